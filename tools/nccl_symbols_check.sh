#!/usr/bin/env bash
# tools/nccl_symbols_check.sh LIB LIST - does gcomm's libnccl.so.2 (LIB) export every NCCL symbol
# of LIST (nccl/nccl_symbols.txt: those NVIDIA's nccl-tests reference, written by
# tools/nccl_tests.sh build)? One PASS/FAIL line per symbol, then "N passed, N failed".
set -euo pipefail
lib=$1 list=$2
[ -f "$lib" ] || { echo "FAIL no library at $lib"; echo "0 passed, 1 failed"; exit 1; }
[ -s "$list" ] || { echo "FAIL no symbol list at $list"; echo "0 passed, 1 failed"; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWiV]$/ { print $3 }' | sort -u)
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
passed=0 failed=0
if [ "$soname" = libnccl.so.2 ]; then
  echo "PASS soname libnccl.so.2"; passed=$((passed + 1))
else
  echo "FAIL soname is '$soname', not libnccl.so.2"; failed=$((failed + 1))
fi
while read -r sym; do
  [ -n "$sym" ] || continue
  if grep -qxF "$sym" <<< "$exported"; then
    echo "PASS exports $sym"; passed=$((passed + 1))
  else
    echo "FAIL does not export $sym"; failed=$((failed + 1))
  fi
done < "$list"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
