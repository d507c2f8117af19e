"""Speculative decoding: propose a few tokens per decoding request, verify them
all in the target model's next forward, keep the longest agreeing prefix.

* ``config``: ``SpeculativeConfig`` (method, k, n-gram range, adaptive limits);
* ``proposer``: the interface every proposer implements;
* ``ngram``: prompt lookup (no second model);
* ``draft_model``: a smaller model of the same tokenizer;
* ``verify``: acceptance, greedy and sampled;
* ``controller``: which requests speculate this step (adaptive), the counters.

The scheduler, KV cache manager and model runner know only
``Request.spec_token_ids`` (the proposal riding along with a request this step).
"""
