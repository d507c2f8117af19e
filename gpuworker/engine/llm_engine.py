"""The engine core: requests in, one scheduled forward per step, deltas out.

Not thread-safe: one thread owns an engine and calls ``step()`` in a loop
(the worker service feeds it through a queue).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional, Sequence

import torch

from inferq.gpuworker.attention.base import get_backend
from inferq.gpuworker.config import EngineConfig
from inferq.gpuworker.engine import host_malloc
from inferq.gpuworker.engine.cuda_device import bind_cuda_device, keep_cuda_device
from inferq.gpuworker.engine.detokenizer import IncrementalDetokenizer
from inferq.gpuworker.engine.grammar import GrammarCompiler, ReasoningMarkers, gate_token
from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
from inferq.gpuworker.engine.model_runner import ModelRunner
from inferq.gpuworker.engine.outputs import EngineStats, RequestDelta
from inferq.gpuworker.engine.penalty_tokens import PenaltyTokens
from inferq.gpuworker.engine.pooling import Pooling, finished_vector
from inferq.gpuworker.engine.request import Request, RequestStatus
from inferq.gpuworker.engine.continuation import continue_from
from inferq.gpuworker.engine.scheduler import Scheduler
from inferq.gpuworker.engine.speculative.factory import make_spec_decoder
from inferq.gpuworker.models.loader import load_model
from inferq.schemas import SamplingParams

log = logging.getLogger(__name__)


def _merge(first: RequestDelta, later: RequestDelta) -> RequestDelta:
    """Two deltas of one request in one step (speculation emits several tokens) as one."""
    later.new_token_ids = first.new_token_ids + later.new_token_ids
    later.new_text = first.new_text + later.new_text
    if first.logprobs is not None:
        later.logprobs = first.logprobs + (later.logprobs or [])
    if first.prompt_logprobs is not None:
        later.prompt_logprobs = first.prompt_logprobs
    return later
_FINISHED = RequestStatus.FINISHED  # a module constant: an Enum member lookup costs ~0.2 us


class LLMEngine:
    def __init__(self, config: Optional[EngineConfig] = None, **kwargs):
        self.config = config = config or EngineConfig(**kwargs)
        self.device = config.resolved_device()
        self._cuda = self.device.type == "cuda"
        if self._cuda:  # before anything is allocated or launched
            self.device = bind_cuda_device(self.device)
        if self.device.type == "cpu":
            host_malloc.retain_freed_memory()  # a step's big temporaries: reused, not faulted in again
        dtype, why = config.resolved_dtype_and_reason(self.device)
        self.dtype = dtype
        log.info("engine dtype %s on %s (%s)", str(dtype).removeprefix("torch."), self.device, why)
        self.backend = get_backend(config.resolved_backend(self.device))
        if self.backend.name == "triton":  # the CPU kernels are batch-invariant either way
            self.backend.batch_invariant = config.batch_invariant
        loaded = load_model(config.model, dtype=dtype, device=self.device, backend=self.backend)
        self.model = loaded.model
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model_name = config.served_model_name or loaded.name
        if config.quantization is not None:
            if loaded.path.suffix == ".gguf":
                raise ValueError("quantization applies to an HF folder's weights; a GGUF file's run as stored")
            from inferq.gpuworker.models.weight_quantization import quantize_model

            kernels = "triton" if self._cuda or self.backend.name == "triton" else "cpu"
            log.info("weights quantized at load: %s", quantize_model(self.model, config.quantization, kernels))
        if config.prepack_weights is not False and self.device.type == "cpu" and hasattr(self.model, "prepack_cpu_weights"):
            # The matmul kernels are C kernels: cpu_kernels=False keeps oneDNN's packing (bf16) or none.
            packing = self.model.prepack_cpu_weights(kernels=config.cpu_kernels is not False)
            if packing:
                log.info("matmul weights prepacked for %s (CPU %s)", packing, str(dtype).removeprefix("torch."))
                host_malloc.release_free_memory()  # the plain weights' pages, freed one by one as packed
        if self.device.type == "cpu" and hasattr(self.backend, "native_decode"):
            if config.cpu_kernels is False:
                self.backend.native_decode = False
            elif hasattr(self.model, "use_cpu_kernels") and self.model.use_cpu_kernels():
                log.info("CPU C kernels on: paged decode attention, rotary%s", ", fused add + RMSNorm" if dtype == torch.bfloat16 else "")
        if config.batch_invariant and self.backend.name == "triton":
            from inferq.gpuworker.models.batch_invariant import use_batch_invariant_kernels

            if use_batch_invariant_kernels(self.model):
                log.info("batch-invariant mode: Triton matmuls and RMSNorm, fixed-size split-K attention")
        self.eos_token_ids = tuple(loaded.config.eos_token_ids)

        mc = loaded.config
        num_blocks = self._num_kv_blocks(mc, dtype)
        self.kv_caches = self.backend.allocate_kv_cache(
            mc.num_layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, dtype, self.device
        )
        max_len = mc.max_model_len if config.max_model_len is None else min(config.max_model_len, mc.max_model_len)
        # A sequence can never outgrow the whole cache, or it would preempt itself forever;
        # without chunking, a prompt must also fit in one step's budget.
        self.max_model_len = min(max_len, num_blocks * config.block_size)
        if not config.enable_chunked_prefill:
            self.max_model_len = min(self.max_model_len, config.max_num_batched_tokens)
        if self.max_model_len < max_len:
            log.warning("max_model_len capped at %d by the KV cache size", self.max_model_len)

        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            policy=config.scheduling_policy,
            enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.runner = ModelRunner(self.model, self.kv_caches, config.block_size, self.device,
                                  max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len)
        if self._cuda and self.backend.name == "triton":
            from inferq.gpuworker.engine.kernel_warmup import warm_up_triton_kernels

            warm_up_triton_kernels(self.model, self.kv_caches, self.backend, config.block_size,
                                   self.max_model_len, config.max_num_batched_tokens, self.device)
        if self._captures_cuda_graphs():
            from inferq.gpuworker.engine.cuda_graphs import DecodeGraphs

            graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, config.block_size,
                                  self.max_model_len, config.max_num_seqs, self.device)
            if graphs.capture():
                self.runner.graphs = graphs
        self.spec = make_spec_decoder(config.speculative, self) if config.speculative else None
        self.requests: dict[str, Request] = {}
        self._with_deadline: set[str] = set()
        self.num_steps = 0
        self.last_step_times = None  # (schedule s, runner StepTimes, output/detokenize s)
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0
        self._grammar: Optional[GrammarCompiler] = None
        self.reasoning = ReasoningMarkers.for_model(config.reasoning_parser, self.tokenizer)

    @property
    def grammar(self) -> GrammarCompiler:
        """Compiles structured-output constraints for this model's tokenizer (made on first use)."""
        if self._grammar is None:
            self._grammar = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids,
                                            cache_size=self.config.grammar_cache_size)
        return self._grammar

    def _captures_cuda_graphs(self) -> bool:
        return self._cuda and self.backend.name == "triton" and self.config.cuda_graphs_enabled()

    def _num_kv_blocks(self, mc, dtype: torch.dtype) -> int:
        cfg = self.config
        if cfg.num_kv_blocks:
            return cfg.num_kv_blocks
        bytes_per_block = 2 * mc.num_layers * cfg.block_size * mc.num_kv_heads * mc.head_dim * dtype.itemsize
        if cfg.kv_cache_memory:
            budget = cfg.kv_cache_memory
        elif self._cuda:
            budget = self._profile_free_gpu_memory(bytes_per_block)
        else:
            budget = EngineConfig.CPU_KV_CACHE_BYTES
        return max(1, int(budget // bytes_per_block))

    def _profile_free_gpu_memory(self, bytes_per_block: int) -> int:
        """Run one forward at the full token budget, then give the KV cache what
        gpu_memory_utilization of the device leaves after everything in use on it
        (gpuworker/engine/gpu_memory.py)."""
        from inferq.gpuworker.engine.cuda_graphs import capture_sizes
        from inferq.gpuworker.engine.gpu_memory import kv_cache_budget, margin_bytes, profile_device_memory
        from inferq.gpuworker.engine.profiling import peak_activation_bytes

        cfg = self.config
        memory = profile_device_memory(self.device, lambda: peak_activation_bytes(self))
        graph_batch = capture_sizes(cfg.max_num_seqs)[-1] if self._captures_cuda_graphs() else 0
        margin = margin_bytes(memory, cfg.max_num_batched_tokens, graph_batch, cfg.max_num_seqs,
                              self.model_config.vocab_size)
        budget = kv_cache_budget(memory, cfg.gpu_memory_utilization, margin, self.device, bytes_per_block)
        log.info("KV cache gets %.2f GiB of %s: %.2f GiB x %g, less %.2f GiB in use, %.2f GiB step peak, "
                 "%.2f GiB graphs and sampler", budget / 1024**3, self.device, memory.total / 1024**3,
                 cfg.gpu_memory_utilization, memory.in_use / 1024**3, memory.step_peak / 1024**3, margin / 1024**3)
        return budget

    # -- requests -------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: Optional[SamplingParams] = None,
        priority: int = 0,
        deadline: Optional[float] = None,
        arrival_time: Optional[float] = None,
        matcher=None,
        continue_token_ids: Sequence[int] = (),
        pooling: Optional[Pooling] = None,
    ) -> str:
        """``matcher``: the request's compiled structured-output matcher (from
        ``self.grammar.matcher``, compiled off the step loop by the caller); when the
        params have a constraint and none is given, it is compiled here.

        ``continue_token_ids``: output an earlier attempt already generated; the
        request continues after it (engine/continuation.py). Returns the text those
        tokens show ("" without them); raises CannotContinue (a ValueError) when
        they cannot be continued.

        ``pooling``: a pooling request (embeddings, engine/pooling.py): its prompt runs
        and its last delta carries the pooled vector; nothing is sampled."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if params.n != 1:
            raise ValueError("the engine runs one sample per request; expand n > 1 into n requests")
        if params.best_of not in (None, 1):
            raise ValueError("the engine runs one sample per request; best_of is the worker's (one request per "
                             "sequence, ranked in gpuworker/service/best_of.py)")
        vocab = self.model_config.vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if pooling is not None and len(prompt_token_ids) > self.max_model_len:
            raise ValueError(f"the input has {len(prompt_token_ids)} tokens, but this model's context is "
                             f"{self.max_model_len} tokens (max_model_len)")
        if pooling is None and len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_token_ids)} tokens, but this model allows at most "
                f"{self.max_model_len - 1} prompt tokens (max_model_len {self.max_model_len} "
                f"includes at least one generated token)"
            )
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.structured_outputs is not None and matcher is None:
            matcher = self.grammar.matcher(params.structured_outputs)
        req = Request(request_id, prompt_token_ids, params, priority, arrival_time, deadline, self.eos_token_ids)
        req.matcher = matcher
        gate = None if matcher is None or self.reasoning is None else self.reasoning.gate(prompt_token_ids, matcher)
        if gate is not None:
            gate.attach(req)
        if pooling is not None:
            req.pooling = dataclasses.replace(pooling, kind=pooling.kind or self.config.pooling)
            self.runner.pooling_requests += 1
        # A seeded request draws output token i from a generator seeded by (seed, i): its
        # tokens do not depend on how many positions a step verified (speculation), nor on
        # where an attempt started (a continued request draws token N as the first did).
        req.token_seed = params.seed
        req.detokenizer = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, params)
        if params.uses_penalties:
            req.penalty_tokens = PenaltyTokens(req.prompt_token_ids, self.model_config.vocab_size, self.device,
                                               with_prompt=params.repetition_penalty != 1.0)
        shown = continue_from(req, continue_token_ids, vocab, self.max_model_len)
        self.requests[request_id] = req
        if deadline is not None:
            self._with_deadline.add(request_id)
        self.scheduler.add(req)
        return shown

    def abort(self, request_id: str, reason: str = "abort") -> Optional[RequestDelta]:
        """Finish a request now (abort or deadline) and free its blocks."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        text = req.detokenizer.flush()
        return self._finish(req, reason, [], text, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step -------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        t0 = time.perf_counter()
        if self._cuda:
            keep_cuda_device(self.device)
        deltas = self._expire_deadlines()
        spec = self.spec
        if spec is not None:
            spec.propose(self.scheduler.running)
        sched = self.scheduler.schedule()
        if not sched:
            if spec is not None:
                spec.end_step(self.kv)
            return deltas
        t1 = time.perf_counter()
        sampled = self.runner.execute(sched, self.kv)
        t2 = time.perf_counter()
        if sampled.num_spec is not None:
            return self._step_speculative(sched, sampled, deltas, t0, t1, t2)
        if spec is not None:
            spec.end_step(self.kv)
        kv = self.kv
        caching = kv.enable_caching
        prompt_tokens = 0
        for s in sched.scheduled:
            if caching:
                kv.cache_computed_blocks(s.request)
            before, n_prompt = s.num_computed_before, s.request.num_prompt_tokens
            if before < n_prompt:  # a prefill chunk (decode rows skip this)
                prompt_tokens += min(before + s.num_new_tokens, n_prompt) - before
        self.num_steps += 1
        self.num_prompt_tokens += prompt_tokens
        on_token, append = self._on_token, deltas.append
        for req, token, lp in zip(sampled.requests, sampled.token_ids, sampled.logprobs):
            d = on_token(req, token, lp)
            if d is not None:
                append(d)
        if self.runner.pooling_requests:
            self._end_pooled(sched, deltas)
        # Host time split of this step (seconds), read by `inferq bench offline --step`.
        self.last_step_times = (t1 - t0, self.runner.last_times, time.perf_counter() - t2)
        return deltas

    def _step_speculative(self, sched, sampled, deltas, t0, t1, t2) -> list[RequestDelta]:
        """The rest of a step in which some requests verified proposals: their KV
        past the accepted tokens is dropped before anything is cached, then every
        request's tokens go through ``_on_token`` one by one (stops, EOS, max_tokens
        apply to each accepted token) and become one delta per request."""
        spec, kv = self.spec, self.kv
        for req, ns, tokens in zip(sampled.requests, sampled.num_spec, sampled.token_ids):
            if ns:
                accepted = len(tokens) - 1
                req.num_computed_tokens -= ns - accepted  # the rejected proposals' KV is garbage now
                spec.verified(req, ns, accepted)
        prompt_tokens = 0
        for s in sched.scheduled:
            if kv.enable_caching:
                kv.cache_computed_blocks(s.request)
            before, n_prompt = s.num_computed_before, s.request.num_prompt_tokens
            if before < n_prompt:
                prompt_tokens += min(before + s.num_new_tokens, n_prompt) - before
        self.num_steps += 1
        self.num_prompt_tokens += prompt_tokens
        on_token = self._on_token
        for req, ns, tokens, lps in zip(sampled.requests, sampled.num_spec, sampled.token_ids, sampled.logprobs):
            if not ns:
                d = on_token(req, tokens, lps)
            else:
                d = None
                for token, lp in zip(tokens, lps):
                    step_delta = on_token(req, token, lp)
                    if step_delta is None:
                        break
                    d = step_delta if d is None else _merge(d, step_delta)
                    if d.finished:
                        break
            if d is not None:
                deltas.append(d)
        if self.runner.pooling_requests:
            self._end_pooled(sched, deltas)
        spec.end_step(kv)  # after the tokens are in: only then are a request's known tokens final
        self.last_step_times = (t1 - t0, self.runner.last_times, time.perf_counter() - t2)
        return deltas

    def _end_pooled(self, sched, deltas: list) -> None:
        """Pooling requests whose whole prompt has run (after its blocks were cached):
        finished, their last delta carrying the vector."""
        for s in sched.scheduled:
            req = s.request
            if req.pooling is not None and req.status is not _FINISHED and req.num_computed_tokens >= req.num_prompt_tokens:
                d = self._finish(req, "stop", [], "", None)
                d.embedding = finished_vector(req)
                deltas.append(d)

    def _on_token(self, req: Request, token: int, logprobs) -> Optional[RequestDelta]:
        # Runs once per sampled token (256 times a step at batch 256): properties,
        # params reads and the append helper are replaced by fields the request
        # works out once (``finishing_token_ids``, ``wants_logprobs``, ``max_tokens``);
        # same checks, same order.
        if req.status is _FINISHED:  # aborted between schedule and output
            return None
        req.all_token_ids.append(token)
        out_ids = req.output_token_ids
        out_ids.append(token)
        self.num_generated_tokens += 1
        lps = [logprobs] if req.wants_logprobs else None
        plp = None
        if req.prompt_logprobs is not None and not req.prompt_logprobs_sent:
            plp, req.prompt_logprobs_sent = req.prompt_logprobs, True
        if token in req.finishing_token_ids:
            # Stop tokens (then EOS) end the request without their text.
            p = req.params
            if p.stop_token_ids and token in p.stop_token_ids:
                return self._finish(req, "stop", [token], req.detokenizer.flush(), lps, stop_reason=token, plp=plp)
            return self._finish(req, "stop", [token], req.detokenizer.flush(), lps, plp=plp)
        detok = req.detokenizer
        text, stop_str = detok.update_one(token)
        if stop_str is not None:
            return self._finish(req, "stop", [token], text, lps, stop_reason=stop_str, plp=plp)
        matcher = None if req.reasoning_gate is not None and gate_token(req, out_ids) else req.matcher
        if matcher is not None:
            # The grammar's accept state with nothing more allowed ends the request as
            # EOS would ("stop"); a refused token cannot come from a masked row.
            if not matcher.consume_token(token):
                log.error("request %s: the sampled token %d broke its constraint: %s",
                          req.request_id, token, matcher.get_error())
                return self._finish(req, "abort", [token], text + detok.flush(), lps, stop_reason="constraint", plp=plp)
            if matcher.is_stopped():
                return self._finish(req, "stop", [token], text + detok.flush(), lps, plp=plp)
        n_out = len(out_ids)
        if n_out >= req.max_tokens or len(req.all_token_ids) >= self.max_model_len:
            text += detok.flush()
            if detok.stop_hit is not None:  # a stop string in text that only settled now
                return self._finish(req, "stop", [token], text, lps, stop_reason=detok.stop_hit, plp=plp)
            return self._finish(req, "length", [token], text, lps, plp=plp)
        cached = req.num_cached_tokens
        # Positional (about half the cost of keywords, once per token): request_id,
        # new_token_ids, new_text, finished, finish_reason, logprobs, num_prompt_tokens,
        # num_output_tokens, num_cached_tokens, stop_reason, prompt_logprobs.
        return RequestDelta(req.request_id, [token], text, False, None, lps, req.num_prompt_tokens,
                            n_out, cached if cached > 0 else 0, None, plp)

    def _finish(self, req, reason, tokens, text, lps, stop_reason=None, plp=None) -> RequestDelta:
        self.scheduler.finish(req, reason)
        if self.spec is not None:
            self.spec.finished(req.request_id)
        self.requests.pop(req.request_id, None)
        self._with_deadline.discard(req.request_id)
        if req.pooling is not None:
            self.runner.pooling_requests -= 1
        return RequestDelta(
            request_id=req.request_id,
            new_token_ids=tokens,
            new_text=text,
            finished=True,
            finish_reason=reason,
            logprobs=lps,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            stop_reason=stop_reason,
            prompt_logprobs=plp,
        )

    def _expire_deadlines(self) -> list[RequestDelta]:
        if not self._with_deadline:
            return []
        now = time.time()
        expired = [rid for rid in self._with_deadline if self.requests[rid].deadline <= now]
        return [self.abort(rid, reason="deadline") for rid in expired]

    # -- observability --------------------------------------------------------
    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=self.kv.usage(),
            num_blocks=self.kv.pool.num_blocks,
            num_free_blocks=self.kv.num_free_blocks,
            prefix_cache_queries=self.kv.prefix_queries,
            prefix_cache_hits=self.kv.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.num_generated_tokens,
            num_prompt_tokens=self.num_prompt_tokens,
            num_priority_preemptions=self.scheduler.num_priority_preemptions,
            spec=None if self.spec is None else dataclasses.replace(self.spec.stats),  # a snapshot
        )

    def check_invariants(self) -> None:
        """Block pool consistent, and no block held by a finished request."""
        self.kv.check_invariants(self.scheduler.live_request_ids())
        assert set(self.requests) == self.scheduler.live_request_ids(), "engine and scheduler disagree on live requests"
