#!/usr/bin/env bash
# tools/check_params.sh - every GCOMM_* variable declared in gcomm_params.c's paramTable, or read with
# getenv by the example profiler plugin (examples/profiler/, which gcomm does not read), must have
# a row in README.md's environment table, and the README must name no variable they lack.
cd "$(dirname "$0")/.." || exit 1
declared=$({
  grep -oE '^\s*\{"GCOMM_[A-Z0-9_]+"' gcomm_params.c
  grep -ohE 'getenv\("GCOMM_[A-Z0-9_]+"' examples/profiler/*.c
} | grep -oE 'GCOMM_[A-Z0-9_]+' | sort -u)
documented=$(grep -oE '^\| `GCOMM_[A-Z0-9_]+`' README.md | grep -oE 'GCOMM_[A-Z0-9_]+' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$documented"))
extra=$(comm -13 <(echo "$declared") <(echo "$documented"))
[ -z "$missing" ] || echo "declared (gcomm_params.c's paramTable, examples/profiler/) but not in README.md's table: $missing"
[ -z "$extra" ] || echo "in README.md's table but not declared in gcomm_params.c or examples/profiler/: $extra"
[ -z "$missing$extra" ] && echo "all $(echo "$declared" | wc -l) GCOMM_* variables documented"
[ -z "$missing$extra" ]
