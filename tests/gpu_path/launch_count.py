"""Count what one engine step launches on the GPU path, on CPU.

The engine runs with the Triton attention backend (kernels interpreted on CPU),
the model's plain torch ops (no CPU C kernels, no packed weights: what runs on
CUDA), and every step is counted:

* Triton launches: calls of an interpreted kernel's grid (one launch each);
* aten ops that launch a kernel on CUDA: every op a TorchDispatchMode sees except
  views and allocations (metadata only on a GPU);
* the rest (views, ``empty``), which cost host time but no launch.

    TRITON_INTERPRET=1 python -m tests.gpu_path.launch_count [--layers 30]

prints the counts of the first mixed step (decodes next to a prefill chunk) and
of the first decode-only step, per layer and in all.
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

# On a GPU these only make or reshape tensor metadata (or take memory from the
# caching allocator): no kernel.
NO_LAUNCH = {
    "view", "_unsafe_view", "reshape", "slice", "select", "expand", "as_strided", "t", "transpose", "permute",
    "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind", "alias", "detach", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "_reshape_alias", "unflatten", "narrow",
    "chunk", "resolve_conj", "resolve_neg",
}


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.launching: collections.Counter = collections.Counter()
        self.metadata: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        (self.metadata if name in NO_LAUNCH else self.launching)[name] += 1
        return func(*args, **(kwargs or {}))


class TritonCounter:
    """Counts the launches of interpreted Triton kernels, by kernel."""

    def __init__(self) -> None:
        self.launches: collections.Counter = collections.Counter()

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self._cls, self._run = InterpretedFunction, InterpretedFunction.run
        counter = self

        def run(fn, *args, grid, warmup, **kwargs):
            if not warmup:
                counter.launches[fn.fn.__name__] += 1
            with _disable_current_modes():  # the interpreter's own tensor work is not the step's
                return counter._run(fn, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc) -> None:
        self._cls.run = self._run


def count_steps(num_layers: int, folder: str, batch_invariant: bool = False) -> dict[str, dict]:
    """Counts of the first mixed and the first decode-only step of a small batch (by default of
    the throughput mode, ``batch_invariant=False``: cuBLAS matmuls and torch norms)."""
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams
    from tests.tiny_models import save_tiny_model

    save_tiny_model("llama", folder, num_hidden_layers=num_layers)
    llm = LLM(model=folder, attention_backend="triton", device="cpu", dtype="float32", block_size=16,
              max_num_batched_tokens=64, max_num_seqs=8, num_kv_blocks=128, cpu_kernels=False,
              prepack_weights=False, enable_prefix_caching=False, batch_invariant=batch_invariant)
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, n in enumerate((5, 7, 9, 200)):  # three short prompts start decoding while the long one is chunked
        engine.add_request(f"r{i}", list(range(10 + i, 10 + i + n)), params)
    found: dict[str, dict] = {}
    execute = runner.execute

    def counted(sched, kv):
        lens = [s.num_new_tokens for s in sched.scheduled]
        kind = "mixed" if 1 in lens and max(lens) > 1 else "decode" if max(lens) == 1 else "prefill"
        if kind in found:
            return execute(sched, kv)
        ops, triton = OpCounter(), TritonCounter()
        with ops, triton:
            out = execute(sched, kv)
        found[kind] = dict(tokens=sum(lens), seqs=len(lens), triton=triton.launches, launching=ops.launching,
                           metadata=ops.metadata)
        return out

    runner.execute = counted
    # the sampler as on a GPU: greedy rows take one argmax kernel (on CPU a C kernel, no aten op)
    from inferq.gpuworker.engine import sampler

    reads_are_free, sampler._reads_are_free = sampler._reads_are_free, lambda device: False
    try:
        while engine.has_unfinished() and not {"mixed", "decode"} <= found.keys():
            engine.step()
    finally:
        sampler._reads_are_free = reads_are_free
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batch-invariant", action="store_true", help="count the batch-invariant mode (Triton matmuls and norms)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        found = count_steps(args.layers, d, args.batch_invariant)
    for kind in ("mixed", "decode"):
        c = found[kind]
        triton, launching, meta = (sum(c[k].values()) for k in ("triton", "launching", "metadata"))
        print(f"{kind} step ({c['seqs']} sequences, {c['tokens']} tokens), {args.layers} layers: "
              f"{triton} Triton launches, {launching} aten ops that launch a kernel, {meta} views/allocations")
        print("  Triton:", dict(c["triton"]))
        print("  aten (most frequent):", dict(c["launching"].most_common(14)))


if __name__ == "__main__":
    main()
