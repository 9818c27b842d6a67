"""`calispec_tools/bench/rpc_floor.py`: the bare round trips `bench compare` prints beside its overhead."""

from __future__ import annotations

from calispec_tools.bench import rpc_floor
from calispec_tools.bench.compare import format_report
from tests.service.conftest import ModelServices


def test_the_median_is_over_the_timed_calls_each_after_the_idle_gap(monkeypatch) -> None:
    clock = iter(range(1000))
    slept: list[float] = []
    monkeypatch.setattr(rpc_floor.time, "perf_counter", lambda: next(clock) / 1000)  # every read 1 ms later
    monkeypatch.setattr(rpc_floor.time, "sleep", slept.append)
    calls: list[int] = []
    ms = rpc_floor.median_round_trip_ms(lambda: calls.append(1), idle_s=0.03, calls=5)
    assert ms == 1.0  # start and end reads are 1 ms apart; the warm-up calls are not timed
    assert len(calls) == rpc_floor.WARM_UP + 5
    assert slept == [0.03] * 5
    slept.clear()
    rpc_floor.median_round_trip_ms(lambda: None, idle_s=0.0, calls=5)
    assert slept == []  # back to back


def test_model_service_floors_time_each_service_both_ways(model_services: ModelServices) -> None:
    floors = rpc_floor.model_service_floors(model_services.draft_address, model_services.target_address, calls=2)
    assert set(floors) == {"draft", "target"}
    for floor in floors.values():
        assert set(floor) == {"back_to_back_ms", "after_idle_ms"}
        assert all(ms > 0 for ms in floor.values())


def test_transport_floors_time_grpc_and_raw_tcp_against_servers_in_other_processes() -> None:
    import asyncio

    asyncio.run(asyncio.sleep(0))  # as an earlier test may have: the main thread has no current loop now
    floors = rpc_floor.transport_floors(calls=2)
    assert set(floors) == {"grpc unary", "grpc stream", "grpc aio", "raw tcp"}
    assert all(ms > 0 for floor in floors.values() for ms in floor.values())


def test_the_compare_report_prints_the_floors_under_the_overhead_column() -> None:
    floors = {"draft": {"back_to_back_ms": 1.0, "after_idle_ms": 2.5}, "target": {"back_to_back_ms": 1.25,
              "after_idle_ms": 3.0}}  # fmt: skip
    report = format_report({"dtype": "float32"}, {}, {}, {}, floors)
    assert "bare round trip (ms back to back / after 30 ms idle): draft 1.00 / 2.50, target 1.25 / 3.00" in report
    assert "bare round trip" not in format_report({"dtype": "float32"}, {}, {}, {})
