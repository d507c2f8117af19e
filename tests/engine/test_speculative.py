"""Speculative decoding (n-gram prompt lookup) on the real SmolLM2-135M-Instruct:
greedy output is the non-speculative output token for token (HF decides any
near-tie), stops / EOS / max_tokens / logprobs apply to accepted tokens, the KV
of rejected proposals goes back to the pool, seeded sampling is reproducible,
and the adaptive switches turn it off where it cannot pay."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.gpuworker.engine.speculative.config import SpeculativeConfig
from inferq.gpuworker.engine.speculative.proposer import Proposer
from inferq.schemas import SamplingParams
from tests.engine.hf_oracle import compare_greedy

NGRAM = {"method": "ngram", "k": 4}

DOCUMENT = ("Invoice 1042 from Northwind Traders to Contoso Ltd, dated 3 March 2026: 12 boxes of green tea "
            "at 4.50 each, 3 crates of oranges at 19.99 each, delivery to 221 Baker Street, London. "
            "Payment is due within 30 days to account 7731-2290.")


def copy_prompts(llm, n: int = 4) -> list[list[int]]:
    asks = ["Repeat this text exactly:", "Copy the following invoice word for word:",
            "Rewrite this invoice exactly as it is:", "Quote the text below verbatim:"]
    return [llm.apply_chat_template([{"role": "user", "content": f"{asks[i % 4]}\n{DOCUMENT}"}]) for i in range(n)]


@pytest.fixture(scope="module")
def spec_llm():
    torch.set_num_threads(1)
    return LLM(dtype="float32", num_kv_blocks=256, max_num_batched_tokens=256, speculative=NGRAM)


def assert_same_greedy(hf, prompts, spec_outs, plain_outs) -> None:
    """Token for token, except after a near-tie in HF's own logits (then either may continue)."""
    verdicts = [compare_greedy(hf, p, a.token_ids, b.token_ids) if a.token_ids != b.token_ids else "equal"
                for p, a, b in zip(prompts, spec_outs, plain_outs)]
    assert verdicts.count("equal") >= len(verdicts) - 1, verdicts


def test_greedy_identical_on_the_hf_prompts_with_chunked_prefill_and_preemption(mixed_prompts, hf_smol, smol_llm):
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    llm = LLM(dtype="float32", block_size=16, max_num_batched_tokens=48, num_kv_blocks=24, max_num_seqs=16,
              speculative=NGRAM)
    spec_outs = llm.generate(mixed_prompts, greedy)
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0, "the small pool should have forced preemption"
    assert stats.spec.num_drafts > 0 and stats.spec.num_accepted_tokens > 0
    llm.engine.check_invariants()
    assert stats.num_free_blocks == stats.num_blocks
    plain = smol_llm.generate(mixed_prompts, greedy)
    assert all(len(o.token_ids) == 24 for o in spec_outs)
    assert_same_greedy(hf_smol, mixed_prompts, spec_outs, plain)


def test_64_request_mix_identical_with_chunked_prefill_and_preemption(mixed_prompts, hf_smol, smol_llm):
    prompts = (mixed_prompts + copy_prompts(smol_llm, 16)) * 2
    assert len(prompts) == 64
    params = [SamplingParams(max_tokens=8 + (i % 5) * 8, temperature=0, ignore_eos=i % 2 == 0) for i in range(64)]
    llm = LLM(dtype="float32", block_size=16, max_num_batched_tokens=64, num_kv_blocks=40, max_num_seqs=12,
              speculative=NGRAM | {"max_batch": 12})
    spec_outs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0 and stats.spec.num_accepted_tokens > 0
    llm.engine.check_invariants()
    assert stats.num_free_blocks == stats.num_blocks
    plain = smol_llm.generate(prompts, params)
    assert [o.finish_reason for o in spec_outs] == [o.finish_reason for o in plain]
    assert_same_greedy(hf_smol, prompts, spec_outs, plain)


def test_copying_accepts_most_proposals_and_takes_fewer_steps(spec_llm, smol_llm):
    prompt = copy_prompts(smol_llm, 1)[0]
    p = SamplingParams(max_tokens=60, temperature=0)
    before = spec_llm.engine.stats()
    steps0 = spec_llm.engine.num_steps
    out = spec_llm.generate([prompt], p)[0]
    spec = spec_llm.engine.stats().spec
    assert out.token_ids == smol_llm.generate([prompt], p)[0].token_ids
    accepted = spec.num_accepted_tokens - before.spec.num_accepted_tokens
    proposed = spec.num_draft_tokens - before.spec.num_draft_tokens
    assert accepted >= 0.6 * proposed > 0
    # One prefill step, then each step emits one token plus the accepted ones.
    assert spec_llm.engine.num_steps - steps0 <= len(out.token_ids) - accepted + 1


def test_stops_eos_and_max_tokens_apply_to_accepted_tokens(spec_llm, smol_llm):
    prompt = copy_prompts(smol_llm, 1)[0]
    full = smol_llm.generate([prompt], SamplingParams(max_tokens=100, temperature=0))[0]
    assert "Baker" in full.text
    cases = [
        SamplingParams(max_tokens=100, temperature=0, stop=["Baker"]),
        SamplingParams(max_tokens=100, temperature=0, stop=["Street, "]),
        SamplingParams(max_tokens=100, temperature=0, stop_token_ids=[full.token_ids[25]]),
        SamplingParams(max_tokens=23, temperature=0),
        SamplingParams(max_tokens=100, temperature=0),  # ends on EOS or at 100
    ]
    for params in cases:
        want = smol_llm.generate([prompt], params)[0]
        got = spec_llm.generate([prompt], params)[0]
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason), params
    assert spec_llm.generate([prompt], cases[3])[0].token_ids == full.token_ids[:23]


def test_deltas_of_a_speculative_step_carry_several_tokens_and_concatenate(spec_llm, smol_llm):
    eng = spec_llm.engine
    prompt = copy_prompts(smol_llm, 1)[0]
    p = SamplingParams(max_tokens=40, temperature=0)
    eng.add_request("deltas", prompt, p)
    deltas = []
    while eng.has_unfinished():
        deltas += [d for d in eng.step() if d.request_id == "deltas"]
    assert max(len(d.new_token_ids) for d in deltas) > 1
    want = smol_llm.generate([prompt], p)[0]
    assert [t for d in deltas for t in d.new_token_ids] == want.token_ids
    assert "".join(d.new_text for d in deltas) == want.text
    assert [d.num_output_tokens for d in deltas] == sorted({d.num_output_tokens for d in deltas})


def test_logprobs_of_accepted_tokens_equal_plain_decoding(spec_llm, smol_llm):
    prompt = copy_prompts(smol_llm, 1)[0]
    p = SamplingParams(max_tokens=30, temperature=0, logprobs=2)
    got = spec_llm.generate([prompt], p)[0]
    want = smol_llm.generate([prompt], p)[0]
    assert got.token_ids == want.token_ids and len(got.logprobs) == 30
    for a, b in zip(got.logprobs, want.logprobs):
        assert a.keys() == b.keys()
        assert all(abs(a[t] - b[t]) < 1e-4 for t in a)


def test_blocks_of_rejected_proposals_go_back_and_prefix_cache_stays_right(spec_llm, smol_llm):
    eng = spec_llm.engine
    bs = eng.kv.block_size
    prompts = copy_prompts(smol_llm, 3)
    p = SamplingParams(max_tokens=50, temperature=0.7, seed=5)
    for i, prompt in enumerate(prompts):
        eng.add_request(f"blocks-{i}", prompt, p)
    while eng.has_unfinished():
        eng.step()
        eng.check_invariants()
        for req in eng.scheduler.running:
            # Blocks for the computed tokens, at most one more for the last known token: none
            # left over from rejected proposals.
            held = len(eng.kv.req_blocks[req.request_id])
            assert -(-(req.num_tokens - 1) // bs) <= held <= -(-req.num_tokens // bs), req
            assert req.num_computed_tokens == req.num_tokens - 1
    assert eng.stats().num_free_blocks == eng.stats().num_blocks
    # The same prompt again hits the blocks cached above and decodes the same tokens.
    greedy = SamplingParams(max_tokens=40, temperature=0)
    first = spec_llm.generate([prompts[0]], greedy)[0]
    hits = eng.kv.prefix_hits
    again = spec_llm.generate([prompts[0]], greedy)[0]
    assert eng.kv.prefix_hits > hits and again.num_cached_tokens > 0
    assert again.token_ids == first.token_ids == smol_llm.generate([prompts[0]], greedy)[0].token_ids


def test_seeded_sampling_is_reproducible_whatever_the_batch(spec_llm, smol_llm):
    prompt = copy_prompts(smol_llm, 1)[0]
    p = SamplingParams(max_tokens=40, temperature=0.8, seed=1234)
    drafts0 = spec_llm.engine.stats().spec.num_drafts
    alone = spec_llm.generate([prompt], p)[0].token_ids
    assert spec_llm.engine.stats().spec.num_drafts > drafts0, "the request should have speculated"
    assert spec_llm.generate([prompt], p)[0].token_ids == alone
    # With 20 requests running, more than max_batch (16): nobody speculates in those steps.
    off0 = spec_llm.engine.stats().spec.num_steps_off_for_batch
    others = [SamplingParams(max_tokens=20, temperature=1.0) for _ in range(19)]
    batched = spec_llm.generate([prompt] + ["Numbers:"] * 19, [p] + others)[0].token_ids
    assert spec_llm.engine.stats().spec.num_steps_off_for_batch > off0
    assert batched == alone
    assert spec_llm.generate([prompt], p.model_copy(update={"seed": 99}))[0].token_ids != alone


class WrongProposer(Proposer):
    """Proposes a token the model never writes here (the last id of the vocabulary)."""

    def __init__(self, token: int):
        self.token, self.calls = token, 0

    def propose(self, requests, limits):
        self.calls += 1
        return [[self.token] * n for n in limits]


def test_a_request_that_accepts_nothing_stops_proposing_then_tries_again(smol_llm):
    llm = LLM(dtype="float32", num_kv_blocks=64, speculative=NGRAM | {"cooldown_tokens": 10, "min_acceptance": 0.3})
    eng = llm.engine
    vocab = eng.model_config.vocab_size
    eng.spec.proposer = WrongProposer(vocab - 1)
    p = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    out = llm.generate(["Count from one to twenty: one, two,"], p)[0]
    assert out.token_ids == smol_llm.generate(["Count from one to twenty: one, two,"], p)[0].token_ids
    st = eng.stats().spec
    assert st.num_accepted_tokens == 0 and st.num_cooldowns >= 2
    # Two verifications, then 10 tokens without proposals, again and again: about 1 in 4 decode steps proposes.
    assert 2 * st.num_cooldowns <= st.num_drafts <= 40 // 3


def test_no_proposals_while_the_batch_is_larger_than_max_batch():
    llm = LLM(dtype="float32", num_kv_blocks=64, speculative=NGRAM | {"max_batch": 2})
    p = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompt = "a b c a b c a b c a b c"
    llm.generate([prompt] * 3, p)
    st = llm.engine.stats().spec
    assert st.num_steps_off_for_batch >= 11 and st.num_drafts == 0
    llm.generate([prompt], p)
    assert llm.engine.stats().spec.num_drafts > 0


def test_requests_with_bias_min_tokens_or_penalties_do_not_speculate(spec_llm, smol_llm):
    prompt = copy_prompts(smol_llm, 1)[0]
    for p in (SamplingParams(max_tokens=20, temperature=0, logit_bias={11: -5.0}),
              SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.2),
              SamplingParams(max_tokens=20, temperature=0, min_tokens=3)):
        drafts = spec_llm.engine.stats().spec.num_drafts
        got = spec_llm.generate([prompt], p)[0].token_ids
        assert spec_llm.engine.stats().spec.num_drafts == drafts
        assert got == smol_llm.generate([prompt], p)[0].token_ids


@pytest.mark.parametrize("bad, message", [
    ({"method": "medusa"}, "method"),
    ({"method": "ngram", "min_n": 5, "max_n": 3}, "min_n"),
    ({"method": "draft_model"}, "needs model"),
    ({"method": "ngram", "k": 0}, "k"),
    ('{"method": "ngram", "k": ', "json"),
])
def test_bad_speculative_configs_are_clear_errors(bad, message):
    from inferq.gpuworker.config import EngineConfig

    with pytest.raises(ValueError, match=f"(?i){message}"):
        EngineConfig(speculative=bad)
    assert SpeculativeConfig.parse('{"method": "ngram", "k": 2}').k == 2


def test_structured_outputs_speculate_and_stay_identical_and_valid(spec_llm, smol_llm):
    import json

    import jsonschema

    from inferq.schemas import StructuredOutputs

    text = {"type": "string", "maxLength": 40}
    schema = {"type": "object", "properties": {"invoice": text, "seller": text, "buyer": text, "address": text,
                                               "items": {"type": "array", "items": text, "maxItems": 3}},
              "required": ["invoice", "seller", "buyer", "address", "items"], "additionalProperties": False}
    ask = f"Extract the invoice number, seller, buyer, delivery address and items of this invoice as JSON:\n{DOCUMENT}"
    prompt = smol_llm.apply_chat_template([{"role": "user", "content": ask}])
    cases = [SamplingParams(max_tokens=200, temperature=0, structured_outputs=StructuredOutputs(json=schema)),
             SamplingParams(max_tokens=60, temperature=0,
                            structured_outputs=StructuredOutputs(regex=r"Invoice [0-9]+ from [A-Za-z ]+ to [A-Za-z ]+"))]
    before = spec_llm.engine.stats().spec
    for params in cases:
        got = spec_llm.generate([prompt], params)[0]
        want = smol_llm.generate([prompt], params)[0]
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
    after = spec_llm.engine.stats().spec
    assert after.num_accepted_tokens > before.num_accepted_tokens, "the JSON copies the invoice: proposals should land"
    out = spec_llm.generate([prompt], cases[0])[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), schema)
