"""Checks, on open, that a memory database's stored values are ones the store can use (domain code: no gRPC).

A table made without STRICT (by hand, by another program) may hold text or a float in any column, and a NaN
`last_decay` made every flush with decay fail: the store found out long after start-up, in reads that failed INTERNAL
and flushes that failed for good (found by probing). One scan a table, in SQL; the bad row is named in Python.
"""

from __future__ import annotations

import math

import sqlite_utils

from calispec_core.errors import FailedPrecondition

Bounds = tuple[int, int] | None  # an integer in [low, high]; None: text
SQLITE_MAX_INTEGER = 2**63 - 1


def check_stored_state(db: sqlite_utils.Database, stored: dict[str, dict[str, Bounds]]) -> None:
    """FailedPrecondition naming the first stored value out of its bounds (`stored`: table -> column -> bounds), or
    a store_meta.last_decay that is no finite number."""
    for table, columns in stored.items():
        declared = {c.name: c for c in db[table].columns}
        missing = [c for c in columns if c not in declared]
        if missing:
            raise _not_ours(f"table {table} has no column {missing[0]}")
        strict = db[table].strict
        bad = [sql for c, b in columns.items() for sql in _bad_value_sql(c, b, strict and _typed(declared[c], b))]
        if not bad:
            continue
        # One scan per table (the cost of a large valid database); the bad row is diagnosed in Python.
        names = ", ".join(_quoted(c) for c in columns)
        row = db.execute(f"SELECT {names} FROM {table} WHERE {' OR '.join(bad)} LIMIT 1").fetchone()
        if row is not None:
            column, value = next((c, v) for (c, b), v in zip(columns.items(), row, strict=True) if not _fits(v, b))
            raise _not_ours(f"{table}.{column} holds {value!r} ({_expected(columns[column])})")
    last_decay = db.execute("SELECT value FROM store_meta WHERE key = 'last_decay'").fetchone()[0]
    if not _is_finite(last_decay):  # NaN made every flush with decay fail, for good
        raise _not_ours(f"store_meta.last_decay holds {last_decay!r} (not a finite number of seconds)")


def _typed(column: sqlite_utils.db.Column, bounds: Bounds) -> bool:
    """Whether a STRICT table's declaration alone keeps the column to its type (typeof(): 90 ms a column, 1M rows)."""
    return bool(column.notnull) and column.type.upper() in (("TEXT",) if bounds is None else ("INT", "INTEGER"))


def _quoted(column: str) -> str:
    return f'"{column}"'


def _bad_value_sql(column: str, bounds: Bounds, typed: bool) -> list[str]:
    """SQL conditions true for a value of `column` out of `bounds`; `typed`: its type needs no check."""
    checks = [] if typed else [f"typeof({_quoted(column)}) != '{'text' if bounds is None else 'integer'}'"]
    if bounds is not None:
        checks.append(f"{_quoted(column)} NOT BETWEEN {bounds[0]} AND {bounds[1]}")
    return checks


def _fits(value: object, bounds: Bounds) -> bool:
    if bounds is None:
        return isinstance(value, str)
    return isinstance(value, int) and bounds[0] <= value <= bounds[1]


def _expected(bounds: Bounds) -> str:
    if bounds is None:
        return "not text"
    if bounds[1] >= SQLITE_MAX_INTEGER:
        return f"not an integer >= {bounds[0]}"
    return f"not an integer in [{bounds[0]}, {bounds[1]}]"


def _is_finite(value: object) -> bool:
    try:
        return isinstance(value, str | int | float) and math.isfinite(float(value))
    except ValueError:  # text that is no number
        return False


def _not_ours(problem: str) -> FailedPrecondition:
    return FailedPrecondition(f"{problem}: not a Calispec memory, or damaged")
