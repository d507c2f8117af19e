"""Detokenizer fuzz, one test per tokenizer family, every tokenizer built here
offline (no model hub): byte-fallback SentencePiece (Llama 2 / Mistral style),
byte-level BPE (GPT-2 / Llama 3 / Qwen style), WordPiece, plus the real SmolLM2.

Each case is a random id sequence mixing word pieces, multi-byte characters of
2, 3 and 4 bytes (split over tokens), invalid bytes, special tokens and stop
strings that straddle deltas, fed in random chunks. Checked:

* the streamed text equals ``tokenizer.decode`` of the same ids, cut before the
  first completed stop string (the stop string and everything after it never
  appear);
* after every update, what was shown equals the full decode of the ids fed so
  far minus only: an unfinished character (trailing U+FFFD), an open byte run
  (byte fallback: the decoder settles a run only when it ends), and the longest
  tail that could still begin a stop string.
"""
from __future__ import annotations

import random

import pytest

from inferq.gpuworker.engine.detokenizer import IncrementalDetokenizer, _gpt2_byte_decoder, byte_fallback_ids
from inferq.schemas import SamplingParams
from tests.engine.stop_reference import first_stop, longest_stop_prefix_tail

FFFD = "\ufffd"
CHARS = ["é", "ß", "Ж", "中", "文", "€", "한", "😀", "🎉", "𝄞", "a", " ", "\n"]  # 2, 3, 4 bytes


def check_sequence(tok, ids, rng: random.Random, skip: bool, stops: list[str], byte_ids=frozenset(), cleanup_hold=0):
    """Feed ids in random chunks; assert exactness after every update and at the end."""
    decode = lambda xs: tok.decode(xs, skip_special_tokens=skip)  # noqa: E731
    skipped = set(tok.all_special_ids) if skip else set()
    full = decode(ids)
    want_text, want_stop = first_stop(full, stops)
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=stops, skip_special_tokens=skip))
    shown, stop, i = "", None, 0
    while i < len(ids) and stop is None:
        n = rng.choice([1, 1, 1, 2, 3, 5])
        piece, stop = d.update(ids[i : i + n])
        shown += piece
        i += n
        if stop is not None:
            break
        # What may be held: an open byte run, a trailing unfinished character, a stop prefix.
        fed = [t for t in ids[:i] if t not in skipped]
        k = len(fed)
        while k and fed[k - 1] in byte_ids:
            k -= 1
        settled = decode(fed[:k]).rstrip(FFFD)
        assert settled.startswith(shown), (ids[:i], shown, settled)
        if cleanup_hold:
            # A tokenizer that cleans up spaces also holds a tail that could still be
            # rewritten (a chain of " '" / " n" / " " pattern prefixes): checked above
            # only as a prefix, exactness is checked at the end.
            pass
        else:
            assert longest_stop_prefix_tail(settled, stops) == len(settled) - len(shown), (ids[:i], shown, settled)
    if stop is None:
        shown += d.flush()  # may still find a stop in the text it settles (e.g. made of U+FFFD)
        stop = d.stop_hit
    assert (shown, stop) == (want_text, want_stop), (ids, stops, skip)
    assert d.output_text == want_text


def random_stops(rng: random.Random, text: str) -> list[str]:
    stops = []
    for _ in range(rng.randint(0, 3)):
        if text and rng.random() < 0.8:
            a = rng.randrange(len(text))
            stops.append(text[a : a + rng.randint(1, 4)])
        else:
            stops.append(rng.choice(["zz", "中文", "é!", "\n\n"]))
    return stops


def fuzz(tok, make_ids, n: int, seed: int, byte_ids=frozenset(), cleanup_hold=0) -> int:
    rng = random.Random(seed)
    checked = 0
    for case in range(n):
        ids = make_ids(rng)
        skip = case % 3 != 0
        # Half the cases without stops (pure decoding), half with stops taken from the text.
        stops = random_stops(rng, tok.decode(ids, skip_special_tokens=skip)) if case % 2 else []
        check_sequence(tok, ids, rng, skip, stops, byte_ids, cleanup_hold)
        checked += 1
    return checked


# ----------------------------------------------------- byte-fallback SentencePiece
@pytest.fixture(scope="module")
def sp_bytes_tok():
    """Llama-2 layout: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> in the
    model's vocabulary, then pieces; decoder Replace("▁"," "), ByteFallback, Fuse, Strip."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    pieces = ["▁", "▁▁", "▁hello", "▁world", "▁the", "a", "b", "c", ".", ",", "!", "▁a", "中", "é", "▁中文",
              "<0x", "41>", "<", ">", "x", "\ufffd", "▁é", "ab", "▁zz", "z", "\n", "▁\n"]
    for p in pieces:
        vocab[p] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tk.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_byte_fallback_issue_example_is_exact(sp_bytes_tok):
    """The issue's case: 'hello world', six 中 as byte tokens, then 'a' (used to
    stream '…中中中中������a')."""
    tok = sp_bytes_tok
    ids = tok.convert_tokens_to_ids(["▁hello", "▁world"])
    ids += [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "中".encode() * 6]
    ids += tok.convert_tokens_to_ids(["a"])
    for chunk in (1, 2, 5):
        d = IncrementalDetokenizer(tok, [], SamplingParams())
        out = "".join(d.update(ids[i : i + chunk])[0] for i in range(0, len(ids), chunk)) + d.flush()
        assert out == tok.decode(ids) == "hello world中中中中中中a"


def test_byte_fallback_invalid_run_matches_full_decode(sp_bytes_tok):
    """A run that turns invalid late becomes U+FFFD per byte in a full decode;
    the stream never showed its earlier, valid-looking characters."""
    tok = sp_bytes_tok
    byte = lambda b: tok.convert_tokens_to_ids(f"<0x{b:02X}>")  # noqa: E731
    ids = tok.convert_tokens_to_ids(["▁hello"]) + [byte(b) for b in "中中".encode()] + [byte(0xFF)]
    ids += tok.convert_tokens_to_ids(["▁world"])
    d = IncrementalDetokenizer(tok, [], SamplingParams())
    pieces = [d.update([t])[0] for t in ids] + [d.flush()]
    assert "".join(pieces) == tok.decode(ids) == "hello" + FFFD * 7 + " world"
    assert "中" not in "".join(pieces)


def test_byte_fallback_fuzz(sp_bytes_tok):
    tok = sp_bytes_tok
    byte_ids = byte_fallback_ids(tok)
    assert len(byte_ids) == 256
    byte = {b: tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    words = [i for i in range(259, tok.backend_tokenizer.get_vocab_size())]

    def make_ids(rng: random.Random) -> list[int]:
        ids: list[int] = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            if r < 0.35:
                ids += [byte[b] for b in rng.choice(CHARS).encode()]  # a whole character as bytes
            elif r < 0.45:
                ids += [byte[b] for b in rng.choice(CHARS).encode()[: rng.randint(1, 3)]]  # maybe cut short
            elif r < 0.5:
                ids.append(byte[rng.choice([0x80, 0xBF, 0xC0, 0xF5, 0xFF, rng.randrange(256)])])  # invalid
            elif r < 0.58:
                ids.append(rng.choice([1, 2]))  # <s> </s>
            else:
                ids.append(rng.choice(words))
        return ids

    assert fuzz(tok, make_ids, 2500, seed=13, byte_ids=byte_ids) == 2500


# -------------------------------------------------------------- byte-level BPE
def byte_level_tokens(tok) -> dict[int, int]:
    """byte -> the id of its single-byte token (GPT-2's bytes_to_unicode alphabet)."""
    ids = {b: tok.convert_tokens_to_ids(ch) for ch, b in _gpt2_byte_decoder().items()}
    # A trained vocabulary may lack bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF).
    return {b: i for b, i in ids.items() if i is not None and (tok.unk_token_id is None or i != tok.unk_token_id)}



@pytest.fixture(scope="module")
def bytelevel_tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["hello world, the quick brown fox 中文 文字 é è 😀 🎉 ok!", "a b c. 한국어 Жук ß €"] * 20
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|im_start|>")


def test_byte_level_bpe_fuzz(bytelevel_tok):
    tok = bytelevel_tok
    assert byte_fallback_ids(tok) == frozenset()
    vocab = tok.backend_tokenizer.get_vocab_size()
    byte = byte_level_tokens(tok)
    assert set(byte.values()) <= set(range(vocab)) and len(byte) == 256

    def make_ids(rng: random.Random) -> list[int]:
        ids: list[int] = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            if r < 0.3:
                ids += [byte[b] for b in rng.choice(CHARS).encode()]
            elif r < 0.4:
                ids += [byte[b] for b in rng.choice(CHARS).encode()[: rng.randint(1, 3)]]
            elif r < 0.45:
                ids.append(byte[rng.choice([0x80, 0xBF, 0xC0, 0xF5, 0xFF, rng.randrange(256)])])
            elif r < 0.5:
                ids.append(rng.choice(tok.all_special_ids))
            elif r < 0.7:
                ids += tok.encode(rng.choice(CHARS) + rng.choice(["", " ok", "文"]))
            else:
                ids.append(rng.randrange(vocab))
        return ids

    assert fuzz(tok, make_ids, 2500, seed=14) == 2500


# ------------------------------------------------------------------- WordPiece
@pytest.fixture(scope="module", params=[False, True], ids=["no-cleanup", "cleanup"])
def wordpiece_tok(request):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "the", "do", "n't", "'", "s", "m", "ve", "re",
             ".", ",", "?", "!", "##ing", "##s", "##é", "中", "##文", "😀", "##😀", "a", "##a", "run", "##'"]
    tk = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tk.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        clean_up_tokenization_spaces=request.param,
    )


def test_wordpiece_fuzz(wordpiece_tok):
    tok = wordpiece_tok
    vocab = tok.backend_tokenizer.get_vocab_size()

    def make_ids(rng: random.Random) -> list[int]:
        return [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]

    hold = 3 if tok.clean_up_tokenization_spaces else 0
    assert fuzz(tok, make_ids, 2000, seed=15, cleanup_hold=hold) == 2000


# -------------------------------------------------------------- the real SmolLM2
@pytest.fixture(scope="module")
def smol_tok():
    from inferq.gpuworker.models.gguf_loader import converted_folder
    from inferq.gpuworker.models.loader import bundled_model_path, load_tokenizer

    return load_tokenizer(converted_folder(bundled_model_path()))


def test_smollm2_fuzz(smol_tok):
    tok = smol_tok
    vocab = tok.backend_tokenizer.get_vocab_size()
    byte = byte_level_tokens(tok)
    assert all(b in byte for c in CHARS for b in c.encode())
    invalid = [b for b in (0x80, 0xBF, 0xC0, 0xF5, 0xFF, 0xE4, 0xF0) if b in byte]
    assert len(invalid) >= 4
    text_pieces = ["Hello", " world", " 中文", " 😀", "é", " ok", ".", "\n"]

    def make_ids(rng: random.Random) -> list[int]:
        ids: list[int] = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.15:
                ids += tok.encode(rng.choice(CHARS) * rng.randint(1, 2))
            elif r < 0.25:
                ids += [byte[b] for b in rng.choice(CHARS).encode()]  # a character spelled in byte tokens
            elif r < 0.3:
                ids.append(byte[rng.choice(invalid)])  # a stray continuation or lead byte
            elif r < 0.5:
                ids += tok.encode(rng.choice(text_pieces))
            elif r < 0.55:
                ids.append(rng.choice(tok.all_special_ids))
            else:
                ids.append(rng.randrange(vocab))
        return ids

    assert fuzz(tok, make_ids, 2000, seed=16) == 2000


# ------------------------------------------------- through the engine, end to end
def test_engine_text_is_exact_with_a_byte_fallback_tokenizer(sp_bytes_tok, tmp_path):
    """A tiny random Llama whose vocabulary is the byte-fallback tokenizer above:
    its sampled output is mostly byte tokens (valid and invalid runs). The streamed
    deltas equal a full decode of the output ids, with and without stop strings."""
    import torch

    from inferq.gpuworker import LLM
    from tests.tiny_models import save_tiny_model

    torch.set_num_threads(1)
    vocab = len(sp_bytes_tok)
    folder = save_tiny_model("llama", tmp_path / "bf", seed=5, vocab_size=vocab, bos_token_id=1, eos_token_id=2,
                             pad_token_id=0)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    sp_bytes_tok.save_pretrained(folder)
    llm = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=128)
    eng = llm.engine
    prompts = [[1, 259 + k % 20, 5 + k, 100 + 3 * k] for k in range(12)]
    seen_bytes = 0
    for k, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=40, temperature=1.0, seed=k, ignore_eos=True)
        eng.add_request(f"r{k}", prompt, params)
        pieces, ids = [], []
        while eng.has_unfinished():
            for d in eng.step():
                pieces.append(d.new_text)
                ids += d.new_token_ids
        full = sp_bytes_tok.decode(ids, skip_special_tokens=True)
        assert "".join(pieces) == full, (ids, pieces)
        seen_bytes += sum(t in byte_fallback_ids(sp_bytes_tok) for t in ids)
        # Again with a stop string taken from that text: cut before it, nothing after it shown.
        if len(full) > 4:
            stop = full[len(full) // 2 : len(full) // 2 + 2]
            eng.add_request(f"s{k}", prompt, params.model_copy(update={"stop": [stop]}))
            shown = []
            while eng.has_unfinished():
                for d in eng.step():
                    shown.append(d.new_text)
                    last = d
            assert "".join(shown) == full[: full.index(stop)] and last.finish_reason == "stop"
    assert seen_bytes > 100  # the case this test is about did happen


# ------------------------------------------------ byte mode (ByteLevel decoders)
def test_incomplete_tail_cut_never_changes_with_what_follows():
    """Bytes before the cut decode (with U+FFFD) exactly as they will in any longer
    text; the held tail is at most 3 bytes and is the start of a valid character."""
    from inferq.gpuworker.engine.detokenizer import _incomplete_tail

    rng = random.Random(3)
    alphabet = [0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    for _ in range(20_000):
        buf = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        more = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
        cut = len(buf) - _incomplete_tail(buf)
        head = buf[:cut].decode("utf-8", "replace")
        assert (buf + more).decode("utf-8", "replace").startswith(head), (buf, more)
        if cut < len(buf):  # held: some continuation completes it into one character
            tail = buf[cut:]
            assert any(len((tail + bytes([c] * k)).decode("utf-8", "replace")) == 1
                       for c in (0x80, 0x90, 0xA0) for k in range(1, 4)), tail


def test_smollm2_uses_byte_mode(smol_tok):
    from inferq.gpuworker.engine.detokenizer import byte_level_table

    table = byte_level_table(smol_tok)
    assert table is not None
    ids = smol_tok.encode("Hello wörld 😀 中文")
    d = IncrementalDetokenizer(smol_tok, [], SamplingParams())
    shown = "".join(d.update_one(t)[0] for t in ids) + d.flush()
    assert shown == smol_tok.decode(ids, skip_special_tokens=True)
