#!/usr/bin/env bash
# calibration.sh [DIST]: the simulator against real steps on this machine, after calibrating it.
#
# Calibrates this machine (`dist calibrate`, or takes the profile in $PROFILE), then trains the
# tiny GPT (width 128) and one 4x wider (width 512) for real on each mesh of the list below and
# simulates the same plan with the calibrated profile: the measured median step time (steps 6 to
# the end; the first ones warm up) against `dist sim`'s step time, and the last step's measured
# bubble against the predicted one. Meshes: pp 1, 2 and 4 with 1F1B; dp 2 x tp 2 x pp 2; every
# pipeline schedule at pp 2. Prints a markdown table and, last, the worst ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/hardware"
if [[ -n "${PROFILE:-}" ]]; then
    cp "$PROFILE" "$tmp/hardware/here.toml"
else
    "$dist" calibrate --out "$tmp/hardware/here.toml" >&2
fi
export DIST_PATH="$tmp"
py=/usr/bin/python3

run_one() { # label width steps overrides...
    local label=$1 width=$2 steps=$3
    shift 3
    local args=(--set mesh.devices=here --set model.width="$width" --set train.batch=16
                --set 'train.data=synthetic()' --set train.stop_after="$steps" "$@")
    if ! "$dist" run examples/gpt_tiny.dist "${args[@]}" --quiet --metrics "$tmp/m.jsonl" \
        > "$tmp/run.txt" 2>&1; then
        echo "| $label | $width | failed: $(tail -1 "$tmp/run.txt") | | | | | |"
        return
    fi
    "$dist" sim examples/gpt_tiny.dist "${args[@]}" --json > "$tmp/sim.json"
    "$py" - "$label" "$width" "$tmp" <<'PY'
import json, re, sys
label, width, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
steps = [json.loads(l)["step_time_s"] for l in open(f"{tmp}/m.jsonl")][5:]
steps.sort()
measured = steps[len(steps) // 2]
sim = json.load(open(f"{tmp}/sim.json"))
bubble = float(re.search(r"bubble: measured ([0-9.]+)%", open(f"{tmp}/run.txt").read()).group(1))
ratio = sim["step_time_s"] / measured
print(f"| {label} | {width} | {measured * 1e3:.1f} | {sim['step_time_s'] * 1e3:.1f} | "
      f"{ratio:.2f} | {bubble:.1f}% | {100 * sim['bubble_fraction']:.1f}% | "
      f"{100 * sim['bubble_fraction'] - bubble:+.1f} |")
with open(f"{tmp}/ratios.txt", "a") as f:
    f.write(f"{ratio} {100 * sim['bubble_fraction'] - bubble} {label} {width}\n")
PY
}

echo "| mesh | width | measured step (ms) | predicted step (ms) | predicted / measured | measured bubble | predicted bubble | bubble gap (points) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for width in 128 512; do
    steps=25
    [[ $width == 512 ]] && steps=16
    run_one "pp 1, 1f1b, m 2" "$width" "$steps" --set mesh.pp=1 --set schedule.microbatches=2
    run_one "pp 2, 1f1b, m 4" "$width" "$steps" --set mesh.pp=2 --set schedule.microbatches=4
    run_one "pp 4, 1f1b, m 8" "$width" "$steps" --set mesh.pp=4 --set schedule.microbatches=8
    run_one "dp 2 x tp 2 x pp 2, m 4" "$width" "$steps" --set mesh.dp=2 --set mesh.tp=2 \
        --set mesh.pp=2 --set schedule.microbatches=4
    for kind in gpipe interleaved_1f1b looped_bfs zb_h1 zb_h2 zbv dualpipev; do
        case $kind in interleaved_1f1b|looped_bfs|zbv|dualpipev) v=2;; *) v=1;; esac
        run_one "pp 2, $kind, m 4" "$width" "$steps" --set mesh.pp=2 --set schedule.kind="$kind" \
            --set schedule.virtual_stages="$v" --set schedule.microbatches=4
    done
done
"$py" - "$tmp/ratios.txt" <<'PY'
import sys
rows = [l.split(maxsplit=2) for l in open(sys.argv[1])]
errors = sorted((abs(float(r) - 1), r, b, label) for r, b, label in rows)
within = sum(e <= 0.10 for e, *_ in errors)
print(f"\n{within} of {len(errors)} within 10% of the measured step; worst: "
      + "; ".join(f"{label.strip()} {float(r):.2f}" for e, r, b, label in errors[-3:]))
gaps = sorted(abs(float(b)) for r, b, label in rows)
print(f"bubble: the largest gap {gaps[-1]:.1f} points; {sum(g <= 5 for g in gaps)} of {len(gaps)} within 5")
PY
