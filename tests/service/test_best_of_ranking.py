"""best_of > n in the worker's choice group (gpuworker/service/choices.py, best_of.py):
nothing is published until every sequence has ended, then the n sequences with the
highest cumulative logprob come out as choices 0..n-1, and usage counts every sequence."""
from __future__ import annotations

from inferq.gpuworker.engine.outputs import RequestDelta
from inferq.gpuworker.service.choices import ChoiceGroup, choice_params
from inferq.schemas import SamplingParams


def _tok(rid, token, lp, text, finished=False):
    return RequestDelta(rid, [token], text, finished=finished, finish_reason="length" if finished else None,
                        logprobs=[{token: lp}], num_prompt_tokens=5, num_output_tokens=2)


def _run(group, per_sequence):
    """Feed each sequence's two tokens (step by step, interleaved); return what came out."""
    out = []
    for step in range(2):
        for i, toks in enumerate(per_sequence):
            rid = group.job_id if i == 0 else f"{group.job_id}#{i}"
            token, lp, text = toks[step]
            out.append(group.translate(_tok(rid, token, lp, text, finished=step == 1)))
    return out


SEQS = [[(1, -2.0, "a"), (2, -2.0, "b")],   # -4.0
        [(3, -0.5, "c"), (4, -1.0, "d")],   # -1.5: best
        [(5, -1.0, "e"), (6, -1.5, "f")]]   # -2.5: second


def test_best_of_3_n1_publishes_only_the_best_sequence_at_the_end():
    g = ChoiceGroup.of("job", SamplingParams(best_of=3, n=1, temperature=1.0))
    out = _run(g, SEQS)
    assert all(o == [] for o in out[:-1])  # held back while any sequence runs
    (final,) = out[-1]
    assert final.finished and final.request_id == "job" and final.index == 0
    assert (final.new_text, final.new_token_ids) == ("cd", [3, 4])
    assert final.logprobs is None  # the client did not ask for them
    assert final.num_output_tokens == 6  # every sequence's tokens are billed
    assert final.choices is None  # a single-choice job's done, as with n=1


def test_best_of_3_n2_ranks_and_reindexes_with_logprobs_when_asked():
    g = ChoiceGroup.of("job", SamplingParams(best_of=3, n=2, temperature=1.0, logprobs=0))
    first, second = _run(g, SEQS)[-1]
    assert (first.index, first.new_text, first.choice_end, first.finished) == (0, "cd", "length", False)
    assert (second.index, second.new_text, second.finished) == (1, "ef", True)
    assert first.logprobs == [{3: -0.5}, {4: -1.0}]
    assert [(c.index, c.finish_reason, c.completion_tokens) for c in second.choices] == [(0, "length", 2),
                                                                                           (1, "length", 2)]
    assert second.num_output_tokens == 6


def test_best_of_equal_to_n_streams_like_n():
    g = ChoiceGroup.of("job", SamplingParams(best_of=2, n=2, temperature=1.0))
    out = _run(g, SEQS[:2])
    assert [len(o) for o in out] == [1, 1, 1, 1] and g.ranking is None


def test_ties_go_to_the_lower_sequence_and_greedy_sequences_ask_no_logprobs():
    greedy = SamplingParams(best_of=2, temperature=0)
    assert choice_params(greedy, 1).logprobs is None
    g = ChoiceGroup.of("job", greedy)
    same = [[(1, 0.0, "x"), (2, 0.0, "y")]] * 2
    (final,) = _run(g, [[(t, 0.0, s) for t, _, s in seq] for seq in same])[-1]
    assert final.new_text == "xy" and final.num_output_tokens == 4


def test_ranked_sequences_ask_for_the_sampled_token_logprob_only():
    p = SamplingParams(best_of=3, temperature=0.8, seed=5)
    sibling = choice_params(p, 2)
    assert (sibling.n, sibling.best_of, sibling.logprobs, sibling.seed) == (1, None, 0, 7)
    assert choice_params(SamplingParams(best_of=3, logprobs=4), 1).logprobs == 4
    # Without logprobs of its own the ranking uses raw ones, whatever mode the job names.
    processed = SamplingParams(best_of=3, logprobs_mode="processed_logprobs")
    assert choice_params(processed, 1).logprobs_mode == "raw_logprobs"
    assert choice_params(SamplingParams(n=3), 1).logprobs is None  # plain n: nothing extra


def test_an_abort_before_the_siblings_joined_still_ends_the_job():
    g = ChoiceGroup.of("job", SamplingParams(best_of=3, n=1, temperature=1.0))
    assert g.translate(RequestDelta("job", [], "", finished=True, finish_reason="abort")) == []
    (final,) = g.end_waiting("abort")
    assert final.finished and final.finish_reason == "abort" and final.new_text == ""
