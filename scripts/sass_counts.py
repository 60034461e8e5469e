#!/usr/bin/env python3
"""Instruction counts of each kernel in `cuobjdump -sass` output (standard input): all instructions, tensor-core MMAs
(HMMA), shared-memory loads (LDS / LDSM), and those in the kernel's main loop (of its backward-branch loops, the one
with the most MMAs, then the widest), so that a change to a main loop can be judged by its machine code before it is
timed. Kernel names are demangled where c++filt is found.

usage: cuobjdump -sass FILE.o | sass_counts.py
"""
import re
import subprocess
import sys
from collections import Counter


def demangled(name):
    """The kernel's name with its template arguments (c++filt where there is one), namespaces dropped."""
    try:
        out = subprocess.run(["c++filt", name], capture_output=True, text=True, timeout=10).stdout.strip() or name
    except (OSError, subprocess.SubprocessError):
        out = name
    out = re.sub(r"\(qinfer::cuda::[^)]*\)", "", out)  # the enum casts of template arguments
    out = re.sub(r"qinfer::cuda::(\w+::)*", "", out)
    return re.sub(r"\(.*\)$", "", out)[:160]


def report(name, lines):
    if not name or not lines:
        return
    ins = [(addr, op) for addr, op in lines]
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    # The main loop: of the backward branches' loops, the one with the most MMAs (a kernel's prologue can hold wider
    # loops: staging, group parameters), then the widest.
    loop, best = (0, 0), (-1, -1)
    hmma_before = [0]
    for _, op in ins:
        hmma_before.append(hmma_before[-1] + ("HMMA" in op))
    back_branches = []
    for i, (addr, op) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`?\(?\.L_x_\d+\)?|0x([0-9a-f]+))", op)
        if m and m.group(1):
            target = int(m.group(1), 16)
            if target in index and index[target] < i:
                back_branches.append((i, target))
                key = (hmma_before[i + 1] - hmma_before[index[target]], i - index[target])
                if key > best:
                    best, loop = key, (index[target], i)
    body = [op for _, op in ins[loop[0]:loop[1] + 1]] if loop[1] > loop[0] else []
    # Every loop with MMAs, as instructions / MMAs (a kernel may hold several: unchecked and checked rounds).
    mma_loops = sorted({(i - index[t], hmma_before[i + 1] - hmma_before[index[t]])
                        for i, t in back_branches if hmma_before[i + 1] - hmma_before[index[t]] > 0}, reverse=True)
    def kinds(ops):
        c = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0].split(".")[0] for op in ops if op.strip())
        return c
    c_all, c_loop = kinds(op for _, op in ins), kinds(body)
    short = demangled(name)
    print(f"{short}: {len(ins)} instructions, HMMA {c_all['HMMA']}; main loop {len(body)} "
          f"(HMMA {c_loop['HMMA']}, LDSM {c_loop['LDSM']}, LDS {c_loop['LDS']}, LDGSTS {c_loop['LDGSTS']}, "
          f"BAR {c_loop['BAR']}, LOP3 {c_loop['LOP3']}, HADD2/HFMA2 {c_loop['HADD2'] + c_loop['HFMA2']}, "
          f"IADD3/IMAD/LEA {c_loop['IADD3'] + c_loop['IMAD'] + c_loop['LEA']}, ISETP {c_loop['ISETP']}, BRA {c_loop['BRA']}); "
          f"loops with MMAs (instructions / MMAs): {', '.join(f'{n}/{h}' for n, h in mma_loops[:4]) or '-'}")


def main():
    name, lines = None, []
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            report(name, lines)
            name, lines = m.group(1), []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and name:
            lines.append((int(m.group(1), 16), m.group(2).strip()))
    report(name, lines)


if __name__ == "__main__":
    main()
