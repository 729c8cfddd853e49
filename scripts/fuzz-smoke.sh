#!/usr/bin/env bash
# A short run of every fuzz target (cargo-fuzz, nightly toolchain), seeded with the
# checked-in known-answer vectors. CI runs this for FUZZ_SECONDS per target; longer
# campaigns use the same command with a larger value, e.g. FUZZ_SECONDS=600.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-20}
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz-smoke: the nightly toolchain is missing (cargo-fuzz needs it)" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install --locked -q cargo-fuzz

for target in $(cargo +nightly fuzz list); do
    corpus=$(mktemp -d)
    python3 seeds.py "$target" "$corpus"
    echo "fuzz-smoke: $target for ${seconds}s"
    log=$(mktemp)
    status=0
    cargo +nightly fuzz run "$target" "$corpus" -- \
        -max_total_time="$seconds" -max_len=9100 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -40 "$log" >&2
        echo "fuzz-smoke: $target FAILED (exit $status); reproduce: cd fuzz && cargo +nightly fuzz run $target" >&2
        exit 1
    fi
    rm -rf "$corpus" "$log"
done
