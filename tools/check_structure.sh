#!/usr/bin/env bash
# tools/check_structure.sh [BUILD] - the library's shape, as docs/ARCHITECTURE.md draws it:
#   1. no function of the library longer than 100 lines (universal-ctags measures them);
#   2. no circle among the library's headers (#include "...");
#   3. no circle among the library's files by calls: from the objects of a build (BUILD, default
#      build; nm tells which file defines each symbol another file uses), each file's callees,
#      and no file that calls back into one that calls it, directly or through others.
# The kernels (gcomm_kernels.cu) and the NCCL layer (nccl/) are not the library's C core and are
# left out. Prints what breaks a rule and exits 1, else one line per rule that holds.
cd "$(dirname "$0")/.." || exit 1
build=${1:-build}
python3 - "$build" <<'EOF'
import glob, json, os, re, subprocess, sys

build = sys.argv[1]
MAX_LINES = 100
sources = sorted(glob.glob("gcomm*.c") + glob.glob("transports/*.c"))
headers = sorted(glob.glob("gcomm*.h"))
bad = 0

# 1. function lengths
longest = []
for f in sources:
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+ne", "--kinds-C=f", "-o", "-", f],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        d = json.loads(line)
        if "end" in d:
            longest.append((d["end"] - d["line"] + 1, f, d["name"]))
longest.sort(reverse=True)
over = [x for x in longest if x[0] > MAX_LINES]
for n, f, name in over:
    print(f"FAIL function {name} ({f}) is {n} lines (at most {MAX_LINES})")
bad |= bool(over)
if not over and longest:
    n, f, name = longest[0]
    print(f"ok: every library function is at most {MAX_LINES} lines (longest: {name}, {f}, {n})")


def cycle(graph):
    """A circle in graph (node -> set of nodes) as a list, or None."""
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                c = visit(v)
                if c:
                    return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state:
            c = visit(u)
            if c:
                return c
    return None


# 2. the include graph of the headers
inc = {}
for h in headers:
    inc[h] = {m for m in re.findall(r'^#include "([^"]+)"', open(h).read(), re.M) if m in headers}
c = cycle(inc)
if c:
    print("FAIL include circle: " + " -> ".join(c))
    bad = 1
else:
    print(f"ok: no include circle among {len(headers)} headers")

# 3. the call graph between files, from a build's objects
objs = {f: os.path.join(build, "obj", f[:-2] + ".o") for f in sources}
objs = {f: o for f, o in objs.items() if os.path.exists(o)}
if not objs:
    print(f"FAIL no objects in {build}/obj: build first (make BUILD={build})")
    sys.exit(1)
defined, used = {}, {}
for f, o in objs.items():
    out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
    used[f] = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used[f].add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBR":
            defined[parts[2]] = f
calls = {f: {defined[s] for s in used[f] if s in defined and defined[s] != f} for f in objs}
c = cycle(calls)
if c:
    print("FAIL call circle among files: " + " -> ".join(c))
    bad = 1
else:
    print(f"ok: no call circle among {len(objs)} files ({build})")
sys.exit(1 if bad else 0)
EOF
