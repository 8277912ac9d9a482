#!/usr/bin/env python3
"""Critical path of one fused-kernel call from bench_marlin --timeline-dump records (one csv per layer).

For calls 31..33 (each against the call before it), in microseconds:
  rel     previous call's last block exit -> this call's first block past griddepcontrol.wait
  first   -> first tile of operands in shared memory
  comp    -> median block's products done
  skew    median -> slowest block's products done
  reduce  -> last finisher past the wait for its slice's deposits
  exit    -> last block exit (finisher's sum and C write)
and the two waves: median products time of blocks 0..SMs-1 (first on their SM) and of the rest.
Usage: timeline_path.py DIR_OR_CSV...
"""
import csv
import os
import sys


def rows_of(path):
    with open(path) as f:
        return [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def report(path):
    rows = rows_of(path)
    name = os.path.basename(path)[3:-4]
    for c in (31, 32, 33):
        cur = [r for r in rows if r["call"] == c]
        prev = [r for r in rows if r["call"] == c - 1]
        if not cur or not prev or any(r["waited"] < 0 for r in cur):
            continue
        prev_exit = max(r["exit"] for r in prev)
        w0 = min(r["waited"] for r in cur)
        f0 = min(r["first"] for r in cur)
        comp = [r["computed"] for r in cur]
        cmed, cmax = med(comp), max(comp)
        red = [r["reduced"] for r in cur if r["reduced"] > 0]
        rmax = max(red) if red else cmax
        last = max(r["exit"] for r in cur)
        sms = len({r["sm"] for r in cur})
        wave1 = [r["computed"] - w0 for r in cur if r["block"] < sms]
        wave2 = [r["computed"] - w0 for r in cur if r["block"] >= sms]
        count = max(r["info"] >> 1 for r in cur)
        print(f"{name} call {c}: blocks {len(cur)} on {sms} SMs, slice shared by <= {count} | "
              f"rel {(w0 - prev_exit) / 1e3:.2f} first {(f0 - w0) / 1e3:.2f} comp {(cmed - f0) / 1e3:.2f} "
              f"skew {(cmax - cmed) / 1e3:.2f} reduce {(rmax - cmax) / 1e3:.2f} exit {(last - rmax) / 1e3:.2f} "
              f"= period {(last - prev_exit) / 1e3:.2f} | waves {med(wave1) / 1e3:.2f} / {med(wave2) / 1e3:.2f}")


def main():
    paths = []
    for a in sys.argv[1:]:
        paths += sorted(os.path.join(a, f) for f in os.listdir(a) if f.endswith(".csv")) if os.path.isdir(a) else [a]
    if not paths:
        sys.exit(__doc__)
    for p in paths:
        report(p)


if __name__ == "__main__":
    main()
