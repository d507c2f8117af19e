"""The engine on the real SmolLM2-135M-Instruct against HF transformers."""
from __future__ import annotations

import time

import pytest

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams
from tests.engine.hf_oracle import compare_greedy, hf_greedy

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_greedy_equals_hf_with_chunked_prefill_and_preemption(mixed_prompts, hf_smol):
    # A 48-token budget chunks every long prompt; 24 blocks of 16 cannot hold
    # all 16 sequences (up to ~160 tokens each), so requests get preempted.
    llm = LLM(dtype="float32", block_size=16, max_num_batched_tokens=48, num_kv_blocks=24, max_num_seqs=16)
    assert max(len(p) for p in mixed_prompts) > 48
    outs = llm.generate(mixed_prompts, GREEDY)
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0, "the small pool should have forced preemption"
    llm.engine.check_invariants()
    assert stats.num_free_blocks == stats.num_blocks

    verdicts = []
    for prompt, out in zip(mixed_prompts, outs):
        assert out.finish_reason == "length" and len(out.token_ids) == GREEDY.max_tokens
        verdicts.append(compare_greedy(hf_smol, prompt, out.token_ids, hf_greedy(hf_smol, prompt, GREEDY.max_tokens)))
    assert verdicts.count("equal") >= len(verdicts) - 1, verdicts


def test_step_deltas_concatenate_to_the_final_text(smol_llm):
    eng = smol_llm.engine
    ids = smol_llm.encode("Once upon a time")
    eng.add_request("d1", ids, SamplingParams(max_tokens=10, temperature=0))
    pieces, tokens, last = [], [], None
    while eng.has_unfinished():
        for d in eng.step():
            pieces.append(d.new_text)
            tokens += d.new_token_ids
            last = d
    assert last.finished and last.finish_reason in ("length", "stop")
    assert "".join(pieces) == smol_llm.tokenizer.decode(tokens, skip_special_tokens=True)
    eng.check_invariants()


def test_prefix_cache_hits_give_the_same_output(smol_llm, mixed_prompts):
    eng = smol_llm.engine
    long_prompts = [p for p in mixed_prompts if len(p) > 40][:4]
    first = smol_llm.generate(long_prompts, GREEDY)
    before = eng.stats().prefix_cache_hits
    second = smol_llm.generate(long_prompts, GREEDY)
    assert eng.stats().prefix_cache_hits > before
    assert all(o.num_cached_tokens > 0 for o in second)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    eng.check_invariants()


def test_stop_string_is_cut_and_never_shown(smol_llm):
    prompt = "Count: 1, 2, 3, 4,"
    full = smol_llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0))[0].text
    assert "7" in full, full
    out = smol_llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0, stop=["7"]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index("7")]
    assert "7" not in out.text


def test_stop_token_ids_and_max_tokens(smol_llm):
    prompt = "Count: 1, 2, 3, 4,"
    full = smol_llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    stop_tok = full.token_ids[3]
    out = smol_llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_tok]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_tok) + 1]


def test_eos_stops_unless_ignored(smol_llm):
    chat = smol_llm.apply_chat_template([{"role": "user", "content": "Say hi."}])
    out = smol_llm.generate([chat], SamplingParams(max_tokens=64, temperature=0))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in smol_llm.engine.eos_token_ids
    forced = smol_llm.generate([chat], SamplingParams(max_tokens=len(out.token_ids) + 3, temperature=0, ignore_eos=True))[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == len(out.token_ids) + 3


def test_same_seed_same_tokens_whatever_the_batch(smol_llm):
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    alone = smol_llm.generate("The weather today", p)[0].token_ids
    others = [SamplingParams(max_tokens=12, temperature=1.0), SamplingParams(max_tokens=5, temperature=0)]
    batched = smol_llm.generate(["Hello", "The weather today", "Numbers:"], [others[0], p, others[1]])[1].token_ids
    assert alone == batched
    other_seed = smol_llm.generate("The weather today", p.model_copy(update={"seed": 99}))[0].token_ids
    assert other_seed != alone


def test_frequency_penalty_reduces_repetition(smol_llm):
    prompt = "Repeat after me: go go go go go go go go"
    base = smol_llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0))[0].token_ids
    pen = smol_llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0, frequency_penalty=2.0))[0].token_ids
    assert max(pen.count(t) for t in set(pen)) < max(base.count(t) for t in set(base))


def test_logprobs_are_returned_per_token(smol_llm):
    out = smol_llm.generate("Hello", SamplingParams(max_tokens=5, temperature=0, logprobs=3))[0]
    assert len(out.logprobs) == 5
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert tok in lp and len(lp) >= 3
        assert lp[tok] == pytest.approx(max(lp.values()))  # greedy picks the most likely
        assert all(v <= 0.0 for v in lp.values())


def test_abort_frees_blocks_at_once(smol_llm):
    eng = smol_llm.engine
    for i in range(3):
        eng.add_request(f"ab{i}", smol_llm.encode(f"Story number {i}:"), SamplingParams(max_tokens=30, temperature=0))
    eng.step()
    eng.step()
    free_before = eng.stats().num_free_blocks
    d = eng.abort("ab1")
    assert d.finished and d.finish_reason == "abort"
    assert eng.stats().num_free_blocks > free_before or eng.kv.block_ids("ab1") == []
    assert eng.kv.block_ids("ab1") == []
    eng.check_invariants()
    finished = set()
    while eng.has_unfinished():
        finished |= {d.request_id for d in eng.step() if d.finished}
    assert finished == {"ab0", "ab2"}
    assert eng.abort("ab1") is None  # unknown now
    eng.check_invariants()


def test_deadline_finishes_before_prefill_and_while_running(smol_llm):
    eng = smol_llm.engine
    eng.add_request("late", smol_llm.encode("Too late"), SamplingParams(max_tokens=5), deadline=time.time() - 1)
    deltas = eng.step()
    assert [(d.request_id, d.finish_reason, d.new_token_ids) for d in deltas] == [("late", "deadline", [])]
    deadline = time.time() + 2.0
    eng.add_request("soon", smol_llm.encode("Soon"), SamplingParams(max_tokens=500, temperature=0, ignore_eos=True),
                    deadline=deadline)
    first = eng.step()  # prefill + first token: running now
    assert [d.finish_reason for d in first] == [None] and first[0].new_token_ids
    # Not a "long enough" sleep: the clock passes the deadline whatever the engine's
    # speed, so the next step must end the running request (a fast machine would
    # otherwise finish all 500 tokens first).
    time.sleep(max(0.0, deadline - time.time()) + 0.01)
    reasons = []
    while eng.has_unfinished():
        reasons += [d.finish_reason for d in eng.step() if d.finished]
    assert reasons == ["deadline"]
    eng.check_invariants()


def test_bad_prompts_get_clear_errors(smol_llm):
    eng = smol_llm.engine
    with pytest.raises(ValueError, match="empty"):
        eng.add_request("e", [], SamplingParams())
    with pytest.raises(ValueError, match="at most"):
        eng.add_request("long", [1] * eng.max_model_len, SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request("vocab", [10**9], SamplingParams())
    eng.add_request("dup", [1, 2], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="already"):
        eng.add_request("dup", [1, 2], SamplingParams(max_tokens=1))
    eng.abort("dup")
    eng.check_invariants()


def test_n_samples_are_expanded(smol_llm):
    out = smol_llm.generate("Pick a colour:", SamplingParams(max_tokens=6, temperature=1.0, n=3, seed=5))[0]
    assert len(out.samples) == 3
    assert len({tuple(s.token_ids) for s in out.samples}) >= 2
