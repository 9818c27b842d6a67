"""One store per database file: the lock beside it (memory_service/db_lock.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from calispec_core.errors import FailedPrecondition
from memory_service.db_lock import DatabaseInUse, DatabaseLock, lock_path
from memory_service.store import CorrectionStore


def test_a_second_store_on_the_same_file_is_refused_naming_the_holder(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    with CorrectionStore(db, flush_interval_s=0) as first:
        first.announce("127.0.0.1:50053")
        with pytest.raises(DatabaseInUse) as info:
            CorrectionStore(db, flush_interval_s=0)
        message = str(info.value)
        assert f"the memory database {db} is in use by another memory service" in message
        assert f"pid {os.getpid()} on {socket.gethostname()}, serving 127.0.0.1:50053" in message
        assert str(lock_path(db)) in message and "\n" not in message
        assert first.record("ns", [(1, 2, 3)], durable=True) == (3, 1)  # the holder is untouched
    with CorrectionStore(db, flush_interval_s=0) as second:  # closed: the next one takes it
        assert second.stats("ns") == (3, 1, 1)


def test_another_spelling_of_the_path_finds_the_same_lock(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    (tmp_path / "link.db").symlink_to(db)
    with CorrectionStore(db, flush_interval_s=0):
        for other in (tmp_path / "." / "memory.db", tmp_path / "link.db"):
            with pytest.raises(DatabaseInUse):
                CorrectionStore(other, flush_interval_s=0)


def test_stores_on_two_files_coexist(tmp_path: Path) -> None:
    with CorrectionStore(tmp_path / "a.db", flush_interval_s=0) as a, CorrectionStore(tmp_path / "b.db") as b:
        assert a.record("ns", [(1, 2, 1)], durable=True) == b.record("ns", [(1, 2, 1)], durable=True) == (1, 1)


def test_in_memory_databases_take_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with CorrectionStore(":memory:", flush_interval_s=0) as a, CorrectionStore(":memory:", flush_interval_s=0) as b:
        assert a.file_lock is None and b.file_lock is None
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_fails_to_open_lets_the_lock_go(tmp_path: Path) -> None:
    db = tmp_path / "corrupt.db"
    db.write_bytes(b"definitely not SQLite " * 200)
    with pytest.raises(FailedPrecondition, match="file is not a database"):
        CorrectionStore(db, flush_interval_s=0)
    lock = DatabaseLock.take(db)  # free again
    assert lock is not None
    lock.release()


def test_a_lock_file_that_names_no_holder_still_refuses(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    with CorrectionStore(db, flush_interval_s=0):
        lock_path(db).write_text("not json")  # a holder still between its lock and its record, or a stranger
        with pytest.raises(DatabaseInUse, match=r"\(holder unknown; lock "):
            CorrectionStore(db, flush_interval_s=0)
