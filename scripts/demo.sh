#!/usr/bin/env bash
# demo.sh DIST: what Dist does so far: check, format and plan the examples.
set -euo pipefail
dist=${1:-build/bin/dist}
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say dist check examples/gpt_tiny.dist
"$dist" check examples/gpt_tiny.dist

say dist plan examples/gpt_tiny.dist
"$dist" plan examples/gpt_tiny.dist

say dist plan examples/gpt_tiny.dist --set mesh.pp=2 --set mesh.dp=2 --set train.batch=32
"$dist" plan examples/gpt_tiny.dist --set mesh.pp=2 --set mesh.dp=2 --set train.batch=32

for f in examples/*.dist; do
    [[ "$f" == examples/gpt_tiny.dist ]] && continue
    say dist check "$f"
    "$dist" check "$f"
done

say dist plan examples/llama3_8b_64xh100.dist
"$dist" plan examples/llama3_8b_64xh100.dist

say "dist check examples/gpt_tiny.dist --set mesh.tp=3   # a mistake, caught before anything runs"
"$dist" check examples/gpt_tiny.dist --set mesh.tp=3 || true

say dist fmt examples/data_parallel.dist
"$dist" fmt examples/data_parallel.dist
