#!/bin/sh
# Runs the sanitizer fuzz target for a bounded time: run_fuzz.sh FUZZER SEEDS CORPUS SECONDS.
# The corpus grows in the build tree between runs; any crash, leak, UB or input slower than
# 10 s fails the run (libFuzzer exits non-zero and leaves the input as crash-* / timeout-*).
set -eu
fuzzer=$1 seeds=$2 corpus=$3 seconds=$4
mkdir -p "$corpus"
cd "$(dirname "$corpus")"
exec "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -max_len=65536 -print_final_stats=1 "$corpus" "$seeds"
