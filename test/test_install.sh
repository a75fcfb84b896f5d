#!/usr/bin/env bash
# test/test_install.sh - `make install` and the two ways an outside project builds against it
# (`make test-install` runs it): install into a temporary prefix (and once more through DESTDIR),
# then build examples/hello_allreduce.c out of the tree with pkg-config (examples/pkgconfig) and
# with CMake's find_package(gcomm) (examples/cmake), and run each on 2 ranks.
# Prints a PASS/FAIL line per step and "N passed, N failed"; the exit status is non-zero on failure.
#
# Environment: BUILD (build directory, default build), MPIEXEC (default mpiexec). Options of the
# calling make (CUDA=1, OFI=1, ...) reach `make install` through MAKEFLAGS.
set -u
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
BUILD=${BUILD:-build}
MPIEXEC=${MPIEXEC:-mpiexec}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
passed=0
failed=0

mpiexec_flags=()
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte"; then
  mpiexec_flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && mpiexec_flags+=(--allow-run-as-root)
fi

# Runs a step with its output in a log; PASS, or FAIL and the log's tail.
check() {
  local what=$1 log
  log=$tmp/step-$((passed + failed)).log
  shift
  if "$@" >"$log" 2>&1; then
    echo "PASS install: $what"
    passed=$((passed + 1))
  else
    echo "FAIL install: $what (exit status $?); last lines:"
    tail -n 20 "$log" | sed 's/^/      | /'
    failed=$((failed + 1))
  fi
}

# hello_allreduce prints its sum check; a run passes when it exits 0 on 2 ranks.
hello() {
  timeout -k 5 120 "$MPIEXEC" "${mpiexec_flags[@]}" -n 2 "$1"
}

installed() {
  local root=$1
  for f in include/gcomm.h include/gcomm_types.h include/gcomm_profiler.h lib/libgcomm.a \
    lib/libgcomm.so lib/pkgconfig/gcomm.pc lib/cmake/gcomm/gcommConfig.cmake \
    lib/cmake/gcomm/gcommConfigVersion.cmake lib/libgcomm-profiler-trace.so bin/gcomm_perf \
    bin/gcomm_schedule; do
    [ -e "$root/$f" ] || { echo "missing: $root/$f"; return 1; }
  done
  soname=$(objdump -p "$root/lib/libgcomm.so" | awk '$1 == "SONAME" { print $2 }')
  echo "soname $soname"
  [ -n "$soname" ] && [ -e "$root/lib/$soname" ]
}

check "make install PREFIX=$prefix" make -s install BUILD="$BUILD" PREFIX="$prefix"
check "installed files and soname" installed "$prefix"
check "make install DESTDIR=... PREFIX=/opt/gcomm" \
  make -s install BUILD="$BUILD" DESTDIR="$tmp/stage" PREFIX=/opt/gcomm
check "DESTDIR layout" installed "$tmp/stage/opt/gcomm"

# pkg-config: a copy of examples/pkgconfig with the source, built with its Makefile
mkdir -p "$tmp/pc"
cp examples/pkgconfig/Makefile examples/hello_allreduce.c "$tmp/pc/"
check "pkg-config: compile and link" \
  env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" make -C "$tmp/pc" -s MAKEFLAGS=
check "pkg-config: mpiexec -n 2 hello_allreduce" hello "$tmp/pc/hello_allreduce"

# CMake: examples/cmake configured in a build folder outside the tree
if command -v cmake >/dev/null; then
  check "cmake: find_package(gcomm), compile and link" \
    bash -c "cmake -S '$repo/examples/cmake' -B '$tmp/cm' -DCMAKE_PREFIX_PATH='$prefix' &&
             cmake --build '$tmp/cm'"
  check "cmake: mpiexec -n 2 hello_allreduce" hello "$tmp/cm/hello_allreduce"
else
  echo "FAIL install: cmake is not installed (apt-get install cmake)"
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
