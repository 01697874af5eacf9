#!/usr/bin/env python3
"""Summarises run.sh step_trace's trace of decode steps replayed from CUDA graphs, each graph node traced (the CSV of
scripts/gpu/cupti-trace.cpp, or an Nsight Systems sqlite export): what each kernel costs inside the graph, where programmatic dependent launches overlap one
kernel with the next and two lanes (streams) run side by side, which step-ncu's single cold launches cannot show.

A step begins at the token embedding (a kernel whose name holds "embed") of grid TRACE_EMBED_GRID ("B" for B sequences,
default 1); the last TRACE_STEPS (20) whole steps count. Per kernel name: launches a step, mean duration in the graph
(end - start: a PDL launch's includes its wait for the kernel before), and its "advance": how far it moves the step's
latest kernel end (in start order, end - the latest end before it, at least 0), over every lane: the advances sum to
the time some kernel was running, the rest of the step is "idle". Streams are not used: CUPTI reports a graph's
kernel nodes on streams of its own, not the lanes they were captured on (H100 12-08 01:1x). CUPTI's tracing slows
each kernel (the 10-layer V4 step at b1 2.05 -> 2.81 ms traced), so read the figures as shares, not as times."""
import csv
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    return re.sub(r"dfl::cuda::", "", name)[:80]


def demangle(names):
    if not shutil.which("c++filt"):
        return names
    r = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = r.stdout.splitlines()
    return out if r.returncode == 0 and len(out) == len(names) else names


def kernels(path):
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            raw = list(csv.DictReader(f))
        names = demangle(sorted({r["name"] for r in raw}))
        nice = dict(zip(sorted({r["name"] for r in raw}), names))
        rows = [(int(r["start"]), int(r["end"]), int(r["stream"]), (int(r["gx"]), int(r["gy"]), int(r["gz"])),
                 short(nice[r["name"]])) for r in raw]
        return sorted(rows)
    db = sqlite3.connect(path)
    cols = {r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    name_col = "demangledName" if "demangledName" in cols else "shortName"
    q = (f"SELECT k.start, k.end, k.streamId, k.gridX, k.gridY, k.gridZ, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
         f"JOIN StringIds s ON s.id = k.{name_col} ORDER BY k.start")
    return [(a, b, st, (gx, gy, gz), short(n)) for a, b, st, gx, gy, gz, n in db.execute(q)]


def main(path):
    rows = kernels(path)
    if not rows:
        print(f"{path}: no kernels traced")
        return
    grid = int(os.environ.get("TRACE_EMBED_GRID", "1"))
    starts = [i for i, r in enumerate(rows) if "embed" in r[4] and r[3][0] == grid]
    spans = list(zip(starts, starts[1:]))[-int(os.environ.get("TRACE_STEPS", "20")):]
    if not spans:
        print(f"{path}: fewer than two steps of embedding grid {grid}")
        return
    n = len(spans)
    dur, adv, cnt = defaultdict(float), defaultdict(float), defaultdict(float)
    step_us, busy_us = [], []
    for a, b in spans:
        t0 = frontier = rows[a][0]
        step_us.append((rows[b][0] - t0) / 1e3)
        busy = 0.0
        for s, e, _, _, name in rows[a:b]:
            dur[name] += (e - s) / 1e3
            cnt[name] += 1
            d = max(0, e - max(frontier, s)) / 1e3
            adv[name] += d
            busy += d
            frontier = max(frontier, e)
        busy_us.append(busy)
    mean = lambda v: sum(v) / len(v)
    print(f"{n} steps (embedding grid {grid}): {mean(step_us):.1f} us a step from embedding to embedding (min "
          f"{min(step_us):.1f}), some kernel running {mean(busy_us):.1f} of it, idle {mean(step_us) - mean(busy_us):.1f}")
    print(f"{'advance':>9} {'in graph':>9} {'a step':>7} {'each':>7}  kernel")
    for name in sorted(dur, key=lambda k: -adv[k]):
        print(f"{adv[name] / n:9.1f} {dur[name] / n:9.1f} {cnt[name] / n:7.1f} {dur[name] / cnt[name]:7.2f}  {name}")
    a, b = spans[-1]
    t0 = frontier = rows[a][0]
    print("the last step in start order (us from its start: start, end, advance):")
    for s, e, _, g, name in rows[a:b][: int(os.environ.get("TRACE_LIST", "60"))]:
        d = max(0, e - max(frontier, s)) / 1e3
        frontier = max(frontier, e)
        print(f"  {(s - t0) / 1e3:8.1f} {(e - t0) / 1e3:8.1f} {d:7.2f} {str(g):16} {name}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
