"""A structured-output constraint of a reasoning model applies only after the
reasoning (engine/grammar.py, ReasoningGate), in the real engine on tiny random
"thinking" models (tests/reasoning_models.py: ``<think>``/``</think>`` single tokens,
Qwen3 and DeepSeek-R1 templates). Greedy throughout, so runs can be compared token
for token; a logit bias on a marker scripts when the model opens or closes its block."""
from __future__ import annotations

import json

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams, StructuredOutputs
from tests.reasoning_models import END_THINK_ID, QWEN3_TEMPLATE, R1_TEMPLATE, THINK_ID, save_thinking_model

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
ASK = [{"role": "user", "content": "Is it raining?"}]


def _llm(folder, **kw):
    torch.set_num_threads(1)
    return LLM(model=str(folder), device="cpu", dtype="float32", num_kv_blocks=64, max_num_batched_tokens=256, **kw)


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    return _llm(save_thinking_model(tmp_path_factory.mktemp("r1"), R1_TEMPLATE))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _llm(save_thinking_model(tmp_path_factory.mktemp("qwen3"), QWEN3_TEMPLATE))


def prompt(llm, **template_kwargs):
    tok = llm.tokenizer
    text = tok.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True, **template_kwargs)
    return list(tok(text, add_special_tokens=False).input_ids)


def params(constrained=True, **kw):
    kw.setdefault("max_tokens", 16)
    return SamplingParams(temperature=0, structured_outputs=StructuredOutputs(json=SCHEMA) if constrained else None,
                          **kw)


def after_end(llm, token_ids):
    """The text after the first </think>."""
    i = token_ids.index(END_THINK_ID)
    return llm.tokenizer.decode(token_ids[i + 1:])


def test_auto_detection_follows_the_template(r1, qwen3, smol_llm):
    assert r1.engine.reasoning is not None and r1.engine.reasoning.end_ids == (END_THINK_ID,)
    assert qwen3.engine.reasoning is not None and qwen3.engine.reasoning.start_ids == (THINK_ID,)
    assert smol_llm.engine.reasoning is None  # SmolLM2's template knows no <think>


def test_reasoning_is_free_until_the_end_marker_then_constrained(r1):
    p = prompt(r1)  # the template opened <think>
    free, held = r1.generate([p, p], [params(False), params(True)])
    assert END_THINK_ID not in free.token_ids
    # Inside the reasoning the constraint changes nothing: the same tokens as unconstrained.
    assert held.token_ids == free.token_ids and held.finish_reason == "length"
    # Closing the block (scripted by a bias on </think>) hands the rest to the grammar.
    out = r1.generate([p], params(True, max_tokens=40, logit_bias={END_THINK_ID: 100.0}))[0]
    assert out.token_ids[0] == END_THINK_ID and out.finish_reason == "stop", out.text
    assert json.loads(after_end(r1, out.token_ids)) in ({"ok": True}, {"ok": False})
    # The bias stays, but the grammar's mask comes last: no second </think> after the end.
    assert out.token_ids.count(END_THINK_ID) == 1


def test_thinking_disabled_constrains_from_the_first_token(qwen3):
    out = qwen3.generate([prompt(qwen3, enable_thinking=False)], params(True, max_tokens=40))[0]
    assert out.finish_reason == "stop"
    assert json.loads(out.text) in ({"ok": True}, {"ok": False})


def test_qwen3_first_token_may_open_the_reasoning(qwen3):
    p = prompt(qwen3)  # neither opened nor closed: the model chooses
    # Pushed to think, it may: <think> passes the grammar's mask, then the reasoning is free.
    biased = dict(logit_bias={THINK_ID: 100.0})
    free, held = qwen3.generate([p, p], [params(False, **biased), params(True, **biased)])
    assert held.token_ids[0] == THINK_ID
    assert END_THINK_ID not in free.token_ids and held.token_ids == free.token_ids
    # Without the push the first token is <think> or the answer's; an answer is JSON.
    out = qwen3.generate([p], params(True, max_tokens=40))[0]
    if out.token_ids[0] != THINK_ID:
        assert out.finish_reason == "stop" and json.loads(out.text) in ({"ok": True}, {"ok": False})


def test_continued_attempt_resumes_gate_and_matcher(r1):
    """Request migration: a continued attempt gives the tokens the uninterrupted one
    gave, whether it resumes inside the reasoning or inside the constrained answer."""
    p = prompt(r1)
    eng = r1.engine

    def continued(rid, sp, done):
        eng.add_request(rid, p, sp, continue_token_ids=done)
        got = list(done)
        while eng.has_unfinished():
            for d in eng.step():
                got.extend(d.new_token_ids)
        return got

    inside = params(True)
    whole = r1.generate([p], inside)[0].token_ids
    assert continued("cont-reasoning", inside, whole[:5]) == whole
    across = params(True, max_tokens=40, logit_bias={END_THINK_ID: 100.0})
    whole = r1.generate([p], across)[0].token_ids
    assert whole[0] == END_THINK_ID and len(whole) > 4
    assert continued("cont-answer", across, whole[:3]) == whole


def test_speculative_drafts_stop_before_the_end_marker():
    from inferq.gpuworker.engine.grammar import ReasoningGate

    gate = ReasoningGate(None, (7, 8))
    assert gate.draft_limit([1, 2], [3, 7, 8, 9]) == 2  # 7 8 would end it: verify only 3 7
    assert gate.draft_limit([1, 7], [8, 9]) == 0  # the end completes with the first proposal
    assert gate.draft_limit([1, 2], [3, 4]) == 2
    one = ReasoningGate(None, (END_THINK_ID,))
    assert one.draft_limit([], [5, END_THINK_ID, 6]) == 1


def test_speculative_decoding_gives_the_same_tokens(r1, tmp_path):
    """n-gram speculation on the thinking model: inside the reasoning, across its end
    and in the constrained answer, the tokens of the plain engine."""
    spec = _llm(save_thinking_model(tmp_path / "r1", R1_TEMPLATE),
                speculative={"method": "ngram", "k": 4, "min_n": 1})
    p = prompt(r1)
    cases = [params(True, max_tokens=24), params(True, max_tokens=40, logit_bias={END_THINK_ID: 100.0})]
    for want, got in zip(r1.generate([p] * 2, cases), spec.generate([p] * 2, cases)):
        assert got.token_ids == want.token_ids
    assert spec.engine.spec.stats.num_accepted_tokens > 0  # speculation did run
