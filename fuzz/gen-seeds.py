#!/usr/bin/env python3
"""Writes the committed seed corpora: a few deterministic pseudo-random inputs per target.

The targets decode their input with `arbitrary`, so any bytes are a valid input; these seeds
only give libFuzzer a start at useful lengths (the serializer target needs a few hundred bytes
to reach 64 operations). Run from `fuzz/`: `python3 gen-seeds.py`.
"""
import os
import random

SIZES = {
    "chain": [16, 64, 256, 1024],
    "table": [16, 96, 384, 1536],
    "pool_ready": [16, 64, 256, 1024],
    "serializer": [32, 128, 384, 768],
    "fixed": [16, 64, 256],
}

for target, sizes in SIZES.items():
    rng = random.Random(target)
    os.makedirs(f"corpus/{target}", exist_ok=True)
    for i, n in enumerate(sizes):
        with open(f"corpus/{target}/seed-{i}", "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))
