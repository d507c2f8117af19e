"""n > 1 end to end: the official `openai` client -> gateway (real HTTP) -> Redis ->
a worker process (tiny Llama) and back, streamed and not, plus the SDK and a Batch
API line. Greedy choices must each equal a single request's text."""
from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from inferq.producer import Producer
from inferq.schemas import SamplingParams
from tests.gateway.stack import TINY

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _chat(client, **kw):
    return client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "Count to ten"}],
                                          max_tokens=MAX_TOKENS, temperature=0, **kw)


def test_chat_n4_greedy_choices_equal_a_single_request(client):
    single = _chat(client)
    many = _chat(client, n=4)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert [c.message.content for c in many.choices] == [single.choices[0].message.content] * 4
    assert all(c.finish_reason == single.choices[0].finish_reason for c in many.choices)
    assert many.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert many.usage.completion_tokens == 4 * single.usage.completion_tokens


def test_completions_n3_streamed_interleaved_with_usage(client):
    single = client.completions.create(model=TINY, prompt="The sky is", max_tokens=MAX_TOKENS, temperature=0)
    stream = client.completions.create(model=TINY, prompt="The sky is", max_tokens=MAX_TOKENS, temperature=0, n=3,
                                       stream=True, stream_options={"include_usage": True})
    texts, ends, usage_chunks = {}, {}, []
    for chunk in stream:
        if not chunk.choices:
            usage_chunks.append(chunk.usage)
            continue
        assert chunk.usage is None
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                ends[c.index] = c.finish_reason
    assert texts == {i: single.choices[0].text for i in range(3)}
    assert ends == {i: single.choices[0].finish_reason for i in range(3)}
    assert len(usage_chunks) == 1
    assert usage_chunks[0].completion_tokens == 3 * single.usage.completion_tokens
    assert usage_chunks[0].prompt_tokens == single.usage.prompt_tokens


def test_chat_streamed_n2_each_choice_gets_a_role_and_finish(client):
    single = _chat(client)
    texts, roles, ends = {}, {}, {}
    for chunk in _chat(client, n=2, stream=True):
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                ends[c.index] = c.finish_reason
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {0: single.choices[0].message.content, 1: single.choices[0].message.content}
    assert set(ends) == {0, 1}


def test_seeded_choices_differ_and_reproduce(client):
    kw = dict(model=TINY, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=1.0, seed=7, n=4)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # choice i samples with seed + i


def test_seeded_choice_i_equals_a_single_request_with_seed_plus_i(client):
    kw = dict(model=TINY, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=1.0,
              extra_body={"ignore_eos": True})
    singles = [client.completions.create(seed=11 + i, **kw).choices[0].text for i in range(3)]
    many = client.completions.create(seed=11, n=3, **kw)
    assert [c.text for c in many.choices] == singles
    streamed = {}
    for chunk in client.completions.create(seed=11, n=3, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == dict(enumerate(singles))  # streamed assembly per index equals non-streamed


def test_greedy_n4_with_ignore_eos_runs_every_choice_to_max_tokens(client):
    single = _chat(client, extra_body={"ignore_eos": True})
    many = _chat(client, n=4, extra_body={"ignore_eos": True})
    assert [c.message.content for c in many.choices] == [single.choices[0].message.content] * 4
    assert [c.finish_reason for c in many.choices] == ["length"] * 4
    assert many.usage.completion_tokens == 4 * MAX_TOKENS


def test_n_over_the_cap_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, n=17)
    assert "n=17" in str(e.value)


def test_sdk_result_exposes_the_choices(stack):
    p = Producer(stack.url, default_model=TINY)
    single = p.submit(prompt="Hello there", sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0)).result(
        timeout=120)
    many = p.submit(prompt="Hello there", sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0, n=4)).result(
        timeout=120)
    assert many.text == single.text  # the single-choice fields are choice 0's
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert [c.text for c in many.choices] == [single.text] * 4
    assert [c.token_ids for c in many.choices] == [single.token_ids] * 4
    assert single.choices[0].text == single.text and len(single.choices) == 1
    assert many.usage.completion_tokens == 4 * single.usage.completion_tokens


def test_async_sdk_result_exposes_the_choices(stack):
    import asyncio

    from inferq.producer import AsyncProducer

    async def go():
        p = AsyncProducer(stack.url, default_model=TINY)
        try:
            h = await p.submit(prompt="Hello there", sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0, n=3))
            return await h.result(timeout=120)
        finally:
            await p.close()

    res = asyncio.run(go())
    assert [c.index for c in res.choices] == [0, 1, 2]
    assert len({c.text for c in res.choices}) == 1 and res.choices[0].text == res.text
