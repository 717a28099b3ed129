"""pytorch_gpt.py: the reference for bench/compare.sh: the same GPT-2 trained by PyTorch.

Usage: [DEVICE=cuda] [PRECISION=bf16] pytorch_gpt.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS
Prints one line of JSON: tokens per second over the steps after the first two, and the model's
parameter count. Same architecture as std/gpt.dist (pre-norm, tanh GELU, 4x MLP, biases, tied
head), same optimizer (AdamW), fp32 (TF32 off on a GPU, as Dist's cuBLAS calls), random tokens.
PRECISION=bf16 runs the forward under bf16 autocast (float weights and optimizer, as Dist's
`precision: bf16`), with PyTorch's fused scaled-dot-product attention, without torch.compile.
"""
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) \
            if hasattr(F, "scaled_dot_product_attention") else self.attend(q, k, v)
        x = x + self.c_proj(a.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    @staticmethod
    def attend(q, k, v):
        T = q.shape[2]
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    vocab, context, layers, heads, width, batch, steps = map(int, sys.argv[1:8])
    device = os.environ.get("DEVICE", "cpu")
    precision = os.environ.get("PRECISION", "f32")
    autocast = (torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
                if precision == "bf16" else contextlib.nullcontext())
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = GPT(vocab, context, layers, heads, width).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    times = []
    for _ in range(steps):
        idx = torch.randint(0, vocab, (batch, context + 1)).to(device)
        start = time.perf_counter()
        with autocast:
            loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    measured = times[2:]
    tokens = batch * context * len(measured)
    print(json.dumps({"tokens_per_s": tokens / sum(measured),
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "device": device, "precision": precision}))


if __name__ == "__main__":
    main()
