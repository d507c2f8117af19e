"""Copy-heavy prompts for the speculative-decoding benchmark: 700-1,400 token
documents (meeting notes, invoices, a config file) and tasks that make the
output reuse them (rewrite, extract, quote, summarise), as backends enqueue.
Deterministic from a seed; no dataset download."""
from __future__ import annotations

import random

_NAMES = ["Alice Moreau", "Bongani Dlamini", "Chen Wei", "Dara O'Neill", "Emre Yilmaz", "Farah Haddad",
          "Gustavo Lima", "Hana Sato", "Ivan Petrov", "Jamal Carter"]
_VERBS = ["review", "update", "ship", "benchmark", "document", "rewrite", "migrate", "test", "price", "audit"]
_THINGS = ["the billing service", "the Redis cluster", "the onboarding guide", "the search index",
           "the mobile release", "the quarterly report", "the vendor contract", "the load balancer",
           "the data retention policy", "the Grafana dashboards"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "next week", "the end of the month"]
_ITEMS = ["green tea", "oranges", "printer paper", "USB-C cables", "office chairs", "coffee beans", "notebooks"]

TASKS = [
    "Rewrite the document below exactly as it is, line by line, changing nothing.",
    "Extract every line of the document below that mentions {who}, copied word for word.",
    "Copy the action items of the document below into a numbered list, keeping their wording.",
    "Summarise the document below, quoting its most important lines.",
]


def _meeting(rng: random.Random, lines: int) -> str:
    out = [f"Meeting notes, {rng.choice(_DAYS)} planning session. Attendees: " + ", ".join(rng.sample(_NAMES, 5)) + "."]
    for i in range(lines):
        who, verb, thing, day = rng.choice(_NAMES), rng.choice(_VERBS), rng.choice(_THINGS), rng.choice(_DAYS)
        out.append(f"- Action {i + 1}: {who} will {verb} {thing} by {day}; status: "
                   f"{rng.choice(['open', 'in progress', 'blocked on review', 'done'])}.")
    return "\n".join(out)


def _invoice(rng: random.Random, lines: int) -> str:
    out = [f"Invoice {rng.randint(1000, 9999)} from Northwind Traders to {rng.choice(_NAMES)}, "
           f"due {rng.choice(_DAYS)}."]
    for i in range(lines):
        qty, price = rng.randint(1, 40), rng.randint(100, 9999) / 100
        out.append(f"Line {i + 1}: {qty} x {rng.choice(_ITEMS)} at {price:.2f} each, total {qty * price:.2f}, "
                   f"ship to warehouse {rng.choice('ABCDEFG')}{rng.randint(1, 9)}.")
    return "\n".join(out)


def _config(rng: random.Random, lines: int) -> str:
    out = ["# service configuration"]
    for i in range(lines):
        out.append(f"service_{i}: {{ host: node-{rng.randint(1, 64)}.internal, port: {rng.randint(1024, 65535)}, "
                   f"replicas: {rng.randint(1, 8)}, owner: \"{rng.choice(_NAMES)}\" }}")
    return "\n".join(out)


def copy_chats(n: int, seed: int = 0, min_lines: int = 16, max_lines: int = 40) -> list[list[dict]]:
    """n chat conversations: one user message each, a task over a document."""
    rng = random.Random(seed)
    chats = []
    for i in range(n):
        make = (_meeting, _invoice, _config)[i % 3]
        doc = make(rng, rng.randint(min_lines, max_lines))
        task = TASKS[i % len(TASKS)].format(who=rng.choice(_NAMES))
        chats.append([{"role": "user", "content": f"{task}\n\n{doc}"}])
    return chats
