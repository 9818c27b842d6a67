"""CircuitBreaker: skip a failed backend, probe it once per backoff, close on success."""

from __future__ import annotations

from coordinator.circuit import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_closed_until_a_failure_then_one_probe_per_backoff() -> None:
    clock = Clock()
    circuit = CircuitBreaker(backoff_s=1.0, max_backoff_s=3.0, clock=clock)
    assert circuit.allow() and circuit.allow() and not circuit.is_open
    circuit.failed()
    assert circuit.is_open and not circuit.allow()
    clock.now = 1.0
    assert circuit.allow()  # the probe
    assert not circuit.allow()  # everyone else keeps skipping while it runs
    circuit.failed()  # failed probe: backoff doubles to 2 s
    clock.now = 2.5
    assert not circuit.allow()
    clock.now = 3.0
    assert circuit.allow()
    circuit.failed()  # doubles again, capped at 3 s
    clock.now = 5.9
    assert not circuit.allow()
    clock.now = 6.0
    assert circuit.allow()
    circuit.succeeded()
    assert not circuit.is_open and circuit.allow() and circuit.allow()


def test_failures_of_calls_already_in_flight_do_not_stretch_the_backoff() -> None:
    clock = Clock()
    circuit = CircuitBreaker(backoff_s=1.0, max_backoff_s=30.0, clock=clock)
    for _ in range(5):  # five requests were mid-call when the backend died
        circuit.failed()
    clock.now = 1.0
    assert circuit.allow()


def test_success_resets_the_backoff() -> None:
    clock = Clock()
    circuit = CircuitBreaker(backoff_s=1.0, max_backoff_s=30.0, clock=clock)
    circuit.failed()
    clock.now = 1.0
    assert circuit.allow()
    circuit.failed()  # backoff now 2 s
    clock.now = 3.0
    assert circuit.allow()
    circuit.succeeded()
    circuit.failed()
    clock.now = 4.0
    assert circuit.allow()  # back to 1 s
