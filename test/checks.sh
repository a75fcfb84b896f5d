# test/checks.sh - what the scripts that test one tool share (sourced, after setting CHECK_NAME to
# the tool's name): a temporary folder $tmp, removed at exit, and
#   check WHAT COMMAND...  PASS when COMMAND succeeds, else FAIL with the output it saw
#   run RC_WANTED ARGS...  runs ARGS with stdout in $tmp/out and stderr in $tmp/err; true when the
#                          exit status is as wanted (a number, or "nonzero": neither 0 nor a timeout)
#   has TEXT               $tmp/out holds TEXT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {
  local what=$1
  shift
  if "$@"; then
    echo "PASS $CHECK_NAME: $what"
  else
    echo "FAIL $CHECK_NAME: $what; its output:"
    cat "$tmp/out" "$tmp/err" 2>/dev/null | sed 's/^/    | /'
  fi
}
run() {
  local want=$1 rc=0
  shift
  timeout -k 10 300 "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  if [ "$want" = nonzero ]; then [ "$rc" != 0 ] && [ "$rc" != 124 ]; else [ "$rc" = "$want" ]; fi
}
has() { grep -qF -- "$1" "$tmp/out"; }
