#!/usr/bin/env python3
"""A long prompt's prefill pass by pass, from a kernel trace (`qinfer bench --trace FILE.csv`, as the device stage
prefill-trace writes it): a pass starts at each embedding_kernel launch. Per pass: its wall time (first kernel's start
to the next pass's first), the time its prefill attention kernels ran, its GEMMs (cuBLASLt) and the rest, and the
attention's mean time a layer. Passes of one launch grid shape the same; decode steps after the prompt show as passes
of their own (the embedding runs once a step).

usage: trace_passes.py TRACE.csv[.gz] [--every N]   (N: print every Nth pass, the first and the last; default 1)
"""
import csv
import gzip
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from trace_totals import family  # noqa: E402
from trace_step import short  # noqa: E402


def main():
    argv = sys.argv[1:]
    every = 1
    if "--every" in argv:
        at = argv.index("--every")
        every = int(argv[at + 1])
        del argv[at:at + 2]
    if len(argv) != 1:
        sys.exit(__doc__)
    path = argv[0]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        kernels = sorted((int(r["start_ns"]), int(r["end_ns"]), short(r["name"])) for r in csv.DictReader(f))
    passes = []  # [start, attention ns, attention launches, GEMM ns, other ns]
    for start, end, name in kernels:
        if name.startswith("embedding_kernel") or not passes:
            passes.append([start, 0, 0, 0, 0])
        p, ns = passes[-1], end - start
        if name.startswith("attention_prefill"):
            p[1] += ns
            p[2] += 1
        elif family(name) == "GEMM (cuBLASLt)":
            p[3] += ns
        else:
            p[4] += ns
    ends = [p[0] for p in passes[1:]] + [kernels[-1][1]]
    print("| pass | wall ms | attention ms | attention us a layer | GEMM ms | other ms |")
    print("|---|---|---|---|---|---|")
    for i, (p, end) in enumerate(zip(passes, ends)):
        if i % every and i != len(passes) - 1:
            continue
        per_layer = p[1] / p[2] / 1e3 if p[2] else 0.0
        print(f"| {i} | {(end - p[0]) / 1e6:.3f} | {p[1] / 1e6:.3f} | {per_layer:.1f} | {p[3] / 1e6:.3f} | {p[4] / 1e6:.3f} |")
    print(f"| all | {(ends[-1] - passes[0][0]) / 1e6:.3f} | {sum(p[1] for p in passes) / 1e6:.3f} | | "
          f"{sum(p[3] for p in passes) / 1e6:.3f} | {sum(p[4] for p in passes) / 1e6:.3f} |")


if __name__ == "__main__":
    main()
