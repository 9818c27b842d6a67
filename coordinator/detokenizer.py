"""Incremental detokenization with stop strings."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


def without_half_character(text: str) -> str:
    """The text without its trailing U+FFFD: the start of a character whose other bytes are still to come (or,
    rarely, a real U+FFFD at the very end, which the next token or the final flush settles)."""
    return text.rstrip(REPLACEMENT_CHAR)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas and watches for stop strings.

    Each step decodes a short window, not the whole output (as vLLM does): the text of the tokens
    past `read` is the decode of ids[prefix:] minus that of ids[prefix:read], where the window's
    first tokens give the tokenizer its context (a SentencePiece leading space, the start of a
    multi-byte character). Once that text is whole (no trailing U+FFFD) it joins `decoded` and the
    window moves on, so a step costs O(its tokens) instead of O(output).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...], min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.min_tokens = min_tokens  # a stop string counts once it ends in this token or a later one (vLLM's)
        self._floor: int | None = 0 if min_tokens <= 1 else None  # a counted stop ends past this many characters
        self.token_ids: list[int] = []
        self.decoded = ""  # the settled text of token_ids[:read]
        self.prefix = self.read = 0
        self.text = ""  # text already handed out

    def add(self, token_ids: list[int]) -> tuple[str, bool, int]:
        """Append tokens; returns (new text, whether a stop string ended the output, how many of `token_ids` the
        output keeps: all, or those up to the one that completed a stop string, as rounds of one token would
        have stopped: a round's tokens past it were counted in `usage`, so it changed with the mode and γ)."""
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        # a trailing replacement char is usually half of a multi-byte character: wait for the rest (a stop
        # string never matches it: "\ufffd" cut a valid character in two, found by probing)
        safe = without_half_character(self._decode_new())
        if (cut := self._stop_index(safe)) is not None:
            return self._stopped(start, len(token_ids)) or (self._advance(safe[:cut]), True, len(token_ids))
        return self._advance(safe[: len(safe) - self._stop_prefix_len(safe)]), False, len(token_ids)

    def _stopped(self, start: int, added: int) -> tuple[str, bool, int] | None:
        """The output up to the first of the tokens added at `start` whose text holds a stop string (the earliest
        one to complete, as one token at a time finds it), cut before that string; later ones are dropped. None
        where no whole decode holds it (the window's text did): then every token is kept."""
        for kept in range(1, added + 1):
            text = without_half_character(
                self.tokenizer.decode(self.token_ids[: start + kept], skip_special_tokens=True)
            )
            if (cut := self._stop_index(text)) is not None:
                del self.token_ids[start + kept :]
                return self._advance(text[:cut]), True, kept
        return None

    def finish(self) -> str:
        """Flush whatever was held back (one whole decode: the final text is exactly the tokens', cut before a stop
        string that only the whole text holds: one ending in a real U+FFFD, which `add` held back as a half
        character)."""
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if (cut := self._stop_index(full)) is not None:
            full = full[:cut]
        return self._advance(full)

    def _decode_new(self) -> str:
        """The whole output's text so far: `decoded` plus the window's new text (settled when whole)."""
        decode = self.tokenizer.decode
        before = decode(self.token_ids[self.prefix : self.read], skip_special_tokens=True)
        after = decode(self.token_ids[self.prefix :], skip_special_tokens=True)
        new = after[len(before) :] if after.startswith(before) else after
        if new and not new.endswith(REPLACEMENT_CHAR):
            self.decoded += new
            self.prefix, self.read = self.read, len(self.token_ids)
            return self.decoded
        return self.decoded + new

    def _stop_index(self, full: str) -> int | None:
        floor = self._stop_floor()
        if not self.stop or floor is None:
            return None
        longest = max(len(s) for s in self.stop)
        start = max(0, len(self.text) - longest + 1)  # a stop may straddle the previous delta
        hits = [i for s in self.stop if (i := full.find(s, max(start, floor - len(s) + 1))) >= 0]
        return min(hits) if hits else None

    def _stop_floor(self) -> int | None:
        """The length of the text of the output's first min_tokens - 1 tokens: a stop string ending there or before
        completed among them, where it does not count; None while fewer than min_tokens tokens came."""
        if self._floor is None and len(self.token_ids) >= self.min_tokens:
            held = self.token_ids[: self.min_tokens - 1]
            self._floor = len(without_half_character(self.tokenizer.decode(held, skip_special_tokens=True)))
        return self._floor

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of text that could begin a stop string: held back until decided."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _advance(self, text: str) -> str:
        delta = text[len(self.text) :] if text.startswith(self.text) else ""
        self.text += delta
        return delta
