#!/usr/bin/env python3
"""Per-block view of call 32 from bench_marlin --timeline-dump records (one csv per layer and m).

For each csv: the blocks' exit median and maximum (µs from the call's first entry), the twelve last blocks and
the three first to exit (wait, first data, products done, reduced, exit, info = blocks on the last slice * 2 +
finisher), then per block index the products time (computed - first) and the exit, so that row chunks
(consecutive block ranges) that run slower stand out.
Usage: timeline_blocks.py CSV...
"""
import csv
import sys
for path in sys.argv[1:]:
    rows = [ {k:int(v) for k,v in r.items()} for r in csv.DictReader(open(path))]
    cur = [r for r in rows if r['call']==32]
    if not cur: continue
    e0 = min(r['entry'] for r in cur)
    print(path.split('/')[-1], 'blocks', len(cur))
    cur.sort(key=lambda r: r['exit'])
    xs=[r['exit']-e0 for r in cur]
    med=xs[len(xs)//2]
    print('  exit median %.2f max %.2f' % (med/1e3, xs[-1]/1e3))
    for r in cur[-12:] + cur[:3]:
        print('  b%3d sm%3d wait %.2f first %.2f comp %.2f red %.2f exit %.2f info %d' % (r['block'], r['sm'], (r['waited']-e0)/1e3, (r['first']-e0)/1e3, (r['computed']-e0)/1e3, (r['reduced']-e0)/1e3 if r['reduced']>0 else -1, (r['exit']-e0)/1e3, r['info']))
    # histogram of comp-first by block index
    byb = sorted(cur, key=lambda r: r['block'])
    print('  comp-first per block:', ' '.join('%d' % ((r['computed']-r['first'])/1e3) for r in byb))
    print('  exit per block:', ' '.join('%d' % ((r['exit']-e0)/1e3) for r in byb))
