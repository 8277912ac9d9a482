#!/usr/bin/env python3
"""Writes a bf16 copy of a Hugging Face checkpoint directory whose weights are fp16 or fp32.

A fixture for scripts/gpu.sh: the bf16 model path (bf16 scales, the bf16 Marlin kernel in verify) on
the built-in sample, which is fp16. Standard library only: the GPU machine's Python is not ours to
install into. Usage: bf16_copy.py SRC_DIR DST_DIR
"""
import json
import os
import shutil
import struct
import sys


def to_bf16(raw: bytes, dtype: str) -> bytes:
    fmt = {"F16": "e", "F32": "f"}[dtype]
    count = len(raw) // struct.calcsize(fmt)
    values = struct.unpack("<%d%s" % (count, fmt), raw)
    bits = struct.unpack("<%dI" % count, struct.pack("<%df" % count, *values))
    out = []
    for b in bits:
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF):
            out.append((b >> 16) | 0x40)  # NaN stays a quiet NaN
        else:
            out.append((b + 0x7FFF + ((b >> 16) & 1)) >> 16)  # round to nearest even
    return struct.pack("<%dH" % count, *out)


def convert_file(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        data = f.read()
    out_header, chunks, offset = {}, [], 0
    for name, info in header.items():
        if name == "__metadata__":
            out_header[name] = info
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        dtype = info["dtype"]
        if dtype in ("F16", "F32"):
            raw, dtype = to_bf16(raw, dtype), "BF16"
        out_header[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for c in chunks:
            f.write(c)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry.endswith(".safetensors"):
            convert_file(path, os.path.join(dst, entry))
        elif entry == "config.json":
            with open(path) as f:
                config = json.load(f)
            for key in ("dtype", "torch_dtype"):
                if key in config:
                    config[key] = "bfloat16"
            with open(os.path.join(dst, entry), "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
        elif os.path.isfile(path):
            shutil.copyfile(path, os.path.join(dst, entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
