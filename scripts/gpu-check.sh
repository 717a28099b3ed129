#!/usr/bin/env bash
# shellcheck disable=SC2317 # its functions run through `step`, which shellcheck cannot follow
# gpu-check.sh: the CUDA kernels on a GPU: build with CUDA for sm_90 (H100 / H200), run the CUDA
# tests (every op against the CPU op), the NCCL tests, the runtime training on GPU ranks against
# the CPU (runtime_tests' GPU suites, f32 and bf16), the GPU's calibration and a run's measured
# step beside its prediction, and the GPU benchmarks side by side with PyTorch on the same GPU,
# and print a short table last. CPU-only tests stay off the device.
#
#   scripts/gpu-check.sh                 build in build-gpu/ (needs `make deps` and nvcc), check
#   scripts/gpu-check.sh --bundle DIR    build here, then copy the test and benchmark programs
#                                        and the libraries they need beyond CUDA's into DIR
#   scripts/gpu-check.sh --prebuilt DIR  check with a bundle's programs: for a GPU machine that
#                                        has CUDA but not the build's other dependencies
#
# GPU_CHECK_TIER picks how much runs (the device's time is counted):
#   quick    versions, the CUDA tests, the runtime's GPU suites, `dist calibrate` on the GPU and
#            GPT-2 124M trained by `dist run` beside its prediction from that profile and from
#            the h200 datasheet one (about 2 minutes with a prebuilt bundle)
#   default  also NCCL, the same training by PyTorch (f32 and bf16) and the CUDA benchmarks
#            against PyTorch (about 2 minutes more)
#   full     also the CUDA tests under compute-sanitizer's memcheck (GPU_CHECK_SANITIZE=1 too)
# Every step's log (appended to steps.log), summary.json (one entry per step: name, exit status,
# seconds, the log's last lines), the calibrated profile, the runs' metrics and traces are
# written into $OUT (else the log folder) as each step ends, so a run cut short by a time limit
# still returns what it did.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build="build-gpu"
programs="cuda_tests cuda_bench nccl_tests runtime_tests dist"

build_here() {
    mkdir -p "$build"
    # Portable CPU code (no -march=native): the bundle may run on another processor.
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDIST_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DDIST_NATIVE=OFF -DDIST_FUZZ=OFF \
        > "$build/configure.log" 2>&1 || { tail -20 "$build/configure.log"; exit 1; }
    # shellcheck disable=SC2086
    cmake --build "$build" -j "$(nproc)" --target $programs > "$build/build.log" 2>&1 ||
        { tail -30 "$build/build.log"; exit 1; }
}

bin=$build/bin
logs=$build
case "${1:-}" in
--bundle)
    out=${2:?"--bundle needs a folder"}
    build_here
    mkdir -p "$out/bin" "$out/lib"
    for p in $programs; do
        [ -x "$bin/$p" ] || continue
        cp "$bin/$p" "$out/bin/" && strip "$out/bin/$p"
    done
    # Every library the programs load that is neither CUDA's (the GPU machine has its own) nor
    # the C library's.
    for p in "$out"/bin/*; do ldd "$p"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.so|/cuda' |
        while read -r lib; do cp -L "$lib" "$out/lib/"; done
    du -sh "$out"
    exit 0
    ;;
--prebuilt)
    bundle=$(cd "${2:?"--prebuilt needs a folder"}" && pwd)
    bin=$bundle/bin
    logs=${TMPDIR:-/tmp}/gpu-check
    # CUDA's libraries from the toolkit, or from the Python wheels of NVIDIA's (nvidia/*/lib).
    libs=$bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib
    wheels=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__) if nvidia.__file__ else list(nvidia.__path__)[0])' 2>/dev/null)
    [ -n "$wheels" ] && libs=$libs:$(find "$wheels" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    ;;
"")
    build_here
    ;;
*)
    sed -n '3,22p' "$0"
    exit 2
    ;;
esac
tier=${GPU_CHECK_TIER:-default}
[ "${GPU_CHECK_SANITIZE:-0}" = 1 ] && tier=full
case "$tier" in quick | default | full) ;; *) echo "GPU_CHECK_TIER: quick, default or full" && exit 2 ;; esac
out=${OUT:-$logs}
mkdir -p "$logs" "$out"
summary=$out/summary.json
echo '[]' > "$summary"
status=0

# step NAME SECONDS COMMAND...: runs the command with its output in NAME.log, then appends its
# outcome to summary.json and copies the log to $OUT, before the next step starts.
step() {
    local name=$1 limit=$2 begin rc
    shift 2
    begin=$(date +%s.%N)
    if declare -F "$1" > /dev/null; then # a function of this script: no timeout of its own
        "$@" > "$logs/$name.log" 2>&1
    else
        timeout "$limit" "$@" > "$logs/$name.log" 2>&1
    fi
    rc=$?
    [ "$rc" = 0 ] || status=1
    python3 - "$summary" "$name" "$rc" "$begin" "$logs/$name.log" <<'PY'
import json, sys, time
path, name, rc, begin, log = sys.argv[1:6]
entries = json.load(open(path))
lines = open(log, errors="replace").read().splitlines()
entries.append({"step": name, "rc": int(rc), "seconds": round(time.time() - float(begin), 1),
                "timed_out": rc in ("124", "137"), "tail": lines[-6:]})
json.dump(entries, open(path, "w"), indent=1)
PY
    # One file of every step's log in $OUT (the device returns a few files, not one per step).
    [ "$logs" = "$out" ] || { echo "=== $name: exit $rc" && cat "$logs/$name.log"; } >> "$out/steps.log"
    echo "$name: exit $rc"
    return "$rc"
}

versions() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    grep -m1 'model name' /proc/cpuinfo
    command -v nvcc > /dev/null && nvcc --version | tail -2
    for h in /usr/local/cuda/include/cudnn_version.h /usr/include/cudnn_version.h; do
        [ -f "$h" ] && awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{v = v s $3; s = "."}
            END {print "cudnn (headers) " v}' "$h" && break
    done
    for h in /usr/include/nccl.h /usr/local/cuda/include/nccl.h; do
        [ -f "$h" ] && awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v = v s $3; s = "."}
            END {print "nccl (headers) " v}' "$h" && break
    done
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
        "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())' || true
    for p in $programs; do
        [ -x "$bin/$p" ] || continue
        missing=$(ldd "$bin/$p" 2>&1 | grep 'not found')
        [ -z "$missing" ] || { echo "$p cannot load: $missing"; return 1; }
    done
}
step versions 60 versions
cat "$logs/versions.log"

step cuda_tests 300 "$bin/cuda_tests" --gtest_brief=1
grep -E '^\[  (FAILED|SKIPPED)|Failure' "$logs/cuda_tests.log" | head -40
# The runtime's GPU path: ranks on the GPU train as the CPU does, in f32 and in bf16 (its
# stdlib from this tree).
step runtime_tests 300 env DIST_SOURCE_DIR="$PWD" "$bin/runtime_tests" --gtest_brief=1 \
    --gtest_filter='Devices.*:Meshes/GpuEquivalence.*:GpuBf16.*'
grep -E '^\[  FAILED|Failure' "$logs/runtime_tests.log" | head -20
# `dist calibrate` on the GPU (its full grid: half a minute on an H200): the profile it writes,
# which `dist sim` then loads through DIST_PATH and prices a plan with.
if [ -x "$bin/dist" ]; then
    mkdir -p "$logs/cal/hardware"
    step calibrate 300 env DIST_PATH="$PWD/stdlib" "$bin/dist" calibrate --device cuda \
        --out "$logs/cal/hardware/gpu.toml"
    [ "$logs" = "$out" ] || cp "$logs/cal/hardware/gpu.toml" "$out/" 2> /dev/null
    step calibrated_sim 60 env DIST_PATH="$logs/cal:$PWD/stdlib" "$bin/dist" sim \
        examples/gpt_tiny.dist --set mesh.devices=gpu --set 'train.data=synthetic()'
    tail -3 "$logs/calibrated_sim.log"
fi

sims=""
if [ -x "$bin/dist" ]; then
    # Predicted beside measured: GPT-2 124M (context 256, batch 16) trained by `dist run` on one
    # GPU, priced by the calibrated profile (its last line: measured and simulated step and
    # bubble; its trace: both timelines), and by the h200 datasheet profile through `dist sim`.
    profile=gpu
    [ -f "$logs/cal/hardware/gpu.toml" ] || profile=h200
    for pr in f32 bf16; do
        rm -f "$logs/dist-$pr.jsonl"
        step "dist_$pr" 180 env DIST_PATH="$logs/cal:$PWD/stdlib" "$bin/dist" run \
            bench/gpt2_124m.dist --quiet --set mesh.devices=$profile --set train.batch=16 \
            --set train.steps=20 --set train.precision=$pr --metrics "$logs/dist-$pr.jsonl" \
            --trace "$logs/trace-$pr.json"
        [ "$logs" = "$out" ] || cp "$logs/dist-$pr.jsonl" "$logs/trace-$pr.json" "$out/" 2> /dev/null
        step "sim_h200_$pr" 60 env DIST_PATH="$PWD/stdlib" "$bin/dist" sim bench/gpt2_124m.dist \
            --json --set mesh.devices=h200 --set train.batch=16 --set train.precision=$pr
    done
    sims=$(python3 - "$logs" <<'PY' 2>&1
import json, re, sys
logs = sys.argv[1]
for pr in ("f32", "bf16"):
    # The run's own line: the median step after the first, beside the calibrated prediction.
    m = cal = memory = None
    try:
        for line in open(f"{logs}/dist_{pr}.log", errors="replace"):
            g = re.search(r"measured ([0-9.]+) ms, predicted ([0-9.]+) ms", line)
            if g: m, cal = float(g.group(1)) / 1e3, float(g.group(2)) / 1e3
            g = re.search(r"memory: measured ([0-9.]+) MB at the peak of cuda.*predicted ([0-9.]+) MB", line)
            if g: memory = f"; memory: measured {g.group(1)} MB, predicted {g.group(2)} MB"
    except OSError:
        pass
    try:
        d = json.loads(open(f"{logs}/sim_h200_{pr}.log").read())["step_time_s"]
    except Exception:
        d = None
    fmt = lambda v: "-" if v is None else f"{v * 1e3:.1f} ms"
    rat = lambda v: f" ({v / m:.2f}x)" if v and m else ""
    print(f"| GPT-2 124M step, {pr}: measured {fmt(m)}; calibrated {fmt(cal)}{rat(cal)}; "
          f"h200 datasheet {fmt(d)}{rat(d)}{memory or ''} | predicted (/ measured) |")
PY
)
fi
e2e=""
if [ "$tier" != quick ]; then
    step nccl_tests 120 "$bin/nccl_tests" --gtest_brief=1
    # End to end beside PyTorch training the same model on the same GPU: f32 (TF32 off on both
    # sides), then bf16 (PyTorch under autocast with its fused attention).
    if [ -x "$bin/dist" ]; then
        for pr in f32 bf16; do
            step "torch_$pr" 240 env DEVICE=cuda PRECISION=$pr \
                python3 bench/pytorch_gpt.py 50257 256 12 12 768 16 8
        done
        e2e=$(python3 - "$logs" <<'PY' 2>&1
import json, sys
logs = sys.argv[1]
for pr in ("f32", "bf16"):
    try:
        r = [json.loads(l) for l in open(f"{logs}/dist-{pr}.jsonl")][2:]
        d = sum(x["tokens"] for x in r) / sum(x["step_time_s"] for x in r)
    except Exception:
        d = None
    try:
        p = json.loads(open(f"{logs}/torch_{pr}.log").read().splitlines()[-1])["tokens_per_s"]
    except Exception:
        p = None
    fmt = lambda v: "-" if v is None else f"{v:,.0f}"
    ratio = f"{d / p:.2f}" if d and p else "-"
    print(f"| GPT-2 124M on one GPU, {pr}, tokens/s: Dist {fmt(d)}, PyTorch {fmt(p)} | ratio {ratio} |")
PY
)
    fi
    step cuda_bench 300 "$bin/cuda_bench" --benchmark_min_time=0.2 \
        --benchmark_out="$logs/cuda_bench.json" --benchmark_out_format=json
    [ "$logs" = "$out" ] || cp "$logs/cuda_bench.json" "$out/" 2> /dev/null
fi
if [ "$tier" = full ] && command -v compute-sanitizer > /dev/null; then
    step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_tests" \
        --gtest_brief=1
    grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' "$logs/memcheck.log" | head -20
fi

echo
echo "| check | result |"
echo "| --- | --- |"
for t in cuda_tests runtime_tests nccl_tests memcheck; do
    [ -f "$logs/$t.log" ] || continue
    echo "| $t | $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$t.log" | tr '\n' ' ') |"
done
[ -f "$logs/calibrate.log" ] && echo "| calibrate | $(grep -E '^wrote|error' "$logs/calibrate.log" | tail -1) |"
[ -f "$logs/calibrated_sim.log" ] && echo "| calibrated sim | $(grep -E "step" "$logs/calibrated_sim.log" | head -1) |"
[ -n "$sims" ] && echo "$sims"
[ -n "$e2e" ] && echo "$e2e"
if [ -f "$logs/cuda_bench.json" ]; then
    echo
    python3 bench/cuda_compare.py "$logs/cuda_bench.json" 2>&1 | grep -E '^\||cuda_compare' || status=1
fi
exit $status
