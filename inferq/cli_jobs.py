"""CLI commands that run the worker or follow one job: worker, submit, stream,
cancel."""
from __future__ import annotations

import json
import sys

from inferq.cli_common import err, friendly_errors, out, producer


def run_worker(argv: list[str]) -> int:
    """`inferq worker ...`: the worker's own CLI (imports torch, so only here)."""
    try:
        from inferq.gpuworker.service.cli import main as worker_main
    except ImportError as e:
        err.print(f"[red]error:[/red] the worker needs the worker extra (torch etc.): pip install 'inferq[worker]' ({e})")
        return 1
    rc = worker_main(argv)
    return int(rc or 0)


def _sampling(args) -> dict:
    s = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.top_p is not None:
        s["top_p"] = args.top_p
    if args.seed is not None:
        s["seed"] = args.seed
    if args.stop:
        s["stop"] = args.stop
    if args.ignore_eos:
        s["ignore_eos"] = True
    constraint = _constraint(args)
    if constraint is not None:
        s["structured_outputs"] = constraint
    return s


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _constraint(args):
    """--json-schema/--json-object/--regex/--choice/--grammar as StructuredOutputs
    fields (validated, and compiled, when the job is built)."""
    if getattr(args, "json_schema", None):
        text = _read(args.json_schema)
        try:
            return {"json": json.loads(text)}
        except json.JSONDecodeError as e:
            raise ValueError(f"{args.json_schema}: not valid JSON: {e}") from None
    if getattr(args, "json_object", False):
        return {"json_object": True}
    if getattr(args, "regex", None):
        return {"regex": args.regex}
    if getattr(args, "choice", None):
        return {"choice": args.choice}
    if getattr(args, "grammar", None):
        return {"grammar": _read(args.grammar)}
    return None


@friendly_errors
def cmd_submit(args) -> int:
    p = producer()
    kw = {"sampling": _sampling(args), "model": args.model, "priority": args.priority}
    if args.chat or args.system:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": args.prompt})
        h = p.submit(messages=messages, **kw)
    else:
        h = p.submit(args.prompt, **kw)
    if args.detach:
        print(h.id)
        return 0
    err.print(f"[dim]job {h.id}[/dim]")
    for piece in h.text(timeout=args.timeout):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    r = h.result(timeout=args.timeout)
    ttft = f"{r.timings.ttft:.3f}s" if r.timings.ttft is not None else "-"
    err.print(f"[dim]finish={r.finish_reason} prompt_tokens={r.usage.prompt_tokens} "
              f"completion_tokens={r.usage.completion_tokens} queue={r.timings.queue:.3f}s ttft={ttft} "
              f"total={r.timings.total:.3f}s[/dim]")
    return 0


@friendly_errors
def cmd_stream(args) -> int:
    p = producer()
    h = p.job(args.job_id)
    shown_attempt = None
    for entry_id, ev in h.stream(last_id=args.last_id):
        if args.events:
            out.print(json.dumps({"id": entry_id, **ev.model_dump(mode="json")}), markup=False)
            continue
        if ev.type == "restarted" or (shown_attempt is not None and ev.attempt != shown_attempt):
            err.print(f"\n[yellow]-- restarted (attempt {ev.attempt}); output starts over --[/yellow]")
        shown_attempt = ev.attempt
        if ev.type == "delta":
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif ev.type == "done":
            sys.stdout.write("\n")
            err.print(f"[dim]finish={ev.finish_reason} completion_tokens={ev.usage.completion_tokens}[/dim]")
        elif ev.type == "error":
            err.print(f"\n[red]error[/red] [{ev.code}] {ev.message}")
            return 1
    return 0


@friendly_errors
def cmd_cancel(args) -> int:
    p = producer()
    h = p.job(args.job_id)
    was_running = h.cancel()
    if was_running:
        out.print(f"cancel requested for job {args.job_id}")
    else:
        out.print(f"job {args.job_id} had already finished ({h.status().get('status')})")
    return 0

