"""HF transformers as the oracle: same weights, fp32, CPU, one prompt at a time."""
from __future__ import annotations

import torch

# Logit gap under which two tokens count as tied: our fp32 kernels and HF's sum
# in different orders, so a near-tie may break either way.
TIE_TOLERANCE = 2e-3


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decode with the KV cache, never stopping early (like ignore_eos)."""
    ids = torch.tensor([prompt_ids])
    out = model(ids, use_cache=True)
    past = out.past_key_values
    tokens = []
    for _ in range(max_new_tokens):
        tok = int(out.logits[0, -1].argmax())
        tokens.append(tok)
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens


@torch.inference_mode()
def hf_next_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1].float()


def compare_greedy(model, prompt_ids: list[int], ours: list[int], theirs: list[int]) -> str:
    """'equal', or 'tie' when the first difference is a near-tie in HF's own
    logits (then the rest may legitimately diverge). Fails otherwise."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            logits = hf_next_logits(model, prompt_ids + ours[:k])
            gap = float(logits[b] - logits[a])
            assert gap <= TIE_TOLERANCE, (
                f"token {k}: engine chose {a}, HF chose {b}, HF logit gap {gap:.4g} is not a near-tie"
            )
            return "tie"
    assert len(ours) == len(theirs), f"engine made {len(ours)} tokens, HF {len(theirs)}"
    return "equal"
