"""A database whose tables hold values the store cannot use is refused on open, naming the file and the value.

Tables made without STRICT (by hand, by another program) can hold text or floats anywhere; the store used to start on
them and fail later: reads with INTERNAL, every flush with decay for good (found by a probe).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from calispec_core.errors import FailedPrecondition
from memory_service.store import CorrectionStore, TableLimits

DAMAGED = "not a Calispec memory, or damaged"
LOOSE_VERSIONS = "CREATE TABLE namespace_versions (namespace PRIMARY KEY, version INTEGER, total_events INTEGER)"
LOOSE_PAIRS = (
    "CREATE TABLE pair_counts (namespace TEXT, draft_token_id INTEGER, target_token_id INTEGER, count INTEGER, "
    "last_version INTEGER, PRIMARY KEY (namespace, draft_token_id, target_token_id))"
)


def valid_database(path: Path) -> Path:
    """A database the store wrote: a namespace with pairs, a declared vocabulary, a write id."""
    with CorrectionStore(path, flush_interval_s=0) as store:
        store.record("ns", [(1, 2, 3), (4, 5, 6)], vocab_size=100, write_id="w1", digest="d", durable=True)
    return path


def tamper(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as conn:
        for sql in statements:
            conn.execute(sql)
    conn.close()


def loose_versions(*rows: str) -> list[str]:
    """namespace_versions replaced by a table without STRICT (nor types for namespace) holding `rows`."""
    return [
        "DROP TABLE namespace_versions",
        LOOSE_VERSIONS,
        *(f"INSERT INTO namespace_versions VALUES {r}" for r in rows),
    ]


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (loose_versions("('ns', 'x', 3)"), "namespace_versions.version holds 'x' (not an integer >= 0)"),
        (loose_versions("('ns', 2, 2.5)"), "namespace_versions.total_events holds 2.5 (not an integer >= 0)"),
        (loose_versions("('ns', NULL, 3)"), "namespace_versions.version holds None (not an integer >= 0)"),
        (loose_versions("(7, 1, 3)"), "namespace_versions.namespace holds 7 (not text)"),
        (
            ["DROP TABLE pair_counts", LOOSE_PAIRS, "INSERT INTO pair_counts VALUES ('ns', 1, 2, 1.5, 1)"],
            "pair_counts.count holds 1.5 (not an integer >= 1)",
        ),
        # STRICT keeps the types, not the ranges the store relies on
        (['UPDATE pair_counts SET "count" = 0'], "pair_counts.count holds 0 (not an integer >= 1)"),
        (
            ["UPDATE pair_counts SET target_token_id = 4294967296 WHERE draft_token_id = 4"],
            "pair_counts.target_token_id holds 4294967296 (not an integer in [0, 4294967295])",
        ),
        (["UPDATE namespace_vocab SET vocab_size = 0"], "namespace_vocab.vocab_size holds 0 (not an integer in [1, "),
        (["UPDATE accepted_writes SET recorded = -1"], "accepted_writes.recorded holds -1 (not an integer >= 0)"),
        (
            ["DROP TABLE namespace_vocab", "CREATE TABLE namespace_vocab (namespace TEXT PRIMARY KEY, size INTEGER)"],
            "table namespace_vocab has no column vocab_size",
        ),
    ],
    ids=[
        "version-text",
        "total-float",
        "version-null",
        "namespace-integer",
        "count-float",
        "count-zero",
        "token-id-over-uint32",
        "vocab-zero",
        "recorded-negative",
        "column-missing",
    ],
)
def test_a_table_value_the_store_cannot_use_is_refused_on_open(
    tmp_path: Path, statements: list[str], problem: str
) -> None:
    path = valid_database(tmp_path / "m.db")
    tamper(path, *statements)
    assert_refused(path, problem)


@pytest.mark.parametrize(
    ("value", "shown"), [("'nan'", "'nan'"), ("'abc'", "'abc'"), ("'-inf'", "'-inf'"), ("NULL", "None")]
)
def test_a_last_decay_that_is_no_finite_number_is_refused_on_open(tmp_path: Path, value: str, shown: str) -> None:
    """NaN started, then failed every flush (writes refused for good, the final flush lost accepted events); 'abc'
    was refused without naming the database."""
    path = valid_database(tmp_path / "m.db")
    tamper(path, f"UPDATE store_meta SET value = {value} WHERE key = 'last_decay'")
    assert_refused(path, f"store_meta.last_decay holds {shown} (not a finite number of seconds)", half_life_s=10.0)


def test_a_table_without_strict_holding_valid_values_opens(tmp_path: Path) -> None:
    path = valid_database(tmp_path / "m.db")
    tamper(path, *loose_versions("('ns', 2, 9)"), "UPDATE store_meta SET value = '1000' WHERE key = 'last_decay'")
    with CorrectionStore(path, flush_interval_s=0, limits=TableLimits(half_life_s=10.0)) as store:
        assert [(i.namespace, i.version, i.total_events) for i in store.namespaces()] == [("ns", 2, 9)]
        store.record("ns", [(1, 2, 1)], durable=True)  # decays: last_decay was read as a number
        assert store.committed_version("ns") == 3


def test_a_refused_database_is_not_migrated(tmp_path: Path) -> None:
    """The schema work of the open is rolled back with the refusal: the file stays as it was found."""
    path = valid_database(tmp_path / "m.db")
    tamper(path, "PRAGMA user_version = 1", *loose_versions("('ns', 'x', 3)"))
    assert_refused(path, "namespace_versions.version holds 'x'")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


def assert_refused(path: Path, problem: str, half_life_s: float = 0.0) -> None:
    with pytest.raises(FailedPrecondition) as refused:
        CorrectionStore(path, flush_interval_s=0, limits=TableLimits(half_life_s=half_life_s))
    message = str(refused.value)
    assert message.startswith(f"cannot open the memory database {path}: "), message
    assert problem in message and message.endswith(DAMAGED) and "\n" not in message, message
