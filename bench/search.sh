#!/usr/bin/env bash
# search.sh [DIST]: how long `dist search` takes, and how much of the space its bounds prune,
# for three model sizes on up to 1,024 devices.
#
# Each row is one `dist search --json` process (wall time from the shell, including the start
# and reading the script; the search's own seconds beside it), on the machine's cores. Prints a
# markdown table: the layouts considered, simulated, pruned by memory, pruned by their bound
# and refused by the rules, and the best layout found.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(realpath "${1:-build/bin/dist}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "| model | devices | considered | simulated (placing the script's) | pruned: memory | pruned: bound | refused | search (s) | wall (s) | best layout |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
row() { # script devices
    local start end
    start=$(date +%s.%N)
    "$dist" search "$1" --top 1 --json --devices "$2" > "$tmp/s.json"
    end=$(date +%s.%N)
    /usr/bin/python3 - "$tmp/s.json" "$2" "$start" "$end" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
n = j["layouts"]
best = j["rows"][0]["describe"] if j["rows"] else "(none fits)"
wall = float(sys.argv[4]) - float(sys.argv[3])
print(f"| {j['model']} | {sys.argv[2]} | {n['considered']:,} | "
      f"{n['simulated']:,} ({n['simulated_placing_the_script']:,}) | "
      f"{n['pruned_memory']:,} | {n['pruned_bound']:,} | {n['refused']:,} | "
      f"{j['seconds']:.1f} | {wall:.1f} | {best} |")
PY
}
row examples/gpt2_124m_8xh200.dist "h200 x 8"
row examples/gpt2_124m_8xh200.dist "h200 x 64"
row examples/llama3_8b_64xh100.dist "h100 x 64"
row examples/llama3_8b_64xh100.dist "h100 x 256"
row bench/search/llama3_70b.dist "h100 x 256"
row bench/search/llama3_70b.dist "h100 x 1024"
