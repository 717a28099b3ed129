#!/usr/bin/env bash
# moe.sh [DIST] [ROUNDS]: what expert parallelism costs on CPU ranks, side by side.
#
# examples/moe_tiny.dist (4 experts, top 2, dp 2) trained for 40 steps with every rank holding
# every expert (ep 1) and with the experts split over the two ranks (ep 2, two all-to-alls per
# layer each way), beside the dense Llama of the same active FLOPs (one MLP of top_k x hidden
# units, no router), the three alternating for ROUNDS rounds (default 3). Prints the median
# over steps 6-40 of each run's step time, the median over rounds, ep 2 / ep 1 and ep 1 / dense,
# plus the mean expert imbalance (most loaded expert over the mean) of the last 10 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
rounds=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sets="--quiet --set train.steps=40 --set train.lr_schedule.warmup=5"
# The dense reference: moe_tiny's model with its experts' top_k x hidden units as one MLP.
sed -e 's|import "std/moe.dist"|import "std/llama.dist"|' \
    -e 's|^model = mixtral(\(.*\), width: 128, experts: 4,$|model = llama(\1, width: 128,|' \
    -e 's|^ *top_k: 2, hidden: 256, theta: 10000.0)$|              hidden: 512, theta: 10000.0)|' \
    -e '/^ *ep: 2$/d' examples/moe_tiny.dist > "$tmp/dense.dist"
grep -q '^model = llama(' "$tmp/dense.dist" && grep -q 'hidden: 512' "$tmp/dense.dist" ||
    { echo "moe.sh: examples/moe_tiny.dist changed; update the dense reference" >&2; exit 1; }
for r in $(seq "$rounds"); do
    for ep in 1 2; do
        "$dist" run examples/moe_tiny.dist $sets --set mesh.ep=$ep --metrics "$tmp/ep$ep.$r.jsonl" > /dev/null
    done
    "$dist" run "$tmp/dense.dist" $sets --metrics "$tmp/dense.$r.jsonl" > /dev/null
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
dense_runs = [
    statistics.median(json.loads(l)["step_time_s"] for l in list(open(f"{tmp}/dense.{r}.jsonl"))[5:])
    for r in range(1, rounds + 1)]
dense = statistics.median(dense_runs)
print(f"| dense | {', '.join(f'{s * 1e3:.1f}' for s in dense_runs)} | {dense * 1e3:.1f} | |")
print(f"\nep 2 / ep 1 step time: {med[2] / med[1]:.2f}x; ep 1 / dense: {med[1] / dense:.2f}x")
PY
