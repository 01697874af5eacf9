#!/usr/bin/env python3
"""Summarises run.sh step_trace's trace of decode steps replayed from CUDA graphs, each graph node traced (the CSV of
scripts/gpu/cupti-trace.cpp, or an Nsight Systems sqlite export): what each kernel costs inside the graph, where programmatic dependent launches overlap one
kernel with the next and two lanes (streams) run side by side, which step-ncu's single cold launches cannot show.

A step begins at the token embedding (a kernel whose name holds "embed") of grid TRACE_EMBED_GRID ("B" for B sequences,
default 1); the last TRACE_STEPS (20) whole steps count. Per kernel name: launches a step, mean duration in the graph
(end - start: PDL launches include their wait), and its "advance": on the embedding's stream (the main lane) how far
the kernel moves the lane's latest end (end - the latest end before it, at least 0), summing to the lane's share of
the step; on other streams (side lanes) its duration only. Then one step's kernels in start order."""
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
    dur, adv, cnt, side = defaultdict(float), defaultdict(float), defaultdict(float), defaultdict(bool)
    step_us, main_us = [], []
    for a, b in spans:
        t0, main = rows[a][0], rows[a][2]
        step_us.append((rows[b][0] - t0) / 1e3)
        frontier = t0
        for s, e, st, _, name in rows[a:b]:
            dur[name] += (e - s) / 1e3
            cnt[name] += 1
            if st == main:
                adv[name] += max(0, e - frontier) / 1e3
                frontier = max(frontier, e)
            else:
                side[name] = True
        main_us.append((frontier - t0) / 1e3)
    mean = lambda v: sum(v) / len(v)
    if len({r[2] for a, b in spans for r in rows[a:b]}) == 1:
        print("(one stream in the trace: graph nodes may all report the stream the graph was launched on, so the side "
              "lane's kernels count on the main lane's frontier too)")
    print(f"{n} steps (embedding grid {grid}): {mean(step_us):.1f} us a step from embedding to embedding, "
          f"the main lane's kernels ending {mean(main_us):.1f} us after its start (min step {min(step_us):.1f})")
    print(f"{'advance':>9} {'in graph':>9} {'a step':>7} {'each':>7}  kernel (advance: on the main lane; side: another lane)")
    for name in sorted(dur, key=lambda k: -(adv[k] or dur[k] * 1e-3)):
        a = f"{adv[name] / n:9.1f}" if not side[name] or adv[name] else f"{'side':>9}"
        print(f"{a} {dur[name] / n:9.1f} {cnt[name] / n:7.1f} {dur[name] / cnt[name]:7.2f}  {name}")
    a, b = spans[-1]
    t0, main = rows[a][0], rows[a][2]
    print("the last step in start order (us from its start: start, end, advance on the main lane; * a side lane):")
    frontier = t0
    for s, e, st, g, name in rows[a:b][: int(os.environ.get("TRACE_LIST", "60"))]:
        ad = max(0, e - frontier) / 1e3 if st == main else 0.0
        if st == main:
            frontier = max(frontier, e)
        print(f"  {(s - t0) / 1e3:8.1f} {(e - t0) / 1e3:8.1f} {ad:7.2f} {'*' if st != main else ' '} {str(g):16} {name}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
