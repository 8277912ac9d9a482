#!/usr/bin/env python3
"""Compares the machine code of every kernel in two cubins (nvcc -cubin), section by section (.text.<kernel>), so that
a change can be shown to leave kernels byte-identical without a GPU or cuobjdump. A kernel whose last template
argument is a bool false matches the same name without it (a template parameter added with a default, e.g. the
Hopper kernel's SPLIT). Prints the kernels that differ (with the first and last differing 16-byte instructions) and
a count. Usage: cubin_cmp.py OLD.cubin NEW.cubin
Build the cubins with the flags of build/cuda/compile_commands.json plus -cubin, e.g.
  nvcc -DMARLINC_HAVE_CUDA=1 -O3 -DNDEBUG --generate-code=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \\
       -std=c++17 -x cu -cubin -I. kernels/sm90/marlin_wgmma_fp16.cu -o new.cubin"""
import re
import struct
import sys


def text_sections(path):
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        sys.exit(f"{path}: not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]

    def name(off):
        end = b.index(b"\0", names + off)
        return b[names + off:end].decode()

    out = {}
    for h in hdrs:  # (name, type, flags, addr, offset, size, ...)
        n = name(h[0])
        if n.startswith(".text."):
            out[re.sub(r"Lb0E(EEv)", r"\1", n[6:])] = b[h[4]:h[4] + h[5]]
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = text_sections(sys.argv[1]), text_sections(sys.argv[2])
    same = 0
    for n, code in sorted(old.items()):
        if n not in new:
            print("missing in new:", n)
        elif new[n] == code:
            same += 1
        else:
            d = [i // 16 for i in range(0, max(len(code), len(new[n])), 16) if code[i:i + 16] != new[n][i:i + 16]]
            print(f"differs: {n} ({len(code) // 16} -> {len(new[n]) // 16} instructions, {len(d)} differ, "
                  f"first {d[0]}, last {d[-1]})")
    print(f"kernels in old: {len(old)}, byte-identical in new: {same}, only in new: {len(set(new) - set(old))}")
    return 0 if same == len(old) else 1


if __name__ == "__main__":
    sys.exit(main())
