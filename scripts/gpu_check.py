#!/usr/bin/env python3
"""One-command GPU check of inferq's Triton path (NVIDIA H200; no network; under 8 minutes).

    python3 -m scripts.gpu_check [--out DIR] [--budget-s 450] [--skip-engine] [--skip-pytest]
    TRITON_INTERPRET=1 python3 -m scripts.gpu_check --cpu-smoke   # this script's own logic, tiny shapes, on CPU

Run from the repository root with inferq installed: the kernel checks borrow the test
suite's paged batches (tests/kernels), which `-m` finds in the checkout.

Needs only PyTorch and Triton. Everything else is optional and skipped with a
reason when missing (carry wheels as scripts/gpu_check.sh explains):

1. kernels   Triton vs the torch reference on the GPU: fp16/bf16/fp32, GQA 1-8,
             head sizes 64/128, block sizes 16-128, prefill chunks with context,
             mixed batches, split-K forced and automatic; NaN-poisoned outputs.
2. decode    one layer's attention for decode batches 1/64/256 at 1k context
             with SmolLM2-135M shapes (Hq 9, Hkv 3, D 64, bf16, block 16):
             time, bytes moved, achieved GB/s next to the 4.8 TB/s floor; the
             torch backend on the same batch for comparison.
3. engine    the offline benchmark, inferq.bench.offline (64 requests,
             prompts 16-512, outputs 16-256, ignore_eos) on SmolLM2-135M's
             architecture in bf16, the engine on its CUDA default (triton)
             against HF transformers generate with static batches, same GPU.
             Random weights: the real ones cannot be carried to the GPU
             machine (see docs/kernels.md).
4. pytest    tests/kernels compiled on the GPU (if pytest is installed).

Prints one table at the end and writes it as JSON to --out (default: $OUT or .).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_SMOKE = "--cpu-smoke" in sys.argv
if CPU_SMOKE:  # must precede any inferq.kernels.* import: triton.jit reads it at definition time
    os.environ["TRITON_INTERPRET"] = "1"
else:
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels only

import torch  # noqa: E402

DEVICE = torch.device("cpu" if CPU_SMOKE else "cuda")

H200_BANDWIDTH = 4.8e12  # bytes/s, vendor datasheet (REFERENCES.md)
# Whole decode-step floors from REFERENCES.md (weights + KV at 1k context, 30 layers), µs.
STEP_FLOOR_US = {1: 61, 64: 371, 256: 1310}
SMOL = dict(num_heads=9, num_kv_heads=3, head_dim=64, layers=30)

ROWS: list[dict] = []


def row(section: str, item: str, result: str, detail: str = "") -> None:
    ROWS.append({"section": section, "item": item, "result": result, "detail": detail})
    print(f"[{section}] {item}: {result} {detail}", flush=True)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# --------------------------------------------------------------------------- 1. kernels
KERNEL_CASES = [
    # name, chunks (context_len, query_len), Hq, Hkv, D, block size, dtype, num_kv_splits
    ("smollm mixed", [(0, 37), (100, 1), (1023, 1), (16, 16), (5, 60)], 9, 3, 64, 16, torch.bfloat16, None),
    ("smollm mixed", [(0, 37), (100, 1), (1023, 1), (16, 16), (5, 60)], 9, 3, 64, 16, torch.float16, None),
    ("llama8b-like chunk", [(1000, 512), (300, 1), (0, 200)], 32, 8, 128, 16, torch.bfloat16, None),
    ("gqa1 d128 bs32", [(70, 33), (0, 1), (511, 1)], 8, 8, 128, 32, torch.float16, None),
    ("gqa4 bs128", [(130, 1), (257, 70), (0, 129)], 16, 4, 64, 128, torch.bfloat16, None),
    ("gqa8 bs64 d128", [(64, 64), (1, 1), (999, 1)], 32, 4, 128, 64, torch.bfloat16, None),
    ("split-K auto 1 seq 4k", [(4095, 1)], 9, 3, 64, 16, torch.bfloat16, None),
    ("split-K forced 5 decodes", [(2000, 1), (1, 1), (300, 1), (777, 1), (16, 1)], 9, 3, 64, 16, torch.float16, 7),
    ("split-K forced mixed", [(0, 100), (500, 1), (40, 20)], 8, 2, 64, 16, torch.bfloat16, 4),
    ("ieee dots", [(0, 50), (200, 1), (33, 17)], 6, 2, 64, 16, torch.float32, None),
    ("d128 split", [(900, 1), (10, 1)], 4, 1, 128, 16, torch.float32, 8),
]


def check_kernels(budget: Budget) -> None:
    from inferq.kernels import reference
    from inferq.kernels.reshape_and_cache import reshape_and_cache
    from inferq.kernels.runtime import is_interpreted
    from inferq.kernels.unified_attention import _unified_attention_kernel, unified_attention
    from tests.kernels.paged_batch import ERROR_BOUNDS, make_paged_batch

    assert is_interpreted(_unified_attention_kernel) == CPU_SMOKE, "kernels compiled/interpreted the wrong way"
    dev = DEVICE
    for name, chunks, hq, hkv, d, bs, dtype, splits in KERNEL_CASES:
        if CPU_SMOKE:  # the interpreter is slow: shrink every sequence
            chunks = [(min(c, 40), min(q, 9)) for c, q in chunks]
            hq, hkv = hq // hkv, 1
        if budget.left() < 60:
            row("kernels", name, "SKIPPED", "time budget")
            continue
        batch = make_paged_batch(
            chunks, num_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
            dtype=dtype, device=dev, seed=len(name), pad_rows=3,
        )
        scale = d**-0.5
        out = unified_attention(*batch.attention_args(batch.poisoned_out(), scale, splits))
        ref = reference.unified_attention(*batch.attention_args(batch.poisoned_out(), scale))
        synchronize()
        n = batch.num_rows
        diff = (out[:n].float() - ref[:n].float()).abs()
        bound = ERROR_BOUNDS[dtype]
        ratio = (diff / (bound["atol"] + bound["rtol"] * ref[:n].float().abs())).max().item()
        nan_rows = int(out[:n].isnan().any(dim=(1, 2)).sum())
        pad_touched = not bool(out[n:].isnan().all())
        ok = nan_rows == 0 and not pad_touched and ratio <= 1.0
        row(
            "kernels", f"{name} {str(dtype)[6:]}", "PASS" if ok else "FAIL",
            f"max|err| {diff.max().item():.2e} = {ratio:.2f} of bound; nan rows {nan_rows}; pad written {pad_touched}",
        )

    # reshape_and_cache: bit-exact against the reference, negative slots skipped
    gen = torch.Generator().manual_seed(0)
    num_tokens = 20 if CPU_SMOKE else 300
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        shape = (64, 16, 8, 128)
        kc = torch.randn(shape, generator=gen).to(dtype).to(dev)
        vc = torch.randn(shape, generator=gen).to(dtype).to(dev)
        key = torch.randn(num_tokens, 8, 128, generator=gen).to(dtype).to(dev)
        val = torch.randn(num_tokens, 8, 128, generator=gen).to(dtype).to(dev)
        slots = torch.randperm(64 * 16, generator=gen)[:num_tokens].to(dev)
        slots[::7] = -1
        kr, vr = kc.clone(), vc.clone()
        reference.reshape_and_cache(key, val, kr, vr, slots)
        reshape_and_cache(key, val, kc, vc, slots)
        ok = torch.equal(kc, kr) and torch.equal(vc, vr)
        row("kernels", f"reshape_and_cache {str(dtype)[6:]}", "PASS" if ok else "FAIL", "bit-exact vs reference")


# --------------------------------------------------------------------------- 2. decode timing
def decode_batch(num_seqs: int, seq_len: int, block_size: int = 16, dtype=torch.bfloat16):
    """A decode-only step: every sequence has seq_len tokens, the last one new."""
    dev = DEVICE
    hq, hkv, d = SMOL["num_heads"], SMOL["num_kv_heads"], SMOL["head_dim"]
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq + 8
    key_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    value_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    tables = torch.randperm(num_blocks, device=dev)[: num_seqs * blocks_per_seq].view(num_seqs, blocks_per_seq)
    return dict(
        q=torch.randn(num_seqs, hq, d, device=dev, dtype=dtype),
        k=torch.randn(num_seqs, hkv, d, device=dev, dtype=dtype),
        v=torch.randn(num_seqs, hkv, d, device=dev, dtype=dtype),
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables.int().contiguous(),
        seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=dev),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32, device=dev),
        slot_mapping=(tables[:, (seq_len - 1) // block_size].long() * block_size + (seq_len - 1) % block_size),
        num_seqs=num_seqs,
        seq_len=seq_len,
        block_size=block_size,
    )


def attention_bytes(b: dict) -> int:
    """Bytes one layer's decode attention must move: K and V of every context token, q in, out."""
    elt = b["key_cache"].element_size()
    kv = 2 * b["num_seqs"] * b["seq_len"] * SMOL["num_kv_heads"] * SMOL["head_dim"] * elt
    qo = 2 * b["num_seqs"] * SMOL["num_heads"] * SMOL["head_dim"] * elt
    return kv + qo


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn) -> float:
    if CPU_SMOKE:  # one interpreted run: checks the plumbing, not the speed
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # flushes L2 between runs


def time_graph_ms(fn, calls: int = 20, replays: int = 10) -> float | None:
    """Device time of fn without launch overhead: `calls` x (L2 flush, fn) captured in one CUDA
    graph, minus a graph of the flushes alone. do_bench's eager timing of a few-µs kernel mostly
    measures the host launching it; an engine that replays CUDA graphs pays only this."""
    if CPU_SMOKE:
        return None
    flush = torch.empty(128 * 2**20, dtype=torch.int8, device=DEVICE)  # twice the H200's 60 MB L2
    fn()  # compile and warm outside the capture
    torch.cuda.synchronize()

    def capture(with_fn: bool):
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    flush.zero_()
                    if with_fn:
                        fn()
        torch.cuda.current_stream().wait_stream(stream)
        return graph

    def replay_ms(graph) -> float:
        graph.replay()  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    try:
        with_fn, flush_only = capture(True), capture(False)
        return max(replay_ms(with_fn) - replay_ms(flush_only), 0.0) / calls
    except Exception as exc:
        print(f"graph timing failed: {exc!r}", flush=True)
        return None


def time_decode(budget: Budget) -> None:
    from inferq.kernels.split_k_decode import choose_num_kv_splits
    from inferq.kernels.unified_attention import unified_attention

    seq_len = 64 if CPU_SMOKE else 1024
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE.type == "cuda" else 132
    torch_backend = metadata_cls = None
    try:
        from inferq.gpuworker.attention.base import AttentionMetadata as metadata_cls
        from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend
        from inferq.gpuworker.attention.triton_backend import TritonAttentionBackend

        torch_backend, triton_backend = TorchAttentionBackend(), TritonAttentionBackend()
    except Exception as exc:  # the backends only need torch, but say why if they fail
        row("decode", "backend comparison", "SKIPPED", f"inferq.gpuworker.attention import failed: {exc!r}")

    for num_seqs in (1, 64, 256):
        if CPU_SMOKE and num_seqs > 1:
            continue
        if budget.left() < 45:
            row("decode", f"batch {num_seqs}", "SKIPPED", "time budget")
            continue
        b = decode_batch(num_seqs, seq_len)
        scale = SMOL["head_dim"] ** -0.5
        out = torch.empty_like(b["q"])
        auto_splits = choose_num_kv_splits(num_seqs, SMOL["num_kv_heads"], 1, seq_len, sms)

        def attend(splits):
            return lambda: unified_attention(
                b["q"], b["key_cache"], b["value_cache"], out, b["query_start_loc"], b["seq_lens"],
                b["block_tables"], 1, seq_len, scale, splits,
            )

        nbytes = attention_bytes(b)
        floor_us = nbytes / H200_BANDWIDTH * 1e6
        t_auto = time_ms(attend(None)) * 1e3
        t_graph = time_graph_ms(attend(None))
        detail = (
            f"eager {t_auto:.1f} µs/layer ({auto_splits} split{'s' if auto_splits > 1 else ''}); "
            f"{nbytes / 1e6:.2f} MB -> {nbytes / t_auto / 1e3:.0f} GB/s = {100 * floor_us / t_auto:.0f}% of 4.8 TB/s "
            f"(floor {floor_us:.1f} µs); x30 layers {30 * t_auto:.0f} µs vs whole-step floor "
            f"{STEP_FLOOR_US.get(num_seqs, '?')} µs"
        )
        row("decode", f"batch {num_seqs} @{seq_len} triton attention", f"{nbytes / t_auto / 1e3:.0f} GB/s", detail)
        if t_graph:
            t_graph *= 1e3
            row("decode", f"batch {num_seqs} @{seq_len} triton attention, CUDA graph",
                f"{nbytes / t_graph / 1e3:.0f} GB/s",
                f"{t_graph:.1f} µs/layer without launch overhead, L2 flushed = {100 * floor_us / t_graph:.0f}% of "
                f"4.8 TB/s; x30 layers {30 * t_graph:.0f} µs")
        if auto_splits > 1:
            t_one = time_ms(attend(1)) * 1e3
            t_one_graph = time_graph_ms(attend(1))
            graph_note = ""
            if t_graph and t_one_graph:
                graph_note = f"; CUDA graph {t_one_graph * 1e3:.1f} µs, split-K speed-up x{t_one_graph * 1e3 / t_graph:.2f}"
            row("decode", f"batch {num_seqs} @{seq_len} without split-K", f"{nbytes / t_one / 1e3:.0f} GB/s",
                f"eager {t_one:.1f} µs/layer, split-K speed-up x{t_one / t_auto:.2f}{graph_note}")
        if torch_backend is not None:
            meta = metadata_cls(
                slot_mapping=b["slot_mapping"], query_start_loc=b["query_start_loc"], seq_lens=b["seq_lens"],
                context_lens=b["seq_lens"] - 1, block_tables=b["block_tables"], max_query_len=1,
                max_seq_len=seq_len, block_size=b["block_size"], query_lens_cpu=[1] * num_seqs,
                seq_lens_cpu=[seq_len] * num_seqs,
            )
            cache = (b["key_cache"], b["value_cache"])
            t_triton = time_ms(lambda: triton_backend.forward(b["q"], b["k"], b["v"], cache, meta, scale)) * 1e3
            t_torch = time_ms(lambda: torch_backend.forward(b["q"], b["k"], b["v"], cache, meta, scale)) * 1e3
            row("decode", f"batch {num_seqs} @{seq_len} backend forward", f"triton {t_triton:.1f} µs vs torch {t_torch:.1f} µs",
                f"cache write + attention; triton x{t_torch / t_triton:.1f} faster")
        del b
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------- 3. engine
SMOLLM2_CONFIG = dict(  # SmolLM2-135M-Instruct, as the engine converts the bundled GGUF
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    rms_norm_eps=1e-5, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2, hidden_act="silu",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def find_tokenizer(arg: str | None) -> Path | None:
    """The SmolLM2 tokenizer files: --tokenizer, the carried .gpu_carry/tokenizer, or the local GGUF conversion."""
    for candidate in (arg, REPO / ".gpu_carry" / "tokenizer"):
        if candidate and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    try:
        from tests.tiny_models import tokenizer_source

        return tokenizer_source()
    except Exception:
        return None


def smollm2_shaped_model(folder: Path, tokenizer: Path, small: bool) -> Path:
    """SmolLM2-135M's architecture with random bf16 weights: same FLOPs and bytes per token.

    The real weights (a 98 MB GGUF) exceed what can be carried to the GPU
    machine, and throughput with ignore_eos does not depend on weight values.
    """
    import shutil

    import transformers

    cfg = dict(SMOLLM2_CONFIG)
    if small:  # --cpu-smoke
        cfg.update(hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
                   num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():  # wider than HF's init so logits are not flat
            p.normal_(0.0, 0.05)
    model.to(torch.float32 if small else torch.bfloat16).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def run_engine_benchmark(budget: Budget, out_dir: Path, tokenizer_arg: str | None) -> None:
    """The offline benchmark (inferq.bench.offline) on a SmolLM2-shaped bf16 model."""
    missing = [m for m in ("transformers", "pydantic", "safetensors") if not _importable(m)]
    if missing:
        row("engine", "offline benchmark", "SKIPPED", f"missing packages {missing}; carry wheels (scripts/gpu_check.sh)")
        return
    tokenizer = find_tokenizer(tokenizer_arg)
    if tokenizer is None:
        row("engine", "offline benchmark", "SKIPPED", "no SmolLM2 tokenizer files (bash scripts/gpu_check.sh prepare)")
        return
    if budget.left() < 150:
        row("engine", "offline benchmark", "SKIPPED", "time budget")
        return
    import tempfile

    small = CPU_SMOKE
    model_dir = smollm2_shaped_model(Path(tempfile.mkdtemp(prefix="smollm2-shaped-")), tokenizer, small)
    run_bench_offline(budget, out_dir, model_dir, small)


def run_bench_offline(budget: Budget, out_dir: Path, model_dir: Path, small: bool) -> bool:
    """inferq.bench.offline (engine vs HF generate static batches) in a child
    process, so a hang costs only its timeout; True if it ran."""
    timeout = int(budget.left() - 60)  # leave room for pytest
    if timeout < 90:
        row("engine", "offline benchmark", "SKIPPED", "time budget")
        return False
    cmd = [
        sys.executable, "-m", "inferq.bench.offline", "--model", str(model_dir), "--device", str(DEVICE),
        "--dtype", "float32" if small else "bfloat16", "--threads", "4", "--peers", "static",
        "--static-batch-size", "64", "--json", str(out_dir / "bench_offline.json"),
    ]
    if small:
        cmd += ["--num-requests", "4", "--min-input", "4", "--max-input", "24", "--min-output", "2", "--max-output", "6"]
    row("engine", "command", "RUN", " ".join(cmd[1:]).replace(str(REPO) + "/", ""))
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row("engine", "offline benchmark", "TIMEOUT", f"after {timeout}s")
        return False
    (out_dir / "bench_offline.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        row("engine", "offline benchmark", "FAIL", f"rc {proc.returncode}: {proc.stderr.strip()[-600:]}")
        return False
    for line in proc.stdout.strip().splitlines()[-10:]:
        row("engine", "bench_offline", "", line.strip())
    return True


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --------------------------------------------------------------------------- 4. pytest
def run_pytest(budget: Budget, out_dir: Path) -> None:
    if not _importable("pytest"):
        row("pytest", "tests/kernels", "SKIPPED", "pytest is not installed")
        return
    timeout = int(budget.left() - 10)
    if timeout < 60:
        row("pytest", "tests/kernels", "SKIPPED", "time budget")
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels", "-k", "not engine"]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row("pytest", "tests/kernels", "TIMEOUT", f"after {timeout}s")
        return
    (out_dir / "pytest_kernels.log").write_text(proc.stdout + proc.stderr)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    row("pytest", "tests/kernels (compiled, CUDA)", "PASS" if proc.returncode == 0 else "FAIL", summary)


# --------------------------------------------------------------------------- main
def print_table() -> None:
    widths = [max(len(r[k]) for r in ROWS + [{"section": "section", "item": "item", "result": "result"}])
              for k in ("section", "item", "result")]
    print("\n" + "=" * 100)
    print(f"{'section':<{widths[0]}} | {'item':<{widths[1]}} | {'result':<{widths[2]}} | detail")
    print("-" * 100)
    for r in ROWS:
        print(f"{r['section']:<{widths[0]}} | {r['item']:<{widths[1]}} | {r['result']:<{widths[2]}} | {r['detail']}")
    print("=" * 100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for gpu_check.json and logs")
    parser.add_argument("--budget-s", type=float, default=450, help="wall-clock budget for the whole check")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-pytest", action="store_true")
    parser.add_argument("--cpu-smoke", action="store_true", help="run this script's logic on CPU, tiny shapes")
    parser.add_argument("--tokenizer", help="folder with the SmolLM2 tokenizer files (default .gpu_carry/tokenizer)")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)

    if not CPU_SMOKE and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch; nothing to check (try --cpu-smoke)", file=sys.stderr)
        return 2
    import triton

    if CPU_SMOKE:
        row("env", "device", "CPU (TRITON_INTERPRET=1 smoke run)", "figures below are NOT GPU measurements")
    else:
        props = torch.cuda.get_device_properties(0)
        row("env", "device", props.name, f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
    row("env", "versions", f"torch {torch.__version__}, triton {triton.__version__}", f"python {sys.version.split()[0]}")

    sections = [("kernels", lambda: check_kernels(budget)), ("decode", lambda: time_decode(budget))]
    if not args.skip_engine:
        sections.append(("engine", lambda: run_engine_benchmark(budget, out_dir, args.tokenizer)))
    if not args.skip_pytest:
        sections.append(("pytest", lambda: run_pytest(budget, out_dir)))
    for name, fn in sections:
        start = time.monotonic()
        try:
            fn()
        except Exception as exc:
            traceback.print_exc()
            row(name, "section", "ERROR", repr(exc)[:500])
        print(f"[{name}] took {time.monotonic() - start:.1f}s", flush=True)

    print_table()
    (out_dir / "gpu_check.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                        "rows": ROWS}, indent=1))
    failed = [r for r in ROWS if r["result"] in ("FAIL", "ERROR", "TIMEOUT")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
