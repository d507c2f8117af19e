"""A sampled step makes the host wait for the GPU once: the read of its tokens.

The sampler takes its device branches here on CPU tensors (``_reads_are_free``
patched to answer False, as it does for a CUDA tensor), and
``tests/engine/sync_counter.py`` counts the calls that would sync on a GPU. Per
step: exactly one read (the sampled token ids, with any logprobs packed into the
same tensor) and no blocking host->device copy, whatever the batch mixes.
"""
from __future__ import annotations

import pytest
import torch

import inferq.gpuworker.engine.sampler as smp
from inferq.gpuworker.engine.penalty_tokens import PenaltyTokens
from inferq.gpuworker.engine.keyed_draws import KeyedDraws
from inferq.gpuworker.engine.sampler import Sampler, SamplingRow
from inferq.schemas import SamplingParams
from tests.engine.sync_counter import SyncCounter

VOCAB = 4096  # past the blocked-argmax threshold, so the CPU-only argmax branch would show

KINDS = {
    "greedy": dict(temperature=0.0),
    "greedy_logprobs": dict(temperature=0.0, logprobs=3),
    "greedy_penalised_processed": dict(temperature=0.0, repetition_penalty=1.3, logprobs=2,
                                       logprobs_mode="processed_logprobs"),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=0.9, top_k=5),
    "top_p": dict(temperature=0.7, top_p=0.9),
    "min_p": dict(temperature=1.0, min_p=0.1),
    "top_k_top_p_min_p": dict(temperature=1.1, top_k=40, top_p=0.8, min_p=0.02),
    "penalties": dict(temperature=1.0, repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3),
    "seeded_top_p": dict(temperature=0.6, top_p=0.9, seed=11),
    "seeded_top_k": dict(temperature=0.6, top_k=3, seed=12),
    "raw_logprobs": dict(temperature=1.0, logprobs=4),
    "processed_top_p_logprobs": dict(temperature=1.0, top_p=0.95, logprobs=4, logprobs_mode="processed_logprobs"),
    "processed_top_k_logits": dict(temperature=1.0, top_k=7, logprobs=2, logprobs_mode="processed_logits"),
    "raw_logits": dict(temperature=1.0, logprobs=1, logprobs_mode="raw_logits"),
    "processed_min_p": dict(temperature=1.0, min_p=0.2, logprobs=0, logprobs_mode="processed_logprobs"),
}

BATCHES = {
    "every kind": list(KINDS),
    "sampling only": ["temperature", "top_p", "top_k", "min_p", "seeded_top_p"],
    "top-p only": ["top_p", "top_p", "seeded_top_p"],
    "penalised greedy with logprobs": ["greedy_penalised_processed", "greedy_logprobs", "greedy"],
    "logprobs modes": ["raw_logprobs", "processed_top_p_logprobs", "processed_top_k_logits", "raw_logits"],
}


@pytest.fixture
def device_branches(monkeypatch):
    """The sampler's branches for a GPU tensor, on CPU tensors."""
    monkeypatch.setattr(smp, "_reads_are_free", lambda device: False, raising=False)


def make_rows(kinds: list[str], seed: int = 0) -> tuple[torch.Tensor, list[SamplingRow]]:
    """A batch as the engine hands it over: generators and penalty histories made at admission."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(kinds), VOCAB, generator=g) * 3
    rows = []
    for i, kind in enumerate(kinds):
        p = SamplingParams(**KINDS[kind])
        prompt = torch.randint(0, VOCAB, (5 + i,), generator=g).tolist()
        output = torch.randint(0, VOCAB, (i % 4,), generator=g).tolist()
        history = PenaltyTokens(prompt, VOCAB, "cpu", p.repetition_penalty != 1.0) if p.uses_penalties else None
        rows.append(SamplingRow(p, prompt, output, None if p.seed is None else KeyedDraws(p.seed, len(output)), history))
    return logits, rows


@pytest.mark.parametrize("batch", list(BATCHES))
def test_a_sampled_step_reads_the_device_once_and_never_blocks_on_an_upload(device_branches, batch):
    logits, rows = make_rows(BATCHES[batch])
    with SyncCounter() as counter:
        out = Sampler()(logits, rows, owned=True)
    assert len(out.token_ids) == len(rows)
    assert counter.blocking_uploads == []
    assert len(counter.reads) == 1, counter.reads


def test_prompt_logprobs_read_the_device_once_per_slice(device_branches):
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(1))
    with SyncCounter() as counter:
        out = smp.prompt_logprobs_of(logits, [5, 7, 9, 11, 13, 15], 3)
    assert len(out) == 6 and all(len(d) >= 3 for d in out)
    assert counter.blocking_uploads == []
    assert len(counter.reads) == 1, counter.reads


def test_device_branches_give_the_host_branches_greedy_tokens_and_logprobs(monkeypatch):
    """Greedy tokens and every logprob not drawn from a sampled distribution agree exactly;
    sampled tokens obey their row's top-k; seeded rows repeat."""
    kinds = list(KINDS)
    logits, rows = make_rows(kinds, seed=3)
    host = Sampler()(logits.clone(), rows)
    monkeypatch.setattr(smp, "_reads_are_free", lambda device: False, raising=False)
    first = Sampler()(logits.clone(), make_rows(kinds, seed=3)[1])
    again = Sampler()(logits.clone(), make_rows(kinds, seed=3)[1])
    for i, kind in enumerate(kinds):
        p = rows[i].params
        if p.temperature == 0.0:
            assert first.token_ids[i] == host.token_ids[i], kind
            assert first.logprobs[i] == host.logprobs[i], kind
        if 0 < p.top_k:
            assert first.token_ids[i] in set(logits[i].topk(p.top_k).indices.tolist()), kind
        if p.seed is not None:
            assert first.token_ids[i] == again.token_ids[i], kind
        if p.logprobs is not None and p.logprobs_mode in ("raw_logprobs", "raw_logits"):
            assert list(first.logprobs[i])[: p.logprobs] == list(host.logprobs[i])[: p.logprobs], kind



class Matcher:
    def is_error(self) -> bool:
        return False


def shaped_request(**params):
    from types import SimpleNamespace

    return SimpleNamespace(params=SamplingParams(**params), output_token_ids=[4, 5], eos_token_ids=(2,),
                           matcher=Matcher(), reasoning_gate=None, bias_tensors=None)


def test_logits_shaping_never_waits_for_the_device(device_branches):
    """Logit bias, min_tokens bans and a grammar mask: no read, no blocking upload
    (a request's bias tensors are made once, on its first step, without blocking either)."""
    from concurrent.futures import Future

    import numpy as np

    from inferq.gpuworker.engine.logits_shaping import LogitsShaper, PendingMasks

    reqs = [shaped_request(temperature=0.7, logit_bias={3: 2.0, 9: -1.0}),
            shaped_request(temperature=0.7, min_tokens=5, stop_token_ids=[7]),
            shaped_request(temperature=0.7)]
    bitmask = np.zeros((1, VOCAB // 32), dtype=np.int32)
    bitmask[0, 0] = 0b1011  # tokens 0, 1 and 3 allowed
    done = Future()
    done.set_result(None)
    logits = torch.zeros(3, VOCAB)
    with SyncCounter() as counter:
        LogitsShaper(VOCAB).apply(logits, reqs, PendingMasks([2], bitmask, done))
    assert counter.reads == [] and counter.blocking_uploads == []
    assert logits[0, 3] == 2.0 and logits[0, 9] == -1.0
    assert logits[1, 2] == logits[1, 7] == float("-inf") and logits[1, 3] == 0.0
    assert torch.isfinite(logits[2]).nonzero()[:, 0].tolist() == [0, 1, 3]


def test_the_grammar_mask_unpacks_on_the_device_as_on_the_host():
    import numpy as np

    from inferq.gpuworker.engine.logits_shaping import LogitsShaper

    bitmask = np.random.default_rng(0).integers(-(2**31), 2**31, size=(3, 5), dtype=np.int64).astype(np.int32)
    host = LogitsShaper._unpack(bitmask, None, 150)
    device = LogitsShaper._unpack(bitmask, torch.from_numpy(bitmask), 150)
    assert host.shape == (3, 150) and torch.equal(host, device)
