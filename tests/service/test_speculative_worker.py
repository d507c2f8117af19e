"""Speculative decoding in a real worker process on a real redis-server: a
queued job's text is the offline non-speculative engine's, the spec_decode
counters move, `inferq doctor` reads them, and a bad --speculative-config is a
clear start-up error."""
from __future__ import annotations

import subprocess
import sys

import pytest

from inferq.producer.engine_limits import Sample, diagnose
from inferq.schemas import SamplingParams
from tests.service.conftest import module_producer, wait_for
from tests.workers import WorkerProc

MODEL = "tiny-spec"
SPEC = '{"method": "ngram", "k": 4, "min_n": 1}'


@pytest.fixture(scope="module")
def smol():
    """The bundled SmolLM2 (it copies; the tiny random model never repeats itself) and its offline twin."""
    import torch

    from inferq.gpuworker import LLM
    from inferq.gpuworker.models.loader import bundled_model_path

    torch.set_num_threads(1)
    return bundled_model_path(), LLM(dtype="float32")


@pytest.fixture(scope="module")
def worker(module_redis, smol, tmp_path_factory):
    w = WorkerProc(module_redis.url, smol[0], MODEL, tmp_path_factory.mktemp("wlog"), "spec-1",
                   "--speculative-config", SPEC, "--dtype", "float32", metrics=True)
    w.wait_ready()
    yield w
    w.terminate()


@pytest.fixture
def p(module_redis):
    yield from module_producer(module_redis, MODEL)


def test_queued_greedy_jobs_equal_the_offline_engine_and_counters_move(worker, p, smol):
    import urllib.request

    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    before = Sample.from_text(urllib.request.urlopen(url, timeout=5).read().decode())
    doc = "Order 5531: two lamps, one desk, four chairs; ship to 9 Elm Road, Leeds, by Friday."
    prompts = [f"Repeat exactly: {doc}\n{doc}\n", f"Copy this line: {doc}\nCopy: ", "1, 2, 3, 4, 5, 6,"]
    sampling = {"max_tokens": 40, "temperature": 0.0, "ignore_eos": True}
    handles = [p.submit(x, sampling=sampling) for x in prompts]
    results = [h.result(timeout=120) for h in handles]
    want = smol[1].generate(prompts, SamplingParams(**sampling))
    assert [r.text for r in results] == [w.text for w in want]
    assert all(r.usage.completion_tokens == 40 for r in results)
    accepted = wait_for(lambda: worker.metric("inferq:spec_decode_num_accepted_tokens_total"), 10,
                        what="accepted proposals counted")
    assert 0 < accepted <= worker.metric("inferq:spec_decode_num_draft_tokens_total")
    assert 0 < worker.metric("inferq:spec_decode_acceptance_rate") <= 1
    after = Sample.from_text(urllib.request.urlopen(url, timeout=5).read().decode())
    readings = diagnose(before, after).readings
    assert readings["speculative"] == "ngram k=4 n=1..4 max_batch=16"
    assert readings["spec_proposed_tokens_in_window"] > 0 and 0 < readings["spec_acceptance_rate"] <= 1
    assert worker.metric("inferq:engine_invariant_failures_total") == 0


def test_a_bad_speculative_config_stops_the_worker_with_the_reason(module_redis, tiny_model):
    proc = subprocess.run([sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", module_redis.url,
                           "--model", str(tiny_model), "--speculative-config", '{"method": "ngram", "k": 0}'],
                          capture_output=True, text=True, timeout=600)  # a loaded machine imports slowly
    assert proc.returncode != 0
    assert "speculative-config" in proc.stderr and "k" in proc.stderr


def test_doctor_says_off_when_the_worker_does_not_speculate():
    text = 'inferq:worker_config_info{max_num_seqs="8",speculative_config=""} 1.0\ninferq:num_requests_running 0\n'
    s = Sample.from_text(text, at=0.0)
    assert diagnose(s, Sample.from_text(text, at=1.0)).readings["speculative"] == "off"
