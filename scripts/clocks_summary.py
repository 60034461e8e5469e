#!/usr/bin/env python3
"""Summarise an nvidia-smi clock log (scripts/device/rows.sh with ROW_CLOCKS=1) over its busy samples.

usage: clocks_summary.py LOG.csv [LABEL]
The log is `nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,power.limit,
temperature.gpu,temperature.memory,clocks_event_reasons.active --format=csv,noheader,nounits -lms 200`. A sample is
busy when the GPU's utilisation is at least 50%. One line: the busy samples' SM and memory clocks (median, lowest),
power (mean, highest, the limit), temperatures (highest) and the share of busy samples under each slowdown reason.
"""
import statistics
import sys

REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "hw power brake"}


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def main():
    path, label = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    busy = []
    with open(path) as f:
        for line in f:
            cols = [c.strip() for c in line.split(",")]
            if len(cols) < 9 or number(cols[1]) is None or number(cols[1]) < 50:
                continue
            busy.append(cols)
    if not busy:
        print(f"{label}: no busy samples")
        return
    def column(i):  # the busy samples' numbers in column i ("[N/A]" left out)
        return [v for v in (number(c[i]) for c in busy) if v is not None]

    sm, mem, power, temps, mem_temps = column(2), column(3), column(4), column(6), column(7)
    reasons = []
    for bit, name in REASONS.items():
        n = sum(1 for c in busy if c[8].startswith("0x") and int(c[8], 16) & bit)
        if n:
            reasons.append(f"{name} {100 * n / len(busy):.0f}%")
    print(f"{label}: {len(busy)} busy samples; SM clock median {statistics.median(sm):.0f} MHz (lowest {min(sm):.0f}), "
          f"memory {statistics.median(mem):.0f} (lowest {min(mem):.0f}); power mean {statistics.mean(power):.0f} W "
          f"(highest {max(power):.0f}, limit {busy[0][5]}); GPU {max(temps):.0f} C, memory "
          f"{max(mem_temps) if mem_temps else 'n/a'} C at most; slowdowns: {', '.join(reasons) or 'none'}")


if __name__ == "__main__":
    main()
