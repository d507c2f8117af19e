"""Incremental detokenization with stop strings, one instance per request.

Contract: the text handed out (all ``update`` pieces plus ``flush``) equals
``tokenizer.decode(output_ids, skip_special_tokens=...)`` exactly, for every
decoder family we serve: byte-level BPE (SmolLM2, Llama 3, Qwen), byte-fallback
SentencePiece (Llama 2, Mistral, TinyLlama: ``<0xNN>`` byte tokens) and
WordPiece-style decoders. Prompt tokens are not used as decoding context.

Decoding: we decode a short window of recent output ids (``ids[prefix:]``) and
remember how many of the window's characters were already shown. Each new token
re-decodes only that window and shows the characters it adds. What is held back:

* byte-level BPE: characters at the end of the window that are U+FFFD are a
  multi-byte character cut between tokens; they wait for the rest of it.
* byte fallback: the decoder settles a *run* of consecutive byte tokens only
  when the run ends (valid UTF-8 -> its characters; otherwise one U+FFFD per
  byte, for the whole run). So an open run (the last token is a byte token) is
  held, and not even decoded, until a non-byte token (or ``flush``) closes it;
  this is the only way the streamed text can equal a full decode when a run
  turns out invalid. Everything before the run is shown.

Every ``_WINDOW_MAX`` tokens, at a point where nothing is pending, the window
restarts a few tokens back, so the cost per token stays a decode of a handful of
tokens (amortized O(new tokens)), never of the whole output. A restart never
begins at a byte token (that could cut a byte run, which the decoder would then
turn into U+FFFD), and the restarted window must hold text: a decoder's
start-of-text quirks (SentencePiece dropping a leading space, WordPiece keeping
a leading ``##``) only touch the window's first characters, which have always
been shown already. Special tokens that ``skip_special_tokens`` removes never
enter the window (the decoder never sees them either).

Stop strings: the request stops at the first stop string *completed* when the
text is read left to right (on a tie, the one that starts first); this does not
depend on how many tokens arrive per update. The text is cut before it and it is
never shown. While streaming we hold back only the longest tail of the text that
is still the start of some stop string (at most ``max(len(stop)) - 1``
characters); it is released as soon as it cannot be. Stop strings are matched on
settled text only, so a stop is never found in text a later token would change.
"""
from __future__ import annotations

import json
import re
import weakref
from typing import Callable, Optional

from inferq.schemas import SamplingParams

REPLACEMENT_CHAR = "\ufffd"
# The decode window grows to _WINDOW_MAX tokens, then (once settled) restarts
# _WINDOW_KEEP tokens back.
_WINDOW_MAX = 12
_WINDOW_KEEP = 4


# tokenizer -> ids that skip_special_tokens=True removes (worked out once per tokenizer)
_SKIPPED: "weakref.WeakKeyDictionary[object, frozenset[int]]" = weakref.WeakKeyDictionary()


def skipped_special_ids(tokenizer) -> frozenset[int]:
    """Ids that ``decode(..., skip_special_tokens=True)`` drops.

    Candidates are the tokenizer's special and added tokens; each is confirmed
    by the decoder itself, so the set matches what a full decode skips.
    """
    try:
        return _SKIPPED[tokenizer]
    except (KeyError, TypeError):
        pass
    candidates = set(getattr(tokenizer, "all_special_ids", None) or [])
    candidates.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
    skip, keep = make_decode_fn(tokenizer, True), make_decode_fn(tokenizer, False)
    ids = frozenset(i for i in candidates if skip([i]) == "" and keep([i]) != "")
    try:
        _SKIPPED[tokenizer] = ids
    except TypeError:  # not weak-referenceable: just don't cache
        pass
    return ids


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_BYTE_IDS: "weakref.WeakKeyDictionary[object, frozenset[int]]" = weakref.WeakKeyDictionary()


def byte_fallback_ids(tokenizer) -> frozenset[int]:
    """Ids of ``<0xNN>`` byte tokens when the decoder has a ByteFallback step
    (SentencePiece-style); empty for every other decoder."""
    try:
        return _BYTE_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    ids: frozenset[int] = frozenset()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    try:
        state = json.loads(decoder.__getstate__()) if decoder is not None else None
    except Exception:  # an exotic decoder we cannot inspect: treat as not byte fallback
        state = None
    if state is not None and '"ByteFallback"' in json.dumps(state):
        vocab = backend.get_vocab(with_added_tokens=True)
        ids = frozenset(i for t, i in vocab.items() if len(t) == 6 and _BYTE_TOKEN.fullmatch(t))
    try:
        _BYTE_IDS[tokenizer] = ids
    except TypeError:
        pass
    return ids


def make_decode_fn(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """The cheapest call that decodes like ``tokenizer.decode`` *without* its
    Python-level ``clean_up_tokenization_spaces`` pass (see ``cleanup_fn``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer directly: same text, without the Python wrapper's overhead.
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable stand-in char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


# tokenizer -> (bytes per id, text per id where those bytes are whole characters), or None
_BYTE_TABLES: "weakref.WeakKeyDictionary[object, Optional[tuple]]" = weakref.WeakKeyDictionary()


def byte_level_table(tokenizer) -> Optional[tuple[list[bytes], list[Optional[str]]]]:
    """Per-id bytes for a tokenizer whose decoder is exactly ByteLevel (GPT-2 style:
    SmolLM2, Llama 3, Qwen), else None.

    Such a decoder maps each token's characters back to bytes (a token with a
    character outside the map keeps its own UTF-8), concatenates them and decodes
    the lot with U+FFFD for invalid sequences. Then the text of a token stream is
    a byte stream: no window to re-decode. The table is checked against the
    tokenizer's own decode of every id; any difference and we keep the window
    decoder."""
    try:
        return _BYTE_TABLES[tokenizer]
    except (KeyError, TypeError):
        pass
    table = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    try:
        state = json.loads(decoder.__getstate__()) if decoder is not None else None
    except Exception:
        state = None
    if state is not None and state.get("type") == "ByteLevel":
        inv = _gpt2_byte_decoder()
        size = backend.get_vocab_size(with_added_tokens=True)
        raw: list[bytes] = [b""] * size
        for tok, i in backend.get_vocab(with_added_tokens=True).items():
            if 0 <= i < size:
                try:
                    raw[i] = bytes(inv[c] for c in tok)
                except KeyError:
                    raw[i] = tok.encode("utf-8")
        want = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        if all(b.decode("utf-8", "replace") == w for b, w in zip(raw, want)):
            whole = []
            for b in raw:
                try:
                    text = b.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                whole.append(text if text is not None and not text.endswith(REPLACEMENT_CHAR) else None)
            table = (raw, whole)
    try:
        _BYTE_TABLES[tokenizer] = table
    except TypeError:
        pass
    return table


# tokenizer -> {skipped ids: the fast table} (one per skip_special_tokens setting)
_FAST_TABLES: "weakref.WeakKeyDictionary[object, dict[frozenset, list]]" = weakref.WeakKeyDictionary()


def _fast_table(tokenizer, whole: list, skipped: frozenset) -> list:
    """The byte table's whole-character texts with skipped special ids as "",
    made once per tokenizer and skip set."""
    try:
        per_tok = _FAST_TABLES.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: build it per request
        per_tok = {}
    fast = per_tok.get(skipped)
    if fast is None:
        fast = list(whole)
        for i in skipped:
            if 0 <= i < len(fast):
                fast[i] = ""
        per_tok[skipped] = fast
    return fast


def _incomplete_tail(buf: bytes) -> int:
    """Length of the trailing bytes that begin a valid UTF-8 character but do not
    finish it (0-3): they wait for the next token. Everything before them decodes
    now exactly as it will in the full text (a U+FFFD for an invalid sequence is
    final once a byte that cannot continue it has arrived)."""
    n = len(buf)
    for i in range(1, min(3, n) + 1):
        b = buf[n - i]
        if 0x80 <= b <= 0xBF:  # continuation byte: keep looking for the lead
            continue
        need = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
        if need <= i:
            return 0
        if i >= 2:  # the second byte's range depends on the lead (no overlongs, surrogates, > U+10FFFF)
            lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(b, (0x80, 0xBF))
            if not lo <= buf[n - i + 1] <= hi:
                return 0
        return i
    return 0


def cleanup_fn(tokenizer) -> Optional[Callable[[str], str]]:
    """transformers' ``clean_up_tokenization`` when ``tokenizer.decode`` applies it
    (WordPiece-era tokenizers with ``clean_up_tokenization_spaces``), else None.

    transformers skips it for BPE models unless forced; we follow the same rule.
    """
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and type(backend.model).__name__ == "BPE"
        and not getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
    ):
        return None
    fn = getattr(tokenizer, "clean_up_tokenization", None)
    return fn if callable(fn) else None


# transformers' clean_up_tokenization patterns: each begins with a space, which
# its replacement deletes. A text that ends in a proper prefix of one of them
# may still change; nothing else can.
_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
_CLEANUP_PREFIXES = frozenset(p[:k] for p in _CLEANUP_PATTERNS for k in range(1, len(p)))
_CLEANUP_REACH = max(len(p) for p in _CLEANUP_PREFIXES)


class IncrementalDetokenizer:
    # Slotted: the engine calls one of these per running request every step.
    __slots__ = ("_decode", "_skipped", "_byte_ids", "_tok_bytes", "_tok_text", "_pending", "_held_fffd",
                 "_cleanup", "_raw_pending", "_raw_ctx", "stop_strings", "_max_stop", "_ids", "_prefix",
                 "_window_shown", "_pieces", "_num_chars", "_tail", "_shown", "_final", "stop_hit", "_flushed",
                 "_fast_text")

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        # prompt_token_ids is accepted for the engine's convenience; the text is
        # decoded from the output ids alone (see the module docstring).
        self._decode = make_decode_fn(tokenizer, params.skip_special_tokens)
        # Skipped special tokens never enter the window (the decoder drops them
        # anyway), so a run of them cannot leave a window without text.
        self._skipped = skipped_special_ids(tokenizer) if params.skip_special_tokens else frozenset()
        self._byte_ids = byte_fallback_ids(tokenizer)
        # ByteLevel decoders: decode as a byte stream from a per-id table (no Rust call
        # per token); other decoders re-decode a short window of ids.
        table = byte_level_table(tokenizer)
        self._tok_bytes, self._tok_text = table if table is not None else (None, None)
        self._pending = b""  # byte mode: bytes of a character not finished yet
        self._held_fffd = ""  # byte mode: trailing U+FFFD not shown yet
        # Python-level clean_up_tokenization (WordPiece-era tokenizers): applied
        # to the decoded text as a stream, cut only where no pattern can straddle.
        self._cleanup = cleanup_fn(tokenizer)
        self._raw_pending = ""  # decoded text not yet cleaned (it may still start a pattern)
        self._raw_ctx = ""  # the last _CLEANUP_REACH raw characters already cleaned
        self.stop_strings: list[str] = list(params.stop)
        self._max_stop = max((len(s) for s in self.stop_strings), default=0)

        self._ids: list[int] = []  # output ids
        self._prefix = 0  # the decode window is ids[prefix:]
        self._window_shown = 0  # chars of decode(ids[prefix:]) already taken as text

        self._pieces: list[str] = []  # all decoded text, in order
        self._num_chars = 0
        self._tail = ""  # last max_stop - 1 decoded chars: where a stop may begin
        self._shown = 0  # chars handed out so far
        self._final: Optional[str] = None  # output text once finished by a stop string
        self.stop_hit: Optional[str] = None
        self._flushed = False
        # update_one's lookup table (None: take the general path every token).
        self._fast_text = None
        if table is not None and self._cleanup is None and not self.stop_strings:
            self._fast_text = _fast_table(tokenizer, table[1], self._skipped)

    # ----------------------------------------------------------------- public
    @property
    def output_text(self) -> str:
        """All settled text so far, stop string excluded: what was shown plus a
        held stop-string prefix (an open byte run or an unfinished character
        joins once settled, or at ``flush``)."""
        if self._final is not None:
            return self._final
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def stopped(self) -> bool:
        return self.stop_hit is not None

    def update(self, new_token_ids: list[int]) -> tuple[str, Optional[str]]:
        """Feed newly sampled ids; returns (text to show now, stop string hit or None)."""
        self._check_open()
        new_text = "".join(self._decode_token(t) for t in new_token_ids)
        if self._cleanup is not None:
            new_text = self._clean_stream(new_text, final=False)
        return self._take(new_text, final=False)

    def update_one(self, token_id: int) -> tuple[str, Optional[str]]:
        """``update([token_id])`` for the engine's one-token-per-step case; without
        stop strings or a cleanup pass it skips the stop-string bookkeeping
        (everything decoded is shown at once there)."""
        fast = self._fast_text
        if fast is not None and not self._pending and not self._held_fffd:
            # Byte-level table, no stop strings, no cleanup, no partial character
            # waiting: a token of whole characters (or a skipped special) is a lookup.
            text = fast[token_id] if 0 <= token_id < len(fast) else None
            if text is not None:
                if text:
                    self._pieces.append(text)
                    self._num_chars += len(text)
                    self._shown = self._num_chars
                return text, None
        if self._cleanup is not None or self._max_stop or self._flushed:
            return self.update([token_id])
        new_text = self._decode_token(token_id)
        if new_text:
            self._pieces.append(new_text)
            self._num_chars += len(new_text)
            self._shown = self._num_chars
        return new_text, None

    def flush(self) -> str:
        """On a finish without a stop string: everything not yet shown.

        Tokens still waiting for the rest of a multi-byte character are decoded
        as they are (with U+FFFD), exactly as a full decode would show them.
        """
        self._check_open()
        self._flushed = True
        self._fast_text = None
        rest = self._decode(self._ids[self._prefix :])[self._window_shown :] if self._ids else ""
        if self._pending or self._held_fffd:  # byte mode: an unfinished character decodes as it is (U+FFFD)
            rest += self._held_fffd + self._pending.decode("utf-8", "replace")
            self._pending, self._held_fffd = b"", ""
        if self._cleanup is not None:
            rest = self._clean_stream(rest, final=True)
        text, _ = self._take(rest, final=True)
        return text

    # --------------------------------------------------------------- decoding
    def _decode_token(self, token_id: int) -> str:
        if token_id in self._skipped:
            return ""
        if self._tok_bytes is not None:
            if not 0 <= token_id < len(self._tok_bytes):
                return ""  # an id the tokenizer does not know: its decode drops it too
            if not self._pending and not self._held_fffd:
                text = self._tok_text[token_id]
                if text is not None:  # whole characters: the common case
                    return text
                buf = self._tok_bytes[token_id]
            else:
                buf = self._pending + self._tok_bytes[token_id]
            cut = len(buf) - _incomplete_tail(buf)
            self._pending = buf[cut:]
            text = self._held_fffd + buf[:cut].decode("utf-8", "replace")
            # As in window mode, trailing U+FFFD wait for the next character (or flush).
            ready = text.rstrip(REPLACEMENT_CHAR)
            self._held_fffd = text[len(ready) :]
            return ready
        self._ids.append(token_id)
        if token_id in self._byte_ids:
            # A byte run is settled by the decoder only when it ends: hold it
            # (not even decoded until then).
            return ""
        window = self._decode(self._ids[self._prefix :])
        # Characters before a trailing run of U+FFFD can no longer change.
        ready = len(window.rstrip(REPLACEMENT_CHAR))
        new = window[self._window_shown : ready]
        self._window_shown = max(self._window_shown, ready)
        n = len(self._ids)
        if n - self._prefix >= _WINDOW_MAX and ready == len(window):
            # Restart the window a few tokens back, but only while nothing in it
            # is pending: then every character of the new window (even U+FFFD
            # from starting inside a byte-level character) has been shown
            # already. Never start on a byte-fallback token (it may sit inside
            # a byte run), and the new window must hold some text, or a decoder
            # that strips the start of the text (SentencePiece's leading space)
            # would eat the next token's.
            start = n - _WINDOW_KEEP
            while self._ids[start] in self._byte_ids:  # ids[-1] is not a byte token: this ends
                start += 1
            text = self._decode(self._ids[start:])
            if text:
                self._prefix, self._window_shown = start, len(text)
        return new

    def _clean_stream(self, raw: str, final: bool) -> str:
        """Cleaned text for ``raw``, exactly as a cleanup of the whole text would be.

        The text is cut (and cleaned up to the cut) where it does not end in a
        proper prefix of a pattern: then no pattern can cross the cut, in any of
        the chained replacements (they only delete spaces, and deleting one
        cannot form a new pattern prefix before the cut). What waits is at most
        _CLEANUP_REACH characters (" n'", " 'v", " 'r", " '", " n", " ").
        """
        buf = self._raw_pending + raw
        cut = len(buf)
        if not final:
            ctx = self._raw_ctx + buf
            off = len(self._raw_ctx)
            while cut > 0 and any(
                ctx[max(0, off + cut - k) : off + cut] in _CLEANUP_PREFIXES for k in range(1, _CLEANUP_REACH + 1)
            ):
                cut -= 1
        self._raw_ctx = (self._raw_ctx + buf[:cut])[-_CLEANUP_REACH:]
        self._raw_pending = buf[cut:]
        return self._cleanup(buf[:cut]) if cut else ""

    # ------------------------------------------------------------ stop strings
    def _take(self, new_text: str, final: bool) -> tuple[str, Optional[str]]:
        """Append decoded text, look for stop strings, return what may be shown."""
        region_start = self._num_chars - len(self._tail)
        region = self._tail + new_text  # every new stop match lies inside this
        if new_text:
            self._pieces.append(new_text)
            self._num_chars += len(new_text)

        hit = self._find_stop(region, len(self._tail)) if self.stop_strings else None
        if hit is not None:
            stop, start = hit
            self.stop_hit = stop
            cut = region_start + start
            self._final = self.output_text[:cut]
            shown = region[self._shown - region_start : start]
            self._shown = cut
            return shown, stop

        hold = 0 if final else self._held_back(region)
        upto = max(self._shown, self._num_chars - hold)
        shown = region[self._shown - region_start : upto - region_start]
        self._shown = upto
        keep = self._max_stop - 1
        self._tail = region[-keep:] if keep > 0 else ""
        return shown, None

    def _find_stop(self, region: str, old_len: int) -> Optional[tuple[str, int]]:
        """The stop string completed first in ``region`` (ending past old_len)."""
        best: Optional[tuple[int, int, str]] = None  # (end, start, stop)
        for s in self.stop_strings:
            i = region.find(s, max(0, old_len - len(s) + 1))
            if i < 0:
                continue
            cand = (i + len(s), i, s)
            if best is None or cand[:2] < best[:2]:
                best = cand
        return None if best is None else (best[2], best[1])

    def _held_back(self, region: str) -> int:
        """Length of the longest tail of ``region`` that begins some stop string."""
        best = 0
        for s in self.stop_strings:
            span = min(len(s) - 1, len(region))
            if span <= best:
                continue
            tail = region[-span:]
            # Try tails from longest to shortest, only where s's first char sits.
            i = tail.find(s[0])
            while i >= 0 and span - i > best:
                if s.startswith(tail[i:]):
                    best = span - i
                    break
                i = tail.find(s[0], i + 1)
        return best

    def _check_open(self) -> None:
        if self.stop_hit is not None:
            raise RuntimeError("detokenizer already stopped on a stop string; the request is finished")
        if self._flushed:
            raise RuntimeError("detokenizer already flushed; the request is finished")
