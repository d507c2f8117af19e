"""POST /v1/embeddings through the official `openai` client, against the shared
stack (real redis-server, worker on a tiny random Llama, gateway), with HF
transformers on the same folder as the oracle."""
from __future__ import annotations

import threading

import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from tests.gateway.stack import TINY

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Redis streams carry the jobs.",
         "A much longer input: " + "the lighthouse keeper counted the waves all night long. " * 12]


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf(stack):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(stack.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval(), AutoTokenizer.from_pretrained(stack.model_dir)


@pytest.fixture(scope="module")
def worker_dtype(stack):
    """The stack's worker runs the engine's default dtype: bfloat16 on CPUs with AVX512-BF16."""
    from inferq.gpuworker.config import default_dtype

    return default_dtype(torch.device("cpu"))[0]


@torch.inference_mode()
def hf_vector(hf, ids: list[int], pooling: str) -> np.ndarray:
    hidden = hf[0].model(torch.tensor([ids])).last_hidden_state[0].double()
    v = hidden.mean(0) if pooling == "mean" else hidden[-1]
    return (v / v.norm()).float().numpy()


def assert_close_to_hf(got, want, dtype) -> None:
    """float32: the two sum in different orders (~1e-6 apart). bfloat16 (8-bit mantissa)
    rounds every layer's activations: unit vectors of 64 components differ by a few 1e-2."""
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    assert abs(np.linalg.norm(got) - 1.0) < 1e-5
    atol = 2e-5 if dtype == torch.float32 else 5e-2
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)
    assert float(got @ want) > (0.99999 if dtype == torch.float32 else 0.995)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_batched_float_embeddings_equal_hf(client, hf, worker_dtype, pooling):
    r = client.embeddings.create(model=TINY, input=TEXTS, encoding_format="float", extra_body={"pooling": pooling})
    assert r.object == "list" and r.model == TINY
    assert [d.index for d in r.data] == [0, 1, 2]
    ids = [hf[1](t).input_ids for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(i) for i in ids)
    for d, i in zip(r.data, ids):
        assert d.object == "embedding" and len(d.embedding) == 64
        assert_close_to_hf(d.embedding, hf_vector(hf, i, pooling), worker_dtype)


def test_base64_single_input_and_token_ids(client, hf, worker_dtype):
    # The official client asks for base64 by default and decodes it (little-endian float32).
    default = client.embeddings.create(model=TINY, input=TEXTS[0])
    raw = client.embeddings.with_raw_response.create(model=TINY, input=TEXTS[0], encoding_format="base64")
    b64 = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(b64, str)
    as_floats = client.embeddings.create(model=TINY, input=TEXTS[0], encoding_format="float").data[0].embedding
    assert np.array_equal(np.frombuffer(__import__("base64").b64decode(b64), dtype="<f4"),
                          np.asarray(as_floats, dtype=np.float32))
    assert np.array_equal(np.asarray(default.data[0].embedding, dtype=np.float32), np.asarray(as_floats, np.float32))
    # The same input as token ids, alone and as a list of token-id lists.
    ids = hf[1](TEXTS[0]).input_ids
    one = client.embeddings.create(model=TINY, input=ids, encoding_format="float")
    many = client.embeddings.create(model=TINY, input=[ids, hf[1](TEXTS[1]).input_ids], encoding_format="float")
    assert one.data[0].embedding == as_floats == many.data[0].embedding
    assert one.usage.prompt_tokens == len(ids)
    assert_close_to_hf(as_floats, hf_vector(hf, ids, "last"), worker_dtype)


def test_same_vector_while_generations_run(client):
    """Batch invariance: an input's vector is the same bits alone and batched with running generations."""
    alone = {p: client.embeddings.create(model=TINY, input=TEXTS, encoding_format="float",
                                         extra_body={"pooling": p}) for p in ("mean", "last")}
    started, stop = threading.Barrier(4), threading.Event()
    ended_alone, errors = [], []

    def generate(i: int) -> None:
        try:
            # Long enough to outlast the embeddings; closed (so cancelled) once they are done.
            stream = client.completions.create(model=TINY, prompt=f"Story {i}:", max_tokens=4000, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            chunks = iter(stream)
            next(chunks)
            started.wait(120)
            for _ in chunks:
                if stop.is_set():
                    break
            else:
                ended_alone.append(i)
            stream.close()
        except Exception as e:  # surfaced below
            errors.append(e)
            started.abort()

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait(120)  # every generation is streaming
    beside = {p: client.embeddings.create(model=TINY, input=TEXTS, encoding_format="float",
                                          extra_body={"pooling": p}) for p in ("mean", "last")}
    stop.set()
    for t in threads:
        t.join(120)
    assert not errors
    assert not ended_alone, "a generation ended before the embeddings ran: the test proved nothing"
    for p in ("mean", "last"):
        assert [d.embedding for d in beside[p].data] == [d.embedding for d in alone[p].data], p


def test_over_long_input_is_400(client):
    too_long = [5] * 5000  # the worker's context is 4096 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=TINY, input=[[7, 8, 9], too_long], encoding_format="float")
    assert e.value.status_code == 400
    assert "5000 tokens" in e.value.message and "4096" in e.value.message
    # A whole context is fine: nothing is generated after it.
    full = client.embeddings.create(model=TINY, input=[5] * 4096, encoding_format="float")
    assert full.usage.prompt_tokens == 4096


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["ok", ""]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": "x", "dimensions": 32}, "dimensions"),
    ({"input": "x", "pooling": "cls"}, None),
    ({"input": [-1, 2]}, "input"),
])
def test_bad_requests_are_400(gateway_url, body, param):
    import httpx

    resp = httpx.post(f"{gateway_url}/v1/embeddings", json={"model": TINY, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["message"]
    if param:
        assert err["param"] == param


def test_sdk_embed_equals_the_gateway(client, stack):
    import asyncio

    from inferq import Producer
    from inferq.producer.async_client import AsyncProducer
    from inferq.producer.errors import JobFailed

    want = client.embeddings.create(model=TINY, input=TEXTS[:2], encoding_format="float",
                                    extra_body={"pooling": "mean"})
    with Producer(stack.url, default_model=TINY) as p:
        assert p.embed(TEXTS[:2], pooling="mean", timeout=120) == [d.embedding for d in want.data]
        with pytest.raises(JobFailed, match="4096"):
            p.embed([[5] * 5000], timeout=120)

    async def run():
        async with AsyncProducer(stack.url, default_model=TINY) as ap:
            return await ap.embed(TEXTS[0], pooling="mean", timeout=120)

    assert asyncio.run(run()) == [want.data[0].embedding]


def test_job_schema_of_the_tasks():
    from pydantic import ValidationError

    from inferq.producer.admission import seeded
    from inferq.schemas import Job

    job = Job(model="m", prompt="x", task="embed", embed={"pooling": "mean", "normalize": False})
    again = Job.from_fields(job.to_fields())
    assert again.task == "embed" and again.embed.pooling == "mean" and again.embed.normalize is False
    assert seeded(job).sampling == job.sampling  # nothing is sampled: no seed is drawn
    # A generation job is written as before tasks existed (a worker that predates them reads it).
    assert '"task"' not in Job(model="m", prompt="x").to_fields()["job"]
    for bad, why in [
        (dict(prompt="x", task="embed", sampling={"temperature": 0}), "'sampling' applies to task 'generate'"),
        (dict(prompt="x", embed={"pooling": "mean"}), "need task 'embed'"),
        (dict(prompt="x", task="embed", embed={"pooling": "cls"}), "pooling"),
        (dict(prompt="x", task="detokenize"), "takes 'prompt_token_ids'"),
        (dict(prompt_token_ids=[1, 2], task="tokenize"), "takes 'prompt' or 'messages'"),
        (dict(prompt="x", task="tokenize", tokenize={"add_generation_prompt": False, "x": 1}), "x"),
        (dict(prompt="x", task="classify"), "task"),
    ]:
        with pytest.raises(ValidationError, match=why):
            Job(model="m", **bad)
