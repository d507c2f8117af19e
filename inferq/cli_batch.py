"""`inferq batch submit|status|download|cancel|list`: the OpenAI Batch API of a
running gateway (--url / INFERQ_GATEWAY_URL, key from INFERQ_API_KEY)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from inferq.cli_common import err, out


def add_arguments(p) -> None:
    p.add_argument("--url", default=None, help="gateway URL (default: $INFERQ_GATEWAY_URL or http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=None, help="API key (default: $INFERQ_API_KEY)")
    sub = p.add_subparsers(dest="batch_command", metavar="ACTION")
    s = sub.add_parser("submit", help="upload a JSONL of requests and start a batch")
    s.add_argument("file", help="JSONL: one {custom_id, method, url, body} per line")
    s.add_argument("--endpoint", default="/v1/chat/completions", choices=["/v1/chat/completions", "/v1/completions"])
    s.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--wait", action="store_true", help="wait until the batch finishes, showing progress")
    s.add_argument("--poll", type=float, default=2.0, help="seconds between status polls with --wait")
    st = sub.add_parser("status", help="show a batch (JSON with --json)")
    st.add_argument("batch_id")
    st.add_argument("--json", action="store_true")
    d = sub.add_parser("download", help="write a batch's output (or error) file")
    d.add_argument("batch_id")
    d.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")
    d.add_argument("--errors", action="store_true", help="the error file instead of the output file")
    c = sub.add_parser("cancel", help="cancel a batch")
    c.add_argument("batch_id")
    ls = sub.add_parser("list", help="recent batches")
    ls.add_argument("--limit", type=int, default=20)


def _line(b: dict) -> str:
    n = b["request_counts"]
    return (f"{b['id']}  {b['status']:<11} {n['completed']}/{n['total']} completed, {n['failed']} failed"
            + (f"  output={b['output_file_id']}" if b.get("output_file_id") else "")
            + (f"  errors={b['error_file_id']}" if b.get("error_file_id") else ""))


def cmd_batch(args) -> int:
    from inferq.producer.batch import BatchClient, BatchError

    try:
        import httpx
    except ImportError:
        err.print("[red]error:[/red] `inferq batch` needs httpx: pip install 'inferq[cli]'")
        return 1
    try:
        with BatchClient(args.url, args.api_key) as bc:
            return _run(bc, args)
    except BatchError as e:
        err.print(f"[red]error:[/red] {e}")
    except httpx.HTTPError as e:
        err.print(f"[red]error:[/red] cannot reach the gateway ({e}); set --url or INFERQ_GATEWAY_URL")
    except (OSError, ValueError) as e:
        err.print(f"[red]error:[/red] {e}")
    return 1


def _run(bc, args) -> int:
    cmd = args.batch_command
    if cmd == "submit":
        meta = dict(kv.split("=", 1) for kv in args.metadata) if args.metadata else None
        b = bc.submit(args.file, endpoint=args.endpoint, metadata=meta)
        out.print(b["id"])
        if not args.wait:
            return 0
        b = bc.wait(b["id"], poll_s=args.poll, on_poll=lambda x: err.print(_line(x)))
        out.print(_line(b))
        return 0 if b["status"] == "completed" else 1
    if cmd == "status":
        b = bc.get(args.batch_id)
        out.print(json.dumps(b, indent=2) if args.json else _line(b))
        return 0
    if cmd == "download":
        b = bc.get(args.batch_id)
        file_id = b.get("error_file_id" if args.errors else "output_file_id")
        if not file_id:
            err.print(f"[red]error:[/red] batch {b['id']} ({b['status']}) has no "
                      f"{'error' if args.errors else 'output'} file" + ("" if args.errors else " yet"))
            return 1
        data = bc.content(file_id)
        if args.output:
            Path(args.output).write_bytes(data)
            err.print(f"wrote {len(data.splitlines())} lines to {args.output}")
        else:
            sys.stdout.buffer.write(data)
        return 0
    if cmd == "cancel":
        out.print(_line(bc.cancel(args.batch_id)))
        return 0
    if cmd == "list":
        for b in bc.list(limit=args.limit)["data"]:
            out.print(_line(b))
        return 0
    err.print("usage: inferq batch submit|status|download|cancel|list (see --help)")
    return 2
