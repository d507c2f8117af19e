"""Side by side: the CPU engine with glibc's malloc thresholds raised
(inferq.gpuworker.engine.host_malloc, the default) and without (INFERQ_KEEP_FREED_MEMORY=0), on bench offline's
workload (default: prompts only, where a step's temporaries are largest). Each run is a fresh
process (the setting is per process), alternating; it reports the timed run's wall time and
minor page faults, medians and the ratio.

    inferq bench host-malloc [--dtype float32] [--repeats 3] [--max-output 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
from inferq.gpuworker import LLM
from inferq.bench.offline import make_workload, run_inferq
a = json.loads(sys.argv[1])
llm = LLM(dtype=a["dtype"], max_num_batched_tokens=2048, enable_prefix_caching=False)
vocab = llm.engine.model_config.vocab_size
run_inferq(llm, make_workload(4, 8, 32, 1, 4, vocab, 1))
wl = make_workload(a["n"], 16, a["max_input"], min(16, a["max_output"]), a["max_output"], vocab, 0)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0 = time.perf_counter()
run_inferq(llm, wl)
print(json.dumps({"s": time.perf_counter() - t0, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench host-malloc", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--max-input", type=int, default=256)
    ap.add_argument("--max-output", type=int, default=1, help="1: prompts only")
    args = ap.parse_args(argv)
    spec = json.dumps({"dtype": args.dtype, "n": args.num_requests, "max_input": args.max_input,
                       "max_output": args.max_output})
    res: dict[str, list[dict]] = {"kept (default)": [], "INFERQ_KEEP_FREED_MEMORY=0": []}
    for _ in range(args.repeats):
        for name, keep in (("INFERQ_KEEP_FREED_MEMORY=0", "0"), ("kept (default)", "1")):
            env = dict(os.environ, OMP_NUM_THREADS="1", INFERQ_KEEP_FREED_MEMORY=keep)
            out = subprocess.run([sys.executable, "-c", RUN, spec], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.stderr.write(out.stderr[-3000:])
                return 1
            res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {name}: {res[name][-1]['s']:.2f} s, {res[name][-1]['faults']} minor faults", flush=True)
    med = {k: (statistics.median(r["s"] for r in v), statistics.median(r["faults"] for r in v)) for k, v in res.items()}
    base = med["INFERQ_KEEP_FREED_MEMORY=0"][0]
    print(f"\n{args.dtype}, {args.num_requests} requests, inputs 16-{args.max_input}, outputs up to {args.max_output}, "
          f"1 thread; medians of {args.repeats} alternating runs")
    print("| malloc | wall s | minor faults | speed-up |\n| --- | ---: | ---: | ---: |")
    for k, (s, f) in med.items():
        print(f"| {k} | {s:.2f} | {f:,.0f} | {base / s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
