#!/usr/bin/env bash
# compare.sh [DIST]: end-to-end training speed and peak memory of Dist against PyTorch on the
# same GPT-2 shapes, side by side in one run (ratios, not absolute times: machines are shared).
# PyTorch runs at its best on this machine: two threads, OMP_WAIT_POLICY=passive. It comes from
# Debian's python3-torch, which this script installs when missing (about 800 MB). Each side runs
# RUNS times (default 3), alternating; the table shows the medians and every run. SHAPES picks
# the rows ("small", "124m"; default both).
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${1:-build/bin/dist}
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
    scripts/install-deps.sh python3-torch
fi
threads=$(nproc)

# Peak resident memory (KiB) and stdout of a command.
measure() {
    local out
    out=$(/usr/bin/time -f '%M' -o /tmp/dist-bench-rss "$@")
    echo "$out"
}

runs=${RUNS:-3}

dist_tps() {
    "$py" -c 'import json; r=[json.loads(l) for l in open("/tmp/dist-bench.jsonl")][2:]; print(sum(x["tokens"] for x in r)/sum(x["step_time_s"] for x in r))'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

row() { # name vocab context layers heads width batch steps script
    local name=$1 script=$9 d=() p=() d_rss p_rss
    # Alternate the two so that a slow moment of the machine hits both alike.
    for ((i = 0; i < runs; i++)); do
        measure "$dist" run "$script" --quiet --metrics /tmp/dist-bench.jsonl > /dev/null
        d_rss=$(cat /tmp/dist-bench-rss)
        d+=("$(dist_tps)")
        out=$(OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive measure "$py" bench/pytorch_gpt.py "${@:2:7}")
        p_rss=$(cat /tmp/dist-bench-rss)
        p+=("$(echo "$out" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
    done
    "$py" - "$name" "$(median "${d[@]}")" "$(median "${p[@]}")" "$d_rss" "$p_rss" "${d[*]}" "${p[*]}" <<'PY'
import sys
name, d, p, dm, pm = sys.argv[1], *map(float, sys.argv[2:6])
runs_d = ", ".join(f"{float(x):,.0f}" for x in sys.argv[6].split())
runs_p = ", ".join(f"{float(x):,.0f}" for x in sys.argv[7].split())
print(f"| {name} | {d:,.0f} ({runs_d}) | {p:,.0f} ({runs_p}) | {d / p:.2f} | {dm / 1024:,.0f} | {pm / 1024:,.0f} | {dm / pm:.2f} |")
PY
}

echo "| shape | Dist tokens/s, median (runs) | PyTorch tokens/s, median (runs) | ratio | Dist peak MiB | PyTorch peak MiB | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
shapes=${SHAPES:-small 124m}
[[ " $shapes " == *" small "* ]] && row "gpt 4096/128/6x8/384, batch 8" 4096 128 6 8 384 8 12 bench/gpt_small.dist
[[ " $shapes " == *" 124m "* ]] && row "GPT-2 124M, context 256, batch 4" 50257 256 12 12 768 4 8 bench/gpt2_124m.dist
true
