"""Incremental detokenization and stop strings."""

from __future__ import annotations

from coordinator.detokenizer import IncrementalDetokenizer
from tests.unit.fakes import CharTokenizer


def feed(stop: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    detok = IncrementalDetokenizer(CharTokenizer(), stop)
    deltas = []
    for piece in pieces:
        delta, stopped = detok.add([ord(c) for c in piece])
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
