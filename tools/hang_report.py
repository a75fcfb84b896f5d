#!/usr/bin/env python3
"""tools/hang_report.py - which rank is behind, and where, from the dumps in every rank's log.

gcomm prints a dump (lines "GCOMM WARN dump: ...") on GCOMM_PROXY_DUMP_SIGNAL and whenever the
progress engine stops on an error (a timeout, a dead or stopped peer, a mismatch): per rank and
communicator, how many collectives the rank has called, and for every queue the operation at its
head, its step and the peer it waits on. Give this tool every rank's log (GCOMM_DEBUG_FILE with
%h/%p, or the job's stderr; several files or directories, or - for stdin):

    python3 tools/hang_report.py logs/

It keeps each rank's latest dump per communicator and prints what every rank was doing, then one
"verdict:" line: the rank that has called fewer collectives than the others, or else the rank the
others wait on in their oldest blocked collective, or the ranks that never reported. Exit status:
0 with a verdict naming a rank, 1 when no rank looks behind, 2 when the logs hold no dump.
"""
import os
import re
import sys

HEADER = re.compile(
    r'GCOMM WARN dump: rank (\d+)/(\d+) comm "([^"]*)" pid (\d+) \(([^)]*)\): (\d+) collectives '
    r'called, (\d+) ops posted, (\d+) done, (-?\d+) works active, async error: (.*)$')
QUEUE = re.compile(
    r'GCOMM WARN dump: rank (\d+) comm "([^"]*)" queue (\d+): (\w+)(?: peer (\d+)| seq (\d+) root '
    r'(-?\d+)) count (\d+) (\S+) (\S+) algo (\S+) channel (\d+) step (\d+)/(\d+)(?:, waiting (\d+) '
    r'ms to (receive from|send to) rank (\d+) \(fifo tail (\d+) head (\d+)\))?; (\d+) more queued')


def read_lines(paths):
    for path in paths or ["-"]:
        if path == "-":
            yield from sys.stdin
        elif os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if os.path.isfile(full):
                    with open(full, errors="replace") as f:
                        yield from f
        else:
            with open(path, errors="replace") as f:
                yield from f


def parse(lines):
    """{comm: {rank: dump}}: each rank's latest dump (lines of one process come in order)."""
    comms = {}
    for line in lines:
        m = HEADER.search(line)
        if m:
            rank, n, comm = int(m[1]), int(m[2]), m[3]
            comms.setdefault(comm, {})[rank] = {
                "nranks": n, "pid": int(m[4]), "why": m[5], "called": int(m[6]),
                "posted": int(m[7]), "done": int(m[8]), "error": m[10].strip(), "queues": []}
            continue
        m = QUEUE.search(line)
        if m and m[2] in comms and int(m[1]) in comms[m[2]]:
            comms[m[2]][int(m[1])]["queues"].append({
                "func": m[4], "peer": int(m[5]) if m[5] else None,
                "seq": int(m[6]) if m[6] else None, "count": int(m[8]), "channel": int(m[12]),
                "step": int(m[13]), "nsteps": int(m[14]),
                "waitMs": int(m[15]) if m[15] else None, "dir": m[16],
                "waitPeer": int(m[17]) if m[17] else None})
    return comms


def describe(q):
    what = q["func"] + (f" seq {q['seq']}" if q["seq"] is not None else f" with rank {q['peer']}")
    where = f"{what} channel {q['channel']} step {q['step']}/{q['nsteps']}"
    if q["waitPeer"] is not None:
        where += f", waiting {q['waitMs']} ms to {q['dir']} rank {q['waitPeer']}"
    return where


def ranks_text(ranks):
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def verdict(comm, dumps):
    """(verdict text, whether it names a rank)."""
    n = max(d["nranks"] for d in dumps.values())
    missing = [r for r in range(n) if r not in dumps]
    called = {r: d["called"] for r, d in dumps.items()}
    most = max(called.values())
    behind = [r for r, c in called.items() if c < most]
    colls = {r: [q for q in d["queues"] if q["seq"] is not None] for r, d in dumps.items()}
    if behind:
        fewest = min(called[r] for r in behind)
        first = [r for r in behind if called[r] == fewest]
        waiting = [q for r in dumps for q in colls[r] if q["seq"] == fewest]
        at = f"; the others wait in {waiting[0]['func']} seq {fewest}" if waiting else ""
        return (f"{ranks_text(first)} behind: called {fewest} collectives where the most "
                f"advanced called {most} (it never called collective seq {fewest}){at}", True)
    if missing:
        waited = sorted({q["waitPeer"] for d in dumps.values() for q in d["queues"]
                         if q["waitPeer"] in missing})
        extra = f"; the others wait on {ranks_text(waited)}" if waited else ""
        return (f"no dump from {ranks_text(missing)} (dead, stuck outside gcomm, or not "
                f"signalled){extra}", True)
    blocked = [(q["seq"], r, q) for r in dumps for q in colls[r] if q["waitPeer"] is not None]
    if blocked:
        oldest = min(s for s, _, _ in blocked)
        inOp = {r for r in dumps for q in colls[r] if q["seq"] == oldest}
        waitedOn = sorted({q["waitPeer"] for s, _, q in blocked if s == oldest} - inOp)
        if waitedOn:
            return (f"{ranks_text(waitedOn)} behind: the others wait on it in collective seq "
                    f"{oldest}, which it is not running", True)
        return (f"every rank is in collective seq {oldest}; they wait on each other (see above)",
                False)
    p2p = [(r, q) for r, d in dumps.items() for q in d["queues"] if q["seq"] is None]
    if p2p:
        r, q = p2p[0]
        return (f"rank {r} is blocked in {describe(q)}: rank {q['peer']} has no matching call "
                f"in progress", True)
    return f"no rank is behind: every rank called {most} collectives, nothing is pending", False


def main():
    comms = parse(read_lines(sys.argv[1:]))
    if not comms:
        print("no gcomm dump found (set GCOMM_PROXY_DUMP_SIGNAL and signal the ranks, or wait "
              "for GCOMM_TIMEOUT_MS)")
        return 2
    named = False
    for comm, dumps in sorted(comms.items()):
        print(f'communicator "{comm}":')
        for r in sorted(dumps):
            d = dumps[r]
            print(f"  rank {r} (pid {d['pid']}, dump on {d['why']}): {d['called']} collectives "
                  f"called, {d['posted'] - d['done']} operations pending, error: {d['error']}")
            for q in d["queues"]:
                print(f"    {describe(q)}")
        text, names = verdict(comm, dumps)
        named |= names
        print(f'verdict: communicator "{comm}": {text}')
    return 0 if named else 1


if __name__ == "__main__":
    sys.exit(main())
