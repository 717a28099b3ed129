#!/usr/bin/env python3
"""Writes a small GPT-2 checkpoint with Hugging Face's own tools, and its loss, for Dist to match.

usage: hf-reference.py OUT_DIR TEXT_FILE

Run where `transformers` and `safetensors` are installed (not Debian's packages; the lent GPU
machine has them). Writes OUT_DIR/config.json and OUT_DIR/model.safetensors through
GPT2LMHeadModel.save_pretrained (Hugging Face's random initialisation, seed 0: vocabulary 256 so
that bytes are tokens, context 64, 2 layers, 2 heads, width 64), OUT_DIR/eval.txt (the first
6000 bytes of TEXT_FILE) and OUT_DIR/hf_eval.json: the mean next-token loss Hugging Face's model
computes over those bytes, cut as `dist eval`
cuts them (consecutive windows of context + 1 tokens, the last partial one dropped; tokens 1..
context of each predicted from the ones before). tests/models/hf_checkpoint_test.cpp loads the
folder with `dist eval` and expects the same loss.
"""
import json
import pathlib
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gpt2_test_weights import scale_up

out = pathlib.Path(sys.argv[1])
text = pathlib.Path(sys.argv[2]).read_bytes()[:6000]
out.mkdir(parents=True, exist_ok=True)
(out / "eval.txt").write_bytes(text)  # the fixture carries its text: TEXT_FILE may change later
context = 64
torch.manual_seed(0)
config = GPT2Config(vocab_size=256, n_positions=context, n_embd=64, n_layer=2, n_head=2,
                    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0)
model = GPT2LMHeadModel(config).eval()
scale_up(model)  # as torch-reference.py does: a misplaced tensor must show in the loss
model.save_pretrained(out, safe_serialization=True)

tokens = torch.tensor(list(text), dtype=torch.long)
windows = len(tokens) // (context + 1)
tokens = tokens[: windows * (context + 1)].view(windows, context + 1)
with torch.no_grad():
    logits = model.double()(tokens[:, :-1]).logits  # in float64: the weights' own loss
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
(out / "hf_eval.json").write_text(json.dumps(
    {"loss": loss.item(), "tokens": windows * context, "text": "tests/fixtures/hf_gpt2_tiny/eval.txt",
     "torch": torch.__version__, "transformers": __import__("transformers").__version__}))
print(f"{out}: loss {loss.item():.6f} over {windows * context} tokens")
