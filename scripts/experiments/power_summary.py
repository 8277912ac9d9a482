#!/usr/bin/env python3
"""Per soak window of `bench_marlin --soak` (stderr lines "soak LABEL T0_MS T1_MS"), the median SM clock,
memory clock, power draw and temperature from an `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,
power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms N` log, and the
union of the clock-event reason masks seen. The first 0.5 s of each window is left out (settling).

usage: power_summary.py SMI_CSV SOAK_LOG
"""
import datetime
import statistics
import sys

SETTLE_MS = 500


def parse_smi(path):
    rows = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            continue
        try:
            # nvidia-smi prints local time "YYYY/MM/DD HH:MM:SS.mmm"; the device machine runs in UTC or local
            # time alike for both clocks (time.time() below is converted the same way).
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp() * 1000
            rows.append((t, float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), int(parts[5], 16)))
        except ValueError:
            continue
    return rows


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    smi = parse_smi(sys.argv[1])
    print(f"{'window':<44} {'n':>4} {'SM MHz':>7} {'mem MHz':>7} {'W':>6} {'C':>4}  reasons")
    for line in open(sys.argv[2]):
        f = line.split()
        if len(f) < 4 or f[0] != "soak":
            continue
        t0, t1 = int(f[-2]), int(f[-1])
        label = " ".join(f[1:-2])
        win = [r for r in smi if t0 + SETTLE_MS <= r[0] <= t1]
        if not win:
            print(f"{label:<44} {0:>4}  (no samples)")
            continue
        mask = 0
        for r in win:
            mask |= r[5]
        med = [statistics.median(r[i] for r in win) for i in range(1, 5)]
        print(f"{label:<44} {len(win):>4} {med[0]:>7.0f} {med[1]:>7.0f} {med[2]:>6.0f} {med[3]:>4.0f}  0x{mask:x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
