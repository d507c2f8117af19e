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
sort on CPU: ``_sample_nucleus`` draws from the min-p'd distribution and accepts the
token if it lies in the top-p nucleus, else redraws among the tokens ranked
before it (rejection with a pivot, as FlashInfer does; exact, see there). Rows
with top-k work on a partial sort of their k best tokens. Rows that report
processed logprobs keep the explicit-mask paths (a nucleus widens its partial
sort only when it does not fit). On CPU the fast path runs in chunks of rows in
reused scratch buffers; exponential-race (Gumbel) sampling was measured and not
taken: one exponential per logit costs ~20x the whole draw on CPU.

The all-greedy batch without penalties or logprobs is one argmax
(``greedy_argmax``), nothing else. Everything else is planned on the host from
the rows' parameters first (``_StepPlan``: which rows take which path, the
penalty indices, the per-row parameters), and the index and parameter tensors
reach the device in ONE non-blocking copy from pinned memory (``host_upload.Upload``).

On a GPU the host waits for the device only once a step: the read of the
sampled tokens, with the logprobs packed into the same tensor. Nothing is
decided by reading the device (no ``bool(t.any())``, ``nonzero``, ``.tolist()``
of intermediate results, nor ``torch.tensor(list, device=cuda)``, a blocking
copy). The CPU keeps the paths that branch on values (blocked argmax, chunked
rejection for top-p), where a read costs nothing (``_reads_are_free``); on a
device, top-p rows sort instead (as vLLM's PyTorch sampler does), since
rejection needs every round's acceptance on the host.

Prompt logprobs (``prompt_logprobs_of``) are the log-softmax of the model's
logits at each prompt position, for the next prompt token: raw, as in vLLM.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from inferq.gpuworker.engine import cpu_argmax
from inferq.gpuworker.engine.host_upload import Upload
from inferq.gpuworker.engine.keyed_draws import KeyedDraws
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
    generator: Optional[KeyedDraws] = None  # a seeded row's draws for this token; None = global RNG
    # The request's token history for penalties, kept across steps (None: built for this call).
    penalty_tokens: Optional[PenaltyTokens] = None


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row: top-N {token_id: logprob} (best first) plus the sampled id,
    # when that row asked for logprobs; else None.
    logprobs: list[Optional[dict[int, float]]]


def _reads_are_free(device: torch.device) -> bool:
    """On the CPU a tensor's values are host memory: its paths may branch on them
    (blocked argmax, rejection rounds). On a GPU every read, ``bool()`` or
    ``nonzero()`` waits until all queued kernels have run, so the device paths
    decide from the request parameters (known on the host) and read only the
    sampled tokens."""
    return device.type == "cpu"


# CPU argmax works on blocks of this many logits (see greedy_argmax).
_ARGMAX_BLOCK = 512


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of each row's largest logit, the first one among equal maxima, in the
    logits' own dtype (no cast, no copy of the rows).

    On CUDA this is ``argmax`` (one kernel). On CPU, ``max(dim=-1).indices`` and
    ``argmax`` reduce element by element (~1.7 / 2.7 ns per logit on one core): float32
    and bfloat16 rows go to a C kernel (cpu_argmax.py, two vectorised passes). Where it
    does not build (or for float16), ``amax`` is vectorised and bound by memory bandwidth.
    So: the max of each block of ``_ARGMAX_BLOCK`` logits (one vectorised pass over the rows), the first
    block holding the row's max, and ``max().indices`` inside that block only.
    Same result as ``argmax``, ties included (first block, then first index in it).
    NaN rows fall back to ``argmax`` (NaN counts as the maximum there).
    """
    if not _reads_are_free(logits.device):
        return logits.argmax(dim=-1)
    got = cpu_argmax.argmax_rows(logits)  # the C kernel, where it builds and takes the dtype
    if got is not None:
        return got
    if logits.shape[-1] <= 2 * _ARGMAX_BLOCK:
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


class _RowParams:
    """Sampling parameters of a set of rows: host arrays, for the decisions the device
    paths must make without reading the device, and the same as device tensors."""

    def __init__(self, params: list[SamplingParams], vocab: int, up: Upload):
        self.params = params
        self.temperature = up.add([p.temperature for p in params], torch.float32)
        self.top_p = up.add([p.top_p for p in params], torch.float32)
        self.top_p_cut = up.add([p.top_p if p.top_p < 1.0 else 2.0 for p in params], torch.float32)  # 2: keep all
        self.min_p = up.add([p.min_p for p in params], torch.float32)
        self.top_k = up.add([p.top_k if 0 < p.top_k < vocab else vocab for p in params], torch.int64)
        # Top-p without top-k: normalised over the whole (min-p'd) row.
        self.nucleus_only = up.add([p.top_p < 1.0 and not 0 < p.top_k < vocab for p in params], torch.bool)
        self.max_k = max((p.top_k for p in params if 0 < p.top_k < vocab), default=0)
        self.any_min_p = any(p.min_p > 0.0 for p in params)

    @classmethod
    def on(cls, params: list[SamplingParams], vocab: int, device: torch.device) -> "_RowParams":
        up = Upload(device)
        cols = cls(params, vocab, up)
        up.send()
        return cols


class _Group:
    """Sampling rows that take one path (``kind``): their positions among the step's
    sampling rows, their logits rows, and their parameters."""

    def __init__(self, kind: str, pos: list[int], rows: list[int], params: list[SamplingParams], vocab: int,
                 up: Upload):
        self.kind, self.pos, self.rows = kind, pos, rows
        self.pos_t = up.add(pos, torch.int64)
        self.rows_t = up.add(rows, torch.int64)
        self.cols = _RowParams(params, vocab, up)


def _sampling_groups(idx: list[int], params: list[SamplingParams], want_processed: list[bool], vocab: int,
                     device: torch.device, up: Upload) -> list[_Group]:
    """Rows without top-k that do not report processed logits take the fast path
    (temperature, min-p and top-p by rejection, in row chunks, never sorting); rows
    with top-k sample among their k best tokens (a partial sort); processed-logprob
    rows keep the explicit-mask paths. On a device, rejection would read every
    round's acceptance on the host, so top-p rows take the sorted path there."""
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    rejection_ok = _reads_are_free(device)
    fast = [j for j, p in enumerate(params)
            if ks[j] >= vocab and not want_processed[j] and (rejection_ok or p.top_p >= 1.0)]
    fast_set = set(fast)
    truncated = [j for j, p in enumerate(params) if j not in fast_set and (ks[j] < vocab or p.top_p < 1.0)]
    plain = [j for j, p in enumerate(params) if j not in fast_set and ks[j] >= vocab and p.top_p >= 1.0]
    return [_Group(kind, group, [idx[j] for j in group], [params[j] for j in group], vocab, up)
            for kind, group in (("nucleus", fast), ("full", plain), ("truncated", truncated)) if group]


class _Penalties:
    """One step's penalty inputs, built on the host: flat ids (row * vocab + token) of
    every penalised row's output tokens, and of its prompt where a repetition penalty
    applies, with per-row factors (1 / 0 for rows without that penalty).

    Each row's token history comes from its ``PenaltyTokens`` (prompt ids already a
    device tensor; output ids a host array); no data-dependent sizes (``unique``,
    ``repeat_interleave`` over a device tensor) that would make a GPU wait."""

    def __init__(self, rows: list[SamplingRow], idx: list[int], vocab: int, device: torch.device, up: Upload):
        n = len(rows)
        ps = [rows[i].params for i in idx]
        hist = [rows[i].penalty_tokens or PenaltyTokens(rows[i].prompt_token_ids, vocab, device,
                                                        rows[i].params.repetition_penalty != 1.0) for i in idx]
        outs = [h.outputs(rows[i].output_token_ids) for h, i in zip(hist, idx)]
        out_ids = np.concatenate(outs) if outs else np.empty(0, dtype=np.int64)
        out_flat = np.repeat(np.asarray(idx, dtype=np.int64) * vocab, [len(o) for o in outs]) + out_ids
        out_flat = out_flat[(out_ids >= 0) & (out_ids < vocab)]
        self.out_flat = up.add(out_flat, torch.int64)

        rep_pos = [j for j, p in enumerate(ps) if p.repetition_penalty != 1.0]
        self.prompts = [hist[j].prompt for j in rep_pos]
        self.repetition = self.prompt_offsets = None
        if rep_pos:
            rep = np.ones(n, dtype=np.float32)
            rep[[idx[j] for j in rep_pos]] = [ps[j].repetition_penalty for j in rep_pos]
            self.repetition = up.add(rep, torch.float32)
            row_starts = np.asarray([idx[j] * vocab for j in rep_pos], dtype=np.int64)
            self.prompt_offsets = up.add(np.repeat(row_starts, [t.numel() for t in self.prompts]), torch.int64)

        self.frequency = self.presence = None
        if out_flat.size and any(p.frequency_penalty or p.presence_penalty for p in ps):
            freq, pres = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
            freq[idx] = [p.frequency_penalty for p in ps]
            pres[idx] = [p.presence_penalty for p in ps]
            self.frequency, self.presence = up.add(freq, torch.float32), up.add(pres, torch.float32)


class _StepPlan:
    """What a step decides from its rows' parameters, all on the host before any kernel
    runs; the index and parameter tensors it needs reach the device in one upload."""

    def __init__(self, rows: list[SamplingRow], vocab: int, device: torch.device):
        n = len(rows)
        params = self.params = [r.params for r in rows]
        greedy = [_is_greedy(p) for p in params]
        self.want_lp = [p.logprobs is not None for p in params]
        self.modes = [p.logprobs_mode if w else None for p, w in zip(params, self.want_lp)]
        self.want_processed = [m is not None and m.startswith("processed") for m in self.modes]
        up = Upload(device)

        penalised = [i for i in range(n) if params[i].uses_penalties]
        self.penalties = _Penalties(rows, penalised, vocab, device, up) if penalised else None
        self.raw_wanted = any(w and not p for w, p in zip(self.want_lp, self.want_processed))

        self.sample_idx = [i for i in range(n) if not greedy[i]]
        self.sample_idx_t = up.add(self.sample_idx, torch.int64)
        self.greedy = greedy
        self.gens = [rows[i].generator for i in self.sample_idx]
        need_processed = [self.want_processed[i] for i in self.sample_idx]
        self.need_processed = need_processed
        self.groups = _sampling_groups(self.sample_idx, [params[i] for i in self.sample_idx], need_processed,
                                       vocab, device, up)

        self.lp_rows = [i for i in range(n) if self.want_lp[i]]
        self.lp_rows_t = up.add(self.lp_rows, torch.int64)
        as_logprobs = [self.modes[i].endswith("logprobs") for i in self.lp_rows]
        self.all_as_logprobs, self.none_as_logprobs = all(as_logprobs), not any(as_logprobs)
        self.as_logprobs_t = up.add(as_logprobs, torch.bool)
        self.top_n = max((params[i].logprobs for i in self.lp_rows), default=0)
        up.send()


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

        plan = _StepPlan(rows, logits.shape[1], logits.device)
        raw = logits.float()
        logits = raw
        if plan.penalties is not None:
            if owned and not plan.raw_wanted and raw.is_contiguous():
                logits = raw  # nobody reads the unpenalised logits again
            else:
                logits = raw.clone(memory_format=torch.contiguous_format)  # never modify the caller's tensor
            self._apply_penalties(logits, plan.penalties)

        processed = None  # full-vocabulary step-3 logits of the sampling rows that report them
        if len(plan.sample_idx) == n:
            tokens, processed = self._sample(logits, plan)
        else:
            tokens = greedy_argmax(logits)
            if plan.sample_idx:
                sampled, processed = self._sample(logits, plan)
                tokens[plan.sample_idx_t.t] = sampled

        if not plan.lp_rows:
            return SamplerOutput(tokens.tolist(), [None] * n)
        # One source row per asking row: raw logits, penalised (greedy), or step-3 (sampling).
        pos_in_sample = {i: j for j, i in enumerate(plan.sample_idx)}
        src_rows = []
        for i in plan.lp_rows:
            if not plan.want_processed[i]:
                src_rows.append(raw[i])
            elif plan.greedy[i]:
                src_rows.append(logits[i])
            else:
                src_rows.append(processed[pos_in_sample[i]])
        return self._read_with_logprobs(torch.stack(src_rows), tokens, plan)

    # ------------------------------------------------------------------ penalties
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, pen: _Penalties) -> None:
        """In place on the contiguous ``logits``, touching only the tokens seen.

        Works on flat indices (row * vocab + token), so the cost follows the
        number of prompt/output tokens, not rows x vocab.
        """
        device = logits.device
        vocab = logits.shape[1]
        flat = logits.view(-1)
        out_flat = pen.out_flat.t
        if pen.repetition is not None:
            seen = torch.cat([torch.cat(pen.prompts) + pen.prompt_offsets.t, out_flat])
            # A token seen twice is written twice with the same value (both read
            # the unpenalised logit), so no unique() is needed; rows without a
            # repetition penalty divide by 1.
            r = pen.repetition.t[seen // vocab]
            vals = flat[seen]
            flat[seen] = torch.where(vals > 0, vals / r, vals * r)

        if pen.frequency is not None:
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
            flat[tok] = flat[tok] - (pen.frequency.t[row] * count + pen.presence.t[row])

    # ------------------------------------------------------------------- sampling
    @staticmethod
    def _sample(logits: torch.Tensor, plan: _StepPlan) -> tuple[torch.Tensor, Optional[list[Optional[torch.Tensor]]]]:
        """Draw one token for each sampling row (temperature > 0).

        Also returns, per sampling row that wants processed logprobs, its step-3
        logits over the whole vocabulary (None for the others; None overall
        when no row wants them).
        """
        device = logits.device
        num = len(plan.sample_idx)
        # Inverse CDF needs one uniform per row. Seeded rows take theirs from
        # their own generator, so their draw does not depend on the batch.
        u = _uniforms(plan.gens, device)
        processed: Optional[list[Optional[torch.Tensor]]] = [None] * num if any(plan.need_processed) else None
        picked = None
        for g in plan.groups:
            whole = len(g.pos) == num
            g_u = u if whole else u[g.pos_t.t]
            if g.kind == "nucleus":
                tokens = _sample_nucleus(logits, g.rows, g.rows_t.t, g.cols, [plan.gens[j] for j in g.pos], g_u)
            else:
                g_logits = logits if len(g.rows) == logits.shape[0] else logits.index_select(0, g.rows_t.t)
                keep = processed is not None and any(plan.need_processed[j] for j in g.pos)
                fn = _sample_full if g.kind == "full" else _sample_truncated
                # Division makes a new tensor: the caller's logits stay as they were.
                tokens, g_processed = fn(g_logits / g.cols.temperature.t[:, None], g.cols, g_u, keep)
                if g_processed is not None:
                    for k, j in enumerate(g.pos):
                        if plan.need_processed[j]:
                            processed[j] = g_processed[k]
            if whole:
                return tokens, processed
            if picked is None:
                picked = torch.empty(num, dtype=torch.long, device=device)
            picked[g.pos_t.t] = tokens
        return picked, processed

    # ------------------------------------------------------------------- logprobs
    @staticmethod
    def _read_with_logprobs(src: torch.Tensor, tokens: torch.Tensor, plan: _StepPlan) -> SamplerOutput:
        """The tokens, and top-N (best first) plus the sampled token for the rows that
        asked, in ONE device->host read.

        ``src`` holds one row per asking row (in order): logits to report as they
        are (``*_logits`` modes) or to log-softmax (``*_logprobs``).
        """
        if plan.all_as_logprobs:
            lp = torch.log_softmax(src, dim=-1)
        elif plan.none_as_logprobs:
            lp = src
        else:
            lp = torch.where(plan.as_logprobs_t.t[:, None], torch.log_softmax(src, dim=-1), src)
        chosen = tokens.index_select(0, plan.lp_rows_t.t)
        parts = [tokens.double(), lp.gather(1, chosen[:, None])[:, 0].double()]
        width = min(plan.top_n, lp.shape[1])
        if width > 0:
            tv, ti = lp.topk(width, dim=-1)  # sorted, best first
            parts += [tv.double().reshape(-1), ti.double().reshape(-1)]
        # Token ids and fp32 values are exact in float64: one tensor, one read.
        values = torch.cat(parts).tolist()
        n, m = tokens.shape[0], len(plan.lp_rows)
        token_ids = [int(t) for t in values[:n]]
        chosen_lp = values[n : n + m]
        tops = values[n + m :]
        out: list[Optional[dict[int, float]]] = [None] * n
        for j, i in enumerate(plan.lp_rows):
            want_n = plan.params[i].logprobs
            d: dict[int, float] = {}
            if want_n and width > 0:
                at = j * width
                for v, tid in zip(tops[at : at + want_n], tops[m * width + at : m * width + at + want_n]):
                    d[int(tid)] = v
            d.setdefault(token_ids[i], chosen_lp[j])
            out[i] = d
        return SamplerOutput(token_ids, out)


def prompt_logprobs_of(logits: torch.Tensor, next_ids: list[int], top_n: int) -> list[dict[int, float]]:
    """For each row (a prompt position): log-softmax of the raw logits, as
    {token: logprob} with the top ``top_n`` (best first) plus the actual next
    prompt token ``next_ids[row]``; one device->host read."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    up = Upload(lp.device)
    nxt = up.add(next_ids, torch.int64)
    up.send()
    parts = [lp.gather(1, nxt.t[:, None])[:, 0].double()]
    width = min(top_n, lp.shape[1]) if top_n > 0 else 0
    if width:
        tops = lp.topk(width, dim=-1)
        parts += [tops.values.double().reshape(-1), tops.indices.double().reshape(-1)]
    values = torch.cat(parts).tolist()
    rows = lp.shape[0]
    out = []
    for r in range(rows):
        d: dict[int, float] = {}
        at = rows + r * width
        for v, tid in zip(values[at : at + width], values[at + rows * width : at + rows * width + width]):
            d[int(tid)] = v
        d.setdefault(int(next_ids[r]), values[r])
        out.append(d)
    return out


# Top-k / top-p first look at this many best tokens (a partial sort), widening
# to a full sort only when some row's nucleus does not fit.
_PARTIAL_WIDTHS = (1024, 8192)


def _min_p_floor(best: torch.Tensor, cols: _RowParams) -> Optional[torch.Tensor]:
    """Per-row logit floor for min-p: p_i < min_p * p_max <=> logit_i < best + log(min_p)."""
    if not cols.any_min_p:
        return None
    return best + torch.log(cols.min_p.t.to(best.dtype))[:, None]  # log(0) = -inf: no floor


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


def _apply_min_p(logits: torch.Tensor, cols: _RowParams) -> torch.Tensor:
    """Mask tokens below min_p x the best probability (the row's own softmax)."""
    floor = _min_p_floor(logits.max(dim=-1, keepdim=True).values, cols)
    return logits if floor is None else logits.masked_fill(logits < floor, float("-inf"))


def _sample_full(
    logits: torch.Tensor, cols: _RowParams, u: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Temperature-scaled rows without top-k/top-p: min-p, then draw over the vocabulary."""
    logits = _apply_min_p(logits, cols)
    return _draw(logits, u), (logits if keep else None)


def _sample_truncated(
    logits: torch.Tensor, cols: _RowParams, u: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Min-p, then top-k, then top-p, then draw, within each row's best tokens.

    Where reads are free, a nucleus (top-p without top-k) first tries partial sorts
    and widens when it does not fit; on a device, whether it fits is known only on
    the device, so such rows sort their whole row at once."""
    vocab = logits.shape[1]
    device = logits.device
    logits = _apply_min_p(logits, cols)  # before top-k/top-p, as in vLLM V1
    ks = cols.top_k.t[:, None]
    any_nucleus = bool(cols.nucleus_only.host.any())
    # Top-p needs each row's normaliser: over its k kept tokens, or the whole
    # row (both after min-p: masked tokens carry no mass).
    nucleus_t = cols.nucleus_only.t
    row_lse = torch.logsumexp(logits, dim=-1, keepdim=True) if any_nucleus else None
    top_p = cols.top_p_cut.t[:, None]
    any_top_p = bool((cols.top_p_cut.host < 1.0).any())

    widths = [w for w in _PARTIAL_WIDTHS if cols.max_k < w < vocab] if any_nucleus and _reads_are_free(device) else []
    widths = ([cols.max_k] if not any_nucleus else widths) + [vocab]
    for width in widths:
        vals, order = logits.topk(width, dim=-1) if width < vocab else logits.sort(dim=-1, descending=True)
        pos = torch.arange(width, device=device)[None, :]
        vals = vals.masked_fill(pos >= ks, float("-inf"))  # exactly k kept, ties broken by rank
        if row_lse is not None or any_top_p:
            norm = torch.logsumexp(vals, dim=-1, keepdim=True)
            if row_lse is not None:
                norm = torch.where(nucleus_t[:, None], row_lse, norm)
            probs = torch.exp(vals - norm)
            # Keep a token while the mass strictly before it is below top_p (the
            # best token always stays).
            vals = vals.masked_fill(probs.cumsum(dim=-1) - probs >= top_p, float("-inf"))
        # A nucleus (without top-k) that keeps all `width` tokens may go on past them.
        if width < vocab and any_nucleus and bool((torch.isfinite(vals[:, -1]) & nucleus_t).any()):
            continue
        tokens = order.gather(1, _draw(vals, u)[:, None])[:, 0]
        processed = None
        if keep:  # back to vocabulary order; everything outside the kept width is -inf
            processed = torch.full_like(logits, float("-inf")).scatter_(1, order, vals)
        return tokens, processed
    raise AssertionError("unreachable: the full-vocabulary width always returns")


def _uniforms(gens: list[Optional[KeyedDraws]], device) -> torch.Tensor:
    """One uniform in [0, 1) per row: seeded rows from their keyed draws (made on the
    host, uploaded in one copy), the others from one batched draw of the global RNG."""
    seeded = [g is not None for g in gens]
    if not any(seeded):
        return torch.rand(len(gens), device=device)
    up = Upload(device)
    keyed = up.add([g.next_uniform() if g is not None else 0.0 for g in gens], torch.float32)
    mask = None if all(seeded) else up.add(seeded, torch.bool)
    up.send()
    if mask is None:
        return keyed.t
    return torch.where(mask.t, keyed.t, torch.rand(len(gens), device=device))


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
    if not _reads_are_free(e.device) or vocab < 4 * bk:
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
    rows_t: torch.Tensor,
    cols: _RowParams,
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

    Rejection decides on the host whether to redraw, so it runs only where reads are
    free; on a device this path gets rows without top-p (one draw, always accepted).
    """
    device = logits.device
    n, vocab = len(row_ids), logits.shape[1]
    out = torch.empty(n, dtype=torch.long, device=device)
    params = cols.params
    temp_all, top_p_all, min_p_all = cols.temperature.t, cols.top_p.t, cols.min_p.t
    on_host = _reads_are_free(device)
    chunk = _CHUNK_ROWS if on_host else max(1, n)
    scratch = _scratch(vocab, device) if on_host else None
    contiguous = row_ids == list(range(row_ids[0], row_ids[0] + n))
    retry: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (chunk start, rows, e, tokens)
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        if contiguous:
            x = logits[row_ids[c0] : row_ids[c0] + (c1 - c0)]
        else:
            x = logits.index_select(0, rows_t[c0:c1])
        # Into scratch (or a new tensor): the caller's logits are never modified.
        t = temp_all[c0:c1, None]
        if scratch is not None:
            e = torch.div(x, t, out=scratch[0][: c1 - c0])
        else:
            e = x.float().div_(t) if x.dtype != torch.float32 else x / t
        e.sub_(e.amax(dim=-1, keepdim=True)).exp_()
        if cols.any_min_p:
            e.mul_(e >= min_p_all[c0:c1, None])  # the max is 1: drop p < min_p x p_max
        cdf_tokens, total = _draw_unnormalised(e, u[c0:c1])
        out[c0:c1] = cdf_tokens
        top_p = top_p_all[c0:c1]
        if not (cols.top_p.host[c0:c1] < 1.0).any():  # the same fp32 test, on the host copy
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
    sub_cols = _RowParams.on([params[j] for j in pos_list], vocab, device)
    tokens, _ = _sample_truncated(sub, sub_cols, _uniforms([gens[j] for j in pos_list], device), False)
    out[pos] = tokens
    return out
