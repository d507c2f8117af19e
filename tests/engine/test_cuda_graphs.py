"""CUDA graphs of decode steps, checked on CPU: the CUDA graph API is replaced by
stand-ins that run the forward eagerly, and the model records what it is run with.

* each captured size gets the split-K count the eager path's chooser picks for a
  decode step of that many sequences at the longest context a replay may see;
* the self-check accepts a replay that differs from the eager forward by a
  rounding of the model's dtype (bf16 hidden states of a real model are in the
  tens to hundreds: one rounding there is 0.1-4, far above an absolute 1e-2),
  and rejects a real mismatch.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from inferq.gpuworker.engine.cuda_graphs import DecodeGraphs, replay_matches_eager
from inferq.kernels.runtime import num_compute_units
from inferq.kernels.split_k_decode import choose_num_kv_splits

NUM_KV_HEADS = 2
MAX_MODEL_LEN = 8192
BLOCK = 16
HIDDEN = 64


class Backend:
    name = "triton"
    num_kv_splits = None  # None: chosen per step


class FakeCuda:
    """torch.cuda's graph API, as far as DecodeGraphs.capture uses it; a 'graph' replays nothing."""

    def __init__(self) -> None:
        self.capturing = False

    class Stream:
        def __init__(self, device=None) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    class CUDAGraph:
        def pool(self):
            return None

        def replay(self) -> None:
            pass

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "Stream", self.Stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.CUDAGraph)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "graph", self.graph)

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None):
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False


class RecordingModel:
    def __init__(self, backend: Backend, cuda: FakeCuda) -> None:
        self.backend, self.cuda = backend, cuda
        self.captured_splits: dict[int, object] = {}

    def __call__(self, ids, positions, kv_caches, meta):
        if self.cuda.capturing:
            self.captured_splits[ids.shape[0]] = self.backend.num_kv_splits
        return torch.zeros(ids.shape[0], HIDDEN)


def kv_caches(dtype=torch.float32):
    shape = (4, BLOCK, NUM_KV_HEADS, 16)
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))]


def test_each_graph_is_captured_with_the_split_k_the_eager_chooser_picks(monkeypatch):
    cuda, backend = FakeCuda(), Backend()
    cuda.install(monkeypatch)
    model = RecordingModel(backend, cuda)
    graphs = DecodeGraphs(model, kv_caches(), backend, BLOCK, MAX_MODEL_LEN, max_num_seqs=256,
                          device=torch.device("cpu"))
    assert graphs.capture()
    units = num_compute_units(torch.device("cpu"))
    expected = {n: choose_num_kv_splits(n, NUM_KV_HEADS, 1, MAX_MODEL_LEN, units) for n in graphs.sizes}
    assert model.captured_splits == expected
    assert len(set(expected.values())) > 3  # one size, one count: no fixed split for all
    assert expected[1] > 4 and expected[256] == 1
    assert backend.num_kv_splits is None  # eager steps choose for themselves again


# ------------------------------------------------------------------ self-check
def hidden_states(seed: int = 0) -> torch.Tensor:
    """bf16 hidden states as a real model has them: tens, with outlier channels in the hundreds."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(4, HIDDEN, generator=g) * 30
    h[:, 5] = 600.0
    h[:, 9] = -250.0
    return h.bfloat16()


def one_rounding_off(h: torch.Tensor) -> torch.Tensor:
    """The same values summed in another order: each element one rounding away (or equal)."""
    return (h.float() * (1 + 2.0**-8)).bfloat16()


def test_a_rounding_level_difference_passes_and_a_real_mismatch_fails():
    h = hidden_states()
    off = one_rounding_off(h)
    assert (off.float() - h.float()).abs().max() >= 2.0  # an absolute 1e-2 would reject it
    assert replay_matches_eager(off, h)[0]
    assert replay_matches_eager(h, h) == (True, 0.0)

    assert not replay_matches_eager(h.flip(0), h)[0]  # another sequence's states (a stale input)
    wrong = h.clone()
    wrong[2, 20] = h[2, 20] * 1.25 + 30  # one element really off
    assert not replay_matches_eager(wrong, h)[0]
    nan = h.clone()
    nan[1, 1] = float("nan")
    assert not replay_matches_eager(nan, h)[0]
    assert not replay_matches_eager(torch.zeros_like(h), h)[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_tolerance_follows_the_dtype(dtype):
    h = (hidden_states().float() / 10).to(dtype)
    step = torch.finfo(dtype).eps / 2
    rounded = (h.float() * (1 + step)).to(dtype)
    assert replay_matches_eager(rounded, h)[0]
    assert not replay_matches_eager((h.float() * 1.05).to(dtype), h)[0]  # 5%: many bf16 steps, a mismatch here


class ReplayedGraph:
    """A captured graph whose replay leaves ``values`` in the output buffer."""

    def __init__(self, out: torch.Tensor, values: torch.Tensor) -> None:
        self.out, self.values = out, values

    def replay(self) -> None:
        self.out.copy_(self.values[: self.out.shape[0]])


@pytest.mark.parametrize("replayed, trusted", [(one_rounding_off, True), (lambda h: h.flip(0), False)])
def test_the_self_check_trusts_a_rounding_level_replay_and_rejects_a_wrong_one(replayed, trusted):
    h = hidden_states()

    class Model:
        def __call__(self, ids, positions, kv_caches, meta):
            return h[: ids.shape[0]].clone()

    graphs = DecodeGraphs(Model(), kv_caches(torch.bfloat16), Backend(), BLOCK, 64, max_num_seqs=8,
                          device=torch.device("cpu"))
    n = graphs.sizes[min(2, len(graphs.sizes) - 1)]
    graphs.outputs[n] = torch.empty(n, HIDDEN, dtype=torch.bfloat16)
    graphs.graphs[n] = ReplayedGraph(graphs.outputs[n], replayed(h))
    assert graphs._self_check() is trusted
