"""Incremental detokenization with stop strings, one instance per request.

Decoding: we decode a short window of recent output ids (``ids[prefix:]``) and
remember how many of the window's characters were already shown. Each new token
re-decodes only that window and shows the characters it adds. Characters at the
end of the window that are U+FFFD are a multi-byte character cut between tokens:
they are held until a later token completes them (or until ``flush``). Every
``_WINDOW_MAX`` tokens, at a point where nothing is pending, the window restarts
a few tokens back, so the cost per token stays a decode of a handful of tokens,
never of the whole output. A
decoder's start-of-text quirks (SentencePiece dropping a leading space) only
touch the window's first characters, which have always been shown already: a
restarted window always holds text, and special tokens that
``skip_special_tokens`` removes never enter it.

Known limit (shared with vLLM's scheme): a byte-fallback decoder turns a whole
run of byte tokens into U+FFFD when the run is invalid UTF-8, so an ASCII byte
token followed by invalid bytes (garbage output) can differ from a full decode.

The text equals ``tokenizer.decode(output_ids, skip_special_tokens=...)``:
prompt tokens are not used as decoding context.

Stop strings: the request stops at the first stop string *completed* when the
text is read left to right (on a tie, the one that starts first); this does not
depend on how many tokens arrive per update. The text is cut before it and it is
never shown. While streaming we hold back only the longest tail of the text that
is still the start of some stop string (at most ``max(len(stop)) - 1``
characters); it is released as soon as it cannot be.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

from schemas import SamplingParams

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


def make_decode_fn(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """The cheapest call that decodes exactly like ``tokenizer.decode``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        # The Rust tokenizer directly: same text, without the Python wrapper's overhead.
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        # prompt_token_ids is accepted for the engine's convenience; the text is
        # decoded from the output ids alone (see the module docstring).
        self._decode = make_decode_fn(tokenizer, params.skip_special_tokens)
        # Skipped special tokens never enter the window (the decoder drops them
        # anyway), so a run of them cannot leave a window without text.
        self._skipped = skipped_special_ids(tokenizer) if params.skip_special_tokens else frozenset()
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

    # ----------------------------------------------------------------- public
    @property
    def output_text(self) -> str:
        """All text so far (held-back characters included), stop string excluded."""
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
        return self._take(new_text, final=False)

    def flush(self) -> str:
        """On a finish without a stop string: everything not yet shown.

        Tokens still waiting for the rest of a multi-byte character are decoded
        as they are (with U+FFFD), exactly as a full decode would show them.
        """
        self._check_open()
        self._flushed = True
        rest = self._decode(self._ids[self._prefix :])[self._window_shown :] if self._ids else ""
        text, _ = self._take(rest, final=True)
        return text

    # --------------------------------------------------------------- decoding
    def _decode_token(self, token_id: int) -> str:
        if token_id in self._skipped:
            return ""
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix :])
        # Characters before a trailing run of U+FFFD can no longer change.
        ready = len(window.rstrip(REPLACEMENT_CHAR))
        new = window[self._window_shown : ready]
        self._window_shown = max(self._window_shown, ready)
        if len(self._ids) - self._prefix >= _WINDOW_MAX and ready == len(window):
            # Restart the window a few tokens back, but only while nothing in it
            # is pending: then every character of the new window (even U+FFFD
            # from starting inside a character) has been shown already. The new
            # window must hold some text, or a decoder that strips the start of
            # the text (SentencePiece's leading space) would eat the next token's.
            start = len(self._ids) - _WINDOW_KEEP
            text = self._decode(self._ids[start:])
            if text:
                self._prefix, self._window_shown = start, len(text)
        return new

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
