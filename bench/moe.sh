#!/usr/bin/env bash
# moe.sh [DIST] [ROUNDS]: what expert parallelism costs on CPU ranks, side by side.
#
# examples/moe_tiny.dist (4 experts, top 2, dp 2) trained for 40 steps with every rank holding
# every expert (ep 1) and with the experts split over the two ranks (ep 2, two all-to-alls per
# layer each way), the two alternating for ROUNDS rounds (default 3). Prints the median over
# steps 6-40 of each run's step time, the median over rounds, and ep 2 / ep 1, plus the mean
# expert imbalance (most loaded expert over the mean) of the last 10 steps, measured.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
rounds=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sets="--quiet --set train.steps=40 --set train.lr_schedule.warmup=5"
for r in $(seq "$rounds"); do
    for ep in 1 2; do
        "$dist" run examples/moe_tiny.dist $sets --set mesh.ep=$ep --metrics "$tmp/ep$ep.$r.jsonl" > /dev/null
    done
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def run(ep, r):
    rows = [json.loads(l) for l in open(f"{tmp}/ep{ep}.{r}.jsonl")]
    steps = statistics.median(x["step_time_s"] for x in rows[5:])
    imbalance = statistics.mean(x["expert_imbalance"] for x in rows[-10:])
    return steps, imbalance
med = {}
print("| ep | median step (ms), per round | median (ms) | imbalance, last 10 steps |")
print("| --- | --- | --- | --- |")
for ep in (1, 2):
    runs = [run(ep, r) for r in range(1, rounds + 1)]
    med[ep] = statistics.median(s for s, _ in runs)
    print(f"| {ep} | {', '.join(f'{s * 1e3:.1f}' for s, _ in runs)} | {med[ep] * 1e3:.1f} | "
          f"{statistics.mean(i for _, i in runs):.3f} |")
print(f"\nep 2 / ep 1 step time: {med[2] / med[1]:.2f}x")
PY
