#!/usr/bin/env python3
"""Checks a kernel's SASS main loop for writes to wgmma A registers that an in-flight HGMMA may still read.

Usage: wgmma_regcheck.py SASS_FILE FUNCTION_SUBSTRING (scripts/gpu.sh runs it on every producer kernel)
The loop is the backward branch that closes over the first HGMMA. The body is replayed twice (the back edge):
every HGMMA's A registers join the open commit group; `gsb0` closes it; WARPGROUP.DEPBAR.LE gsb0, n retires
all but the newest n groups. A write to a register of an unretired group is reported.
"""
import re, sys

def body(path, func):
    lines, on = [], False
    for l in open(path):
        if 'Function :' in l:
            on = func in l
            continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
        if on and m:
            lines.append((int(m.group(1), 16), m.group(2).strip()))
    if not lines:
        sys.exit(f'{func}: no such function in {path}')
    first = next((a for a, t in lines if 'HGMMA' in t), None)
    if first is None:
        sys.exit(f'{func}: no HGMMA')
    for a, t in lines:
        m = re.search(r'BRA (0x[0-9a-f]+)', t)
        if m and a > first and int(m.group(1), 16) <= first:
            lo = int(m.group(1), 16)
            return [(x, t) for x, t in lines if lo <= x <= a]
    sys.exit('no loop around the first HGMMA')

def regs(tok):
    m = re.match(r'R(\d+)', tok)
    return int(m.group(1)) if m else None

def main():
    code = body(sys.argv[1], sys.argv[2])
    groups, open_g, bad = [], set(), 0
    for it in range(2):
        for a, t in code:
            op = t.split()[0] if not t.startswith('@') else t.split()[1]
            args = t.split(None, 1 if not t.startswith('@') else 2)[-1]
            if op.startswith('HGMMA'):
                src = regs(args.split(',')[1].strip())
                open_g |= set(range(src, src + 4))
                if 'gsb0' in args:
                    groups.append(open_g); open_g = set()
                continue
            if op.startswith('WARPGROUP.DEPBAR'):
                n = int(args.split(',')[-1], 0)
                groups = groups[len(groups) - n:] if n else []
                continue
            dst = regs(args.split(',')[0].strip()) if ',' in args else None
            if dst is None or op.startswith(('ST', 'SYNCS', 'BAR', 'ISETP', 'HGMMA')):
                continue
            width = 2 if op.endswith('.64') or '.WIDE' in op else 4 if op.endswith('.128') else 1
            hit = [r for r in range(dst, dst + width) if any(r in g for g in groups + [open_g])]
            if hit and it == 1:
                bad += 1
                print(f'{a:#06x} {t}: writes R{hit[0]} of a wgmma in flight')
    print(f'{len(code)} instructions in the loop, {bad} hazards')
    sys.exit(1 if bad else 0)

main()
