"""vLLM as a benchmark peer for ``inferq bench offline --peers vllm``.

vLLM pins its own torch, so it never shares inferq's environment: this file is
run as a script by the Python of a separate virtual environment (made by
``scripts/setup_vllm_peer.sh``; found through ``--vllm-python`` or the
``INFERQ_VLLM_PYTHON`` environment variable). The parent writes the workload
(prompt token ids and output lengths) to a JSON file; the child runs vLLM's
offline ``LLM.generate`` on it (greedy, EOS ignored, prefix caching off, same
token budget and sequence cap), checks it made exactly the requested tokens,
and writes the wall time of each run back.

The script half imports only the standard library and vLLM: it must not import
inferq (whose dependencies are not in vLLM's environment). vLLM's ``LLM``
spawns an engine process, so building it sits under ``__main__``.
vLLM vs inferq is a benchmark comparison only; vLLM is never a dependency.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ENV_PYTHON = "INFERQ_VLLM_PYTHON"


def vllm_python(explicit: str | None = None) -> str:
    path = explicit or os.environ.get(ENV_PYTHON)
    if not path:
        raise SystemExit(
            f"--peers vllm needs vLLM's own Python: run scripts/setup_vllm_peer.sh, then pass "
            f"--vllm-python <venv>/bin/python or set {ENV_PYTHON}"
        )
    if not os.path.exists(path):
        raise SystemExit(f"vLLM python {path!r} does not exist (see scripts/setup_vllm_peer.sh)")
    return path


def run_vllm(python: str, model_folder: str, prompts: list[list[int]], output_lens: list[int], *, dtype: str,
             repeats: int, max_num_seqs: int, max_num_batched_tokens: int, threads: int,
             kv_cache_gib: int = 2, timeout: float = 3600) -> list[float]:
    """Run the workload through vLLM in ``python``'s environment; return the wall seconds of each run."""
    with tempfile.TemporaryDirectory(prefix="inferq-vllm-") as tmp:
        job = os.path.join(tmp, "job.json")
        out = os.path.join(tmp, "out.json")
        with open(job, "w") as f:
            json.dump({"model": model_folder, "prompts": prompts, "output_lens": output_lens, "dtype": dtype,
                       "repeats": repeats, "max_num_seqs": max_num_seqs,
                       "max_num_batched_tokens": max_num_batched_tokens, "out": out}, f)
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # vLLM keeps one core for its front end and binds compute threads to the rest; with
        # N cores visible it computes on N-1, so inferq's "--threads N-1" is the like-for-like run.
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.pop("PYTHONPATH", None)  # keep inferq's tree out of vLLM's interpreter
        proc = subprocess.run([python, os.path.abspath(__file__), job], env=env, timeout=timeout,
                              cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise RuntimeError(f"vLLM peer failed (exit {proc.returncode}):\n{tail}")
        with open(out) as f:
            return json.load(f)["seconds"]


def _child(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams  # only in vLLM's environment

    llm = LLM(model=job["model"], dtype=job["dtype"], max_num_seqs=job["max_num_seqs"],
              max_num_batched_tokens=job["max_num_batched_tokens"], enable_prefix_caching=False, seed=0)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    params = [SamplingParams(max_tokens=o, min_tokens=o, temperature=0.0, ignore_eos=True) for o in job["output_lens"]]
    want = sum(job["output_lens"])
    # Warm-up (compilation and caches) on a few short requests, as inferq gets.
    llm.generate(prompts[:4], [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * min(4, len(prompts)),
                 use_tqdm=False)
    seconds = []
    for _ in range(job["repeats"]):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if got != want:
            raise SystemExit(f"vLLM made {got} tokens, expected {want}")
        print(f"vllm run: {seconds[-1]:.2f} s", file=sys.stderr, flush=True)
    with open(job["out"], "w") as f:
        json.dump({"seconds": seconds}, f)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
