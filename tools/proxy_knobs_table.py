#!/usr/bin/env python3
"""proxy_knobs_table.py - the markdown table of tools/proxy_knobs.sh's logs (docs/TUNING.md).

  tools/proxy_knobs_table.py OUTDIR/*.log

A row per setting (NAME-lat.log and NAME-bw.log, the INFO lines in NAME-*.err): the all-reduce's out-of-place time in us at
8 B, 512 B, 4 KB and 64 KB, its out-of-place busbw in GB/s at 1 MB, 16 MB, 64 MB, 256 MB and 1 GB, and
the progress thread's CPU time per operation in each range (the mean over the ranks that report
one; "-" where no progress thread ran: a GPU communicator without a proxy never starts it). A
run that failed or was skipped shows "?" for what it lacks.
"""
import re
import sys

LAT_SIZES = [8, 512, 4096, 65536]
BW_SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+")
CPU = re.compile(r"progress thread CPU time: .* ([\d.]+) us an operation")


def lines(path):
    try:
        with open(path) as f:
            return f.readlines()
    except OSError:
        return []


def read(base):
    """base.log's {size: (time_us, busbw)} and setting; base.err's [cpu us/op per rank]."""
    rows, what = {}, ""
    for line in lines(base + ".log"):
        if line.startswith("# setting "):
            what = line.split(":", 1)[1].strip()
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(4)))
    cpu = [float(m.group(1)) for m in map(CPU.search, lines(base + ".err")) if m]
    return rows, cpu, what


def pretty(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return "%d %sB" % (n >> shift, unit)
    return "%d B" % n


def cell(rows, size, index, fmt):
    return fmt % rows[size][index] if size in rows else "?"


def cpu_cell(cpu, rows):
    if cpu:
        return "%.2f" % (sum(cpu) / len(cpu))
    return "-" if rows else "?"


def main(paths):
    names = []
    for p in paths:
        m = re.search(r"([^/]+)-(lat|bw)\.log$", p)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    folder = {re.sub(r"-(lat|bw)\.log$", "", p).rsplit("/", 1)[-1]: p.rsplit("/", 1)[0]
              for p in paths if "/" in p}
    head = (["setting"] + ["%s us" % pretty(s) for s in LAT_SIZES] +
            ["%s GB/s" % pretty(s) for s in BW_SIZES] + ["proxy CPU us/op (lat, bw)", "knobs"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        base = (folder.get(name, ".") + "/" + name)
        lat, lcpu, what = read(base + "-lat")
        bw, bcpu, _ = read(base + "-bw")
        cells = ([name] + [cell(lat, s, 0, "%.1f") for s in LAT_SIZES] +
                 [cell(bw, s, 1, "%.1f") for s in BW_SIZES] +
                 ["%s, %s" % (cpu_cell(lcpu, lat), cpu_cell(bcpu, bw)), what or "defaults"])
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
