"""Fuzz: arbitrary entries written straight to the job stream (XADD), past the
SDK's validation. Each one either runs to ``done`` or ends as a clear error: a
DLQ entry with a code and reason, plus an ``error`` event on the reply stream
when the payload carries a readable job id. The workers never crash."""
from __future__ import annotations

import json
import re
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings

from inferq.schemas import decode_event, keys
from tests.reliability.conftest import MODEL, pending_count, wait_for
from tests.reliability.fuzz_inputs import stream_entry

N_CASES = 2500
ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
KNOWN_CODES = {"invalid_job", "unknown_model", "prompt_too_long", "invalid_prompt", "empty_prompt",
               "invalid_messages", "no_chat_template", "unsupported", "invalid_request", "max_deliveries",
               "engine_error"}


def readable_id(fields: dict):
    try:
        job = json.loads(fields["job"])
    except Exception:
        return None
    jid = job.get("id") if isinstance(job, dict) else None
    return jid if isinstance(jid, str) and ID_RE.match(jid) else None


def test_stream_fuzz_every_entry_ends_clearly(fleet, r):
    stream = keys.jobs(MODEL)
    cases: list[tuple[str, str, dict]] = []  # (entry id, kind, fields)

    @settings(max_examples=N_CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(stream_entry(MODEL))
    def add(case):
        kind, fields = case
        if kind in ("valid", "mutated"):
            # A fresh id per case (unless the mutation rewrote it), so outcomes can be told apart.
            job = json.loads(fields["job"])
            if isinstance(job, dict) and ("id" not in job or kind == "valid"):
                job["id"] = uuid.uuid4().hex
                fields = {"job": json.dumps(job)}
        entry_id = r.xadd(stream, fields).decode()
        cases.append((entry_id, kind, fields))

    add()
    assert len(cases) >= 2000
    wait_for(lambda: r.xlen(stream) == 0 and pending_count(r, MODEL) == 0, 300, interval=0.5,
             what="every fuzzed entry processed")

    dlq = {f[b"entry_id"].decode(): f for _, f in r.xrange(keys.dlq(MODEL))}
    outcomes: Counter = Counter()
    for entry_id, kind, fields in cases:
        jid = readable_id(fields)
        if entry_id in dlq:
            d = dlq[entry_id]
            code, reason = d[b"code"].decode(), d[b"reason"].decode()
            assert code in KNOWN_CODES and len(reason) > 10, (fields, code, reason)
            outcomes[f"dlq:{code}"] += 1
            if jid is not None and d[b"job_id"]:
                events = [decode_event(f) for _, f in r.xrange(keys.reply(jid))]
                assert any(e.type == "error" and e.code == code for e in events), (fields, events)
        else:
            assert jid is not None, ("an entry without a readable id was neither run nor dead-lettered", fields)
            events = [decode_event(f) for _, f in r.xrange(keys.reply(jid))]
            done = [e for e in events if e.type == "done"]  # (a mutated id may be shared by several cases)
            assert done, (fields, events)
            outcomes[f"done:{done[-1].finish_reason}"] += 1

    for w in fleet.workers.values():
        assert w.proc.poll() is None, w.log()[-3000:]
        assert "crashed" not in w.log()
    # The workers still serve ordinary jobs.
    from inferq.producer import Producer

    with Producer(fleet.redis_url, default_model=MODEL) as p:
        assert p.submit("still alive?", sampling={"max_tokens": 2}).result(timeout=60).usage.completion_tokens == 2
    print(f"\n[reliability] stream fuzz: {len(cases)} entries, outcomes {dict(sorted(outcomes.items()))}")
    r.delete(keys.dlq(MODEL))
