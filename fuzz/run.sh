#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60, at most 60), one after the other, on
# its corpus in fuzz/corpus/TARGET. Exits non-zero at the first crash; the input is in
# fuzz/artifacts/TARGET/. Needs the nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`).
#
#   fuzz/run.sh [SECONDS]
set -euo pipefail
seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || (( seconds < 1 || seconds > 60 )); then
    echo "usage: fuzz/run.sh [SECONDS], 1 to 60 per target" >&2
    exit 2
fi
cd "$(dirname "$0")"
for target in wire_frame peer_message http_bodies; do
    echo "== $target: ${seconds} s"
    mkdir -p "corpus/$target"
    # Overflow checks and debug assertions on (cargo fuzz's default); no sanitizer: the
    # decoders are safe Rust, and an instrumented-only build is several times faster.
    cargo +nightly fuzz run --sanitizer none "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
