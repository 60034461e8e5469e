#!/usr/bin/env python3
"""Sums up a scheduler step log (`qinfer serve --step-log FILE`, `qinfer bench --throughput --step-log FILE`).

Steps by kind (decode rows only / with prompt chunks): count, total and percentiles of their time, rows and tokens;
the gaps between steps; the requests' server-side times (queue: submitted -> admitted, TTFT: submitted -> first
token, and TTFT split into the wait for the step in flight and the steps after admission), with --after MS to leave
out what began before that time (a warm-up, an earlier load on the same server).

usage: scripts/step_log.py FILE.csv [--after MS] [--before MS]
"""
import argparse
import csv


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    at = q * (len(v) - 1)
    lo = int(at)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (at - lo)


def p3(v):
    return f"{pct(v, 0.5):.2f} / {pct(v, 0.9):.2f} / {pct(v, 0.99):.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--after", type=float, default=-1e18, help="only steps and requests that began at or after this time (ms)")
    ap.add_argument("--before", type=float, default=1e18, help="only steps and requests that began before this time (ms)")
    a = ap.parse_args()
    steps, reqs = [], []
    with open(a.log) as f:
        for row in csv.reader(line for line in f if not line.startswith("#")):
            if row[0] == "step":
                t, ms, wait, rows, chunks, ctok, adm, fin, run, waiting = row[1:11]
                if a.after <= float(t) < a.before:
                    steps.append(dict(t=float(t), ms=float(ms), wait=float(wait), rows=int(rows), chunks=int(chunks), ctok=int(ctok),
                                      admitted=int(adm), finished=int(fin)))
            elif row[0] == "req":
                _, rid, sub, adm, first, fin, prompt, cached, out, reason = row[:10]
                if a.after <= float(sub) < a.before:
                    reqs.append(dict(sub=float(sub), adm=float(adm), first=float(first), fin=float(fin), prompt=int(prompt), cached=int(cached),
                                     out=int(out), reason=reason))
    if not steps:
        print("no steps in that window")
        return
    span = steps[-1]["t"] + steps[-1]["ms"] - steps[0]["t"]
    busy = sum(s["ms"] for s in steps)
    print(f"{len(steps)} steps over {span:.1f} ms, {busy:.1f} ms inside steps ({busy / span:.1%}), {len(reqs)} requests finished")
    print("| steps | count | ms total | ms p50 / p90 / p99 | decode rows (mean) | prompt tokens (mean) | admitted (mean) |")
    print("|---|---|---|---|---|---|---|")
    for name, sel in (("decode rows only", lambda s: s["chunks"] == 0), ("with prompt chunks", lambda s: s["chunks"] > 0)):
        ss = [s for s in steps if sel(s)]
        if not ss:
            continue
        n = len(ss)
        print(f"| {name} | {n} | {sum(s['ms'] for s in ss):.1f} | {p3([s['ms'] for s in ss])} | {sum(s['rows'] for s in ss) / n:.1f} | "
              f"{sum(s['ctok'] for s in ss) / n:.1f} | {sum(s['admitted'] for s in ss) / n:.2f} |")
    gaps = [b["t"] - (a_["t"] + a_["ms"]) for a_, b in zip(steps, steps[1:])]
    print(f"gaps between steps, ms p50 / p90 / p99: {p3(gaps)} (idle included)")
    if not reqs:
        return
    ok = [r for r in reqs if r["first"] >= 0 and r["adm"] >= 0]
    cached = [r for r in ok if r["cached"] > 0]
    print("| requests | count | queue ms p50 / p90 / p99 | TTFT ms p50 / p90 / p99 | admitted -> first token ms p50 / p90 / p99 |")
    print("|---|---|---|---|---|")
    for name, rs in (("all", ok), ("prefix hit", cached), ("no hit", [r for r in ok if r["cached"] == 0])):
        if rs:
            print(f"| {name} | {len(rs)} | {p3([r['adm'] - r['sub'] for r in rs])} | {p3([r['first'] - r['sub'] for r in rs])} | "
                  f"{p3([r['first'] - r['adm'] for r in rs])} |")


if __name__ == "__main__":
    main()
