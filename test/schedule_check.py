#!/usr/bin/env python3
"""test/schedule_check.py - checks the schedules gcomm_schedule prints (--steps) against the
definitions of the collectives, without gcomm's code: run by test/test_schedule.sh.

For every collective and algorithm on 1 to 8 ranks (roots first, middle and last), and on a few
rank counts with counts and chunk sizes that take several rounds, it runs `gcomm_schedule
--steps` and then:
  - the steps' fields are in range: peers are ranks, buffer ranges lie inside the buffers (whose
    sizes the collective's definition gives), nothing writes the input buffer;
  - it runs the steps over FIFOs between every pair of ranks, of as many slots as gcomm's (the
    tool's first line says how many): rank a's k-th slot to b is b's k-th from a, each rank runs
    its steps in order, a step waits until what it reads has arrived and what it writes has room.
    Every rank must finish, every slot sent be received, and a slot hold as many elements as its
    receiver expects;
  - the tool's rounds agree: a rank's rounds increase, and a slot is received in a round after
    the one it was sent in;
  - with symbolic data (element i of rank p's input is the leaf (p, i); a reduction is a node of
    two values) the outputs at the end are the collective's definition: each reduced element holds
    every rank's contribution exactly once, each copied one is the right rank's element, and an
    all-reduce's element is the same expression on every rank (up to a op b == b op a), so every
    rank gets the same bits.
An algorithm a collective does not have runs another (gcommSchedAlgo): it is checked to print
that one's steps. Prints one PASS or FAIL line per collective, algorithm and size over all rank
counts.
Usage: schedule_check.py GCOMM_SCHEDULE
"""
import collections
import concurrent.futures
import os
import subprocess
import sys

MAX_RANKS = 8
# collective -> (its buffers' sizes for count c on n ranks: input, output; rooted)
BUFFERS = {
    "allreduce": (lambda c, n: (c, c), False),
    "broadcast": (lambda c, n: (c, c), True),
    "reduce": (lambda c, n: (c, c), True),
    "allgather": (lambda c, n: (c, n * c), False),
    "reducescatter": (lambda c, n: (n * c, c), False),
    "alltoall": (lambda c, n: (n * c, n * c), False),
    "gather": (lambda c, n: (c, n * c), True),
    "scatter": (lambda c, n: (n * c, c), True),
}
ALGOS = ["ring", "tree", "direct", "twoshot", "recdbl"]
PER_RANK = {"allgather", "reducescatter", "alltoall", "gather", "scatter"}


class Wrong(Exception):
    pass


def parse_steps(text, n):
    """{rank: [step, ...]} from the --steps lines, each step a dict."""
    steps = {r: [] for r in range(n)}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        f = dict(kv.split("=", 1) for kv in line.split())
        peers = lambda v: [] if v == "-" else [int(p) for p in v.split(",")]
        buf = lambda v: (v.split(":")[0], int(v.split(":")[1]))
        step = {
            "rank": int(f["rank"]), "index": int(f["step"]), "round": int(f["round"]),
            "recv": peers(f["recv"]), "send": peers(f["send"]), "src": buf(f["src"]),
            "dst": buf(f["dst"]), "count": int(f["count"]), "reduce": f["reduce"] == "1",
        }
        if not 0 <= step["rank"] < n:
            raise Wrong("a step of rank %d" % step["rank"])
        steps[step["rank"]].append(step)
    for r, mine in steps.items():
        if [s["index"] for s in mine] != list(range(len(mine))):
            raise Wrong("rank %d's steps are not numbered 0, 1, ..." % r)
    return steps


def check_fields(st, n, sizes):
    where = "rank %d step %d" % (st["rank"], st["index"])
    for p in st["recv"] + st["send"]:
        if not 0 <= p < n:
            raise Wrong("%s: peer %d is not a rank" % (where, p))
    if st["dst"][0] == "in":
        raise Wrong("%s writes the input buffer" % where)
    for name, (buf, off) in (("src", st["src"]), ("dst", st["dst"])):
        if buf != "-" and buf not in sizes:
            raise Wrong("%s: %s is %s, a buffer this schedule does not have" % (where, name, buf))
        if buf != "-" and off + st["count"] > sizes[buf]:
            raise Wrong("%s: %s %s[%d..%d] is past the buffer's %d elements"
                        % (where, name, buf, off, off + st["count"] - 1, sizes[buf]))


def op(a, b):
    """A reduction node; its operands in a fixed order, as a op b == b op a."""
    return ("op",) + tuple(sorted((a, b), key=repr))


def value_of(st, mem, got):
    """The step's value: the local operand combined with (or replaced by) what it received."""
    where = "rank %d step %d" % (st["rank"], st["index"])
    buf, off = st["src"]
    local = mem[buf][off:off + st["count"]] if buf != "-" else None
    if local is not None and None in local:
        raise Wrong("%s reads %s[%d..] before anything wrote it" % (where, buf, off))
    if not got:
        if local is None:
            raise Wrong("%s has no value: nothing received and no local operand" % where)
        return list(local)
    if not st["reduce"]:
        if len(got) != 1:
            raise Wrong("%s receives two slots and does not reduce them" % where)
        return list(got[0])
    value = list(local) if local is not None else None
    for slot in got:
        value = list(slot) if value is None else [op(a, b) for a, b in zip(value, slot)]
    if any(v is None for v in value):
        raise Wrong("%s reduces an element nobody wrote" % where)
    return value


def run(steps, n, sizes, slots):
    """Runs every rank's steps over the FIFOs; returns each rank's buffers at the end."""
    mem = {r: {"in": [(r, i) for i in range(sizes["in"])], "out": [None] * sizes["out"],
               "scr": [None] * sizes.get("scr", 0)} for r in range(n)}
    fifo = collections.defaultdict(collections.deque)  # (from, to) -> [(value, round)]
    nxt = [0] * n
    while any(nxt[r] < len(steps[r]) for r in range(n)):
        moved = False
        for r in range(n):
            while nxt[r] < len(steps[r]) and can_run(steps[r][nxt[r]], fifo, slots):
                run_step(steps[r][nxt[r]], mem[r], fifo)
                nxt[r] += 1
                moved = True
        if not moved:
            raise Wrong("stalls: ranks wait at steps %s" % nxt)
    left = [k for k, q in fifo.items() if q]
    if left:
        raise Wrong("slots sent and never received, from rank to rank: %s" % left)
    return mem


def can_run(st, fifo, slots):
    need = collections.Counter(st["recv"])
    room = collections.Counter(st["send"])
    return (all(len(fifo[(p, st["rank"])]) >= k for p, k in need.items()) and
            all(len(fifo[(st["rank"], q)]) + k <= slots for q, k in room.items()))


def run_step(st, mem, fifo):
    where = "rank %d step %d" % (st["rank"], st["index"])
    got = []
    for p in st["recv"]:
        data, sent_round = fifo[(p, st["rank"])].popleft()
        if len(data) != st["count"]:
            raise Wrong("%s expects %d elements from rank %d, which sent %d"
                        % (where, st["count"], p, len(data)))
        if sent_round >= st["round"]:
            raise Wrong("%s (round %d) receives a slot sent in round %d"
                        % (where, st["round"], sent_round))
        got.append(data)
    if st["count"] == 0 and not st["send"]:
        return
    value = value_of(st, mem, got)
    buf, off = st["dst"]
    if buf != "-":
        mem[buf][off:off + st["count"]] = value
    for q in st["send"]:
        fifo[(st["rank"], q)].append((value, st["round"]))


def leaves(v):
    return [v] if v is None or v[0] != "op" else leaves(v[1]) + leaves(v[2])


def expect_sum(mem, r, i, terms, what):
    got = sorted(leaves(mem[r]["out"][i]), key=repr)
    if got != sorted(terms):
        raise Wrong("%s: rank %d's out[%d] holds %s, not every rank's once: %s"
                    % (what, r, i, got, sorted(terms)))


def expect_copy(mem, r, i, leaf, what):
    if mem[r]["out"][i] != leaf:
        raise Wrong("%s: rank %d's out[%d] is %s, not (rank, element) %s"
                    % (what, r, i, mem[r]["out"][i], leaf))


def check_result(coll, mem, n, c, root):
    ranks = range(n)
    for r in ranks:
        for i in range(len(mem[r]["out"])):
            b, j = divmod(i, c)  # block and element of a per-rank output
            if coll == "allreduce":
                expect_sum(mem, r, i, [(p, i) for p in ranks], coll)
                if repr(mem[r]["out"][i]) != repr(mem[0]["out"][i]):
                    raise Wrong("allreduce: out[%d] is computed as %s on rank %d, %s on rank 0"
                                % (i, mem[r]["out"][i], r, mem[0]["out"][i]))
            elif coll == "broadcast":
                expect_copy(mem, r, i, (root, i), coll)
            elif coll == "reduce" and r == root:
                expect_sum(mem, r, i, [(p, i) for p in ranks], coll)
            elif coll == "allgather" or (coll == "gather" and r == root):
                expect_copy(mem, r, i, (b, j), coll)
            elif coll == "reducescatter":
                expect_sum(mem, r, i, [(p, r * c + i) for p in ranks], coll)
            elif coll == "alltoall":
                expect_copy(mem, r, i, (b, r * c + j), coll)
            elif coll == "scatter":
                expect_copy(mem, r, i, (root, r * c + i), coll)
            elif mem[r]["out"][i] is not None:
                raise Wrong("%s: rank %d (not the root) writes out[%d]" % (coll, r, i))


def steps_of(tool, coll, algo, n, count=0, chunk=0, root=0):
    """gcomm_schedule --steps' output."""
    args = [tool, "--coll", coll, "--algo", algo, "-n", str(n), "--root", str(root), "--steps"]
    if count:
        args += ["--count", str(count)]
    if chunk:
        args += ["--chunk", str(chunk)]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        raise Wrong("%s exited with %d: %s" % (" ".join(args[1:]), res.returncode, res.stderr))
    return res.stdout


def header(text):
    """The first line of --steps: # algorithm=A fifo_slots=S"""
    first = text.split("\n", 1)[0].split()
    if first[:1] != ["#"] or not all("=" in kv for kv in first[1:]):
        raise Wrong("--steps begins with %r, not '# algorithm=... fifo_slots=...'" % " ".join(first))
    fields = dict(kv.split("=", 1) for kv in first[1:])
    if "algorithm" not in fields or not fields.get("fifo_slots", "").isdigit():
        raise Wrong("--steps' first line lacks the algorithm or the FIFO slots")
    return fields


def check_one(tool, coll, algo, n, count, chunk, root):
    text = steps_of(tool, coll, algo, n, count, chunk, root)
    fields = header(text)
    slots = int(fields["fifo_slots"])
    c = count or (1 if coll in PER_RANK else n)
    sizes = dict(zip(("in", "out"), BUFFERS[coll][0](c, n)))
    if coll in ("gather", "scatter") and fields["algorithm"] == "tree":
        sizes["scr"] = n * c  # the binomial tree's scratch: room for every block
    steps = parse_steps(text, n)
    for mine in steps.values():
        rounds = [s["round"] for s in mine]
        if rounds != sorted(set(rounds)) or (rounds and rounds[0] < 0):
            raise Wrong("rank %d's rounds do not increase: %s" % (mine[0]["rank"], rounds))
        for st in mine:
            check_fields(st, n, sizes)
    mem = run(steps, n, sizes, slots)
    check_result(coll, mem, n, c, root)


# (count, chunk, rank counts, roots of n ranks): the default (one round, a block per rank) on
# every rank count and root first, middle and last; a slot of 4 elements (recursive doubling runs
# on 2, 4 and 8 ranks, its dissemination form on 3, 5, 6 and 7, the binomial gather and scatter on
# every count, their subtrees wrapping past the last rank under the middle root); several rounds
# of uneven blocks;
# more rounds than a FIFO has slots; recursive doubling's largest group filling a slot exactly
SIZES = [
    (0, 0, range(1, MAX_RANKS + 1), lambda n: sorted({0, n // 2, n - 1})),
    (0, 4, range(1, MAX_RANKS + 1), lambda n: sorted({0, n // 2, n - 1})),
    (7, 28, (2, 3, 4, 5, 6, 8), lambda n: [n - 1]),
    (7, 3, (3, 5, 8), lambda n: [n - 1]),
    (20, 2, (3, 5, 8), lambda n: [n - 1]),
]


def falls_back(tool, coll, algo):
    """The algorithm gcomm runs instead of algo for coll, or None when it runs algo. Its schedule
    (checked under its own name) must be the one printed for algo. Four ranks with a slot of four
    elements: where recursive doubling fits."""
    text = steps_of(tool, coll, algo, 4, chunk=4)
    ran = header(text)["algorithm"]
    if ran == algo:
        return None
    same = steps_of(tool, coll, ran, 4, chunk=4).split("\n", 1)[1]
    if ran not in ALGOS or text.split("\n", 1)[1] != same:
        raise Wrong("says it runs %s, but prints another schedule than %s's" % (ran, ran))
    return ran


def check_size(tool, coll, algo, size):
    """The case's line: PASS, or FAIL with the first rank count and root that fails."""
    count, chunk, ns, roots = size
    rooted = BUFFERS[coll][1]
    what = "%s %s count %s chunk %s, n = %s%s" % (
        coll, algo, count or "default", chunk or "default",
        "1..%d" % MAX_RANKS if len(ns) == MAX_RANKS else ", ".join(map(str, ns)),
        ", root%s" % ("s 0, n/2, n-1" if len(roots(8)) > 1 else " n-1") if rooted else "")
    for n in ns:
        for root in roots(n) if rooted else [0]:
            try:
                check_one(tool, coll, algo, n, count, chunk, root)
            except Wrong as e:
                return "FAIL schedule %s: n %d root %d: %s" % (what, n, root, e)
    return "PASS schedule %s: the collective's definition" % what


def check_algo(tool, coll, algo):
    """The lines of one collective's algorithm."""
    try:
        ran = falls_back(tool, coll, algo)
    except Wrong as e:
        return ["FAIL schedule %s %s: %s" % (coll, algo, e)]
    if ran is not None:
        return ["PASS schedule %s %s: runs %s's schedule (checked as %s)" % (coll, algo, ran, ran)]
    return [check_size(tool, coll, algo, size) for size in SIZES]


def main():
    tool = sys.argv[1]
    # the cases run side by side: most of the time is the tool's start (slow under sanitizers)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = [pool.submit(check_algo, tool, coll, algo)
                for coll in BUFFERS for algo in ALGOS]
        lines = [line for job in jobs for line in job.result()]
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
