"""Incremental detokenizer with the real SmolLM2 tokenizer: exact text, split
multi-byte characters, stop strings and the minimal hold-back."""
from __future__ import annotations

import random

import pytest

from inferq.gpuworker.engine.detokenizer import IncrementalDetokenizer
from inferq.schemas import SamplingParams
from tests.engine.stop_reference import first_stop, longest_stop_prefix_tail

TEXTS = [
    "The quick brown fox jumps over the lazy dog. END of story.",
    "Hello 你好世界! 🎉🎉 Emoji and CJK: 日本語のテキスト、한국어 텍스트. 👩‍👩‍👧 family.",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))\n",
    "Ünïcödé àccents — “quotes” and … ellipsis; ½ ∑ ∞ ≠ ≤ ≥ 🚀🌍",
]


@pytest.fixture(scope="session")
def tok():
    from inferq.gpuworker.models.gguf_loader import converted_folder
    from inferq.gpuworker.models.loader import bundled_model_path, load_tokenizer

    return load_tokenizer(converted_folder(bundled_model_path()))


def run(tok, ids, chunks=None, rng=None, **params):
    """Feed ids in chunks; return (pieces, stop, detokenizer)."""
    d = IncrementalDetokenizer(tok, [1, 2, 3], SamplingParams(**params))
    pieces, stop, i = [], None, 0
    while i < len(ids):
        n = rng.choice([1, 1, 1, 2, 3, 7]) if rng else (chunks or 1)
        piece, stop = d.update(ids[i : i + n])
        pieces.append(piece)
        i += n
        if stop is not None:
            break
    if stop is None:
        pieces.append(d.flush())
    return pieces, stop, d


# ------------------------------------------------------------------ exact text
def test_random_token_sequences_reassemble_to_full_decode(tok):
    rng = random.Random(0)
    specials = list(tok.all_special_ids)
    for _ in range(150):
        n = rng.randint(0, 60)
        ids = [rng.choice(specials) if rng.random() < 0.05 else rng.randrange(len(tok)) for _ in range(n)]
        for skip in (True, False):
            pieces, stop, d = run(tok, ids, rng=rng, skip_special_tokens=skip)
            full = tok.decode(ids, skip_special_tokens=skip)
            assert stop is None
            assert "".join(pieces) == d.output_text == full


def test_multibyte_text_never_shows_a_split_character(tok):
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        pieces, _, d = run(tok, ids)
        assert "".join(pieces) == d.output_text == text
        assert not any("\ufffd" in p for p in pieces)
    # The emoji text really does cut characters between tokens.
    ids = tok.encode(TEXTS[1])
    assert any("\ufffd" in tok.decode([t]) for t in ids)


def test_long_output_reassembles(tok):
    ids = tok.encode(" ".join(TEXTS * 20))
    pieces, _, d = run(tok, ids)
    assert "".join(pieces) == d.output_text == tok.decode(ids)


def test_special_tokens_follow_skip_special_tokens(tok):
    ids = tok.encode("Hi there") + [tok.eos_token_id] + tok.encode(" after")
    shown, _, _ = run(tok, ids, skip_special_tokens=False)
    hidden, _, _ = run(tok, ids, skip_special_tokens=True)
    assert "".join(shown) == "Hi there" + tok.eos_token + " after"
    assert "".join(hidden) == "Hi there after"


def test_flush_shows_an_unfinished_character_like_a_full_decode(tok):
    ids = tok.encode("ok 🎉")
    cut = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
    d = IncrementalDetokenizer(tok, [], SamplingParams())
    shown, _ = d.update(ids[:cut])
    assert "\ufffd" not in shown
    assert shown + d.flush() == tok.decode(ids[:cut])


def test_each_token_decodes_a_short_window(tok):
    """O(new tokens): every decode call sees a bounded window, not the whole output."""

    class Recording:
        def __init__(self, inner):
            self.inner, self.sizes = inner, []

        def decode(self, ids, skip_special_tokens):
            self.sizes.append(len(ids))
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    rec = Recording(tok.backend_tokenizer)

    class Tok:  # the real tokenizer, with its Rust decoder observed
        backend_tokenizer = rec
        clean_up_tokenization_spaces = False

    ids = tok.encode(" ".join(TEXTS * 30))
    assert len(ids) > 1500
    pieces, _, _ = run(Tok(), ids)
    assert "".join(pieces) == tok.decode(ids)
    assert max(rec.sizes) <= 16
    assert len(rec.sizes) <= 1.5 * len(ids)


# ---------------------------------------------------------------- stop strings
def test_stop_string_spanning_tokens_is_cut_and_never_shown(tok):
    text = TEXTS[0]
    ids = tok.encode(text)
    stop = "END of st"
    assert not any(stop in tok.decode([t]) for t in ids)  # it spans several tokens
    for chunks in (1, 2, 5, len(ids)):
        pieces, hit, d = run(tok, ids, chunks=chunks, stop=[stop])
        assert hit == stop
        assert "".join(pieces) == d.output_text == text[: text.index(stop)]
        assert not any("END" in p for p in pieces)


def test_stop_string_at_the_very_start(tok):
    ids = tok.encode("Stop right there, more text")
    pieces, hit, d = run(tok, ids, stop=["Stop"])
    assert hit == "Stop"
    assert pieces[-1] == "" and "".join(pieces) == "" and d.output_text == ""


def test_several_stops_first_completed_wins(tok):
    text = "alpha beta gamma delta"
    ids = tok.encode(text)
    pieces, hit, d = run(tok, ids, stop=["gamma", "beta"])
    assert (hit, d.output_text, "".join(pieces)) == ("beta", "alpha ", "alpha ")
    # "ta g" completes before "beta gamma" although it starts later.
    for chunks in (1, len(ids)):
        _, hit, d = run(tok, ids, chunks=chunks, stop=["beta gamma", "ta g"])
        assert (hit, d.output_text) == ("ta g", "alpha be")


def test_multibyte_stop_string(tok):
    text = "Party 🎉 time"
    pieces, hit, d = run(tok, tok.encode(text), stop=["🎉"])
    assert hit == "🎉" and "".join(pieces) == d.output_text == "Party "


def test_random_stops_match_reference_and_chunking(tok):
    rng = random.Random(1)
    for _ in range(60):
        text = rng.choice(TEXTS)
        ids = tok.encode(text)
        stops = []
        for _ in range(rng.randint(1, 3)):
            a = rng.randrange(len(text))
            stops.append(text[a : a + rng.randint(1, 8)])
        if rng.random() < 0.3:
            stops.append("zz-not-there")
        want_text, want_stop = first_stop(text, stops)
        pieces, hit, d = run(tok, ids, rng=rng, stop=stops)
        assert hit == want_stop
        assert "".join(pieces) == d.output_text == want_text


def test_hold_back_is_exactly_the_tail_that_could_still_stop(tok):
    text = "We wait at the EN, then ENDING, then E, finally END! and more"
    stops = ["END!", "xyz"]
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=stops))
    shown, held_at_some_point = "", False
    for k in range(len(ids)):
        piece, hit = d.update([ids[k]])
        shown += piece
        if hit:
            break
        so_far = tok.decode(ids[: k + 1])
        hold = longest_stop_prefix_tail(so_far, stops)
        assert shown == so_far[: len(so_far) - hold]
        assert hold <= max(map(len, stops)) - 1
        held_at_some_point |= hold > 0
    assert held_at_some_point
    assert hit == "END!" and shown == text[: text.index("END!")]


def test_no_stop_prefix_means_nothing_held(tok):
    text = TEXTS[0]
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["@@@"]))
    shown = ""
    for k, t in enumerate(ids):
        shown += d.update([t])[0]
        assert shown == tok.decode(ids[: k + 1])


def test_flush_releases_held_text_when_finished_without_stop(tok):
    text = "the final word is EN"
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["END"]))
    shown = "".join(d.update([t])[0] for t in ids)
    assert shown == "the final word is "  # "EN" could still become "END"
    assert d.flush() == "EN"
    assert d.output_text == text


def test_updates_after_finish_are_refused(tok):
    ids = tok.encode("one two three")
    _, hit, d = run(tok, ids, stop=["two"])
    assert hit == "two"
    with pytest.raises(RuntimeError, match="stopped"):
        d.update([ids[0]])
    d2 = IncrementalDetokenizer(tok, [], SamplingParams())
    d2.update(ids)
    d2.flush()
    with pytest.raises(RuntimeError, match="flushed"):
        d2.update([ids[0]])


# ------------------------------------------- a SentencePiece-style tokenizer
@pytest.fixture(scope="session")
def sp_tok():
    """Llama-2/Mistral-style decoding (Metaspace "▁", byte fallback, strip the
    first leading space), trained here on a few sentences: no model hub."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tk.train_from_iterator([t.replace("\n", " ") for t in TEXTS] * 20, trainer)
    tk.add_tokens([f"<0x{b:02X}>" for b in range(256)])  # byte tokens, as in Llama's vocabulary
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_leading_spaces_survive_window_restarts_and_special_runs(sp_tok):
    """A decoder that strips the text's first space must only do so at the very start."""
    rng = random.Random(2)
    words = [i for i in range(sp_tok.backend_tokenizer.get_vocab_size(with_added_tokens=False)) if i > 2]
    spaced = [i for i in words if sp_tok.convert_ids_to_tokens(i).startswith("▁")]
    emoji = [sp_tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "😀".encode()]
    assert len(spaced) > 10
    for _ in range(200):
        ids: list[int] = []
        for _ in range(rng.randint(1, 50)):
            r = rng.random()
            if r < 0.1:
                ids += [sp_tok.eos_token_id] * rng.randint(1, 8)  # e.g. ignore_eos
            elif r < 0.2:
                ids += emoji
            else:
                ids.append(rng.choice(spaced if r < 0.6 else words))
        for skip in (True, False):
            pieces, _, d = run(sp_tok, ids, rng=rng, skip_special_tokens=skip)
            assert "".join(pieces) == d.output_text == sp_tok.decode(ids, skip_special_tokens=skip)
            assert not any("\ufffd" in p for p in pieces)
