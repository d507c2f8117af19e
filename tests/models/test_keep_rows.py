"""The forward's ``keep_rows``, which the model runner passes with the rows that sample: the
last layer runs attention for every row, then its output projection, MLP and final norm on the
kept rows only. Those rows get the values of the full forward (the same bits where the matmuls
are our CPU kernels, whose rows do not depend on the batch), and every layer's keys and values
are cached for every row, so the next steps see the same cache."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.models.loader import load_model
from tests.models.paged import PagedDriver
from tests.tiny_models import save_tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prepack", [False, True])
def test_kept_rows_get_the_full_forwards_values_and_the_cache_is_whole(dtype, prepack, tmp_path):
    model = load_model(str(save_tiny_model("llama", tmp_path / "m")), dtype=dtype).model
    ours = prepack and model.prepack_cpu_weights() not in (None, "onednn")  # our kernels run every matmul
    if prepack:
        model.use_cpu_kernels()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, model.config.vocab_size, (n,), generator=g).tolist() for n in (37, 9, 21)]
    full, kept = PagedDriver(model, model.backend, seed=1), PagedDriver(model, model.backend, seed=1)
    # two prompts, one of them in two chunks; then the chunk's rest beside decodes of the others
    steps = [[(0, prompts[0][:20]), (1, prompts[1])],
             [(0, prompts[0][20:]), (1, [7]), (2, prompts[2])],
             [(0, [11]), (1, [12]), (2, [13])]]
    for work in steps:
        want = [rows[-1:] for rows in full.step(work)]
        got = kept.step(work, last_rows_only=True)
        for a, b in zip(got, want):
            assert a.shape == b.shape == (1, model.config.vocab_size)
            if ours:
                assert torch.equal(a, b)
            else:  # torch's matmuls may take another path for fewer rows: within rounding
                assert (a - b).abs().max().item() <= (2e-2 if dtype == torch.bfloat16 else 1e-4) * b.abs().max().item()
    for (ka, va), (kb, vb) in zip(kept.kv, full.kv):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
