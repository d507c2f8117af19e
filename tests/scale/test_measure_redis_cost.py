"""`inferq bench redis-cost` (inferq.bench.redis_cost), small: it runs end to end against a real
redis-server and a real worker, and its accounting adds up (events per job,
the per-token command mix)."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.timeout(600)
def test_measure_redis_cost_smoke(tmp_path):
    out = tmp_path / "cost.json"
    tokens = 8
    r = subprocess.run([sys.executable, "-m", "inferq.bench.redis_cost", "--jobs", "4",
                        "--tokens", str(tokens), "--idle-s", "1", "--lease-held", "16", "--no-aof",
                        "--json", str(out)], capture_output=True, text=True, timeout=540,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    # queued, started, 1 delta, done; then one more delta per extra token.
    assert d["events_short_phase_per_job"] == 4
    assert d["events_long_phase_per_job"] == 3 + tokens
    ev = d["per_event"]
    # Each extra token: exactly one reply XADD; the cancel EXISTS is per job in
    # flight per publish round trip: one per token while the publisher keeps up, down
    # to 1/8 when an engine faster than the round trips queues steps (one round trip
    # carries up to --max-flush-steps 8 of them; seen on a fast CI machine: 0.43).
    assert ev["calls"]["xadd"] == pytest.approx(1.0)
    assert 1 / 8 <= ev["calls"]["exists"] <= 2.0
    assert 1.0 < ev["commands"] <= 4.0  # the XADD plus its share of the round trip (EXISTS, MULTI/EXEC)
    assert ev["bytes_in"] > 0
    # Per-event CPU is the difference of two phases' CPU; at this smoke size (28 extra
    # events) the idle background's jitter can outweigh it, so only each phase's own
    # CPU must be positive here (the full-size run in docs/ quotes per-event figures).
    assert d["per_job"]["cpu_us"] > 0 and d["long_phase_cpu_us"] > 0
    job = d["per_job"]
    assert job["calls"]["evalsha"] == 1.0 and job["calls"]["xack"] == 1.0 and job["calls"]["xdel"] == 1.0
    # One XPENDING + one XCLAIM per round: the worker is stopped before the replayed rounds,
    # so its own lease round (an XPENDING) cannot land in the server's counters.
    lease_calls = dict(d["lease_refresh_round"]["calls"])
    assert lease_calls.pop("xclaim") == 1.0 and lease_calls.pop("xpending") == 1.0, d["lease_refresh_round"]
    assert all(v < 0.1 for v in lease_calls.values()), lease_calls
