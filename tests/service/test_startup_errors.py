"""Start-up failures the operator must fix: one line naming the path and the cause, exit 2, no traceback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TinyPair
from tests.helpers import REPO_ROOT


def run_service(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args, "--port", "0"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0]


def corrupt_database(tmp_path: Path) -> Path:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"definitely not SQLite " * 200)
    return path


def damaged_pages(tmp_path: Path) -> Path:
    """A valid header, a damaged table page: opens, but would fail at the first flush."""
    path = tmp_path / "damaged.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 50)
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096 + 16 : 4096 * 3] = b"\xff" * (4096 * 2 - 16)  # the table's pages, not the header
    path.write_bytes(bytes(data))
    return path


def unwritable_path(tmp_path: Path) -> Path:
    """A read-only place: a plain directory made read-only, or (root ignores modes) procfs."""
    if os.geteuid() == 0:
        return Path("/proc/calispec-test/memory.db")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro / "memory.db"


@pytest.mark.parametrize(
    ("make_path", "cause"),
    [
        (corrupt_database, "file is not a database"),
        (damaged_pages, "malformed"),
        (lambda tmp: tmp, "unable to open database file"),  # a directory
        (lambda tmp: corrupt_database(tmp) / "memory.db", "File exists"),
        (unwritable_path, ""),
    ],
    ids=["corrupt", "damaged-pages", "directory", "parent-is-a-file", "read-only"],
)
def test_memory_service_with_a_bad_database(tmp_path: Path, make_path, cause: str) -> None:
    db = make_path(tmp_path)
    result = run_service("memory_service", "--db", str(db), "--allow-unauthenticated-writes")
    assert_one_clear_line(result, "memory_service: cannot start: cannot open the memory database", str(db), cause)


def test_memory_service_with_an_unreadable_token_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    result = run_service("memory_service", "--db", str(tmp_path / "m.db"), "--writer-token-file", str(missing))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"cannot read writer token file {missing}" in result.stderr


def test_draft_service_with_a_bad_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a directory, but no model in it
    result = run_service("draft_service", "--model", str(tmp_path))
    assert_one_clear_line(result, f"draft_service: cannot load the model in {tmp_path}:")


def test_draft_service_with_a_draft_vocab_larger_than_the_model(tiny_pair: TinyPair) -> None:
    result = run_service("draft_service", "--model", str(tiny_pair.draft), "--draft-vocab", "100000")
    assert_one_clear_line(result, "draft_service: cannot load the model in", "--draft-vocab 100000 is larger")


def test_draft_service_with_a_negative_draft_vocab(tiny_pair: TinyPair) -> None:
    result = run_service("draft_service", "--model", str(tiny_pair.draft), "--draft-vocab", "-3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--draft-vocab must be >= 0" in result.stderr.strip().splitlines()[-1]
