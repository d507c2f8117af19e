"""Build the engine's speculative decoder from its config."""
from __future__ import annotations

from gpuworker.engine.speculative.config import SpeculativeConfig
from gpuworker.engine.speculative.controller import SpecDecoder


def make_spec_decoder(value, engine) -> SpecDecoder:
    config = SpeculativeConfig.parse(value)
    if config.method == "ngram":
        from gpuworker.engine.speculative.ngram import NgramProposer

        proposer = NgramProposer(config.k, config.min_n, config.max_n)
    else:
        from gpuworker.engine.speculative.draft_model import DraftModelProposer

        proposer = DraftModelProposer(config, engine)
    return SpecDecoder(config, proposer, engine.max_model_len)
