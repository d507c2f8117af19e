"""CLI commands about queues rather than one job: status and dlq."""
from __future__ import annotations

import json
import time

from rich.table import Table

from inferq.schemas import keys
from inferq.schemas.records import DeadLetter
from inferq.schemas.text import as_str
from inferq.cli_common import err, friendly_errors, out, producer
from inferq.producer.queue_stats import all_stats, discover_models


@friendly_errors
def cmd_status(args) -> int:
    p = producer()
    stats = all_stats(p.redis, p.settings.worker_stale_seconds)
    if args.json:
        out.print(json.dumps([s.as_dict() for s in stats], indent=2), markup=False)
        return 0
    out.print(f"Redis: {p.settings.safe_url()}")
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
    lanes = Table(title="lanes (partition, priority class, fair-share tenant)")
    for col in ("model", "partition", "class", "tenant", "waiting", "pending", "oldest waiting"):
        lanes.add_column(col, justify="right" if col in ("partition", "waiting", "pending") else "left")
    for s in stats:
        if len(s.lanes) < 2:
            continue  # one lane: the table above says it all
        for ln in s.lanes:
            oldest = f"{ln.oldest_waiting_s:.1f}s" if ln.oldest_waiting_s is not None else "-"
            lanes.add_row(s.model, str(ln.partition), ln.cls, ln.tenant or "(shared)", str(ln.waiting),
                          str(ln.pending), oldest)
    if lanes.row_count:
        out.print(lanes)
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


def _dlqs(model):
    from inferq.producer.dlq import streams

    return streams(model)


def _models(p, model):
    if model:
        return [model]
    return [m for m in discover_models(p.redis) if any(p.redis.exists(d) for d in _dlqs(m))]


def _entries(p, model, count=None):
    """(dlq stream, entry id, fields) of a model's dead letters, oldest first per partition."""
    out = []
    for dlq in _dlqs(model):
        rows = p.redis.xrange(dlq, count=count) if count else p.redis.xrange(dlq)
        # Shown as the strings they are stored as (records.DeadLetter is the one reader).
        out += [(dlq, as_str(eid), DeadLetter.from_fields(f).to_fields()) for eid, f in rows]
    return out[:count] if count else out


@friendly_errors
def cmd_dlq(args) -> int:
    p = producer()
    action = args.dlq_command
    models = _models(p, args.model)
    if action == "list":
        rows = []
        for m in models:
            for _, eid, f in _entries(p, m, args.count):
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
        total = sum(int(p.redis.xlen(d)) for m in models for d in _dlqs(m))
        if not total:
            out.print("the dead-letter queue is empty")
            return 0
        if not args.yes:
            answer = input(f"delete {total} dead-lettered job(s)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                out.print("nothing deleted")
                return 1
        for m in models:
            for d in _dlqs(m):
                p.redis.delete(d)
        out.print(f"deleted {total} dead-lettered job(s)")
        return 0
    return 2


def _retry(p, models, wanted: set[str], everything: bool) -> int:
    """Requeue under the same job id (producer/dlq.py: through admission, so a
    refusal leaves the DLQ entry and records intact)."""
    from inferq.producer import dlq as dead_letters
    from inferq.producer.admission import ADMISSION_LUA

    admit = p.redis.register_script(ADMISSION_LUA)
    from rich.progress import track

    todo = [(dlq, eid, f) for m in models for dlq, eid, f in _entries(p, m) if everything or eid in wanted]
    done, failed = 0, 0
    for dlq, eid, f in track(todo, description="requeueing", console=err, disable=len(todo) < 20):
        try:
            job_id = dead_letters.requeue(p.redis, admit, p.settings, dlq, eid, f)
        except dead_letters.NotRequeued as e:
            err.print(f"[yellow]not requeued[/yellow] {eid}: {e}")
            failed += 1
            continue
        out.print(f"requeued job {job_id} (was DLQ entry {eid})")
        done += 1
        wanted.discard(eid)
    for missing in sorted(wanted):
        err.print(f"[yellow]not found[/yellow] DLQ entry {missing}")
        failed += 1
    out.print(f"{done} requeued, {failed} not")
    return 0 if failed == 0 else 1
