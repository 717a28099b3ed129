#!/usr/bin/env bash
# fuzz.sh FUZZER SECONDS: runs the front-end fuzzer from a corpus seeded with the examples and
# the golden files, for SECONDS seconds. Any crash, leak or sanitizer report fails the run.
set -euo pipefail
fuzzer=$1
seconds=${2:-30}
corpus=build-fuzz/corpus
mkdir -p "$corpus"
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
cp examples/*.dist stdlib/std/*.dist "$seeds"/
find tests/golden -name '*.dist' -exec cp {} "$seeds"/ \; 2>/dev/null || true
cp tests/fuzz/regressions/* "$seeds"/  # inputs that once failed
# The fuzzer resolves imports against stdlib/ and never reads data files.
DIST_PATH="$PWD/stdlib" "$fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/ "$corpus" "$seeds" 2>&1 | tail -n 15
echo "fuzz: ${seconds}s without a finding"
