"""Grammar compilation for structured outputs: constraint -> token matcher, cached.

A constraint (``schemas.StructuredOutputs``) becomes an llguidance ``LLMatcher``
over the model's tokenizer. Building one costs ~0.1-1 ms for usual schemas and
up to seconds for pathological ones, so it never runs on the step loop: the
worker compiles when it takes a job (intake thread), the offline ``LLM`` when a
request is added. Compiled matchers are kept in a bounded LRU cache keyed by the
constraint's grammar; each request gets a ``deep_copy`` (~1 us) of the pristine
one, so equal schemas compile once per process.

Why llguidance and not xgrammar (both measured on this tokenizer, see
docs/structured-outputs.md): no dependencies (the producer side validates with the
same library at admission, without torch), no per-schema compile step worth
caching separately (~0.7 ms to build a matcher vs ~5.7 ms to compile in
xgrammar), and a mask fill of a few microseconds per row that runs outside the
GIL, so it overlaps the forward pass.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable, Optional, Sequence

import llguidance
import llguidance.hf

from inferq.schemas import StructuredOutputs
from inferq.schemas.reasoning import THINK_END, THINK_START, detect_parser, reasoning_format


class GrammarError(ValueError):
    """The constraint cannot be used for this job (does not compile, or compiling took too long)."""


class GrammarCompiler:
    """Thread-safe: the intake thread compiles, the engine thread never waits on it."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...] = (),
                 cache_size: int = 256, compile_threads: int = 2,
                 on_compile: Optional[Callable[[float, bool, int], None]] = None,
                 compile_delay_s: float = 0.0):
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = [int(t) for t in eos_token_ids] or None
        self._llg_tokenizer = None  # built on first use: ~0.4 s for a 49k vocabulary
        self.cache_size = max(1, cache_size)
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, compile_threads), thread_name_prefix="inferq-grammar")
        self._on_compile = on_compile  # (seconds, cache_hit, cache entries) -> None, for metrics
        # Test pacing only (INFERQ_TEST_GRAMMAR_COMPILE_DELAY_S): makes every cold compile
        # this much slower, so a compile time-out can be provoked whatever the machine's speed.
        self._compile_delay_s = compile_delay_s
        self.hits = 0
        self.misses = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._llg_tokenizer is None:
                self._llg_tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos)
            return self._llg_tokenizer

    def __len__(self) -> int:
        return len(self._cache)

    def matcher(self, constraint: StructuredOutputs, timeout_s: Optional[float] = None) -> llguidance.LLMatcher:
        """A fresh matcher for one request. Raises GrammarError with a message the
        client can act on."""
        key = constraint.cache_key()
        with self._lock:
            pristine = self._cache.get(key)
            if pristine is not None:
                self._cache.move_to_end(key)
                self.hits += 1
        if pristine is not None:
            if self._on_compile:
                self._on_compile(0.0, True, len(self._cache))
            return pristine.deep_copy()
        tok = self.tokenizer
        spec = constraint.grammar_spec()
        fut = self._pool.submit(self._build, tok, spec)
        try:
            pristine, seconds = fut.result(timeout=timeout_s)
        except FutureTimeout:
            # The build goes on in its thread (llguidance cannot be interrupted) and
            # its result is dropped; only this job fails.
            raise GrammarError(
                f"the {constraint.kind} constraint took longer than {timeout_s:g} s to compile "
                f"(INFERQ_GRAMMAR_COMPILE_TIMEOUT_S); simplify it") from None
        if pristine.is_error():
            raise GrammarError(f"the {constraint.kind} constraint cannot be compiled: {pristine.get_error().strip()}")
        with self._lock:
            self.misses += 1
            self._cache[key] = pristine
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if self._on_compile:
            self._on_compile(seconds, False, len(self._cache))
        return pristine.deep_copy()

    def _build(self, tok, spec: str):
        t0 = time.perf_counter()
        if self._compile_delay_s:
            time.sleep(self._compile_delay_s)
        m = llguidance.LLMatcher(tok, spec, log_level=0)
        return m, time.perf_counter() - t0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# -- reasoning models: the constraint applies to what follows the reasoning ----------
class ReasoningMarkers:
    """A tokenizer's encodings of ``<think>`` and ``</think>`` (one special token
    each in Qwen3 and DeepSeek-R1). With them a structured-output constraint holds
    back until the reasoning has ended, as vLLM's reasoning-aware structured
    outputs do: the model thinks freely, then the grammar shapes the answer."""

    def __init__(self, start_ids: tuple[int, ...], end_ids: tuple[int, ...]):
        if not start_ids or not end_ids:
            raise ValueError("reasoning markers need token ids for both <think> and </think>")
        self.start_ids = tuple(start_ids)
        self.end_ids = tuple(end_ids)
        # How far back the prompt is searched for a block the template opened or closed.
        self._window = 2 * (len(self.start_ids) + len(self.end_ids)) + 4

    @classmethod
    def for_model(cls, parser: Optional[str], tokenizer) -> Optional["ReasoningMarkers"]:
        """``parser``: "auto" (on when the chat template knows ``<think>``), "none",
        or a family name (inferq.schemas.reasoning.PARSERS)."""
        name = (parser or "none").strip().lower()
        if name == "auto":
            name = detect_parser(getattr(tokenizer, "chat_template", None)) or "none"
        if reasoning_format(name) is None:  # ValueError for an unknown name
            return None

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False))

        return cls(ids(THINK_START), ids(THINK_END))

    def gate(self, prompt_token_ids: Sequence[int], matcher) -> Optional["ReasoningGate"]:
        """The gate of a request with ``matcher``, from where its prompt leaves the
        reasoning: closed by the template (thinking disabled) -> None, the grammar
        applies from the first token; opened by the template -> held until the end
        marker; neither -> the first token decides (the start marker, or the
        grammar's first token: the model may answer without thinking)."""
        tail = list(prompt_token_ids[-self._window:])
        s, e = _rfind(tail, self.start_ids), _rfind(tail, self.end_ids)
        if e > s:
            return None
        if s > e or len(self.start_ids) > 1:  # a multi-token start cannot be offered in one mask bit
            return ReasoningGate(matcher, self.end_ids)
        return ReasoningGate(matcher, self.end_ids, start_token=self.start_ids[0])


class ReasoningGate:
    """One request's matcher while its reasoning may go on.

    Undecided (``start_token`` set, before the first output token): the matcher is
    the request's and masks the first token, with ``start_token`` also allowed
    (logits_shaping). Waiting: ``req.matcher`` is None and the matcher rests here
    until the output ends with ``end_ids``; then it becomes the request's and
    constrains every later token."""

    __slots__ = ("matcher", "end_ids", "start_token")

    def __init__(self, matcher, end_ids: tuple[int, ...], start_token: Optional[int] = None):
        self.matcher = matcher
        self.end_ids = list(end_ids)
        self.start_token = start_token

    def draft_limit(self, output_ids: Sequence[int], draft: Sequence[int]) -> int:
        """Speculative decoding while waiting: how many of ``draft`` may be verified.
        Up to (not including) the token that would end the reasoning, so no row of
        the step samples the answer's first token without the grammar's mask."""
        n = len(self.end_ids)
        tail = list(output_ids[-(n - 1):]) if n > 1 else []
        for i, t in enumerate(draft):
            tail.append(t)
            if tail[-n:] == self.end_ids:
                return i
        return len(draft)

    def attach(self, req) -> None:
        """Give ``req`` (just built) this gate and the matcher it holds."""
        req.reasoning_gate = self
        if self.start_token is None:
            req.matcher = None
        else:
            req.matcher, self.matcher = self.matcher, None


def gate_token(req, output_ids: Sequence[int]) -> bool:
    """Route ``req``'s newest output token (the last of ``output_ids``) past its
    reasoning gate. True: the token belongs to the reasoning (or ends it) and its
    matcher must not consume it; False: the matcher (if any) consumes it."""
    gate = req.reasoning_gate
    if gate is None:
        return False
    token = output_ids[-1]
    if gate.start_token is not None:  # the first token decides
        if token == gate.start_token:
            gate.matcher, req.matcher, gate.start_token = req.matcher, None, None
            return True
        req.reasoning_gate = None  # no reasoning: the grammar goes on from this token
        return False
    n = len(gate.end_ids)
    if len(output_ids) >= n and list(output_ids[-n:]) == gate.end_ids:
        req.matcher, req.reasoning_gate = gate.matcher, None
    return True


def _rfind(seq: list[int], sub: tuple[int, ...]) -> int:
    n = len(sub)
    for i in range(len(seq) - n, -1, -1):
        if tuple(seq[i:i + n]) == sub:
            return i
    return -1
