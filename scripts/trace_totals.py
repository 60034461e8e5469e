#!/usr/bin/env python3
"""Where a whole run's GPU time goes, from a kernel trace (`qinfer bench --throughput --trace FILE.csv`, or any
`--trace`): per kernel family, the time it ran and the time it alone was running (exposed), and the time no kernel
ran at all (the host between steps, copies, launch gaps). Steps are cut after each pick_rows_kernel (the last kernel of
a continuous-batching step that decodes alone), or after a pick_slots_kernel that a gap of over 100 us follows (the end
of a step whose decode rows ride in its prefill passes); a step holding a prefill attention kernel counts as mixed. Per kind of
step it then prints each family's mean exposed time a step, and the mean gap between steps (no kernel: the host).

--templates keeps each kernel's template arguments (as trace_step.py shortens them) in its family, so that one
kernel's instances are told apart (qgemm_rs_kernel's grouped MoE launches from its dense ones).

usage: trace_totals.py TRACE.csv[.gz] [TOP] [--templates]
"""
import csv
import gzip
import re
import sys
from collections import defaultdict

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from trace_step import short  # noqa: E402


def family(name, templates=False):
    """Kernels of one kind under one name: cuBLASLt's many GEMM kernels become 'GEMM (cuBLASLt)'."""
    if re.match(r"(nvjet|sm90_xmma|sm80_xmma|cutlass|gemm|gemv2T|ampere_|sm90_gemm|xmma)", name):
        return "GEMM (cuBLASLt)"
    return name if templates else re.sub(r"<.*", "", name)


def main():
    templates = "--templates" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--templates"]
    if not args:
        sys.exit(__doc__)
    path, top = args[0], int(args[1]) if len(args) > 1 else 20
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        kernels = sorted((int(r["start_ns"]), int(r["end_ns"]), family(short(r["name"]), templates)) for r in csv.DictReader(f))
    if not kernels:
        sys.exit("trace_totals: no kernels in " + path)
    dur, exposed, count = defaultdict(float), defaultdict(float), defaultdict(int)
    idle, prev_end = 0.0, kernels[0][0]
    steps = {"decode": [0, 0.0], "mixed": [0, 0.0]}
    per_step = {"decode": defaultdict(float), "mixed": defaultdict(float)}
    step_start, step_mixed, step_exposed = kernels[0][0], False, defaultdict(float)
    for i, (start, end, name) in enumerate(kernels):
        count[name] += 1
        dur[name] += end - start
        exposed[name] += max(0.0, end - max(prev_end, start))
        step_exposed[name] += max(0.0, end - max(prev_end, start))
        step_exposed["(no kernel running)"] += max(0.0, start - prev_end)
        idle += max(0.0, start - prev_end)
        prev_end = max(prev_end, end)
        step_mixed = step_mixed or "prefill" in name
        # A step ends with its picks: the decode step's pick_rows_kernel, or a prefill pass's pick_slots_kernel that
        # the host follows with a gap (a step of several passes picks after each).
        gap_after = kernels[i + 1][0] - end if i + 1 < len(kernels) else float("inf")
        if name == "pick_rows_kernel" or (name == "pick_slots_kernel" and gap_after > 100e3):
            kind = "mixed" if step_mixed else "decode"
            steps[kind][0] += 1
            steps[kind][1] += end - step_start
            for n, t in step_exposed.items():
                per_step[kind][n] += t
            step_start, step_mixed, step_exposed = end, False, defaultdict(float)
    wall = prev_end - kernels[0][0]
    print(f"{path}: {len(kernels)} kernels over {wall / 1e9:.3f} s; no kernel running for {idle / 1e9:.3f} s ({100 * idle / wall:.1f}%)")
    for kind, (n, t) in steps.items():
        if not n:
            continue
        print(f"{kind} steps: {n}, mean {t / n / 1e6:.2f} ms (end of the step before to the end of its token pick, gaps included)")
        for name in sorted(per_step[kind], key=lambda x: -per_step[kind][x])[:10]:
            print(f"    {name[:44]:44s} {per_step[kind][name] / n / 1e3:10.1f} us a step exposed")
    print(f"{'kernel':48s} {'launches':>9s} {'ran s':>8s} {'exposed s':>9s} {'of wall':>8s}")
    for n in sorted(count, key=lambda n: -exposed[n])[:top]:
        print(f"{n[:48]:48s} {count[n]:9d} {dur[n] / 1e9:8.3f} {exposed[n] / 1e9:9.3f} {100 * exposed[n] / wall:7.1f}%")


if __name__ == "__main__":
    main()
