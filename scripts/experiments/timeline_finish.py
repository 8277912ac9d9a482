#!/usr/bin/env python3
"""Ends of shared slices from bench_marlin --timeline-dump records: finishers against depositors.

For call 32 of each layer csv (times in us from the call's first block's first data; medians over blocks):
  fin/dep        finishers and depositors of slices shared by MIN_BLOCKS or more blocks
  done f/d       products done (kTlComputed): finishers / depositors
  f: done->exit  a finisher's products done to its exit (its wait, the deposits' sum and C), median and max
  d: done->exit  a depositor's products done to its exit (its deposit)
  last exit      the call's last block exit
Usage: timeline_finish.py DIR [MIN_BLOCKS]  (csv names: tl_SET_gG_mM_kK_nN.csv)
"""
import os
import sys

from timeline_path import med, rows_of  # the same record reader and median as the critical-path report


def main():
    d = sys.argv[1]
    min_blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"{'layer':42s} {'fin/dep':>8s} {'done f/d':>13s} {'f: done->exit':>15s} {'d: done->exit':>13s} {'last exit':>9s}")
    for name in sorted(os.listdir(d)):
        if not name.endswith(".csv"):
            continue
        rows = [r for r in rows_of(os.path.join(d, name)) if r["call"] == 32]
        if not rows:
            continue
        t0 = min(r["first"] for r in rows)
        us = lambda r, k: (r[k] - t0) / 1000.0
        shared = [r for r in rows if (r["info"] >> 1) >= min_blocks]
        fin = [r for r in shared if r["info"] & 1]
        dep = [r for r in shared if not r["info"] & 1]
        last = max(us(r, "exit") for r in rows)
        if not fin:
            print(f"{name[3:-4]:42s} {'-':>8s} {'':>13s} {'':>15s} {'':>13s} {last:9.1f}")
            continue
        fx = [(r["exit"] - r["computed"]) / 1000.0 for r in fin]
        dx = [(r["exit"] - r["computed"]) / 1000.0 for r in dep]
        print(f"{name[3:-4]:42s} {len(fin):>3d}/{len(dep):<4d} {med([us(r, 'computed') for r in fin]):6.1f}/"
              f"{med([us(r, 'computed') for r in dep]):<6.1f} {med(fx):7.2f}, {max(fx):5.2f} {med(dx):13.2f} {last:9.1f}")


if __name__ == "__main__":
    main()
