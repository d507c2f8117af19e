"""Linears on GGUF-quantized weights as they are stored (inferq_kernels/cpu/quant_linear.c).

A decode step of one sequence reads every weight once; a 4-bit weight is a quarter of the
bytes of a bf16 one, so the matmul unpacks the file's blocks in registers and never holds a
dequantized copy. With int8 activations (the default) x is quantized to int8 blocks of 32 once
per call (shared by the segments of a fused weight), then each 32-element block of a weight is
one integer dot product (AVX512-VNNI's vpdpbusd, or AVX2's vpmaddubsw), scaled in float; the
blocks are re-laid out once at load in groups of 16 rows (every supported type), one vpdpbusd
then serving 16 rows (AVX2: two vpmaddubsw of 8). With float activations x stays float32 and the
weights are widened to float in registers (exact to float32 sums; the file's row layout).
docs/kernels.md "Quantized GGUF weights" has the measurements behind the default.

``QuantLinear`` is one fused projection (q|k|v, gate|up, or a single one): a list of
``QuantWeight`` segments, each rows of one ggml type (a Q4_K_M file mixes Q4_K and Q6_K: its
v and down projections are often Q6_K), written into column slices of one output. A segment
stored as float (F32 / F16 / BF16 in the file) runs on the float kernels of cpu_linear where
they apply (multiples of 32), else ``F.linear``.
"""
from __future__ import annotations

import ctypes
import os
import threading

import torch
import torch.nn.functional as F

from inferq.gpuworker.models import cpu_linear
from inferq.kernels.cpu import loader
from inferq.kernels.cpu.quant_reference import SUPPORTED, block_shape, type_name

# The AVX512-VNNI build (256-bit vpdpbusd on 32-element blocks; -march=native for the rest) and
# the AVX2 one (no -march=native: an AVX-512 build machine cannot slip wider code in). No
# contraction: each output's float operations are the ones written (batch invariance).
_FLAGS_VNNI = ["-O3", "-march=native", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c",
               "-std=gnu11", "-ffp-contract=off"]
_FLAGS_AVX2 = ["-O3", "-mavx2", "-mfma", "-mf16c", "-std=gnu11", "-ffp-contract=off"]

# x as the kernels take it ($INFERQ_GGUF_ACTIVATIONS): "int8" (blocks of 32 quantized, llama.cpp's
# way: integer dot products, about 0.5% error per matmul; the default: 2.5x the float kernel's
# speed at one row on a Zen 4, docs/kernels.md) or "float" (float32 x, exact to float32 sums:
# the dequantized model's tokens, at the row kernel's speed)
ACTIVATIONS_ENV = "INFERQ_GGUF_ACTIVATIONS"
ACTIVATIONS = ("int8", "float")


def activations_setting(value: str | None = None) -> str:
    mode = (value or os.environ.get(ACTIVATIONS_ENV) or ACTIVATIONS[0]).strip().lower()
    if mode not in ACTIVATIONS:
        raise ValueError(f"{ACTIVATIONS_ENV}={mode!r}: expected one of {', '.join(ACTIVATIONS)}")
    return mode

_lock = threading.Lock()
_loaded: "ctypes.CDLL | None | bool" = False  # False = not tried yet


def load(isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels (``lib.isa``: "avx512_vnni" or "avx2"), or None where they cannot
    be had (no compiler, no AVX2, ``INFERQ_CPU_KERNELS=0``). ``isa`` forces a build (tests)."""
    global _loaded
    if isa is not None:
        return _build(isa)
    with _lock:
        if _loaded is False:
            _loaded = _build(best_isa())
        return _loaded  # type: ignore[return-value]


def best_isa() -> str | None:
    if loader.cpu_has("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"):
        return "avx512_vnni"
    if loader.cpu_has("avx2", "fma", "f16c"):
        return "avx2"
    return None


def _build(isa: str | None) -> ctypes.CDLL | None:
    if isa is None or not loader.enabled():
        return None
    lib = loader.build("quant_linear", _FLAGS_VNNI if isa == "avx512_vnni" else _FLAGS_AVX2)
    if lib is None:
        return None
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.quant_x.argtypes = [p, i, c, i, i, p, p, p]
    lib.quant_x.restype = None
    lib.quant_linear.argtypes = [c, p, p, p, i, i, p, i, p, i, c]
    lib.quant_linear.restype = c
    lib.quant_linear_f32.argtypes = [c, p, i, i, i, p, i, p, i, c]
    lib.quant_linear_f32.restype = c
    lib.quant_linear16.argtypes = [c, p, p, p, i, i, p, i, p, i, c]
    lib.quant_linear16.restype = c
    lib.quant_repack16.argtypes = [c, p, i, i, p]
    lib.quant_repack16.restype = c
    lib.quant_repack16_bytes.argtypes = [c, i, i]
    lib.quant_repack16_bytes.restype = i
    lib.quant_rows16.argtypes = [c, p, i, i, p, i, p, c]
    lib.quant_rows16.restype = c
    lib.repack16 = bool(lib.quant_has_repack16())
    lib.quant_rows.argtypes = [c, p, i, i, p, i, p, c]
    lib.quant_rows.restype = c
    lib.quant_isa.restype = ctypes.c_char_p
    lib.isa = lib.quant_isa().decode()
    return lib


def quantize_x(lib: ctypes.CDLL, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ``[m, k]`` (float32 / bfloat16, unit column stride) as the kernels read it: int8
    blocks, their scales, their half-block sums (quant_reference.quantize_activations)."""
    m, k = x.shape
    if k % 32:
        raise ValueError(f"quantized matmul needs k a multiple of 32, got {k}")
    xq = torch.empty(m, k, dtype=torch.int8)
    xd = torch.empty(m, k // 32, dtype=torch.float32)
    xs = torch.empty(m, k // 32, 4, dtype=torch.float32)
    loader.sync_threads(lib)
    lib.quant_x(x.data_ptr(), x.stride(0), int(x.dtype == torch.bfloat16), m, k, xq.data_ptr(), xd.data_ptr(),
                xs.data_ptr())
    return xq, xd, xs


class QuantWeight:
    """A weight ``[n, k]`` of one ggml type: ``packed`` uint8 ``[n, row_bytes]``, the file's
    blocks row by row."""

    def __init__(self, packed: torch.Tensor, qtype: int, k: int, name: str = "") -> None:
        name_part = f" (tensor {name!r})" if name else ""
        if qtype not in SUPPORTED.values():
            raise ValueError(f"GGUF type {type_name(qtype)}{name_part} has no native CPU kernel; "
                             f"supported: {', '.join(SUPPORTED)}")
        elems, nbytes = block_shape(qtype)
        if k % elems or packed.dim() != 2 or packed.dtype != torch.uint8 or packed.shape[1] != k // elems * nbytes:
            raise ValueError(f"{type_name(qtype)} weight{name_part}: {tuple(packed.shape)} bytes do not hold rows of "
                             f"{k} elements in blocks of {elems}")
        self.packed = packed.contiguous()
        self.qtype, self.k, self.n = qtype, k, packed.shape[0]
        self.type_name = type_name(qtype)
        self.name = name
        self.layout = "rows"  # the file's blocks row by row; "x16": quant_repack16's groups of 16 rows

    def repack16(self, lib: ctypes.CDLL) -> "QuantWeight":
        """Re-lay the blocks out for the 16-row kernel where it runs this type (both builds:
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K); the row bytes are dropped (one copy). Returns self."""
        size = lib.quant_repack16_bytes(self.qtype, self.n, self.k)
        if self.layout != "rows" or not lib.repack16 or size < 0:
            return self
        out = torch.empty(size, dtype=torch.uint8)
        if lib.quant_repack16(self.qtype, self.packed.data_ptr(), self.n, self.k, out.data_ptr()) != 0:
            return self
        self.packed, self.layout = out, "x16"
        return self

    def run(self, lib: ctypes.CDLL, xq: tuple[torch.Tensor, torch.Tensor, torch.Tensor], y: torch.Tensor) -> None:
        """y ``[m, n]`` (a column slice of a wider output is fine) = x @ W^T, x quantized."""
        q, d, s = xq
        run = lib.quant_linear16 if self.layout == "x16" else lib.quant_linear
        rc = run(self.qtype, q.data_ptr(), d.data_ptr(), s.data_ptr(), q.shape[0], self.k,
                              self.packed.data_ptr(), self.n, y.data_ptr(), y.stride(0),
                              int(y.dtype == torch.bfloat16))
        if rc != 0:
            raise RuntimeError(f"quantized matmul failed (rc {rc}) for {self.type_name} ({self.n}, {self.k})")

    def run_float(self, lib: ctypes.CDLL, x: torch.Tensor, y: torch.Tensor) -> None:
        """y = x @ W^T with x float32 ``[m, k]`` unquantized (quant_linear_f32; the row layout)."""
        if self.layout != "rows":
            raise ValueError("float activations run on the row layout; this weight is repacked")
        rc = lib.quant_linear_f32(self.qtype, x.data_ptr(), x.stride(0), x.shape[0], self.k, self.packed.data_ptr(),
                                  self.n, y.data_ptr(), y.stride(0), int(y.dtype == torch.bfloat16))
        if rc != 0:
            raise RuntimeError(f"quantized matmul failed (rc {rc}) for {self.type_name} ({self.n}, {self.k})")

    def rows_call(self, lib: ctypes.CDLL, ids, n_ids: int, out: int, out_bf16: bool) -> tuple:
        """``(fn, args)`` writing rows ``ids`` (the address of ``n_ids`` int64) at address ``out``;
        the kernel returns -2, writing nothing, for an id outside the table."""
        fn = lib.quant_rows16 if self.layout == "x16" else lib.quant_rows
        return fn, (self.qtype, self.packed.data_ptr(), self.n, self.k, ids, n_ids, out, int(out_bf16))

    def rows(self, lib: ctypes.CDLL, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(ids.numel(), self.k, dtype=dtype)
        fn, args = self.rows_call(lib, ids.data_ptr(), ids.numel(), out.data_ptr(), dtype == torch.bfloat16)
        rc = fn(*args)
        if rc == -2:
            raise IndexError(f"row ids out of range for a table of {self.n} rows")
        if rc != 0:
            raise RuntimeError(f"row lookup failed (rc {rc}) for {self.type_name}")
        return out


class FloatWeight:
    """A segment stored as float in the file: a cpu_linear PackedWeight where it applies. An F16
    matrix with float32 activations keeps its width where the float32 kernel reads float16
    panels (AVX2: half the bytes, the same products as its float32 copy)."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        lib = cpu_linear.load()
        keep16 = (weight.dtype == torch.float16 and dtype == torch.float32 and lib is not None
                  and cpu_linear.can_pack(lib, weight))
        w = (weight if keep16 else weight.to(dtype)).contiguous()
        self.n, self.k = w.shape
        self.packed_weight = cpu_linear.PackedWeight(lib, w) if lib is not None and cpu_linear.can_pack(lib, w) else None
        self.weight = None if self.packed_weight is not None else w
        self.packed = self.packed_weight.packed if self.packed_weight is not None else w

    def run_plain(self, x: torch.Tensor, y: torch.Tensor) -> None:
        y.copy_(self.packed_weight(x, None) if self.packed_weight is not None else F.linear(x, self.weight))

    def rows(self, lib, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ids = ids.reshape(-1)
        got = self.packed_weight.rows(ids) if self.packed_weight is not None else self.weight[ids]
        return got.to(dtype)


def merge_adjacent(segments: list) -> list:
    """Neighbouring quantized segments of one type as one weight (their rows stacked): q, k and v
    (gate and up) of one file type become one matmul call over one contiguous range of bytes, the
    hardware prefetch running on from one into the next. Each output row's sum is its own, so the
    results are the same bits."""
    runs: list[list] = []
    for seg in segments:
        prev = runs[-1][-1] if runs else None
        if (isinstance(seg, QuantWeight) and isinstance(prev, QuantWeight) and prev.qtype == seg.qtype
                and prev.layout == seg.layout == "rows"):
            runs[-1].append(seg)
        else:
            runs.append([seg])
    return [run[0] if len(run) == 1 else  # one copy per run
            QuantWeight(torch.cat([s.packed for s in run]), run[0].qtype, run[0].k, "+".join(s.name for s in run))
            for run in runs]


class QuantLinear:
    """One projection of segments stacked by rows; ``__call__(x, bias)`` is ``F.linear`` on
    their concatenation, in x's dtype (float32 or bfloat16); ``rows(ids)`` an embedding lookup."""

    def __init__(self, lib: ctypes.CDLL, segments: list[QuantWeight | FloatWeight], dtype: torch.dtype,
                 activations: str | None = None) -> None:
        if not segments or len({s.k for s in segments}) != 1:
            raise ValueError("a quantized linear needs segments of one width")
        self.lib, self.dtype = lib, dtype
        self.activations = activations_setting(activations)
        self.segments = merge_adjacent(segments)
        if self.activations == "int8":
            for seg in self.segments:
                if isinstance(seg, QuantWeight):
                    seg.repack16(lib)
        self.k = segments[0].k
        self.n = sum(s.n for s in segments)

    @property
    def packed(self) -> list[torch.Tensor]:
        return [s.packed for s in self.segments]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.packed)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"x {tuple(x.shape)} does not fit a quantized weight ({self.n}, {self.k})")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"quantized matmul takes float32 or bfloat16 activations, got {x.dtype}")
        if x.stride(1) != 1:
            x = x.contiguous()
        y = torch.empty(x.shape[0], self.n, dtype=x.dtype)
        if x.shape[0] == 0:
            return y
        xq = xf = None  # x as the kernels read it: once for every segment
        col = 0
        loader.sync_threads(self.lib)
        for seg in self.segments:
            out = y[:, col:col + seg.n]
            if isinstance(seg, FloatWeight):
                seg.run_plain(x, out)
            elif self.activations == "int8":
                xq = quantize_x(self.lib, x) if xq is None else xq
                seg.run(self.lib, xq, out)
            else:
                xf = x.float() if xf is None else xf
                seg.run_float(self.lib, xf, out)
            col += seg.n
        return y if bias is None else y.add_(bias)

    def replay_calls(self, x: torch.Tensor, y: torch.Tensor):
        """``([(fn, args), ...], buffers)``: the ctypes kernel calls ``__call__`` makes for
        ``y = x @ W^T`` (the activation quantizer, then each segment into its columns of y), on
        these fixed buffers, for the CPU decode replay (cpu_decode_replay.py): no tensor is made
        and no argument worked out per call. ``buffers`` hold x's int8 blocks: the caller keeps
        them as long as the calls. None where a segment has no such call (a float segment,
        float activations)."""
        quantized = [s for s in self.segments if isinstance(s, QuantWeight)]
        if ((quantized and self.activations != "int8")
                or not all(isinstance(s, QuantWeight) or (s.packed_weight is not None and s.packed_weight.applies(x))
                           for s in self.segments)
                or x.dim() != 2 or y.dim() != 2 or x.shape[1] != self.k or tuple(y.shape) != (x.shape[0], self.n)
                or x.stride(1) != 1 or y.stride(1) != 1 or x.dtype != y.dtype
                or x.dtype not in (torch.float32, torch.bfloat16)):
            return None
        lib, (m, k), bf16 = self.lib, x.shape, int(x.dtype == torch.bfloat16)
        calls, col, buffers = [], 0, ()
        if quantized:  # x's int8 blocks in buffers of their own
            xq = torch.empty(m, k, dtype=torch.int8)
            xd = torch.empty(m, k // 32, dtype=torch.float32)
            xs = torch.empty(m, k // 32, 4, dtype=torch.float32)
            buffers = (xq, xd, xs)
            calls.append((lib.quant_x, (x.data_ptr(), x.stride(0), bf16, m, k, xq.data_ptr(), xd.data_ptr(),
                                        xs.data_ptr())))
        for seg in self.segments:
            out = y.data_ptr() + col * y.element_size()
            if isinstance(seg, QuantWeight):
                run = lib.quant_linear16 if seg.layout == "x16" else lib.quant_linear
                calls.append((run, (seg.qtype, xq.data_ptr(), xd.data_ptr(), xs.data_ptr(), m, k,
                                    seg.packed.data_ptr(), seg.n, out, y.stride(0), bf16)))
            else:  # cpu_linear's kernel on its panels, into this segment's columns
                pw = seg.packed_weight
                calls.append((pw._run, (x.data_ptr(), x.stride(0), m, pw.packed.data_ptr(), pw.n, pw.k, None, out,
                                        y.stride(0))))
            col += seg.n
        return calls, buffers

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the (single-segment) weight as ``self.dtype``: the embedding."""
        if len(self.segments) != 1:
            raise ValueError("rows() reads a single-segment weight")
        return self.segments[0].rows(self.lib, ids, self.dtype)


# The model's fused projections: (key in DecoderLayer.packed, parameter, HF modules in row order)
_PROJECTIONS = (("qkv", "qkv_proj", "qkv_bias", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                ("o", "o_proj", "o_bias", ("self_attn.o_proj",)),
                ("gate_up", "gate_up_proj", "gate_up_bias", ("mlp.gate_proj", "mlp.up_proj")),
                ("down", "down_proj", "down_bias", ("mlp.down_proj",)))
_NORMS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")


def install(model, tensors: dict, lib: ctypes.CDLL, activations: str | None = None) -> str:
    """Put a GGUF's weights as stored (gguf_loader.native_tensors) into a freshly built
    LlamaForCausalLM: each projection a QuantLinear in ``layer.packed`` (its parameter None, its
    bytes registered as buffers), the embedding rows read from the packed table (tied: the same
    table is the LM head), norms and biases as plain parameters. Returns the packing name the
    engine logs ("gguf-native"); every tensor must be used exactly once. ``activations``:
    "int8" or "float" (default: ``$INFERQ_GGUF_ACTIVATIONS``, else int8)."""
    dtype = model.dtype
    tensors = dict(tensors)

    def take(name: str):
        if name not in tensors:
            raise ValueError(f"GGUF is missing tensor {name!r}")
        return tensors.pop(name)

    def segment(name: str) -> QuantWeight | FloatWeight:
        v = take(name)
        return QuantWeight(v[0], v[1], v[2], name) if isinstance(v, tuple) else FloatWeight(v, dtype)

    def put(param: torch.nn.Parameter | None, value: torch.Tensor, name: str) -> None:
        if param is None or tuple(param.shape) != tuple(value.shape):
            raise ValueError(f"GGUF tensor {name!r} {tuple(value.shape)} does not fit the model "
                             f"({None if param is None else tuple(param.shape)})")
        param.data = value.to(dtype).contiguous().clone()

    def quant_linear(module, attr: str, names: list[str]) -> QuantLinear:
        lin = QuantLinear(lib, [segment(n) for n in names], dtype, activations)
        want = getattr(module, attr).shape
        if (lin.n, lin.k) != tuple(want):
            raise ValueError(f"GGUF tensors {names} make a ({lin.n}, {lin.k}) weight; the model needs {tuple(want)}")
        setattr(module, attr, None)
        for j, t in enumerate(lin.packed):  # held by the module, so its bytes count as its weights
            module.register_buffer(f"{attr}_packed{j}", t, persistent=False)
        return lin

    for i, layer in enumerate(model.layers):
        pre = f"model.layers.{i}."
        for key, attr, bias, parts in _PROJECTIONS:
            layer.packed[key] = quant_linear(layer, attr, [f"{pre}{p}.weight" for p in parts])
            if getattr(layer, bias) is not None:
                put(getattr(layer, bias), torch.cat([take(f"{pre}{p}.bias") for p in parts]), f"{pre}{parts[0]}.bias")
        for norm in _NORMS:
            attr = norm.rpartition(".")[2]
            if getattr(layer, attr) is not None:
                put(getattr(layer, attr), take(f"{pre}{norm}.weight"), f"{pre}{norm}.weight")
    put(model.norm, take("model.norm.weight"), "model.norm.weight")

    # The embedding table as a projection too, quantized or float (an F16 table keeps its width
    # where the float kernels read float16): its rows are the lookup, and tied it is the LM head
    # on the same kernels, never a second copy.
    tied = model.lm_head is model.embed_tokens
    embed = quant_linear(model, "embed_tokens", ["model.embed_tokens.weight"])
    model.packed_embed = embed
    if tied:
        model.lm_head, model.packed_lm_head = None, embed
    if not tied:
        model.packed_lm_head = quant_linear(model, "lm_head", ["lm_head.weight"])
    tensors.pop("lm_head.weight", None)  # a tied model's file may still carry it
    if tensors:
        raise ValueError(f"unexpected GGUF tensors: {', '.join(sorted(tensors)[:6])}")
    model.packing = "gguf-native"
    return model.packing
