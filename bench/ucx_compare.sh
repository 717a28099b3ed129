#!/usr/bin/env bash
# ucx_compare.sh [UCX_BENCH]: activation transfer between two processes through Dist's UCX path
# (bench/ucx_bench.cpp) beside ucx_perftest (ucx-utils) on the same machine, same sizes, same
# UCX_TLS (the environment's, else UCX's choice): one-way latency (tag_lat) and bandwidth with
# a window of 16 messages (tag_bw), and the ratio Dist / ucx_perftest. Each side runs RUNS
# times (default 3), alternating; the table shows medians and every run.
#
# ucx_perftest busy-polls; Dist sleeps on the worker's event fd when there is nothing to do, so
# its small-message latency includes a wake-up. Sizes: LAT_SIZE (default 8) for latency,
# BW_SIZES (default "65536 4194304") for bandwidth. SPIN_US (default 0) lets Dist's waits poll
# that many microseconds before sleeping (UcxOptions::spin). The machines are shared: compare ratios
# within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-build/bin/ucx_bench}
lat_size=${LAT_SIZE:-8}
bw_sizes=${BW_SIZES:-"65536 4194304"}
command -v ucx_perftest >/dev/null || { echo "ucx_compare.sh: ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 1; }
[ -x "$bench" ] || { echo "ucx_compare.sh: $bench missing (cmake --build build --target ucx_bench)" >&2; exit 1; }

port=$((20000 + RANDOM % 20000))

# perftest TEST SIZE ITERS -> the "Final:" line's overall latency (us) and bandwidth (MiB/s).
perftest() {
    local out="" try
    for try in 1 2 3 4 5; do
        port=$((port + 1))
        ucx_perftest -p "$port" >/dev/null 2>&1 &
        local server=$!
        sleep 0.3
        out=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" -w 100 2>/dev/null |
              awk '/^Final:/ {print $5, $7}') || true
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        [ -n "$out" ] && break
    done
    [ -n "$out" ] || { echo "ucx_compare.sh: ucx_perftest $1 -s $2 failed" >&2; exit 1; }
    echo "$out"
}

runs=${RUNS:-3}
sizes="$lat_size"
for s in $bw_sizes; do sizes="$sizes,$s"; done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# Each side RUNS times, alternating; medians, with every run in parentheses.
declare -A dist perf
for ((r = 1; r <= runs; r++)); do
    out=$("$bench" --sizes "$sizes" --spin-us "${SPIN_US:-0}")
    dist[lat]+="$(echo "$out" | awk -v s="$lat_size" '$1 == s {print $2}') "
    for s in $bw_sizes; do dist[$s]+="$(echo "$out" | awk -v s="$s" '$1 == s {print $3}') "; done
    read -r l _ <<<"$(perftest tag_lat "$lat_size" 20000)"
    perf[lat]+="$l "
    for s in $bw_sizes; do
        read -r _ b <<<"$(perftest tag_bw "$s" $((s > 65536 ? 1000 : 20000)))"
        perf[$s]+="$b "
    done
done

row() { # measure size key
    local d p
    d=$(median ${dist[$3]}) p=$(median ${perf[$3]})
    echo "| $1 | $2 | $d (${dist[$3]% }) | $p (${perf[$3]% }) | $(ratio "$d" "$p") |"
}
echo "| measure | size (bytes) | Dist, median (runs) | ucx_perftest, median (runs) | Dist / ucx_perftest |"
echo "| --- | --- | --- | --- | --- |"
row "one-way latency (us, lower is better)" "$lat_size" lat
for s in $bw_sizes; do row "bandwidth (MiB/s)" "$s" "$s"; done
