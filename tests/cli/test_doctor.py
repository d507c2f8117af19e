"""The doctor's reading of worker metrics: which limit binds, and the advice."""
from inferq.doctor import Sample, diagnose, parse_metrics

CONFIG = {"max_num_seqs": "64", "max_num_batched_tokens": "2048", "num_kv_blocks": "1000", "block_size": "16"}


def pair(**after):
    before = Sample(at=0.0, config=CONFIG)
    fields = {"at": 10.0, "config": CONFIG, **after}
    return before, Sample(**fields)


def test_preemptions_mean_kv_cache():
    r = diagnose(*pair(preemptions=7, kv_usage=0.99, running=40, waiting=10, steps=100,
                       prompt_tokens=1000, generation_tokens=4000))
    assert r.bottleneck == "kv_cache"
    assert "7 preemption" in r.findings[0].summary
    assert "--num-kv-blocks 1500" in r.findings[0].advice


def test_full_prefill_steps_with_backlog_mean_token_budget():
    r = diagnose(*pair(steps=10, prompt_tokens=19000, generation_tokens=500, running=30, waiting=20,
                       kv_usage=0.4))
    assert r.bottleneck == "token_budget"
    assert "--max-num-batched-tokens (e.g. 4096)" in r.findings[0].advice


def test_running_at_cap_with_free_kv_means_max_num_seqs():
    r = diagnose(*pair(running=64, consumer_lag=50, kv_usage=0.3, steps=100, prompt_tokens=500,
                       generation_tokens=6400))
    assert r.bottleneck == "max_num_seqs"
    assert "--max-num-seqs (e.g. 128)" in r.findings[0].advice
    assert "room for about 213 sequences" in r.findings[0].advice  # 1000 blocks / (0.3*1000/64)


def test_idle_worker_has_headroom():
    r = diagnose(*pair())
    assert r.bottleneck == "none" and "idle" in r.findings[0].summary


def test_backlog_without_an_engine_limit_means_add_workers():
    r = diagnose(*pair(running=20, consumer_lag=5, kv_usage=0.5, steps=100, generation_tokens=2000))
    assert r.bottleneck == "queue" and "add workers" in r.findings[0].advice


def test_parse_metrics_reads_labels_and_sums():
    text = ('# HELP x\ninferq:num_requests_running{model_name="m"} 3.0\n'
            'inferq:worker_config_info{max_num_seqs="8",model="a \\"b\\""} 1.0\n')
    m = parse_metrics(text)
    assert m["inferq:num_requests_running"] == [({"model_name": "m"}, 3.0)]
    s = Sample.from_text(text)
    assert s.running == 3.0 and s.config["max_num_seqs"] == "8"


def test_doctor_shows_the_workers_eos_set():
    text = 'inferq:worker_config_info{dtype="bfloat16",eos_token_ids="128001,128009",max_num_seqs="8"} 1.0\n'
    s = Sample.from_text(text)
    assert diagnose(s, s).readings["eos_token_ids"] == "128001,128009"
    assert diagnose(s, s).readings["dtype"] == "bfloat16"  # the engine's choice (bf16 on CPUs with AVX512-BF16/AMX)
