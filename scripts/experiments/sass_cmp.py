#!/usr/bin/env python3
"""Per producer-form kernel of several cuobjdump -sass dumps: instruction count, HGMMA count, and whether the
instructions between the first and last HGMMA (the main loop) are the same as in the first dump. A kernel whose last
template argument is a bool false is compared with the same name without it (a template parameter added with a
default, e.g. the split form's SPLIT).
Usage: sass_cmp.py A.sass B.sass ..."""
import re
import sys


def kernels(path):
    out, name, body = {}, None, []
    for line in open(path):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out[name] = body
            name, body = re.sub(r"Lb0E(EEv)", r"\1", m.group(1)), []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and name:
            body.append(re.sub(r"\s+", " ", m.group(1)).strip())
    if name:
        out[name] = body
    return out


dumps = [kernels(p) for p in sys.argv[1:]]
for name in sorted(dumps[0]):
    if "ws_kernel" not in name:
        continue
    cols = []
    base = None
    for d in dumps:
        body = d.get(name)
        if body is None:
            cols.append("missing")
            continue
        idx = [i for i, s in enumerate(body) if s.startswith("HGMMA") or " HGMMA" in s]
        loop = body[idx[0]:idx[-1] + 1] if idx else []
        if base is None:
            base = loop
        cols.append("%d instr, %d hgmma, loop %d %s" % (len(body), len(idx), len(loop), "same" if loop == base else "DIFFERS"))
    print(name[-70:], " | ".join(cols))
