#!/usr/bin/env bash
# schedules.sh [DIST]: every pipeline schedule on pp = 2 and pp = 4 CPU meshes of this machine,
# trained for real and simulated with the `cpu` hardware profile, side by side: the measured
# step time and bubble of the last step against `dist sim`'s prediction, and their ratio.
# The model: the tiny GPT with 8 layers, 8 microbatches of 2 sequences (synthetic tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${1:-build/bin/dist}
steps=${STEPS:-6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3
common=(--set model.layers=8 --set train.batch=16 --set schedule.microbatches=8
        --set 'train.data=synthetic()' --set train.stop_after="$steps")

echo "| pp | schedule | measured step (ms) | simulated step (ms) | predicted / measured | measured bubble | simulated bubble |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for pp in 2 4; do
    for kind in gpipe 1f1b interleaved_1f1b looped_bfs zb_h1 zb_h2 zbv dualpipev; do
        case $kind in interleaved_1f1b|looped_bfs|zbv|dualpipev) v=2;; *) v=1;; esac
        args=("${common[@]}" --set mesh.pp="$pp" --set schedule.kind="$kind"
              --set schedule.virtual_stages="$v")
        if ! "$dist" run examples/gpt_tiny.dist "${args[@]}" --quiet --metrics "$tmp/m.jsonl" \
            > "$tmp/run.txt" 2>&1; then
            echo "| $pp | $kind | $(tail -1 "$tmp/run.txt") | | | | |"
            continue
        fi
        "$dist" sim examples/gpt_tiny.dist "${args[@]}" --json > "$tmp/sim.json"
        "$py" - "$pp" "$kind" "$tmp" <<'PY'
import json, re, sys
pp, kind, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
steps = [json.loads(l) for l in open(f"{tmp}/m.jsonl")][1:]  # the first step warms up
steps.sort(key=lambda s: s["step_time_s"])
measured = steps[len(steps) // 2]["step_time_s"]
sim = json.load(open(f"{tmp}/sim.json"))
bubble = re.search(r"measured ([0-9.]+)%", open(f"{tmp}/run.txt").read()).group(1)
print(f"| {pp} | {kind} | {measured * 1e3:.1f} | {sim['step_time_s'] * 1e3:.1f} | "
      f"{sim['step_time_s'] / measured:.2f} | {bubble}% | {100 * sim['bubble_fraction']:.1f}% |")
PY
    done
done
