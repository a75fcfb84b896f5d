#!/usr/bin/env python3
"""perf_table.py - turn a gcomm_perf log (several backends in one run) into a markdown table.

  tools/perf_table.py LOG [--sizes 8,32K,2M,16M,128M,1G] [--vs nccl|mpi] [--coll allreduce,...]

One row per collective and size: time and busbw (out-of-place, plus in-place busbw) of gcomm and
of the other backend, and their busbw ratio.
"""
import argparse
import re


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def pretty(n):
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def read_rows(path):
    rows, coll, backend = {}, None, None
    for line in open(path):
        m = re.match(r"# Collective: (\w+)", line)
        if m:
            coll = m.group(1)
            continue
        m = re.match(r"# Backend: (\w+)", line)
        if m:
            backend = m.group(1)
            continue
        f = line.split()
        if len(f) >= 13 and f[0].isdigit():
            num = lambda s: float(s) if re.match(r"^[0-9.e+-]+$", s) else float("nan")
            rows[(coll, backend, int(f[0]))] = (num(f[5]), num(f[7]), num(f[11]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--vs", default="nccl")
    ap.add_argument("--coll", default="")
    a = ap.parse_args()
    rows = read_rows(a.log)
    colls = a.coll.split(",") if a.coll else list(dict.fromkeys(k[0] for k in rows))
    sizes = [parse_size(s) for s in a.sizes.split(",")] if a.sizes else None
    other = a.vs
    print(f"| collective | size | gcomm time (us) | {other} time (us) | gcomm busbw (GB/s) | "
          f"{other} busbw (GB/s) | gcomm in-place busbw | {other} in-place busbw | gcomm/{other} busbw |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in colls:
        for s in sorted({k[2] for k in rows if k[0] == c}):
            if sizes and s not in sizes:
                continue
            g, o = rows.get((c, "gcomm", s)), rows.get((c, other, s))
            if not g or not o:
                continue
            ratio = f"{g[1] / o[1]:.2f}" if o[1] >= 0.5 else "-"
            print(f"| {c} | {pretty(s)} | {g[0]:.1f} | {o[0]:.1f} | {g[1]:.2f} | {o[1]:.2f} | "
                  f"{g[2]:.2f} | {o[2]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
