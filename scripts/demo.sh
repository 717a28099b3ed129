#!/usr/bin/env bash
# demo.sh DIST: what Dist does so far: check and plan scripts, catch a mistake early, then
# train the tiny GPT on the fortunes text for real, sample from it and evaluate it.
set -euo pipefail
dist=${1:-build/bin/dist}
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

for f in examples/*.dist; do
    say dist check "$f"
    "$dist" check "$f"
done

say dist plan examples/llama3_8b_64xh100.dist
"$dist" plan examples/llama3_8b_64xh100.dist

say "dist check examples/gpt_tiny.dist --set mesh.tp=3   # a mistake, caught before anything runs"
"$dist" check examples/gpt_tiny.dist --set mesh.tp=3 || true

say dist run examples/gpt_tiny.dist --save build/demo-checkpoint --sample 300
"$dist" run examples/gpt_tiny.dist --save build/demo-checkpoint --sample 300

say "dist eval examples/gpt_tiny.dist --load build/demo-checkpoint --data /usr/share/games/fortunes/riddles   # text it never trained on"
"$dist" eval examples/gpt_tiny.dist --load build/demo-checkpoint --data /usr/share/games/fortunes/riddles
