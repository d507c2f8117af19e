"""Paged attention in plain torch: the reference backend and the CPU path.

Per step it makes one plan (shared by every layer, since all layers see the
same ``AttentionMetadata``):

* all rows with one new token (decodes, and one-token prompts) become ONE
  ``scaled_dot_product_attention`` call: their blocks are gathered through the
  block table into a padded ``[B, Hkv, L, D]`` tensor with a key mask. GQA is
  folded into the query axis (``[B, Hkv, G, D]``), so K/V are never repeated.
* each prefill chunk gets one SDPA call: ``is_causal`` when it starts at
  position 0 (keys are the new k/v, no gather), otherwise keys come from the
  cache and the mask is causal with an offset (``key_pos <= context + q_pos``).

Planning uses only the host lists in the metadata, so nothing syncs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from gpuworker.attention.base import AttentionBackend, AttentionMetadata, KVCache


@dataclass
class _Prefill:
    start: int  # first query row
    end: int
    context: int  # tokens already cached before this chunk
    seq_len: int
    blocks: torch.Tensor | None = None  # block ids covering seq_len (only when context > 0)
    mask: torch.Tensor | None = None  # [G*Q, L] bool, True = attend (only when context > 0)


@dataclass
class _Plan:
    write_slots: torch.Tensor  # slots to write
    write_rows: torch.Tensor | None  # rows of k/v that go to write_slots (None = all rows)
    decode_rows: torch.Tensor | slice | None = None
    decode_blocks: torch.Tensor | None = None  # [Bd, nb]
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, nb*block_size]
    prefills: list[_Prefill] = field(default_factory=list)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._plan_meta: AttentionMetadata | None = None
        self._plan_groups: int | None = None
        self._plan: _Plan | None = None

    # ------------------------------------------------------------------ planning
    def _make_plan(self, meta: AttentionMetadata, groups: int, device: torch.device) -> _Plan:
        slots = meta.slot_mapping
        valid = slots >= 0
        if bool(valid.all()):
            plan = _Plan(write_slots=slots, write_rows=None)
        else:
            rows = valid.nonzero().squeeze(1)
            plan = _Plan(write_slots=slots[rows], write_rows=rows)

        bs = meta.block_size
        decode_seqs: list[int] = []
        decode_rows: list[int] = []
        row = 0
        for i, (q_len, s_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            if q_len == 1:
                decode_seqs.append(i)
                decode_rows.append(row)
            elif q_len > 1:
                ctx = s_len - q_len
                pre = _Prefill(start=row, end=row + q_len, context=ctx, seq_len=s_len)
                if ctx > 0:
                    nb = -(-s_len // bs)
                    pre.blocks = meta.block_tables[i, :nb].long()
                    q_pos = torch.arange(ctx, s_len, device=device)
                    k_pos = torch.arange(s_len, device=device)
                    pre.mask = (k_pos[None, :] <= q_pos[:, None]).repeat(groups, 1)
                plan.prefills.append(pre)
            row += q_len

        if decode_seqs:
            lens = [meta.seq_lens_cpu[i] for i in decode_seqs]
            nb = -(-max(lens) // bs)
            first, last = decode_rows[0], decode_rows[-1]
            if last - first + 1 == len(decode_rows):
                plan.decode_rows = slice(first, last + 1)
            else:
                plan.decode_rows = torch.tensor(decode_rows, device=device)
            if decode_seqs == list(range(decode_seqs[0], decode_seqs[-1] + 1)):
                plan.decode_blocks = meta.block_tables[decode_seqs[0] : decode_seqs[-1] + 1, :nb].long()
            else:
                plan.decode_blocks = meta.block_tables[torch.tensor(decode_seqs, device=device), :nb].long()
            lens_t = torch.tensor(lens, device=device)
            k_pos = torch.arange(nb * bs, device=device)
            plan.decode_mask = (k_pos[None, :] < lens_t[:, None])[:, None, None, :]
        return plan

    def _get_plan(self, meta: AttentionMetadata, groups: int, device: torch.device) -> _Plan:
        if self._plan_meta is not meta or self._plan_groups != groups:
            self._plan = self._make_plan(meta, groups, device)
            self._plan_meta = meta  # keep a reference so a later meta cannot reuse its id
            self._plan_groups = groups
        return self._plan  # type: ignore[return-value]

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        num_tokens, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        groups = num_heads // num_kv_heads
        plan = self._get_plan(meta, groups, q.device)

        # 1. write the new tokens' k/v into their slots
        flat_k = key_cache.view(-1, num_kv_heads, head_dim)
        flat_v = value_cache.view(-1, num_kv_heads, head_dim)
        k_new = k if plan.write_rows is None else k[plan.write_rows]
        v_new = v if plan.write_rows is None else v[plan.write_rows]
        flat_k.index_copy_(0, plan.write_slots, k_new.to(key_cache.dtype))
        flat_v.index_copy_(0, plan.write_slots, v_new.to(value_cache.dtype))

        out = torch.empty_like(q)

        # 2. every one-token row in one batched call
        if plan.decode_rows is not None:
            qd = q[plan.decode_rows]  # [Bd, Hq, D]
            bd = qd.shape[0]
            keys = key_cache[plan.decode_blocks].view(bd, -1, num_kv_heads, head_dim).transpose(1, 2)
            vals = value_cache[plan.decode_blocks].view(bd, -1, num_kv_heads, head_dim).transpose(1, 2)
            qd = qd.view(bd, num_kv_heads, groups, head_dim).to(keys.dtype)
            od = F.scaled_dot_product_attention(qd, keys, vals, attn_mask=plan.decode_mask, scale=scale)
            out[plan.decode_rows] = od.reshape(bd, num_heads, head_dim).to(out.dtype)

        # 3. one call per prefill chunk
        for pre in plan.prefills:
            qp = q[pre.start : pre.end]  # [Q, Hq, D]
            n_q = pre.end - pre.start
            if pre.context == 0:
                o = F.scaled_dot_product_attention(
                    qp.transpose(0, 1),
                    k[pre.start : pre.end].transpose(0, 1),
                    v[pre.start : pre.end].transpose(0, 1),
                    is_causal=True,
                    scale=scale,
                    enable_gqa=groups > 1,
                )  # [Hq, Q, D]
                out[pre.start : pre.end] = o.transpose(0, 1)
            else:
                keys = key_cache[pre.blocks].view(-1, num_kv_heads, head_dim)[: pre.seq_len].transpose(0, 1)
                vals = value_cache[pre.blocks].view(-1, num_kv_heads, head_dim)[: pre.seq_len].transpose(0, 1)
                # [Q, Hkv, G, D] -> [Hkv, G*Q, D]: query heads sharing a kv head become extra query rows
                qg = qp.view(n_q, num_kv_heads, groups, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, groups * n_q, head_dim)
                o = F.scaled_dot_product_attention(qg.to(keys.dtype), keys, vals, attn_mask=pre.mask, scale=scale)
                out[pre.start : pre.end] = o.view(num_kv_heads, groups, n_q, head_dim).permute(2, 0, 1, 3).reshape(n_q, num_heads, head_dim)
        return out
