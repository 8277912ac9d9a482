#!/usr/bin/env python3
"""NFC test vectors from Python's unicodedata (the Unicode version quantizer/calib/unicode_tables.cpp
was generated from): every code point that has a canonical decomposition, a non-zero combining class or
composes with a predecessor, alone and after a base letter; every Hangul LV syllable with a trailing
jamo; and seeded random runs of bases and combining marks. One line per vector: the input and its NFC,
code points in hex, `;` between them. tests/calib/test_tokenizer.cpp checks marlinc's nfc() against them.

    python3 tests/calib/make_nfc_vectors.py > tests/data/nfc-vectors.txt
"""
import random
import unicodedata


def line(s):
    return " ".join(f"{ord(c):X}" for c in s) + ";" + " ".join(f"{ord(c):X}" for c in unicodedata.normalize("NFC", s))


print(f"# Unicode {unicodedata.unidata_version}: input;NFC, code points in hex")
interesting = []
for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    d = unicodedata.decomposition(c)
    if unicodedata.combining(c) or (d and not d.startswith("<")) or unicodedata.normalize("NFC", c) != c:
        interesting.append(c)
for c in interesting:
    print(line(c))
    print(line("a" + c))
    print(line(unicodedata.normalize("NFD", c)))
for t in range(0x11A8, 0x11C3, 5):
    print(line(chr(0xAC00) + chr(t)))
    print(line(chr(0x1100) + chr(0x1161) + chr(t)))
rng = random.Random(20261129)
bases = [c for c in "aeiouyAEIOUYcCnNsSzZgGkK" ] + [chr(x) for x in (0x0915, 0x09C7, 0x0B47, 0x0BC6, 0x0CC6, 0x0D46, 0x0DD9, 0x1025, 0x1100, 0xAC00, 0x3046, 0x30AB, 0x05D0, 0x0627, 0x03B1, 0x0430)]
marks = [c for c in interesting if unicodedata.combining(c)] + [chr(x) for x in (0x09BE, 0x09D7, 0x0B3E, 0x0B56, 0x0B57, 0x0BBE, 0x0BD7, 0x0CC2, 0x0CD5, 0x0D3E, 0x0D57, 0x0DCF, 0x0DDF, 0x102E, 0x1161, 0x11A8, 0x3099, 0x309A)]
for _ in range(2000):
    s = "".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.3:
        s = rng.choice(marks) + s  # a leading combining mark
    print(line(s))
