"""`python -m memory_service` on a database holding values the store cannot use: one line naming it, exit 2.

It used to start, then fail `calispec memory namespaces` with INTERNAL (a version 'x'), or every flush (last_decay
'nan', with decay on); 'abc' was refused without naming the database.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from memory_service.store import CorrectionStore
from tests.helpers import REPO_ROOT

LOOSE_VERSIONS = "CREATE TABLE namespace_versions (namespace TEXT PRIMARY KEY, version INTEGER, total_events INTEGER)"


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (
            ["DROP TABLE namespace_versions", LOOSE_VERSIONS, "INSERT INTO namespace_versions VALUES ('ns', 'x', 3)"],
            "namespace_versions.version holds 'x' (not an integer >= 0)",
        ),
        (["UPDATE store_meta SET value = 'nan'"], "store_meta.last_decay holds 'nan' (not a finite number of seconds)"),
        (["UPDATE store_meta SET value = 'abc'"], "store_meta.last_decay holds 'abc' (not a finite number of seconds)"),
    ],
    ids=["version-text", "last-decay-nan", "last-decay-abc"],
)
def test_the_service_refuses_a_database_it_cannot_use(tmp_path: Path, statements: list[str], problem: str) -> None:
    db = tmp_path / "m.db"
    with CorrectionStore(db, flush_interval_s=0) as store:
        store.record("ns", [(1, 2, 3)], durable=True)
    with sqlite3.connect(db) as conn:
        for sql in statements:
            conn.execute(sql)
    conn.close()
    args = ["--db", str(db), "--port", "0", "--half-life", "10", "--allow-unauthenticated-writes"]
    result = subprocess.run(
        [sys.executable, "-m", "memory_service", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"memory_service: cannot start: cannot open the memory database {db}: {problem}: "
        "not a Calispec memory, or damaged"
    ], result.stderr
