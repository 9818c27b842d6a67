"""The session registry of the model services: capacity, idle TTL, reaper (a fake clock, no sleeps)."""

from __future__ import annotations

import pytest

from calispec_core.errors import AlreadyExists, Cancelled, InvalidArgument, NotFound, ResourceExhausted
from calispec_core.sessions import SessionRegistry, SessionStats


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(max_sessions: int = 2, ttl: float = 10.0, busy: set[str] | None = None):
    clock = FakeClock()
    busy = busy if busy is not None else set()
    reg: SessionRegistry[str] = SessionRegistry(max_sessions, ttl, is_busy=lambda state: state in busy, clock=clock)
    return reg, clock


def test_idle_sessions_are_reaped_after_the_ttl_and_used_ones_are_kept() -> None:
    reg, clock = registry()
    reg.add("a", "a")
    reg.add("b", "b")
    clock.now += 6
    reg.get("a")  # a use resets the idle time
    clock.now += 6  # b idle 12 s > 10 s, a idle 6 s
    assert reg.reap() == ["b"]
    assert "a" in reg and "b" not in reg
    with pytest.raises(NotFound):
        reg.get("b")
    assert reg.stats() == SessionStats(open_sessions=1, max_sessions=2, idle_ttl_s=10.0, reaped_sessions=1)


def test_a_full_registry_of_abandoned_sessions_admits_new_ones() -> None:
    """The reported outage: clients vanished with their sessions open, every Prefill RESOURCE_EXHAUSTED."""
    reg, clock = registry()
    reg.add("abandoned-1", "x")
    reg.add("abandoned-2", "y")
    with pytest.raises(ResourceExhausted):
        reg.add("new", "z")
    clock.now += 10.5
    reg.add("new", "z")  # reaps first: no background thread needed for the limit to recover
    assert len(reg) == 1 and reg.stats().reaped_sessions == 2


def test_a_busy_session_is_never_reaped() -> None:
    busy = {"long-call"}
    reg, clock = registry(busy=busy)
    reg.add("s", "long-call")
    clock.now += 100
    assert reg.reap() == []
    busy.clear()
    clock.now += 6  # the call just ended: idle for 6 s, not since it started 106 s ago
    assert reg.reap() == []
    clock.now += 5
    assert reg.reap() == ["s"]


def test_ttl_zero_never_expires_and_bad_settings_are_refused() -> None:
    reg, clock = registry(ttl=0)
    reg.add("s", "s")
    clock.now += 1e9
    assert reg.reap() == [] and "s" in reg
    with pytest.raises(InvalidArgument):
        SessionRegistry(2, -1.0)
    with pytest.raises(InvalidArgument):
        SessionRegistry(0)


def test_duplicate_and_unknown_ids() -> None:
    reg, _ = registry()
    reg.add("s", "s")
    with pytest.raises(AlreadyExists):
        reg.add("s", "t")
    with pytest.raises(NotFound):
        reg.remove("nope")
    assert reg.remove("s") == "s" and len(reg) == 0


def test_a_prefill_in_flight_holds_its_slot_and_its_id() -> None:
    """Concurrent Prefills for the last slot (or one id) used to all compute a KV cache; all but one were
    refused only afterwards, having held the memory of every one."""
    reg, _ = registry(max_sessions=2)
    reg.add("open", "x")
    with reg.opening("first") as open_first:
        with pytest.raises(ResourceExhausted), reg.opening("second"):  # refused before its prefill computes
            pytest.fail("a second prefill ran for the last slot")
        with pytest.raises(AlreadyExists), reg.opening("open"):
            pytest.fail("a prefill ran for an open session's id")
        open_first("y")
    assert reg.get("first") == "y" and len(reg) == 2


def test_a_prefill_that_fails_frees_its_slot_and_its_id() -> None:
    reg, _ = registry(max_sessions=1)
    with pytest.raises(MemoryError), reg.opening("s"):
        raise MemoryError("the prefill ran out of memory")
    with reg.opening("s") as open_session:  # nothing left claimed
        open_session("t")
    assert reg.get("s") == "t"


def test_a_claim_becomes_the_session_once() -> None:
    reg, _ = registry(max_sessions=2)
    with reg.opening("s") as open_session:
        assert len(reg) == 1 and reg.stats().open_sessions == 1  # a prefill in flight holds its slot
        open_session("x")
        assert len(reg) == 1  # one slot, not two, between opening and the block's end
        with pytest.raises(InvalidArgument, match="opened twice"):
            open_session("y")
    with pytest.raises(InvalidArgument, match="after its prefill"):
        open_session("z")
    assert reg.get("s") == "x" and len(reg) == 1


def test_a_close_while_the_prefill_computes_drops_the_session_when_it_ends() -> None:
    """Its client gave up waiting and closed it: it used to be NOT_FOUND, and the session, opened a moment
    later, held its slot and KV cache until its TTL."""
    reg, _ = registry(max_sessions=1)
    with pytest.raises(Cancelled, match="closed while its prefill"), reg.opening("s") as open_session:
        assert reg.remove("s") is None  # accepted: nothing to hand back yet
        with pytest.raises(NotFound, match="closed while its prefill computed"):
            reg.remove("s")  # a second Close: it answered OK again (found by probing)
        open_session("kv")
    assert "s" not in reg and len(reg) == 0
    with pytest.raises(NotFound):
        reg.remove("s")
    reg.add("s", "again")  # the id and the slot are free
    assert reg.get("s") == "again"


def test_an_opened_prefill_leaves_a_later_claim_of_its_id_alone() -> None:
    """Opened, closed and claimed again by another Prefill, all before the first one's block ends."""
    reg, _ = registry(max_sessions=2)
    with reg.opening("s") as open_first:
        open_first("first")
        reg.remove("s")
        second = reg.opening("s")
        open_second = second.__enter__()
    assert len(reg) == 1  # the second claim still holds its slot
    open_second("second")
    second.__exit__(None, None, None)
    assert reg.get("s") == "second" and len(reg) == 1


def test_the_draft_refuses_a_prefill_for_the_last_slot_before_computing_it(draft_runner, monkeypatch) -> None:
    """The service-level claim: a second Prefill while the first computes is refused at once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from calispec_core.sampling import SamplingConfig
    from calispec_core.timing import Stopwatch
    from draft_service import proposer as proposer_module
    from draft_service.proposer import Proposer

    real, computing, release = proposer_module.prefill_session, threading.Event(), threading.Event()
    computed: list[str] = []

    def prefill_session(runner, session_id, token_ids, cache, **options):
        computed.append(session_id)
        if session_id == "first":
            computing.set()
            release.wait()
        return real(runner, session_id, token_ids, cache, **options)

    monkeypatch.setattr(proposer_module, "prefill_session", prefill_session)
    proposer = Proposer(draft_runner, max_sessions=1)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(proposer.prefill, "first", [1, 2, 3], SamplingConfig(), Stopwatch())
            assert computing.wait(60)
            try:
                with pytest.raises(ResourceExhausted):
                    proposer.prefill("second", [1, 2, 3], SamplingConfig(), Stopwatch())
                with pytest.raises(AlreadyExists):
                    proposer.prefill("first", [1, 2, 3], SamplingConfig(), Stopwatch())
            finally:
                release.set()
            first.result()
        assert computed == ["first"] and "first" in proposer.sessions
    finally:
        proposer.stop()


def test_a_close_that_arrives_before_its_prefill_cancels_the_prefill() -> None:
    """The Prefill still on its way (queued for a worker) when its client gave up and closed it: the Close was
    NOT_FOUND, and the session, opened a moment later, held its slot and KV cache until its TTL."""
    reg, _ = registry(max_sessions=1)
    with pytest.raises(NotFound):  # the registry cannot tell it from an id that never existed
        reg.remove("late")
    with pytest.raises(Cancelled, match="closed before its prefill arrived"), reg.opening("late"):
        pytest.fail("a prefill computed for a session closed before it arrived")
    assert "late" not in reg and len(reg) == 0
    reg.add("late", "again")  # one Close cancels one Prefill: the id and the slot are free
    assert reg.get("late") == "again"


def test_an_early_close_is_remembered_for_one_ttl_among_the_latest_ones(monkeypatch) -> None:
    from calispec_core import sessions

    monkeypatch.setattr(sessions, "RECENT_IDS_KEPT", 2)
    reg, clock = registry(max_sessions=4, ttl=10.0)
    for sid in ("a", "b", "c"):
        with pytest.raises(NotFound):
            reg.remove(sid)
    for sid in ("", "x" * 300):  # ids no Prefill accepts: refused, not kept
        with pytest.raises(InvalidArgument):
            reg.remove(sid)
    reg.add("a", "a")  # pushed out by the later two
    with pytest.raises(Cancelled), reg.opening("b"):
        pytest.fail("b's Close was forgotten")
    clock.now += 10.5  # c's Close is older than a TTL: a session opened now lives at most a TTL anyway
    reg.add("c", "c")
    assert reg.get("c") == "c"


def test_a_second_close_does_not_cancel_a_later_prefill_of_the_id() -> None:
    """A client that reuses its ids: the session it closed twice is no Prefill on its way."""
    reg, clock = registry(ttl=10.0)
    reg.add("s", "first")
    reg.remove("s")
    with pytest.raises(NotFound):
        reg.remove("s")
    reg.add("s", "second")
    clock.now += 10.5  # reaped: a Close after that is a second one as well
    assert reg.reap() == ["s"]
    with pytest.raises(NotFound):
        reg.remove("s")
    reg.add("s", "third")
    assert reg.get("s") == "third"


@pytest.mark.parametrize("session_id", ["", "A" * 129, "A" * 20_000])
def test_an_id_no_prefill_accepts_is_invalid_argument_not_looked_up(session_id: str) -> None:
    """NotFound quoted the id whole, in a header: an id of 16 KB failed as RESOURCE_EXHAUSTED "metadata size
    exceeds hard limit" (found by probing)."""
    reg, _ = registry()
    for call in (reg.get, reg.remove, lambda sid: reg.add(sid, "kv")):
        with pytest.raises(InvalidArgument, match=f"session_id must be 1-128 characters, got {len(session_id)}$"):
            call(session_id)
    assert session_id not in reg._ended  # a refused claim was noted among the ended ids (found by review)
