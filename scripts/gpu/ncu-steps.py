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
    steps = max(1, len(starts) - 1)
    # the whole steps of the window only
    window = rows[starts[0]:starts[-1]] if len(starts) > 1 else rows
    total = defaultdict(float)
    count = defaultdict(int)
    for n, _, us in window:
        total[n] += us
        count[n] += 1
    all_us = sum(total.values())
    if len(starts) < 2:
        # (12-06 08:1x: 1,500 kernels of a 16-row verify held one embedding, ~1.4 steps, and read as one step)
        print(f"{len(window)} kernels and no whole step in the window (fewer than two embeddings: raise NCU_COUNT);"
              f" the sums below are the window's, not a step's: {all_us:.1f} us")
    else:
        print(f"{len(window)} kernels in {steps} decode steps: {all_us / steps:.1f} us of kernel time a step (each kernel alone)")
    for n in sorted(total, key=total.get, reverse=True):
        print(f"  {total[n] / steps:8.1f} us/step {100 * total[n] / all_us:5.1f} %  {count[n] / steps:6.1f}/step  {total[n] / count[n]:7.2f} us  {n}")
    if len(starts) > 1:
        first = int(os.environ.get("NCU_STEP_LIST", "40"))
        print(f"one step in launch order (the first {first} kernels):")
        for n, g, us in rows[starts[0]:starts[1]][:first]:
            print(f"  {us:7.2f} us  grid {g:<16} {n}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
