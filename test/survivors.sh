# test/survivors.sh - what the kill tests of test_fault.sh and test_net.sh share (sourced):
#   fail WHAT                         prints FAIL WHAT and counts it in $failed
#   countSurvivors DIR WHAT OUT R...  the line each surviving rank R wrote in DIR/rankR: a PASS
#                                     line counts in $passed, any other in $failed; a survivor
#                                     that wrote nothing fails (crashed or hung), with OUT's tail
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

countSurvivors() {
  local dir=$1 what=$2 out=$3 r
  shift 3
  for r in "$@"; do
    if [ -s "$dir/rank$r" ]; then
      cut -c1-400 "$dir/rank$r"
      if grep -q '^PASS' "$dir/rank$r"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    else
      fail "$what: survivor rank $r reported nothing (crashed or hung?)"
      tail -20 "$out"
    fi
  done
}
