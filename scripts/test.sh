#!/usr/bin/env bash
# The project's test command (README.md, .ci/run): installs what a fresh machine
# lacks, checks formatting and lints, then runs every test, including the end-to-end
# suite that builds two-sled topologies in network namespaces (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

# Every cargo test run's output is kept so the last line can total them all.
results=$(mktemp)
trap 'rm -f "$results"' EXIT
run_tests() {
    cargo test "$@" 2>&1 | tee -a "$results"
}

run_tests --workspace --exclude e2e
# Every parser and the whole engine under libFuzzer for a short while (seeded with
# the scapy vectors); see docs/testing.md for longer campaigns.
bash scripts/fuzz-smoke.sh
# The end-to-end tests run in release mode: the harness then drives the release
# overlayd/xdeadm (it builds `-p overlayd -p xdeadm` in the test's own profile, see
# tests/src/bins.rs); a debug datapath is too slow for the 200 MB transfer on a
# 2-core machine. Built first so the first test's time is not the build's.
cargo build --release -p overlayd -p xdeadm --bins
run_tests --release -p e2e
# A minute of the soak (docs/reliability.md); churn reset by RST so the tables reach
# their steady size within its warm-up (the 600 s default uses FIN and TIME_WAIT).
bash scripts/soak.sh --seconds 60 --churn-close rst
# The side-by-side benchmark once, briefly: keeps its four topologies working. The
# figures of a 2-second run mean nothing; see docs/benchmarks.md for real runs.
bash scripts/bench-e2e.sh --smoke

# One total over every test binary (cargo prints one summary per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$results"
