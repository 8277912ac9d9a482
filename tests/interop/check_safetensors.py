#!/usr/bin/env python3
"""Interop check: what marlinc writes loads in Python's safetensors, and decodes, with an independent
numpy implementation of the layouts in ../shared/spec/formats.md, to the same weights.

  check_safetensors.py MARLINC SAMPLE_MODEL_DIR WORK_DIR

1. `marlinc quantize` the sample to Marlin and to GPTQ (same RTN options, so the same codes), and
   `marlinc convert` the Marlin output to GPTQ v2 and compressed-tensors.
2. Every output file loads with safetensors.numpy; metadata {"format": "pt"}; dtypes and shapes as §1.1/§4.1.
3. Marlin B/s decoded with the §1.5 inverse and §1.6 scale permutations equals the GPTQ qweight/scales
   decoded with §4.2, bit for bit, and both are within RTN error of the original weights.
4. The converted GPTQ v2 equals the quantized GPTQ v1 up to the documented qzeros offset (§4.3).
5. A file written by Python's safetensors (several dtypes) is listed by `marlinc inspect --json` with the
   same names, dtypes and shapes.
Exits non-zero with a message naming the file and tensor on the first mismatch.
"""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # setup.sh installs both into .deps/py
    sys.exit(f"interop: {e}; run `bash scripts/setup.sh` (it installs numpy and safetensors into .deps/py)")

MAX_RTN_REL_ERR = 0.2  # 4-bit RTN, group 128, on random-init weights: about 0.10 (demo output)


def fail(msg):
    sys.exit(f"interop: FAIL: {msg}")


def run(*args):
    r = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    return r.stdout


def load_dir(d):
    """All tensors of a checkpoint directory, checking each file's metadata."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(d, f)
        with safe_open(path, framework="numpy") as h:
            meta = h.metadata()
        if meta is None or meta.get("format") != "pt":
            fail(f"{path}: __metadata__ is {meta}, expected format = pt")
        for name, t in load_file(path).items():
            if name in out:
                fail(f"{path}: tensor {name} appears in two files")
            out[name] = t
    if not out:
        fail(f"{d}: no .safetensors files")
    return out


def marlin_perm_inverse(k, n):
    """(k, n) of every (row, word, nibble) of B [k/16, 2n] (formats.md §1.5 inverse)."""
    R, W, m = np.meshgrid(np.arange(k // 16), np.arange(2 * n), np.arange(8), indexing="ij")
    nt, w = W // 128, W % 128
    i, j = w // 4, w % 4
    kk = 16 * R + 8 * (m % 2) + 2 * (i % 4) + (m // 4)
    nn = 64 * nt + 16 * j + 8 * ((m // 2) % 2) + (i // 4)
    return kk, nn


def marlin_codes(B, k, n):
    q = np.zeros((k, n), dtype=np.int32)
    words = B.astype(np.uint32)
    nib = (words[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    kk, nn = marlin_perm_inverse(k, n)
    q[kk, nn] = nib
    return q


def marlin_scales(s, n):
    """Undo §1.6: stored column p holds source column src[p]."""
    G = s.shape[0]
    cols = np.arange(n)
    if G > 1:
        dest = 64 * (cols // 64) + 8 * (cols % 8) + (cols % 64) // 8
    else:
        u = cols % 32
        dest = 32 * (cols // 32) + 8 * ((u % 8) // 2) + 2 * (u // 8) + (u % 2)
    plain = np.empty_like(s)
    plain[:, cols] = s[:, dest]
    return plain


def gptq_codes(qweight, k):
    words = qweight.astype(np.uint32)  # [k/8, n]
    nib = (words[:, None, :] >> (4 * np.arange(8, dtype=np.uint32))[None, :, None]) & 0xF
    return nib.reshape(k, -1).astype(np.int32)


def dequant(q, zero, scales, group, k):
    g = np.arange(k) // (group if group > 0 else k)
    return (q - zero) * scales.astype(np.float64)[g, :]


def expect(cond, msg):
    if not cond:
        fail(msg)


def main():
    marlinc, sample, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    out = {f: os.path.join(work, f) for f in ("marlin", "gptq", "gptq_v2", "ct")}
    for d in out.values():
        subprocess.run(["rm", "-rf", d])
    common = ["--method", "rtn", "--group", "128"]
    run(marlinc, "quantize", sample, out["marlin"], "--format", "marlin", *common)
    run(marlinc, "quantize", sample, out["gptq"], "--format", "gptq", *common)
    run(marlinc, "convert", out["marlin"], out["gptq_v2"], "--to", "gptq_v2")
    run(marlinc, "convert", out["marlin"], out["ct"], "--to", "compressed-tensors")

    orig = load_dir(sample)
    tm, tg, tv2, tct = (load_dir(out[f]) for f in ("marlin", "gptq", "gptq_v2", "ct"))
    layers = sorted(n[: -len(".B")] for n in tm if n.endswith(".B"))
    expect(len(layers) == 14, f"{out['marlin']}: expected 14 Marlin layers, found {len(layers)}")
    for L in layers:
        n, k = orig[L + ".weight"].shape  # HF orientation [out, in]
        B, s = tm[L + ".B"], tm[L + ".s"]
        expect(B.dtype == np.int32 and B.shape == (k // 16, 2 * n), f"{L}.B: {B.dtype} {B.shape}, want int32 {(k // 16, 2 * n)}")
        expect(s.dtype == np.float16 and s.shape == (k // 128, n), f"{L}.s: {s.dtype} {s.shape}, want float16 {(k // 128, n)}")
        qw, qz, sc, gi = (tg[L + x] for x in (".qweight", ".qzeros", ".scales", ".g_idx"))
        expect(qw.dtype == np.int32 and qw.shape == (k // 8, n), f"{L}.qweight: {qw.dtype} {qw.shape}")
        expect(qz.shape == (k // 128, n // 8) and np.all(qz.astype(np.uint32) == 0x77777777), f"{L}.qzeros: not sym v1 (0x77777777)")
        expect(np.array_equal(gi, np.arange(k, dtype=np.int32) // 128), f"{L}.g_idx: not the trivial k/128 map")
        qm, qg = marlin_codes(B, k, n), gptq_codes(qw, k)
        expect(np.array_equal(qm, qg), f"{L}: Marlin codes (§1.5) differ from GPTQ codes (§4.2) at {np.argwhere(qm != qg)[:3].tolist()}")
        expect(np.array_equal(marlin_scales(s, n), sc), f"{L}: Marlin scales (§1.6) differ from GPTQ scales")
        w = dequant(qm, 8, sc, 128, k)  # [k, n]
        ref = orig[L + ".weight"].astype(np.float64).T
        rel = np.linalg.norm(w - ref) / np.linalg.norm(ref)
        expect(rel < MAX_RTN_REL_ERR, f"{L}: relative weight error {rel:.3g} >= {MAX_RTN_REL_ERR}")
        # Marlin -> GPTQ v2: the same qweight/scales/g_idx, qzeros = v1 + 0x11111111 (§4.3).
        for x in (".qweight", ".scales", ".g_idx"):
            expect(np.array_equal(tv2[L + x], tg[L + x]), f"{out['gptq_v2']}: {L}{x} differs from the GPTQ v1 output")
        expect(np.all(tv2[L + ".qzeros"].astype(np.uint32) == 0x88888888), f"{L}.qzeros: v2 output is not 0x88888888")
        # compressed-tensors pack-quantized: weight_packed [n, k/8] int32, weight_scale [n, G].
        wp = tct[L + ".weight_packed"]
        expect(wp.dtype == np.int32 and wp.shape == (n, k // 8), f"{L}.weight_packed: {wp.dtype} {wp.shape}")
        qc = gptq_codes(wp.T.copy(), k)  # the same LSB-first nibble order along k, transposed
        expect(np.array_equal(qc, qg), f"{L}: compressed-tensors codes differ from GPTQ codes")
        expect(np.array_equal(tct[L + ".weight_scale"].T, sc), f"{L}.weight_scale differs from GPTQ scales")
    for name, t in orig.items():  # unquantized tensors pass through byte for byte
        if name.endswith(".weight") and name[: -len(".weight")] in layers:
            continue
        for d, tensors in (("marlin", tm), ("gptq", tg)):
            expect(name in tensors and np.array_equal(tensors[name], t), f"{out[d]}: {name} not passed through unchanged")
    with open(os.path.join(out["gptq"], "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    expect(qc.get("quant_method") == "gptq" and qc.get("bits") == 4 and qc.get("group_size") == 128,
           f"{out['gptq']}/config.json: quantization_config {qc}")

    # Python writes, marlinc reads.
    rng = np.random.default_rng(7)
    written = {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((64, 2)).astype(np.float16),
        "c.i32": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "d.u8": np.arange(7, dtype=np.uint8),
        "e.f64": np.zeros((0, 4), dtype=np.float64),
        "f.i64": np.array([1, -2], dtype=np.int64),
        "g.bool": np.array([True, False, True]),
        "h.i8": np.array([[-1, 2]], dtype=np.int8),
    }
    py_file = os.path.join(work, "python_written.safetensors")
    save_file(written, py_file, metadata={"format": "pt"})
    listed = {t["name"]: t for t in json.loads(run(marlinc, "inspect", py_file, "--json"))["tensors"]}
    want_dtype = {"float32": "F32", "float16": "F16", "int32": "I32", "uint8": "U8", "float64": "F64",
                  "int64": "I64", "bool": "BOOL", "int8": "I8"}
    for name, arr in written.items():
        t = listed.get(name)
        expect(t is not None, f"{py_file}: marlinc inspect does not list {name}")
        expect(t["dtype"] == want_dtype[str(arr.dtype)] and tuple(t["shape"]) == arr.shape and t["bytes"] == arr.nbytes,
               f"{py_file}: {name} listed as {t['dtype']} {t['shape']} {t['bytes']} B, written as {arr.dtype} {arr.shape}")
    print(f"interop: {len(layers)} layers decode identically from Marlin, GPTQ v1/v2 and compressed-tensors; "
          f"{len(written)} Python-written tensors read back; all files load in safetensors")


if __name__ == "__main__":
    main()
