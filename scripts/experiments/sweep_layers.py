#!/usr/bin/env python3
"""Auto's µs per set and per layer across the bench runs of one sweep.sh call, side by side per tree.

Usage: sweep_layers.py DIR "NAME1 NAME2 ..."   (DIR holds bench_1.json ..., the names in RUNS order)
Prints, per (set, group, m) and then per layer (k, n), each tree's runs as a/b/c, and the ratio of cuBLAS
to Auto per run of each set.
"""
import collections
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d, names = sys.argv[1], sys.argv[2].split()
    sets = collections.defaultdict(lambda: collections.defaultdict(list))
    ratio = collections.defaultdict(lambda: collections.defaultdict(list))
    layers = collections.defaultdict(lambda: collections.defaultdict(list))
    for i, name in enumerate(names, 1):
        with open(f"{d}/bench_{i}.json") as f:
            rows = json.load(f)["rows"]
        for r in rows:
            key = (r["set"], r["group"], r["m"])
            sets[key][name].append(r["auto_us"])
            ratio[key][name].append(r["cublas_us"] / r["auto_us"] if r["auto_us"] > 0 else 0.0)
            for layer in r["layers"]:  # [k, n, cuBLAS, serial, fused, dq+cuBLAS, wgmma, auto]
                layers[key + (layer[0], layer[1])][name].append(layer[7])
    order = list(dict.fromkeys(names))
    cell = lambda v, f: "/".join(f.format(x) for x in v)
    print("set g m | " + " | ".join(order))
    for key, v in sets.items():
        print(*key, "|", " | ".join(cell(v[n], "{:.2f}") for n in order), "| x", " | ".join(cell(ratio[key][n], "{:.2f}") for n in order))
    for key, v in layers.items():
        print(*key, "|", " | ".join(cell(v[n], "{:.2f}") for n in order))


if __name__ == "__main__":
    main()
