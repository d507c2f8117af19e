"""Request migration, end to end: real Redis, gateway and worker processes, the
official openai client streaming. A worker is SIGKILLed (or SIGTERMed, handing
its jobs back) while every stream is mid-generation, and a second worker takes
the jobs over. For greedy, sampled-unseeded (seeded at admission), seeded,
n=2, logprobs, tools and JSON-schema requests, in float32 and bfloat16:

- every client's streamed text equals the job's final text (no splice), and
- the final text equals an uninterrupted run of the same request (same seed),
- the new attempt continued from the published tokens (its ``restarted`` event
  carries resume points) instead of generating them again.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
import redis
from openai import OpenAI

from inferq.schemas import keys
from inferq.schemas.fold import Assembly
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import Fleet, pending_count, reply_events, wait_for

MODEL = "migration"
MAX_TOKENS = 40
# A name of 100+ characters cannot close within MAX_TOKENS: the job is still running when its
# worker stops (a short object could finish inside the SIGTERM drain and never be taken over).
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "minLength": 100}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
# name -> the request's options (beyond model and messages)
REQUESTS = {
    "greedy": dict(temperature=0, extra_body={"ignore_eos": True}),
    "greedy-logprobs": dict(temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True}),
    "sampled": dict(temperature=0.9, extra_body={"ignore_eos": True}),
    "sampled-2": dict(temperature=0.9, top_p=0.9, extra_body={"ignore_eos": True}),
    "seeded": dict(temperature=0.9, seed=1234, extra_body={"ignore_eos": True}),
    "n2": dict(temperature=0.9, n=2, extra_body={"ignore_eos": True}),
    "tools": dict(temperature=0.9, extra_body={"ignore_eos": True}, tools=[{"type": "function", "function": {
        "name": "lookup", "description": "Look a word up", "parameters": {
            "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]),
    "json": dict(temperature=0.9, response_format={"type": "json_schema",
                                                   "json_schema": {"name": "person", "schema": SCHEMA}}),
}


@dataclass
class Stream:
    name: str
    job_id: str = ""
    text: dict = field(default_factory=dict)  # choice index -> what the client was shown
    error: BaseException | None = None

    def shown(self) -> int:
        return min((len(t) for t in self.text.values()), default=0)


def stream(client: OpenAI, name: str, out: Stream) -> None:
    try:
        chunks = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Tell me about {name}"}],
            max_tokens=MAX_TOKENS, stream=True, **REQUESTS[name])
        for c in chunks:
            out.job_id = c.id.removeprefix("chatcmpl-")
            for ch in c.choices:
                out.text[ch.index] = out.text.get(ch.index, "") + (ch.delta.content or "")
    except BaseException as e:  # surfaced by the assertions
        out.error = e


def final_texts(r: redis.Redis, job_id: str) -> dict:
    asm = Assembly()
    for ev in reply_events(r, job_id):
        asm.feed(ev)
    assert asm.done is not None, (job_id, asm.error_code, asm.error_message)
    return {c.index: c.text for c in asm.choices()}


def rerun(client: OpenAI, name: str, seed) -> dict:
    """The same request, uninterrupted, with the seed its job had."""
    opts = dict(REQUESTS[name])
    if seed is not None:
        opts["seed"] = seed
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Tell me about {name}"}],
                                          max_tokens=MAX_TOKENS, **opts)
    return {c.index: c.message.content for c in resp.choices}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_taken_over_job_continues_its_stream(chaos, tmp_path, dtype, how):
    r = chaos.client()
    model = f"{MODEL}"
    fleet = Fleet(chaos.url, chaos.fleet.model_folder, model, tmp_path, "--reply-ttl", "120", "--max-num-seqs", "16",
                  "--dtype", dtype, "--drain-timeout", "0.5")
    first, second = f"mig-{how}-{dtype}-a", f"mig-{how}-{dtype}-b"
    # Paced so the interruption lands mid-generation on any machine (40 tokens >= 2 s).
    fleet.start(first, extra=("--step-pace-s", "0.05"))
    try:
        with running_gateway(chaos.url, producer={"default_model": model}, models=model) as gw:
            client = OpenAI(base_url=f"{gw}/v1", api_key="none", max_retries=0, timeout=300)
            streams = {name: Stream(name) for name in REQUESTS}
            threads = [threading.Thread(target=stream, args=(client, name, s), daemon=True)
                       for name, s in streams.items()]
            for t in threads:
                t.start()
            n_choices = {"n2": 2}
            wait_for(lambda: all(len(s.text) == n_choices.get(s.name, 1) and s.shown() >= 8
                                 for s in streams.values()), 240, what="every stream showing text")
            victim = fleet.workers[first]
            if how == "sigkill":
                victim.kill()
            else:
                victim.proc.terminate()  # drains 0.5 s, then hands the rest back
                victim.proc.wait(60)
            fleet.start(second)
            for t in threads:
                t.join(300)

            for name, s in streams.items():
                assert s.error is None, (name, s.error)
                final = final_texts(r, s.job_id)
                assert s.text == final, f"{name}: the client was shown {s.text!r}, the job's text is {final!r}"
                events = reply_events(r, s.job_id)
                restarts = [e for e in events if e.type == "restarted"]
                assert len(restarts) == 1, (name, [e.type for e in events])
                assert restarts[0].resume, f"{name}: the new attempt started over instead of continuing"
                assert sum(p.tokens for p in restarts[0].resume) > 0
                info = r.hgetall(keys.job_info(s.job_id))
                seed = info.get(b"seed", b"").decode() or None
                if REQUESTS[name].get("temperature"):
                    assert seed is not None, f"{name}: a sampled job gets a seed at admission"
                again = rerun(client, name, None if seed is None else int(seed))
                assert again == final, f"{name}: uninterrupted {again!r} vs taken over {final!r}"
            assert pending_count(r, model) == 0
            assert r.xlen(keys.dlq(model)) == 0
    finally:
        fleet.stop_all()
        r.close()
