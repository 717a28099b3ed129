#!/usr/bin/env python3
"""PyTorch on the same GPU shapes as build/bin/cuda_bench, as the reference for its ratios.

usage: cuda_compare.py [CUDA_BENCH_JSON]

Measures each of cuda_bench's benchmarks in PyTorch (`NAME TFLOP/s` lines as it goes), then, given
the JSON that `cuda_bench --benchmark_out=FILE --benchmark_out_format=json` wrote, prints a
Markdown table of both and their ratio (Dist / PyTorch). The FLOP counts are
cuda_bench's: 2*N*C*OC for a forward matmul, twice that for its backward (input and weight
gradients), 4*B*H*T*T*D/2 for causal attention forward and 2.5 times that for its backward.
Each figure is the median over timed batches of launches between CUDA events, after warm-up.
"""
import json
import statistics
import sys


def dist_figures(path):
    """name -> TFLOP/s from cuda_bench's JSON output (errors and skipped runs left out)."""
    try:
        with open(path) as f:
            runs = json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError) as e:
        print(f"cuda_compare: no figures of Dist's from {path}: {e}")
        return {}
    return {r["name"].removesuffix("/real_time"): r["TFLOP/s"] for r in runs
            if "TFLOP/s" in r and not r.get("error_occurred")}


def table(dist, torch_rates):
    print("| benchmark | Dist TFLOP/s | PyTorch TFLOP/s | Dist / PyTorch |")
    print("| --- | --- | --- | --- |")
    for name in list(dist) + [n for n in torch_rates if n not in dist]:
        d, t = dist.get(name), torch_rates.get(name)
        ratio = f"{d / t:.2f}" if d and t else "-"
        print(f"| {name} | {d if d is None else round(d, 2)} | "
              f"{t if t is None else round(t, 2)} | {ratio} |")


dist = dist_figures(sys.argv[1]) if len(sys.argv) > 1 else {}
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("cuda_compare: no PyTorch here, no reference measured")
    table(dist, {})
    sys.exit(0)

if not torch.cuda.is_available():
    print("cuda_compare: no GPU visible, no reference measured")
    table(dist, {})
    sys.exit(0)

torch.backends.cuda.matmul.allow_tf32 = False  # cuda_bench's float matmul is true fp32
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
N = 8 * 1024
AB, AT, AH, AD = 8, 1024, 12, 64
ATTENTION_FLOPS = 4.0 * AB * AH * AT * AT * AD / 2


def timed(fn, flops, batches=7, per_batch=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rates = []
    for _ in range(batches):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_batch):
            fn()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / per_batch
        rates.append(flops / seconds / 1e12)
    return statistics.median(rates)


measured = {}


def report(name, rate):
    measured[name] = rate
    print(f"{name} {rate:.2f}", flush=True)


for C, OC in [(768, 2304), (768, 3072), (3072, 768)]:
    x = torch.randn(N, C, device=dev)
    w = torch.randn(OC, C, device=dev)
    b = torch.randn(OC, device=dev)
    report(f"BM_cuda_matmul_f32/{C}/{OC}", timed(lambda: F.linear(x, w, b), 2.0 * N * C * OC))

    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    report(f"BM_cuda_matmul_bf16/{C}/{OC}", timed(lambda: F.linear(xb, wb, bb), 2.0 * N * C * OC))

    dy = torch.randn(N, OC, device=dev).bfloat16()

    def backward():
        dx = dy @ wb  # [N, OC] x [OC, C]
        dw = dy.t() @ xb  # [OC, N] x [N, C]
        db = dy.float().sum(0)
        return dx, dw, db

    report(f"BM_cuda_matmul_bf16_backward/{C}/{OC}", timed(backward, 4.0 * N * C * OC))
    del x, w, b, xb, wb, bb, dy

q, k, v = (torch.randn(AB, AH, AT, AD, device=dev) for _ in range(3))
report("BM_cuda_attention_forward",
       timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), ATTENTION_FLOPS))

qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
grad = torch.randn_like(out)


def attention_backward():
    torch.autograd.grad(out, (qg, kg, vg), grad, retain_graph=True)


report("BM_cuda_attention_backward", timed(attention_backward, 2.5 * ATTENTION_FLOPS))

print()
table(dist, measured)
