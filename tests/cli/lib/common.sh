# common.sh: sourced by the shell tests (run from the repository root) for what every one of them
# needs: `fail MESSAGE` prints one FAIL line and ends the test with status 1. A test that counts its
# failures and goes on defines its own fail after sourcing this.
fail() { echo "FAIL $*"; exit 1; }
