"""Incremental detokenization with stop strings."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas and watches for stop strings.

    Decodes the whole output each time: simple and always consistent (tokenizers may change
    earlier characters as later tokens arrive); quadratic in the output length, which is
    negligible next to model time for the outputs we serve (see README notes).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.token_ids: list[int] = []
        self.text = ""  # text already handed out

    def add(self, token_ids: list[int]) -> tuple[str, bool]:
        """Append tokens; returns (new text, whether a stop string ended the output)."""
        self.token_ids.extend(token_ids)
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cut = self._stop_index(full)
        if cut is not None:
            return self._advance(full[:cut]), True
        # a trailing replacement char is usually half of a multi-byte character: wait for the rest
        safe = full.rstrip(REPLACEMENT_CHAR)
        return self._advance(safe[: len(safe) - self._stop_prefix_len(safe)]), False

    def finish(self) -> str:
        """Flush whatever was held back."""
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        return self._advance(full)

    def _stop_index(self, full: str) -> int | None:
        if not self.stop:
            return None
        longest = max(len(s) for s in self.stop)
        start = max(0, len(self.text) - longest + 1)  # a stop may straddle the previous delta
        hits = [i for s in self.stop if (i := full.find(s, start)) >= 0]
        return min(hits) if hits else None

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
