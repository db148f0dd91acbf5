# common.sh: sourced by the shell tests (run from the repository root) for what every one of them
# needs:
#   fail MESSAGE   prints one FAIL line and ends the test with status 1.
#   counting_fails for a test that reports every failure and goes on: sets fails=0 and makes fail
#                  print its FAIL line, add one to fails and return; the test ends on its count.
#   test_tmp       sets T to a new temporary folder, removed when the test exits (an EXIT trap:
#                  a test that traps EXIT for more sets its own). KEEP_T=DIR: T is DIR, made if
#                  missing and kept, to look at a run's files afterwards.
fail() { echo "FAIL $*"; exit 1; }
counting_fails() {
  fails=0
  fail() { echo "FAIL $*"; fails=$((fails + 1)); }
}
test_tmp() {
  if [ -n "${KEEP_T:-}" ]; then T=$KEEP_T; mkdir -p "$T"
  else T=$(mktemp -d) && trap 'rm -rf "$T"' EXIT; fi
}
