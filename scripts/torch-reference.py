#!/usr/bin/python3
"""Writes small GPT-2 checkpoints with PyTorch's own torch.save, and their losses, for Dist to match.

usage: torch-reference.py OUT_DIR TEXT_FILE

Runs with Debian's python3-torch (`scripts/install-deps.sh python3-torch`). The model is GPT-2
written out in plain PyTorch, with the module tree of Hugging Face's GPT2LMHeadModel so that its
state dict has exactly Hugging Face's names and layouts: `transformer.h.N.attn.c_attn.weight`
stored [in, out] (Conv1D), `lm_head.weight` sharing its storage with `transformer.wte.weight`,
and the attention-mask buffers older transformers versions saved (`attn.bias` as a BOOL
[1, 1, ctx, ctx] and `attn.masked_bias`). Vocabulary 256 (bytes are tokens), context 64, 2 layers,
2 heads, width 64; weights, biases and layer-norm parameters all random (seed 0) and large enough
that the loss is far from uniform's log(256) = 5.545, so that a
misplaced or transposed tensor shows in the loss.

Writes:
  OUT_DIR/torch_gpt2_tiny/                pytorch_model.bin (f32, one file), config.json,
                                          eval.txt (the first 6000 bytes of TEXT_FILE),
                                          reference.json
  OUT_DIR/torch_gpt2_tiny_sharded_f16/    the same weights in float16, in two shards named by
                                          pytorch_model.bin.index.json as save_pretrained names
                                          them; some tensors saved as strided views or at an
                                          offset into a larger storage; reference.json

reference.json holds the mean next-token loss over eval.txt cut as `dist eval` cuts it
(consecutive windows of context + 1 tokens, the last partial one dropped), computed in float64
from the weights as stored. tests/models/torch_checkpoint_test.cpp loads each folder with
`--load`'s code and expects that loss.
"""
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F

from gpt2_test_weights import scale_up

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 256, 64, 2, 2, 64


class Conv1D(torch.nn.Module):
    """Hugging Face's Conv1D: y = x @ weight + bias, weight stored [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        mask = torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool))
        self.register_buffer("bias", mask.view(1, 1, CONTEXT, CONTEXT))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.c_attn = Conv1D(WIDTH, 3 * WIDTH)
        self.c_proj = Conv1D(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        heads = lambda y: y.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c // HEADS)
        scores = scores.masked_fill(~self.bias[:, :, :t, :t], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(WIDTH, 4 * WIDTH)
        self.c_proj = Conv1D(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(WIDTH, eps=1e-5)
        self.attn = Attention()
        self.ln_2 = torch.nn.LayerNorm(WIDTH, eps=1e-5)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.wpe = torch.nn.Embedding(CONTEXT, WIDTH)
        self.h = torch.nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = torch.nn.LayerNorm(WIDTH, eps=1e-5)


class GPT2LMHeadModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = Transformer()
        self.lm_head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's head is

    def forward(self, idx):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for block in tr.h:
            x = block(x)
        return self.lm_head(tr.ln_f(x))


def reference_loss(model, text):
    tokens = torch.tensor(list(text), dtype=torch.long)
    windows = len(tokens) // (CONTEXT + 1)
    tokens = tokens[: windows * (CONTEXT + 1)].view(windows, CONTEXT + 1)
    with torch.no_grad():
        logits = model.double()(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    return loss.item(), windows * CONTEXT


def config():
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": VOCAB,
            "n_positions": CONTEXT, "n_ctx": CONTEXT, "n_embd": WIDTH, "n_layer": LAYERS,
            "n_head": HEADS, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": True, "torch_dtype": "float32"}


def write_reference(folder, model, text, note):
    loss, tokens = reference_loss(model, text)
    (folder / "reference.json").write_text(json.dumps(
        {"loss": loss, "tokens": tokens, "text": "tests/fixtures/torch_gpt2_tiny/eval.txt",
         "torch": torch.__version__, "note": note}, indent=2) + "\n")
    print(f"{folder}: loss {loss:.6f} over {tokens} tokens")


def main():
    out = pathlib.Path(sys.argv[1])
    text = pathlib.Path(sys.argv[2]).read_bytes()[:6000]
    torch.manual_seed(0)
    model = GPT2LMHeadModel()
    scale_up(model)

    flat = out / "torch_gpt2_tiny"
    flat.mkdir(parents=True, exist_ok=True)
    (flat / "eval.txt").write_bytes(text)
    (flat / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    torch.save(model.state_dict(), flat / "pytorch_model.bin")
    write_reference(flat, copy_of(model), text,
                    "torch.save(model.state_dict()) of f32 weights, one file")

    # The same weights in float16, in two shards, with views the reader must gather.
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    for k in list(half):
        if k.endswith("c_attn.weight"):  # a transposed view: strides (1, rows)
            half[k] = half[k].t().contiguous().t()
        if k.endswith("c_fc.bias"):  # a slice at an offset into a larger storage
            backing = torch.zeros(3 * half[k].numel(), dtype=torch.float16)
            backing[half[k].numel():2 * half[k].numel()] = half[k]
            half[k] = backing[half[k].numel():2 * half[k].numel()]
    sharded = out / "torch_gpt2_tiny_sharded_f16"
    sharded.mkdir(parents=True, exist_ok=True)
    names = list(half)
    cut = len(names) // 2
    shards = {"pytorch_model-00001-of-00002.bin": names[:cut],
              "pytorch_model-00002-of-00002.bin": names[cut:]}
    weight_map = {}
    for shard, keys in shards.items():
        torch.save({k: half[k] for k in keys}, sharded / shard)
        weight_map.update({k: shard for k in keys})
    total = sum(v.numel() * v.element_size() for v in half.values())
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    (sharded / "config.json").write_text(json.dumps(dict(config(), torch_dtype="float16"),
                                                    indent=2) + "\n")
    widened = GPT2LMHeadModel()
    widened.load_state_dict({k: v.float() if v.is_floating_point() else v
                             for k, v in half.items()})
    write_reference(sharded, widened, text,
                    "float16 weights in two shards (pytorch_model.bin.index.json), "
                    "c_attn.weight saved transposed, c_fc.bias at an offset into a larger storage")


def copy_of(model):
    copy = GPT2LMHeadModel()
    copy.load_state_dict(model.state_dict())
    return copy


if __name__ == "__main__":
    main()
