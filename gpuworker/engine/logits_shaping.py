"""Per-request changes to a step's logits before sampling: logit bias, min_tokens,
and the structured-output token mask.

Order (as vLLM's logits processors): bias, then min_tokens (EOS and stop token ids
banned until enough tokens are out), then the grammar mask last, so nothing can
bring back a token the grammar forbids. Logprobs are computed by the sampler from
the shaped logits: they report the distribution after the mask.

The grammar masks of a step are filled by llguidance outside the GIL on a helper
thread started *before* the forward pass (``begin``), so on a CPU with a spare core
the mask costs no step time; ``apply`` waits for it, then applies all masks of the
batch in one vectorised op (bitmask -> bool -> ``masked_fill_``).

Nothing here makes the host wait for a GPU: the banned ids of the step and the
grammar bitmask go to the device in one non-blocking copy (``host_upload``), and
nothing is read back.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import llguidance
import llguidance.numpy as llg_np
import numpy as np
import torch

from inferq.gpuworker.engine.host_upload import Upload

_NEG_INF = float("-inf")


class PendingMasks:
    """The bitmask of one step's constrained rows, being filled."""

    __slots__ = ("rows", "bitmask", "future")

    def __init__(self, rows: list[int], bitmask: np.ndarray, future: Optional[Future]):
        self.rows = rows  # indices into the step's sampling rows
        self.bitmask = bitmask
        self.future = future


class LogitsShaper:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._executor = None  # llguidance's own pool (fills several masks in parallel)
        self._thread = None  # one Python thread that drives it while the forward runs
        self._bitmask = llg_np.allocate_token_bitmask(1, vocab_size)

    def _pools(self):
        if self._thread is None:
            self._executor = llguidance.LLExecutor(num_threads=max(1, min(4, (os.cpu_count() or 2) - 1)))
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferq-mask")
        return self._executor, self._thread

    def begin(self, reqs: list, offsets: Optional[list[int]] = None) -> Optional[PendingMasks]:
        """Start filling the grammar masks of the constrained rows (None: no row has one).

        ``offsets`` (speculative decoding): per row, how many of its request's proposals
        precede it; a request's rows are consecutive, and the mask of its row j is the
        grammar's after the first j proposals (filled by llguidance without changing the
        matcher)."""
        rows = [i for i, r in enumerate(reqs) if r.matcher is not None]
        if not rows:
            return None
        words = self._bitmask.shape[1]
        if self._bitmask.shape[0] < len(rows):
            self._bitmask = llg_np.allocate_token_bitmask(max(len(rows), 2 * self._bitmask.shape[0]), self.vocab_size)
        bitmask = self._bitmask[: len(rows)]
        assert bitmask.shape[1] == words
        executor, thread = self._pools()
        if offsets is None:
            matchers = [(reqs[i].matcher, j) for j, i in enumerate(rows)]
            fut = thread.submit(llg_np.fill_next_token_bitmask_par, executor, matchers, bitmask)
        else:
            # llguidance refuses an empty draft: a constrained request without proposals
            # this step (none made, or all cut by its grammar) gets the plain fill.
            firsts = [(reqs[i], j) for j, i in enumerate(rows) if offsets[i] == 0]
            drafted = [(r.matcher, j, r.spec_token_ids) for r, j in firsts if r.spec_token_ids]
            plain = [(r.matcher, j) for r, j in firsts if not r.spec_token_ids]
            fut = thread.submit(_fill_speculative, executor, drafted, plain, bitmask)
        return PendingMasks(rows, bitmask, fut)

    def apply(self, logits: torch.Tensor, reqs: list, pending: Optional[PendingMasks]) -> None:
        """Shape ``logits`` ([rows, vocab], float, owned by the caller) in place."""
        vocab = logits.shape[1]
        up = Upload(logits.device)
        ban_rows, ban_ids = [], []  # (row, token) pairs banned until min_tokens are out
        for i, r in enumerate(reqs):
            p = r.params
            if p.logit_bias:
                ids, vals = _bias_tensors(r, logits.device)
                logits[i].index_add_(0, ids, vals)
            if p.min_tokens and len(r.output_token_ids) < p.min_tokens:
                banned = [t for t in sorted(set(r.eos_token_ids) | set(p.stop_token_ids)) if t < vocab]
                ban_rows += [i] * len(banned)
                ban_ids += banned
        rows_t, ids_t = (up.add(ban_rows, torch.int64), up.add(ban_ids, torch.int64)) if ban_ids else (None, None)
        words = None
        if pending is not None:
            pending.future.result()  # the helper thread has filled the bitmask
            _allow_reasoning_start(pending, reqs)
            if logits.device.type != "cpu":
                words = up.add(pending.bitmask, torch.int32)
        up.send()
        if ids_t is not None:
            logits[rows_t.t, ids_t.t] = _NEG_INF
        if pending is None:
            return
        device_words = None if words is None else words.t.view(pending.bitmask.shape)
        allowed = self._unpack(pending.bitmask, device_words, vocab)
        rows = pending.rows
        for j, i in enumerate(rows):
            if reqs[i].matcher.is_error():
                # Cannot happen with a valid mask; never sample from an all -inf row:
                # allow EOS only, so the request ends instead of drawing NaNs.
                allowed[j].zero_()
                allowed[j, next(iter(reqs[i].eos_token_ids), 0)] = True
        if len(rows) == logits.shape[0]:
            logits.masked_fill_(~allowed, _NEG_INF)
        else:
            for j, i in enumerate(rows):
                logits[i].masked_fill_(~allowed[j], _NEG_INF)

    @staticmethod
    def _unpack(bitmask: np.ndarray, device_words: Optional[torch.Tensor], width: int) -> torch.Tensor:
        """[rows, words] int32 bitmask (bit k of word w = token 32w+k) -> [rows, width] bool;
        ``device_words``: the bitmask already on the device (None: unpack on the host, CPU)."""
        out = unpack_on_host(bitmask) if device_words is None else unpack_on_device(device_words)
        if out.shape[1] < width:  # logits wider than the tokenizer's vocabulary: padding ids are never allowed
            out = torch.nn.functional.pad(out, (0, width - out.shape[1]), value=False)
        return out[:, :width]

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False)


def unpack_on_host(bitmask: np.ndarray) -> torch.Tensor:
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits).view(torch.bool)


def unpack_on_device(words: torch.Tensor) -> torch.Tensor:
    """The same on the GPU: 32 shifts of each word, no host round trip of the expanded mask."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> shifts) & 1).view(words.shape[0], -1).bool()


def _fill_speculative(executor, drafted: list, plain: list, bitmask: np.ndarray) -> None:
    if drafted:
        llg_np.fill_next_token_bitmask_par_with_draft_tokens(executor, drafted, bitmask)
    if plain:
        llg_np.fill_next_token_bitmask_par(executor, plain, bitmask)


def _allow_reasoning_start(pending: PendingMasks, reqs: list) -> None:
    """A reasoning model's first token may open its reasoning instead of starting
    the constrained answer (engine/grammar.py, ReasoningGate): that token's bit is set."""
    words = None
    for j, i in enumerate(pending.rows):
        gate = reqs[i].reasoning_gate
        if gate is not None and gate.start_token is not None:
            words = pending.bitmask.view(np.uint32) if words is None else words
            t = gate.start_token
            words[j, t >> 5] |= np.uint32(1 << (t & 31))


def _bias_tensors(req, device):
    """The request's logit bias as (ids, values) tensors, built once per request."""
    cached = req.bias_tensors
    if cached is None or cached[0].device != device:
        items = sorted(req.params.logit_bias.items())
        up = Upload(device)
        ids, vals = up.add([k for k, _ in items], torch.int64), up.add([v for _, v in items], torch.float32)
        up.send()
        cached = (ids.t, vals.t)
        req.bias_tensors = cached
    return cached
