"""The calibration's MemoryWriter against a real memory service: a lost reply is retried as the same write."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import grpc
import pytest

from calispec_tools.calibrate import sink
from calispec_tools.calibrate.sink import MemoryWriter
from tests.service.test_memory_link import TOKEN, CodesSeen, LoseFirstReply, start_memory


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


def test_a_write_the_service_never_admits_is_raised_at_once_one_it_admits_later_is_resent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every RESOURCE_EXHAUSTED was retried, a write over the writer's burst (no pushback: never admitted) for the
    whole 120 s (found by probing); a refusal with a pushback (the writer's rate) is sent again after its wait."""
    memory = start_memory(tmp_path / "memory.db", burst=5, rate=20)  # 5 events refill in 0.25 s
    try:
        writer = MemoryWriter(f"127.0.0.1:{memory.port}", "ns", TOKEN, vocab_size=100)
        stub = CodesSeen(writer._stub)
        writer._stub = stub  # type: ignore[assignment]
        with pytest.raises(grpc.RpcError) as info:
            writer._record([((1, d + 2), 1) for d in range(6)], durable=True, timeout_s=5)  # over the burst of 5
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "never admitted" in info.value.details()
        assert len(stub.codes) == 1  # raised at once
        writer._record([((1, d + 2), 1) for d in range(5)], durable=True, timeout_s=120)  # the whole burst
        writer._record([((2, d + 3), 1) for d in range(5)], durable=True, timeout_s=120)  # over the rate: a pushback
        assert stub.codes[1:] == [grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OK]
        assert memory.store.stats("ns")[0] == 10
        writer.close()
    finally:
        memory.stop()
