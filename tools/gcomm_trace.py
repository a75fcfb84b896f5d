#!/usr/bin/env python3
"""gcomm_trace.py - merges the per-rank Chrome traces of the example profiler plugin
(examples/profiler/trace.c) into one trace, checks it, and prints a per-collective summary.

  python3 tools/gcomm_trace.py -o merged.json /tmp/trace-*.json        merge + summary
  python3 tools/gcomm_trace.py --check --ranks 4 -o merged.json FILES    + fail on a bad trace

The merged file opens in https://ui.perfetto.dev or chrome://tracing: one process track per rank
(pid = rank), the plugin's threads (ops, channels, proxy) inside it, times shifted so that the
earliest event is at 0 (the ranks' clocks are CLOCK_MONOTONIC of one host; ranks on different
hosts are not aligned). A file cut short by a crash is closed before reading.

--check verifies: valid JSON; one pid per input file, named "rank R" (with --ranks N: exactly
ranks 0..N-1); every event's parent (args.parent) exists in its rank and its time span holds the
child's; each event type has the parent type it must have; the slices of every thread nest (no
partial overlap, which trace viewers cannot draw). Exit status 1 and the first problems listed
when anything fails.

Summary columns: calls per rank, bytes (nccl-tests' size), time = mean over ranks and calls of
the execution span (first ProxyOp/KernelCh start to the end of the last), algbw = bytes/time,
busbw = algbw x nccl-tests' factor for the collective.
"""
import argparse
import collections
import json
import sys

EPS_US = 0.0015  # timestamps carry whole nanoseconds; allow their rounding in floats

PARENT_CATS = {
    "coll": {None, "group"},
    "p2p": {None, "group"},
    "proxyop": {"coll", "p2p"},
    "proxystep": {"proxyop"},
    "kernelch": {"coll", "p2p"},
    "group": {None},
    "proxyctrl": {None},
    "net": {None},
}


def load(path):
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # the process died before the plugin closed the file: close it here
        return json.loads(text.rstrip().rstrip(",") + "\n]}")


def bus_factor(name, n):
    if n <= 1:
        return 1.0
    return {"AllReduce": 2.0 * (n - 1) / n, "AllGather": (n - 1) / n,
            "ReduceScatter": (n - 1) / n, "AllToAll": (n - 1) / n, "Gather": (n - 1) / n,
            "Scatter": (n - 1) / n}.get(name, 1.0)


def merge(paths):
    events, ranks, problems = [], [], []
    for path in paths:
        try:
            trace = load(path)
        except (OSError, ValueError) as e:
            problems.append("%s: not a JSON trace (%s)" % (path, e))
            continue
        evs = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
        names = [e for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"]
        pids = {e.get("pid") for e in evs if e.get("ph") == "X"} | {e.get("pid") for e in names}
        if len(pids) != 1:
            problems.append("%s: %d process ids (%s), expected one" % (path, len(pids), sorted(pids)))
            continue
        rank = pids.pop()
        if rank in ranks:
            problems.append("%s: rank %s is in another file too" % (path, rank))
        if not names or names[0]["args"].get("name") != "rank %s" % rank:
            problems.append("%s: no process_name \"rank %s\"" % (path, rank))
        ranks.append(rank)
        events.extend(evs)
    xs = [e for e in events if e.get("ph") == "X"]
    t0 = min((e["ts"] for e in xs), default=0)
    for e in xs:
        e["ts"] = round(e["ts"] - t0, 3)
    return events, ranks, problems


def check(events, ranks, want_ranks):
    problems = []
    if want_ranks is not None and sorted(ranks) != list(range(want_ranks)):
        problems.append("ranks %s, expected 0..%d" % (sorted(ranks), want_ranks - 1))
    xs = [e for e in events if e.get("ph") == "X"]
    by_id = {}
    for e in xs:
        for key in ("name", "cat", "pid", "tid", "ts", "dur", "args"):
            if key not in e:
                problems.append("event without %s: %s" % (key, e))
                break
        else:
            if e["dur"] < 0:
                problems.append("negative duration: %s" % e)
            by_id[(e["pid"], e["args"]["id"])] = e
    for e in by_id.values():
        pid, parent_id = e["pid"], e["args"].get("parent", 0)
        parent = by_id.get((pid, parent_id)) if parent_id else None
        if parent_id and parent is None:
            problems.append("rank %s: %s %s has a parent %s that is not in the trace"
                            % (pid, e["cat"], e["args"]["id"], parent_id))
            continue
        allowed = PARENT_CATS.get(e["cat"], {None})
        if (parent["cat"] if parent else None) not in allowed:
            problems.append("rank %s: %s %s has a %s parent" % (pid, e["cat"], e["args"]["id"],
                                                                 parent["cat"] if parent else "no"))
        if parent and (e["ts"] < parent["ts"] - EPS_US or
                       e["ts"] + e["dur"] > parent["ts"] + parent["dur"] + EPS_US):
            problems.append("rank %s: %s %s [%.3f, %.3f] is not inside its parent %s %s "
                            "[%.3f, %.3f]" % (pid, e["cat"], e["args"]["id"], e["ts"],
                                              e["ts"] + e["dur"], parent["cat"], parent_id,
                                              parent["ts"], parent["ts"] + parent["dur"]))
    threads = collections.defaultdict(list)
    for e in by_id.values():
        threads[(e["pid"], e["tid"])].append(e)
    for (pid, tid), evs in threads.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS_US:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS_US:
                problems.append("rank %s thread %s: %s %s overlaps %s %s without nesting"
                                % (pid, tid, e["cat"], e["args"]["id"], stack[-1]["cat"],
                                   stack[-1]["args"]["id"]))
            stack.append(e)
    return problems


def summary(events, nranks):
    rows = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("coll", "p2p"):
            continue
        a = e["args"]
        name = e["name"] if e["cat"] == "coll" else e["name"].split()[0]
        if a.get("exec_us", 0) > 0:
            rows[(name, a["bytes"])].append(a["exec_us"])
    lines = ["# %-14s %12s %8s %11s %12s %12s" % ("collective", "bytes", "calls", "time (us)",
                                                   "algbw (GB/s)", "busbw (GB/s)")]
    for (name, nbytes), times in sorted(rows.items()):
        t = sum(times) / len(times)
        algbw = nbytes / (t * 1e3) if t > 0 else 0.0
        lines.append("  %-14s %12d %8d %11.2f %12.3f %12.3f" % (
            name, nbytes, len(times) // max(nranks, 1), t, algbw, algbw * bus_factor(name, nranks)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="the per-rank traces (GCOMM_PROFILER_TRACE)")
    ap.add_argument("-o", "--output", default="gcomm-trace.json", help="merged trace to write")
    ap.add_argument("--check", action="store_true", help="verify the trace; exit 1 if bad")
    ap.add_argument("--ranks", type=int, help="with --check: the number of ranks expected")
    ap.add_argument("--no-summary", action="store_true", help="skip the summary table")
    args = ap.parse_args()
    events, ranks, problems = merge(args.files)
    with open(args.output, "w") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    nx = sum(1 for e in events if e.get("ph") == "X")
    print("# merged %d files (ranks %s), %d events -> %s" % (len(args.files), sorted(ranks), nx,
                                                            args.output))
    if not args.no_summary:
        print(summary(events, len(ranks)))
    if args.check:
        problems += check(events, ranks, args.ranks)
        for p in problems[:20]:
            print("trace problem: %s" % p)
        if problems:
            print("trace check FAILED: %d problems" % len(problems))
            return 1
        print("trace check passed: %d ranks, %d events, parents hold their children, threads nest"
              % (len(ranks), nx))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
