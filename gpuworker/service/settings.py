"""Worker configuration: CLI flags over INFERQ_* environment variables over defaults.

The Redis URL may carry a password / ACL user (``redis://user:pass@host/0``)
or TLS (``rediss://``); INFERQ_REDIS_USERNAME / INFERQ_REDIS_PASSWORD and the
INFERQ_REDIS_TLS_* variables override or complete it.
"""
from __future__ import annotations

import os
import socket
from typing import Literal, Optional

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from inferq.schemas import keys
from inferq.schemas.connection import sync_client
from inferq.schemas.policy import QueuePolicy

from inferq.gpuworker.config import EngineConfig


def _engine_default(knob: str):
    # The engine owns its knobs' defaults; the worker only exposes them.
    return EngineConfig.__dataclass_fields__[knob].default


# Worker settings that are EngineConfig knobs of the same name: the one mapping
# from settings to engine (see engine_config).
ENGINE_KNOBS = ("attention_backend", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "num_kv_blocks", "dtype", "device", "gpu_memory_utilization", "cuda_graphs", "batch_invariant", "pooling", "quantization",
                "reasoning_parser")


class WorkerSettings(QueuePolicy):
    """Every knob of a worker. Each field is a flag (``--max-num-seqs``), an
    environment variable (``INFERQ_MAX_NUM_SEQS``) and, for ENGINE_KNOBS, an
    EngineConfig field; its description is the flag's help."""

    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # Model and engine
    model: str = Field("", description="HF folder or .gguf file; empty for the bundled SmolLM2-135M-Instruct")
    served_model_name: Optional[str] = Field(None, description="queue/model name jobs use (default: the bundled model's name, else the folder/file name)")
    attention_backend: Optional[str] = Field(_engine_default("attention_backend"), description="torch | triton (default: triton on CUDA, torch on CPU)")
    max_num_seqs: int = Field(_engine_default("max_num_seqs"), ge=1, description="most jobs in the engine at once (also the intake capacity)")
    max_num_batched_tokens: int = Field(_engine_default("max_num_batched_tokens"), ge=1, description="token budget of one engine step")
    num_kv_blocks: Optional[int] = Field(_engine_default("num_kv_blocks"), ge=1, description="KV cache blocks (default: sized from memory)")
    block_size: int = Field(_engine_default("block_size"), description="tokens per KV block")
    max_model_len: Optional[int] = Field(_engine_default("max_model_len"), ge=2, description="cap on prompt + output tokens")
    device: Optional[str] = Field(_engine_default("device"), description="cpu | cuda | cuda:N")
    gpu_memory_utilization: float = Field(_engine_default("gpu_memory_utilization"), gt=0.0, le=1.0, description="CUDA: share of the whole GPU this worker plans for; what other processes use comes out of it")
    cuda_graphs: bool = Field(_engine_default("cuda_graphs"), description="CUDA: replay decode steps from captured CUDA graphs (false: eager, as vLLM's --enforce-eager)")
    batch_invariant: bool = Field(_engine_default("batch_invariant"), description="GPU: a job's tokens do not depend on the jobs beside it (fixed-order Triton attention, matmuls, RMSNorm), so a migrated or regenerated job gives the same tokens; false: cuBLAS and split-K by batch, faster, not invariant (the CPU path is invariant either way)")
    quantization: Optional[str] = Field(_engine_default("quantization"), description="an HF folder's weights quantized at load: int8 | int4 (CPU or CUDA) | fp8 (CUDA); default none (a GGUF runs as stored)")
    dtype: Optional[str] = Field(_engine_default("dtype"), description="auto (default: bfloat16 on CUDA or a CPU with AVX512-BF16/AMX, else float32) | float32 | bfloat16 | float16")
    torch_threads: Optional[int] = Field(None, ge=1, description="CPU compute threads (default: $OMP_NUM_THREADS, else all cores but one, left to the queue and reply work as vLLM leaves one to its front end)")
    cpu_threads_bind: str = Field("auto", description="CPU each compute thread is pinned to: auto (with 2+ threads: one per physical core of one NUMA node, its first core left free) | off | a list such as 0-3,8 (inferq_kernels/cpu/binding.py)")

    # Queue behaviour
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}", description="stable consumer name (default host-pid)")
    block_ms: int = Field(1000, ge=10, description="XREADGROUP BLOCK in ms; must stay under the socket timeout")
    coalesce_deltas: bool = Field(False, description="merge a job's deltas within one publish round trip (large batches)")
    max_flush_steps: int = Field(8, ge=1, description="engine steps merged into one pipeline when the publisher lags")

    # Lanes: priority classes and fair share (gpuworker/service/lanes.py)
    tenant_weights: str = Field("", description="fair-share weights, tenant=weight,... (others weigh 1)")
    tenant_max_running: int = Field(0, ge=0, description="most jobs of one tenant on this worker at once (0 = no cap)")
    interactive_reserve: int = Field(4, ge=0, description="interactive jobs taken past capacity while batch jobs run (the engine preempts those)")
    idle_poll_ms: int = Field(50, ge=5, description="with several lanes or partitions: how often an idle worker looks at all of them")
    steal_after_ms: int = Field(1000, ge=0, description="prefix affinity: a job waiting on another worker's lane this long may be taken by this one")
    session_ttl: int = Field(600, ge=1, description="prefix affinity: seconds a session remembers the worker that served it")

    # Structured outputs
    grammar_compile_timeout_s: float = Field(10.0, gt=0.0, description="a job whose constraint takes longer to compile fails with an error event")
    grammar_cache_size: int = Field(_engine_default("grammar_cache_size"), ge=1, description="compiled structured-output grammars kept (LRU)")
    # Test aid, off by default: slows every cold grammar compile so a compile time-out can be provoked.
    test_grammar_compile_delay_s: float = Field(0.0, ge=0.0, le=60.0, description="test aid: add this to every grammar compile (0 = off)")

    # Embeddings: a job's pooling when it names none (docs/gateway.md, "Embeddings").
    pooling: Literal["mean", "last"] = Field(_engine_default("pooling"), description="embeddings: mean | last (token) pooling of the final hidden states, when a job names none")

    # Reasoning models (docs/gateway.md "Reasoning models"), vLLM's --reasoning-parser.
    reasoning_parser: str = Field(_engine_default("reasoning_parser"), description="auto (on when the chat template knows <think>) | none | qwen3 | deepseek_r1: a structured-output constraint applies after the reasoning")

    # Speculative decoding (docs/engine.md): vLLM's --speculative-config, as JSON.
    speculative_config: Optional[str] = Field(None, description='speculative decoding as JSON, e.g. {"method": "ngram", "k": 4} (default: off)')

    check_invariants: bool = Field(False, description="verify the KV block pool after aborts and when idle (debugging)")
    # Test aid, off by default: tests that need a job to still be running at some
    # point (a deadline, a drain timeout) pace the engine instead of assuming a slow machine.
    step_pace_s: float = Field(0.0, ge=0.0, le=10.0, description="test aid: sleep this long after every engine step (0 = off)")

    # Observability
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus port (0 = off)")
    metrics_addr: str = Field("0.0.0.0", description="Prometheus bind address")
    # Generous: a first request's Triton compiles run inside one step.
    health_stall_s: float = Field(120.0, gt=0.0, description="GET /health on the metrics port answers 503 once the engine loop has not come round (a step or an idle wait) for this long")
    log_level: str = Field("info", description="debug | info | warning | error")
    log_json: bool = Field(True, description="JSON log lines (default) or console")
    log_prompts: bool = Field(False, description="include prompts in logs (off by default)")

    @model_validator(mode="after")
    def _block_below_socket_timeout(self):
        if self.block_ms / 1000 >= self.socket_timeout - 1:
            raise ValueError(f"block_ms ({self.block_ms}) must stay at least 1 s under socket_timeout ({self.socket_timeout}s)")
        return self

    @model_validator(mode="after")
    def _speculative_parses(self):
        from inferq.gpuworker.engine.speculative.config import SpeculativeConfig

        try:
            SpeculativeConfig.parse(self.speculative_config)
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"INFERQ_SPECULATIVE_CONFIG / --speculative-config: {e}") from None
        return self

    @model_validator(mode="after")
    def _threads_bind_parses(self):
        from inferq.kernels.cpu import binding

        binding.plan(self.torch_threads or 1, self.cpu_threads_bind)  # ValueError names the setting
        return self

    @model_validator(mode="after")
    def _weights_parse(self):
        self.weights()
        return self

    def weights(self) -> dict[str, float]:
        out = {}
        for item in filter(None, (x.strip() for x in self.tenant_weights.split(","))):
            tenant, sep, w = item.rpartition("=")
            try:
                out[tenant] = float(w)
            except ValueError:
                sep = ""
            if not sep or not tenant or out.get(tenant, 0) <= 0:
                raise ValueError(f"INFERQ_TENANT_WEIGHTS: {item!r} is not tenant=weight with a weight above 0")
        return out

    @property
    def model_name(self) -> str:
        return self.served_model_name or keys.served_name(self.model)

    def engine_config(self) -> EngineConfig:
        # Jobs carry a priority; equal priorities are served first come, first served.
        return EngineConfig(model=self.model or None, served_model_name=self.model_name, scheduling_policy="priority",
                            speculative=self.speculative_config or None, **{k: getattr(self, k) for k in ENGINE_KNOBS})

    @property
    def consumer_name(self) -> str:
        # Stable across restarts when worker_id is given, so a restarted worker
        # re-reads its own pending entries first.
        return self.worker_id

    def redis(self):
        return sync_client(self)

    def safe_dump(self) -> dict:
        """For logs and the config metric: no secrets, no URL password."""
        return {**self.model_dump(exclude={"redis_password", "redis_sentinel_password"}), "redis_url": self.safe_url()}
