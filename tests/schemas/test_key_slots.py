"""Every atomic step touches one Redis Cluster slot, for any partition count:
the keys each Lua script declares are computed here exactly as the callers
compute them and hashed with redis-py's own CRC16 slot function."""
from __future__ import annotations

import pytest
from redis.crc import key_slot

from inferq.producer.admission import lane_for, script_keys
from inferq.producer.settings import ProducerSettings
from inferq.schemas import keys, transitions
from inferq.schemas.job import Job
from inferq.schemas.queues import Lane, lane_of


def slots(names) -> set[int]:
    return {key_slot(n.encode()) for n in names}


@pytest.fixture(params=[1, 2, 3, 8])
def partitions(request, monkeypatch):
    monkeypatch.setenv("INFERQ_PARTITIONS", str(request.param))
    return request.param


@pytest.mark.parametrize("fair", [False, True])
@pytest.mark.parametrize("cls", ["interactive", "batch"])
def test_the_admission_script_touches_one_slot(partitions, fair, cls):
    s = ProducerSettings(fair_share=fair)
    for i in range(50):
        job = Job(model="m", prompt="x", tenant="acme" if i % 2 else None, priority_class=cls)
        lane = lane_for(job, s, owner="worker-7" if i % 5 == 0 else "")
        names = script_keys(job, f"key-{i}" if i % 3 else None, lane)
        assert len(slots(names)) == 1, names


def test_every_fenced_script_touches_one_slot(partitions):
    captured = []

    class Recorder:
        def eval(self, _src, n, *rest):
            captured.append(list(rest[:n]))

    for i in range(50):
        jid = f"job-{i}"
        lane = lane_of("m", jid, "batch" if i % 2 else "interactive", "t" if i % 3 else "", "w" if i % 5 else "")
        common = dict(stream=lane.stream, entry_id="1-0", consumer="w", job_id=jid)
        transitions.claim_attempt(Recorder(), live_ttl=1, **common)
        transitions.start(Recorder(), attempt=1, events=[], fields={}, live_ttl=1, reply_maxlen=100, **common)
        transitions.finish(Recorder(), attempt=1, event={"type": "done", "data": "{}"}, fields={}, ttl_after_done=1,
                           reply_maxlen=100, **common)
        from inferq.schemas.records import DeadLetter
        dead = DeadLetter(job="{}", job_id=jid, entry_id="1-0", code="c", reason="r", attempts=1, worker="w",
                          failed_at=0.0)
        for job_id in (jid, None):
            transitions.fail(Recorder(), stream=lane.stream, dlq=lane.dlq, entry_id="1-0", consumer="w", attempt=1,
                             job_id=job_id, error_data="{}", fields={}, dead=dead, dlq_maxlen=10, ttl_after_done=1,
                             reply_maxlen=100)
        transitions.request_cancel(Recorder(), job_id=jid, ttl=1)
    for names in captured:
        assert len(slots(names)) == 1, names


def test_partitions_spread_over_the_slot_range(partitions):
    """Partition k hashes into the k-th equal share of the 16384 slots, so a
    cluster with contiguous slot ranges gets the partitions spread evenly."""
    for k in range(partitions):
        slot = key_slot(keys.jobs("m", k).encode())
        assert k * 16384 // partitions <= slot < (k + 1) * 16384 // partitions


def test_job_ids_spread_over_partitions(partitions):
    seen = {keys.partition_of(f"job-{i}") for i in range(200)}
    assert seen == set(range(partitions))


def test_lane_names_read_back():
    lane = Lane("my-model", 0, "batch", "acme")
    assert keys.name_of(lane.stream).split("::")[0] == "my-model"
    assert Lane("m").stream == "inferq:jobs:{p0}:m"


def test_a_bad_partition_count_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("INFERQ_PARTITIONS", "zero")
    with pytest.raises(ValueError, match="INFERQ_PARTITIONS"):
        keys.partitions()
