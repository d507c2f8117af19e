"""The serve benchmark's arithmetic: known timestamps in, known numbers out."""
from __future__ import annotations

import math

import pytest

from inferq.bench.metrics import (
    RequestRecord,
    compute_metrics,
    meets_slos,
    parse_goodput,
    percentile,
    summarize,
    throughput_timeline,
)


def rec(sent, chunks, out, prompt=10, ok=True):
    return RequestRecord(sent_at=sent, chunk_times=list(chunks), prompt_tokens=prompt, output_tokens=out, success=ok)


def test_per_request_ttft_itl_tpot_e2e():
    r = rec(1.0, [1.5, 1.6, 1.8, 2.1], out=4)
    assert r.ttft == pytest.approx(0.5)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])
    assert r.e2e == pytest.approx(1.1)
    # (E2E - TTFT) / (out - 1) = 0.6 / 3
    assert r.tpot == pytest.approx(0.2)


def test_tpot_uses_token_count_not_chunk_count():
    # Two chunks carrying 7 tokens: TPOT spreads the decode time over 6 gaps.
    r = rec(0.0, [0.4, 1.0], out=7)
    assert r.tpot == pytest.approx(0.6 / 6)
    assert r.itls == pytest.approx([0.6])


def test_single_token_and_empty_requests_have_no_tpot():
    assert rec(0.0, [0.3], out=1).tpot is None
    empty = rec(0.0, [], out=0, ok=False)
    assert empty.ttft is None and empty.e2e is None and empty.tpot is None and empty.itls == []


def test_percentile_interpolates_like_numpy():
    vals = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(vals, 50) == pytest.approx(5.5)
    assert percentile(vals, 99) == pytest.approx(9.91)
    assert percentile(vals, 0) == 1 and percentile(vals, 100) == 10
    assert percentile([4.0], 99) == 4.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(vals, 101)


def test_summarize_in_milliseconds():
    s = summarize([0.1, 0.2, 0.3, 0.4], [90])
    assert s["mean"] == pytest.approx(250.0)
    assert s["median"] == pytest.approx(250.0)
    assert s["p90"] == pytest.approx(370.0)
    assert s["std"] == pytest.approx(math.sqrt(((150**2) + (50**2)) * 2 / 4))


def test_compute_metrics_pools_itl_and_counts_failures():
    records = [
        rec(0.0, [0.2, 0.3, 0.5], out=3, prompt=5),   # ttft .2, itls .1 .2, tpot .15, e2e .5
        rec(1.0, [1.4, 1.5], out=2, prompt=7),        # ttft .4, itls .1,    tpot .1,  e2e .5
        rec(2.0, [], out=0, prompt=9, ok=False),
    ]
    records[2].error = "HTTP 503: no worker"
    m = compute_metrics(records, duration_s=2.5, percentiles=[50, 90])
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["total_input_tokens"] == 12 and m["total_output_tokens"] == 5
    assert m["request_throughput"] == pytest.approx(2 / 2.5)
    assert m["output_throughput"] == pytest.approx(5 / 2.5)
    assert m["total_token_throughput"] == pytest.approx(17 / 2.5)
    assert m["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert m["ttft_ms"]["median"] == pytest.approx(300.0)
    # pooled ITL: 100, 200, 100 ms
    assert m["itl_ms"]["mean"] == pytest.approx(400.0 / 3)
    assert m["itl_ms"]["median"] == pytest.approx(100.0)
    assert m["itl_ms"]["p90"] == pytest.approx(180.0)
    assert m["tpot_ms"]["mean"] == pytest.approx(125.0)
    assert m["e2e_ms"]["p99"] == pytest.approx(500.0)
    assert m["errors"] == ["HTTP 503: no worker"]
    assert "goodput" not in m


def test_goodput_counts_requests_meeting_every_slo():
    records = [
        rec(0.0, [0.1, 0.2, 0.3], out=3),   # ttft 100, tpot 100, e2e 300
        rec(0.0, [0.3, 0.35], out=2),       # ttft 300 (misses ttft:200)
        rec(0.0, [0.1, 0.5], out=2),        # tpot 400 (misses tpot:150)
        rec(0.0, [0.05], out=1),            # no TPOT: only ttft and e2e apply
        rec(0.0, [], out=0, ok=False),      # failed requests are never good
    ]
    slos = parse_goodput(["ttft:200", "tpot:150"])
    assert slos == {"ttft": 0.2, "tpot": 0.15}
    assert [meets_slos(r, slos) for r in records] == [True, False, False, True, False]
    m = compute_metrics(records, duration_s=2.0, slos=slos)
    assert m["good_requests"] == 2
    assert m["goodput"] == pytest.approx(1.0)
    assert m["slos_ms"] == {"ttft": pytest.approx(200.0), "tpot": pytest.approx(150.0)}


def test_parse_goodput_forms_and_errors():
    assert parse_goodput("ttft:500,e2e:2000") == {"ttft": 0.5, "e2e": 2.0}
    assert parse_goodput(None) == {}
    for bad in (["itl:5"], ["ttft"], ["ttft:abc"], ["tpot:-1"]):
        with pytest.raises(ValueError, match="goodput SLO"):
            parse_goodput(bad)


def test_throughput_timeline_bins_tokens_by_chunk_arrival():
    records = [rec(0.0, [0.5, 1.5], out=4), rec(0.0, [1.2], out=1), rec(0.0, [], out=0, ok=False)]
    xs, ys = throughput_timeline(records, start=0.0, bin_s=1.0)
    assert xs == [0.5, 1.5]
    assert ys == pytest.approx([2.0, 3.0])
    assert sum(ys) == pytest.approx(5.0)


def test_compute_metrics_rejects_zero_duration():
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)
