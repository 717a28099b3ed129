#!/usr/bin/env bash
# sched.sh [--set KEY=VALUE ...]: how the operating system runs the ranks of one training run.
#
# Trains examples/gpt_tiny.dist with the given overrides (after `--set mesh.devices=here` when
# $DIST_PATH holds a calibrated `here` profile, else on `cpu`) for $STEPS steps (default 30)
# under `perf sched record`, then reads the trace with bench/sched_trace.py: the share of the
# cores' time the ranks' threads ran, and why the cores idled otherwise; how many wakings of a
# rank's thread took a core at once from a running one, by how long it had slept and how long
# its last turn lasted. Needs `perf` (linux-perf) and the right to trace the scheduler (root, or
# kernel.perf_event_paranoid at most 1). Example, four ranks a core on two cores:
#   DIST_PATH=DIR bench/sched.sh --set mesh.pp=8 --set model.layers=8 --set schedule.microbatches=16
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${DIST:-build/bin/dist}")
steps=${STEPS:-30}
command -v perf > /dev/null || { echo "sched.sh: needs perf (apt-get install linux-perf)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
devices=cpu
for dir in ${DIST_PATH:+${DIST_PATH//:/ }}; do
    [[ -f "$dir/hardware/here.toml" ]] && devices=here
done
# perf record exits with the run's status: a run that failed is said, not traced.
if ! perf sched record -o "$tmp/perf.data" -- "$dist" run examples/gpt_tiny.dist \
    --set mesh.devices="$devices" --set 'train.data=synthetic()' --set train.stop_after="$steps" \
    "$@" > "$tmp/run.txt" 2>&1; then
    grep -v "^\[ perf record" "$tmp/run.txt" >&2
    echo "sched.sh: the run failed (above), or perf could not trace it (perf_event_paranoid?)" >&2
    exit 1
fi
grep -E "^step time|^training" "$tmp/run.txt" || true
perf sched script -i "$tmp/perf.data" 2> /dev/null | /usr/bin/python3 bench/sched_trace.py
