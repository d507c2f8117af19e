"""Decode steps on the CPU as a replayed list of C kernel calls (a CPU cousin of CUDA graphs).

A decode step of a small model at batch 1 is ~300 kernel calls (10 a layer), each a few
microseconds of torch dispatch, tensor allocation and argument checks around the C kernel:
on SmolLM2-135M that Python was a third of the step on top of the weight stream
(``inferq bench step-breakdown``). For a decode-only step of ``b`` rows every kernel reads
and writes buffers of a shape fixed by ``b``: so the calls are recorded once per ``b``
against buffers kept for it (pointers, strides and sizes worked out once) and replayed as
plain ctypes calls; per step only the positions' rotary rows, the K/V slots and the block
table change.

The replay runs exactly the kernels the layer-by-layer forward runs (llama.py:
``add_rms_norm``, ``PackedWeight`` / ``PackedGateUp``, ``rotate_qk``, the paged decode
kernel of the torch backend) with the same inputs, so its results are the same bits: the
first replay of each ``b`` is checked against the forward, and any difference (or a kernel
refusing its arguments) turns the replay off for good, the forward giving the step's result.
A GGUF's quantized projection (quant_linear.py) is replayed as its kernels' calls on the
fixed buffers (``QuantLinear.replay_calls``: the activation quantizer, then each segment);
any other projection as its own call, its result copied into the fixed buffer. Where a
piece has no C kernel here (oneDNN packing, q/k norms, a KV cache of another dtype, the
attention backend not on its C decode kernel) the model never replays.

The step's calls, in order, are one list (``_Recording.ops``), from the embedding's rows (a
GGUF table's kernel; other tables are looked up from Python) and the positions' cos/sin rows to
the final norm, reading the step's ids, positions and slots where the runner put them. Where every one is a C kernel of
a known prototype, the list is encoded as a step program (cpu_step_program.py) that C walks in
one foreign call; else (a projection through Python, or ``inferq bench step-breakdown`` timing
each call) the same list is called from Python.
"""
from __future__ import annotations

import logging
import threading
from array import array

import torch

from inferq.gpuworker.engine import cpu_argmax
from inferq.gpuworker.models import cpu_step_program
from inferq.gpuworker.models.cpu_linear import PackedGateUp, PackedWeight
from inferq.kernels.cpu import loader

log = logging.getLogger(__name__)

MAX_ROWS = 64  # the ~300 calls a step are the same at any row count; past 64 rows they are a small part of it


PerStep = cpu_step_program.PerStep
# the step program's per-step parameters
TABLES, TABLE_STRIDE, SCRATCH, IDS, POSITIONS, SLOTS, OUT = range(7)
N_PARAMS = 7
# what a step program ends with: the final-normed hidden rows, the logits, the greedy tokens
HIDDEN, LOGITS, TOKENS = "hidden", "logits", "tokens"


def _embed_call(model, b: int, residual: torch.Tensor):
    """The embedding of a step's ids into ``residual`` as one kernel call where the table is a
    GGUF's blocks (one segment), else None (the replay looks the rows up from Python)."""
    table = model.packed_embed if model.packed_embed is not None else (
        model.packed_lm_head if model.embed_tokens is None else None)
    seg = getattr(table, "segments", None)
    if not seg or len(seg) != 1 or not hasattr(seg[0], "rows_call"):
        return None
    return seg[0].rows_call(table.lib, PerStep(IDS), b, residual.data_ptr(), residual.dtype == torch.bfloat16)


def _call_into(w, x: torch.Tensor, bias, y: torch.Tensor) -> int:
    """A projection without a raw kernel call here, into the fixed buffer ``y``."""
    y.copy_(w(x, bias))
    return 0


class _Recording:
    """Buffers and fixed kernel arguments of a ``b``-row decode step. ``instrument(fn, part)``,
    where given, wraps every op function (``inferq bench step-breakdown`` times them)."""

    def __init__(self, model, b: int, instrument=None, head_out=None) -> None:
        cfg = model.config
        layer0 = model.layers[0]
        dt = model.dtype
        h, d = cfg.hidden_size, cfg.head_dim
        hq, hkv = cfg.num_heads, cfg.num_kv_heads
        q_size, kv_size = layer0.q_size, layer0.kv_size
        qkv_n = q_size + 2 * kv_size
        inter = cfg.intermediate_size
        isz = torch.tensor([], dtype=dt).element_size()
        self.b = b
        e = lambda *shape: torch.empty(*shape, dtype=dt)  # noqa: E731
        self.residual, self.x, self.qkv = e(b, h), e(b, h), e(b, qkv_n)
        self.qo, self.ko, self.attn = e(b, hq, d), e(b, hkv, d), e(b, hq * d)
        self.o_out, self.act, self.down_out = e(b, h), e(b, inter), e(b, h)
        self.cos, self.sin = e(b, d), e(b, d)
        self.rows = torch.arange(b, dtype=torch.int64)  # query row i is sequence i
        self.lens = torch.empty(b, dtype=torch.int64)
        self.inputs: DecodeInputs | None = None  # made by DecodeReplay.inputs on the runner's first direct step
        self.buffers: list = []  # the projections' own buffers (x's int8 blocks)
        self.steps = None  # (the KV cache list they were made for, {kind: StepProgram or PythonSteps})
        self.scratch = torch.empty(0, dtype=torch.float32)
        self._scratch_size, self._scratch_ptr = 0, 0  # its size and address as ints: read every step
        self.kv_row_bytes = hkv * d * isz
        ptr = lambda t: t.data_ptr()  # noqa: E731
        kernels = layer0.cpu_kernels
        wrap = instrument or (lambda fn, part: fn)
        self.wrap = wrap
        self.wrap_linear = lambda fn: wrap(fn, "linear")  # noqa: E731
        norm, rotary = wrap(kernels.add_rms_norm[dt], "other model ops"), wrap(kernels.rotary[dt], "other model ops")
        eps = cfg.rms_norm_eps
        # K and V rows for the cache: each row's k after rotary, its v inside qkv
        self.kv_rows = (ptr(self.ko), self.kv_row_bytes, ptr(self.qkv) + (q_size + kv_size) * isz, qkv_n * isz)
        self.rotary = (rotary, (ptr(self.qkv), qkv_n, hq, ptr(self.qkv) + q_size * isz, qkv_n, hkv, d,
                                ptr(self.cos), ptr(self.sin), ptr(self.qo), ptr(self.ko), b))
        self.attention = wrap(kernels.fns["paged_decode_bf16" if dt == torch.bfloat16 else "paged_decode_f32"],
                              "attention")
        self.heads = (hq, hkv, d)
        self.scale = float(layer0.scale)
        self.layers = []
        for i, layer in enumerate(model.layers):
            p = layer.packed
            qkv, o, gate_up, down = p["qkv"], p["o"], p["gate_up"], p["down"]
            hidden_in = None if i == 0 else ptr(self.down_out)
            pre = (norm, (ptr(self.residual), hidden_in, ptr(layer.input_layernorm), ptr(self.x), b, h, eps))
            qkv_call = self._linear(qkv, self.x, layer.qkv_bias, self.qkv)
            o_call = self._linear(o, self.attn, layer.o_bias, self.o_out)
            post = (norm, (ptr(self.residual), ptr(self.o_out), ptr(layer.post_attention_layernorm), ptr(self.x), b, h, eps))
            if isinstance(gate_up, PackedGateUp):
                fused = self.wrap_linear(gate_up.lib.silu_fused[gate_up.layout][0])
                mlp = [(fused, (ptr(self.x), h, b, ptr(gate_up.packed), gate_up.n, gate_up.k, ptr(self.act), inter))]
            else:
                if not hasattr(self, "gate_up_out"):
                    self.gate_up_out = e(b, 2 * inter)
                mlp = [*self._linear(gate_up, self.x, layer.gate_up_bias, self.gate_up_out),
                       (wrap(kernels.silu_mul[dt], "other model ops"),
                        (ptr(self.gate_up_out), 2 * inter, inter, ptr(self.act), b))]
            down_call = self._linear(down, self.act, layer.down_bias, self.down_out)
            self.layers.append((pre, qkv_call, post, mlp, o_call, down_call))
        # the last layer's residual add + the final norm, into the given rows
        self.final_norm = lambda out: (norm, (ptr(self.residual), ptr(self.down_out), ptr(model.norm), out, b, h,  # noqa: E731
                                              eps))
        self.final = self.final_norm(PerStep(OUT))
        self.head = self._head(model, head_out)
        # the step's inputs: the embedding's rows (quantized tables; else model.embed from
        # Python) and the positions' cos/sin rows, read from the ids and positions themselves
        embed = _embed_call(model, b, self.residual)
        self.embed = None if embed is None else (wrap(embed[0], "other model ops"), embed[1])
        rot = model.rotary
        self.rotary_rows = [(cpu_step_program.gather, (ptr(mine), ptr(table), d * isz, PerStep(POSITIONS), b,
                                                       table.shape[0]))
                            for mine, table in ((self.cos, rot.cos), (self.sin, rot.sin))]
        self.n_inputs = (self.embed is not None) + len(self.rotary_rows)  # the ops that read the step's inputs

    def _head(self, model, head_out):
        """``(ops, argmax op, logits, tokens)``: the final norm into a buffer of its own, the LM
        head into ``logits`` and (for greedy rows) their argmax into ``tokens``, as kernel calls;
        None where the LM head has no kernel call here (it runs from Python after the forward).
        ``head_out(n)``: the replay's logits [MAX_ROWS, n] and tokens [MAX_ROWS], shared by every
        row count (a recording's logits of its own would hold MAX_ROWS x (MAX_ROWS + 1) / 2
        rows of the vocabulary: 1 GB for a 128k-token float32 LM head)."""
        head, argmax = model.packed_lm_head, cpu_argmax.load()
        if (head is None or isinstance(head, torch.Tensor) or model.logits_cols is not None or argmax is None
                or head_out is None):
            return None
        b, dt = self.b, model.dtype
        self.hidden = torch.empty_like(self.x)
        logits, tokens = head_out(head.n)
        logits, tokens = logits[:b], tokens[:b]
        calls = self._linear(head, self.hidden, None, logits, part="LM head", from_python=False)
        if calls is None:
            return None
        pick = (self.wrap(argmax.fns[dt], "sampler"), (logits.data_ptr(), head.n, b, head.n, tokens.data_ptr()))
        return [self.final_norm(self.hidden.data_ptr()), *calls], [pick], logits, tokens

    def _linear(self, w, x: torch.Tensor, bias, y: torch.Tensor, part: str = "linear", from_python: bool = True):
        """The calls of ``y = w(x, bias)`` on fixed buffers: PackedWeight._kernel's; a quantized
        projection's own kernel calls (QuantLinear.replay_calls) where it has them and no bias;
        else the projection's call (``_call_into``, from Python), or None if not ``from_python``."""
        wrap = lambda fn: self.wrap(fn, part)  # noqa: E731
        if not isinstance(w, PackedWeight):
            raw = getattr(w, "replay_calls", None)
            made = raw(x, y) if raw is not None and bias is None else None
            if made is not None:
                calls, buffers = made
                self.buffers.append(buffers)
                return [(wrap(fn), args) for fn, args in calls]
            return [(wrap(_call_into), (w, x, bias, y))] if from_python else None
        return [(wrap(w._run), (x.data_ptr(), x.stride(0), x.shape[0], w.packed.data_ptr(), w.n, w.k,
                                            None if bias is None else bias.data_ptr(), y.data_ptr(), w.n))]

    def steps_for(self, kv_caches, kind: str = HIDDEN):
        """The step's calls for these KV caches, ending as ``kind`` says (HIDDEN, LOGITS or
        TOKENS): a StepProgram, else PythonSteps (made once per cache list and kind: the engine
        allocates its caches once, so this is one identity check a step)."""
        made = self.steps[1].get(kind) if self.steps is not None and self.steps[0] is kv_caches else None
        if made is None:
            ops = self.ops(kv_caches, kind)
            made = cpu_step_program.StepProgram.build(cpu_step_program.load(), ops, N_PARAMS)
            made = made if made is not None else cpu_step_program.PythonSteps(ops, N_PARAMS)
            if self.steps is None or self.steps[0] is not kv_caches:
                self.steps = (kv_caches, {})
            self.steps[1][kind] = made
        return made

    def ops(self, kv_caches, kind: str = HIDDEN) -> list:
        """Every call of the step in order, ``(fn, args)``, from the embedding to the final norm
        into the output rows (HIDDEN), or on through the LM head (LOGITS) and the argmax
        (TOKENS); per-step parameters (``PerStep``): the block table, its row stride, the
        attention scratch, the ids, positions and K/V slots (int64) and the output rows."""
        tables, table_stride, scratch = PerStep(TABLES), PerStep(TABLE_STRIDE), PerStep(SCRATCH)
        hq, hkv, d = self.heads
        q_stride, b, ptr = hq * d, self.b, (lambda t: t.data_ptr())  # noqa: E731
        block_size = kv_caches[0][0].shape[1]
        ops = [*([self.embed] if self.embed is not None else []), *self.rotary_rows]
        for (pre, qkv, post, mlp, o, down), (key_cache, value_cache) in zip(self.layers, kv_caches):
            kc, vc = ptr(key_cache), ptr(value_cache)
            ops += [pre, *qkv, self.rotary,
                    (cpu_step_program.kv_store, (kc, vc, *self.kv_rows, self.kv_row_bytes, b, PerStep(SLOTS))),
                    (self.attention, (ptr(self.qo), q_stride, ptr(self.attn), q_stride, kc, vc, tables, table_stride,
                                      ptr(self.rows), ptr(self.rows), ptr(self.lens), b, hq, hkv, d, block_size,
                                      self.scale, scratch)),
                    *o, post, *mlp, *down]
        if kind == HIDDEN:
            return ops + [self.final]
        head, pick = self.head[0], self.head[1]
        return ops + head + (pick if kind == TOKENS else [])

    def scratch_for(self, max_len: int, threads: int) -> int:
        """The attention kernel's fp32 scratch (as the torch backend sizes it), grown as needed."""
        need = self.heads[0] * (max_len + 256) * max(1, threads)
        if self._scratch_size < need:
            self._scratch_size = max(need, 2 * self._scratch_size, 4096)
            self.scratch = torch.empty(self._scratch_size, dtype=torch.float32)
            self._scratch_ptr = self.scratch.data_ptr()
        return self._scratch_ptr


class DecodeInputs:
    """A ``b``-row decode step's integer inputs where its step program reads them, written by
    the model runner item by item (``ModelRunner._direct_inputs``): token ids, positions, K/V
    slots and sequence lengths (int64) and the block table (int32, rows ``width`` apart). A
    step's Python runs with cold caches, where a numpy or torch call costs ~10-25 us and a
    store through a memoryview well under one: so the runner's general input build and the
    replay's tensor checks (~25 such calls) are skipped once a row count is checked.

    Row ``i`` of the table is copied from the KV manager's block list only where that list is
    another object than the one it was copied from (another request at this row) or grew: a
    request's list only grows in place (a cut makes a new list), as ``PersistentBlockTable``
    also relies on."""

    def __init__(self, b: int, lens: torch.Tensor, width: int) -> None:
        self.width = width
        self.ids, self.positions, self.slots = (torch.zeros(b, dtype=torch.int64) for _ in range(3))
        self.lens = lens  # the recording's: the attention kernel reads it
        self.table = torch.zeros(b, width, dtype=torch.int32)
        self.ids_mv, self.positions_mv, self.slots_mv, self.lens_mv = (
            memoryview(t.numpy()) for t in (self.ids, self.positions, self.slots, self.lens))
        self.table_mv = memoryview(self.table.numpy().reshape(-1))
        self.pointers = (self.ids.data_ptr(), self.positions.data_ptr(), self.slots.data_ptr(), self.table.data_ptr())
        self._src: list = [None] * b  # per row: the block list it was copied from (held: its id stays unique)
        self._filled = [0] * b

    def set_blocks(self, i: int, blocks: list[int]) -> bool:
        """Row ``i``'s block table from ``blocks``; False where they do not fit its width."""
        n = len(blocks)
        same = self._src[i] is blocks
        have = self._filled[i] if same else 0
        if same and have == n:
            return True  # most steps: no new block
        if n > self.width:
            return False
        if n < have:  # shrank in place: copy it all again
            have = 0
        base = i * self.width
        self.table_mv[base + have:base + n] = array("i", blocks[have:n])
        self._src[i], self._filled[i] = blocks, n
        return True


class DecodeReplay:
    """Replays decode-only steps of up to MAX_ROWS rows for one model (see the module doc)."""

    def __init__(self, model) -> None:
        self.model = model
        self.kernels = model.layers[0].cpu_kernels
        # every library the step's kernels come from, its thread count synced before a step
        weights = [layer.packed[n] for layer in model.layers for n in ("qkv", "o", "gate_up", "down")]
        weights += [model.packed_lm_head, model.packed_embed]
        libs = [getattr(w, "lib", None) for w in weights] + [cpu_argmax.load(), cpu_step_program.load()]
        self.libs = list({id(lib): lib for lib in libs if lib is not None}.values())
        self.enabled = True
        self.instrument = None  # see _Recording; forget() after setting it
        self.teams = True  # False: step programs op by op at any thread count (a benchmark's baseline)
        self._recordings: dict[int, _Recording] = {}
        self._checked: set[int] = set()  # row counts checked against the forward, in any kind
        self._checked_kinds: set[tuple[int, str]] = set()
        self._head_buffers = None  # see _head_out
        self._tokens_mv = None  # the greedy tokens' buffer, read as Python ints
        self._synced = None  # (thread count, thread) the libraries were last synced for

    @staticmethod
    def supported(model) -> bool:
        """Whether every op of this model's decode step has a C kernel here."""
        cfg = model.config
        layer0 = model.layers[0]
        if model.dtype not in (torch.float32, torch.bfloat16) or layer0.cpu_kernels is None or cfg.qk_norm:
            return False
        if getattr(model.backend, "name", None) != "torch" or getattr(model.backend, "native_decode", False) is False:
            return False
        # every projection packed for a CPU kernel (a PackedWeight, or quantized blocks): not
        # oneDNN's layout (a tensor), nor a plain weight
        return all(layer.packed.get(n) is not None and not isinstance(layer.packed[n], torch.Tensor)
                   for layer in model.layers for n in ("qkv", "o", "gate_up", "down"))

    def forget(self) -> None:
        """Drop the recordings (they hold the kernel functions they were made with)."""
        self._recordings.clear()

    def applies(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, meta) -> bool:
        b = input_ids.shape[0]
        return (self.enabled and meta.max_query_len == 1 and 0 < b <= MAX_ROWS and meta.all_slots_valid
                and all(t.dtype == torch.int64 and t.is_contiguous() for t in (input_ids, positions, meta.slot_mapping))
                and len(meta.seq_lens_cpu) == b and meta.block_tables.dtype == torch.int32
                and meta.block_tables.is_contiguous() and kv_caches[0][0].dtype == self.model.dtype)

    def _head_out(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits [MAX_ROWS, n] (model dtype) and greedy tokens [MAX_ROWS] every recording
        writes its first rows of (a step reads them before the next one runs)."""
        if self._head_buffers is None:
            self._head_buffers = (torch.empty(MAX_ROWS, n, dtype=self.model.dtype),
                                  torch.empty(MAX_ROWS, dtype=torch.int64))
            self._tokens_mv = memoryview(self._head_buffers[1].numpy())
        return self._head_buffers

    def _recording(self, b: int) -> _Recording:
        rec = self._recordings.get(b)
        if rec is None:
            # plain tensors, not inference tensors: the runner's direct steps (DecodeInputs) run
            # outside inference mode, and may sample from the logits buffer in place
            with torch.inference_mode(False):
                rec = self._recordings[b] = _Recording(self.model, b, self.instrument, self._head_out)
        return rec

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, meta, forward):
        """The final-normed hidden states of a decode-only step; ``forward`` is the model's
        layer-by-layer forward, run instead where the replay cannot (and beside the first
        replay of each row count, as its check)."""
        b = input_ids.shape[0]
        rec = self._recording(b)
        out = torch.empty_like(rec.x)  # a fresh tensor: the caller may keep it past the next step
        if not self._replay(rec, input_ids, positions, kv_caches, meta, HIDDEN, out):
            return forward()
        if (b, HIDDEN) not in self._checked_kinds:
            expected = forward()  # rewrites the same K/V slots with its own values
            self._check_against(b, HIDDEN, torch.equal(out, expected))
            return expected
        return out

    def run_head(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, meta, greedy: bool,
                 forward_logits):
        """``(logits, tokens)`` of a decode-only step with the LM head (and for ``greedy`` rows
        the argmax, else ``tokens`` None) in the step program, or None where the LM head has no
        kernel call here or a kernel refused (the caller takes the forward and its LM head).
        Both are views of the replay's buffers (``_head_out``), rewritten by the next decode
        step: read them (or copy) before it. ``forward_logits``: the forward's logits, the
        first replay's check."""
        b = input_ids.shape[0]
        rec = self._recording(b)
        if rec.head is None:
            return None
        kind = TOKENS if greedy else LOGITS
        if not self._replay(rec, input_ids, positions, kv_caches, meta, kind):
            return None
        logits, tokens = rec.head[2], rec.head[3] if greedy else None
        if (b, kind) not in self._checked_kinds:
            expected = forward_logits()
            picked = expected.argmax(dim=-1) if greedy else None  # torch's, not the program's kernel
            self._check_against(b, kind, torch.equal(logits, expected) and (not greedy or torch.equal(tokens, picked)))
            return expected, picked
        return logits, tokens

    def _check_against(self, b: int, kind: str, same: bool) -> None:
        if not same:
            log.warning("CPU decode replay (%s) differs from the forward at %d rows: decode steps take the forward",
                        kind, b)
            self.enabled = False
        self._checked_kinds.add((b, kind))
        self._checked.add(b)

    def _sync_threads(self) -> None:
        """Every library of the step at torch's thread count, its team pinned for this thread:
        done again only when the count or the calling thread changes (a step's Python runs with
        cold caches, where each sync costs microseconds)."""
        key = (torch.get_num_threads(), threading.get_ident())
        if key != self._synced:
            self.kernels.sync()
            for lib in self.libs:
                if hasattr(lib, "threads"):
                    loader.sync_threads(lib)
            self._synced = key

    def _replay(self, rec: _Recording, input_ids, positions, kv_caches, meta, kind: str,
                out: torch.Tensor | None = None) -> bool:
        """The step program on the general path's tensors, ending as ``kind`` says (HIDDEN: into
        ``out``); False, the replay off for good, where a kernel refused."""
        rec.lens.copy_(meta.seq_lens)
        tables = meta.block_tables
        return self._run(rec, kv_caches, kind, input_ids, (input_ids.data_ptr(), positions.data_ptr(),
                  meta.slot_mapping.data_ptr(), tables.data_ptr()), tables.stride(0), meta.max_seq_len,
                  0 if out is None else out.data_ptr())

    def ready(self, b: int, kind: str) -> bool:
        """Whether a ``b``-row decode step ending as ``kind`` replays with nothing left to check:
        then the runner may write its inputs straight into ``inputs(b, ...)`` and ``run_inputs``."""
        return self.enabled and (b, kind) in self._checked_kinds and b in self._recordings

    def inputs(self, b: int, width: int) -> DecodeInputs:
        """The ``b``-row step's input buffers, block table rows ``width`` wide (``ready(b, kind)``)."""
        rec = self._recordings[b]
        if rec.inputs is None or rec.inputs.width != width:
            rec.inputs = DecodeInputs(b, rec.lens, width)
        return rec.inputs

    def run_inputs(self, inputs: DecodeInputs, kind: str, max_len: int, kv_caches):
        """``(logits, greedy tokens as a list or None)`` of the step whose inputs the runner wrote
        into ``inputs`` (``max_len``: the longest sequence), as ``run_head`` gives them; None where
        a kernel refused (the replay is then off: the caller takes the general path)."""
        b = len(inputs.ids_mv)
        rec = self._recordings[b]
        if not self._run(rec, kv_caches, kind, inputs.ids, inputs.pointers, inputs.width, max_len, 0):
            return None
        return rec.head[2], (self._tokens_mv[:b].tolist() if kind == TOKENS else None)

    def _run(self, rec: _Recording, kv_caches, kind: str, input_ids: torch.Tensor, pointers, table_stride: int,
             max_len: int, out: int) -> bool:
        """The step program on inputs at ``pointers`` (ids, positions, slots, block table) and the
        recording's ``lens``; False, the replay off for good, where a kernel refused (the step
        then takes the forward)."""
        self._sync_threads()
        if rec.embed is None:  # a table with no kernel call here: looked up by torch
            with torch.inference_mode():
                rec.residual.copy_(self.model.embed(input_ids))
        steps = rec.steps_for(kv_caches, kind)
        params = steps.params
        params[IDS], params[POSITIONS], params[SLOTS], params[TABLES] = pointers
        params[TABLE_STRIDE], params[OUT] = table_stride, out
        params[SCRATCH] = rec.scratch_for(max_len, self.kernels.lib.threads)
        rc, at = steps.run(self.teams)
        if rc and at < rec.n_inputs:  # an id past the embedding or a position past the rotary table
            raise IndexError(f"decode step input out of range (rc {rc}): token ids must be < the vocabulary, "
                             f"positions < {self.model.rotary.cos.shape[0]}")
        if rc:  # 0, or None from a kernel that returns nothing
            log.warning("CPU decode replay refused by a kernel (rc %s): decode steps take the forward", rc)
            self.enabled = False
            return False
        return True

