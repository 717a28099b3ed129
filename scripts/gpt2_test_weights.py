"""Random GPT-2 weights for reference checkpoints, large enough that a mistake shows in the loss.

GPT-2's own initialisation (std 0.02) leaves a small model's loss at the uniform log(vocab),
where a misplaced or transposed tensor barely moves it. With these scales, replacing any one
tensor of the test model moves the loss by 7e-4 or more. Used by torch-reference.py and
hf-reference.py on modules named as Hugging Face's GPT2LMHeadModel names them.
"""
import torch


def scale_up(model):
    """Draws every parameter of `model` anew from the global torch generator."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "ln_" in name or name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            elif "wte" in name or "wpe" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
