"""Whether two built sites hold the same content: the check behind "the same site" in docs/benchmarks.md.

Every file of each site is compared: the same bytes; else a `.gz` copy unpacked; else a `.json` file (unpacked or
not) parsed. It prints how many files are identical, how many differ in bytes only (a `.gz` copy another compressor
made, a JSON file whose numbers are spelled differently) and which differ in content. Usage:

    .venv/bin/python benchmarks/compare_sites.py SITE_BEFORE SITE_AFTER
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys


def files(root: str) -> set[str]:
    return {os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root) for name in names}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    args = ap.parse_args()
    a, b = files(args.before), files(args.after)
    print(f"only in {args.before}: {len(a - b)} {sorted(a - b)[:5]}")
    print(f"only in {args.after}: {len(b - a)} {sorted(b - a)[:5]}")
    same = gz_bytes = json_bytes = 0
    different: list[str] = []
    for rel in sorted(a & b):
        with open(os.path.join(args.before, rel), "rb") as f:
            x = f.read()
        with open(os.path.join(args.after, rel), "rb") as f:
            y = f.read()
        if x == y:
            same += 1
            continue
        name = rel
        if rel.endswith(".gz"):
            gz_bytes += 1
            x, y, name = gzip.decompress(x), gzip.decompress(y), rel[:-3]
            if x == y:
                continue
        if name.endswith(".json"):
            json_bytes += 1
            if json.loads(x) == json.loads(y):
                continue
        different.append(rel)
    print(f"identical bytes: {same}; .gz copies differing in bytes only: {gz_bytes}; JSON differing in bytes: "
          f"{json_bytes}; different content: {len(different)} {different[:10]}")
    return 1 if different or a != b else 0


if __name__ == "__main__":
    sys.exit(main())
