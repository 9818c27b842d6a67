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


def test_one_probe_at_a_time_even_when_it_outlasts_the_backoff() -> None:
    """A hung draft answers a probe only at its call timeout (10 s) while the backoff is 0.5 s: each
    backoff period used to let one more request probe it, and stall, before the first had reported."""
    clock = Clock()
    circuit = CircuitBreaker(backoff_s=0.5, max_backoff_s=10.0, clock=clock, probe_expiry_s=60.0)
    circuit.failed()
    clock.now = 0.5
    assert circuit.allow()  # the probe, now hanging
    for clock.now in (1.0, 5.0, 10.0):
        assert not circuit.allow()
    circuit.failed()  # its timeout: backoff doubles to 1 s
    clock.now = 11.0
    assert circuit.allow()  # the next probe
    clock.now = 71.5
    assert circuit.allow()  # a probe that never reported is given up on after probe_expiry_s
    circuit.succeeded()
    assert circuit.allow() and circuit.allow()


def test_a_probe_given_up_before_its_call_lets_the_next_caller_probe() -> None:
    clock = Clock()
    circuit = CircuitBreaker(backoff_s=1.0, clock=clock)
    circuit.failed()
    clock.now = 1.0
    assert circuit.allow() and not circuit.allow()  # one probe in flight
    circuit.give_up_probe()  # its request ended before the call
    assert circuit.allow() and circuit.is_open  # the next caller probes at once; still open until it reports
    circuit.succeeded()
    circuit.give_up_probe()  # closed: nothing to give up
    assert circuit.allow() and not circuit.is_open
