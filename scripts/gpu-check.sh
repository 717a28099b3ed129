#!/usr/bin/env bash
# gpu-check.sh: on a machine with a GPU, build with CUDA for sm_90 (H100 / H200), run the CUDA
# tests and the GPU-relevant benchmarks, and print a short table last. Meant to run within a few
# minutes: a lent GPU machine is held for minutes, not hours.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
jobs=$(nproc)
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDIST_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDIST_FUZZ=OFF > "$build.configure.log" 2>&1 ||
    { tail -20 "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target cuda_tests kernel_tests kernels_bench cuda_bench dist \
    > "$build.build.log" 2>&1 || { tail -30 "$build.build.log"; exit 1; }

"$build/bin/cuda_tests" --gtest_brief=1 > "$build.cuda_tests.log" 2>&1 || status=1
tail -5 "$build.cuda_tests.log"
"$build/bin/kernel_tests" --gtest_brief=1 > "$build.kernel_tests.log" 2>&1 || status=1
"$build/bin/kernels_bench" --benchmark_min_time=0.2 > "$build.bench.log" 2>&1 || status=1
"$build/bin/cuda_bench" --benchmark_min_time=0.2 \
    --benchmark_filter='BM_cuda_matmul_(f32|bf16|bf16_backward)/768/3072|BM_cuda_attention' \
    > "$build.cuda_bench.log" 2>&1 || status=1

echo
echo "| check | result |"
echo "| --- | --- |"
echo "| cuda_tests | $(grep -E 'PASSED|FAILED' "$build.cuda_tests.log" | tr '\n' ' ') |"
echo "| kernel_tests (CPU, this host) | $(grep -E 'PASSED|FAILED' "$build.kernel_tests.log" | tr '\n' ' ') |"
grep -E '^BM_(matmul_forward/768/3072|attention_backward)' "$build.bench.log" |
    awk '{printf "| %s | %s %s, %s |\n", $1, $2, $3, $NF}'
grep -E '^BM_cuda_' "$build.cuda_bench.log" | awk '{printf "| %s | %s %s, %s |\n", $1, $2, $3, $NF}'
grep -E 'ERROR OCCURRED' "$build.cuda_bench.log" | head -3
exit $status
