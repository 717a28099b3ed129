#!/usr/bin/env bash
# gpu-check.sh: the CUDA kernels on a GPU: build with CUDA for sm_90 (H100 / H200), run the CUDA
# tests (every op against the CPU op), the NCCL tests, the runtime training on GPU ranks against
# the CPU (runtime_tests' GPU suites), and the GPU benchmarks side by side with
# PyTorch on the same shapes, and print a short table last. Meant to run within a few minutes:
# a lent GPU machine is held for minutes, not hours.
#
#   scripts/gpu-check.sh                 build in build-gpu/ (needs `make deps` and nvcc), check
#   scripts/gpu-check.sh --bundle DIR    build here, then copy the test and benchmark programs
#                                        and the libraries they need beyond CUDA's into DIR
#   scripts/gpu-check.sh --prebuilt DIR  check with a bundle's programs: for a GPU machine that
#                                        has CUDA but not the build's other dependencies
# GPU_CHECK_SANITIZE=1 adds a run of the CUDA tests under compute-sanitizer (memcheck).
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
programs="cuda_tests cuda_bench nccl_tests kernel_tests kernels_bench runtime_tests dist"

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
    sed -n '2,11p' "$0"
    exit 2
    ;;
esac
mkdir -p "$logs"
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
grep -m1 'model name' /proc/cpuinfo || true
for p in $programs; do
    missing=$(ldd "$bin/$p" 2>&1 | grep 'not found')
    [ -z "$missing" ] || { echo "$p cannot load: $missing"; status=1; }
done

timeout 300 "$bin/cuda_tests" --gtest_brief=1 > "$logs/cuda_tests.log" 2>&1 || status=1
grep -E '^\[  (FAILED|SKIPPED)|Failure|error' "$logs/cuda_tests.log" | head -40
tail -3 "$logs/cuda_tests.log"
# GPU_CHECK_SANITIZE=1: the CUDA tests again under compute-sanitizer's memory checker.
if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/cuda_tests" \
        --gtest_brief=1 > "$logs/memcheck.log" 2>&1 || status=1
    grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' "$logs/memcheck.log" | head -20
fi
timeout 120 "$bin/nccl_tests" --gtest_brief=1 > "$logs/nccl_tests.log" 2>&1 || status=1
tail -3 "$logs/nccl_tests.log"
timeout 300 "$bin/kernel_tests" --gtest_brief=1 > "$logs/kernel_tests.log" 2>&1 || status=1
# The runtime's GPU path: ranks on the GPU train as the CPU does (its stdlib from this tree).
DIST_SOURCE_DIR=$PWD timeout 300 "$bin/runtime_tests" --gtest_brief=1 --gtest_filter='Devices.*:Meshes/GpuEquivalence.*' \
    > "$logs/runtime_tests.log" 2>&1 || status=1
grep -E '^\[  FAILED|Failure' "$logs/runtime_tests.log" | head -20
# End to end: GPT-2 124M (context 256, batch 16) trained by `dist run` on one GPU, beside
# PyTorch training the same model on the same GPU (fp32, TF32 off on both sides).
e2e=""
if [ -x "$bin/dist" ]; then
    rm -f "$logs/dist-gpu.jsonl"
    DIST_PATH=$PWD/stdlib timeout 240 "$bin/dist" run bench/gpt2_124m.dist --quiet \
        --set mesh.devices=h200 --set train.batch=16 --metrics "$logs/dist-gpu.jsonl" \
        > "$logs/dist-gpu.log" 2>&1 || { status=1; tail -5 "$logs/dist-gpu.log"; }
    DEVICE=cuda timeout 240 python3 bench/pytorch_gpt.py 50257 256 12 12 768 16 8 \
        > "$logs/torch-gpu.json" 2> "$logs/torch-gpu.log" || { status=1; tail -5 "$logs/torch-gpu.log"; }
    e2e=$(python3 - "$logs/dist-gpu.jsonl" "$logs/torch-gpu.json" <<'PY' 2>&1
import json, sys
try:
    r = [json.loads(l) for l in open(sys.argv[1])][2:]
    d = sum(x["tokens"] for x in r) / sum(x["step_time_s"] for x in r)
except Exception as e:
    d = None
try:
    p = json.load(open(sys.argv[2]))["tokens_per_s"]
except Exception:
    p = None
fmt = lambda v: "-" if v is None else f"{v:,.0f}"
ratio = f"{d / p:.2f}" if d and p else "-"
print(f"| GPT-2 124M on one GPU, tokens/s: Dist {fmt(d)}, PyTorch {fmt(p)} | ratio {ratio} |")
PY
)
fi
timeout 300 "$bin/cuda_bench" --benchmark_min_time=0.2 --benchmark_out="$logs/cuda_bench.json" \
    --benchmark_out_format=json > "$logs/cuda_bench.log" 2>&1 || status=1
grep -E 'ERROR OCCURRED' "$logs/cuda_bench.log" | head -3
timeout 120 "$bin/kernels_bench" --benchmark_min_time=0.2 \
    --benchmark_filter='BM_(matmul_forward/768/3072|attention_backward)' \
    > "$logs/kernels_bench.log" 2>&1 || status=1

echo
echo "| check | result |"
echo "| --- | --- |"
for t in cuda_tests nccl_tests kernel_tests runtime_tests; do
    echo "| $t | $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$t.log" | tr '\n' ' ') |"
done
grep -E '^BM_' "$logs/kernels_bench.log" | awk '{printf "| CPU %s | %s %s |\n", $1, $2, $3}'
[ -n "$e2e" ] && echo "$e2e"
echo
python3 bench/cuda_compare.py "$logs/cuda_bench.json" 2>&1 | grep -E '^\||cuda_compare' || status=1
exit $status
