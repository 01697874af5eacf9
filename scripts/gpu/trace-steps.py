#!/usr/bin/env python3
"""Summarises run.sh step_trace's trace of decode steps replayed from CUDA graphs, each graph node traced (the CSV of
scripts/gpu/cupti-trace.cpp): what each kernel costs inside the graph, where programmatic dependent launches overlap
one kernel with the next and two lanes run side by side, which step-ncu's single cold launches cannot show.

A step begins at the token embedding (a kernel whose name holds "embed") of grid TRACE_EMBED_GRID ("B" for B sequences,
default 1); the last TRACE_STEPS (20) whole steps count. Per kernel name: launches a step, mean duration in the graph
(end - start: a PDL launch's includes its wait for the kernel before), and its "advance": how far it moves the step's
latest kernel end (in start order, end - the latest end before it, at least 0), over every lane: the advances sum to
the time some kernel was running, the rest of the step is "idle". Streams are not used: CUPTI reports a graph's
kernel nodes on streams of its own, not the lanes they were captured on (H100 12-08 01:1x). CUPTI's tracing slows
each kernel (the 10-layer V4 step at b1 2.05 -> 2.81 ms traced), so read the figures as shares, not as times."""
import csv
import importlib.util
import os
import shutil
import subprocess
import sys
from collections import defaultdict

# the kernel names shortened as ncu-steps.py shortens them
_spec = importlib.util.spec_from_file_location("ncu_steps", os.path.join(os.path.dirname(__file__), "ncu-steps.py"))
_ncu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ncu)
short = _ncu.short


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    r = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = r.stdout.splitlines()
    return out if r.returncode == 0 and len(out) == len(names) else names


def kernels(path):
    """(start, end, grid, short name) of every kernel, in start order (the CSV's stream column is not used)."""
    with open(path, newline="") as f:
        raw = list(csv.DictReader(f))
    mangled = sorted({r["name"] for r in raw})
    nice = dict(zip(mangled, demangle(mangled)))
    return sorted((int(r["start"]), int(r["end"]), (int(r["gx"]), int(r["gy"]), int(r["gz"])), short(nice[r["name"]]))
                  for r in raw)


def advances(step):
    """Each kernel of a step with its advance in us: how far its end moves the latest kernel end before it."""
    frontier = step[0][0]
    for s, e, g, name in step:
        yield s, e, g, name, max(0, e - max(frontier, s)) / 1e3
        frontier = max(frontier, e)


def main(path):
    rows = kernels(path)
    if not rows:
        print(f"{path}: no kernels traced")
        return
    grid = int(os.environ.get("TRACE_EMBED_GRID", "1"))
    starts = [i for i, r in enumerate(rows) if "embed" in r[3] and r[2][0] == grid]
    spans = list(zip(starts, starts[1:]))[-int(os.environ.get("TRACE_STEPS", "20")):]
    if not spans:
        print(f"{path}: fewer than two steps of embedding grid {grid}")
        return
    n = len(spans)
    dur, adv, cnt = defaultdict(float), defaultdict(float), defaultdict(float)
    step_us, busy_us = [], []
    for a, b in spans:
        step_us.append((rows[b][0] - rows[a][0]) / 1e3)
        busy = 0.0
        for s, e, _, name, d in advances(rows[a:b]):
            dur[name] += (e - s) / 1e3
            cnt[name] += 1
            adv[name] += d
            busy += d
        busy_us.append(busy)
    mean = lambda v: sum(v) / len(v)
    print(f"{n} steps (embedding grid {grid}): {mean(step_us):.1f} us a step from embedding to embedding (min "
          f"{min(step_us):.1f}), some kernel running {mean(busy_us):.1f} of it, idle {mean(step_us) - mean(busy_us):.1f}")
    print(f"{'advance':>9} {'in graph':>9} {'a step':>7} {'each':>7}  kernel")
    for name in sorted(dur, key=lambda k: -adv[k]):
        print(f"{adv[name] / n:9.1f} {dur[name] / n:9.1f} {cnt[name] / n:7.1f} {dur[name] / cnt[name]:7.2f}  {name}")
    a, b = spans[-1]
    t0 = rows[a][0]
    print("the last step in start order (us from its start: start, end, advance):")
    for s, e, g, name, d in list(advances(rows[a:b]))[: int(os.environ.get("TRACE_LIST", "60"))]:
        print(f"  {(s - t0) / 1e3:8.1f} {(e - t0) / 1e3:8.1f} {d:7.2f} {str(g):16} {name}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
