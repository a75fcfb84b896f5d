#!/usr/bin/env python3
"""nccl_tests_table.py - the markdown table of a `tools/nccl_tests.sh perf` log: gcomm against NCCL.

  tools/nccl_tests_table.py LOG [--sizes 8,8K,128K,512K,2M,8M] [--a gcomm] [--b nccl]

LOG holds nccl-tests runs, each after a line "=== PROGRAM LIB G=.. round=.." (LIB: gcomm, nccl,
or a name of tools/nccl_tests.sh perf's ALSO). A cell is "A / B" in us (default gcomm / NCCL),
out of place, each the fastest of that library's runs of the size ("*": A slower). A program
whose runs start at 32 B shows 32 B in the first column. Then every size of every program at
which A is slower, the slowest first, with the ratio.
"""
import argparse
import collections
import re

from perf_table import parse_size, pretty as size_name

ORDER = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv",
         "alltoall", "gather", "scatter"]


def read_log(path):
    """times[(program, lib)][size] = [out-of-place us of each run]"""
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    key = None
    with open(path) as f:
        for line in f:
            m = re.match(r"=== (\w+) (\w+) G=\d+ round=\d+", line)
            if m:
                key = (m.group(1), m.group(2))
                continue
            t = line.split()
            # a size of 0 B (a block under one element at this rank count) moves nothing
            if key and len(t) >= 13 and t[0].isdigit() and int(t[0]) > 0:
                try:
                    times[key][int(t[0])].append(float(t[5]))
                except ValueError:
                    pass
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--sizes", default="8,8K,128K,512K,2M,8M")
    ap.add_argument("--a", default="gcomm", help="the library of each cell's first time")
    ap.add_argument("--b", default="nccl", help="the library it is compared with")
    args = ap.parse_args()
    times = read_log(args.log)
    cols = [parse_size(s) for s in args.sizes.split(",")]
    progs = [p for p in ORDER if (p, args.a) in times] + sorted(
        {p for p, _ in times if p not in ORDER})
    print("| collective | " + " | ".join(size_name(c) for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    behind, total = [], 0
    for p in progs:
        g, n = times[(p, args.a)], times[(p, args.b)]
        cells = []
        for c in cols:
            s = c if c in g else min((x for x in g if x >= c), default=None)
            if s is None or s not in n:
                cells.append("")
                continue
            tg, tn = min(g[s]), min(n[s])
            cells.append(f"{tg:.1f} / {tn:.1f}{' *' if tg > tn else ''}")
        print(f"| {p.replace('_', '')} | " + " | ".join(cells) + " |")
        for s in sorted(g):
            if s in n:
                total += 1
                tg, tn = min(g[s]), min(n[s])
                if tg > tn:
                    behind.append((tg / tn, p, s, tg, tn))
    runs = min((len(v) for k in times for v in times[k].values()), default=0)
    print(f"\n{args.a} slower than {args.b} at {len(behind)} of {total} sizes "
          f"(fastest of {runs} runs each):")
    for ratio, p, s, tg, tn in sorted(behind, reverse=True):
        print(f"  {p} {size_name(s)}: {tg:.1f} / {tn:.1f} us = {ratio:.2f}")


if __name__ == "__main__":
    main()
