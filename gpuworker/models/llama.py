"""The Llama family (Llama 2/3.x, SmolLM, Mistral, Qwen2/2.5, Qwen3) as one model.

The differences are switches in ``ModelConfig``: q/k/v bias (Qwen2), per-head
q/k RMSNorm (Qwen3), rope scaling (Llama 3.1+), tied embeddings. Inputs are a
flattened varlen batch (no batch axis): ``input_ids[T]``, ``positions[T]``;
attention over the paged cache is the backend's job.

q/k/v and gate/up are fused into one matmul each; ``load_weights`` maps the HF
tensor names onto the fused parameters.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from inferq.gpuworker.attention.base import AttentionBackend, AttentionMetadata, KVCache
from inferq.gpuworker.models import cpu_linear
from inferq.gpuworker.models.cpu_decode_replay import DecodeReplay
from inferq.gpuworker.models.cpu_linear import PackedGateUp, PackedWeight
from inferq.gpuworker.models.config import ModelConfig


def _param(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    # Uninitialised on purpose: load_weights fills everything, and random init of a
    # large model costs seconds.
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, packed) -> torch.Tensor:
    """``F.linear``, or a weight prepacked once in its place (see prepack_cpu_weights; then
    ``weight`` is None): panels for our CPU kernels (inferq.gpuworker.models.cpu_linear, every batch
    size), else oneDNN's blocked layout."""
    if packed is None:
        return F.linear(x, weight, bias)
    if not isinstance(packed, torch.Tensor):  # a PackedWeight, or a quant_linear.QuantLinear (GGUF blocks)
        return packed(x, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in fp32, cast back, then scale."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def add_rms_norm(residual: torch.Tensor, hidden: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 kernels=None, norm=rms_norm) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += hidden`` in place (``hidden`` None: no add), then ``rms_norm`` of it;
    returns (normed, residual). With ``kernels`` (inferq.gpuworker.attention.cpu_kernels, CPU
    float32/bfloat16, torch's thread count) both run in one C pass with the same roundings
    (only the order of the fp32 sum of squares differs). ``norm``: the RMSNorm otherwise (the layer's
    ``rms_norm``: a batch-invariant Triton kernel on the GPU path, see models/batch_invariant.py)."""
    dt = residual.dtype
    if (kernels is not None and dt in (torch.float32, torch.bfloat16) and residual.dim() == 2
            and residual.is_contiguous() and (hidden is None or hidden.is_contiguous())):
        kernels.sync()
        out = torch.empty_like(residual)
        rc = kernels.add_rms_norm[dt](
            residual.data_ptr(), None if hidden is None else hidden.data_ptr(), weight.data_ptr(), out.data_ptr(),
            residual.shape[0], residual.shape[1], eps)
        if rc == 0:
            return out, residual  # rc != 0 (bf16, hidden size > 8192) is returned before any row is touched
    if hidden is not None:
        residual = residual.add_(hidden)
    return norm(residual, weight, eps), residual


def silu_and_mul(gate_up: torch.Tensor, kernels=None) -> torch.Tensor:
    """``F.silu(gate) * up`` of a fused ``[T, 2I]`` projection. With ``kernels``
    (inferq.gpuworker.attention.cpu_kernels, CPU float32/bfloat16, torch's thread count) one C pass
    with torch's two roundings instead of three passes over a strided half (the silu
    itself within an ulp or two of torch's)."""
    n = gate_up.shape[-1] // 2
    dt = gate_up.dtype
    if (kernels is not None and dt in (torch.float32, torch.bfloat16) and gate_up.dim() == 2
            and gate_up.stride(1) == 1):
        kernels.sync()
        out = torch.empty(gate_up.shape[0], n, dtype=dt)
        kernels.silu_mul[dt](
            gate_up.data_ptr(), gate_up.stride(0), n, out.data_ptr(), gate_up.shape[0])
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin of every position up to max_position_embeddings, computed once (fp32
    math like HF, then stored in the model dtype) and indexed by ``positions``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(cfg)
        t = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [P, D/2]
        cos, sin = freqs.cos(), freqs.sin()
        # Full-width tables with the rotate-half sign folded into sin, so a rotation is
        # x * cos + swap_halves(x) * sin: 4 ops instead of 7, the same products and
        # sums as HF's x * cos + rotate_half(x) * sin (bit-identical results).
        self.register_buffer("cos", torch.cat((cos, cos), -1).to(dtype=dtype, device=device), persistent=False)
        self.register_buffer("sin", torch.cat((-sin, sin), -1).to(dtype=dtype, device=device), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of shape [T, 1, D], looked up once per step for all layers."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              kernels=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_rotate`` of q and k. With ``kernels`` (inferq.gpuworker.attention.cpu_kernels, CPU
    float32/bfloat16, torch's thread count) one C call does both with the same roundings
    (bit-identical: elementwise, no sums); outputs are new contiguous tensors."""
    dt = q.dtype
    if (kernels is not None and dt in (torch.float32, torch.bfloat16) and k.dtype == dt and cos.dtype == dt
            and sin.dtype == dt and q.stride(2) == 1 and k.stride(2) == 1 and q.stride(1) == q.shape[2]
            and k.stride(1) == k.shape[2] and cos.is_contiguous() and sin.is_contiguous()):
        kernels.sync()
        rows, hq, d = q.shape
        qo = torch.empty(q.shape, dtype=dt)
        ko = torch.empty(k.shape, dtype=dt)
        kernels.rotary[dt](
            q.data_ptr(), q.stride(0), hq, k.data_ptr(), k.stride(0), k.shape[1], d,
            cos.data_ptr(), sin.data_ptr(), qo.data_ptr(), ko.data_ptr(), rows)
        return qo, ko
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # HF's "rotate_half" convention: the first and second halves of a head are the pair.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1).mul_(sin).add_(x * cos)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, dtype: torch.dtype, device) -> None:
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size = cfg.num_heads * d
        self.kv_size = cfg.num_kv_heads * d
        self.scale = d**-0.5
        p = dict(dtype=dtype, device=device)
        self.input_layernorm = _param(h, **p)
        self.qkv_proj = _param(self.q_size + 2 * self.kv_size, h, **p)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size, **p) if cfg.attention_bias else None
        self.o_proj = _param(h, self.q_size, **p)
        self.o_bias = _param(h, **p) if cfg.o_proj_bias else None
        self.q_norm = _param(d, **p) if cfg.qk_norm else None
        self.k_norm = _param(d, **p) if cfg.qk_norm else None
        self.post_attention_layernorm = _param(h, **p)
        self.gate_up_proj = _param(2 * cfg.intermediate_size, h, **p)
        self.gate_up_bias = _param(2 * cfg.intermediate_size, **p) if cfg.mlp_bias else None
        self.down_proj = _param(h, cfg.intermediate_size, **p)
        self.down_bias = _param(h, **p) if cfg.mlp_bias else None
        # The four projection weights prepacked for the CPU (PackedWeight panels or oneDNN's
        # layout), by name ("qkv", "o", "gate_up", "down"); the parameters are then None.
        self.packed: dict[str, PackedWeight | torch.Tensor] = {}
        # inferq.gpuworker.attention.cpu_kernels (add + RMSNorm, rotary, SiLU-and-mul; CPU fp32/bf16), else None.
        self.cpu_kernels = None
        # The RMSNorm where the C kernels do not run: torch's, or one row per program in batch-invariant
        # mode on the GPU path (gpuworker/models/batch_invariant.py).
        self.rms_norm = rms_norm

    def forward(
        self,
        rotary: tuple[torch.Tensor, torch.Tensor],
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        keep_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer over the step's rows; with ``keep_rows`` the rows after attention are
        these only (see LlamaForCausalLM.forward)."""
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        # In place: the residual stream is private to the forward (fewer allocations).
        if residual is None:
            x, residual = add_rms_norm(hidden, None, self.input_layernorm, eps, self.cpu_kernels, self.rms_norm)
        else:
            x, residual = add_rms_norm(residual, hidden, self.input_layernorm, eps, self.cpu_kernels, self.rms_norm)

        qkv = linear(x, self.qkv_proj, self.qkv_bias, self.packed.get("qkv"))
        t = qkv.shape[0]
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(t, cfg.num_heads, cfg.head_dim)
        k = k.view(t, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None:
            q = self.rms_norm(q, self.q_norm, eps)
            k = self.rms_norm(k, self.k_norm, eps)
        cos, sin = rotary
        q, k = rotate_qk(q, k, cos, sin, self.cpu_kernels)
        attn = self.backend.forward(q, k, v, kv_cache, meta, self.scale).view(t, self.q_size)
        if keep_rows is not None:
            attn, residual = attn.index_select(0, keep_rows), residual.index_select(0, keep_rows)
        x = linear(attn, self.o_proj, self.o_bias, self.packed.get("o"))

        x, residual = add_rms_norm(residual, x, self.post_attention_layernorm, eps, self.cpu_kernels, self.rms_norm)
        gate_up = self.packed.get("gate_up")
        if isinstance(gate_up, PackedGateUp):  # the matmul and SiLU-and-mul in one kernel
            act = gate_up.silu_mul(x)
        else:
            act = silu_and_mul(linear(x, self.gate_up_proj, self.gate_up_bias, gate_up), self.cpu_kernels)
        x = linear(act, self.down_proj, self.down_bias, self.packed.get("down"))
        return x, residual


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.config = cfg
        self.backend = backend
        self.dtype = dtype
        p = dict(dtype=dtype, device=device)
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size, **p)
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, dtype, device) for _ in range(cfg.num_layers))
        self.norm = _param(cfg.hidden_size, **p)
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else _param(cfg.vocab_size, cfg.hidden_size, **p)
        self.rotary = RotaryEmbedding(cfg, dtype, device)
        # The LM head prepacked for the CPU in its place (PackedWeight or oneDNN's layout), else None;
        # tied to the embedding, its PackedWeight also serves the embedding's rows.
        self.packed_lm_head: PackedWeight | torch.Tensor | None = None
        self.packing: str | None = None  # what prepack_cpu_weights did, once done
        # A GGUF's embedding as stored (quant_linear.QuantLinear, rows dequantized per lookup), else None.
        self.packed_embed = None
        # The vocabulary size where the packed LM head has zero rows past it (a vocabulary that is
        # not a multiple of the kernels' 32 columns), else None: lm_logits cuts them off.
        self.logits_cols: int | None = None
        # Decode-only steps of a few rows replayed as recorded C kernel calls (cpu_decode_replay.py;
        # set by use_cpu_kernels where every op has a kernel), else None.
        self.decode_replay: DecodeReplay | None = None

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        keep_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the final-normed hidden states ``[T, hidden]`` of every new token, or with
        ``keep_rows`` (int64 row indices) only of those rows, ``[len(keep_rows), hidden]``: the
        last layer then runs its attention for every row (their keys and values must be
        cached, and a row's attention is the same whatever rows run beside it) and its output
        projection, MLP and the final norm on the kept rows alone. A prompt chunk needs the
        logits of its last token only: this skips 1/L of a prompt step's matmuls (L layers)
        and gives the kept rows the same values as the full forward."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} kv caches, got {len(kv_caches)}")
        replay = self.decode_replay
        if replay is not None and keep_rows is None and replay.applies(input_ids, positions, kv_caches, meta):
            return replay.run(input_ids, positions, kv_caches, meta,
                              lambda: self.layers_forward(input_ids, positions, kv_caches, meta))
        return self.layers_forward(input_ids, positions, kv_caches, meta, keep_rows)

    @torch.inference_mode()
    def replayed_head(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                      meta: AttentionMetadata, greedy: bool):
        """A decode-only step's ``(logits, greedy tokens or None)`` from one step program, the LM
        head (and the argmax) included (cpu_decode_replay.DecodeReplay.run_head: buffers valid
        until the next step), or None where the replay does not cover it: then ``forward`` and
        ``lm_logits``."""
        replay = self.decode_replay
        if replay is None or len(kv_caches) != len(self.layers) or not replay.applies(input_ids, positions,
                                                                                        kv_caches, meta):
            return None
        return replay.run_head(input_ids, positions, kv_caches, meta, greedy,
                               lambda: self.lm_logits(self.layers_forward(input_ids, positions, kv_caches, meta)))

    def layers_forward(self, input_ids, positions, kv_caches, meta, keep_rows=None) -> torch.Tensor:
        """``forward`` layer by layer, op by op."""
        hidden = self.embed(input_ids)
        residual = None
        rotary = self.rotary(positions)
        last = len(self.layers) - 1
        for i, (layer, cache) in enumerate(zip(self.layers, kv_caches)):
            hidden, residual = layer(rotary, hidden, residual, cache, meta, keep_rows if i == last else None)
        first = self.layers[0]
        return add_rms_norm(residual, hidden, self.norm, self.config.rms_norm_eps, first.cpu_kernels, first.rms_norm)[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.packed_embed is not None:
            return self.packed_embed.rows(input_ids)
        if self.embed_tokens is None:  # tied and packed: the LM head's panels hold the only copy
            return self.packed_lm_head.rows(input_ids)
        return F.embedding(input_ids, self.embed_tokens)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_logits(hidden).float()

    @torch.inference_mode()
    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model dtype (enough for an argmax)."""
        logits = linear(hidden, self.lm_head, None, self.packed_lm_head)
        return logits if self.logits_cols is None else logits[:, : self.logits_cols].contiguous()

    def use_cpu_kernels(self) -> bool:
        """C kernels (inferq.gpuworker.attention.cpu_kernels) on CPU: rotary in float32 and
        bfloat16 (bit-identical to the torch ops) and SiLU-and-mul (within an ulp or
        two of torch's silu); fused residual-add + RMSNorm (the same roundings as
        HF's norm but for the order of the sum of squares). Returns False,
        changing nothing, where the kernels do not build or do not apply."""
        if self.dtype not in (torch.float32, torch.bfloat16) or self.norm.device.type != "cpu":
            return False
        from inferq.gpuworker.attention import cpu_kernels

        kernels = cpu_kernels.load()
        if kernels is None:
            return False
        for layer in self.layers:
            layer.cpu_kernels = kernels
        if DecodeReplay.supported(self) and os.environ.get("INFERQ_CPU_DECODE_REPLAY", "1") != "0":
            self.decode_replay = DecodeReplay(self)
        return True

    # ------------------------------------------------------------------ CPU weight prepacking
    _PROJECTIONS = {"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj"}

    @torch.inference_mode()
    def prepack_cpu_weights(self, batch_hint: int = 32, kernels: bool = True) -> str | None:
        """Repack every matmul weight once for the CPU, in place of the plain weight; returns
        which packing was used ("amx", "avx512_bf16", "avx512", "avx2" or "onednn"), or None,
        changing nothing.

        * "amx" / "avx512_bf16" (bfloat16), "avx512" or "avx2" (float32): panels read by
          our kernels (inferq.gpuworker.models.cpu_linear), which stream the weights faster than
          oneDNN/MKL at decode-sized batches. Every batch size runs on the kernels (a
          row's result then does not depend on its batch: batch invariance), the LM head
          too (zero rows up to a multiple of 32 where the vocabulary is not one). Needs
          AVX-512 or AVX2+FMA (AMX or AVX512-BF16 for bf16) and ``kernels``. On the AVX-512
          fp32 and AVX512-BF16 kernels the MLP's gate/up weight is a ``PackedGateUp``: the
          matmul and SiLU-and-mul run as one kernel (the same bits as the two apart).
        * "onednn" (bfloat16 elsewhere): oneDNN's blocked layout. Plain ``F.linear``
          re-lays the weight out on every call; prepacked it runs 1.5-2.5x faster at
          decode-sized batches here, with bit-identical results.

        The model keeps one copy of each weight: the packed one, registered as a buffer
        (``<name>_packed``), the parameter set to None. A tied embedding reads its rows
        from the LM head's panels; on oneDNN (an opaque layout) a tied LM head stays plain.
        Weights are packed and dropped one at a time, so the peak is one copy plus one
        weight. Call it after ``load_weights``."""
        if self.packing is not None:  # already done: the plain weights are gone
            return self.packing
        if self.dtype not in (torch.bfloat16, torch.float32) or self.norm.device.type != "cpu":
            return None
        bf16 = self.dtype == torch.bfloat16
        lib = cpu_linear.load() if kernels else None
        if lib is not None and all(cpu_linear.can_pack(lib, getattr(l, attr)) for l in self.layers
                                   for attr in self._PROJECTIONS.values()):
            pack = lambda w: PackedWeight(lib, w)  # noqa: E731
            kind = lib.bf16 if bf16 else lib.isa
            lm_head = cpu_linear.can_pack(lib, self.lm_head)
            vocab = self.lm_head.shape[0]
            if not lm_head and vocab % 32 and cpu_linear.can_pack(lib, self.lm_head[: vocab // 32 * 32]):
                # A vocabulary that is not a multiple of 32 (tokens added to a base model): the LM
                # head gets zero rows up to one, cut off again in lm_logits. On F.linear (MKL or
                # oneDNN) a row's logits would change with the number of rows (batch invariance).
                tied = self.lm_head is self.embed_tokens
                pad = self.lm_head.new_zeros(-vocab % 32, self.lm_head.shape[1])
                self.lm_head = nn.Parameter(torch.cat([self.lm_head.detach(), pad]), requires_grad=False)
                if tied:  # the packed head serves the embedding's rows (ids < vocab)
                    self.embed_tokens = self.lm_head
                self.logits_cols = vocab
                lm_head = True
        else:
            pack = self._onednn_packer(batch_hint) if bf16 else None
            if pack is None:
                return None
            kind = "onednn"
            lm_head = not self.config.tie_word_embeddings  # oneDNN's layout gives no rows back
        for layer in self.layers:
            for name, attr in self._PROJECTIONS.items():
                fuse = (name == "gate_up" and lib is not None and kind != "onednn" and layer.gate_up_bias is None
                        and cpu_linear.can_fuse_gate_up(lib, layer.gate_up_proj))
                layer.packed[name] = self._replace(layer, attr, (lambda w: PackedGateUp(lib, w)) if fuse else pack)
        if lm_head:
            tied = self.lm_head is self.embed_tokens
            self.packed_lm_head = self._replace(self, "lm_head", pack)
            if tied:
                self.embed_tokens = None
        self.packing = kind
        return kind

    @staticmethod
    def _replace(module: nn.Module, attr: str, pack):
        """Pack ``module.<attr>``, register the packed tensor as ``<attr>_packed`` and drop the plain one."""
        packed = pack(getattr(module, attr))
        setattr(module, attr, None)
        module.register_buffer(f"{attr}_packed", packed.packed if isinstance(packed, PackedWeight) else packed,
                               persistent=False)
        return packed

    def _onednn_packer(self, batch_hint: int):
        """A function giving oneDNN's blocked layout of a bf16 weight, checked bit-identical to
        ``F.linear`` on a probe; None where oneDNN cannot."""
        if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            return None
        pack = lambda w: torch.ops.mkldnn._reorder_linear_weight(w.detach(), batch_hint)  # noqa: E731
        try:
            layer = self.layers[0]
            probe = torch.randn(3, self.config.hidden_size, dtype=self.dtype)
            got = torch.ops.mkldnn._linear_pointwise(probe, pack(layer.qkv_proj), layer.qkv_bias, "none", [], "")
            if not torch.equal(got, F.linear(probe, layer.qkv_proj, layer.qkv_bias)):
                return None
        except Exception:  # an older oneDNN or torch build: stay on F.linear
            return None
        return pack

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into our (fused) parameters; every parameter must be
        filled exactly once, so a wrong or partial checkpoint fails here, not later."""
        cfg = self.config
        filled: set[str] = set()
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        inter = cfg.intermediate_size
        qkv_rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        gate_rows = {"gate_proj": (0, inter), "up_proj": (inter, 2 * inter)}
        layer_re = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)?\.?(\w+)\.(weight|bias)$")

        def put(key: str, target: torch.Tensor | None, tensor: torch.Tensor, rows: tuple[int, int] | None = None) -> None:
            if target is None:
                raise ValueError(f"checkpoint tensor {name!r} has no place in a {cfg.architecture} with this config")
            dest = target if rows is None else target[rows[0] : rows[1]]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(dest.shape)}")
            if key in filled:
                raise ValueError(f"checkpoint has {name!r} twice")
            if rows is None:  # take the loaded tensor itself: one copy fewer for large weights
                data = tensor.to(dtype=target.dtype, device=target.device).contiguous()
                # A norm or a bias is copied out: a loaded tensor may be a view of the checkpoint's
                # mmap, which it would keep mapped (and resident) after prepacking has replaced
                # the matrices beside it.
                target.data = data.clone() if data is tensor and data.dim() == 1 else data
            else:
                with torch.no_grad():
                    dest.copy_(tensor)
            filled.add(key)

        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "model.embed_tokens.weight":
                put("embed", self.embed_tokens, tensor)
            elif name == "model.norm.weight":
                put("norm", self.norm, tensor)
            elif name == "lm_head.weight":
                if not cfg.tie_word_embeddings:
                    put("lm_head", self.lm_head, tensor)
            elif m := layer_re.match(name):
                i, _, mod, kind = int(m.group(1)), m.group(2), m.group(3), m.group(4)
                if i >= len(self.layers):
                    raise ValueError(f"checkpoint tensor {name!r}: the config has only {len(self.layers)} layers")
                layer = self.layers[i]
                key = f"{i}.{mod}.{kind}"
                if mod in qkv_rows:
                    put(key, layer.qkv_proj if kind == "weight" else layer.qkv_bias, tensor, qkv_rows[mod])
                elif mod in gate_rows:
                    put(key, layer.gate_up_proj if kind == "weight" else layer.gate_up_bias, tensor, gate_rows[mod])
                elif mod == "o_proj":
                    put(key, layer.o_proj if kind == "weight" else layer.o_bias, tensor)
                elif mod == "down_proj":
                    put(key, layer.down_proj if kind == "weight" else layer.down_bias, tensor)
                elif mod in ("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm") and kind == "weight":
                    put(key, getattr(layer, mod), tensor)
                else:
                    raise ValueError(f"unexpected checkpoint tensor {name!r}")
            else:
                raise ValueError(f"unexpected checkpoint tensor {name!r}")

        missing = sorted(set(self._expected_keys()) - filled)
        if missing:
            shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} tensors: {shown}")

    def _expected_keys(self) -> list[str]:
        cfg = self.config
        keys = ["embed", "norm"] + ([] if cfg.tie_word_embeddings else ["lm_head"])
        for i in range(cfg.num_layers):
            mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                    "input_layernorm", "post_attention_layernorm"]
            if cfg.qk_norm:
                mods += ["q_norm", "k_norm"]
            keys += [f"{i}.{m}.weight" for m in mods]
            if cfg.attention_bias:
                keys += [f"{i}.{m}.bias" for m in ("q_proj", "k_proj", "v_proj")]
            if cfg.o_proj_bias:
                keys.append(f"{i}.o_proj.bias")
            if cfg.mlp_bias:
                keys += [f"{i}.{m}.bias" for m in ("gate_proj", "up_proj", "down_proj")]
        return keys
