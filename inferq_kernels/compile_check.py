"""Compile every kernel for an NVIDIA GPU without one: ``python -m inferq.kernels.compile_check``.

Triton's compiler and ``ptxas`` (bundled with the triton wheel) run on any
Linux machine, so CPU-only CI can prove the compiled path builds: Python AST
-> Triton IR -> LLVM -> PTX -> cubin for, by default, Hopper (sm_90, the
H100/H200). It compiles the same constexpr variants a real launch would use
(``kernel_constants`` etc.), for shapes the engine meets: SmolLM2-135M
(Hq 9 / Hkv 3 / D 64), Llama-3-8B (32 / 8 / 128), a tiny test model (D 16),
each in decodes, split-K decodes and prefill tiles, in bf16, fp16 and fp32.

It checks that each variant compiles and fits in shared memory; it cannot
check numerics or speed (scripts/gpu_check.py does, on a GPU). Must run
without TRITON_INTERPRET (the interpreter has nothing to compile).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HOPPER_SHARED_MEMORY = 227 * 1024  # bytes one block may use on sm_90


def _signature(kernel, args: dict, constexprs: dict) -> tuple[dict, dict, dict]:
    """Types, constants and alignment attributes for ``args``, specialised as a launch would be.

    Triton's own launch binder decides (``inferq.kernels.compile_key``): pointers and
    ints divisible by 16 get ``tt.divisibility = 16`` (this is what lets Triton
    vectorise loads) and an int equal to 1 becomes a constant, except for the
    arguments the kernel declares ``do_not_specialize`` / ``do_not_specialize_on_alignment``.
    """
    from inferq.kernels.compile_key import cuda_backend, specialization

    ordered = tuple(constexprs[name] if name in constexprs else args[name] for name in kernel.arg_names)
    spec, _ = specialization(kernel, ordered, {})
    signature, constants, attrs = {}, {}, {}
    for index, (name, (kind, key)) in enumerate(zip(kernel.arg_names, spec)):
        signature[name] = kind
        if kind == "constexpr":  # declared constexpr, or an int equal to 1 baked in
            constants[name] = key
        elif isinstance(key, str) and key:
            attrs[(index,)] = cuda_backend().parse_attr(key)
    return signature, constants, attrs


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def attention_variant(dtype, num_heads, num_kv_heads, head_dim, block_size, max_query_len, num_kv_splits):
    from inferq.kernels.unified_attention import LAUNCH_OPTIONS, _unified_attention_kernel, kernel_constants

    const = kernel_constants(dtype, "cuda", num_heads, num_kv_heads, head_dim, block_size, max_query_len, num_kv_splits)
    q = _meta((64, num_heads, head_dim), dtype)
    cache = _meta((100, block_size, num_kv_heads, head_dim), dtype)
    part = _meta((64, num_heads, max(num_kv_splits, 1), const["DIM_PAD"]), torch.float32)
    ints = _meta((9,), torch.int32)
    tables = _meta((8, 40), torch.int32)
    args = dict(
        q_ptr=q, key_cache_ptr=cache, value_cache_ptr=cache, out_ptr=q, part_out_ptr=part, part_lse_ptr=part,
        query_start_loc_ptr=ints, seq_lens_ptr=ints, block_tables_ptr=tables, num_seqs=8, num_heads=num_heads,
        scale_log2=0.18,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2),
        stride_ot=q.stride(0), stride_oh=q.stride(1), stride_od=q.stride(2),
        stride_cb=cache.stride(0), stride_cs=cache.stride(1), stride_ch=cache.stride(2), stride_cd=cache.stride(3),
        stride_block_table=tables.stride(0),
    )
    name = (
        f"unified_attention {str(dtype)[6:]} Hq{num_heads}/Hkv{num_kv_heads} D{head_dim} bs{block_size} "
        f"max_q{max_query_len} splits{num_kv_splits}"
    )
    return name, _unified_attention_kernel, args, const, LAUNCH_OPTIONS


def merge_variant(dtype, num_heads, head_dim, num_kv_splits):
    import triton

    from inferq.kernels.split_k_decode import MERGE_LAUNCH_OPTIONS, _merge_kv_splits_kernel, merge_constants

    const = merge_constants(num_kv_splits, head_dim, max(16, triton.next_power_of_2(head_dim)))
    out = _meta((64, num_heads, head_dim), dtype)
    part = _meta((64, num_heads, num_kv_splits, const["DIM_PAD"]), torch.float32)
    args = dict(
        part_out_ptr=part, part_lse_ptr=part, out_ptr=out, query_start_loc_ptr=_meta((9,), torch.int32),
        num_seqs=8, num_heads=num_heads, stride_ot=out.stride(0), stride_oh=out.stride(1), stride_od=out.stride(2),
    )
    name = f"merge_kv_splits {str(dtype)[6:]} Hq{num_heads} D{head_dim} splits{num_kv_splits}"
    return name, _merge_kv_splits_kernel, args, const, MERGE_LAUNCH_OPTIONS


def cache_write_variant(dtype, num_kv_heads, head_dim, block_size):
    from inferq.kernels.reshape_and_cache import CACHE_WRITE_LAUNCH_OPTIONS, _reshape_and_cache_kernel, cache_write_constants

    key = _meta((64, num_kv_heads, head_dim), dtype)
    cache = _meta((100, block_size, num_kv_heads, head_dim), dtype)
    args = dict(
        key_ptr=key, value_ptr=key, key_cache_ptr=cache, value_cache_ptr=cache,
        slot_ptr=_meta((64,), torch.int64),
        stride_kt=key.stride(0), stride_kh=key.stride(1), stride_kd=key.stride(2),
        stride_vt=key.stride(0), stride_vh=key.stride(1), stride_vd=key.stride(2),
        stride_cb=cache.stride(0), stride_cs=cache.stride(1), stride_ch=cache.stride(2), stride_cd=cache.stride(3),
        block_size=block_size,
    )
    name = f"reshape_and_cache {str(dtype)[6:]} Hkv{num_kv_heads} D{head_dim} bs{block_size}"
    return name, _reshape_and_cache_kernel, args, cache_write_constants(num_kv_heads, head_dim), CACHE_WRITE_LAUNCH_OPTIONS


def invariant_attention_variant(dtype, num_heads, num_kv_heads, head_dim, block_size, num_kv_splits):
    """Batch-invariant mode: the decode tile for every row, fixed 512-key segments."""
    from inferq.kernels.split_k_decode import KV_SPLIT_TOKENS
    from inferq.kernels.unified_attention import kernel_constants

    name, kernel, args, _, options = attention_variant(dtype, num_heads, num_kv_heads, head_dim, block_size, 1,
                                                       num_kv_splits)
    const = kernel_constants(dtype, "cuda", num_heads, num_kv_heads, head_dim, block_size, 512, num_kv_splits,
                             KV_SPLIT_TOKENS)
    return "batch-invariant " + name, kernel, args, const, options


def invariant_merge_variant(dtype, num_heads, head_dim, num_kv_splits):
    import triton

    from inferq.kernels.split_k_decode import merge_constants

    name, kernel, args, _, options = merge_variant(dtype, num_heads, head_dim, num_kv_splits)
    const = merge_constants(num_kv_splits, head_dim, max(16, triton.next_power_of_2(head_dim)), in_order=True)
    return "batch-invariant " + name, kernel, args, const, options


def matmul_variant(dtype, n, k, bias: bool):
    from inferq.kernels.batch_invariant_matmul import _batch_invariant_matmul_kernel, tile_config

    config = tile_config(dtype)
    options = {key: config.pop(key) for key in ("num_warps", "num_stages")}
    x, w, out = _meta((100, k), dtype), _meta((n, k), dtype), _meta((100, n), dtype)
    args = dict(x_ptr=x, w_ptr=w, bias_ptr=_meta((n,), dtype), out_ptr=out, M=100, N=n, K=k, num_programs=132,
                stride_xm=k, stride_xk=1, stride_wn=k, stride_wk=1, stride_om=n, stride_on=1)
    const = {**config, "HAS_BIAS": bias, "DOT_IN_FP32": dtype == torch.float32}
    return f"batch-invariant matmul {str(dtype)[6:]} N{n} K{k} bias {bias}", _batch_invariant_matmul_kernel, args, const, options


def weight_only_variant(dtype, kind, n, k):
    from inferq.kernels.weight_only_matmul import _KIND_CODE, _weight_only_matmul_kernel, tile_config

    config = tile_config(dtype, kind)
    options = {key: config.pop(key) for key in ("num_warps", "num_stages")}
    stored = {"fp8": torch.float8_e4m3fn, "int8": torch.int8, "int4": torch.uint8}[kind]
    packed_k = k // 2 if kind == "int4" else k
    groups = k // 128 if kind == "int4" else 1
    args = dict(x_ptr=_meta((100, k), dtype), w_ptr=_meta((n, packed_k), stored), scale_ptr=_meta((n, groups), FP32),
                bias_ptr=_meta((n,), dtype), out_ptr=_meta((100, n), dtype), M=100, N=n, K=k,
                stride_xm=k, stride_xk=1, stride_wn=packed_k, stride_wk=1, stride_sn=groups, stride_sg=1,
                stride_om=n, stride_on=1)
    const = {**config, "KIND": _KIND_CODE[kind], "GROUP": 128 if kind == "int4" else 1, "HAS_BIAS": False,
             "DOT_IN_FP32": dtype == torch.float32}
    return f"weight-only {kind} matmul {str(dtype)[6:]} N{n} K{k}", _weight_only_matmul_kernel, args, const, options


def rms_norm_variant(dtype, hidden):
    from inferq.kernels.batch_invariant_rowwise import _block, _rms_norm_kernel

    x = _meta((100, hidden), dtype)
    args = dict(x_ptr=x, w_ptr=_meta((hidden,), dtype), out_ptr=x, num_rows=100, n=hidden, stride_x=hidden,
                stride_o=hidden, eps=1e-5)
    return f"batch-invariant rms_norm {str(dtype)[6:]} {hidden}", _rms_norm_kernel, args, dict(BLOCK=_block(hidden)), dict(num_warps=4)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
CORE_VARIANTS = [
    # SmolLM2-135M in bf16, the engine's CUDA default: decode, split-K decode, prefill
    lambda: attention_variant(BF16, 9, 3, 64, 16, 1, 1),
    lambda: attention_variant(BF16, 9, 3, 64, 16, 1, 8),
    lambda: attention_variant(BF16, 9, 3, 64, 16, 512, 1),
    # Llama-3-8B shapes: D 128, GQA 4
    lambda: attention_variant(BF16, 32, 8, 128, 16, 512, 1),
    # fp32 with D 128 (IEEE dots, narrower key tiles) and split-K
    lambda: attention_variant(FP32, 8, 8, 128, 32, 64, 2),
    lambda: merge_variant(BF16, 9, 64, 8),
    lambda: cache_write_variant(BF16, 3, 64, 16),
    lambda: cache_write_variant(FP32, 1, 16, 16),  # a single KV head: a 1-wide head axis
    # quantized weights (weight_only_matmul): FP8 checkpoints, int4 groups, at Llama-3-8B's width
    lambda: weight_only_variant(BF16, "fp8", 4096, 4096),
    lambda: weight_only_variant(BF16, "int4", 4096, 4096),
]
EXTRA_VARIANTS = [
    lambda: attention_variant(FP16, 8, 8, 128, 32, 300, 1),
    lambda: attention_variant(BF16, 32, 8, 128, 16, 1, 4),
    lambda: attention_variant(BF16, 4, 2, 16, 16, 1, 1),  # tiny test models
    lambda: attention_variant(FP16, 32, 4, 128, 128, 64, 1),  # GQA 8, block size 128
    lambda: attention_variant(FP32, 6, 2, 64, 16, 1, 4),
    lambda: merge_variant(FP16, 32, 128, 4),
    lambda: cache_write_variant(FP16, 8, 128, 32),
    # batch-invariant mode (docs/kernels.md, "Batch invariance (GPU)")
    lambda: invariant_attention_variant(BF16, 9, 3, 64, 16, 16),
    lambda: invariant_attention_variant(BF16, 32, 8, 128, 16, 16),
    lambda: invariant_merge_variant(BF16, 32, 128, 16),
    lambda: matmul_variant(BF16, 4096, 4096, False),
    lambda: matmul_variant(FP16, 896, 896, True),
    lambda: matmul_variant(FP32, 576, 576, False),
    lambda: rms_norm_variant(BF16, 4096),
    lambda: weight_only_variant(BF16, "int8", 4096, 4096),
    lambda: weight_only_variant(FP16, "fp8", 896, 896),
    lambda: weight_only_variant(FP32, "int4", 576, 576),
]


def ptxas_report(ptx: str, arch: int) -> str:
    """Registers and spills per thread, from the ptxas bundled with triton (informational)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    try:  # the ptxas triton itself used for this arch
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(arch).path
    except Exception:
        return "ptxas not found"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        arch_name = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        result = subprocess.run(
            [str(ptxas), "-v", f"--gpu-name={arch_name}", str(src), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True, text=True,
        )
    report = result.stdout + result.stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if not regs:
        return "ptxas gave no report"
    text = f"{regs.group(1)} registers"
    if spills and (int(spills.group(1)) or int(spills.group(2))):
        text += f", SPILLS {spills.group(1)}/{spills.group(2)} B store/load"
    return text


def compile_variant(variant, arch: int) -> tuple[str, float, int]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, kernel, args, constexprs, options = variant()
    signature, constants, attrs = _signature(kernel, args, constexprs)
    start = time.perf_counter()
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(options),
    )
    if "cubin" not in compiled.asm:
        raise RuntimeError(f"{name}: no cubin produced")
    seconds = time.perf_counter() - start
    return f"{name} ({ptxas_report(compiled.asm['ptx'], arch)})", seconds, int(compiled.metadata.shared)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90 = Hopper)")
    parser.add_argument("--all", action="store_true", help="also the extra variants (slower)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter has nothing to compile", file=sys.stderr)
        return 2
    import triton

    print(f"triton {triton.__version__}, target sm_{args.arch}")
    failures = 0
    for variant in CORE_VARIANTS + (EXTRA_VARIANTS if args.all else []):
        try:
            name, seconds, shared = compile_variant(variant, args.arch)
        except Exception as exc:  # report every variant, then fail
            failures += 1
            print(f"FAIL {exc!r}"[:2000])
            continue
        fits = shared <= HOPPER_SHARED_MEMORY
        failures += not fits
        print(f"{'ok  ' if fits else 'FAIL'} {name}: {seconds:.1f}s, shared memory {shared} B")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
