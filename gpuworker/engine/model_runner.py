"""Runs one scheduled step through the model: flatten, forward, sample.

Host work per step is kept small and off the device's critical path, in the
manner of vLLM V1's persistent batch and nano-vllm's pinned buffers:

* every request owns a row of a persistent block table (host array); each step
  copies in only the block ids allocated since the last step, instead of
  rebuilding every table from Python lists;
* positions, slot mapping, query start offsets, sequence lengths and the rows
  that sample are computed with vectorised numpy over per-request scalars;
* all integer inputs of the step (token ids, positions, slots, offsets, lengths,
  block tables, sampled rows) are packed into ONE staging buffer (pinned on
  CUDA; the int32 ones two to a word) and moved with ONE non-blocking
  host->device copy; the device tensors are views of that copy, so a step
  launches no kernel to unpack them. Two such buffers take turns (``StepStaging``):
  the copy runs whenever the GPU gets to it, and a step without sampling never
  waits for the GPU, so the next step must not rewrite the buffer that copy reads;
* the only device->host transfer of a step is the sampled token ids (plus
  logprobs when a request asks for them), done by the sampler;
* on the CPU, a decode-only step of a row count the decode replay has checked
  skips all of the above: its inputs go as Python ints straight into the replay's
  buffers (``_direct_inputs``), with no numpy or torch call, which costs ~10-25 us
  each on a core whose caches the weights have just streamed through.

``num_device_syncs`` counts the blocking device->host transfers the runner and
sampler make (the sampler's ``.tolist()``), for ``inferq bench step``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from inferq.gpuworker.attention.base import AttentionMetadata
from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.logits_shaping import LogitsShaper
from inferq.gpuworker.engine.pooling import accumulate, pooling_rows
from inferq.gpuworker.engine.prompt_logprobs import collect_prompt_logprobs
from inferq.gpuworker.engine.sampler import Sampler, SamplingRow, greedy_argmax
from inferq.gpuworker.engine.scheduler import SchedulerOutput
from inferq.gpuworker.engine.speculative.verify import expand_rows, row_generator, split_rows
from inferq.gpuworker.models.cpu_decode_replay import LOGITS, MAX_ROWS, TOKENS


@dataclass
class SampledTokens:
    """The step's new tokens: parallel lists, one entry per sampling request
    (no object per token: at batch 256 that alone costs ~0.1 ms a step)."""

    requests: list = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # None per row unless it asked for logprobs
    # Set when some request verified proposals this step: per request how many it
    # proposed; the token_ids / logprobs entries of those with > 0 are then lists of
    # every token they emit (accepted proposals, then the target's own token).
    num_spec: Optional[list[int]] = None


@dataclass
class StepTimes:
    """Host wall time of the parts of the last step (seconds), for bench step."""

    prepare: float = 0.0
    forward: float = 0.0
    sample: float = 0.0
    syncs: int = 0  # blocking device->host transfers in this step


class PersistentBlockTable:
    """One host row of block ids per live request, filled incrementally.

    A row is reused while the request keeps the same block list object in the
    KV manager (a freed and re-allocated request gets a new list, so its row is
    rewritten from scratch). Rows of requests that no longer hold blocks are
    reclaimed when the table runs out of rows. ``filled`` is a Python list: it is
    read once per request per step, and numpy scalar access costs ~10x a list's."""

    def __init__(self, num_rows: int, max_blocks: int) -> None:
        self.table = np.zeros((num_rows, max(1, max_blocks)), dtype=np.int64)
        self.filled = [0] * num_rows
        self.free_rows = list(range(num_rows - 1, -1, -1))
        self.row_of: dict[str, int] = {}
        self.src_of: dict[str, list[int]] = {}

    def _grow(self, rows: int = 0, width: int = 0) -> None:
        n, w = self.table.shape
        rows, width = max(rows, n), max(width, w)
        if (rows, width) == (n, w):
            return
        table = np.zeros((rows, width), dtype=np.int64)
        table[:n, :w] = self.table
        self.table = table
        self.filled.extend([0] * (rows - n))
        self.free_rows = list(range(rows - 1, n - 1, -1)) + self.free_rows

    def _reclaim(self, live: dict[str, list[int]]) -> None:
        for rid in [r for r, src in self.src_of.items() if live.get(r) is not src]:
            self.free_rows.append(self.row_of.pop(rid))
            del self.src_of[rid]

    def rows_for(self, request_ids: list[str], kv: KVCacheManager) -> np.ndarray:
        """Row index of each request, after bringing its row up to date."""
        live = kv.req_block_ids
        row_of, src_of, filled = self.row_of, self.src_of, self.filled
        out = []
        for rid in request_ids:
            ids = live[rid]
            row = row_of.get(rid)
            # Most steps add no block to a request: nothing to copy.
            if row is None or src_of[rid] is not ids or filled[row] != len(ids):
                row = self._update(rid, ids, row, live)
            out.append(row)
        return np.array(out, dtype=np.int64)

    def _update(self, rid: str, ids: list[int], row: Optional[int], live: dict[str, list[int]]) -> int:
        if row is None or self.src_of[rid] is not ids:
            if row is None:
                if not self.free_rows:
                    self._reclaim(live)
                if not self.free_rows:
                    self._grow(rows=2 * self.table.shape[0])
                row = self.free_rows.pop()
                self.row_of[rid] = row
            self.src_of[rid] = ids
            self.filled[row] = 0
        have, n = self.filled[row], len(ids)
        if n < have:  # the list shrank in place: rewrite the row
            have = 0
        if n > have:
            if n > self.table.shape[1]:
                self._grow(width=max(n, 2 * self.table.shape[1]))
            self.table[row, have:n] = ids[have:n]
        self.filled[row] = n
        return row


def _copy_done_event(device: torch.device):
    """An event on the current stream, recorded after a step's copy was queued."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class StepStaging:
    """The host buffer a step's integer inputs are packed into, and its copy to the device.

    On a GPU the copy is asynchronous: it reads the pinned buffer when the GPU reaches it,
    possibly after the host has begun the next step (a step in which no request samples
    ends without waiting for the GPU). Rewriting the buffer then would hand the earlier
    step's kernels this step's positions, slots and block tables, and write K/V to the
    wrong slots. So two buffers take turns, each with an event recorded after its copy was
    queued, and a buffer is rewritten only once its event has passed: that is the copy of
    two steps ago, long done in practice, so the wait costs nothing.

    On CPU the device tensors are the buffer itself, read within the step: one buffer."""

    def __init__(self, device: torch.device):
        self.device = device
        self.asynchronous = device.type != "cpu"
        self._buffers: list[Optional[torch.Tensor]] = [None, None]
        self._copied = [None, None]  # per buffer: the event after its last copy, until waited for
        self._turn = 0

    def take(self, n: int) -> torch.Tensor:
        """``n`` int64 of host buffer to fill, which no queued copy still reads."""
        if self.asynchronous:
            self._turn ^= 1
            self._wait_for_copy(self._turn)
        buf = self._buffers[self._turn]
        if buf is None or buf.numel() < n:  # grow-only
            size = max(n, 4096, 0 if buf is None else 2 * buf.numel())
            buf = torch.empty(size, dtype=torch.int64, pin_memory=self.device.type == "cuda")
            self._buffers[self._turn] = buf
        return buf[:n]

    def send(self, host: torch.Tensor) -> torch.Tensor:
        """The device copy of what ``take`` returned (on CPU, the buffer itself)."""
        if not self.asynchronous:
            return host
        moved = host.to(self.device, non_blocking=True)
        self._copied[self._turn] = _copy_done_event(self.device)
        return moved

    def _wait_for_copy(self, turn: int) -> None:
        event = self._copied[turn]
        if event is not None:
            event.synchronize()
            self._copied[turn] = None


class ModelRunner:
    def __init__(self, model, kv_caches, block_size: int, device: torch.device,
                 max_num_seqs: int = 256, max_model_len: int = 8192):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.shaper: Optional[LogitsShaper] = None  # made on the first request that shapes logits
        self.graphs = None  # DecodeGraphs on CUDA, set by the engine after capture
        self.tables = PersistentBlockTable(2 * max_num_seqs, -(-max_model_len // block_size))
        self._table_width = -(-max_model_len // block_size)  # the CPU decode replay's block table rows
        self._direct_decode = device.type == "cpu"  # decode steps may write the replay's inputs directly
        self.staging = StepStaging(device)
        self.num_device_syncs = 0
        self.last_times = StepTimes()
        # Live pooling requests (embeddings), counted by the engine: with none, no step looks for them.
        self.pooling_requests = 0

    def _shaper(self) -> LogitsShaper:
        if self.shaper is None:
            self.shaper = LogitsShaper(self.model.config.vocab_size)
        return self.shaper

    def build_metadata(self, sched: SchedulerOutput, kv: KVCacheManager):
        """One flattened varlen batch: every scheduled token of every request.

        Returns (input ids, positions, metadata, hidden-row indices of the sampling
        requests or None, their indices in the schedule, query start offsets as a
        host array)."""
        bs = self.block_size
        scheduled = sched.scheduled
        b = len(scheduled)
        # One pass over the schedule (256 rows at batch 256): plain lists, then arrays.
        rids, starts_l, q_lens_l, input_ids, sampling = [], [], [], [], []
        speculating = False
        for i, s in enumerate(scheduled):
            req = s.request
            start, n = s.num_computed_before, s.num_new_tokens
            rids.append(req.request_id)
            starts_l.append(start)
            q_lens_l.append(n)
            if n == 1:
                input_ids.append(req.all_token_ids[start])
            elif s.num_spec:  # its last known token, then the proposed ones
                input_ids.extend(req.all_token_ids[start : start + n - s.num_spec])
                input_ids.extend(req.spec_token_ids)
                speculating = True
            else:
                input_ids.extend(req.all_token_ids[start : start + n])
            if s.samples:
                sampling.append(i)
        if self.pooling_requests:  # a pooling request's last prompt chunk samples nothing
            sampling = [i for i in sampling if scheduled[i].request.pooling is None]
        starts = np.array(starts_l, dtype=np.int64)
        q_lens = np.array(q_lens_l, dtype=np.int64)
        rows = self.tables.rows_for(rids, kv)
        seq_lens = starts + q_lens
        seq_lens_l = seq_lens.tolist()
        max_seq_len = max(seq_lens_l)  # Python's max of a list: no numpy reduction per step
        qsl = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(q_lens, out=qsl[1:])
        t = int(qsl[-1])
        if t == b:  # every row has one new token (decode-only step)
            positions = starts
            seq_rows = rows
        else:
            seq_index = np.repeat(np.arange(b), q_lens)
            positions = np.arange(t, dtype=np.int64) - qsl[:-1][seq_index] + starts[seq_index]
            seq_rows = rows[seq_index]
        width = -(-max_seq_len // bs)
        table = self.tables.table
        slots = table[seq_rows, positions // bs] * bs + positions % bs
        sample_rows = qsl[1:] - 1
        if speculating:  # a speculating request samples at its last k + 1 rows
            sample_rows = np.array([r for i in sampling for r in range(int(sample_rows[i]) - scheduled[i].num_spec,
                                                                       int(sample_rows[i]) + 1)], dtype=np.int64)
        elif len(sampling) != b:
            sample_rows = sample_rows[sampling]
        ns = len(sample_rows)

        # One staging buffer, one host->device copy: the int64 inputs, then the int32 ones
        # (query starts, sequence lengths, context lengths, block table) two to a word.
        n64, n32 = 3 * t + ns, 3 * b + 1 + b * width
        buf = self.staging.take(n64 + (n32 + 1) // 2)
        host = buf.numpy()
        host32 = host[n64:].view(np.int32)
        i0, p0, s0, r0 = 0, t, 2 * t, 3 * t
        q0, l0, c0, b0 = 0, b + 1, 2 * b + 1, 3 * b + 1
        host[i0:p0] = input_ids
        host[p0:s0] = positions
        host[s0:r0] = slots
        host[r0:n64] = sample_rows
        host32[q0:l0] = qsl
        host32[l0:c0] = seq_lens
        host32[c0:b0] = starts
        host32[b0:n32].reshape(b, width)[:] = table[rows, :width]
        moved = self.staging.send(buf)
        moved32 = moved[n64:].view(torch.int32)
        meta = AttentionMetadata(
            slot_mapping=moved[s0:r0],
            query_start_loc=moved32[q0:l0],
            seq_lens=moved32[l0:c0],
            context_lens=moved32[c0:b0],
            block_tables=moved32[b0:n32].view(b, width),
            max_query_len=max(q_lens_l),
            max_seq_len=max_seq_len,
            block_size=bs,
            query_lens_cpu=q_lens_l,
            seq_lens_cpu=seq_lens_l,
            all_slots_valid=True,
        )
        return moved[i0:p0], moved[p0:s0], meta, (moved[r0:n64] if ns else None), sampling, qsl

    def _direct_inputs(self, sched: SchedulerOutput, kv: KVCacheManager):
        """A decode-only step of plain rows (one new token each, all sampling; no proposals,
        logits shaping or prompt logprobs) whose row count the CPU decode replay has checked:
        its inputs written straight into the replay's buffers (cpu_decode_replay.DecodeInputs)
        as Python ints. This skips ``build_metadata`` and the replay's tensor checks: their ~25
        numpy and torch calls cost ~0.3 ms a step on a core whose caches the weights just
        streamed through. Returns ``(replay, inputs, kind, requests, greedy, longest sequence)``,
        or None: the general path."""
        replay = getattr(self.model, "decode_replay", None)
        scheduled = sched.scheduled
        b = len(scheduled)
        if replay is None or b > MAX_ROWS:
            return None
        reqs, greedy = [], True
        for s in scheduled:
            req = s.request
            if (s.num_new_tokens != 1 or not s.samples or s.num_spec or req.shapes_logits
                    or req.prompt_logprobs is not None):
                return None
            greedy = greedy and req.plain_greedy
            reqs.append(req)
        kind = TOKENS if greedy else LOGITS
        if not replay.ready(b, kind):
            return None
        inputs = replay.inputs(b, self._table_width)
        ids, positions, slots, lens = inputs.ids_mv, inputs.positions_mv, inputs.slots_mv, inputs.lens_mv
        live, bs, longest = kv.req_block_ids, self.block_size, 0
        for i, s in enumerate(scheduled):
            req, start = s.request, s.num_computed_before
            blocks = live[req.request_id]
            if not inputs.set_blocks(i, blocks):
                return None
            ids[i], positions[i] = req.all_token_ids[start], start
            slots[i], lens[i] = blocks[start // bs] * bs + start % bs, start + 1
            if start >= longest:
                longest = start + 1
        return replay, inputs, kind, reqs, greedy, longest

    def _execute_direct(self, direct, times: StepTimes, t0: float) -> Optional[SampledTokens]:
        """The step ``_direct_inputs`` prepared, or None where the replay refused it."""
        replay, inputs, kind, reqs, greedy, longest = direct
        t1 = time.perf_counter()
        out = replay.run_inputs(inputs, kind, longest, self.kv_caches)
        if out is None:
            return None
        logits, tokens = out
        t2 = time.perf_counter()
        if greedy:
            lps: list = [None] * len(reqs)
        else:
            with torch.inference_mode():  # the sampler's own tensors are inference tensors
                sampled = self.sampler(logits.float(), self._sampling_rows(reqs), owned=True)
            tokens, lps = sampled.token_ids, sampled.logprobs
        self.num_device_syncs += 1
        times.prepare, times.forward, times.sample, times.syncs = t1 - t0, t2 - t1, time.perf_counter() - t2, 1
        return SampledTokens(reqs, tokens, lps)

    @staticmethod
    def _sampling_rows(reqs: list) -> list[SamplingRow]:
        """The sampler's rows of requests sampling one token each."""
        return [SamplingRow(params=r.params, prompt_token_ids=r.prompt_token_ids, output_token_ids=r.output_token_ids,
                            generator=row_generator(r, 0), penalty_tokens=r.penalty_tokens) for r in reqs]

    def execute(self, sched: SchedulerOutput, kv: KVCacheManager) -> SampledTokens:
        times = self.last_times = StepTimes()
        t0 = time.perf_counter()
        if self._direct_decode and not self.pooling_requests:
            # no inference_mode around it: it makes no autograd tensors, and entering and
            # leaving the mode cost ~50 us on a cold core
            direct = self._direct_inputs(sched, kv)
            done = None if direct is None else self._execute_direct(direct, times, t0)
            if done is not None:
                return done
        return self._execute(sched, kv, times, t0)

    @torch.inference_mode()
    def _execute(self, sched: SchedulerOutput, kv: KVCacheManager, times: StepTimes, t0: float) -> SampledTokens:
        """The general step: ``build_metadata``, the forward (or a replay), the sampler."""
        syncs_before = self.num_device_syncs
        ids, positions, meta, rows_idx, sampling, qsl = self.build_metadata(sched, kv)
        scheduled = sched.scheduled
        reqs = [scheduled[i].request for i in sampling]
        num_spec = [scheduled[i].num_spec for i in sampling]
        speculating = any(num_spec)
        # One entry per logits row: a speculating request has one per verified position.
        row_reqs, row_offsets = expand_rows(reqs, num_spec) if speculating else (reqs, None)
        shaped = any(r.shapes_logits for r in reqs)
        # Grammar masks are filled on a helper thread while the forward runs.
        pending = self._shaper().begin(row_reqs, row_offsets) if shaped else None
        t1 = time.perf_counter()
        prompt_logprobs = any(s.request.prompt_logprobs is not None for s in sched.scheduled)
        pooling = pooling_rows(scheduled) if self.pooling_requests else None
        kept = False  # hidden holds the sampling rows only
        greedy = all(r.plain_greedy for r in reqs)
        head = None  # (logits, greedy tokens or None) of a decode step replayed on the CPU with its LM head
        if (self.device.type == "cpu" and rows_idx is not None and rows_idx.numel() == ids.shape[0]
                and not prompt_logprobs and not pooling and not speculating):
            replayed_head = getattr(self.model, "replayed_head", None)  # a model without a decode replay: None
            if replayed_head is not None:
                head = replayed_head(ids, positions, self.kv_caches, meta, greedy)
        if head is not None:
            hidden = None
        elif self.graphs is not None and self.graphs.can_run(meta):
            hidden = self.graphs.run(ids, positions, meta)
        elif rows_idx is not None and 0 < rows_idx.numel() < ids.shape[0] and not prompt_logprobs and not pooling:
            # Only the sampling rows' hidden states are wanted: the last layer's MLP skips the rest.
            hidden = self.model(ids, positions, self.kv_caches, meta, keep_rows=rows_idx)
            kept = True
        else:
            hidden = self.model(ids, positions, self.kv_caches, meta)
        if prompt_logprobs:
            collect_prompt_logprobs(self.model, hidden, sched.scheduled, qsl.tolist())
        if pooling:
            accumulate(hidden, pooling, qsl)
        if rows_idx is None:
            times.prepare, times.forward = t1 - t0, time.perf_counter() - t1
            return SampledTokens()
        if head is not None:
            logits = head[0]
        else:
            # Logits only for rows that sample: the last token of each finished prompt/decode.
            if not kept and rows_idx.numel() != hidden.shape[0]:
                hidden = hidden.index_select(0, rows_idx)
            # Greedy rows need only the best token: logits stay in the model dtype (widening
            # bf16 to fp32 is exact, so the winner and its tie-breaking are the same).
            logits = self.model.lm_logits(hidden) if greedy else self.model.compute_logits(hidden)
        t2 = time.perf_counter()
        times.prepare, times.forward = t1 - t0, t2 - t1
        if greedy:
            # Greedy fast path at the call site: the first index of each row's maximum,
            # in the logits' own dtype (on CPU a blocked, vectorised argmax; see
            # sampler.greedy_argmax); one device->host copy.
            token_ids = (head[1] if head is not None else greedy_argmax(logits)).tolist()
            lps: list = [None] * len(row_reqs)
        else:
            if shaped:
                logits = logits.float()
                self.shaper.apply(logits, row_reqs, pending)
            if speculating:  # later positions see the drafts before them as output
                rows = [
                    SamplingRow(params=r.params, prompt_token_ids=r.prompt_token_ids,
                                output_token_ids=r.output_token_ids + r.spec_token_ids[:j] if j else r.output_token_ids,
                                generator=row_generator(r, j), penalty_tokens=r.penalty_tokens)
                    for r, j in zip(row_reqs, row_offsets)
                ]
            else:
                rows = self._sampling_rows(reqs)
            out = self.sampler(logits.float(), rows, owned=True)  # fresh from the LM head, read once
            token_ids, lps = out.token_ids, out.logprobs
        self.num_device_syncs += 1
        times.sample = time.perf_counter() - t2
        times.syncs = self.num_device_syncs - syncs_before
        if speculating:
            token_ids, lps = split_rows(token_ids, lps, reqs, num_spec)
            return SampledTokens(reqs, token_ids, lps, num_spec)
        return SampledTokens(reqs, token_ids, lps)
