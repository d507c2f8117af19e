"""Triton kernels of inferq, each with a plain-torch reference of the same signature.

    inferq.kernels.reference          reshape_and_cache, unified_attention (torch, any device)
    inferq.kernels.reshape_and_cache  reshape_and_cache (Triton)
    inferq.kernels.unified_attention  unified_attention (Triton; split-K via inferq.kernels.split_k_decode)

This package imports nothing of inferq's, and this file imports no Triton:
``triton.jit`` decides between compiled and interpreted kernels when a kernel
module is imported, so a CPU caller must set ``TRITON_INTERPRET=1`` before it
imports ``inferq.kernels.reshape_and_cache`` / ``inferq.kernels.unified_attention``.
"""
