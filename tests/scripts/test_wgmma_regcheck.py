#!/usr/bin/env python3
"""scripts/wgmma_regcheck.py on two hand-written loops in cuobjdump's format: one that waits for a wgmma
group before overwriting its A registers, and the same loop without that wait, which must be reported."""
import os, subprocess, sys, tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'scripts', 'wgmma_regcheck.py')

def listing(name, first_wait):
    body = [
        'MOV R1, R2',
        'LOP3.LUT R104, R0, 0xf000f, R3, 0xea, !PT',  # fragment set A
        'WARPGROUP.ARRIVE',
        'HGMMA.64x64x16.F32 R24, R104, gdesc[UR16], R24, gsb0',
    ]
    if first_wait:
        body.append('WARPGROUP.DEPBAR.LE gsb0, 0x1')  # retires the previous iteration's set-B group
    body += [
        'HADD2 R108, R5, -1032, -1032',  # fragment set B
        'WARPGROUP.ARRIVE',
        'HGMMA.64x64x16.F32 R24, R108, gdesc[UR16], R24, gsb0',
        'WARPGROUP.DEPBAR.LE gsb0, 0x1',  # retires this iteration's set-A group
        '@!P0 BRA 0x10',
        'EXIT',
    ]
    lines = [f'\t\tFunction : {name}']
    lines += [f'        /*{16 * i:04x}*/                   {t} ;' for i, t in enumerate(body)]
    return '\n'.join(lines) + '\n'

def run(text, name):
    with tempfile.NamedTemporaryFile('w', suffix='.sass', delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, CHECK, f.name, name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)

ok = run(listing('loop_ok', True), 'loop_ok')
bad = run(listing('loop_bad', False), 'loop_bad')
missing = run(listing('loop_ok', True), 'no_such_kernel')
failures = []
if ok.returncode != 0 or '0 hazards' not in ok.stdout:
    failures.append(f'clean loop: rc {ok.returncode}, {ok.stdout.strip()} {ok.stderr.strip()}')
if bad.returncode != 1 or 'writes R108 of a wgmma in flight' not in bad.stdout:
    failures.append(f'hazardous loop: rc {bad.returncode}, {bad.stdout.strip()} {bad.stderr.strip()}')
if missing.returncode == 0:
    failures.append('an absent function was not an error')
if failures:
    sys.exit('\n'.join(failures))
print('wgmma_regcheck: clean loop passes, the loop without the wait is reported, an absent function fails')
