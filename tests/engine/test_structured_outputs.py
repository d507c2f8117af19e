"""Structured outputs, logit_bias and min_tokens in the engine, on the real SmolLM2."""
from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest

from inferq.gpuworker import LLM
from inferq.gpuworker.engine.grammar import GrammarCompiler, GrammarError
from inferq.schemas import SamplingParams, StructuredOutputs
from inferq.bench.structured_cases import PROMPTS, SCHEMAS


def chat(llm, text):
    return llm.apply_chat_template([{"role": "user", "content": text}])


def run(llm, prompts, params):
    return llm.generate(prompts, params)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_schema_gives_valid_json(smol_llm, temperature):
    names = list(SCHEMAS)
    prompts = [chat(smol_llm, PROMPTS[n]) for n in names]
    params = [SamplingParams(max_tokens=160, temperature=temperature, seed=7,
                             structured_outputs=StructuredOutputs(json=SCHEMAS[n])) for n in names]
    outs = run(smol_llm, prompts, params)
    for name, out in zip(names, outs):
        assert out.finish_reason == "stop", (name, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])


def test_regex_choice_and_lark_grammar(smol_llm):
    prompt = chat(smol_llm, "Answer now.")
    grammar = 'start: "The answer is " NUM "."\nNUM: /[0-9]{1,3}/'
    outs = run(smol_llm, [prompt] * 4, [
        SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputs(regex=r"[0-9]{3}-[a-z]{2,4}")),
        SamplingParams(max_tokens=40, temperature=0.9, seed=1, structured_outputs=StructuredOutputs(choice=["red", "green", "blue"])),
        SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputs(grammar=grammar)),
        SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputs(json_object=True)),
    ])
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", outs[0].text), outs[0].text
    assert outs[1].text in ("red", "green", "blue")
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", outs[2].text), outs[2].text
    assert all(o.finish_reason == "stop" for o in outs[:3])
    if outs[3].finish_reason == "stop":
        assert isinstance(json.loads(outs[3].text), dict)
    else:  # ran out of tokens: a valid prefix of a JSON object
        assert outs[3].text.startswith("{")


def test_max_tokens_running_out_leaves_a_valid_prefix(smol_llm):
    schema = SCHEMAS["array_of_objects"]
    so = StructuredOutputs(json=schema)
    out = run(smol_llm, [chat(smol_llm, PROMPTS["array_of_objects"])],
              SamplingParams(max_tokens=6, temperature=0, structured_outputs=so))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    checker = smol_llm.engine.grammar.matcher(so)
    assert checker.consume_tokens(out.token_ids), checker.get_error()
    assert not checker.is_accepting()


def test_logprobs_are_reported_after_the_mask(smol_llm):
    so = StructuredOutputs(choice=["yes", "no"])
    out = run(smol_llm, [chat(smol_llm, "Is the sky blue?")],
              SamplingParams(max_tokens=5, temperature=0, logprobs=5, structured_outputs=so))[0]
    assert out.text in ("yes", "no")
    tok = smol_llm.tokenizer
    first = out.logprobs[0]
    allowed = {tok.decode([t]) for t in first if first[t] > float("-inf")}
    # Only prefixes of the choices have a finite logprob, and they sum to (almost) 1.
    assert allowed and all("yes".startswith(s) or "no".startswith(s) for s in allowed), allowed


def test_stop_string_and_abort_with_a_constraint(smol_llm):
    eng = smol_llm.engine
    so = StructuredOutputs(json=SCHEMAS["person"])
    out = run(smol_llm, [chat(smol_llm, PROMPTS["person"])],
              SamplingParams(max_tokens=60, temperature=0, stop=['"age"'], structured_outputs=so))[0]
    assert out.finish_reason == "stop" and '"age"' not in out.text and out.text.startswith('{"name": ')
    eng.add_request("abort-me", chat(smol_llm, PROMPTS["person"]), SamplingParams(max_tokens=60, temperature=0, structured_outputs=so))
    eng.step()
    d = eng.abort("abort-me")
    assert d.finished and d.finish_reason == "abort"
    eng.check_invariants()


def test_constrained_greedy_is_identical_under_chunked_prefill_and_preemption(smol_llm, mixed_prompts):
    names = list(SCHEMAS)
    prompts = [p + chat(smol_llm, PROMPTS[names[i % len(names)]]) for i, p in enumerate(mixed_prompts)]
    params = [SamplingParams(max_tokens=48, temperature=0, structured_outputs=StructuredOutputs(json=SCHEMAS[names[i % len(names)]]))
              for i in range(len(prompts))]
    reference = [run(smol_llm, [p], [sp])[0] for p, sp in zip(prompts, params)]  # one at a time: no chunking, no preemption
    tight = LLM(dtype="float32", block_size=16, max_num_batched_tokens=48, num_kv_blocks=40, max_num_seqs=16)
    outs = run(tight, prompts, params)
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0, "the small pool should have forced preemption"
    assert max(len(p) for p in prompts) > 48  # every long prompt is chunked
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in reference]
    tight.engine.check_invariants()


def test_logit_bias_forces_and_bans_tokens(smol_llm):
    prompt = chat(smol_llm, "Say hello.")
    plain = run(smol_llm, [prompt], SamplingParams(max_tokens=4, temperature=0))[0]
    first = plain.token_ids[0]
    banned = run(smol_llm, [prompt], SamplingParams(max_tokens=4, temperature=0, logit_bias={first: -100}))[0]
    assert banned.token_ids[0] != first
    forced_id = smol_llm.tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = run(smol_llm, [prompt], SamplingParams(max_tokens=3, temperature=0.8, seed=3, logit_bias={forced_id: 100}))[0]
    assert forced.token_ids == [forced_id] * 3


def test_min_tokens_holds_back_eos(smol_llm):
    prompt = chat(smol_llm, "Reply with one word: yes or no?")
    plain = run(smol_llm, [prompt], SamplingParams(max_tokens=64, temperature=0))[0]
    assert plain.finish_reason == "stop" and len(plain.token_ids) < 20
    held = run(smol_llm, [prompt], SamplingParams(max_tokens=64, temperature=0, min_tokens=24))[0]
    assert len(held.token_ids) >= 24
    assert held.token_ids[: len(plain.token_ids) - 1] == plain.token_ids[:-1]  # the same text up to where EOS came


def test_compile_cache_is_bounded_and_bad_grammars_fail_alone(smol_llm):
    eng = smol_llm.engine
    g = GrammarCompiler(eng.tokenizer, eng.model_config.vocab_size, eng.eos_token_ids, cache_size=16)
    for i in range(1000):
        g.matcher(StructuredOutputs(json={"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}))
    assert len(g) == 16 and g.misses == 1000
    again = StructuredOutputs(json={"type": "object", "properties": {"k999": {"type": "integer"}}, "required": ["k999"]})
    g.matcher(again)
    assert g.hits == 1
    slow = GrammarCompiler(eng.tokenizer, eng.model_config.vocab_size, eng.eos_token_ids, compile_delay_s=2.0)
    with pytest.raises(GrammarError, match="longer than 0.1 s to compile"):
        slow.matcher(StructuredOutputs(regex="[a-z]+"), timeout_s=0.1)


def test_engine_refuses_an_out_of_vocabulary_logit_bias(smol_llm):
    with pytest.raises(ValueError, match="logit_bias token ids"):
        smol_llm.engine.add_request("oov", [1, 2, 3], SamplingParams(logit_bias={10**7: 1.0}))


def test_host_and_device_mask_unpacking_agree():
    # The CUDA path's unpacking (shifts on the device) runs here on CPU tensors.
    import numpy as np
    import torch

    from inferq.gpuworker.engine.logits_shaping import unpack_on_device, unpack_on_host

    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31, size=(5, 1536), dtype=np.int64).astype(np.int32)
    host = unpack_on_host(words)
    assert host.shape == (5, 1536 * 32)
    assert torch.equal(host, unpack_on_device(torch.from_numpy(words)))
    # Bit k of word w is token 32w + k.
    assert bool(host[0, 32 * 7 + 3]) == bool((int(words[0, 7]) >> 3) & 1)
