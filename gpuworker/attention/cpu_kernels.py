"""Small C kernels for the CPU path: decode attention straight over the paged KV
cache, prompt chunks with the same per-row arithmetic (``rows_fns``, paged_decode.c's
``*_rows``: the default for prefill, batch-invariant), tiled prefill attention over it
(inferq_kernels/cpu/paged_prefill.c, its own build: see that file and ``_PREFILL_FLAGS``;
``prefill_fns`` is empty where it did not build), rotary of q and k
(bit-identical to the torch ops; llama.rotate_qk), SiLU-and-mul of the MLP
(llama.silu_and_mul) and a fused residual add + RMSNorm (llama.add_rms_norm).

The torch path gathers every decode sequence's blocks into a padded buffer
(``index_select``) and then runs SDPA over it: the K/V bytes cross memory three
times (read by the gather, written, read again by SDPA), and the gather alone was
~10 % of an offline run. This kernel reads each sequence's K and V once, through
its block table, the way vLLM's CPU paged-attention kernels do:

for each (sequence, kv head): the G query heads that share the kv head are
scored against every cached key (scores kept in fp32), softmax in two passes
(max, then exp/sum), then the G outputs accumulate ``p * v`` in fp32 and are
divided by the sum once. Inputs and outputs are float32 or bfloat16 (bf16 read
as the high half of an fp32, results rounded to nearest-even, as torch does).

The C lives in inferq_kernels/cpu/paged_decode.c (plain C, no torch headers), built
by inferq_kernels/cpu/loader.py on first use (``-O3 -march=native``, warnings on; about
a second) into ``$INFERQ_CACHE_DIR/cpu_kernels`` (default ``~/.cache/inferq``) and
loaded with ctypes; this module types its functions. Where there is no compiler, the build
fails, or ``INFERQ_CPU_KERNELS=0`` is set, ``load()`` returns None and the
callers keep their torch ops. Built with OpenMP where it can be (see the loader),
they run on ``torch.get_num_threads()`` threads (``sync()`` before a call), with
results bit-identical to one thread.

No ``-ffast-math`` (its start-up code would set flush-to-zero for the whole
process): only the flags that let gcc vectorise the reductions. ``exp`` is a
Cody-Waite range reduction plus a degree-7 Taylor polynomial (relative error
< 1e-7 on the softmax's range), vectorisable where libm's ``expf`` is not.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from inferq.kernels.cpu import loader
from inferq.kernels.cpu.loader import compiler, cpu_has, cpu_vendor, enabled  # noqa: F401  (this module's API)


_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-std=c11", "-fno-math-errno", "-fno-trapping-math",
          "-fno-signed-zeros", "-fassociative-math"]

# paged_prefill.c is written in GCC vector extensions: contraction makes its a * b + c FMAs, and
# it needs no reassociation (its sums are explicit vectors, in a fixed order).
_PREFILL_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-std=c11", "-fno-math-errno",
                  "-fno-trapping-math", "-ffp-contract=fast"]

# paged_prefill_amx.c: the bf16 prefill attention on AMX tiles, built where the CPU has AMX
_AMX_FLAGS = ["-O3", "-march=native", "-mamx-tile", "-mamx-bf16", "-mavx512bf16", "-std=gnu11"]

_lock = threading.Lock()
_loaded: "DecodeKernel | None | bool" = False  # False = not tried yet


class DecodeKernel:
    def __init__(self, lib: ctypes.CDLL, path: Path, prefill_lib: ctypes.CDLL | None = None,
                 amx_lib: ctypes.CDLL | None = None) -> None:
        self.path = path
        self.lib = lib
        self.prefill_lib = prefill_lib
        self.amx_lib = amx_lib
        self.openmp = lib.openmp
        argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p]
        self.fns = {}
        for name in ("paged_decode_f32", "paged_decode_bf16"):
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self.fns[name] = fn
        p, i = ctypes.c_void_p, ctypes.c_int64
        # Prefill chunks with the decode kernel's arithmetic (paged_decode.c, paged_decode_*_rows):
        # every row the same bits as a decode row at its position, in any chunk (batch invariance).
        self.rows_fns = {}
        for name in ("paged_decode_f32_rows", "paged_decode_bf16_rows"):
            fn = getattr(lib, name)
            fn.argtypes = [p, i, p, i, p, p, p, i, p, p, p, p, i, i, i, i, i, ctypes.c_float, p, i]
            fn.restype = ctypes.c_int
            self.rows_fns[name] = fn
        # paged_prefill.c (its own build; None where it failed): the tiled prefill attention
        self.prefill_fns = {}
        if prefill_lib is not None:
            for name in ("paged_prefill_f32", "paged_prefill_bf16"):
                fn = getattr(prefill_lib, name)
                fn.argtypes = [p, i, p, i, p, p, p, i, p, p, p, p, i, i, i, i, i, ctypes.c_float]
                fn.restype = ctypes.c_int
                self.prefill_fns[name] = fn
        # paged_prefill_amx.c (bf16 on AMX tiles, head sizes a multiple of 32), else None
        self.prefill_amx = None
        if amx_lib is not None:
            self.prefill_amx = amx_lib.paged_prefill_bf16_amx
            self.prefill_amx.argtypes = [p, i, p, i, p, p, p, i, p, p, p, p, i, i, i, i, i, ctypes.c_float]
            self.prefill_amx.restype = ctypes.c_int
        # elementwise kernels, one C function per dtype, looked up by the tensor's dtype
        self.add_rms_norm = _by_dtype(lib, "add_rms_norm", [p, p, p, p, i, i, ctypes.c_float])
        self.silu_mul = _by_dtype(lib, "silu_mul", [p, i, i, p, i])
        self.rotary = _by_dtype(lib, "rotary", [p, i, i, p, i, i, i, p, p, p, p, i])


    def sync(self) -> None:
        """Set the kernels' thread count to torch's (call before a kernel)."""
        loader.sync_threads(self.lib)
        for extra in (self.prefill_lib, self.amx_lib):
            if extra is not None:
                loader.sync_threads(extra)


def _by_dtype(lib: ctypes.CDLL, stem: str, argtypes: list) -> dict:
    """{torch.float32: <stem>_f32, torch.bfloat16: <stem>_bf16}, typed for ctypes."""
    import torch

    fns = {}
    for suffix, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        fn = getattr(lib, f"{stem}_{suffix}")
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        fns[dt] = fn
    return fns

def _build() -> DecodeKernel | None:
    if not enabled():
        return None
    lib = loader.build("paged_decode", _FLAGS)
    if lib is None:
        return None
    return DecodeKernel(lib, Path(lib._name), loader.build("paged_prefill", _PREFILL_FLAGS), _build_amx())


def _build_amx() -> ctypes.CDLL | None:
    """paged_prefill_amx.c where the CPU has AMX and Linux grants this process its tile state."""
    if not cpu_has("amx_tile", "amx_bf16", "avx512_bf16"):
        return None
    lib = loader.build("paged_prefill_amx", _AMX_FLAGS)
    return lib if lib is not None and lib.amx_enable() == 0 else None


def load() -> DecodeKernel | None:
    """The compiled kernel (built on first use), or None where it cannot be had."""
    global _loaded
    with _lock:
        if _loaded is False:
            _loaded = _build()
        return _loaded  # type: ignore[return-value]
