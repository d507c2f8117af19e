"""vLLM as a benchmark peer for ``inferq bench offline --peers vllm``.

vLLM pins its own torch, so it never shares inferq's environment: this file is
also run as a script by the Python of a separate virtual environment (made by
``scripts/setup_vllm_peer.sh``; found through ``--vllm-python`` or the
``INFERQ_VLLM_PYTHON`` environment variable). The parent writes the workload
(prompt token ids and output lengths) to a JSON file and starts the child,
which builds vLLM's offline ``LLM`` once (greedy, EOS ignored, prefix caching
off, the same token budget and sequence cap), warms it up and says "ready".
Each "run" line on its stdin then times one ``LLM.generate`` of the whole
workload (checking it made exactly the requested tokens) and answers the wall
seconds. So the parent can interleave inferq and vLLM runs on a shared machine
instead of timing one system after the other.

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
_TAG = "@@inferq-peer "


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


class VllmPeer:
    """A live vLLM ``LLM`` in its own interpreter; ``run()`` times one pass of the workload."""

    def __init__(self, python: str, model_folder: str, prompts: list[list[int]], output_lens: list[int], *,
                 dtype: str, max_num_seqs: int, max_num_batched_tokens: int, threads: int,
                 kv_cache_gib: int = 2, start_timeout: float = 1800, constraints: list | None = None,
                 speculative: dict | None = None, batch: int | None = None, temperature: float = 0.0,
                 max_model_len: int | None = None) -> None:
        """``constraints``: per request None or StructuredOutputs fields (json / regex /
        choice / grammar / json_object); constrained requests stop where their grammar
        ends (EOS not ignored) and ``output_lens`` is their max_tokens. ``speculative``:
        vLLM's speculative_config. ``batch``: run the workload in waves of this many
        requests (default: all at once)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="inferq-vllm-")
        job = os.path.join(self._tmp.name, "job.json")
        with open(job, "w") as f:
            json.dump({"model": model_folder, "prompts": prompts, "output_lens": output_lens, "dtype": dtype,
                       "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                       "constraints": constraints, "speculative": speculative, "batch": batch,
                       "temperature": temperature, "max_model_len": max_model_len}, f)
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # vLLM keeps one core for its front end and binds compute threads to the rest; with
        # 2 cores visible it computes on 1, like inferq's --threads 1.
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.pop("PYTHONPATH", None)  # keep inferq's tree out of vLLM's interpreter
        self._log = open(os.path.join(self._tmp.name, "stderr.log"), "w+")
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), job], env=env, cwd=self._tmp.name,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.startup_s = self._expect("ready")

    def _expect(self, word: str) -> float:
        # vLLM logs to stdout too: protocol lines carry a prefix of their own.
        line = self.proc.stdout.readline()
        while line and not line.startswith(_TAG):
            line = self.proc.stdout.readline()
        line = line[len(_TAG):]
        self._last = line
        if not line.startswith(word + " "):
            self._log.flush()
            self._log.seek(0)
            tail = self._log.read()[-4000:]
            self.close()
            raise RuntimeError(f"vLLM peer failed (exit {self.proc.poll()}), got {line!r}:\n{tail}")
        return float(line.split()[1])

    def run(self) -> float:
        return self.run_counted()[0]

    def run_counted(self) -> tuple[float, int]:
        """(wall seconds, output tokens made) of one pass."""
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        seconds = self._expect("seconds")
        return seconds, int(self._last.split()[3])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=120)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._tmp.cleanup()


def _child(job_path: str) -> int:
    t0 = time.perf_counter()
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams  # only in vLLM's environment

    extra = {"speculative_config": job["speculative"]} if job.get("speculative") else {}
    llm = LLM(model=job["model"], dtype=job["dtype"], max_num_seqs=job["max_num_seqs"],
              max_num_batched_tokens=job["max_num_batched_tokens"], enable_prefix_caching=False, seed=0,
              max_model_len=job.get("max_model_len"), **extra)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    constraints = job.get("constraints")
    if constraints:
        from vllm.sampling_params import StructuredOutputsParams

        # One-line JSON, as inferq writes it (schemas/structured.py JSON_STYLE).
        params = [SamplingParams(max_tokens=o, temperature=0.0, structured_outputs=None if c is None else
                                 StructuredOutputsParams(**c, disable_any_whitespace="json" in c or "json_object" in c))
                  for o, c in zip(job["output_lens"], constraints)]
        want = None  # constrained requests end where their grammar does
    else:
        temp = job.get("temperature") or 0.0
        params = [SamplingParams(max_tokens=o, min_tokens=o, temperature=temp, seed=i if temp else None, ignore_eos=True)
                  for i, o in enumerate(job["output_lens"])]
        want = sum(job["output_lens"])
    # Warm-up (compilation and caches) on a few short requests, as inferq gets.
    n = min(4, len(prompts))
    llm.generate(prompts[:n], [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * n, use_tqdm=False)
    print(f"{_TAG}ready {time.perf_counter() - t0:.3f}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t = time.perf_counter()
        wave = job.get("batch") or len(prompts)
        outs = []
        for i in range(0, len(prompts), wave):
            outs += llm.generate(prompts[i : i + wave], params[i : i + wave] if isinstance(params, list) else params,
                                 use_tqdm=False)
        took = time.perf_counter() - t
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if want is not None and got != want:
            print(f"{_TAG}error vLLM made {got} tokens, expected {want}", flush=True)
            return 1
        print(f"{_TAG}seconds {took:.4f} tokens {got}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
