"""CLI commands about queues rather than one job: status and dlq."""
from __future__ import annotations

import json
import time

from rich.table import Table

from schemas import Job, keys
from schemas.records import DeadLetter
from schemas.text import as_str
from inferq.cli_common import err, friendly_errors, out, producer
from schemas.connection import redact_url
from producer.errors import InferqError
from producer.queue_stats import all_stats, discover_models


@friendly_errors
def cmd_status(args) -> int:
    p = producer()
    stats = all_stats(p.redis, p.settings.worker_stale_seconds)
    if args.json:
        out.print(json.dumps([s.as_dict() for s in stats], indent=2), markup=False)
        return 0
    out.print(f"Redis: {redact_url(p.settings.redis_url)}")
    if not stats:
        out.print("no models yet: no job submitted and no worker registered")
        return 0
    t = Table(title="inferq queues")
    for col in ("model", "depth", "waiting (lag)", "pending", "oldest waiting", "DLQ", "workers alive"):
        t.add_column(col, justify="right" if col != "model" else "left", no_wrap=(col == "model"))
    for s in stats:
        oldest = f"{s.oldest_waiting_s:.1f}s" if s.oldest_waiting_s is not None else "-"
        workers = f"{s.workers_alive}/{len(s.workers)}"
        t.add_row(s.model, str(s.depth), str(s.waiting), str(s.pending), oldest,
                  f"[red]{s.dlq}[/red]" if s.dlq else "0",
                  f"[red]{workers}[/red]" if s.workers_alive == 0 else workers)
    out.print(t)
    wt = Table(title="workers")
    for col in ("model", "worker", "last heartbeat", "state"):
        wt.add_column(col)
    for s in stats:
        for w in s.workers:
            wt.add_row(s.model, w.name, f"{w.last_heartbeat_age_s:.1f}s ago",
                       "[green]alive[/green]" if w.alive else "[red]stale[/red]")
    if wt.row_count:
        out.print(wt)
    return 0


def _models(p, model):
    if model:
        return [model]
    return [m for m in discover_models(p.redis) if p.redis.exists(keys.dlq(m))]


def _entries(p, model, count=None):
    rows = p.redis.xrange(keys.dlq(model), count=count) if count else p.redis.xrange(keys.dlq(model))
    # Shown as the strings they are stored as (records.DeadLetter is the one reader).
    return [(as_str(eid), DeadLetter.from_fields(f).to_fields()) for eid, f in rows]


@friendly_errors
def cmd_dlq(args) -> int:
    p = producer()
    action = args.dlq_command
    models = _models(p, args.model)
    if action == "list":
        rows = []
        for m in models:
            for eid, f in _entries(p, m, args.count):
                rows.append({"model": m, "dlq_id": eid, **{k: f.get(k, "") for k in
                             ("job_id", "code", "reason", "attempts", "worker", "failed_at")}})
        if args.json:
            out.print(json.dumps(rows, indent=2), markup=False)
            return 0
        if not rows:
            out.print("the dead-letter queue is empty")
            return 0
        t = Table(title="dead-lettered jobs")
        for col in ("model", "dlq id", "job id", "code", "reason", "attempts", "failed"):
            t.add_column(col, overflow="fold")
        for r in rows:
            age = f"{time.time() - float(r['failed_at']):.0f}s ago" if float(r["failed_at"] or 0) else "-"
            t.add_row(r["model"], r["dlq_id"], r["job_id"] or "-", r["code"], r["reason"][:120], r["attempts"], age)
        out.print(t)
        return 0
    if action == "retry":
        if not args.entry_ids and not args.all:
            err.print("[red]error:[/red] name DLQ entry ids, or pass --all")
            return 1
        return _retry(p, models, set(args.entry_ids), args.all)
    if action == "purge":
        total = sum(int(p.redis.xlen(keys.dlq(m))) for m in models)
        if not total:
            out.print("the dead-letter queue is empty")
            return 0
        if not args.yes:
            answer = input(f"delete {total} dead-lettered job(s)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                out.print("nothing deleted")
                return 1
        for m in models:
            p.redis.delete(keys.dlq(m))
        out.print(f"deleted {total} dead-lettered job(s)")
        return 0
    return 2


def _retry(p, models, wanted: set[str], everything: bool) -> int:
    """Requeue under the same job id, with a fresh reply stream: clients that
    poll the job see it queued again. Goes through admission (backlog bound);
    the old records are replaced inside the admission step, so a refusal
    (QueueFull, Redis out of memory) leaves the DLQ entry and records intact."""
    from producer.admission import ADMISSION_LUA, admit as admit_job

    admit = p.redis.register_script(ADMISSION_LUA)
    from rich.progress import track

    todo = [(m, eid, f) for m in models for eid, f in _entries(p, m) if everything or eid in wanted]
    done, failed = 0, 0
    for m, eid, f in track(todo, description="requeueing", console=err, disable=len(todo) < 20):
        if '"redacted": true' in f.get("job", ""):
            err.print(f"[yellow]skip[/yellow] {eid}: its payload was redacted (INFERQ_DLQ_PAYLOAD=redact), so it "
                      "cannot be run again")
            failed += 1
            continue
        try:
            job = Job.model_validate_json(f.get("job", ""))
        except Exception as e:
            err.print(f"[yellow]skip[/yellow] {eid}: the payload is not a valid job ({str(e)[:200]})")
            failed += 1
            continue
        try:
            admit_job(p.redis, admit, job, None, p.settings, reset=True)
        except InferqError as e:
            err.print(f"[yellow]not requeued[/yellow] {eid}: {e}")
            failed += 1
            continue
        p.redis.xdel(keys.dlq(m), eid)
        out.print(f"requeued job {job.id} (was DLQ entry {eid})")
        done += 1
        wanted.discard(eid)
    for missing in sorted(wanted):
        err.print(f"[yellow]not found[/yellow] DLQ entry {missing}")
        failed += 1
    out.print(f"{done} requeued, {failed} not")
    return 0 if failed == 0 else 1
