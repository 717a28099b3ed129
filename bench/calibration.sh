#!/usr/bin/env bash
# calibration.sh [DIST]: the simulator against real steps on this machine, after calibrating it.
#
# Calibrates this machine (`dist calibrate`, or takes the profile in $PROFILE), then trains the
# tiny GPT (width 128) and one 4x wider (width 512) for real on each mesh of the list below and
# simulates the same plan with the calibrated profile: the measured median step time (steps 6 to
# the end; the first ones warm up) against `dist sim`'s step time, and the median of the same
# steps' measured bubbles against the predicted one. Meshes: pp 1, 2 and 4 with 1F1B; dp 2;
# dp 2 x tp 2 x pp 2; every pipeline schedule at pp 2. ROUNDS (default 3) rounds of every mesh,
# one after another, each round's measured step and bubble shown. The predicted step is set
# beside the median of the rounds' ratios (`dist calibrate` prices whole actions at the median of
# its probes' passes, as a run's step is its steps' median) and beside the fastest round, to show
# what the machine's other load adds; the predicted bubble beside the rounds' median.
# CALIBRATE=each calibrates again before every round and sets each round beside its own
# prediction (a shared machine's speed drifts over minutes: a calibration in a fast spell and
# rounds in a slow one move every prediction alike); the default, once, calibrates first only.
# KEEP_PROFILE=DIR keeps every calibration it makes there. Prints a markdown table and, last,
# how many are within 10% and the worst ratios, and how much of the cores' time the host took
# (steal) during the calibration and each round.
# The machine's pace: a shared machine runs the same work 20-30% slower in one spell than in
# another, minutes apart, and a calibration sees only its own. Before every mesh and after the
# last of each width, a short run of the reference mesh (pp 1 at that width) is timed against
# its prediction; each mesh is also set beside its prediction at the pace of the two reference
# runs around it (their geometric mean of measured / predicted): the simulator's error with the
# machine's speed of the moment taken out, what comparing two layouts rests on. The raw ratios
# stay the first measure. Each run also times one of the profile's matmuls again before and after
# it (`dist run`'s pace line): its rate over the calibrated one, each round, and each mesh beside
# its prediction slowed as that matmul was, the check a user of `dist run` has; a line after the
# summaries says how often a timing read low and how the error follows either pace.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/hardware"
calibrate_each=${CALIBRATE:-once}
if [[ $calibrate_each != once && $calibrate_each != each ]]; then
    echo "calibration.sh: CALIBRATE is once or each, not '$calibrate_each'" >&2
    exit 2
fi
# The host's steal (/proc/stat): the ticks of all the CPUs' time and of the steal, now; and the
# percent of the time stolen since a reading. A calibration or a round in a spell when the host
# gave these cores' turns to other guests runs slower than the machine is.
ticks() { awk '/^cpu / { print $2+$3+$4+$5+$6+$7+$8+$9, $9 }' /proc/stat 2>/dev/null || echo "0 0"; }
stolen_since() { # "all steal" from ticks
    local now
    now=$(ticks)
    awk -v a="$1" -v b="$now" 'BEGIN { split(a, x, " "); split(b, y, " "); d = y[1] - x[1];
        printf "%.1f%%", (d > 0 ? 100 * (y[2] - x[2]) / d : 0) }'
}
steal_log=()
calibrate() {
    local t0
    t0=$(ticks)
    if [[ -n "${PROFILE:-}" ]]; then
        cp "$PROFILE" "$tmp/hardware/here.toml"
    else
        "$dist" calibrate --device cpu --out "$tmp/hardware/here.toml" >&2
    fi
    # KEEP_PROFILE=DIR keeps each calibration (here-1.toml, here-2.toml ...) for a second look.
    if [[ -n "${KEEP_PROFILE:-}" ]]; then
        mkdir -p "$KEEP_PROFILE"
        local n=1
        while [[ -e "$KEEP_PROFILE/here-$n.toml" ]]; do n=$((n + 1)); done
        cp "$tmp/hardware/here.toml" "$KEEP_PROFILE/here-$n.toml"
    fi
    [[ -n "${PROFILE:-}" ]] || steal_log+=("calibration $(stolen_since "$t0")")
}
calibrate
export DIST_PATH="$tmp"
py=/usr/bin/python3

layouts() { # width: one line per mesh, its label and its overrides separated by ';'
    echo "pp 1, 1f1b, m 2;--set mesh.pp=1 --set schedule.microbatches=2"
    echo "pp 2, 1f1b, m 4;--set mesh.pp=2 --set schedule.microbatches=4"
    echo "pp 4, 1f1b, m 8;--set mesh.pp=4 --set schedule.microbatches=8"
    echo "dp 2, m 2;--set mesh.dp=2 --set schedule.microbatches=2"
    echo "dp 2 x tp 2 x pp 2, m 4;--set mesh.dp=2 --set mesh.tp=2 --set mesh.pp=2 --set schedule.microbatches=4"
    for kind in gpipe interleaved_1f1b looped_bfs zb_h1 zb_h2 zbv dualpipev; do
        case $kind in interleaved_1f1b|looped_bfs|zbv|dualpipev) v=2;; *) v=1;; esac
        echo "pp 2, $kind, m 4;--set mesh.pp=2 --set schedule.kind=$kind --set schedule.virtual_stages=$v --set schedule.microbatches=4"
    done
}

reference="pp 1, 1f1b, m 2;--set mesh.pp=1 --set schedule.microbatches=2"

measure() { # width steps metrics sim label overrides: trains the mesh, and simulates it once
    local width=$1 steps=$2 metrics=$3 sim=$4 label=$5 overrides=$6
    # shellcheck disable=SC2206
    local args=(--set mesh.devices=here --set model.width="$width" --set train.batch=16
                --set 'train.data=synthetic()' --set train.stop_after="$steps" $overrides)
    if ! "$dist" run examples/gpt_tiny.dist "${args[@]}" --quiet --metrics "$metrics" \
        > "$tmp/run.txt" 2>&1; then
        echo "$label ($width) failed: $(tail -1 "$tmp/run.txt")" >&2
        return 1
    fi
    [[ -f "$sim" ]] || "$dist" sim examples/gpt_tiny.dist "${args[@]}" --json > "$sim"
}

pace_one() { # round width: the reference mesh's median step over its prediction, now
    local round=$1 width=$2 steps=12
    [[ $width == 512 ]] && steps=8
    measure "$width" "$steps" "$tmp/pace.jsonl" "$tmp/sim.pace.$width.json" \
        "the reference mesh" "${reference#*;}" || return 0
    "$py" - "$round" "$width" "$tmp" <<'PY'
import json, statistics, sys
rnd, width, tmp = sys.argv[1:]
kept = [json.loads(l)["step_time_s"] for l in open(f"{tmp}/pace.jsonl")][2:]
predicted = json.load(open(f"{tmp}/sim.pace.{width}.json"))["step_time_s"]
with open(f"{tmp}/runs.jsonl", "a") as f:
    f.write(json.dumps({"round": int(rnd), "width": int(width),
                        "pace": statistics.median(kept) / predicted}) + "\n")
PY
}

run_one() { # round index label width overrides: one measured run, and the prediction once
    local round=$1 index=$2 label=$3 width=$4 overrides=$5 steps=25
    [[ $width == 512 ]] && steps=16
    measure "$width" "$steps" "$tmp/m.jsonl" "$tmp/sim.$index.json" "$label" "$overrides" ||
        return 0
    "$py" - "$round" "$index" "$label" "$width" "$tmp" <<'PY'
import json, re, sys
rnd, index, label, width, tmp = sys.argv[1:]
# Steps 6 to the end, in the order they ran: the median step and, apart, the median bubble
# (what `dist run` prints for the steps after the first).
kept = [json.loads(l) for l in open(f"{tmp}/m.jsonl")][5:]
steps = sorted(m["step_time_s"] for m in kept)
bubbles = sorted(100 * m["bubble"] for m in kept)
bubble = bubbles[len(bubbles) // 2]
sim = json.load(open(f"{tmp}/sim.{index}.json"))
# The run's own pace line: the profile's matmul timed again before and after it, its rate over
# the calibrated one.
rates = re.search(r"\npace: .* ran at ([\d.]+)x and ([\d.]+)x", open(f"{tmp}/run.txt").read())
with open(f"{tmp}/runs.jsonl", "a") as f:
    f.write(json.dumps({"round": int(rnd), "index": int(index), "label": label, "width": int(width),
                        "step": steps[len(steps) // 2], "bubble": bubble,
                        "predicted": sim["step_time_s"],
                        "predicted_bubble": 100 * sim["bubble_fraction"],
                        "matmul": [float(x) for x in rates.groups()] if rates else None}) + "\n")
PY
}

# Every mesh once per round, the rounds one after another: a burst of load on this shared
# machine slows the meshes of one round, not of every round.
for round in $(seq "$rounds"); do
    echo "calibration.sh: round $round of $rounds" >&2
    if [[ $calibrate_each == each && $round -gt 1 ]]; then
        calibrate
        rm -f "$tmp"/sim.*.json
    fi
    index=0
    round_t0=$(ticks)
    for width in 128 512; do
        while IFS=';' read -r label overrides; do
            pace_one "$round" "$width"
            run_one "$round" "$index" "$label" "$width" "$overrides"
            index=$((index + 1))
        done < <(layouts)
        pace_one "$round" "$width"
    done
    steal_log+=("round $round $(stolen_since "$round_t0")")
done
"$py" - "$tmp" "$(IFS=';'; echo "${steal_log[*]}")" <<'PY'
import json, statistics, sys
tmp = sys.argv[1]
lines = [json.loads(l) for l in open(f"{tmp}/runs.jsonl")]
# Each run at the pace of the reference runs just before and just after it (the lines are in
# the order they ran; a reference run that failed leaves a run one neighbour or none).
runs = []
for i, line in enumerate(lines):
    if "pace" in line:
        continue
    near = [lines[k]["pace"] for k in (i - 1, i + 1) if 0 <= k < len(lines) and "pace" in lines[k]
            and (lines[k]["round"], lines[k]["width"]) == (line["round"], line["width"])]
    line["pace"] = statistics.geometric_mean(near) if near else None
    runs.append(line)
# Each round beside its own prediction (the same for every round unless CALIBRATE=each).
print("| mesh | width | measured step (ms), each round | predicted (ms), each round | "
      "predicted / measured, each round | fastest round: predicted / measured | median of the "
      "ratios | the reference's pace, each round | at that pace: predicted / measured, each round | "
      "at that pace: median | the run's matmul over its calibrated rate, before / after, each "
      "round | at the matmul's pace: median | measured bubble, each round | predicted bubble | "
      "bubble gap (points) |")
print("|" + " --- |" * 15)
rows = []
for index in sorted({r["index"] for r in runs}):
    mine = sorted((r for r in runs if r["index"] == index), key=lambda r: r["round"])
    ratios = [r["predicted"] / r["step"] for r in mine]
    fastest = min(mine, key=lambda r: r["step"])
    at_fastest = fastest["predicted"] / fastest["step"]
    median = statistics.median(ratios)
    paced = [r["predicted"] * r["pace"] / r["step"] for r in mine if r["pace"]]
    paced_median = statistics.median(paced) if paced else float("nan")
    # At the pace of the run's own matmul (the geometric mean of its two timings): the
    # prediction slowed as the matmul was.
    by_matmul = [r["predicted"] / statistics.geometric_mean(r["matmul"]) / r["step"]
                 for r in mine if r.get("matmul") and min(r["matmul"]) > 0]
    matmul_median = statistics.median(by_matmul) if by_matmul else float("nan")
    # The bubble of each round is its steps' median; the rounds' median beside the prediction.
    bubble = statistics.median(r["bubble"] for r in mine)
    predicted_bubble = statistics.median(r["predicted_bubble"] for r in mine)
    gap = predicted_bubble - bubble
    label = f"{mine[0]['label']} {mine[0]['width']}"
    rows.append((at_fastest, median, gap, label, paced_median, matmul_median))
    print(f"| {mine[0]['label']} | {mine[0]['width']} | "
          f"{', '.join('%.1f' % (r['step'] * 1e3) for r in mine)} | "
          f"{', '.join('%.1f' % (r['predicted'] * 1e3) for r in mine)} | "
          f"{', '.join('%.2f' % x for x in ratios)} | {at_fastest:.2f} | {median:.2f} | "
          f"{', '.join('%.2f' % r['pace'] if r['pace'] else '-' for r in mine)} | "
          f"{', '.join('%.2f' % x for x in paced)} | {paced_median:.2f} | "
          f"{', '.join('%.2f/%.2f' % tuple(r['matmul']) if r.get('matmul') else '-' for r in mine)} | "
          f"{matmul_median:.2f} | "
          f"{', '.join('%.1f%%' % r['bubble'] for r in mine)} | {predicted_bubble:.1f}% | "
          f"{gap:+.1f} |")
for name, k in (("the fastest round", 0), ("the median of the rounds' ratios", 1),
                ("the median of the rounds' ratios at the reference's pace", 4),
                ("the median of the rounds' ratios at the run's matmul's pace", 5)):
    errors = sorted((abs(r[k] - 1), r[k], r[3]) for r in rows)
    print(f"\nagainst {name}: {sum(e <= 0.10 for e, *_ in errors)} of {len(errors)} within 10% "
          f"of the measured step, {sum(e <= 0.15 for e, *_ in errors)} within 15%; worst: "
          + "; ".join(f"{label} {r:.2f}" for e, r, label in errors[-3:]))
# The runs' pace lines: how often a timing read low, whether the runs the line calls slower (the
# geometric mean of its two timings a tenth low, as `dist run` judges) ran further below their
# prediction, and how the error follows the matmul's pace and the reference's.
timed = [r for r in runs if r.get("matmul") and min(r["matmul"]) > 0 and r["pace"]]
if len(timed) > 2:
    readings = [x for r in timed for x in r["matmul"]]
    error = [r["predicted"] / r["step"] for r in timed]
    mm = [statistics.geometric_mean(r["matmul"]) for r in timed]
    slow = [e for e, m in zip(error, mm) if m < 0.9]
    rest = [e for e, m in zip(error, mm) if m >= 0.9]
    def median(v): return f"{statistics.median(v):.2f}" if v else "-"
    def corr(x, y):
        try: return f"{statistics.correlation(x, y):.2f}"
        except statistics.StatisticsError: return "-"
    print(f"the runs' matmul: {sum(x < 0.6 for x in readings)} and {sum(x < 0.8 for x in readings)} "
          f"of {len(readings)} timings below 0.6 and 0.8 of its calibrated rate; {len(slow)} of "
          f"{len(timed)} runs its line calls slower, their median predicted / measured "
          f"{median(slow)}, the others' {median(rest)}; the correlation of predicted / measured "
          f"with the matmul's pace {corr(mm, error)}, with the reference's "
          f"{corr([1 / r['pace'] for r in timed], error)}")
gaps = sorted(abs(r[2]) for r in rows)
print(f"bubble (the median of the rounds'): the largest gap {gaps[-1]:.1f} points; "
      f"{sum(g <= 5 for g in gaps)} of {len(gaps)} within 5")
print(f"the host's steal (/proc/stat, of all the cores' time): {sys.argv[2].replace(';', ', ')}")
PY
