"""The follower's pure core: which events a reader accepts, when it is finished,
and what the accepted events add up to. No Redis here."""
import pytest

from inferq.schemas import encode_event
from inferq.schemas.events import DeltaEvent, DoneEvent, ErrorEvent, RestartedEvent, StartedEvent
from inferq.schemas.fold import Assembly, ReplyFilter
from inferq.schemas.follower import Cursor


def entries(*events):
    return [(f"{i + 1}-0".encode(), {k.encode(): v.encode() for k, v in encode_event(ev).items()})
            for i, ev in enumerate(events)]


def test_filter_drops_lower_attempts_and_repeats():
    f = ReplyFilter()
    assert f.accept(StartedEvent(attempt=1, seq=0))
    assert f.accept(DeltaEvent(attempt=1, seq=1, text="a"))
    assert not f.accept(DeltaEvent(attempt=1, seq=1, text="a"))  # repeated publish
    assert f.accept(RestartedEvent(attempt=2, seq=0))  # raises the accepted attempt
    assert not f.accept(DoneEvent(attempt=1, seq=2, finish_reason="stop"))  # stale final
    assert f.accept(DoneEvent(attempt=2, seq=1, finish_reason="length"))


def test_cursor_is_finished_only_by_a_final_event_of_the_accepted_attempt():
    cur = Cursor()
    got = list(cur.take(entries(
        StartedEvent(attempt=1, seq=0), RestartedEvent(attempt=2, seq=0),
        DoneEvent(attempt=1, seq=1, finish_reason="stop"),
    )))
    assert [a for _, _, a in got] == [True, True, False]
    assert not cur.finished and cur.last_id == "3-0"
    got = list(cur.take(entries(DoneEvent(attempt=2, seq=1, finish_reason="length"), StartedEvent(attempt=3))))
    assert len(got) == 1 and got[0][2] and cur.finished  # nothing after the accepted final


def test_cursor_error_of_accepted_attempt_finishes():
    cur = Cursor()
    list(cur.take(entries(ErrorEvent(attempt=1, seq=0, code="x", message="y"))))
    assert cur.finished


def test_assembly_starts_over_on_a_new_attempt_and_ignores_stale_output():
    asm = Assembly()
    asm.feed(DeltaEvent(attempt=1, seq=0, text="old", token_ids=[1], logprobs=[{1: -0.5}]))
    asm.feed(RestartedEvent(attempt=2, seq=0))
    asm.feed(DeltaEvent(attempt=2, seq=1, text="new", token_ids=[2]))
    asm.feed(DeltaEvent(attempt=1, seq=1, text="late", token_ids=[3]))
    asm.feed(DoneEvent(attempt=1, seq=2, finish_reason="stop"))
    assert (asm.text, asm.token_ids, asm.finished, asm.restarts) == ("new", [2], False, 1)
    assert not asm.has_logprobs
    asm.feed(DoneEvent(attempt=2, seq=2, finish_reason="length"))
    assert asm.finished and asm.finish_reason == "length" and asm.done.attempt == 2


def test_assembly_returns_only_unshown_output():
    asm = Assembly()
    p = asm.feed(DeltaEvent(attempt=1, seq=0, text="ab", token_ids=[1, 2]))
    assert (p.text, p.token_ids) == ("ab", [1, 2])
    asm.feed(RestartedEvent(attempt=2, seq=0))
    assert asm.feed(DeltaEvent(attempt=2, seq=1, text="a", token_ids=[1])) is None  # already shown
    p = asm.feed(DeltaEvent(attempt=2, seq=2, text="bc", token_ids=[2, 3]))
    assert (p.text, p.token_ids) == ("c", [3])


def test_text_follower_shows_each_character_once_and_raises_on_divergence():
    from inferq.producer.client import TextFollower
    from inferq.producer.errors import JobFailed, JobRestarted

    f = TextFollower("j")
    assert f.feed(DeltaEvent(attempt=1, seq=0, text="ab")) == "ab"
    assert f.feed(RestartedEvent(attempt=2, seq=0)) is None
    assert f.feed(DeltaEvent(attempt=2, seq=1, text="a")) is None  # reproduced, already shown
    assert f.feed(DeltaEvent(attempt=2, seq=2, text="bc")) == "c"
    with pytest.raises(JobRestarted):
        f.feed(DeltaEvent(attempt=3, seq=0, text="x"))  # diverges from what was shown

    strict = TextFollower("j", on_restart="raise")
    strict.feed(DeltaEvent(attempt=1, seq=0, text="a"))
    with pytest.raises(JobRestarted):
        strict.feed(RestartedEvent(attempt=2, seq=0))
    with pytest.raises(JobFailed):
        TextFollower("j").feed(ErrorEvent(attempt=1, seq=0, code="c", message="m"))


def test_a_skipped_seq_is_an_error_not_silently_missing_text():
    import pytest

    from inferq.schemas.fold import ReplyGap

    f = ReplyFilter()
    assert f.accept(StartedEvent(attempt=1, seq=0))
    with pytest.raises(ReplyGap, match="expected seq 1, got 3"):
        f.accept(DeltaEvent(attempt=1, seq=3, text="c"))  # seq 1 and 2 were trimmed away
    # Reading from the start, the first event of an attempt must be its seq 0.
    with pytest.raises(ReplyGap):
        ReplyFilter().accept(DeltaEvent(attempt=1, seq=5, text="late"))
    # Resuming mid-stream (Last-Event-ID) joins wherever the attempt is...
    resumed = ReplyFilter(from_start=False)
    assert resumed.accept(DeltaEvent(attempt=1, seq=5, text="x"))
    assert resumed.accept(DeltaEvent(attempt=1, seq=6, text="y"))
    # ... but a later attempt is read whole.
    with pytest.raises(ReplyGap):
        resumed.accept(DeltaEvent(attempt=2, seq=1, text="z"))
