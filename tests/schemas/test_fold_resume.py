"""Request migration in the fold: a ``restarted`` event with resume points keeps
what the attempt before it published, and a reader that cannot take text back
refuses a new attempt that contradicts what it showed (never a splice)."""
import pytest

from inferq.schemas.events import DeltaEvent, DoneEvent, RestartedEvent, ResumePoint, StartedEvent
from inferq.schemas.fold import Assembly, ReplyDiverged


def first_attempt(asm: Assembly, pieces=("Once", " upon", " a")) -> str:
    asm.feed(StartedEvent(attempt=1, seq=0))
    shown = ""
    for seq, (tok, text) in enumerate(zip((11, 12, 13), pieces), start=1):
        p = asm.feed(DeltaEvent(attempt=1, seq=seq, text=text, token_ids=[tok], logprobs=[{tok: -0.5}]))
        shown += p.text if p else ""
    return shown


def test_a_continued_attempt_keeps_the_published_text_and_extends_it():
    asm = Assembly(check_shown=True)
    shown = first_attempt(asm)
    assert shown == "Once upon a"
    # The new worker read two of the three deltas (the third came after it looked).
    asm.feed(RestartedEvent(attempt=2, seq=0, reason="redelivered", resume=[ResumePoint(tokens=2, chars=9)]))
    assert asm.text == "Once upon" and asm.token_ids == [11, 12] and asm.logprobs == [{11: -0.5}, {12: -0.5}]
    asm.feed(StartedEvent(attempt=2, seq=1))
    # It regenerates token 3 the same (seeded draws): nothing new to show, and no divergence.
    assert asm.feed(DeltaEvent(attempt=2, seq=2, text=" a", token_ids=[13])) is None
    p = asm.feed(DeltaEvent(attempt=2, seq=3, text=" time", token_ids=[14]))
    assert p.text == " time" and asm.text == "Once upon a time" and asm.token_ids == [11, 12, 13, 14]
    asm.feed(DoneEvent(attempt=2, seq=4, finish_reason="stop"))
    assert asm.finished and asm.restarts == 1


def test_a_reader_that_showed_text_refuses_a_diverging_attempt():
    asm = Assembly(check_shown=True)
    first_attempt(asm)
    asm.feed(RestartedEvent(attempt=2, seq=0, reason="redelivered"))  # starts over
    asm.feed(StartedEvent(attempt=2, seq=1))
    assert asm.feed(DeltaEvent(attempt=2, seq=2, text="Once", token_ids=[11])) is None  # agrees so far
    with pytest.raises(ReplyDiverged) as e:
        asm.feed(DeltaEvent(attempt=2, seq=3, text=" there", token_ids=[21]))
    assert e.value.attempt == 2 and e.value.index == 0 and e.value.at == 5  # "Once u" vs "Once t"


def test_a_regenerated_attempt_that_agrees_goes_on_past_what_was_shown():
    asm = Assembly(check_shown=True)
    first_attempt(asm)
    asm.feed(RestartedEvent(attempt=2, seq=0, reason="redelivered"))
    assert asm.feed(DeltaEvent(attempt=2, seq=1, text="Once upon a", token_ids=[11, 12, 13])) is None
    assert asm.feed(DeltaEvent(attempt=2, seq=2, text=" time", token_ids=[14])).text == " time"


def test_readers_of_the_final_text_do_not_check():
    """A reader that shows only the final answer takes the new attempt whatever it is."""
    asm = Assembly()
    first_attempt(asm)
    asm.feed(RestartedEvent(attempt=2, seq=0, reason="redelivered"))
    asm.feed(DeltaEvent(attempt=2, seq=1, text="Twice", token_ids=[31]))
    asm.feed(DoneEvent(attempt=2, seq=2, finish_reason="stop"))
    assert asm.text == "Twice"


def test_resume_points_per_choice():
    asm = Assembly(check_shown=True)
    asm.feed(StartedEvent(attempt=1, seq=0))
    asm.feed(DeltaEvent(attempt=1, seq=1, text="A", token_ids=[1]))
    asm.feed(DeltaEvent(attempt=1, seq=2, index=1, text="B1", token_ids=[2, 3], finish_reason="length"))
    asm.feed(DeltaEvent(attempt=1, seq=3, index=2, text="C", token_ids=[4]))
    asm.feed(RestartedEvent(attempt=2, seq=0, resume=[
        ResumePoint(index=0, tokens=1, chars=1), ResumePoint(index=1, tokens=2, chars=2, finish_reason="length")]))
    ch = asm.choices()
    assert [c.text for c in ch] == ["A", "B1", ""] and ch[1].finish_reason == "length"
    # Choice 2 starts over and must agree with the "C" it showed.
    with pytest.raises(ReplyDiverged):
        asm.feed(DeltaEvent(attempt=2, seq=1, index=2, text="D", token_ids=[5]))
