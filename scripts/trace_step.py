#!/usr/bin/env python3
"""Where a decode step's GPU time goes, kernel by kernel, from `qinfer bench --trace FILE.csv` (CUPTI's records of
every kernel, those replayed from the decode step's CUDA graph included).

Steps are cut after each argmax_final_kernel or step_advance_kernel (the last kernel of a greedy decode step of one
sequence, of a static batch). For the last STEPS
steps it prints, per kernel (name without namespaces and arguments, template arguments cut, and its grid), the mean
duration and the mean exposed time: the end of this kernel minus the end of the kernel before it. Under programmatic
dependent launch a kernel starts before the one ahead of it ends, so durations overlap and do not add up; exposed
times and the gaps with no kernel running add up to the step. A kernel launched more than once a layer is split by its
place in the layer (#0, #1: o_proj and down). CUPTI's tracing adds its own overhead to every kernel: compare steps
traced alike.

With --timeline LAYER it prints, instead, the kernels of that layer of the last step in order: start and end (us from
the layer's first kernel start), duration and exposed time. That shows what the totals hide: which kernel's blocks
start while the one ahead still runs (programmatic dependent launch) and how long each waits.

usage: trace_step.py TRACE.csv [STEPS] [--timeline LAYER]
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"^void ", "", name)
    depth, base_end = 0, len(name)
    for i, ch in enumerate(name):  # the kernel's own name ends at its first '<' or '(' outside any brackets
        if ch in "<(" and depth == 0:
            base_end = i
            break
    base = name[:base_end].split("::")[-1]
    args = ""
    if base_end < len(name) and name[base_end] == "<":
        depth = 0
        for j in range(base_end, len(name)):
            depth += name[j] == "<"
            depth -= name[j] == ">"
            if depth == 0:
                args = name[base_end + 1:j]
                break
        args = re.sub(r"\((?:\w+::)*(\w+)\)", r"\1", args).replace(" ", "")  # (qinfer::cuda::GemvIn)0 -> GemvIn0
    return base + ("<" + args[:28] + ">" if args else "")


def counts_and_layers(step):
    """How often each kernel runs in a step, and the layer count L: the count above one that most kernels share (the
    larger on a tie; 0: none repeats). A gcd of the counts failed on static batches, whose steps run one RMSNorm
    kernel more than twice a layer (the final norm): gcd(49, 24) = 1."""
    count = defaultdict(int)
    for _, _, name in step:
        count[name] += 1
    shared = defaultdict(int)
    for c in count.values():
        if c > 1:
            shared[c] += 1
    layers = max(shared, key=lambda c: (shared[c], c)) if shared else 0
    return count, layers


def by_role(step):
    """A kernel launched r times a layer (the same GEMV for o_proj and down) is told apart by its place in the layer:
    occurrence i of a kernel seen c times a step, with L layers (the gcd of the counts above one), gets "#(i % (c / L))"."""
    count, layers = counts_and_layers(step)
    seen, out = defaultdict(int), []
    for start, end, name in step:
        per_layer = max(1, count[name] // layers) if layers else 1
        role = seen[name] % per_layer
        seen[name] += 1
        out.append((start, end, name + (f" #{role}" if per_layer > 1 else "")))
    return out


def timeline(step, layer):
    """The kernels of layer `layer` (0-based) of one step: a layer starts at each occurrence of the first kernel that
    runs a multiple of L times a step (L the layer count, as in by_role)."""
    count, layers = counts_and_layers(step)
    if not layers:
        sys.exit("trace_step: no kernel repeats within a step, so no layers")
    first = next(name for _, _, name in step if count[name] > 1 and count[name] % layers == 0)
    starts = [i for i, (_, _, name) in enumerate(step) if name == first][::count[first] // layers]
    if not 0 <= layer < len(starts):
        sys.exit(f"trace_step: layer {layer} is not in 0..{len(starts) - 1}")
    rows = step[starts[layer]:starts[layer + 1] if layer + 1 < len(starts) else len(step)]
    t0 = rows[0][0]
    prev_end = max(end for _, end, _ in step[:starts[layer]]) if starts[layer] > 0 else t0  # the kernels ahead
    print(f"layer {layer} of {len(starts)} (last step): {(rows[-1][1] - t0) / 1000:.1f} us from its first start to its last end")
    print(f"{'start us':>9s} {'end us':>8s} {'duration':>8s} {'exposed':>8s}  kernel (grid)")
    for start, end, name in rows:
        print(f"{(start - t0) / 1000:9.2f} {(end - t0) / 1000:8.2f} {(end - start) / 1000:8.2f} "
              f"{max(0.0, end - max(prev_end, start)) / 1000:8.2f}  {name}")
        prev_end = max(prev_end, end)


def main():
    args = sys.argv[1:]
    layer = None
    if "--timeline" in args:
        i = args.index("--timeline")
        if i + 1 >= len(args):
            sys.exit("trace_step: --timeline needs a layer number")
        layer = int(args[i + 1])
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    path = args[0]
    steps_wanted = int(args[1]) if len(args) > 1 else 16
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kernels = sorted((int(r["start_ns"]), int(r["end_ns"]), short(r["name"]) + " g" + r["grid"]) for r in rows)
    steps, cur = [], []
    for k in kernels:
        cur.append(k)
        if k[2].startswith(("argmax_final_kernel", "step_advance_kernel")):
            steps.append(cur)
            cur = []
    steps = steps[-steps_wanted:]
    if not steps:
        sys.exit("trace_step: no argmax_final_kernel or step_advance_kernel in " + path)
    steps = [by_role(step) for step in steps]
    if layer is not None:
        return timeline(steps[-1], layer)
    dur, exposed, count = defaultdict(float), defaultdict(float), defaultdict(int)
    total = idle = 0.0
    for step in steps:
        prev_end = step[0][0]
        total += step[-1][1] - step[0][0]
        for start, end, name in step:
            count[name] += 1
            dur[name] += end - start
            exposed[name] += max(0.0, end - max(prev_end, start))
            idle += max(0.0, start - prev_end)  # no kernel running: launch gaps
            prev_end = max(prev_end, end)
    s = len(steps)
    print(f"decode step: {total / s / 1000:.1f} us (mean of {s} steps, first kernel's start to the argmax's end), "
          f"{idle / s / 1000:.1f} us of it with no kernel running")
    print(f"{'kernel (grid)':64s} {'per step':>8s} {'duration us':>11s} {'exposed us':>10s} {'exposed':>8s}")
    for n in sorted(count, key=lambda n: -exposed[n]):
        print(f"{n:64s} {count[n] / s:8.0f} {dur[n] / s / 1000:11.1f} {exposed[n] / s / 1000:10.1f} {100 * exposed[n] / total:7.1f}%")


if __name__ == "__main__":
    main()
