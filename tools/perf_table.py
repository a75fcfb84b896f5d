#!/usr/bin/env python3
"""perf_table.py - turn gcomm_perf logs (several backends in one run) into markdown tables.

  tools/perf_table.py LOG... [--sizes 8,32K,2M,16M,128M,1G] [--vs nccl|mpi] [--coll allreduce,...]
                      [--behind-from 1M] [--merge] [--wins]

A log holds either gcomm_perf's side-by-side table ("# Backends: gcomm mpi") or one nccl-tests
table per backend ("# Backend: gcomm", gcomm_perf --separate), or is nccl-tests' own output
(all_reduce_perf ...: read as backend nccl). --merge: the logs are parts of one run (gcomm_perf
--backend gcomm and nccl-tests run one after the other, or a small-size and a large-size sweep).

One log: a row per collective and size, with the time and busbw (out-of-place, plus in-place busbw)
of gcomm and of the other backend, and the other's time over gcomm's (the busbw ratio gcomm/other;
above 1, gcomm is faster). Several logs (runs of one command): a row per collective and size, with
each run's ratio out of place / in place and their medians: a machine that drifts shows in the
spread, and no single run stands for the others.
--wins: per collective and size, the median ratio out of place and in place and in
how many runs each was at least 1.0 (gcomm level or ahead), instead of every run's ratio.
--behind-from SIZE: then, per log, the sizes from SIZE at which gcomm's busbw is below the other's,
out of place or in place, and in how many logs there is none.
"""
import argparse
import re
import statistics


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def pretty(n):
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def num(text):
    return float(text) if re.match(r"^[0-9.e+-]+$", text) else float("nan")


def read_rows(path):
    """{(collective, backend, size): (time, busbw out of place, busbw, time in place)}."""
    rows, coll, backend, side = {}, None, None, None
    for line in open(path):
        m = re.match(r"# Collective test starting: (\w+)_perf", line)
        if m:  # nccl-tests: all_reduce_perf, all_gather_perf, ...
            coll, backend = m.group(1).replace("_", ""), "nccl"
            continue
        m = re.match(r"# Collective: (\w+)", line)
        if m:
            coll = m.group(1)
            continue
        m = re.match(r"# Backend: (\w+)", line)
        if m:
            backend, side = m.group(1), None
            continue
        m = re.match(r"# Backends: ([\w ]+?) \(", line)
        if m:
            side = m.group(1).split()
            continue
        f = line.split()
        if not f or not f[0].isdigit():
            continue
        if side:
            # per half of a row: n times, n busbw, n-1 ratios, #wrong
            n = len(side)
            if len(f) >= 5 + 6 * n:
                for i, b in enumerate(side):
                    rows[(coll, b, int(f[0]))] = (num(f[5 + i]), num(f[5 + n + i]),
                                                  num(f[5 + 4 * n + i]), num(f[5 + 3 * n + i]))
        elif len(f) >= 13:
            rows[(coll, backend, int(f[0]))] = (num(f[5]), num(f[7]), num(f[11]), num(f[9]))
    return rows


def ratio_table(runs, colls, sizes, other):
    """Each run's time ratio other/gcomm (= busbw gcomm/other), out of place / in place."""
    heads = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    print(f"| collective | size | {heads} | median |")
    print("|---|---|" + "---|" * (len(runs) + 1))
    for c in colls:
        for s in sorted({k[2] for rows in runs for k in rows if k[0] == c}):
            if sizes and s not in sizes:
                continue
            pairs = []
            for rows in runs:
                g, o = rows.get((c, "gcomm", s)), rows.get((c, other, s))
                if g and o and g[0] > 0 and g[3] > 0:
                    pairs.append((o[0] / g[0], o[3] / g[3]))
            if not pairs:
                continue
            cells = " | ".join(f"{p[0]:.2f} / {p[1]:.2f}" for p in pairs)
            med = (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs))
            print(f"| {c} | {pretty(s)} | {cells} | **{med[0]:.2f} / {med[1]:.2f}** |")


def wins_table(runs, colls, sizes, other):
    """Per cell: the median ratio other/gcomm and how many runs had it at least 1.0."""
    print(f"| collective | size | median out of place | runs >= 1.0 | median in place | runs >= 1.0 |")
    print("|---|---|---|---|---|---|")
    for c in colls:
        for s in sorted({k[2] for rows in runs for k in rows if k[0] == c}):
            if sizes and s not in sizes:
                continue
            cols = []
            for side in (0, 3):  # time out of place, time in place
                r = []
                for rows in runs:
                    g, o = rows.get((c, "gcomm", s)), rows.get((c, other, s))
                    if g and o and g[side] > 0 and o[side] == o[side]:
                        r.append(o[side] / g[side])
                cols.append(f"{statistics.median(r):.2f} | {sum(x >= 1.0 for x in r)}/{len(r)}"
                            if r else "- | -")
            print(f"| {c} | {pretty(s)} | {cols[0]} | {cols[1]} |")


def behind_table(paths, runs, colls, other, least):
    """Per run: the sizes from `least` at which gcomm's busbw is below the other's."""
    met = 0
    print(f"\n| run | sizes from {pretty(least)} where gcomm is behind (ratio out of place / in place) |")
    print("|---|---|")
    for path, rows in zip(paths, runs):
        behind = []
        for c in colls:
            for s in sorted({k[2] for k in rows if k[0] == c and k[2] >= least}):
                g, o = rows.get((c, "gcomm", s)), rows.get((c, other, s))
                if g and o and (g[0] > o[0] or g[3] > o[3]):
                    behind.append(f"{pretty(s)} {o[0] / g[0]:.2f} / {o[3] / g[3]:.2f}")
        met += not behind
        print(f"| {path} | {', '.join(behind) if behind else 'none'} |")
    print(f"\ngcomm ahead at every size from {pretty(least)} in {met} of {len(runs)} runs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="+")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--vs", default="nccl")
    ap.add_argument("--coll", default="")
    ap.add_argument("--behind-from", default="")
    ap.add_argument("--merge", action="store_true")
    ap.add_argument("--wins", action="store_true")
    a = ap.parse_args()
    runs = [read_rows(path) for path in a.log]
    if a.merge:
        runs = [{k: v for rows in runs for k, v in rows.items()}]
    rows = runs[0]
    colls = a.coll.split(",") if a.coll else list(dict.fromkeys(k[0] for k in rows))
    sizes = [parse_size(s) for s in a.sizes.split(",")] if a.sizes else None
    other = a.vs
    if a.wins or len(runs) > 1:
        (wins_table if a.wins else ratio_table)(runs, colls, sizes, other)
        if a.behind_from:
            behind_table(a.log, runs, colls, other, parse_size(a.behind_from))
        return
    print(f"| collective | size | gcomm time (us) | {other} time (us) | gcomm busbw (GB/s) | "
          f"{other} busbw (GB/s) | gcomm in-place busbw | {other} in-place busbw | {other}/gcomm time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in colls:
        for s in sorted({k[2] for k in rows if k[0] == c}):
            if sizes and s not in sizes:
                continue
            g, o = rows.get((c, "gcomm", s)), rows.get((c, other, s))
            if not g or not o:
                continue
            ratio = f"{o[0] / g[0]:.2f}" if g[0] > 0 else "-"
            print(f"| {c} | {pretty(s)} | {g[0]:.1f} | {o[0]:.1f} | {g[1]:.2f} | {o[1]:.2f} | "
                  f"{g[2]:.2f} | {o[2]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
