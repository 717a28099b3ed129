#!/usr/bin/env bash
# fuzz.sh FUZZER SECONDS: runs one of the libFuzzer targets for SECONDS seconds from a corpus
# seeded by kind: the front-end fuzzer with the examples, the standard library and the golden
# files; the checkpoint fuzzer with small torch.save and safetensors files. Inputs that once
# failed (tests/fuzz/regressions) are seeds too. Any crash, leak or sanitizer report fails the run.
set -euo pipefail
fuzzer=$1
seconds=${2:-30}
name=$(basename "$fuzzer")
corpus=build-fuzz/corpus-$name
mkdir -p "$corpus"
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
case "$name" in
frontend_fuzzer)
    cp examples/*.dist stdlib/std/*.dist "$seeds"/
    find tests/golden -name '*.dist' -exec cp {} "$seeds"/ \; 2>/dev/null || true
    cp tests/fuzz/regressions/*.dist "$seeds"/ ;;
checkpoint_fuzzer)
    cp tests/fuzz/checkpoint_seeds/* "$seeds"/ ;;
*)
    echo "fuzz.sh: no seeds for $name" >&2
    exit 2 ;;
esac
# The front-end fuzzer resolves imports against stdlib/ and never reads data files.
DIST_PATH="$PWD/stdlib" "$fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/ "$corpus" "$seeds" 2>&1 | tail -n 15
echo "fuzz ($name): ${seconds}s without a finding"
