#!/usr/bin/env bash
# precision.sh [DIST] [ROUNDS]: bf16 beside f32 on this machine's cores, side by side.
#
# docs/tutorial/one_device.dist (GPT-2 shape, 0.83 M parameters, batch 16 x 64) trained for 60
# steps in f32 and in bf16, the two alternating for ROUNDS rounds (default 3). Prints per
# precision the median over steps 6-60 of the step time (median over rounds), the measured
# peak of tensors beside the memory model's (the run's own last line), and the loss of the last
# step; then bf16 / f32 for the step time and the peak, and the relative difference of the two
# loss curves over the 60 steps (median and largest).
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
rounds=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
    for pr in f32 bf16; do
        "$dist" run docs/tutorial/one_device.dist --quiet --set train.precision=$pr \
            --metrics "$tmp/$pr.$r.jsonl" > "$tmp/$pr.$r.out"
    done
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def run(pr, r):
    rows = [json.loads(l) for l in open(f"{tmp}/{pr}.{r}.jsonl")]
    out = open(f"{tmp}/{pr}.{r}.out").read()
    m = re.search(r"memory: measured ([\d.]+) MB .* predicted ([\d.]+) MB", out)
    return (statistics.median(x["step_time_s"] for x in rows[5:]), float(m.group(1)),
            float(m.group(2)), [x["loss"] for x in rows])
res = {pr: [run(pr, r) for r in range(1, rounds + 1)] for pr in ("f32", "bf16")}
print("| precision | median step (ms), per round | median (ms) | peak MB measured | predicted | last loss |")
print("| --- | --- | --- | --- | --- | --- |")
med = {}
for pr, runs in res.items():
    med[pr] = statistics.median(s for s, _, _, _ in runs)
    s, peak, pred, losses = runs[0]
    print(f"| {pr} | {', '.join(f'{x[0] * 1e3:.1f}' for x in runs)} | {med[pr] * 1e3:.1f} | "
          f"{peak:.1f} | {pred:.1f} | {losses[-1]:.4f} |")
lf, lb = res["f32"][0][3], res["bf16"][0][3]
apart = [abs(b - f) / f for f, b in zip(lf, lb)]
worst = max(range(len(apart)), key=lambda i: apart[i])
print(f"\nbf16 / f32: step time {med['bf16'] / med['f32']:.2f}x, measured peak "
      f"{res['bf16'][0][1] / res['f32'][0][1]:.2f}x; the loss curves {statistics.median(apart) * 100:.2f}% "
      f"apart at the median step, {apart[worst] * 100:.2f}% at most (step {worst + 1})")
PY
