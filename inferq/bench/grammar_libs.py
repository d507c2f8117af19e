"""llguidance vs xgrammar on our tokenizer (the bundled SmolLM2, 49,152 tokens):
the numbers behind choosing llguidance (docs/structured-outputs.md).

  pip install xgrammar   # only for this comparison; inferq does not depend on it
  inferq bench grammar-libs [--steps 40]

For each library: tokenizer setup once, then per schema of the tests' eleven
(inferq.bench.structured_cases) the compile time and the median time to
fill one token mask along a greedy-like walk (the first allowed token each step),
and the time to fill 32 masks of a batch at once. Medians over the schemas.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

EOS = 2  # SmolLM2's <|im_end|>


def first_allowed(words: np.ndarray):
    """The first allowed token other than EOS (None: only EOS is left)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    ids = [int(t) for t in np.flatnonzero(bits)[:2] if t != EOS]
    return ids[0] if ids else None


def bench_llguidance(tok, vocab, schemas, steps):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp

    from inferq.schemas.structured import JSON_STYLE

    t = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    setup = time.perf_counter() - t
    compile_s, fill_s = [], []
    mask = lnp.allocate_token_bitmask(32, vocab)
    for s in schemas:
        t = time.perf_counter()
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(s, defaults=JSON_STYLE), log_level=0)
        compile_s.append(time.perf_counter() - t)
        for _ in range(steps):
            t = time.perf_counter()
            lnp.fill_next_token_bitmask(m, mask, 0)
            fill_s.append(time.perf_counter() - t)
            tok_id = first_allowed(mask[0])
            if m.is_stopped() or tok_id is None:
                break
            m.consume_token(tok_id)
    ex = llguidance.LLExecutor(num_threads=1)
    ms = [llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(schemas[i % len(schemas)], defaults=JSON_STYLE))
          for i in range(32)]
    t = time.perf_counter()
    for _ in range(10):
        lnp.fill_next_token_bitmask_par(ex, [(m, i) for i, m in enumerate(ms)], mask)
    batch = (time.perf_counter() - t) / 10
    return setup, compile_s, fill_s, batch


def bench_xgrammar(tok, vocab, schemas, steps):
    import torch
    import xgrammar as xgr

    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - t
    compile_s, fill_s = [], []
    mask = xgr.allocate_token_bitmask(32, vocab)
    compiled = []
    for s in schemas:
        t = time.perf_counter()
        cg = compiler.compile_json_schema(s, any_whitespace=False)
        compile_s.append(time.perf_counter() - t)
        compiled.append(cg)
        m = xgr.GrammarMatcher(cg)
        for _ in range(steps):
            t = time.perf_counter()
            m.fill_next_token_bitmask(mask, 0)
            fill_s.append(time.perf_counter() - t)
            if m.is_terminated():
                break
            tok_id = first_allowed(mask[0].numpy())
            if tok_id is None or not m.accept_token(tok_id):
                break
    ms = [xgr.GrammarMatcher(compiled[i % len(compiled)]) for i in range(32)]
    t = time.perf_counter()
    for _ in range(10):
        for i, m in enumerate(ms):
            m.fill_next_token_bitmask(mask, i)
    batch = (time.perf_counter() - t) / 10
    del torch
    return setup, compile_s, fill_s, batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench grammar-libs", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="tokens walked per schema (mask fills timed)")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from inferq.bench.structured_cases import SCHEMAS
    from inferq.gpuworker.models.loader import bundled_model_path

    path = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    vocab = 49152
    schemas = list(SCHEMAS.values())
    print("| library | tokenizer setup | compile, median (max) | one mask fill, median | 32 masks (batch) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        try:
            setup, comp, fill, batch = fn(tok, vocab, schemas, args.steps)
        except ImportError as e:
            print(f"| {name} | not installed ({e}) | | | |")
            continue
        print(f"| {name} | {setup * 1e3:.0f} ms | {statistics.median(comp) * 1e3:.2f} ms ({max(comp) * 1e3:.1f} ms) | "
              f"{statistics.median(fill) * 1e6:.1f} us | {batch * 1e3:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
