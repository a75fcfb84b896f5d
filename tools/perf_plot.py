#!/usr/bin/env python3
"""perf_plot.py - plot bus bandwidth against message size from gcomm_perf logs (a PNG).

  python3 tools/perf_plot.py LOG... -o OUT.png [--coll allreduce] [--vs nccl|mpi]
                             [--title TEXT] [--in-place]

Reads the logs as tools/perf_table.py does (gcomm_perf's side-by-side table, or one nccl-tests
table per backend) and draws gcomm's busbw and the other backend's against the size, both axes
logarithmic. Several logs: sizes measured in more than one (several runs of one command, or a
small-size sweep and a large-size one that meet) are drawn at their median, with the range over
the runs as a band. Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_table  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(runs, coll, backend, in_place):
    """{size: [busbw of each run that has it]}, positive values only."""
    col = 2 if in_place else 1
    out = {}
    for rows in runs:
        for (c, b, size), values in rows.items():
            if c == coll and b == backend and values[col] > 0 and not math.isnan(values[col]):
                out.setdefault(size, []).append(values[col])
    return out


def draw(ax, data, label, style):
    sizes = sorted(data)
    if not sizes:
        return
    med = [statistics.median(data[s]) for s in sizes]
    ax.plot(sizes, med, style, label=label, markersize=4)
    if any(len(data[s]) > 1 for s in sizes):
        ax.fill_between(sizes, [min(data[s]) for s in sizes], [max(data[s]) for s in sizes],
                        alpha=0.2, color=ax.lines[-1].get_color())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--coll", default="allreduce")
    ap.add_argument("--vs", default="nccl")
    ap.add_argument("--title", default="")
    ap.add_argument("--in-place", action="store_true")
    a = ap.parse_args()
    runs = [perf_table.read_rows(path) for path in a.log]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    runs_note = f", median of {len(runs)} runs" if len(runs) > 2 else ""
    ours, theirs = series(runs, a.coll, "gcomm", a.in_place), series(runs, a.coll, a.vs, a.in_place)
    if not ours or not theirs:
        sys.exit(f"perf_plot.py: no {a.coll} rows of gcomm and {a.vs} in {' '.join(a.log)}")
    draw(ax, ours, "gcomm", "o-")
    draw(ax, theirs, {"mpi": "MPI", "nccl": "NCCL"}.get(a.vs, a.vs), "s--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [1 << k for k in range(0, 34, 4)]
    ax.set_xticks(ticks, [perf_table.pretty(t).replace(" ", "") for t in ticks])
    ax.set_xlim(min(ours) / 1.5, max(ours) * 1.5)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    place = "in place" if a.in_place else "out of place"
    ax.set_title(f"{a.title or a.coll} ({a.coll}, {place}{runs_note})", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.output, dpi=100)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
