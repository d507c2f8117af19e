"""Paged attention in plain torch: the reference backend and the CPU path.

Per step it makes one plan (shared by every layer, since all layers see the
same ``AttentionMetadata``; planning reads only the host lists, so nothing syncs):

* rows with one new token (decodes, one-token prompts) are batched: their
  blocks are gathered through the block table (``index_select``, one memcpy per
  block) into a padded ``[B, L, Hkv, D]`` tensor with a key mask, and ONE
  ``scaled_dot_product_attention`` runs per group. Sequences are grouped by
  length so a few long contexts do not make every short one gather padding.
  GQA is folded into the query axis (``[B, Hkv, G, D]``): K/V are never repeated.
* on CPU with the C kernels (inferq.gpuworker.attention.cpu_kernels) every decode row goes to ONE
  call of the paged-decode kernel, straight over the paged cache, and every prefill chunk
  (q_len > 1: a fresh prompt, a later chunk of a long one, a prefix-cache hit, speculative
  tokens to verify) with >= 8 (token, query head) rows per kv head to ONE call of the rows
  kernel (paged_decode.c's ``*_rows``: tiles of 16 of a chunk's tokens per kv head, each
  block of keys and values read once per tile). Both compute every (token, query head) row
  with the same arithmetic (one compiled function): the scores of its keys, a two-pass
  softmax over exactly them, p.v in key order. So a token's attention is the same bits
  whether it was decoded or prefilled, in a chunk cut anywhere, beside any other rows, on
  any thread count: the engine's batch invariance (docs/kernels.md). Shorter chunks (2
  tokens x 3 heads) and up to 17 tokens after a context (a speculative verification) go to
  the decode kernel row by row (row j sees context + j + 1 keys): the same bits again.
  ``batch_invariant=False`` sends the chunks to paged_prefill.c instead (a tile of 16 rows
  against each 16-key chunk, online softmax; on AMX paged_prefill_amx.c): 1.2x faster
  attention at 1,024-2,048 tokens in bf16 here (about equal below 256), other bits than a
  decode row's. ``prefill_path`` forces one route (tests, the benchmark: "tiled" is
  paged_prefill.c).
* otherwise each prefill chunk attends over its keys (the new k/v when it starts at
  position 0, otherwise the cached blocks) with a causal mask offset by its
  context (``key_pos <= context + q_pos``), GQA folded the same way. On CPU an
  explicit baddbmm + softmax + bmm is about 2x faster than SDPA's flash kernel
  for the chunk sizes we run, so that path is used while the score matrix is
  small (< 32M elements), and SDPA (memory-efficient) beyond.

The plan is cached by the identity of the metadata object, so a runner must
build a new ``AttentionMetadata`` per step rather than mutate the last one.
Gathers go into a reused grow-only workspace (the largest decode batch seen).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inferq.gpuworker.attention.base import AttentionBackend, AttentionMetadata, KVCache

# Above this many score elements per prefill chunk, use SDPA instead of materialising scores.
_MAX_EXPLICIT_SCORES = 32 * 1024 * 1024
# Fewest (token, query head) rows per kv head for the tiled prefill kernel (below: the decode kernel's rows).
_MIN_TILED_ROWS = 8
# Chunks of at most this many rows after a context (a speculative decode's verification)
# go to the decode kernel row by row: see _prefill_route.
_NATIVE_MAX_VERIFY_ROWS = 17
# Query tokens per unit of the rows kernel (paged_decode.c, *_rows; 1-16): they read each
# block of keys and values one after another, from L1. Results do not depend on it (1.05x
# faster at 16 than at 8 or 4 on prompts of 1,024-2,048 tokens, a Zen 5).
_ROWS_TILE = 16
# Start a new decode group when it saves at least this many gathered blocks.
_MIN_GROUP_SAVING_BLOCKS = 64


@dataclass
class _DecodeGroup:
    rows: torch.Tensor | slice  # query rows of these sequences
    blocks: torch.Tensor  # [B * nb] flat block ids, row-major per sequence
    num_blocks: int  # nb (blocks per sequence after padding)
    mask: torch.Tensor  # [B, 1, 1, nb*block_size] bool, True = attend


@dataclass
class _Prefill:
    start: int  # first query row
    end: int
    context: int  # tokens already cached before this chunk
    seq_len: int
    blocks: torch.Tensor | None  # block ids covering seq_len (only when context > 0)
    explicit: bool  # baddbmm path (else SDPA)
    mask: torch.Tensor | None  # explicit: additive [G*Q, L] float; SDPA with context: bool [G*Q, L]


@dataclass
class _NativeDecode:
    """The rows of a step for the C kernel (inferq.gpuworker.attention.cpu_kernels): every
    decode row and every row of a prompt that starts at position 0; host int64 arrays,
    read through their data pointers."""

    q_rows: torch.Tensor  # [N] query row
    seq_idx: torch.Tensor  # [N] its sequence's row in meta.block_tables
    lens: torch.Tensor  # [N] the keys it sees (its position + 1)
    max_len: int


@dataclass
class _TiledPrefill:
    """Prefill chunks for one C call over whole chunks, one entry per chunk; host int64 arrays,
    read through their data pointers. ``kernel``: "rows" (the default), the decode kernel's
    arithmetic over tiles of a chunk's tokens (paged_decode.c, ``paged_decode_*_rows``: each row
    the same bits as a decode row at its position), or "tiled" (inferq_kernels/cpu/paged_prefill.c,
    or paged_prefill_amx.c: query tiles x key chunks with an online softmax, a different order of
    sums than a decode row's, so a token's bits would depend on whether it was decoded or
    prefilled; only where ``prefill_path="tiled"`` asks for it)."""

    q_start: torch.Tensor  # [C] first query row
    seq_idx: torch.Tensor  # [C] its sequence's row in meta.block_tables
    q_lens: torch.Tensor  # [C] query rows
    ctx_lens: torch.Tensor  # [C] tokens cached before the chunk
    rows: list[tuple[int, int]]  # (start, end) per chunk, for a copy-back when out is not direct
    kernel: str = "rows"
    max_len: int = 0  # the longest sequence (context + chunk)


@dataclass
class _Plan:
    write_slots: torch.Tensor
    write_rows: torch.Tensor | None  # rows of k/v that go to write_slots (None = all rows)
    decodes: list[_DecodeGroup] = field(default_factory=list)
    prefills: list[_Prefill] = field(default_factory=list)
    native: _NativeDecode | None = None
    tiled: _TiledPrefill | None = None


def _kernel_io(q: torch.Tensor, out: torch.Tensor, dt: torch.dtype):
    """What a C kernel reads and writes: q in the cache dtype with rows of [heads, head_dim]
    contiguous, and ``out`` itself when it has that layout (``direct``), else a buffer the
    caller copies back from."""
    head_dim = q.shape[2]
    qn = q if q.dtype == dt and q.stride(2) == 1 and q.stride(1) == head_dim else q.to(dt).contiguous()
    direct = out.dtype == dt and out.stride(2) == 1 and out.stride(1) == head_dim
    return qn, (out if direct else torch.empty(q.shape, dtype=dt)), direct


def _group_by_length(order: list[int], nbs: dict[int, int], min_saving: int) -> list[list[int]]:
    """Split sequences (sorted by block count, longest first) into groups so that
    padding every sequence to its group's longest does not waste much gather."""
    groups: list[list[int]] = [[order[0]]]
    group_max = nbs[order[0]]
    for k, i in enumerate(order[1:], start=1):
        remaining = len(order) - k
        if (group_max - nbs[i]) * remaining >= min_saving and nbs[i] * 4 <= group_max * 3:
            groups.append([i])
            group_max = nbs[i]
        else:
            groups[-1].append(i)
    return groups


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self, max_explicit_scores: int = _MAX_EXPLICIT_SCORES,
                 min_group_saving_blocks: int = _MIN_GROUP_SAVING_BLOCKS,
                 native_decode: bool | None = None, native_prefill: bool = True,
                 prefill_path: str | None = None, batch_invariant: bool = True) -> None:
        """``native_decode``: decode rows through the C paged-attention kernel (CPU,
        float32/bfloat16) instead of gather + SDPA. None (default) = use it when it
        builds (``INFERQ_CPU_KERNELS=0`` turns it off).
        ``native_prefill``: with it (and the C kernels), prefill chunks go to C kernels too
        (the route per chunk: ``_prefill_route``); False keeps every chunk on baddbmm/SDPA.
        ``prefill_path`` forces one route for every chunk ("rows": the decode kernel row by
        row, "tiled": paged_prefill.c, "torch"); None = the measured choice.
        ``batch_invariant`` (default): on the C kernels every attention row is computed with
        the decode kernel's arithmetic, so a token's output does not depend on the step's other
        rows, its chunk or the thread count (docs/kernels.md, "Batch invariance"). False: prompt
        chunks take paged_prefill.c's online-softmax tiles (on AMX paged_prefill_amx.c) where
        they built: faster prompts at 1,024+ tokens (1.2x here, more on AMX), bits that depend
        on the chunking."""
        if prefill_path not in (None, "rows", "tiled", "torch"):
            raise ValueError(f"prefill_path must be rows, tiled or torch, not {prefill_path!r}")
        self.max_explicit_scores = max_explicit_scores
        self.native_decode = native_decode
        self.native_prefill = native_prefill
        self.prefill_path = prefill_path
        self.batch_invariant = batch_invariant
        self._native_kernel = None
        self._scratch: torch.Tensor | None = None  # fp32 scores of the C kernel, grow-only
        self.min_group_saving_blocks = min_group_saving_blocks
        # Reused gather buffers (key, value): a fresh multi-MB tensor per layer costs
        # more in page faults than the copy itself.
        self._workspace: list[torch.Tensor | None] = [None, None]
        self._plan_meta: AttentionMetadata | None = None
        self._plan_key: tuple | None = None
        self._plan: _Plan | None = None

    # ------------------------------------------------------------------ planning
    def _make_plan(self, meta: AttentionMetadata, num_heads: int, groups: int, dtype, device) -> _Plan:
        slots = meta.slot_mapping
        valid = None if meta.all_slots_valid else slots >= 0
        if valid is None or bool(valid.all()):
            plan = _Plan(write_slots=slots, write_rows=None)
        else:
            rows = valid.nonzero().squeeze(1)
            plan = _Plan(write_slots=slots[rows], write_rows=rows)

        bs = meta.block_size
        decode_seqs: list[int] = []
        decode_rows: dict[int, int] = {}
        native = self._use_native(meta, num_heads, groups, dtype, device)
        # The decode kernel's rows: (query row, sequence, keys it sees); the tiled kernel's chunks.
        # Each chunk's route: _prefill_route (the measured choice, see the module docstring).
        n_rows: list[int] = []
        n_seqs: list[int] = []
        n_lens: list[int] = []
        tiled: list[tuple[int, int, int, int]] = []  # (first row, sequence, q_len, context)
        row = 0
        for i, (q_len, s_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            route = "rows" if q_len == 1 else self._prefill_route(q_len, s_len - q_len, groups, native)
            if q_len == 1:
                decode_seqs.append(i)
                decode_rows[i] = row
            if route == "rows":
                n_rows.extend(range(row, row + q_len))
                n_seqs.extend([i] * q_len)
                n_lens.extend(range(s_len - q_len + 1, s_len + 1))
            elif route == "tiled":
                tiled.append((row, i, q_len, s_len - q_len))
            elif q_len > 1:
                plan.prefills.append(self._plan_prefill(meta, i, row, q_len, s_len, num_heads, groups, dtype, device))
            row += q_len
        if tiled:
            cols = list(zip(*tiled))
            plan.tiled = _TiledPrefill(*(torch.tensor(c, dtype=torch.int64) for c in cols),
                                       rows=[(r, r + n) for r, _, n, _ in tiled],
                                       kernel="tiled" if self._tiled_kernel() else "rows",
                                       max_len=max(c + n for _, _, n, c in tiled))

        if n_rows and native:
            plan.native = _NativeDecode(
                q_rows=torch.tensor(n_rows, dtype=torch.int64),
                seq_idx=torch.tensor(n_seqs, dtype=torch.int64),
                lens=torch.tensor(n_lens, dtype=torch.int64),
                max_len=max(n_lens),
            )
        elif decode_seqs and not native:
            nbs = {i: -(-meta.seq_lens_cpu[i] // bs) for i in decode_seqs}
            order = sorted(decode_seqs, key=lambda i: -nbs[i])
            for members in _group_by_length(order, nbs, self.min_group_saving_blocks):
                members.sort()  # keep batch order: rows are then usually one contiguous slice
                nb = nbs[members[0]] if len(members) == 1 else max(nbs[i] for i in members)
                rows = [decode_rows[i] for i in members]
                if rows[-1] - rows[0] + 1 == len(rows):
                    row_index: torch.Tensor | slice = slice(rows[0], rows[-1] + 1)
                else:
                    row_index = torch.tensor(rows, device=device)
                if members[-1] - members[0] + 1 == len(members):
                    table = meta.block_tables[members[0] : members[-1] + 1, :nb]
                else:
                    table = meta.block_tables[torch.tensor(members, device=device), :nb]
                lens = torch.tensor([meta.seq_lens_cpu[i] for i in members], device=device)
                k_pos = torch.arange(nb * bs, device=device)
                plan.decodes.append(
                    _DecodeGroup(
                        rows=row_index,
                        blocks=table.reshape(-1).long(),
                        num_blocks=nb,
                        mask=(k_pos[None, :] < lens[:, None])[:, None, None, :],
                    )
                )
        return plan

    def _prefill_route(self, q_len: int, context: int, groups: int, native: bool) -> str:
        """Which path a prefill chunk of ``q_len`` (> 1) rows after ``context`` cached tokens
        takes: "rows" (the decode kernel, row by row), "tiled" (one call for the step's chunks:
        by default the decode kernel's arithmetic over tiles of tokens, paged_decode.c's
        ``*_rows``; paged_prefill.c where ``prefill_path="tiled"``) or "torch". Where the C
        kernels run, "rows" and the default "tiled" give every row the same bits (a decode row's),
        so the choice is speed only: a token's attention does not depend on how its prompt was
        chunked or what shares the step (batch invariance; docs/kernels.md)."""
        if native and context > 0 and q_len <= _NATIVE_MAX_VERIFY_ROWS and self.prefill_path is None:
            # A speculative verification: each row is a decode row seeing one more key, through the
            # same kernel and the same sums as a plain decode, so a verified token's logits equal the
            # non-speculative ones bit for bit (the tiled kernel was faster at G >= 3, by ~0.03 ms
            # a layer at 5 rows: not worth greedy outputs that could differ at a near-tie).
            return "rows"
        if not native or not self.native_prefill:
            return "torch"
        if self.prefill_path is not None:
            tiled_ok = bool(self._native_kernel.prefill_fns)
            return "rows" if self.prefill_path == "tiled" and not tiled_ok else self.prefill_path
        # A tile holds 16 (token, query head) rows of one kv head: with fewer than 8 of them (2
        # tokens x 3 heads, a short speculative verification) most of its lanes idle, and the
        # decode kernel's rows were faster (2@512: 0.08 vs 0.11 ms; baddbmm 0.15).
        if q_len * groups < _MIN_TILED_ROWS:
            return "rows"
        # Otherwise one call over tiles of each chunk's tokens, which read each block of keys and
        # values once per tile, not once per row (the rows kernel, same bits as "rows").
        return "tiled"

    def _tiled_kernel(self) -> bool:
        """Whether prompt chunks go to paged_prefill.c (else the rows kernel, paged_decode.c)."""
        if self.prefill_path == "tiled":
            return True  # _prefill_route sent them to "rows" where it did not build
        return not self.batch_invariant and self.prefill_path is None and bool(self._native_kernel.prefill_fns)

    def _use_native(self, meta: AttentionMetadata, num_heads: int, groups: int, dtype, device) -> bool:
        if self.native_decode is False or device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
            return False
        if groups > 16 or meta.block_tables.dtype != torch.int32 or not meta.block_tables.is_contiguous():
            return False
        if self._native_kernel is None:
            from inferq.gpuworker.attention import cpu_kernels

            self._native_kernel = cpu_kernels.load() or False
        return bool(self._native_kernel)

    def _plan_prefill(self, meta, i, row, q_len, s_len, num_heads, groups, dtype, device) -> _Prefill:
        ctx = s_len - q_len
        blocks = None
        if ctx > 0:
            blocks = meta.block_tables[i, : -(-s_len // meta.block_size)].long()
        explicit = num_heads * q_len * s_len <= self.max_explicit_scores
        mask = None
        if explicit or ctx > 0:
            q_pos = torch.arange(ctx, s_len, device=device)
            k_pos = torch.arange(s_len, device=device)
            allowed = (k_pos[None, :] <= q_pos[:, None]).repeat(groups, 1)  # rows: (g, q)
            if explicit:
                mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            else:
                mask = allowed
        return _Prefill(start=row, end=row + q_len, context=ctx, seq_len=s_len, blocks=blocks,
                        explicit=explicit, mask=mask)

    def _get_plan(self, meta: AttentionMetadata, num_heads: int, groups: int, dtype, device) -> _Plan:
        key = (num_heads, groups, dtype, device)
        if self._plan_meta is not meta or self._plan_key != key:
            self._plan = self._make_plan(meta, num_heads, groups, dtype, device)
            self._plan_meta = meta  # holding a reference: a later meta cannot reuse its id
            self._plan_key = key
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
        plan = self._get_plan(meta, num_heads, groups, key_cache.dtype, q.device)

        # 1. write the new tokens' k/v into their slots
        flat_k = key_cache.view(-1, num_kv_heads, head_dim)
        flat_v = value_cache.view(-1, num_kv_heads, head_dim)
        k_new = k if plan.write_rows is None else k[plan.write_rows]
        v_new = v if plan.write_rows is None else v[plan.write_rows]
        flat_k.index_copy_(0, plan.write_slots, k_new.to(key_cache.dtype))
        flat_v.index_copy_(0, plan.write_slots, v_new.to(value_cache.dtype))

        out = torch.empty_like(q)
        if plan.native is not None:
            self._decode_native(q, out, key_cache, value_cache, meta, plan.native, scale)
        if plan.tiled is not None:
            self._prefill_tiled(q, out, key_cache, value_cache, meta, plan.tiled, scale)
        for group in plan.decodes:
            out[group.rows] = self._decode(q[group.rows], key_cache, value_cache, group, scale).to(out.dtype)
        for pre in plan.prefills:
            out[pre.start : pre.end] = self._prefill(q, k, v, key_cache, value_cache, pre, scale).to(out.dtype)
        return out

    def _decode_native(self, q, out, key_cache, value_cache, meta: AttentionMetadata,
                       nd: _NativeDecode, scale: float) -> None:
        """Every decode row in one C call, straight over the paged cache (no gather)."""
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = key_cache.shape[2]
        dt = key_cache.dtype
        qn, on, direct = _kernel_io(q, out, dt)
        kern = self._native_kernel
        kern.sync()  # each thread takes its own slice: heads x (max_len scores + 256 accumulators)
        need = num_heads * (nd.max_len + 256) * max(1, kern.lib.threads)
        if self._scratch is None or self._scratch.numel() < need:
            self._scratch = torch.empty(max(need, 4096), dtype=torch.float32)
        assert key_cache.is_contiguous() and value_cache.is_contiguous()
        tables = meta.block_tables
        fn = self._native_kernel.fns["paged_decode_bf16" if dt == torch.bfloat16 else "paged_decode_f32"]
        rc = fn(qn.data_ptr(), qn.stride(0), on.data_ptr(), on.stride(0),
                key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
                nd.q_rows.data_ptr(), nd.seq_idx.data_ptr(), nd.lens.data_ptr(), nd.q_rows.numel(),
                num_heads, num_kv_heads, head_dim, key_cache.shape[1], float(scale), self._scratch.data_ptr())
        if rc != 0:
            raise RuntimeError(f"CPU decode kernel rejected heads={num_heads}/{num_kv_heads} head_dim={head_dim}")
        if not direct:
            out[nd.q_rows] = on[nd.q_rows].to(out.dtype)

    def _prefill_tiled(self, q, out, key_cache, value_cache, meta: AttentionMetadata,
                       tp: _TiledPrefill, scale: float) -> None:
        """Every tiled-route chunk in one C call (inferq_kernels/cpu/paged_prefill.c), straight over
        the paged cache (the chunks' own k/v were written there first)."""
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = key_cache.shape[2]
        dt = key_cache.dtype
        qn, on, direct = _kernel_io(q, out, dt)
        kern = self._native_kernel
        kern.sync()
        assert key_cache.is_contiguous() and value_cache.is_contiguous()
        tables = meta.block_tables
        if tp.kernel == "rows":
            # scratch per thread: tile x query heads per kv head x (longest sequence + 256) floats
            tile = _ROWS_TILE
            need = tile * (num_heads // num_kv_heads) * (tp.max_len + 256) * max(1, kern.lib.threads)
            if self._scratch is None or self._scratch.numel() < need:
                self._scratch = torch.empty(max(need, 4096), dtype=torch.float32)
            fn = kern.rows_fns["paged_decode_bf16_rows" if dt == torch.bfloat16 else "paged_decode_f32_rows"]
            rc = fn(qn.data_ptr(), qn.stride(0), on.data_ptr(), on.stride(0),
                    key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
                    tp.q_start.data_ptr(), tp.seq_idx.data_ptr(), tp.q_lens.data_ptr(), tp.ctx_lens.data_ptr(),
                    tp.q_start.numel(), num_heads, num_kv_heads, head_dim, key_cache.shape[1], float(scale),
                    self._scratch.data_ptr(), tile)
            fn = None
        elif dt == torch.bfloat16 and kern.prefill_amx is not None and head_dim % 32 == 0:
            fn = kern.prefill_amx  # both products on AMX tiles (paged_prefill_amx.c)
        else:
            fn = kern.prefill_fns["paged_prefill_bf16" if dt == torch.bfloat16 else "paged_prefill_f32"]
        if fn is not None:
            rc = fn(qn.data_ptr(), qn.stride(0), on.data_ptr(), on.stride(0),
                    key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
                    tp.q_start.data_ptr(), tp.seq_idx.data_ptr(), tp.q_lens.data_ptr(), tp.ctx_lens.data_ptr(),
                    tp.q_start.numel(), num_heads, num_kv_heads, head_dim, key_cache.shape[1], float(scale))
        if rc != 0:
            raise RuntimeError(f"CPU prefill kernel rejected heads={num_heads}/{num_kv_heads} head_dim={head_dim}")
        if not direct:
            for start, end in tp.rows:
                out[start:end] = on[start:end].to(out.dtype)

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor, which: int) -> torch.Tensor:
        """cache[blocks] into a reused buffer; valid until the next gather of the same kind."""
        n = blocks.numel()
        ws = self._workspace[which]
        if ws is None or ws.shape[0] < n or ws.shape[1:] != cache.shape[1:] or ws.dtype != cache.dtype or ws.device != cache.device:
            ws = torch.empty((max(n, 64),) + tuple(cache.shape[1:]), dtype=cache.dtype, device=cache.device)
            self._workspace[which] = ws
        return torch.index_select(cache, 0, blocks, out=ws[:n])

    def _decode(self, qd, key_cache, value_cache, group: _DecodeGroup, scale: float) -> torch.Tensor:
        bd, num_heads, head_dim = qd.shape
        num_kv_heads = key_cache.shape[2]
        shape = (bd, -1, num_kv_heads, head_dim)
        keys = self._gather(key_cache, group.blocks, 0).view(shape).transpose(1, 2)  # [B, Hkv, L, D]
        vals = self._gather(value_cache, group.blocks, 1).view(shape).transpose(1, 2)
        qg = qd.view(bd, num_kv_heads, num_heads // num_kv_heads, head_dim).to(keys.dtype)
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=group.mask, scale=scale)
        return o.reshape(bd, num_heads, head_dim)

    def _prefill(self, q, k, v, key_cache, value_cache, pre: _Prefill, scale: float) -> torch.Tensor:
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = key_cache.shape[2]
        groups = num_heads // num_kv_heads
        n_q = pre.end - pre.start
        if pre.context == 0:
            keys = k[pre.start : pre.end].transpose(0, 1)  # [Hkv, L, D]
            vals = v[pre.start : pre.end].transpose(0, 1)
        else:
            keys = self._gather(key_cache, pre.blocks, 0).view(-1, num_kv_heads, head_dim)[: pre.seq_len].transpose(0, 1)
            vals = self._gather(value_cache, pre.blocks, 1).view(-1, num_kv_heads, head_dim)[: pre.seq_len].transpose(0, 1)
        # [Q, Hkv, G, D] -> [Hkv, G*Q, D]: query heads sharing a kv head become extra query rows
        qg = (
            q[pre.start : pre.end]
            .view(n_q, num_kv_heads, groups, head_dim)
            .permute(1, 2, 0, 3)
            .reshape(num_kv_heads, groups * n_q, head_dim)
            .to(keys.dtype)
        )
        if pre.explicit:
            scores = torch.baddbmm(pre.mask, qg, keys.transpose(1, 2), alpha=scale)
            o = torch.bmm(torch.softmax(scores, dim=-1, dtype=torch.float32).to(vals.dtype), vals)
        elif pre.context == 0:
            o = F.scaled_dot_product_attention(
                q[pre.start : pre.end].transpose(0, 1).to(keys.dtype), keys, vals,
                is_causal=True, scale=scale, enable_gqa=groups > 1,
            )  # [Hq, Q, D]
            return o.transpose(0, 1)
        else:
            o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=pre.mask, scale=scale)
        return o.view(num_kv_heads, groups, n_q, head_dim).permute(2, 0, 1, 3).reshape(n_q, num_heads, head_dim)
