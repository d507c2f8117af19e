"""Turn one step's logits into tokens (and optional top-N logprobs).

Order of operations, as vLLM V1 defines it:
  0. raw logprobs — when a row asks for logprobs in the default mode
     ``raw_logprobs``: log-softmax of the model's logits *before anything
     below* (``raw_logits``: those logits themselves);
  1. penalties — repetition (prompt + output tokens: positive logits divided,
     negative multiplied), then frequency (x count) and presence (x seen) over
     output tokens;
  2. greedy rows (temperature < 1e-5) take the argmax of the penalised logits;
  3. sampling rows: divide by temperature, then drop tokens below
     min_p x the best probability, then keep the top-k, then the top-p nucleus
     (normalised over what min-p and top-k left), and draw.
  ``processed_logprobs`` / ``processed_logits`` report the distribution the
  token was drawn from: step 3's logits (masked tokens at -inf) for sampling
  rows, the penalised logits for greedy rows.

Drawing is by inverse CDF: one uniform u per row, the first token whose
cumulative probability exceeds u. Rows with their own ``torch.Generator`` take
u from it, so a seeded request draws the same tokens on re-run whatever else
shares the batch (given the same logits); unseeded rows share one batched draw
from the global RNG. Rows with top-k/top-p work on a partial sort of their best
tokens (widened only when a nucleus does not fit), never a full-vocabulary sort
unless needed.

The all-greedy batch without penalties or logprobs is one argmax, nothing else.
Everything else builds its per-row parameter tensors once per call.

Prompt logprobs (``prompt_logprobs_of``) are the log-softmax of the model's
logits at each prompt position, for the next prompt token: raw, as in vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from schemas import SamplingParams

# Temperatures below this are treated as greedy (dividing by them overflows).
_GREEDY_EPS = 1e-5


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


# CPU argmax works on blocks of this many logits (see greedy_argmax).
_ARGMAX_BLOCK = 512


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of each row's largest logit, the first one among equal maxima, in the
    logits' own dtype (no cast, no copy of the rows).

    On CUDA this is ``argmax`` (one kernel). On CPU, ``max(dim=-1).indices`` and
    ``argmax`` reduce element by element (~1.7 / 2.7 ns per logit on one core),
    while ``amax`` is vectorised and bound by memory bandwidth. So: the max of each
    block of ``_ARGMAX_BLOCK`` logits (one vectorised pass over the rows), the first
    block holding the row's max, and ``max().indices`` inside that block only.
    Same result as ``argmax``, ties included (first block, then first index in it).
    NaN rows fall back to ``argmax`` (NaN counts as the maximum there).
    """
    if logits.device.type != "cpu" or logits.shape[-1] <= 2 * _ARGMAX_BLOCK:
        return logits.argmax(dim=-1)
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    bk = _ARGMAX_BLOCK
    nb = vocab // bk
    block_max = logits[:, : nb * bk].view(rows, nb, bk).amax(dim=-1)
    if nb * bk < vocab:
        block_max = torch.cat([block_max, logits[:, nb * bk :].amax(dim=-1, keepdim=True)], dim=1)
    row_max = block_max.amax(dim=-1, keepdim=True)
    hit = block_max == row_max
    first = hit.to(torch.uint8).argmax(dim=-1)  # first block holding the row's max
    start = first * bk
    cols = (start[:, None] + torch.arange(bk, device=logits.device)[None, :]).clamp_(max=vocab - 1)
    # The last block may be short: clamped columns repeat the final logit after
    # its own position, so the first maximum inside the block is still the real one.
    picked = start + logits.gather(1, cols).max(dim=-1).indices
    nan_rows = torch.isnan(row_max[:, 0])
    if bool(nan_rows.any()):
        picked = torch.where(nan_rows, logits.argmax(dim=-1), picked)
    return picked


def _is_greedy(p: SamplingParams) -> bool:
    return p.temperature < _GREEDY_EPS


def _is_plain_greedy(p: SamplingParams) -> bool:
    return p.temperature < _GREEDY_EPS and p.logprobs is None and not p.uses_penalties


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
        # Fast path: one argmax for the whole batch (the check stops at the first other row).
        if all(_is_plain_greedy(r.params) for r in rows):
            return SamplerOutput(greedy_argmax(logits).tolist(), [None] * n)

        params = [r.params for r in rows]
        greedy = [_is_greedy(p) for p in params]
        penal = [p.uses_penalties for p in params]
        want_lp = [p.logprobs is not None for p in params]
        modes = [p.logprobs_mode if w else None for p, w in zip(params, want_lp)]
        want_processed = [m is not None and m.startswith("processed") for m in modes]

        raw = logits.float()
        logits = raw
        if any(penal):
            logits = raw.clone(memory_format=torch.contiguous_format)  # never modify the caller's tensor
            self._apply_penalties(logits, rows, [i for i in range(n) if penal[i]])

        sample_idx = [i for i in range(n) if not greedy[i]]
        need_processed = [want_processed[i] for i in sample_idx]
        processed = None  # full-vocabulary step-3 logits of the sampling rows that report them
        if len(sample_idx) == n:
            tokens, processed = self._sample(logits, rows, sample_idx, need_processed)
        else:
            tokens = greedy_argmax(logits)
            if sample_idx:
                sampled, processed = self._sample(logits, rows, sample_idx, need_processed)
                tokens[torch.tensor(sample_idx, device=tokens.device)] = sampled

        token_list = tokens.tolist()
        lp_out: list[Optional[dict[int, float]]] = [None] * n
        if any(want_lp):
            # One source row per asking row: raw logits, penalised (greedy), or step-3 (sampling).
            pos_in_sample = {i: j for j, i in enumerate(sample_idx)}
            src_rows = []
            for i in range(n):
                if not want_lp[i]:
                    continue
                if not want_processed[i]:
                    src_rows.append(raw[i])
                elif greedy[i]:
                    src_rows.append(logits[i])
                else:
                    src_rows.append(processed[pos_in_sample[i]])
            lp_out = self._gather_logprobs(torch.stack(src_rows), tokens, params, want_lp, modes)
        return SamplerOutput(token_list, lp_out)

    # ------------------------------------------------------------------ penalties
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow], idx: list[int]) -> None:
        """In place on the contiguous ``logits``, touching only the tokens seen.

        Works on flat indices (row * vocab + token) so the cost follows the
        number of prompt/output tokens, not rows x vocab.
        """
        device = logits.device
        vocab = logits.shape[1]
        flat = logits.view(-1)
        ps = {i: rows[i].params for i in idx}

        out_flat = _flat_ids([(i, rows[i].output_token_ids) for i in idx], vocab, device)
        rep_rows = [i for i in idx if ps[i].repetition_penalty != 1.0]
        if rep_rows:
            seen = _flat_ids(
                [(i, rows[i].prompt_token_ids) for i in rep_rows] + [(i, rows[i].output_token_ids) for i in rep_rows],
                vocab,
                device,
            ).unique()
            rep = torch.ones(logits.shape[0], device=device, dtype=logits.dtype)
            rep[torch.tensor(rep_rows, device=device)] = torch.tensor(
                [ps[i].repetition_penalty for i in rep_rows], device=device, dtype=logits.dtype
            )
            r = rep[seen // vocab]
            vals = flat[seen]
            flat[seen] = torch.where(vals > 0, vals / r, vals * r)

        if out_flat.numel() and any(ps[i].frequency_penalty or ps[i].presence_penalty for i in idx):
            freq = torch.zeros(logits.shape[0], device=device, dtype=logits.dtype)
            pres = torch.zeros_like(freq)
            sel = torch.tensor(idx, device=device)
            freq[sel] = torch.tensor([ps[i].frequency_penalty for i in idx], device=device, dtype=logits.dtype)
            pres[sel] = torch.tensor([ps[i].presence_penalty for i in idx], device=device, dtype=logits.dtype)
            tok, count = out_flat.unique(return_counts=True)
            row = tok // vocab
            flat[tok] -= freq[row] * count.to(logits.dtype) + pres[row]

    # ------------------------------------------------------------------- sampling
    @staticmethod
    def _sample(
        logits: torch.Tensor, rows: list[SamplingRow], idx: list[int], want_processed: list[bool]
    ) -> tuple[torch.Tensor, Optional[list[Optional[torch.Tensor]]]]:
        """Draw one token for each row in ``idx`` (all with temperature > 0).

        Also returns, per row of ``idx`` that ``want_processed``, its step-3
        logits over the whole vocabulary (None for the others; None overall
        when no row wants them).
        """
        device = logits.device
        vocab = logits.shape[1]
        ps = [rows[i].params for i in idx]

        # Inverse CDF needs one uniform per row. Seeded rows take theirs from
        # their own generator, so their draw does not depend on the batch.
        u = torch.rand(len(idx), device=device)
        for j, i in enumerate(idx):
            g = rows[i].generator
            if g is not None:
                u[j] = torch.rand(1, generator=g, device=g.device).to(device)[0]

        # Rows with top-k/top-p sample among their best tokens only (a partial
        # sort); the others sample over the whole vocabulary.
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in ps]
        truncated = [j for j, p in enumerate(ps) if ks[j] < vocab or p.top_p < 1.0]
        plain = [j for j in range(len(idx)) if ks[j] >= vocab and ps[j].top_p >= 1.0]
        picked = torch.empty(len(idx), dtype=torch.long, device=device)
        processed: Optional[list[Optional[torch.Tensor]]] = [None] * len(idx) if any(want_processed) else None
        for group, fn in ((plain, _sample_full), (truncated, _sample_truncated)):
            if not group:
                continue
            sel = torch.tensor([idx[j] for j in group], device=device)
            g_logits = logits if len(group) == logits.shape[0] else logits.index_select(0, sel)
            g_params = [ps[j] for j in group]
            temp = torch.tensor([p.temperature for p in g_params], device=device, dtype=logits.dtype)
            g_u = u if len(group) == len(idx) else u[torch.tensor(group, device=device)]
            keep = processed is not None and any(want_processed[j] for j in group)
            # Division makes a new tensor: the caller's logits stay as they were.
            tokens, g_processed = fn(g_logits / temp[:, None], g_params, g_u, keep)
            if g_processed is not None:
                for k, j in enumerate(group):
                    if want_processed[j]:
                        processed[j] = g_processed[k]
            if len(group) == len(idx):
                return tokens, processed
            picked[torch.tensor(group, device=device)] = tokens
        return picked, processed

    # ------------------------------------------------------------------- logprobs
    @staticmethod
    def _gather_logprobs(
        src: torch.Tensor,
        tokens: torch.Tensor,
        params: list[SamplingParams],
        want: list[bool],
        modes: list[Optional[str]],
    ) -> list[Optional[dict[int, float]]]:
        """Top-N (best first) plus the sampled token, for the rows that asked.

        ``src`` holds one row per asking row (in order): logits to report as
        they are (``*_logits`` modes) or to log-softmax (``*_logprobs``).
        """
        idx = [i for i, w in enumerate(want) if w]
        as_logprobs = torch.tensor([modes[i].endswith("logprobs") for i in idx], device=src.device)
        lp = torch.where(as_logprobs[:, None], torch.log_softmax(src, dim=-1), src)
        chosen = tokens.index_select(0, torch.tensor(idx, device=tokens.device)).to(src.device)
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


def prompt_logprobs_of(
    logits: torch.Tensor, next_ids: torch.Tensor, top_n: int
) -> list[dict[int, float]]:
    """For each row (a prompt position): log-softmax of the raw logits, as
    {token: logprob} with the top ``top_n`` (best first) plus the actual next
    prompt token ``next_ids[row]``."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, next_ids[:, None].to(lp.device))[:, 0].tolist()
    ids = next_ids.tolist()
    tops = lp.topk(min(top_n, lp.shape[1]), dim=-1) if top_n > 0 else None
    tv = tops.values.tolist() if tops is not None else None
    ti = tops.indices.tolist() if tops is not None else None
    out = []
    for r in range(lp.shape[0]):
        d: dict[int, float] = {}
        if ti is not None:
            for tid, v in zip(ti[r], tv[r]):
                d[int(tid)] = float(v)
        d.setdefault(int(ids[r]), float(chosen[r]))
        out.append(d)
    return out


# Top-k / top-p first look at this many best tokens (a partial sort), widening
# to a full sort only when some row's nucleus does not fit.
_PARTIAL_WIDTHS = (1024, 8192)


def _min_p_floor(best: torch.Tensor, params: list[SamplingParams]) -> Optional[torch.Tensor]:
    """Per-row logit floor for min-p: p_i < min_p * p_max <=> logit_i < best + log(min_p)."""
    if not any(p.min_p > 0.0 for p in params):
        return None
    m = torch.tensor([p.min_p for p in params], device=best.device, dtype=best.dtype)
    return best + torch.log(m)[:, None]  # log(0) = -inf: no floor


def _draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index of the first token whose cumulative probability exceeds u (per row).

    Zero-probability (-inf) tokens never qualify: their cumulative mass equals
    their predecessor's.
    """
    cdf = torch.softmax(logits, dim=-1).cumsum_(dim=-1)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, u[:, None] * total, right=True)[:, 0]
    # Should rounding put u * total at the very top, take the last token with mass.
    last = torch.searchsorted(cdf, total, right=False)[:, 0]
    return torch.minimum(picked, last)


def _apply_min_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask tokens below min_p x the best probability (the row's own softmax)."""
    floor = _min_p_floor(logits.max(dim=-1, keepdim=True).values, params)
    return logits if floor is None else logits.masked_fill(logits < floor, float("-inf"))


def _sample_full(
    logits: torch.Tensor, params: list[SamplingParams], u: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Temperature-scaled rows without top-k/top-p: min-p, then draw over the vocabulary."""
    logits = _apply_min_p(logits, params)
    return _draw(logits, u), (logits if keep else None)


def _sample_truncated(
    logits: torch.Tensor, params: list[SamplingParams], u: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Min-p, then top-k, then top-p, then draw, within each row's best tokens."""
    vocab = logits.shape[1]
    device = logits.device
    logits = _apply_min_p(logits, params)  # before top-k/top-p, as in vLLM V1
    ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)[:, None]
    max_k = max((p.top_k for p in params if 0 < p.top_k < vocab), default=0)
    nucleus_only = [p.top_p < 1.0 and not 0 < p.top_k < vocab for p in params]
    # Top-p needs each row's normaliser: over its k kept tokens, or the whole
    # row (both after min-p: masked tokens carry no mass).
    nucleus_t = torch.tensor(nucleus_only, device=device)
    row_lse = torch.logsumexp(logits, dim=-1, keepdim=True) if any(nucleus_only) else None
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], device=device)[:, None]

    widths = [w for w in _PARTIAL_WIDTHS if w > max_k and w < vocab] if any(nucleus_only) else []
    widths = ([max_k] if not any(nucleus_only) else widths) + [vocab]
    for width in widths:
        vals, order = logits.topk(width, dim=-1) if width < vocab else logits.sort(dim=-1, descending=True)
        pos = torch.arange(width, device=device)[None, :]
        vals = vals.masked_fill(pos >= ks, float("-inf"))  # exactly k kept, ties broken by rank
        if row_lse is not None or bool((top_p < 1.0).any()):
            norm = torch.logsumexp(vals, dim=-1, keepdim=True)
            if row_lse is not None:
                norm = torch.where(nucleus_t[:, None], row_lse, norm)
            probs = torch.exp(vals - norm)
            # Keep a token while the mass strictly before it is below top_p (the
            # best token always stays).
            vals = vals.masked_fill(probs.cumsum(dim=-1) - probs >= top_p, float("-inf"))
        # A nucleus (without top-k) that keeps all `width` tokens may go on past them.
        if width < vocab and bool((torch.isfinite(vals[:, -1]) & nucleus_t).any()):
            continue
        tokens = order.gather(1, _draw(vals, u)[:, None])[:, 0]
        processed = None
        if keep:  # back to vocabulary order; everything outside the kept width is -inf
            processed = torch.full_like(logits, float("-inf")).scatter_(1, order, vals)
        return tokens, processed
    raise AssertionError("unreachable: the full-vocabulary width always returns")


def _flat_ids(rows: list[tuple[int, list[int]]], vocab: int, device) -> torch.Tensor:
    """Flat indices row * vocab + id for every (row, ids) pair; ids past the
    logits' width (a tokenizer larger than the head) are dropped."""
    tensors = [(row, torch.as_tensor(ids, dtype=torch.long)) for row, ids in rows if ids]
    if not tensors:
        return torch.empty(0, dtype=torch.long, device=device)
    ids = torch.cat([t for _, t in tensors])
    flat = torch.cat([t + row * vocab for row, t in tensors])
    return flat[(ids >= 0) & (ids < vocab)].to(device)
