"""The runner's host->device copy of a step's inputs is asynchronous on a GPU: the
pinned buffer it reads must not be rewritten before that copy has run.

A step in which no request samples (mid-prompt chunks only) ends without any
sync, so the host may stage the next step while the GPU has not yet copied this
one. Without a GPU, the test plays the GPU as late as it may legally be: the
runner's device is a non-CPU device (``meta``), so it takes its device path, and
every ``.to(device, non_blocking=True)`` returns a CPU tensor that is filled from
the host buffer only when something waits for it — an event recorded after the
copy is synchronized, or the host reads the device (the sampled tokens). The
fake model keeps the tensors the kernels get; once everything has run, each step
must have received exactly the metadata it staged.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

import inferq.gpuworker.engine.model_runner as model_runner
from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.model_runner import ModelRunner
from inferq.gpuworker.engine.request import Request
from inferq.gpuworker.engine.scheduler import Scheduler
from inferq.schemas import SamplingParams

BLOCK = 4
VOCAB = 32


class LateGPU(TorchFunctionMode):
    """Host->device copies that run as late as a GPU stream may run them."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_done = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "to" and kwargs.get("non_blocking") and args[1:]:
            return self._queue_copy(args[0])
        return func(*args, **kwargs)

    def _queue_copy(self, host: torch.Tensor) -> torch.Tensor:
        dst = torch.full_like(host, -7)  # what a kernel would see of a copy that never ran
        self.queued.append((host, dst))
        return dst

    def run_until(self, mark: int) -> None:
        """The stream reaches ``mark``: every copy queued before it reads its host buffer now."""
        while self.num_done < mark:
            host, dst = self.queued[self.num_done]
            dst.copy_(host)
            self.num_done += 1

    def run_all(self) -> None:
        self.run_until(len(self.queued))

    def event(self):
        mark = len(self.queued)
        gpu = self

        class Event:
            def synchronize(self) -> None:
                gpu.run_until(mark)

        return Event()


class RecordingModel:
    """Keeps what its kernels were handed; reads nothing (the values may not be there yet)."""

    class config:
        vocab_size = VOCAB

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, ids, positions, kv_caches, meta, keep_rows=None):
        self.calls.append(dict(ids=ids, positions=positions, slots=meta.slot_mapping,
                               query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens,
                               context_lens=meta.context_lens, block_tables=meta.block_tables,
                               keep_rows=keep_rows))
        rows = ids.shape[0] if keep_rows is None else keep_rows.numel()
        return torch.zeros(rows, 8)

    def lm_logits(self, hidden):
        return torch.zeros(hidden.shape[0], VOCAB)

    compute_logits = lm_logits


def staged_by(sched, kv) -> dict:
    """What the step must stage, worked out from the schedule alone."""
    ids, positions, slots, qsl, seq_lens, ctx, tables, sample_rows = [], [], [], [0], [], [], [], []
    for s in sched.scheduled:
        start, n = s.num_computed_before, s.num_new_tokens
        blocks = kv.block_ids(s.request.request_id)
        ids += s.request.all_token_ids[start : start + n]
        positions += range(start, start + n)
        slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + n)]
        qsl.append(qsl[-1] + n)
        seq_lens.append(start + n)
        ctx.append(start)
        tables.append(list(blocks[: -(-(start + n) // BLOCK)]))
        if s.samples:
            sample_rows.append(qsl[-1] - 1)
    return dict(ids=ids, positions=positions, slots=slots, query_start_loc=qsl, seq_lens=seq_lens,
                context_lens=ctx, block_tables=tables, sample_rows=sample_rows)


def received(call: dict) -> dict:
    got = {k: call[k].tolist() for k in ("ids", "positions", "slots", "query_start_loc", "seq_lens", "context_lens")}
    got["block_tables"] = [row[: -(-n // BLOCK)] for row, n in zip(call["block_tables"].tolist(), got["seq_lens"])]
    return got


def test_each_step_gets_the_metadata_it_staged_though_its_copy_runs_late(monkeypatch):
    gpu = LateGPU()
    monkeypatch.setattr(model_runner, "_copy_done_event", lambda device: gpu.event(), raising=False)
    real_argmax = model_runner.greedy_argmax

    def argmax_then_read(logits):  # the runner reads the tokens right after: the host waits for the stream
        gpu.run_all()
        return real_argmax(logits)

    monkeypatch.setattr(model_runner, "greedy_argmax", argmax_then_read)

    kv = KVCacheManager(num_blocks=64, block_size=BLOCK, enable_prefix_caching=False)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=8)
    model = RecordingModel()
    runner = ModelRunner(model, kv_caches=None, block_size=BLOCK, device=torch.device("meta"),
                         max_num_seqs=4, max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    rng = np.random.default_rng(0)
    for i, n in enumerate((40, 17, 9)):  # prompts of several chunks: steps in which nobody samples
        scheduler.add(Request(f"r{i}", rng.integers(0, VOCAB, n).tolist(), params))

    expected, sampled_steps = [], 0
    with gpu:
        for _ in range(16):
            sched = scheduler.schedule()
            if not sched:
                break
            expected.append(staged_by(sched, kv))
            out = runner.execute(sched, kv)
            sampled_steps += bool(out.requests)
            for req, token in zip(out.requests, out.token_ids):
                req.append_output_token(token)
        gpu.run_all()

    assert len(model.calls) == len(expected) >= 10
    assert len(expected) - sampled_steps >= 4, "the schedule must have steps in which nobody samples"
    for step, (call, want) in enumerate(zip(model.calls, expected)):
        got = received(call)
        for key in got:
            assert got[key] == want[key], f"step {step}: the kernels got another step's {key}"
        if call["keep_rows"] is not None:
            assert call["keep_rows"].tolist() == want["sample_rows"], f"step {step}"


def test_on_cpu_the_device_tensors_are_the_staging_buffer_itself():
    """No copy on CPU: one buffer, rewritten by the next step (its reader is done by then)."""
    staging = model_runner.StepStaging(torch.device("cpu"))
    a = staging.take(10)
    assert staging.send(a) is a
    b = staging.take(10)
    assert b.data_ptr() == a.data_ptr()
