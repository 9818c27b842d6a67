"""The tools' table read against a real memory service whose per-draft cap evicts pairs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from calispec_tools.eval.calibration import table_report
from calispec_tools.eval.report import format_concentration
from calispec_tools.memory_reads import fetch_pairs, read_table
from memory_service.config import MemoryConfig
from memory_service.server import create_server
from memory_service.store import TableLimits

TOKEN = "test-writer-token-0123456789"


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", max_pairs_default=1, flush_interval_s=0.05,
                          writer_token=TOKEN, limits=TableLimits(max_pairs=100, max_pairs_per_draft=2))  # fmt: skip
    server, port, store = create_server(config)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
        store.close()


def record(address: str, *triples: tuple[int, int, int]) -> None:
    events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in triples]
    with make_channel(address) as channel:
        memory_pb2_grpc.MemoryServiceStub(channel).RecordEvents(
            memory_pb2.RecordEventsRequest(namespace="ns", events=events, wait_durable=True),
            metadata=writer_metadata(TOKEN, "test"), timeout=30,
        )  # fmt: skip


def test_read_table_reports_what_the_per_draft_cap_evicted(address: str) -> None:
    record(address, (1, 10, 5), (1, 11, 3), (2, 20, 4))
    record(address, (1, 12, 1))  # a third target for draft 1: over its cap of 2, the lowest count goes
    table = read_table(address, "ns")
    assert sorted(table.pairs) == [(1, 10, 5), (1, 11, 3), (2, 20, 4)]  # all of them, past GetPairs' default cap
    assert len(fetch_pairs(address, "ns")) == 1  # what the default cap alone would have shown
    assert (table.recorded_events, table.table_events, table.dropped_events) == (13, 12, 1)
    assert table.max_pairs_per_draft == 2
    report = table_report(table)
    assert report["events"] == 12 and report["recorded_events"] == 13 and report["dropped_events"] == 1
    printed = format_concentration({"shipped": {"before": report, "after": report}})
    assert "1 of 13 recorded events dropped by the memory's caps (<= 2 targets per draft token" in printed


def test_read_table_of_an_untouched_namespace_is_empty(address: str) -> None:
    table = read_table(address, "never-written")
    assert table.pairs == [] and table.recorded_events == table.dropped_events == 0
