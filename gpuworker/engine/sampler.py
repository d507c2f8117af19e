"""Turn one step's logits into tokens (and optional top-N logprobs).

Order of operations, as in vLLM:
  1. penalties — repetition (prompt + output tokens: positive logits divided,
     negative multiplied), then frequency (x count) and presence (x seen) over
     output tokens;
  2. logprobs — log-softmax of the *penalised* logits, before temperature and
     truncation (so they describe the model after penalties, not the
     truncated sampling distribution);
  3. greedy rows (temperature 0) take the argmax of the penalised logits;
  4. sampling rows: divide by temperature, keep the top-k, then the top-p
     nucleus, then drop tokens below min_p x the best probability, and draw.

Drawing uses the exponential race (argmax of p / E with E ~ Exp(1)), which is
an exact sample from p. Rows with their own ``torch.Generator`` fill their
noise from it, so a seeded request draws the same tokens on re-run whatever
else shares the batch; unseeded rows share one batched draw from the global RNG.

The all-greedy batch without penalties or logprobs is one argmax, nothing else.
Everything else builds its per-row parameter tensors once per call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from schemas import SamplingParams

# Temperatures below this are treated as greedy (dividing by them overflows).
_GREEDY_EPS = 1e-5
# Exponential noise can be exactly 0; keep p / E finite.
_TINY = 1e-20


@dataclass
class SamplingRow:
    """One row of logits that samples this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far (before this step)
    generator: Optional[torch.Generator] = None  # per-request, from params.seed; None = global RNG


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row: top-N {token_id: logprob} (best first) plus the sampled id,
    # when that row asked for logprobs; else None.
    logprobs: list[Optional[dict[int, float]]]


def make_generator(seed: Optional[int], device="cpu") -> Optional[torch.Generator]:
    """A private RNG for a seeded request (None when the request has no seed)."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def _is_greedy(p: SamplingParams) -> bool:
    return p.temperature < _GREEDY_EPS


class Sampler:
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must be [num_rows, vocab] with one row per SamplingRow; "
                f"got shape {tuple(logits.shape)} for {len(rows)} rows"
            )
        n = len(rows)
        if n == 0:
            return SamplerOutput([], [])
        params = [r.params for r in rows]
        greedy = [_is_greedy(p) for p in params]
        penal = [p.uses_penalties for p in params]
        want_lp = [p.logprobs is not None for p in params]

        # Fast path: one argmax for the whole batch.
        if all(greedy) and not any(penal) and not any(want_lp):
            return SamplerOutput(logits.argmax(dim=-1).tolist(), [None] * n)

        logits = logits.float()
        if any(penal):
            logits = logits.clone()  # never modify the caller's tensor
            self._apply_penalties(logits, rows, [i for i in range(n) if penal[i]])

        logprobs_all = None
        if any(want_lp):
            logprobs_all = torch.log_softmax(logits, dim=-1)

        tokens = logits.argmax(dim=-1)
        sample_idx = [i for i in range(n) if not greedy[i]]
        if sample_idx:
            sampled = self._sample(logits, rows, sample_idx)
            if len(sample_idx) == n:
                tokens = sampled
            else:
                tokens[torch.tensor(sample_idx, device=tokens.device)] = sampled

        token_list = tokens.tolist()
        lp_out: list[Optional[dict[int, float]]] = [None] * n
        if logprobs_all is not None:
            lp_out = self._gather_logprobs(logprobs_all, tokens, params, want_lp)
        return SamplerOutput(token_list, lp_out)

    # ------------------------------------------------------------------ penalties
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> None:
        """In place on ``logits`` for the rows in ``idx``."""
        device = logits.device
        vocab = logits.shape[1]
        sel = torch.tensor(idx, device=device)
        sub = logits.index_select(0, sel)
        ps = [rows[i].params for i in idx]

        # Output-token counts [m, V]; padding goes to an extra column that is dropped.
        out_ids = _pad([rows[i].output_token_ids for i in idx], vocab, device)
        counts = torch.zeros(len(idx), vocab + 1, device=device, dtype=torch.float32)
        if out_ids.shape[1]:
            counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=torch.float32))
        counts = counts[:, :vocab]
        seen_out = counts > 0

        rep = torch.tensor([p.repetition_penalty for p in ps], device=device, dtype=torch.float32)
        if bool((rep != 1.0).any()):
            prompt_ids = _pad([rows[i].prompt_token_ids for i in idx], vocab, device)
            seen = torch.zeros(len(idx), vocab + 1, device=device, dtype=torch.bool)
            if prompt_ids.shape[1]:
                seen.scatter_(1, prompt_ids, True)
            seen = seen[:, :vocab] | seen_out
            r = rep[:, None].expand_as(sub)
            penalised = torch.where(sub > 0, sub / r, sub * r)
            sub = torch.where(seen, penalised, sub)

        freq = torch.tensor([p.frequency_penalty for p in ps], device=device, dtype=torch.float32)
        pres = torch.tensor([p.presence_penalty for p in ps], device=device, dtype=torch.float32)
        sub = sub - freq[:, None] * counts - pres[:, None] * seen_out.float()
        logits.index_copy_(0, sel, sub)

    # ------------------------------------------------------------------- sampling
    @staticmethod
    def _sample(logits: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> torch.Tensor:
        device = logits.device
        vocab = logits.shape[1]
        if len(idx) == logits.shape[0]:
            sub = logits.clone()
        else:
            sub = logits.index_select(0, torch.tensor(idx, device=device))
        ps = [rows[i].params for i in idx]

        temp = torch.tensor([p.temperature for p in ps], device=device, dtype=torch.float32)
        sub.div_(temp[:, None])

        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in ps]
        tops = [p.top_p for p in ps]
        if any(k < vocab for k in ks) or any(t < 1.0 for t in tops):
            sorted_vals, order = sub.sort(dim=-1, descending=True)
            pos = torch.arange(vocab, device=device)[None, :]
            k_t = torch.tensor(ks, device=device)[:, None]
            drop = pos >= k_t  # exactly k kept, ties broken by sort order
            sorted_vals = sorted_vals.masked_fill(drop, float("-inf"))
            if any(t < 1.0 for t in tops):
                # Keep a token while the mass strictly before it is below top_p
                # (the best token always stays). top_p == 1 keeps everything.
                p_t = torch.tensor([t if t < 1.0 else 2.0 for t in tops], device=device)[:, None]
                probs_sorted = torch.softmax(sorted_vals, dim=-1)
                mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted
                sorted_vals = sorted_vals.masked_fill(mass_before >= p_t, float("-inf"))
            sub = torch.empty_like(sub).scatter_(1, order, sorted_vals)

        min_ps = [p.min_p for p in ps]
        if any(m > 0.0 for m in min_ps):
            # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p)
            m_t = torch.tensor(min_ps, device=device, dtype=torch.float32)
            floor = sub.max(dim=-1, keepdim=True).values + torch.log(m_t)[:, None]
            sub = sub.masked_fill(sub < floor, float("-inf"))

        probs = torch.softmax(sub, dim=-1)
        noise = torch.empty_like(probs).exponential_()
        for j, i in enumerate(idx):
            g = rows[i].generator
            if g is not None:
                noise[j].exponential_(generator=g)
        return (probs / noise.clamp_min_(_TINY)).argmax(dim=-1)

    # ------------------------------------------------------------------- logprobs
    @staticmethod
    def _gather_logprobs(
        logprobs_all: torch.Tensor,
        tokens: torch.Tensor,
        params: list[SamplingParams],
        want: list[bool],
    ) -> list[Optional[dict[int, float]]]:
        idx = [i for i, w in enumerate(want) if w]
        sel = torch.tensor(idx, device=logprobs_all.device)
        lp = logprobs_all.index_select(0, sel)
        chosen = tokens.index_select(0, sel)
        chosen_lp = lp.gather(1, chosen[:, None])[:, 0].tolist()
        chosen_ids = chosen.tolist()
        top_n = max(params[i].logprobs for i in idx)
        top_vals = top_ids = None
        if top_n > 0:
            tv, ti = lp.topk(min(top_n, lp.shape[1]), dim=-1)  # sorted, best first
            top_vals, top_ids = tv.tolist(), ti.tolist()
        out: list[Optional[dict[int, float]]] = [None] * len(params)
        for j, i in enumerate(idx):
            want_n = params[i].logprobs
            d: dict[int, float] = {}
            if want_n and top_ids is not None:
                for tid, v in zip(top_ids[j][:want_n], top_vals[j][:want_n]):
                    d[int(tid)] = float(v)
            d.setdefault(int(chosen_ids[j]), float(chosen_lp[j]))
            out[i] = d
        return out


def _pad(seqs: list[list[int]], pad: int, device) -> torch.Tensor:
    """Right-pad id lists with ``pad`` into one [m, max_len] long tensor."""
    width = max((len(s) for s in seqs), default=0)
    buf = torch.full((len(seqs), width), pad, dtype=torch.long)
    for j, s in enumerate(seqs):
        if s:
            buf[j, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    # Ids past the logits' width (a tokenizer larger than the head) count nowhere.
    return buf.clamp_(max=pad).to(device)
