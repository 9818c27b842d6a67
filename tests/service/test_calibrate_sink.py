"""The calibration's MemoryWriter against a real memory service: a lost reply is retried as the same write."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from calispec_tools.calibrate import sink
from calispec_tools.calibrate.sink import MemoryWriter
from tests.service.test_memory_link import TOKEN, LoseFirstReply, start_memory


def test_a_write_whose_reply_was_lost_is_retried_with_its_id_and_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before write ids the writer gave up on the first lost reply (a calibration of hours failed at its end)."""
    monkeypatch.setattr(sink, "RETRY_S", 0.0)
    memory = start_memory(tmp_path / "memory.db")
    try:
        writer = MemoryWriter(f"127.0.0.1:{memory.port}", "ns", TOKEN, vocab_size=100)
        stub = LoseFirstReply(writer._stub)
        writer._stub = stub  # type: ignore[assignment]
        writer.send(Counter({(1, 2): 3, (4, 5): 1}))
        writer.close()  # the held batch, durably: its first reply is lost, the retry is the same write
        first, retry = stub.requests
        assert retry == first and first.write_id
        assert writer.recorded == 4
        assert memory.store.stats("ns")[0] == 4
    finally:
        memory.stop()
