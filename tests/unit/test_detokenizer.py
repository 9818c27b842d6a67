"""Incremental detokenization and stop strings."""

from __future__ import annotations

from coordinator.detokenizer import IncrementalDetokenizer
from tests.conftest import TinyPair
from tests.unit.fakes import CharTokenizer


def feed(stop: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    detok = IncrementalDetokenizer(CharTokenizer(), stop)
    deltas = []
    for piece in pieces:
        delta, stopped, _ = detok.add([ord(c) for c in piece])
        deltas.append(delta)
        if stopped:
            return deltas, True
    deltas.append(detok.finish())
    return deltas, False


def test_deltas_concatenate_to_the_text() -> None:
    deltas, stopped = feed((), ["ab", "c", "def"])
    assert deltas == ["ab", "c", "def", ""] and not stopped


def test_stop_string_inside_one_delta() -> None:
    deltas, stopped = feed(("cd",), ["abcdef"])
    assert deltas == ["ab"] and stopped


def test_stop_string_straddling_deltas_is_held_back_then_cut() -> None:
    deltas, stopped = feed(("END",), ["abcE", "N", "Dxyz"])
    assert deltas == ["abc", "", ""] and stopped


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    deltas, stopped = feed(("END",), ["abE", "Nx"])
    assert "".join(deltas) == "abENx" and deltas[0] == "ab" and not stopped


def test_earliest_of_several_stops_wins() -> None:
    deltas, stopped = feed(("zz", "b"), ["azzb"])
    assert deltas == ["a"] and stopped


def test_the_tokens_past_the_one_that_completed_a_stop_string_are_dropped() -> None:
    """A round's tokens after the stop were kept (token_ids, usage): `sd` counted up to γ more than `ar`."""
    detok = IncrementalDetokenizer(CharTokenizer(), ("cd",))
    assert detok.add([ord(c) for c in "abcdef"]) == ("ab", True, 4)
    assert detok.token_ids == [ord(c) for c in "abcd"]


def test_overlapping_stops_end_where_one_token_at_a_time_ends() -> None:
    """ "abc" and "b": one token at a time stops at "ab" (the text "a"); a round of three found "abc" first."""
    detok = IncrementalDetokenizer(CharTokenizer(), ("abc", "b"))
    assert detok.add([ord(c) for c in "abc"]) == ("a", True, 2)


def test_any_rounds_stop_where_one_token_at_a_time_stops() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    def run(stop: tuple[str, ...], chunks: list[str]) -> tuple[str, list[int]]:
        detok = IncrementalDetokenizer(CharTokenizer(), stop)
        text = ""
        for chunk in chunks:
            delta, stopped, _ = detok.add([ord(c) for c in chunk])
            text += delta
            if stopped:
                return text, detok.token_ids
        return text + detok.finish(), detok.token_ids

    letters = st.text("abc", min_size=1, max_size=6)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(letters, min_size=1, max_size=3), st.lists(letters, min_size=1, max_size=8))
    def check(stop: list[str], chunks: list[str]) -> None:
        assert run(tuple(stop), chunks) == run(tuple(stop), list("".join(chunks)))

    check()


class CountingTokenizer(CharTokenizer):
    """Counts the tokens it decodes."""

    decoded = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded += len(ids)
        return super().decode(ids, skip_special_tokens)


def test_each_step_decodes_a_window_not_the_whole_output() -> None:
    tokenizer = CountingTokenizer()
    detok = IncrementalDetokenizer(tokenizer, ())
    text = "x" * 400
    deltas = [detok.add([ord(c)])[0] for c in text]
    assert "".join(deltas) == text
    assert tokenizer.decoded < 4 * len(text)  # a whole decode per step would be ~len²/2 = 80,000


def test_multibyte_characters_split_over_tokens_come_out_whole() -> None:
    """A byte-level tokenizer: a character's bytes arrive in separate tokens (U+FFFD until complete)."""

    class Bytes:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    detok = IncrementalDetokenizer(Bytes(), ())  # type: ignore[arg-type]
    data = "a€b😀c".encode()
    deltas = [detok.add([b])[0] for b in data]
    assert "".join(deltas) + detok.finish() == "a€b😀c" and REPLACEMENT not in "".join(deltas)


REPLACEMENT = "\ufffd"


def test_deltas_add_up_to_the_whole_decode_on_a_real_tokenizer(tiny_pair: TinyPair) -> None:
    """Any ids in any chunks: the deltas plus the final flush are exactly the tokens' decoded text."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_pair.target))
    ids = st.integers(0, len(tokenizer) - 1)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.lists(ids, min_size=1, max_size=4), max_size=30))
    def check(chunks: list[list[int]]) -> None:
        detok = IncrementalDetokenizer(tokenizer, ())
        text = "".join(detok.add(chunk)[0] for chunk in chunks) + detok.finish()
        assert text == tokenizer.decode([t for c in chunks for t in c], skip_special_tokens=True)

    check()


def test_a_replacement_char_stop_never_matches_half_of_a_character() -> None:
    """A stop string "\ufffd" matched the first byte of a valid two-byte character (the window's text ends in U+FFFD
    until its second byte comes) and cut the output there (found by probing); it matches a real U+FFFD only."""

    class Bytes:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    for rounds in ([[b] for b in b"a\xd3\x80b\xffc"], [list(b"a\xd3"), list(b"\x80b\xff"), [ord("c")]]):
        detok = IncrementalDetokenizer(Bytes(), (REPLACEMENT,))  # type: ignore[arg-type]
        text, stopped = "", False
        for ids in rounds:
            delta, stopped, _ = detok.add(ids)
            text += delta
            if stopped:
                break
        assert stopped and text == "aӀb"  # cut at the real U+FFFD (the lone byte 0xff), not inside "Ӏ"
    detok = IncrementalDetokenizer(Bytes(), (REPLACEMENT,))  # type: ignore[arg-type]
    assert detok.add(list(b"ab\xff")) == ("ab", False, 3)  # a last U+FFFD may be half a character: held back
    assert detok.finish() == ""  # the output ended there: it was a real one, a stop string, cut (review)


def test_a_stop_string_counts_only_once_it_ends_at_or_past_the_min_tokens_th_token() -> None:
    """vLLM's min_tokens: stop strings are not looked for among the output's first min_tokens - 1 tokens."""
    for pieces in (["xy", "zx", "yzx", "y"], ["xyzxyzxy"], [*"xyzxyzxy"]):
        detok = IncrementalDetokenizer(CharTokenizer(), ("xy",), min_tokens=6)
        text, kept = "", 0
        for piece in pieces:
            delta, stopped, count = detok.add([ord(c) for c in piece])
            text, kept = text + delta, kept + count
            if stopped:
                break
        assert stopped and text == "xyzxyz" and kept == 8, pieces  # the "xy" of tokens 4-5 ends in the fifth: early
    detok = IncrementalDetokenizer(CharTokenizer(), ("xy",), min_tokens=2)
    assert detok.add([ord(c) for c in "xyz"]) == ("", True, 2)  # ends in the second token: counted
