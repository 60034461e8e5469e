#!/usr/bin/env python3
"""What one kernel's ncu source page (`ncu --page source --csv --print-source sass`, gzipped or not) says about where
its time goes: the warp stall reasons over all samples, the instruction mix by opcode (per warp and per unit of work
where --per names it), and the instructions with the most samples beside their main stall reasons.

usage: ncu_sass_summary.py FILE.csv[.gz] [--per N] [--top N]
  --per N   divide the instruction counts by N (e.g. warps x K blocks: 2368 x 56 for 7B gate_up at m 16) and print
            them per unit
"""
import argparse
import csv
import gzip
import sys
from collections import Counter


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):  # a predicate
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def as_int(v):
    try:
        return int(float(v or 0))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--per", type=float, default=0)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    opener = gzip.open if a.path.endswith(".gz") else open
    with opener(a.path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "# Samples" in r), None)
    if head is None:
        sys.exit(f"{a.path}: no source table (columns Source and # Samples)")
    hdr = rows[head]
    col = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    data = [r for r in rows[head + 1:] if len(r) == len(hdr)]

    samples = sum(as_int(r[col["# Samples"]]) for r in data)
    stalls = Counter()
    ops = Counter()
    for r in data:
        for h in stall_cols:
            stalls[h[len("stall_"):]] += as_int(r[col[h]])
        ops[opcode(r[col["Source"]])] += as_int(r[col["Instructions Executed"]])
    executed = sum(ops.values())
    print(f"{len(data)} instructions, {samples} samples, {executed} warp instructions executed")
    print("\n| stall reason | samples | share |\n|---|---|---|")
    for name, n in stalls.most_common():
        if n:
            print(f"| {name} | {n} | {100.0 * n / max(samples, 1):.1f}% |")
    unit = " per unit" if a.per else ""
    print(f"\n| opcode | executed | share | count{unit} |\n|---|---|---|---|")
    for name, n in ops.most_common():
        if n:
            per = f"{n / a.per:.1f}" if a.per else str(n)
            print(f"| {name} | {n} | {100.0 * n / max(executed, 1):.1f}% | {per} |")
    print(f"\n| address | samples | instruction | main stalls |\n|---|---|---|---|")
    for r in sorted(data, key=lambda r: -as_int(r[col["# Samples"]]))[: a.top]:
        top = Counter({h[len("stall_"):]: as_int(r[col[h]]) for h in stall_cols}).most_common(2)
        why = ", ".join(f"{k} {v}" for k, v in top if v)
        print(f"| {r[col['Address']][-5:]} | {r[col['# Samples']]} | `{' '.join(r[col['Source']].split())[:70]}` | {why} |")


if __name__ == "__main__":
    main()
