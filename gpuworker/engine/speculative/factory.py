"""Build the engine's speculative decoder from its config."""
from __future__ import annotations

from inferq.gpuworker.engine.speculative.config import SpeculativeConfig
from inferq.gpuworker.engine.speculative.controller import SpecDecoder


def make_spec_decoder(value, engine) -> SpecDecoder:
    config = SpeculativeConfig.parse(value)
    if config.method == "ngram":
        from inferq.gpuworker.engine.speculative.ngram import NgramProposer

        proposer = NgramProposer(config.k, config.min_n, config.max_n)
    else:
        from inferq.gpuworker.engine.speculative.draft_model import DraftModelProposer

        proposer = DraftModelProposer(config, engine)
    return SpecDecoder(config, proposer, engine.max_model_len)
