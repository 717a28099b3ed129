#!/usr/bin/env bash
# demo.sh DIST: check the example scripts, catch a mistake early, simulate the tiny GPT on a
# dp 2 x tp 2 x pp 2 mesh with 1F1B, then train it on that mesh for real (eight worker actors on
# this machine's cores) on the fortunes text, sample from it and evaluate it; last, continue that
# run for a few steps with its ranks spread over two processes (UCX and Gloo between them).
set -euo pipefail
dist=${1:-build/bin/dist}
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

for f in examples/*.dist; do
    say dist check "$f"
    "$dist" check "$f"
done

mesh=(--set mesh.dp=2 --set mesh.tp=2 --set mesh.pp=2)

say "dist check examples/gpt_tiny.dist --set mesh.tp=3   # a mistake, caught before anything runs"
"$dist" check examples/gpt_tiny.dist --set mesh.tp=3 || true

say dist sim examples/gpt_tiny.dist "${mesh[@]}"
"$dist" sim examples/gpt_tiny.dist "${mesh[@]}"

say dist run examples/gpt_tiny.dist "${mesh[@]}" --save build/demo-checkpoint --sample 300
"$dist" run examples/gpt_tiny.dist "${mesh[@]}" --save build/demo-checkpoint --sample 300

say "dist eval examples/gpt_tiny.dist --load build/demo-checkpoint --data /usr/share/games/fortunes/riddles   # text it never trained on"
"$dist" eval examples/gpt_tiny.dist --load build/demo-checkpoint --data /usr/share/games/fortunes/riddles

say "dist run examples/gpt_tiny.dist ${mesh[*]} --resume build/demo-checkpoint --set train.steps=320 --procs 2   # the same job as two processes"
"$dist" run examples/gpt_tiny.dist "${mesh[@]}" --resume build/demo-checkpoint --set train.steps=320 \
    --procs 2
