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
from the global RNG.

Rows without top-k (plain temperature, min-p, top-p; the usual case) never
sort: ``_sample_nucleus`` draws from the min-p'd distribution and accepts the
token if it lies in the top-p nucleus, else redraws among the tokens ranked
before it (rejection with a pivot, as FlashInfer does; exact, see there). Rows
with top-k work on a partial sort of their k best tokens. Rows that report
processed logprobs keep the explicit-mask paths (a nucleus widens its partial
sort only when it does not fit). On CPU the fast path runs in chunks of rows in
reused scratch buffers; exponential-race (Gumbel) sampling was measured and not
taken: one exponential per logit costs ~20x the whole draw on CPU.

The all-greedy batch without penalties or logprobs is one argmax
(``greedy_argmax``), nothing else. Everything else builds its per-row parameter
tensors once per call.

Prompt logprobs (``prompt_logprobs_of``) are the log-softmax of the model's
logits at each prompt position, for the next prompt token: raw, as in vLLM.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from inferq.gpuworker.engine.penalty_tokens import PenaltyTokens
from inferq.schemas import SamplingParams

# Temperatures below this are treated as greedy (dividing by them overflows).
_GREEDY_EPS = 1e-5


@dataclass
class SamplingRow:
    """One row of logits that samples this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # generated so far (before this step)
    generator: Optional[torch.Generator] = None  # per-request, from params.seed; None = global RNG
    # The request's token history for penalties, kept across steps (None: built for this call).
    penalty_tokens: Optional[PenaltyTokens] = None


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
    if rows == 1:  # one row: the per-op overhead of the blocked form outweighs it
        return logits.max(dim=-1).indices
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
    # A row whose logits are shaped (bias, min_tokens, a grammar) needs them in full.
    return p.temperature < _GREEDY_EPS and p.logprobs is None and not p.uses_penalties and not p.shapes_logits


class Sampler:
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow], owned: bool = False) -> SamplerOutput:
        """``owned``: the caller hands ``logits`` over (it will not read them again),
        so penalties may work in place when no row reports raw logprobs; a copy of
        256 x 49,152 fp32 logits is a fresh 50 MB allocation, ~45 ms of page faults
        on a CPU."""
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
            raw_wanted = any(w and not p for w, p in zip(want_lp, want_processed))
            if owned and not raw_wanted and raw.is_contiguous():
                logits = raw  # nobody reads the unpenalised logits again
            else:
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

        Works on flat indices (row * vocab + token), so the cost follows the
        number of prompt/output tokens, not rows x vocab. Each row's token
        history comes from its ``PenaltyTokens`` (prompt ids already a device
        tensor; output ids a host array): one host->device copy of the output
        ids a step, and no data-dependent sizes (``unique``) that would make a
        GPU wait.
        """
        device = logits.device
        vocab = logits.shape[1]
        flat = logits.view(-1)
        ps = [rows[i].params for i in idx]
        hist = [rows[i].penalty_tokens or PenaltyTokens(rows[i].prompt_token_ids, vocab, device,
                                                        rows[i].params.repetition_penalty != 1.0) for i in idx]

        # Output ids of every penalised row, flattened on the host, then one copy.
        outs = [h.outputs(rows[i].output_token_ids) for h, i in zip(hist, idx)]
        out_ids = np.concatenate(outs) if outs else np.empty(0, dtype=np.int64)
        out_flat = np.repeat(np.asarray(idx, dtype=np.int64) * vocab, [len(o) for o in outs]) + out_ids
        out_flat = out_flat[(out_ids >= 0) & (out_ids < vocab)]
        out_flat = torch.from_numpy(out_flat).to(device, non_blocking=True)

        rep_pos = [j for j, p in enumerate(ps) if p.repetition_penalty != 1.0]
        if rep_pos:
            rep = torch.ones(logits.shape[0], device=device, dtype=logits.dtype)
            rep[torch.tensor([idx[j] for j in rep_pos], device=device)] = torch.tensor(
                [ps[j].repetition_penalty for j in rep_pos], device=device, dtype=logits.dtype
            )
            prompts = [hist[j].prompt for j in rep_pos]
            offsets = torch.tensor([idx[j] * vocab for j in rep_pos], device=device)
            lengths = torch.tensor([t.numel() for t in prompts], device=device)
            seen = torch.cat([torch.cat(prompts) + offsets.repeat_interleave(lengths), out_flat])
            # A token seen twice is written twice with the same value (both read
            # the unpenalised logit), so no unique() is needed; rows without a
            # repetition penalty divide by 1.
            r = rep[seen // vocab]
            vals = flat[seen]
            flat[seen] = torch.where(vals > 0, vals / r, vals * r)

        if out_flat.numel() and any(p.frequency_penalty or p.presence_penalty for p in ps):
            freq = torch.zeros(logits.shape[0], device=device, dtype=logits.dtype)
            pres = torch.zeros_like(freq)
            sel = torch.tensor(idx, device=device)
            freq[sel] = torch.tensor([p.frequency_penalty for p in ps], device=device, dtype=logits.dtype)
            pres[sel] = torch.tensor([p.presence_penalty for p in ps], device=device, dtype=logits.dtype)
            # Count each distinct (row, token) without unique(): sort, mark where a
            # new value starts, number the runs, and count per run.
            tok = out_flat.sort().values
            first = torch.ones_like(tok, dtype=torch.bool)
            first[1:] = tok[1:] != tok[:-1]
            run = first.cumsum(0) - 1
            count = torch.zeros(tok.numel(), device=device, dtype=logits.dtype).index_add_(
                0, run, torch.ones_like(tok, dtype=logits.dtype))[run]
            row = tok // vocab
            # Every copy of a token writes the same value: logit - (freq x count + presence).
            flat[tok] = flat[tok] - (freq[row] * count + pres[row])

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
        gens = [rows[i].generator for i in idx]

        # Inverse CDF needs one uniform per row. Seeded rows take theirs from
        # their own generator, so their draw does not depend on the batch.
        u = _uniforms(gens, device)

        # Rows without top-k that do not report processed logits (the usual case)
        # take the fast path: temperature, min-p and top-p by rejection, in row
        # chunks, never sorting. Rows with top-k sample among their k best tokens (a
        # partial sort); processed-logprob rows keep the explicit-mask paths.
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in ps]
        fast = [j for j in range(len(idx)) if ks[j] >= vocab and not want_processed[j]]
        fast_set = set(fast)
        truncated = [j for j, p in enumerate(ps) if j not in fast_set and (ks[j] < vocab or p.top_p < 1.0)]
        plain = [j for j in range(len(idx)) if j not in fast_set and ks[j] >= vocab and ps[j].top_p >= 1.0]
        picked = torch.empty(len(idx), dtype=torch.long, device=device)
        processed: Optional[list[Optional[torch.Tensor]]] = [None] * len(idx) if any(want_processed) else None
        if fast:
            g_u = u if len(fast) == len(idx) else u[torch.tensor(fast, device=device)]
            tokens = _sample_nucleus(logits, [idx[j] for j in fast], [ps[j] for j in fast],
                                     [gens[j] for j in fast], g_u)
            if len(fast) == len(idx):
                return tokens, processed
            picked[torch.tensor(fast, device=device)] = tokens
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


def _uniforms(gens: list[Optional[torch.Generator]], device) -> torch.Tensor:
    """One uniform in [0, 1) per row: seeded rows from their own generator, the
    others from one batched draw of the global RNG."""
    u = torch.rand(len(gens), device=device)
    for j, g in enumerate(gens):
        if g is not None:
            u[j] = torch.rand(1, generator=g, device=g.device).to(device)[0]
    return u


# The fast path works on this many rows at a time on CPU: a chunk's temporaries
# (rows x vocab floats) stay in cache and are reused by the allocator, where a
# batch-sized temporary (256 x 49,152 floats = 50 MB) is a fresh mmap with page
# faults on every step. On CUDA the whole group is one chunk.
_CHUNK_ROWS = 8
# Per-thread scratch for those chunks (three [chunk, vocab] float buffers), so a
# step allocates no large tensor at all.
_SCRATCH = threading.local()


def _scratch(vocab: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key = (vocab, str(device))
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None or bufs[0] != key:
        bufs = (key, tuple(torch.empty(_CHUNK_ROWS, vocab, device=device, dtype=torch.float32) for _ in range(3)))
        _SCRATCH.bufs = bufs
    return bufs[1]
# Rejection rounds before the rows still drawing fall back to the sorted path
# (each round at least halves the candidate mass on average; never hit in tests).
_MAX_ROUNDS = 12


# On CPU the inverse CDF sums blocks of this many weights first (vectorised), then
# scans only the block the uniform falls in: a full cumsum is a serial scan.
_DRAW_BLOCK = 512


def _draw_unnormalised(e: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse CDF over non-negative weights ``e`` in vocabulary order: per row, the
    first token whose cumulative weight exceeds u x total (zero-weight tokens
    never). Returns (tokens, totals).

    On CPU (large rows) the cumulative weights are block sums plus a scan inside
    the one block the target falls in; the same partition of [0, total) up to
    rounding, a quarter of the work of a full-row cumsum."""
    rows, vocab = e.shape
    bk = _DRAW_BLOCK
    if e.device.type != "cpu" or vocab < 4 * bk:
        cdf = e.cumsum(dim=-1)
        total = cdf[:, -1:].contiguous()
        picked = torch.searchsorted(cdf, u[:, None] * total, right=True)
        last = torch.searchsorted(cdf, total, right=False)
        return torch.minimum(picked, last)[:, 0], total[:, 0]
    nb = vocab // bk
    sums = e[:, : nb * bk].view(rows, nb, bk).sum(dim=-1)
    if nb * bk < vocab:
        sums = torch.cat([sums, e[:, nb * bk :].sum(dim=-1, keepdim=True)], dim=1)
    bcdf = sums.cumsum(dim=-1)
    total = bcdf[:, -1:].contiguous()
    target = u[:, None] * total
    block = torch.minimum(torch.searchsorted(bcdf, target, right=True),
                          torch.searchsorted(bcdf, total, right=False))  # a block with weight
    before = torch.where(block > 0, bcdf.gather(1, (block - 1).clamp_(min=0)), torch.zeros_like(target))
    start = block * bk
    cols = start + torch.arange(bk, device=e.device)[None, :]
    inside = e.gather(1, cols.clamp(max=vocab - 1)) * (cols < vocab)  # the short last block: zero past the end
    icdf = inside.cumsum(dim=-1)
    j = torch.minimum(torch.searchsorted(icdf, (target - before).contiguous(), right=True),
                      torch.searchsorted(icdf, icdf[:, -1:].contiguous(), right=False))
    return (start + j)[:, 0], total[:, 0]


def _surely_in_nucleus(
    e: torch.Tensor, tok: torch.Tensor, limit: torch.Tensor, scratch: Optional[tuple[torch.Tensor, torch.Tensor]] = None
) -> torch.Tensor:
    """Per row: True where the mass ranked before ``tok`` is certainly below
    ``limit`` (False may still be inside: the exact test decides those).

    Vectorised float passes only (comparisons into bool tensors are several times
    slower on CPU): with d = e - e_tok, sum(relu(d)) = S_gt - e_tok n_gt, and
    sum(sign(d)), sum(|sign(d)|) give the counts above, below and equal. The mass
    before ``tok`` is at most S_gt + e_tok (n_eq - 1) (ties ranked by id); the
    margin keeps rounding of these sums from deciding a borderline row."""
    et = e.gather(1, tok[:, None])
    if scratch is None:
        d = e - et
        sg = torch.sign(d)
    else:
        d = torch.sub(e, et, out=scratch[0][: e.shape[0]])
        sg = torch.sign(d, out=scratch[1][: e.shape[0]])
    diff = sg.sum(dim=-1)  # n_gt - n_lt
    n_ne = sg.abs_().sum(dim=-1)  # n_gt + n_lt
    relu = d.clamp_min_(0.0).sum(dim=-1)
    n_gt = (n_ne + diff) * 0.5
    n_eq = e.shape[1] - n_ne
    bound = relu + et[:, 0] * (n_gt + n_eq - 1.0)
    return bound < limit * (1.0 - 1e-4)


def _mass_before(e: torch.Tensor, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the weight of the tokens ranked before ``tok`` (larger weight, or
    equal weight and a lower id) and a bool mask of those tokens."""
    et = e.gather(1, tok[:, None])
    ids = torch.arange(e.shape[1], device=e.device)[None, :]
    before = (e > et) | ((e == et) & (ids < tok[:, None]))
    return (e * before).sum(dim=-1), before


def _sample_nucleus(
    logits: torch.Tensor,
    row_ids: list[int],
    params: list[SamplingParams],
    gens: list[Optional[torch.Generator]],
    u: torch.Tensor,
) -> torch.Tensor:
    """Temperature, min-p and top-p for rows without top-k, without sorting.

    Per row: e = exp(x - max) with x = logits / T (the unnormalised softmax);
    min-p zeroes e < min_p (p < min_p x p_max). The top-p nucleus S is the
    shortest run of tokens, in order of decreasing probability (equal ones by
    token id), whose mass reaches top_p: a token is in S iff the mass ranked
    before it is below top_p x total. Sampling from S by rejection: draw t from
    the whole (min-p'd) distribution by inverse CDF with the row's uniform; keep
    it if it is in S. Otherwise every token ranked at or after t is outside S, so
    the next draw is from the tokens ranked before t only (FlashInfer's pivot);
    since S lies inside that set, the accepted token is distributed exactly as
    the min-p'd distribution restricted to S, renormalised. For top_p = 0.95 a
    first draw is accepted with probability >= 0.95.

    Cost: about six passes over each row (divide, max, exp, cumsum, the
    membership test) instead of a sort of the vocabulary; seeded rows take every
    uniform from their own generator, so their tokens still depend only on
    their logits and seed.
    """
    device = logits.device
    n, vocab = len(row_ids), logits.shape[1]
    out = torch.empty(n, dtype=torch.long, device=device)
    temp_all = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
    top_p_all = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
    min_p_all = torch.tensor([p.min_p for p in params], device=device, dtype=torch.float32)
    any_min_p = any(p.min_p > 0.0 for p in params)
    cpu = device.type == "cpu"
    chunk = _CHUNK_ROWS if cpu else max(1, n)
    scratch = _scratch(vocab, device) if cpu else None
    contiguous = row_ids == list(range(row_ids[0], row_ids[0] + n))
    retry: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (chunk start, rows, e, tokens)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        if contiguous:
            x = logits[row_ids[c0] : row_ids[c0] + (c1 - c0)]
        else:
            x = logits.index_select(0, torch.tensor(row_ids[c0:c1], device=device))
        # Into scratch (or a new tensor): the caller's logits are never modified.
        t = temp_all[c0:c1, None]
        if scratch is not None:
            e = torch.div(x, t, out=scratch[0][: c1 - c0])
        else:
            e = x.float().div_(t) if x.dtype != torch.float32 else x / t
        e.sub_(e.amax(dim=-1, keepdim=True)).exp_()
        if any_min_p:
            e.mul_(e >= min_p_all[c0:c1, None])  # the max is 1: drop p < min_p x p_max
        cdf_tokens, total = _draw_unnormalised(e, u[c0:c1])
        out[c0:c1] = cdf_tokens
        top_p = top_p_all[c0:c1]
        if not bool((top_p < 1.0).any()):
            continue
        # A cheap bound first; rows it cannot clear get the exact test below.
        unsure = ~_surely_in_nucleus(e, cdf_tokens, top_p * total, scratch[1:] if scratch else None) & (top_p < 1.0)
        if bool(unsure.any()):
            rows = unsure.nonzero()[:, 0]
            retry.append((c0, rows, e.index_select(0, rows), cdf_tokens.index_select(0, rows)))
    if not retry:
        return out
    # Rows whose first draw may lie outside the nucleus: exact test, then pivoted redraws.
    pos = torch.cat([c0 + rows for c0, rows, _, _ in retry])
    e = torch.cat([er for _, _, er, _ in retry])
    tok = torch.cat([t for _, _, _, t in retry])
    limit = top_p_all.index_select(0, pos) * e.sum(dim=-1)
    for _ in range(_MAX_ROUNDS):
        before_mass, before = _mass_before(e, tok)
        ok = before_mass < limit
        out[pos] = tok  # rejected ones are overwritten below
        if bool(ok.all()):
            return out
        keep = (~ok).nonzero()[:, 0]
        pos, e, limit, before = pos[keep], e.index_select(0, keep), limit[keep], before.index_select(0, keep)
        e.mul_(before)  # only tokens ranked before the rejected one remain candidates
        pos_list = pos.tolist()
        tok, _ = _draw_unnormalised(e, _uniforms([gens[j] for j in pos_list], device))
    # Still drawing after _MAX_ROUNDS (a tiny top_p over a flat row): exact sorted path.
    pos_list = pos.tolist()
    sub = logits.index_select(0, torch.tensor([row_ids[j] for j in pos_list], device=device)).float()
    sub = sub / temp_all.index_select(0, pos)[:, None]
    tokens, _ = _sample_truncated(sub, [params[j] for j in pos_list], _uniforms([gens[j] for j in pos_list], device), False)
    out[pos] = tokens
    return out
