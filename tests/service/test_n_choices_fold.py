"""Folding a several-choice reply stream (schemas/fold.py): per-choice text and
ends, and a restart that re-sends a choice's text does not show it twice."""
from __future__ import annotations

from inferq.schemas.events import ChoiceEnd, DeltaEvent, DoneEvent, RestartedEvent, StartedEvent, Usage
from inferq.schemas.fold import Assembly


def _delta(attempt, seq, index, text, finish=None):
    return DeltaEvent(attempt=attempt, seq=seq, index=index, text=text, token_ids=[len(text)], finish_reason=finish)


def test_choices_fold_by_index_with_their_ends():
    asm = Assembly()
    events = [StartedEvent(attempt=1, seq=0), _delta(1, 1, 0, "a"), _delta(1, 2, 1, "b"), _delta(1, 3, 1, "bb", "stop"),
              _delta(1, 4, 0, "aa", "length"),
              DoneEvent(attempt=1, seq=5, finish_reason="length", usage=Usage(prompt_tokens=3, completion_tokens=4),
                        choices=[ChoiceEnd(index=0, finish_reason="length"), ChoiceEnd(index=1, finish_reason="stop")])]
    pieces = [asm.feed(e) for e in events]
    assert [(p.index, p.text) for p in pieces if p] == [(0, "a"), (1, "b"), (1, "bb"), (0, "aa")]
    assert [(c.index, c.text, c.finish_reason) for c in asm.choices()] == [(0, "aaa", "length"), (1, "bbb", "stop")]
    assert asm.text == "aaa" and asm.finish_reason == "length"


def test_a_restart_does_not_show_a_choice_twice():
    asm = Assembly()
    for e in [StartedEvent(attempt=1, seq=0), _delta(1, 1, 1, "hello")]:
        asm.feed(e)
    shown = []
    for e in [RestartedEvent(attempt=2, seq=0), StartedEvent(attempt=2, seq=1), _delta(2, 2, 1, "hello"),
              _delta(2, 3, 1, " world", "stop")]:
        p = asm.feed(e)
        if p:
            shown.append(p.text)
    assert shown == [" world"]
    assert asm.choices()[1].text == "hello world"
