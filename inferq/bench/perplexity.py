"""Quality per quantization type: inferq's perplexity and mean KL divergence against a
reference model, beside llama.cpp's ``llama-perplexity`` on the same GGUF files.

    inferq bench perplexity [--quants Q4_1,Q8_0,F16,Q5_K_M,Q4_K_M,Q4_0] [--ctx 256]
        [--text FILE] [--threads N] [--modes bf16-dequantized,native] [--llama-cpp-dir DIR] [--no-llama-cpp]

The files: the bundled SmolLM2-135M-Instruct Q4_1 GGUF and copies requantized from it
by ``llama-quantize --allow-requantize`` (inferq.bench.llama_cpp_build). The reference
is that Q4_1 file dequantized to float32 and run in float32 (on llama.cpp's side: an
F32 copy of it, the same numbers), so a row's KL is what its type, its second rounding
and the engine's arithmetic cost against the weights inferq ships.

Both sides score the text the way ``llama-perplexity`` does: the tokens cut into
non-overlapping windows of --ctx tokens (stride = ctx, the tail that fills no window
dropped), each window evaluated from an empty cache, and only its second half scored
(positions ctx/2 .. ctx-2 predict the next token), so every scored token has at least
ctx/2 tokens of context. The text defaults to inferq/bench/data/declaration_of_independence.txt.

inferq's logits come from the offline engine (``LLM``, prefix caching off) on each
window as a prompt with ``prompt_logprobs``: the rows its model computes for them are
recorded whole (the engine keeps only the top ones) and checked against the log-probs it
returns. llama.cpp's come from ``llama-perplexity -f TEXT -m FILE -c CTX -b CTX`` (its
final PPL) and ``--kl-divergence`` against the F32 copy's saved logits; the tokens in
that logits file are compared with inferq's tokenization of the text.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

DEFAULT_TEXT = Path(__file__).parent / "data" / "declaration_of_independence.txt"
DEFAULT_QUANTS = ("Q4_1", "Q8_0", "F16", "Q5_K_M", "Q4_K_M", "Q4_0")
SOURCE_TYPE = "Q4_1"  # the bundled file's type


def windows(tokens: list[int], ctx: int) -> list[list[int]]:
    """llama-perplexity's chunks: floor(len / ctx) non-overlapping windows."""
    if ctx < 4 or ctx % 2:
        raise ValueError(f"--ctx must be an even number of at least 4, got {ctx}")
    if len(tokens) < 2 * ctx:
        raise ValueError(f"the text has {len(tokens)} tokens; a context of {ctx} needs at least {2 * ctx}")
    return [tokens[i * ctx:(i + 1) * ctx] for i in range(len(tokens) // ctx)]


def scored_targets(window: list[int]) -> list[int]:
    """The tokens a window's scored positions predict: window[ctx/2 + 1 :]."""
    return window[len(window) // 2 + 1:]


def parse_final_ppl(output: str) -> float:
    """``Final estimate: PPL = 12.3456 +/- 0.1`` from llama-perplexity's output."""
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", output)
    if not m:
        raise ValueError("llama-perplexity printed no final PPL estimate")
    return float(m.group(1))


def parse_kl_stats(output: str) -> dict:
    """Mean PPL(Q), mean KLD and 'same top p' from a ``--kl-divergence`` run."""
    out = {}
    for key, pattern in (("ppl", r"Mean PPL\(Q\)\s*:\s*([0-9.]+)"), ("kl", r"Mean\s+KLD:\s*(-?[0-9.]+)"),
                         ("same_top", r"Same top p:\s*([0-9.]+)")):
        m = re.search(pattern, output)
        if m is None:
            raise ValueError(f"llama-perplexity --kl-divergence printed no {key!r} figure")
        out[key] = float(m.group(1))
    out["same_top"] /= 100.0
    return out


def read_logits_tokens(path: Path) -> tuple[int, list[int]]:
    """(ctx, tokens) from the head of a ``--kl-divergence-base`` file:
    "_logits_", n_ctx, n_vocab, n_chunk (int32 each), then n_chunk * n_ctx int32 tokens."""
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise ValueError(f"{path} is not a llama-perplexity logits file")
        n_ctx, _n_vocab, n_chunk = struct.unpack("<iii", f.read(12))
        tokens = list(struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk)))
    return n_ctx, tokens


@dataclass
class Scores:
    """Sums over the scored positions of a model's windows; with ``keep``, also each
    window's log-probability rows (the reference: [positions, vocab] float32 each)."""

    count: int = 0
    nll: float = 0.0
    kl: float = 0.0
    same_top: int = 0
    rows: list = field(default_factory=list)

    def add(self, logp, targets: list[int], ref_rows=None, keep: bool = False) -> None:
        """One window's scored rows; KL(ref || model) and top-1 agreement when ``ref_rows``."""
        import torch

        t = torch.tensor(targets)
        self.count += len(targets)
        self.nll -= float(logp[torch.arange(len(t)), t].double().sum())
        if ref_rows is not None:
            lr = ref_rows.double()
            self.kl += float((lr.exp() * (lr - logp.double())).sum())
            self.same_top += int((logp.argmax(-1) == ref_rows.argmax(-1)).sum())
        if keep:
            self.rows.append(logp)

    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    def against_ref(self) -> dict:
        """Mean KL(ref || self) in nats and how often both rank the same token first."""
        return {"kl": self.kl / self.count, "same_top": self.same_top / self.count}


def inferq_scores(model: Path, dtype: str, gguf_weights: str, wins: list[list[int]], threads: int,
                  ref: Optional[Scores] = None) -> Scores:
    """Run every window through the offline engine as one prompt and score the full
    log-softmax rows of its scored positions, against ``ref``'s rows when given (else
    keeping them: this is the reference). ``gguf_weights``: dequantize or native."""
    import torch

    from inferq.bench.llama_cpp_peer import GGUF_WEIGHTS_ENV
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    torch.set_num_threads(threads)
    os.environ[GGUF_WEIGHTS_ENV] = gguf_weights
    ctx = len(wins[0])
    llm = LLM(model=str(model), dtype=dtype, enable_prefix_caching=False, max_num_seqs=1,
              max_num_batched_tokens=max(2048, ctx), num_kv_blocks=ctx // 8 + 8)
    engine_model = llm.engine.model
    recorded: list = []
    compute_logits = engine_model.compute_logits

    def recording(hidden):  # the prompt-logprob rows, as the engine computes them
        logits = compute_logits(hidden)
        recorded.append(logits)
        return logits

    engine_model.compute_logits = recording
    scores = Scores()
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    try:
        for w, win in enumerate(wins):
            recorded.clear()
            out = llm.generate([win], params)[0]
            logits = torch.cat(recorded)[: ctx - 1]  # position j predicts token j + 1
            if logits.shape[0] != ctx - 1:
                raise RuntimeError(f"recorded {logits.shape[0]} logit rows for a {ctx}-token window")
            logp = torch.log_softmax(logits.float(), dim=-1)
            # The engine's own prompt logprobs must be these rows' values.
            got = [out.prompt_logprobs[j + 1][win[j + 1]] for j in (0, ctx // 2, ctx - 2)]
            want = [float(logp[j, win[j + 1]]) for j in (0, ctx // 2, ctx - 2)]
            if max(abs(a - b) for a, b in zip(got, want)) > 1e-3:
                raise RuntimeError(f"recorded logits disagree with the engine's prompt logprobs: {got} vs {want}")
            first = ctx // 2
            scores.add(logp[first: ctx - 1].clone(), scored_targets(win), None if ref is None else ref.rows[w],
                       keep=ref is None)
    finally:
        engine_model.compute_logits = compute_logits
    del llm
    gc.collect()
    return scores


def run_llama_perplexity(bin_dir: Path, args: list[str], threads: int) -> str:
    cmd = [str(bin_dir / "llama-perplexity"), "-t", str(threads), "-tb", str(threads), *args]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return done.stdout


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="inferq bench perplexity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quants", default=",".join(DEFAULT_QUANTS), help="GGUF types to score (comma list)")
    ap.add_argument("--ctx", type=int, default=256, help="window length in tokens (stride = ctx)")
    ap.add_argument("--text", default=str(DEFAULT_TEXT), help="plain-text file to score")
    ap.add_argument("--threads", type=int, default=2, help="compute threads, both sides")
    ap.add_argument("--modes", default=None, help="inferq GGUF modes to score each file in (comma list of "
                    "inferq.bench.llama_cpp_peer.OUR_MODES; default: every one this checkout has)")
    ap.add_argument("--llama-cpp-dir", default=None, help="folder with llama.cpp's tools (default: PATH or the cached build)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="inferq only (the files must then exist already)")
    args = ap.parse_args(argv)
    args.quant_list = [q.strip().upper() for q in args.quants.split(",") if q.strip()]
    from inferq.bench.llama_cpp_peer import OUR_MODES

    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else None
    if not args.quant_list or args.mode_list == []:
        ap.error("--quants and --modes need at least one entry each")
    if args.mode_list and set(args.mode_list) - set(OUR_MODES):
        ap.error(f"--modes: choose from {', '.join(OUR_MODES)}")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    if not Path(args.text).is_file():
        ap.error(f"--text {args.text} does not exist")
    return args


def model_files(args, bin_dir: Optional[Path]) -> dict[str, Path]:
    """Each type's GGUF file (the bundled one for Q4_1) plus the F32 reference copy."""
    from inferq.bench.llama_cpp_build import cache_dir, quantized_copy
    from inferq.gpuworker.models.loader import bundled_model_path

    source = bundled_model_path()
    files = {}
    for q in [*args.quant_list, *([] if bin_dir is None else ["F32"])]:
        if q == SOURCE_TYPE:
            files[q] = source
        elif bin_dir is not None:
            files[q] = quantized_copy(bin_dir, source, q)
        else:
            found = sorted((cache_dir() / "gguf").glob(f"*.{q}.gguf"))
            if not found:
                raise SystemExit(f"no {q} copy in {cache_dir() / 'gguf'}; run without --no-llama-cpp once")
            files[q] = found[0]
    return files


def main(argv=None) -> int:
    args = parse_args(argv)
    from inferq.bench.llama_cpp_build import tools
    from inferq.gpuworker.models.loader import load_tokenizer, resolve_model_folder

    bin_dir = None if args.no_llama_cpp else tools(args.llama_cpp_dir, needed=("llama-quantize", "llama-perplexity"))
    files = model_files(args, bin_dir)
    text = Path(args.text).read_text(encoding="utf-8")
    folder = resolve_model_folder(str(files[SOURCE_TYPE]))[0]
    tokens = list(load_tokenizer(folder)(text).input_ids)  # SmolLM2's GGUF adds no BOS; neither does this
    wins = windows(tokens, args.ctx)
    print(f"text {args.text}: {len(tokens)} tokens, {len(wins)} windows of {args.ctx}, "
          f"{len(wins) * (args.ctx // 2 - 1)} scored positions; threads {args.threads}", flush=True)

    from inferq.bench.llama_cpp_peer import OUR_MODES, available_modes

    modes = available_modes()
    if args.mode_list and set(args.mode_list) - set(modes):
        raise SystemExit(f"--modes {args.modes}: this checkout and CPU have {', '.join(modes)}")
    modes = args.mode_list or modes
    ref = inferq_scores(files[SOURCE_TYPE], "float32", "dequantize", wins, args.threads)
    print(f"reference (Q4_1 dequantized, float32): inferq PPL {ref.ppl():.4f}", flush=True)
    rows = []
    llama = {}
    with tempfile.TemporaryDirectory(prefix="inferq-ppl-") as tmp:
        if bin_dir is not None:
            base = Path(tmp) / "f32.logits"
            common = ["-c", str(args.ctx), "-b", str(args.ctx)]
            out = run_llama_perplexity(bin_dir, ["-m", str(files["F32"]), "-f", args.text, *common,
                                                 "--kl-divergence-base", str(base)], args.threads)
            n_ctx, ltokens = read_logits_tokens(base)
            same = ltokens == [t for w in wins for t in w]
            print(f"llama.cpp F32 reference: PPL {parse_final_ppl(out):.4f}; its tokens "
                  f"{'match' if same else 'DIFFER from'} inferq's tokenization", flush=True)
            for q in args.quant_list:
                ppl = parse_final_ppl(run_llama_perplexity(
                    bin_dir, ["-m", str(files[q]), "-f", args.text, *common], args.threads))
                kl = parse_kl_stats(run_llama_perplexity(
                    bin_dir, ["-m", str(files[q]), *common, "--kl-divergence-base", str(base), "--kl-divergence"],
                    args.threads))
                llama[q] = {"ppl": ppl, **kl}
                print(f"llama.cpp {q}: PPL {ppl:.4f}, KL {kl['kl']:.5f}", flush=True)
        for q in args.quant_list:
            for mode in modes:
                try:
                    s = inferq_scores(files[q], *OUR_MODES[mode], wins, args.threads, ref=ref)
                except Exception as e:  # noqa: BLE001 - e.g. a type the native kernels lack: one row says so
                    rows.append((q, mode, None, {"error": f"{type(e).__name__}: {e}"}))
                    print(f"inferq {q} {mode}: failed: {e}", flush=True)
                    continue
                rows.append((q, mode, s.ppl(), s.against_ref()))
                print(f"inferq {q} {mode}: PPL {rows[-1][2]:.4f}, KL {rows[-1][3]['kl']:.5f}", flush=True)
                del s
    print()
    print(f"| file | inferq mode | inferq PPL | inferq KL vs ref | inferq same top-1 | llama.cpp PPL "
          f"| llama.cpp KL vs F32 ref | llama.cpp same top-1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print(f"| Q4_1 (reference) | fp32-dequantized | {ref.ppl():.4f} | 0 | 100 % | | | |")
    for q, mode, ppl, k in rows:
        lc = llama.get(q)
        lcs = (f"{lc['ppl']:.4f} | {lc['kl']:.5f} | {100 * lc['same_top']:.1f} %" if lc else "- | - | -")
        ours = (f"{ppl:.4f} | {k['kl']:.5f} | {100 * k['same_top']:.1f} %" if ppl is not None
                else f"failed: {k['error'][:80]} | | ")
        print(f"| {q} | {mode} | {ours} | {lcs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
