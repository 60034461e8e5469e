#!/usr/bin/env python3
"""Instruction counts of each kernel in `cuobjdump -sass` output (standard input): all instructions, tensor-core MMAs
(HMMA), shared-memory loads (LDS / LDSM), and those in the kernel's longest backward-branch loop, so that a change to a
main loop can be judged by its machine code before it is timed.

usage: cuobjdump -sass FILE.o | sass_counts.py
"""
import re
import sys
from collections import Counter


def report(name, lines):
    if not name or not lines:
        return
    ins = [(addr, op) for addr, op in lines]
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    loop = (0, 0)
    for i, (addr, op) in enumerate(ins):  # the widest backward branch marks the main loop
        m = re.search(r"BRA\s+(?:`?\(?\.L_x_\d+\)?|0x([0-9a-f]+))", op)
        if m and m.group(1):
            target = int(m.group(1), 16)
            if target in index and index[target] < i and i - index[target] > loop[1] - loop[0]:
                loop = (index[target], i)
    body = [op for _, op in ins[loop[0]:loop[1] + 1]] if loop[1] > loop[0] else []
    def kinds(ops):
        c = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0].split(".")[0] for op in ops if op.strip())
        return c
    c_all, c_loop = kinds(op for _, op in ins), kinds(body)
    short = re.sub(r"_ZN6qinfer4cuda\w*?(qgemm\w*)", r"\1", name)[:90]
    print(f"{short}: {len(ins)} instructions, HMMA {c_all['HMMA']}; main loop {len(body)} "
          f"(HMMA {c_loop['HMMA']}, LDSM {c_loop['LDSM']}, LDS {c_loop['LDS']}, LDGSTS {c_loop['LDGSTS']}, "
          f"BAR {c_loop['BAR']}, LOP3 {c_loop['LOP3']}, HADD2/HFMA2 {c_loop['HADD2'] + c_loop['HFMA2']}, "
          f"IADD3/IMAD/LEA {c_loop['IADD3'] + c_loop['IMAD'] + c_loop['LEA']}, ISETP {c_loop['ISETP']}, BRA {c_loop['BRA']})")


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
