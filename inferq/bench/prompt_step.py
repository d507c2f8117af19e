"""Time the serving workload's prompt step on the real model: a fresh prompt of
--prompt-len random tokens joins --running decodes, one step; then a decode step.
Prints the medians over --steps such pairs (float32 by default, one torch thread).

    inferq bench prompt-step [--matmul-kernel-rows N] [--torch-prefill] [--profile]

--matmul-kernel-rows caps the rows our CPU matmul kernel takes (past it: MKL on the fp32
panels, as on Intel past 64 rows; the bf16 kernel in chunks of that many rows); --torch-prefill keeps
prompts on baddbmm instead of the C kernels; --prefill-path forces one route of
inferq.gpuworker.attention.torch_backend (rows / tiled / torch);
INFERQ_CPU_KERNELS=0 turns every C kernel off. Alternate settings across runs: this
machine's speed drifts by 5-15 % over minutes.
"""
import argparse
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench prompt-step", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--running", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--matmul-kernel-rows", type=int, default=None)
    ap.add_argument("--torch-prefill", action="store_true")
    ap.add_argument("--prefill-path", choices=["rows", "tiled", "torch"], default=None,
                    help="force the attention backend's prefill route (default: its own choice)")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's table of one prompt step")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    llm = LLM(dtype=args.dtype, enable_prefix_caching=False)
    eng = llm.engine
    if args.matmul_kernel_rows is not None:
        for layer in eng.model.layers:
            for packed in getattr(layer, "packed", {}).values():
                if hasattr(packed, "max_rows"):
                    packed.max_rows = args.matmul_kernel_rows
    if args.torch_prefill:
        eng.model.backend.native_prefill = False
    if args.prefill_path:
        eng.model.backend.prefill_path = args.prefill_path
    g = torch.Generator().manual_seed(0)
    prompt = lambda: torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist()  # noqa: E731
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    for i in range(args.running):
        eng.add_request(f"bg{i}", prompt(), SamplingParams(max_tokens=2 * args.steps + 8, temperature=0, ignore_eos=True))
    eng.step()
    eng.step()
    prompt_s, decode_s = [], []
    for i in range(args.steps):
        eng.add_request(f"p{i}", prompt(), one)
        t = time.perf_counter()
        eng.step()
        prompt_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        eng.step()
        decode_s.append(time.perf_counter() - t)
    print(f"prompt step ({args.prompt_len} tokens + {args.running} decodes): median "
          f"{statistics.median(prompt_s) * 1e3:.1f} ms; decode step: median {statistics.median(decode_s) * 1e3:.1f} ms")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        eng.add_request("profiled", prompt(), one)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            eng.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    return 0


if __name__ == "__main__":
    sys.exit(main())
