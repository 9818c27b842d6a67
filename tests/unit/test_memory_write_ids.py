"""Idempotent writes: a RecordEvents retried with its write_id (its reply was lost) counts once.

Before write ids a verifier whose RecordEvents timed out after the store had accepted it put the
events back and sent them again: the service counted them twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils

from calispec_core.errors import FailedPrecondition, InvalidArgument
from memory_service import write_ids
from memory_service.store import CorrectionStore

EVENTS = [(1, 2, 3), (4, 5, 1)]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[CorrectionStore]:
    with CorrectionStore(db_path, flush_interval_s=0) as s:
        yield s


def counts(store: CorrectionStore, namespace: str = "ns") -> dict[tuple[int, int], int]:
    pairs, _ = store.snapshot(namespace)
    return {(d, t): c for d, t, c in pairs}


def test_a_retry_with_the_same_write_id_counts_once_and_gets_the_first_reply(store: CorrectionStore) -> None:
    first = store.record("ns", EVENTS, write_id="w-1")  # buffered, not committed yet
    again = store.record("ns", list(reversed(EVENTS)), write_id="w-1")  # the same events, another order
    store.flush()
    after_commit = store.record("ns", EVENTS, durable=True, write_id="w-1")
    assert first == again == after_commit == (4, 1)
    assert counts(store) == {(1, 2): 3, (4, 5): 1}
    assert store.stats("ns")[2] == 1  # one committed write: the version did not move


def test_writes_without_an_id_or_with_new_ids_all_count(store: CorrectionStore) -> None:
    store.record("ns", EVENTS, durable=True)
    store.record("ns", EVENTS, durable=True)
    store.record("ns", EVENTS, durable=True, write_id="a")
    store.record("ns", EVENTS, durable=True, write_id="b")
    store.record("other", EVENTS, durable=True, write_id="a")  # ids are per namespace
    assert counts(store) == {(1, 2): 12, (4, 5): 4}
    assert counts(store, "other") == {(1, 2): 3, (4, 5): 1}


def test_the_ids_survive_a_restart(db_path: Path) -> None:
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        assert store.record("ns", EVENTS, durable=True, write_id="before-restart") == (4, 1)
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        assert store.record("ns", EVENTS, durable=True, write_id="before-restart") == (4, 1)
        assert counts(store) == {(1, 2): 3, (4, 5): 1}


def test_an_id_reused_for_other_events_is_refused_and_changes_nothing(store: CorrectionStore) -> None:
    store.record("ns", EVENTS, durable=True, write_id="w")
    with pytest.raises(InvalidArgument, match="already used for other events"):
        store.record("ns", [(1, 2, 4)], durable=True, write_id="w")
    assert counts(store) == {(1, 2): 3, (4, 5): 1}


@pytest.mark.parametrize("bad", ["x" * 65, "has space", "slash/", "ü", 7])
def test_a_malformed_write_id_is_refused_before_anything_is_written(store: CorrectionStore, bad: object) -> None:
    with pytest.raises(InvalidArgument, match="write_id"):
        store.record("ns", EVENTS, durable=True, write_id=bad)  # type: ignore[arg-type]
    assert counts(store) == {}


def test_a_retried_seed_succeeds_instead_of_finding_its_own_counts(store: CorrectionStore) -> None:
    """only_if_empty: the retry of the write that filled the namespace is that write, not a second seeder."""
    store.record("ns", EVENTS, durable=True, only_if_empty=True, write_id="seed")
    assert store.record("ns", EVENTS, durable=True, only_if_empty=True, write_id="seed") == (4, 1)
    with pytest.raises(FailedPrecondition):
        store.record("ns", EVENTS, durable=True, only_if_empty=True, write_id="another-seeder")
    assert counts(store) == {(1, 2): 3, (4, 5): 1}


def test_only_the_newest_ids_are_kept(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_ids, "MAX_WRITE_IDS", 3)
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        for i in range(5):
            store.record("ns", [(1, 2, 1)], durable=True, write_id=f"w{i}")
    with sqlite_utils.Database(db_path) as db:
        assert sorted(r["write_id"] for r in db["accepted_writes"].rows) == ["w2", "w3", "w4"]
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        store.record("ns", [(1, 2, 1)], durable=True, write_id="w4")  # remembered: not counted
        store.record("ns", [(1, 2, 1)], durable=True, write_id="w0")  # forgotten: counted again
        assert counts(store) == {(1, 2): 6}
