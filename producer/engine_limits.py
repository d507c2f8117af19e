"""Which engine limit binds, read from a worker's Prometheus metrics (two
samples apart): the one home of the reading that `inferq doctor` prints and the
gateway's dashboard shows per worker. Pure Python (no torch), so the producer
side can use it.

The three engine limits (as vLLM's scheduler has them):
- KV cache blocks: preemptions for blocks happen, or usage sits near 100% with work
  waiting. (Preemptions by a better-priority job, reason="priority", are the
  priority policy at work, not a shortage, and are only reported.)
- Token budget (max_num_batched_tokens): steps are full and mostly prefill,
  so prompt chunks crowd out decodes while work waits.
- max_num_seqs: the running set is at its cap while KV is still free and work waits.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text format -> {name: [(labels, value), ...]} (comments skipped)."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


@dataclass
class Sample:
    at: float
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemptions: float = 0.0  # for KV blocks (reason="kv", or an unlabelled older worker)
    priority_preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    steps: float = 0.0
    step_seconds: float = 0.0
    consumer_lag: float = 0.0
    in_flight: float = 0.0
    spec_drafts: float = 0.0  # speculative decoding: verifications, proposed and accepted tokens
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0
    config: dict = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str, at: Optional[float] = None) -> "Sample":
        m = parse_metrics(text)

        def one(*names: str) -> float:
            for n in names:
                if n in m:
                    return sum(v for _, v in m[n])
            return 0.0

        def preempted(priority: bool) -> float:
            return sum(v for labels, v in m.get("inferq:num_preemptions_total", [])
                       if (labels.get("reason") == "priority") == priority)

        config = {}
        for labels, _ in m.get("inferq:worker_config_info", []):
            config = labels
        if not m:
            raise ValueError("no metrics found in the response: is this a worker's /metrics URL?")
        return cls(
            at=time.time() if at is None else at,
            running=one("inferq:num_requests_running"),
            waiting=one("inferq:num_requests_waiting"),
            kv_usage=one("inferq:kv_cache_usage_perc"),
            preemptions=preempted(priority=False),
            priority_preemptions=preempted(priority=True),
            prompt_tokens=one("inferq:prompt_tokens_total"),
            generation_tokens=one("inferq:generation_tokens_total"),
            steps=one("inferq:engine_step_seconds_count"),
            step_seconds=one("inferq:engine_step_seconds_sum"),
            consumer_lag=one("inferq:consumer_lag"),
            in_flight=one("inferq:jobs_in_flight"),
            spec_drafts=one("inferq:spec_decode_num_drafts_total"),
            spec_draft_tokens=one("inferq:spec_decode_num_draft_tokens_total"),
            spec_accepted_tokens=one("inferq:spec_decode_num_accepted_tokens_total"),
            config=config,
        )


@dataclass
class Finding:
    limit: str  # kv_cache | token_budget | max_num_seqs | queue | none
    summary: str
    advice: str


@dataclass
class Report:
    readings: dict
    findings: list[Finding]

    @property
    def bottleneck(self) -> str:
        return self.findings[0].limit

    def as_dict(self) -> dict:
        return {"bottleneck": self.bottleneck, "readings": self.readings,
                "findings": [asdict(f) for f in self.findings]}


def _int(config: dict, key: str) -> Optional[int]:
    try:
        return int(float(config[key]))
    except (KeyError, ValueError, TypeError):
        return None


def _speculation(before: Sample, after: Sample, cfg: dict) -> dict:
    """Speculative decoding's readings: whether it is on, and in the window how many
    tokens were proposed, the share accepted, and tokens gained per verification."""
    on = cfg.get("speculative_config") not in (None, "", "None")
    out: dict = {"speculative": cfg.get("speculative_config") if on else "off"}
    if not on:
        return out
    drafts = max(0.0, after.spec_drafts - before.spec_drafts)
    proposed = max(0.0, after.spec_draft_tokens - before.spec_draft_tokens)
    accepted = max(0.0, after.spec_accepted_tokens - before.spec_accepted_tokens)
    out["spec_proposed_tokens_in_window"] = proposed
    out["spec_acceptance_rate"] = round(accepted / proposed, 3) if proposed else None
    out["spec_accepted_per_verification"] = round(accepted / drafts, 2) if drafts else None
    return out


def diagnose(before: Sample, after: Sample) -> Report:
    cfg = after.config or before.config
    max_seqs = _int(cfg, "max_num_seqs")
    budget = _int(cfg, "max_num_batched_tokens")
    blocks = _int(cfg, "num_kv_blocks")
    block_size = _int(cfg, "block_size") or 16
    steps = max(0.0, after.steps - before.steps)
    d_prompt = max(0.0, after.prompt_tokens - before.prompt_tokens)
    d_gen = max(0.0, after.generation_tokens - before.generation_tokens)
    d_preempt = max(0.0, after.preemptions - before.preemptions)
    seconds = max(1e-9, after.at - before.at)
    tokens_per_step = (d_prompt + d_gen) / steps if steps else 0.0
    prefill_share = d_prompt / (d_prompt + d_gen) if (d_prompt + d_gen) else 0.0
    backlog = after.waiting + after.consumer_lag
    readings = {
        "window_s": round(seconds, 2),
        "running": after.running, "waiting_in_engine": after.waiting, "queue_lag": after.consumer_lag,
        "kv_cache_usage": round(after.kv_usage, 3), "preemptions_in_window": d_preempt,
        "priority_preemptions_in_window": max(0.0, after.priority_preemptions - before.priority_preemptions),
        "steps_per_s": round(steps / seconds, 2), "tokens_per_step": round(tokens_per_step, 1),
        "prefill_share": round(prefill_share, 3),
        "generation_tokens_per_s": round(d_gen / seconds, 1),
        "mean_step_ms": round(1000 * (after.step_seconds - before.step_seconds) / steps, 2) if steps else None,
        "max_num_seqs": max_seqs, "max_num_batched_tokens": budget, "num_kv_blocks": blocks,
        "block_size": block_size, "eos_token_ids": cfg.get("eos_token_ids"), "dtype": cfg.get("dtype"),
    }
    readings.update(_speculation(before, after, cfg))
    findings: list[Finding] = []
    if d_preempt > 0 or (after.kv_usage >= 0.9 and backlog > 0):
        more = f"--num-kv-blocks {math.ceil(blocks * 1.5)}" if blocks else "a larger --num-kv-blocks"
        why = (f"{d_preempt:.0f} preemption(s) in {seconds:.0f}s" if d_preempt
               else f"KV cache {after.kv_usage:.0%} full with {backlog:.0f} job(s) waiting")
        findings.append(Finding(
            "kv_cache", f"KV cache blocks are the limit: {why}.",
            f"Give the cache more blocks ({more}; on a GPU raise the memory it may use), or admit fewer "
            f"sequences (--max-num-seqs {max(1, (max_seqs or 2) // 2)}) so running ones are not evicted and "
            f"recomputed; a smaller --max-model-len also caps how much one sequence can hold."))
    if budget and tokens_per_step >= 0.9 * budget and prefill_share >= 0.5 and backlog > 0:
        findings.append(Finding(
            "token_budget",
            f"The token budget is the limit: steps carry {tokens_per_step:.0f} of {budget} tokens, "
            f"{prefill_share:.0%} of them prompt (prefill chunks), with {backlog:.0f} job(s) waiting.",
            f"Raise --max-num-batched-tokens (e.g. {budget * 2}) so prompt chunks and decodes both fit in a "
            f"step; lower it instead if inter-token latency matters more than time to first token."))
    if max_seqs and after.running >= 0.95 * max_seqs and backlog > 0 and after.kv_usage < 0.8:
        room = ""
        if blocks and after.running:
            per_seq = max(1.0, after.kv_usage * blocks / after.running)
            room = f" (KV has room for about {int(blocks / per_seq)} sequences of the current size)"
        findings.append(Finding(
            "max_num_seqs",
            f"max_num_seqs is the limit: {after.running:.0f}/{max_seqs} sequences run, KV is only "
            f"{after.kv_usage:.0%} used, and {backlog:.0f} job(s) wait.",
            f"Raise --max-num-seqs (e.g. {max_seqs * 2}){room}."))
    if not findings and after.consumer_lag > 0:
        findings.append(Finding(
            "queue", f"{after.consumer_lag:.0f} job(s) wait on the queue but no engine limit is reached.",
            "The worker is compute-bound at its current batch: add workers to the consumer group "
            "(inferq worker on more GPUs/machines)."))
    if not findings:
        findings.append(Finding(
            "none", "No limit is binding: the worker has headroom"
            + (" (idle in this window)." if steps == 0 else "."),
            "Nothing to change; run `inferq doctor` again under load to see which limit binds first."))
    return Report(readings, findings)
