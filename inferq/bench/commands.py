"""Every ``inferq bench`` command and its one-line description, by group.

``inferq bench NAME`` runs ``inferq.bench.<NAME with - as _>``'s ``main(argv)``, imported
only then (most import torch); ``serve`` is inferq.bench.cli's own. Plain data, so that
``inferq bench --help`` imports nothing else.
"""
from __future__ import annotations

GROUPS: dict[str, dict[str, str]] = {
    "serving and the queue": {
        "serve": "load-test a running inferq through Redis or the gateway (like `vllm bench serve`)",
        "serve-vs-vllm": "inferq through Redis vs `vllm serve`, same model and arrivals, alternating rounds",
        "llama-cpp-peer": "inferq's gateway vs `llama-server` on one GGUF file: one long request, 24 mixed ones, 1-2 threads",
        "llama-cpp-build": "build (or find) llama.cpp's llama-server, llama-quantize and llama-perplexity; make the GGUF copies",
        "synthetic-gguf": "a GGUF of a real model's shape (llama-8b) with random Q4_K_M / Q8_0 / Q4_0 blocks, for both engines",
        "gateway-vs-sdk": "the gateway (OpenAI HTTP) vs the SDK (Redis) on one `inferq up`",
        "queue-overhead": "what the queue and reply path add per job vs the same engine in-process; publisher events/s",
        "redis-cost": "Redis commands, bytes and server CPU per job and per reply event, with a real worker",
        "lanes": "queue lanes on real workers: priority classes, tenant fair share, prefix affinity",
        "dashboard-scale": "the dashboard's views with 10,000 jobs and 100 lanes in Redis: time and Redis commands each",
        "ttft-trace": "where a job's time to first token goes in a running worker (traced worker, then reports)",
    },
    "the engine, in this process": {
        "offline": "offline throughput: inferq engine vs HF generate vs HF generate_batch (and vs vLLM)",
        "modes": "the four batching modes on one mixed workload; paged vs contiguous KV waste",
        "structured": "a JSON Schema on every request vs the same mix unconstrained (and vs vLLM)",
        "speculative": "n-gram speculative decoding vs plain decoding on copy-heavy and random mixes (and vs vLLM)",
        "migration": "a taken-over job finished by continuing its published tokens vs regenerating them",
        "step": "per-step host overhead (schedule, prepare, forward, sample, output) at batch 1/64/256",
        "step-breakdown": "a batch-1 decode step split into kernels, model ops, sampler, detokenizer, bookkeeping, Python; vs the weight stream of its bytes",
        "prompt-step": "a prompt step joining running decodes, then a decode step, on the bundled model",
        "perplexity": "perplexity and KL vs the fp32 model per GGUF quantization type, beside `llama-perplexity`",
        "weight-memory": "the engine's resident memory on a model (default the bundled one) beside one copy of its weights",
        "host-malloc": "the CPU engine with glibc's malloc thresholds raised (the default) vs not",
        "roofline": "the CPU path's scaling model: ceilings measured at 1..N threads, steps projected to servers",
    },
    "CPU kernels and libraries": {
        "cpu-matmul": "decode-sized CPU matmuls: our kernels vs oneDNN's prepacked weights vs F.linear",
        "quant-matmul": "GGUF quantized matmuls (int8 and float activations) vs the bf16 panels, per type",
        "decode-attention": "one layer's decode attention on the CPU: the C kernel vs gather + SDPA",
        "prefill-attention": "one layer's prefill attention on the CPU, per prefill route of the torch backend",
        "grammar-libs": "llguidance vs xgrammar on the bundled tokenizer: compile and token-mask times",
    },
}

BENCHMARKS: dict[str, str] = {name: line for group in GROUPS.values() for name, line in group.items()}


def module_of(name: str) -> str:
    return "inferq.bench." + name.replace("-", "_")
