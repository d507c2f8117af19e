"""The pure parts of the dashboard: the TTFT quantile from histogram buckets
(as Prometheus' histogram_quantile computes it) and a reply stream read as a
timeline of attempts, with real encoded events."""
import math

from inferq.schemas import encode_event
from inferq.schemas.events import DeltaEvent, DoneEvent, QueuedEvent, RestartedEvent, StartedEvent
from inferq.producer.gateway.dashboard import timeline
from inferq.producer.gateway.dashboard.sampler import quantile


def test_quantile_interpolates_inside_the_bucket():
    # 10 observations: 4 in (0, 0.1], 6 in (0.1, 0.5].
    buckets = {0.1: 4.0, 0.5: 10.0, math.inf: 10.0}
    assert quantile(0.2, buckets) == 0.05
    assert abs(quantile(0.7, buckets) - 0.3) < 1e-9
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, math.inf: 5.0}) == 0.1  # the open top bucket: its lower edge


def entry(ms, ev):
    return (f"{ms}-0", encode_event(ev))


def test_a_restarted_job_reads_as_two_attempts():
    entries = [
        entry(1000, QueuedEvent(attempt=0, seq=0, model="m")),
        entry(1100, StartedEvent(attempt=1, seq=0, worker="a")),
        entry(1200, DeltaEvent(attempt=1, seq=1, text="Hel", token_ids=[1])),
        entry(5000, RestartedEvent(attempt=2, seq=0, reason="redelivered")),
        entry(5001, StartedEvent(attempt=2, seq=1, worker="b")),
        entry(5100, DeltaEvent(attempt=2, seq=2, text="Hi", token_ids=[7])),
        entry(5200, DeltaEvent(attempt=2, seq=3, text="!", token_ids=[8])),
        entry(5300, DoneEvent(attempt=2, seq=4, finish_reason="stop")),
    ]
    view = timeline.build(entries)
    assert [(t["type"], t["attempt"]) for t in view["timeline"]] == [
        ("queued", 0), ("started", 1), ("first_token", 1), ("restarted", 2), ("started", 2), ("first_token", 2),
        ("done", 2)]
    a1, a2 = view["attempts"]
    assert (a1["worker"], a1["outcome"], a1["tokens"], a1["ended_at"]) == ("a", "superseded", 1, None)
    assert (a2["worker"], a2["outcome"], a2["tokens"], a2["first_token_at"]) == ("b", "done", 2, 5.1)
    assert view["text"] == "Hi!" and view["finished"] and view["finish_reason"] == "stop"
