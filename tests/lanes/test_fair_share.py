"""Fair share between tenants: tenant A floods the queue, tenant B submits a
few jobs afterwards. With fair share on, each tenant waits on a lane of its
own and the worker serves the lanes in weighted fair order, so B's jobs start
within a few jobs of arriving; with it off, they wait behind all of A's.
Measured as start order (which the queue decides), not as time."""
from __future__ import annotations

import pytest

from inferq.producer import Producer
from inferq.schemas import keys
from inferq.schemas.queues import lanes_of

TINY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 2}


def start_ranks(r, a, b) -> list[int]:
    """B's jobs' places in the order all jobs started (0 = first)."""
    order = sorted(a + b, key=lambda h: float(r.hget(keys.job_info(h.id), "started_at")))
    rank = {h.id: i for i, h in enumerate(order)}
    return sorted(rank[h.id] for h in b)


@pytest.mark.parametrize("fair", [True, False], ids=["fair-share", "one-lane"])
def test_a_flooding_tenant_delays_another_by_no_more_than_its_share(module_redis, tiny_model, start_worker, fair):
    served = f"fair-{fair}"
    p = Producer(module_redis.url, default_model=served, fair_share=fair)
    a = [p.submit(prompt_token_ids=[5, i % 50 + 1], sampling=TINY, tenant="tenant-a") for i in range(500)]
    b = [p.submit(prompt_token_ids=[7, i + 1], sampling=TINY, tenant="tenant-b") for i in range(10)]
    tenants = {ln.tenant for ln in lanes_of(p.redis, served)}
    assert tenants == ({"", "tenant-a", "tenant-b"} if fair else {""})
    start_worker(module_redis.url, tiny_model, served, f"w-fair-{fair}", "--max-num-seqs", "4")
    for h in a + b:
        h.result(timeout=300)
    ranks = start_ranks(p.redis, a, b)
    if fair:
        # Equal weights and equal job sizes: the two lanes alternate, so B's k-th
        # job starts about 2k-th (plus the slots A filled before B's first read).
        assert ranks[-1] <= 2 * len(b) + 4, ranks
    else:
        assert ranks[0] >= len(a), ranks
    p.close()


def test_weights_and_the_tenant_cap(module_redis, tiny_model, start_worker):
    """Weight 3 for A against 1 for B: A gets ~3 of every 4 starts while both wait."""
    served = "fair-weights"
    p = Producer(module_redis.url, default_model=served, fair_share=True)
    a = [p.submit(prompt_token_ids=[5, i % 50 + 1], sampling=TINY, tenant="tenant-a") for i in range(120)]
    b = [p.submit(prompt_token_ids=[7, i % 50 + 1], sampling=TINY, tenant="tenant-b") for i in range(120)]
    start_worker(module_redis.url, tiny_model, served, "w-weights", "--max-num-seqs", "4",
                 "--tenant-weights", "tenant-a=3,tenant-b=1", "--tenant-max-running", "3")
    for h in a + b:
        h.result(timeout=300)
    order = sorted(a + b, key=lambda h: float(p.redis.hget(keys.job_info(h.id), "started_at")))
    first = order[:80]
    share_a = sum(1 for h in first if h in a) / len(first)
    assert 0.65 <= share_a <= 0.85, share_a
    p.close()
