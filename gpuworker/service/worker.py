"""One worker process: builds the engine, starts the four threads, and shuts
down gracefully (stop reading, drain up to a timeout, hand back the rest)."""
from __future__ import annotations

import os

import copy
import queue
import signal
import threading
import time

from inferq.schemas import keys
from inferq.schemas.redis_checks import queue_warnings
from inferq.schemas.text import as_str

from inferq.gpuworker.logging import get_logger
from inferq.gpuworker.metrics import WorkerMetrics
from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.device_check import CudaFacts, check_device
from inferq.gpuworker.service.engine_loop import EngineLoop
from inferq.gpuworker.service.health import engine_loop_checker
from inferq.gpuworker.service.identity import WorkerIdentity
from inferq.gpuworker.service.intake import Intake
from inferq.gpuworker.service.lease import LeaseKeeper
from inferq.gpuworker.engine.grammar import GrammarCompiler
from inferq.gpuworker.service.prompts import PromptBuilder, reasoning_family
from inferq.gpuworker.service.publisher import STOP, Publisher
from inferq.gpuworker.service.settings import WorkerSettings
from inferq.gpuworker.service.state import InFlight


def build_engine(s: WorkerSettings):
    from inferq.gpuworker.engine.llm_engine import LLMEngine

    set_cpu_threads(s)
    return LLMEngine(s.engine_config())


def build_engine_on_its_own_thread(s: WorkerSettings):
    """build_engine on a thread that ends when it returns, so that no thread but the engine
    loop's keeps an OpenMP pool. libgomp keeps one pool per thread that ran a parallel region
    (loading runs many: packing, the KV cache's fill); once the pools hold more threads than
    the process has CPUs, it cuts every team's spin-wait to a few hundred turns, and each of a
    decode step's ~300 kernels then waits on a futex wake-up (one stream at 2 threads on 2
    cores: 20 instead of 52 tok/s). A pool ends with its thread."""
    done: dict = {}

    def load() -> None:
        try:
            done["engine"] = build_engine(s)
        except BaseException as e:  # raised again on the caller's thread
            done["error"] = e

    loader = threading.Thread(target=load, name="inferq-load", daemon=True)
    loader.start()
    loader.join()
    if "error" in done:
        raise done["error"]
    return done["engine"]


def set_cpu_threads(s: WorkerSettings) -> int:
    """torch's CPU threads for the engine (the C kernels follow the same count), set before
    it loads, and where they are pinned (inferq_kernels/cpu/binding.py; applied at the first kernel
    call of the engine's thread). Default all cores this process may use but one; with 2 cores
    that is 1: the other core runs intake, publishing and Redis instead of fighting the forward."""
    import torch

    from inferq.kernels.cpu import binding

    n = s.torch_threads
    if n is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        n = int(env) if env.isdigit() and int(env) > 0 else max(1, len(binding.ALLOWED or [0]) - 1)
    on_gpu = (s.device or "").startswith("cuda") or (s.device is None and torch.cuda.is_available())
    if not on_gpu:
        torch.set_num_threads(n)
        os.environ[binding.ENV] = s.cpu_threads_bind
        get_logger().info("cpu_threads", torch_threads=n, pinned_to=binding.plan(n, s.cpu_threads_bind))
    return n


class Worker:
    def __init__(self, settings: WorkerSettings, engine=None):
        self.s = settings
        self.log = get_logger(worker=settings.consumer_name, model=settings.model_name)
        self.ctx = WorkerContext(
            model=settings.model_name,
            consumer=settings.consumer_name,
            lease_seconds=settings.lease_seconds,
            max_deliveries=settings.max_deliveries,
            reply_ttl=settings.reply_ttl,
            live_ttl=settings.live_ttl,
            reply_maxlen=settings.reply_maxlen,
            log_prompts=settings.log_prompts,
            dlq_maxlen=settings.dlq_maxlen,
            dlq_max_age_s=settings.dlq_max_age_s,
            dlq_redact=settings.dlq_payload == "redact",
            tenant_weights=settings.weights(),
            tenant_max_running=settings.tenant_max_running,
            interactive_reserve=settings.interactive_reserve,
            idle_poll_ms=settings.idle_poll_ms,
            steal_after_ms=settings.steal_after_ms,
            session_ttl=settings.session_ttl,
        )
        self.r = settings.redis()
        self.engine = engine
        self.metrics = WorkerMetrics(self.ctx.model)
        self.stop_reading = threading.Event()
        self.stop_lease = threading.Event()
        self.hard_stop = threading.Event()
        self.stopped = threading.Event()
        self._metrics_server = None
        self._threads_started = False

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        if self.engine is None:  # before anything else: a worker that cannot run says why at once
            check_device(self.s.device, self.s.attention_backend, CudaFacts.from_torch())
        self.r.ping()  # fail fast on a wrong URL or password, before loading a model
        # One live process per worker id (raises WorkerIdInUse), before loading a model too.
        self.identity = WorkerIdentity(self.ctx.model, self.ctx.consumer, ttl_s=3 * self.s.lease_seconds)
        self.identity.acquire(self.r)
        for warning in queue_warnings(self.r):
            self.log.warning("redis_config_unsafe_for_a_queue", advice=warning)
        if self.engine is None:
            t0 = time.time()
            self.engine = build_engine_on_its_own_thread(self.s)
            self.log.info("engine_ready", load_s=round(time.time() - t0, 2))
        eng = self.engine
        self.metrics.config.info({
            "model": self.ctx.model, "worker": self.ctx.consumer,
            "max_num_seqs": str(self.s.max_num_seqs), "max_num_batched_tokens": str(self.s.max_num_batched_tokens),
            "num_kv_blocks": str(eng.kv.pool.num_blocks), "block_size": str(self.s.block_size),
            "max_model_len": str(eng.max_model_len), "attention_backend": str(getattr(eng.backend, "name", self.s.attention_backend)),
            "lease_seconds": str(self.s.lease_seconds), "max_deliveries": str(self.s.max_deliveries),
            "dtype": str(getattr(eng, "dtype", "")).removeprefix("torch."),
            "eos_token_ids": ",".join(str(i) for i in eng.eos_token_ids),
            "speculative_config": "" if getattr(eng, "spec", None) is None else eng.spec.config.describe(),
        })
        # The gateway splits reasoning from content by the family found here (its own setting may override).
        family = "none" if getattr(eng, "reasoning", None) is None else reasoning_family(eng.config.reasoning_parser,
                                                                                         eng.tokenizer)
        info = keys.model_info(self.ctx.model)
        self.r.pipeline(transaction=False).hset(info, "reasoning_parser", family).expire(
            info, keys.MODEL_INFO_TTL_S).execute()
        self.inflight = InFlight(self.s.max_num_seqs)
        self.to_engine: queue.Queue = queue.Queue()
        self.to_publisher: queue.Queue = queue.Queue()
        prompts = PromptBuilder(copy.deepcopy(eng.tokenizer), eng.max_model_len, eng.model_config.vocab_size,
                                eng.eos_token_ids)
        grammar = GrammarCompiler(copy.deepcopy(eng.tokenizer), eng.model_config.vocab_size, eng.eos_token_ids,
                                  cache_size=self.s.grammar_cache_size, on_compile=self.metrics.grammar_compiled,
                                  compile_delay_s=self.s.test_grammar_compile_delay_s)
        self.intake = Intake(self.ctx, self.r, self.inflight, prompts, self.to_engine, self.to_publisher,
                             self.metrics, self.log, self.s.block_ms, self.stop_reading,
                             grammar=grammar, grammar_timeout_s=self.s.grammar_compile_timeout_s)
        self.engine_loop = EngineLoop(eng, self.to_engine, self.to_publisher, self.inflight, self.metrics, self.log,
                                      rebuild=lambda: build_engine(self.s), check_invariants=self.s.check_invariants,
                                      step_pace_s=self.s.step_pace_s)
        self.publisher = Publisher(self.ctx, self.r, self.inflight, self.to_publisher, self.to_engine,
                                   self.intake.requeue, self.metrics, self.log, coalesce=self.s.coalesce_deltas,
                                   max_flush_steps=self.s.max_flush_steps, give_up=self.hard_stop.is_set)
        self.lease = LeaseKeeper(self.ctx, self.r, self.inflight, self.intake.requeue, self.to_engine, self.metrics,
                                 self.log, self.stop_lease, reap=lambda: self.intake.caught_up.is_set() and not self.stop_reading.is_set(),
                                 identity=self.identity, on_identity_lost=self.request_stop)
        self.intake.ensure_group()  # before the lease thread's first XAUTOCLAIM
        self.lease.heartbeat()
        self._metrics_server = self.metrics.serve(self.s.metrics_port, self.s.metrics_addr,
                                                  health=engine_loop_checker(self.engine_loop, self.s.health_stall_s))
        for t in (self.engine_loop, self.publisher, self.lease, self.intake):
            t.start()
        self._threads_started = True
        self.log.info("worker_started", stream=self.ctx.stream, group=self.ctx.group,
                      metrics_port=self.s.metrics_port or None, config=self.s.safe_dump())

    def request_stop(self, *_args) -> None:
        if not self.stop_reading.is_set():
            self.log.info("shutdown_requested", drain_timeout=self.s.drain_timeout)
        self.stop_reading.set()

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (or request_stop); returns the exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        self.start()
        code = 0
        while not self.stop_reading.wait(0.5):
            crashed = [t for t in (self.intake, self.engine_loop, self.publisher) if t.error is not None]
            if crashed:
                self.log.error("worker_thread_failed", threads=[t.name for t in crashed])
                code = 1
                self.stop_reading.set()
        self.shutdown()
        return code

    def shutdown(self) -> None:
        """Stop reading, drain in-flight jobs up to the timeout, hand back the rest."""
        if not self._threads_started:
            return
        self.stop_reading.set()
        self.intake.join(timeout=self.s.block_ms / 1000 + 5)
        self.engine_loop.drain_until = time.monotonic() + self.s.drain_timeout
        self.engine_loop.join(timeout=self.s.drain_timeout + 30)
        self.to_publisher.put(STOP)
        hard = threading.Timer(15.0, self.hard_stop.set)
        hard.daemon = True
        hard.start()
        self.publisher.join(timeout=20)
        hard.cancel()
        self.stop_lease.set()
        self.lease.join(timeout=5)
        left = self.publisher.handed_back + [(st.lane, st.entry_id) for st in self.inflight.snapshot()]
        # Entries read but never started (still in the intake's local queue) go back too.
        while True:
            try:
                lane, eid, _, _ = self.intake.local.get_nowait()
            except queue.Empty:
                break
            left.append((lane, as_str(eid)))
        try:
            self.lease.release(left)
            self.lease.leave()
            self.identity.release(self.r)
        except Exception as e:
            self.log.warning("release_failed", error=str(e))
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.log.info("worker_stopped", handed_back=len(left))
        self.r.close()
        self.stopped.set()
