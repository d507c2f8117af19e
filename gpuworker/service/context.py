"""Names and limits every thread of one worker shares."""
from __future__ import annotations

from dataclasses import dataclass, field

from inferq.schemas import keys
from inferq.schemas.queues import Lane


@dataclass(frozen=True)
class WorkerContext:
    model: str
    consumer: str
    lease_seconds: float
    max_deliveries: int
    reply_ttl: int  # a job's keys live this long after done/error
    reply_maxlen: int
    live_ttl: int = 86_400  # ... and this long while it waits or runs
    log_prompts: bool = False
    dlq_maxlen: int = 10_000
    dlq_max_age_s: int = 7 * 86_400
    dlq_redact: bool = False
    # Lanes (schemas/queues.py): how the intake picks the next job.
    tenant_weights: dict = field(default_factory=dict)  # fair-share weight per tenant (default 1)
    tenant_max_running: int = 0  # most jobs of one tenant in this worker at once; 0 = no cap
    interactive_reserve: int = 0  # interactive jobs taken past capacity while batch jobs run (preempted)
    idle_poll_ms: int = 50  # with several lanes: how often an idle worker looks at the others
    steal_after_ms: int = 1000  # a job on another worker's affinity lane waits this long before others take it
    session_ttl: int = 600  # how long a session remembers the worker that served it

    @property
    def default_lane(self) -> Lane:
        return Lane(self.model)

    @property
    def stream(self) -> str:
        """The default lane's stream (partition 0, interactive)."""
        return self.default_lane.stream

    @property
    def group(self) -> str:
        return keys.JOBS_GROUP


    @property
    def workers_key(self) -> str:
        return keys.workers(self.model)
