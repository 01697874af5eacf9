#!/usr/bin/env python3
"""Summarises run.sh step_ncu's Nsight Compute CSV (gpu__time_duration.sum of each kernel of a window of batch-1
decode steps): the time of each kernel name summed over the window and per step, then one whole step's kernels in
launch order. A step begins at the token embedding (a kernel whose name holds "embed")."""
import csv
import os
import re
import sys
from collections import defaultdict

UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)  # the parameter list
    return re.sub(r"dfl::cuda::", "", name)[:90]


def main(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(r["Metric Value"].replace(",", "")) * UNIT.get(r["Metric Unit"], 1.0)
        rows.append((short(r["Kernel Name"]), r.get("Grid Size", ""), us))
    if not rows:
        print(f"{path}: no kernel rows (see the file for ncu's messages)")
        return
    starts = [i for i, (n, _, _) in enumerate(rows) if "embed" in n]
    # NCU_EMBED_GRID (run.sh: "(B, 1, 1)" for STEP_BATCHES=B): only the steps whose embedding has that grid, as the
    # benchmark's window may hold steps of other batch sizes too (12-07 13:1x: b1 steps among the b8 ones)
    grid = os.environ.get("NCU_EMBED_GRID", "")
    spans = [(a, b) for a, b in zip(starts, starts[1:]) if not grid or rows[a][1] == grid]
    steps = max(1, len(spans))
    # the whole steps of the window only
    window = [row for a, b in spans for row in rows[a:b]] if spans else rows
    total = defaultdict(float)
    count = defaultdict(int)
    for n, _, us in window:
        total[n] += us
        count[n] += 1
    all_us = sum(total.values())
    if not spans:
        # (12-06 08:1x: 1,500 kernels of a 16-row verify held one embedding, ~1.4 steps, and read as one step)
        print(f"{len(window)} kernels and no whole step in the window (fewer than two embeddings{' of grid ' + grid if grid else ''}:"
              f" raise NCU_COUNT); the sums below are the window's, not a step's: {all_us:.1f} us")
    else:
        print(f"{len(window)} kernels in {steps} decode steps: {all_us / steps:.1f} us of kernel time a step (each kernel alone)")
    for n in sorted(total, key=total.get, reverse=True):
        print(f"  {total[n] / steps:8.1f} us/step {100 * total[n] / all_us:5.1f} %  {count[n] / steps:6.1f}/step  {total[n] / count[n]:7.2f} us  {n}")
    if spans:
        first = int(os.environ.get("NCU_STEP_LIST", "40"))
        print(f"one step in launch order (the first {first} kernels):")
        a, b = spans[0]
        for n, g, us in rows[a:b][:first]:
            print(f"  {us:7.2f} us  grid {g:<16} {n}")

if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
