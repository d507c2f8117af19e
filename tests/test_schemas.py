"""The wire contract rejects nonsense with a message that names the field."""
import pytest
from pydantic import ValidationError

from inferq.schemas import DeltaEvent, DoneEvent, ErrorEvent, Job, SamplingParams, decode_event, encode_event, keys


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_sampling_params_reject_nonsense(bad, field):
    with pytest.raises(ValidationError) as e:
        SamplingParams(**bad)
    assert field in str(e.value)


def test_sampling_defaults_and_stop_string():
    p = SamplingParams(stop="END")
    assert p.stop == ["END"] and p.max_tokens == 16 and not p.greedy
    assert SamplingParams(temperature=0).greedy
    # Greedy choices are allowed (they equal a single request's text, as in vLLM).
    assert SamplingParams(n=2, temperature=0).n == 2
    with pytest.raises(ValidationError, match="min_tokens"):
        SamplingParams(min_tokens=20, max_tokens=10)


def test_job_needs_exactly_one_prompt_kind():
    with pytest.raises(ValidationError, match="exactly one"):
        Job(model="m")
    with pytest.raises(ValidationError, match="exactly one"):
        Job(model="m", prompt="a", prompt_token_ids=[1])
    with pytest.raises(ValidationError, match="role"):
        Job(model="m", messages=[{"role": "wizard", "content": "hi"}])
    job = Job(model="m", messages=[{"role": "user", "content": "hi"}], sampling={"max_tokens": 3})
    assert Job.from_fields(job.to_fields()) == job


def test_job_rejects_bad_ids_and_unknown_fields():
    with pytest.raises(ValidationError):
        Job(id="has space", model="m", prompt="x")
    with pytest.raises(ValidationError, match="non-negative"):
        Job(model="m", prompt_token_ids=[1, -5])
    with pytest.raises(ValidationError, match="extra"):
        Job.model_validate({"model": "m", "prompt": "x", "surprise": True})


def test_events_round_trip_through_stream_fields():
    for ev in [
        DeltaEvent(text="hé", token_ids=[1, 2], attempt=2, seq=5, logprobs=[{1: -0.1}]),
        DoneEvent(finish_reason="length", attempt=1, seq=9),
        ErrorEvent(code="bad_request", message="nope"),
    ]:
        fields = encode_event(ev)
        raw = {k.encode(): v.encode() for k, v in fields.items()}  # as redis-py returns them
        assert decode_event(raw) == ev


def test_a_jobs_keys_share_its_partitions_hash_tag():
    tag = keys.job_tag("j1")
    assert {keys.tag_of(k) for k in (keys.reply("j1"), keys.cancel("j1"), keys.job_info("j1"))} == {tag}
    assert keys.name_of(keys.reply("j1")) == "j1" and keys.name_of(keys.dlq("m")) == "m"


@pytest.mark.parametrize("fields", [
    {"prompt": "a\ud800b"},
    {"messages": [{"role": "user", "content": "\udfff"}]},
    {"prompt": "ok", "sampling": {"stop": ["x\ud800"]}},
    {"prompt": "ok", "metadata": {"k": "\ud800"}},
])
def test_lone_surrogates_are_refused_with_a_clear_message(fields):
    with pytest.raises(ValueError, match="lone surrogate|unicode string"):
        Job(model="m", **fields)


def test_best_of_is_at_least_n_capped_and_ranked_by_logprobs():
    assert SamplingParams(n=2).num_sequences == 2 and not SamplingParams(n=2).ranks_choices
    p = SamplingParams(n=2, best_of=3)
    assert p.num_sequences == 3 and p.ranks_choices
    assert not SamplingParams(n=2, best_of=2).ranks_choices
    with pytest.raises(ValidationError, match=r"best_of \(1\) must be at least n \(2\)"):
        SamplingParams(n=2, best_of=1)
    with pytest.raises(ValidationError, match="best_of=17 exceeds the limit of 16"):
        SamplingParams(best_of=17)
    with pytest.raises(ValidationError, match="best_of"):
        SamplingParams(best_of=0)
    # Ranking sums logprobs: a request reporting logits cannot be ranked.
    with pytest.raises(ValidationError, match="ranks sequences by logprobs"):
        SamplingParams(best_of=2, logprobs=1, logprobs_mode="raw_logits")
    assert SamplingParams(best_of=2, logprobs=1, logprobs_mode="processed_logprobs").ranks_choices
