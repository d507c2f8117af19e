"""The OpenAI-compatible routes through the official `openai` client, against
a real worker (tiny random Llama) behind a real Redis."""
import openai
import pytest
from openai import OpenAI

from tests.gateway.stack import TINY


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)


def greedy_chat(client, **kw):
    return client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "Say hello"}],
                                          temperature=0, **kw)


def test_chat_completion_non_streamed(client):
    r = greedy_chat(client, max_tokens=12)
    assert r.object == "chat.completion"
    assert r.model == TINY
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12
    assert r.usage.prompt_tokens > 3  # the chat template wraps the message
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_streamed_and_reports_usage(client):
    whole = greedy_chat(client, max_tokens=16)
    chunks = list(greedy_chat(client, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    # With include_usage the last chunk has no choices and carries the usage.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completion_with_logprobs(client):
    r = client.completions.create(model=TINY, prompt="The queue", max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert r.object == "text_completion"
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 6
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok.startswith("token_id:")
        assert chosen <= 0.0
        assert 1 <= len(top) <= 4
        # Greedy: the chosen token is the most likely one.
        assert max(top.values()) == pytest.approx(chosen, abs=1e-5)


def test_completion_stream(client):
    whole = client.completions.create(model=TINY, prompt="Once upon", max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=TINY, prompt="Once upon", max_tokens=10, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_ends_output_before_it(client):
    base = client.completions.create(model=TINY, prompt="Numbers:", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 12
    stop = base[8:12]
    cut = base[:base.index(stop)]
    r = client.completions.create(model=TINY, prompt="Numbers:", max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"


def test_seed_makes_sampling_repeatable(client):
    kw = dict(model=TINY, prompt="Colors:", max_tokens=12, temperature=1.0, top_p=0.95,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=99, **kw).choices[0].text
    assert a == b
    assert a != c


def test_max_tokens_is_respected(client):
    r = greedy_chat(client, max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"


def test_models_lists_the_served_model(client):
    ids = [m.id for m in client.models.list().data]
    assert TINY in ids


def test_unknown_model_is_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found"
    assert "no-such-model" in e.value.body["message"]


def test_invalid_parameter_is_400_in_openai_shape(client):
    with pytest.raises(openai.BadRequestError) as e:
        greedy_chat(client, max_tokens=4, top_p=1.5)
    assert e.value.status_code == 400
    assert "top_p" in e.value.body["message"]


def test_chat_logprobs(client):
    r = greedy_chat(client, max_tokens=5, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5 == r.usage.completion_tokens
    for entry in content:
        assert entry.token.startswith("token_id:") and entry.logprob <= 0.0
        assert 1 <= len(entry.top_logprobs) <= 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)  # greedy picks the top


def test_request_timeout_becomes_the_job_deadline(stack):
    from tests.gateway.stack import running_gateway

    with running_gateway(stack.url, request_timeout_s=1.0) as url:
        c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.completions.create(model=TINY, prompt="Go", max_tokens=4000, extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "deadline"
        assert 0 < r.usage.completion_tokens < 4000


# ------------------------------------------------------------ prompt logprobs
def _hf_prompt_logprobs(stack, ids):
    """HF's teacher-forced log-softmax over the same tiny model (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(stack.model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def test_completion_echo_with_logprobs_reports_the_prompt(client, stack):
    prompt = "The queue is long today"
    r = client.completions.create(model=TINY, prompt=prompt, max_tokens=3, temperature=0, logprobs=2, echo=True,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    n_prompt = r.usage.prompt_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n_prompt + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ids = [int(t.split(":")[1]) for t in lp.tokens[:n_prompt]]
    ref = _hf_prompt_logprobs(stack, ids)
    for j in range(1, n_prompt):
        assert lp.token_logprobs[j] == pytest.approx(float(ref[j - 1, ids[j]]), abs=2e-3)
        assert 2 <= len(lp.top_logprobs[j]) <= 3
    # The same through a stream: the echoed prompt arrives with its logprobs, first.
    chunks = list(client.completions.create(model=TINY, prompt=prompt, max_tokens=3, temperature=0, logprobs=2,
                                            echo=True, stream=True, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].text == prompt
    streamed = chunks[0].choices[0].logprobs.token_logprobs
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:n_prompt], abs=1e-5)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text


def test_completion_prompt_logprobs_extension(client, stack):
    r = client.completions.create(model=TINY, prompt="Redis streams carry jobs", max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 1, "ignore_eos": True})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens
    ranks = [e["rank"] for entry in plp[1:] for e in entry.values()]
    assert ranks.count(1) == len(plp) - 1 and set(ranks) <= {1, None}
    for entry in plp[1:]:
        assert 1 <= len(entry) <= 2
        assert all(e["decoded_token"] == f"token_id:{k}" and e["logprob"] <= 0 for k, e in entry.items())


def test_chat_prompt_logprobs_extension(client, stack):
    r = greedy_chat(client, max_tokens=2, extra_body={"prompt_logprobs": 0, "ignore_eos": True})
    plp = r.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens  # the chat template's tokens included
    ids = [int(next(iter(e))) for e in plp[1:]]  # top-0: each entry is the actual prompt token
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] is None for e in plp[1:])
    chunks = list(greedy_chat(client, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 0, "ignore_eos": True}))
    firsts = [c.model_extra.get("prompt_logprobs") for c in chunks if (c.model_extra or {}).get("prompt_logprobs")]
    assert len(firsts) == 1 and [int(next(iter(e))) for e in firsts[0][1:]] == ids
