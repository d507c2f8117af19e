"""Hand-written C kernels of the CPU path (plain C, no torch headers), loaded with ctypes.

    paged_decode.c   decode/prefix-free attention over the paged KV cache, rotary of q and k,
                     SiLU-and-mul, residual add + RMSNorm (float32 and bfloat16)
    paged_prefill.c  tiled causal prefill attention over the paged KV cache (vector lanes)
    paged_prefill_amx.c  the same in bfloat16 with both products on Intel AMX tiles
    linear_avx512.c  packed-panel matmuls: bf16 on AMX or AVX512-BF16, float32 on AVX-512
    linear_avx2.c    the float32 matmul on AVX2 + FMA (no AVX-512)
    amx.h, vec_math.h, threads.h  shared by the files above (AMX tile setup, exp/SiLU, threads)
    loader.py        builds one source on first use into its own cache dir and loads it
    reference.py     plain-torch references of the same signatures (what the tests compare to)

Like the rest of ``kernels`` this imports nothing of inferq's; gpuworker/attention/cpu_kernels.py
and gpuworker/models/cpu_linear.py type the functions and decide when they run.
"""
