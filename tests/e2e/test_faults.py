"""SIGKILL each service in turn under load through the SDK: every request ends correctly, the stack recovers.

For each service (draft, one of two targets, memory, coordinator): a few SDK clients send
greedy sd/csd requests in a loop; the service is killed, stays dead for a while, and is
restarted on its old port. Every request must finish or get a clear status before its
deadline (DEADLINE_EXCEEDED would mean something hung), greedy `sd` output must equal the
target's own (no token lost or repeated by a failover), new requests must succeed after the
restart, and no draft or target session may stay open afterwards (those of a killed
coordinator expire after the idle TTL). Run with `-s` to see the figures:

    .venv/bin/python -m pytest -m slow tests/e2e/test_faults.py -s
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from calispec.client import CalispecClient, CalispecRpcError
from calispec.v1 import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from calispec_core.grpc_server import make_channel
from calispec_tools.stack import LocalStack, StackConfig
from tests.conftest import TinyPair
from tests.helpers import ports_outside_the_ephemeral_range, wait_until

pytestmark = pytest.mark.slow

PROMPTS = ["def fibonacci(n):", "Question: what is 12 plus 30?", "The robot counted", "zebra quantum xylophone"]
KWARGS = {"max_new_tokens": 24, "num_speculative_tokens": 4}
CLIENTS = 4
REQUEST_TIMEOUT_S = 30.0
MAX_REQUESTS_PER_STAGE = 40  # per client; bounds the load while requests are instant (coordinator down)
RECOVERY_TIMEOUT_S = 90.0  # restart (model load on a busy machine) plus the draft's probe backoff
SESSION_IDLE_TTL_S = 3.0  # sessions a killed coordinator left behind are reaped after this
SERVED = ("ok", "degraded")

# when a request started: before the kill, while the service was dead, after its restart, after a
# request was fully served again (for the draft: with speculation)
BEFORE, DOWN, RESTARTED, RECOVERED = STAGES = ("before", "down", "restarted", "recovered")


@dataclass(frozen=True)
class Outcome:
    stage: str
    prompt: str
    mode: str
    status: str  # "ok", "degraded" (served despite the failure: see GenerationStats.degraded) or a gRPC code
    token_ids: tuple[int, ...] = ()


class Load:
    """CLIENTS SDK clients, each in its own thread, sending requests until stopped."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.stage = BEFORE
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # stage changed or stopping
        self._stopping = False
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()  # every request has a deadline, so this ends

    def count(self, stage: str, statuses: tuple[str, ...] | None = None) -> int:
        with self._lock:
            return sum(o.stage == stage and (statuses is None or o.status in statuses) for o in self.outcomes)

    def set_stage(self, stage: str) -> None:
        with self._changed:
            self.stage = stage
            self._changed.notify_all()

    def _client(self, index: int) -> None:
        sent: Counter[str] = Counter()
        with CalispecClient(self.address, timeout=REQUEST_TIMEOUT_S) as client:
            while (stage := self._next_stage(sent)) is not None:
                n = sent.total()
                sent[stage] += 1
                outcome = self._one(client, stage, PROMPTS[(index + n) % len(PROMPTS)], ("sd", "csd")[n % 2])
                with self._lock:
                    self.outcomes.append(outcome)

    def _next_stage(self, sent: Counter[str]) -> str | None:
        """The stage to send the next request in, once this client has room in it; None when stopping."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopping or sent[self.stage] < MAX_REQUESTS_PER_STAGE)
            return None if self._stopping else self.stage

    def _one(self, client: CalispecClient, stage: str, prompt: str, mode: str) -> Outcome:
        try:
            result = client.generate(prompt, mode=mode, **KWARGS)
        except CalispecRpcError as exc:
            return Outcome(stage, prompt, mode, exc.code)
        status = "degraded" if result.stats.degraded else "ok"
        return Outcome(stage, prompt, mode, status, tuple(result.token_ids))


@pytest.fixture(scope="module")
def stack(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("faults")
    # restarted on their ports: free ports of port 0's range could be taken meanwhile (tests/helpers.py)
    coordinator, target, draft, memory = ports_outside_the_ephemeral_range(1, 2, 1, 1)
    config = StackConfig(
        draft_model=tiny_pair.draft, target_model=tiny_pair.target, memory_db=tmp / "memory.db",
        log_dir=tmp / "logs", coordinator_port=coordinator, target_port=target, draft_port=draft, memory_port=memory,
        dtype="float32", device="cpu", memory_sync_interval_s=0.1, start_timeout_s=120, target_replicas=2,
        session_idle_ttl_s=SESSION_IDLE_TTL_S,
    )  # fmt: skip
    with LocalStack(config) as s:
        yield s


@pytest.fixture(scope="module")
def reference(stack: LocalStack) -> dict[str, tuple[int, ...]]:
    """The target's greedy output per prompt (mode ar: the draft plays no part)."""
    with CalispecClient(stack.coordinator_address, timeout=REQUEST_TIMEOUT_S) as client:
        return {p: tuple(client.generate(p, mode="ar", **KWARGS).token_ids) for p in PROMPTS}


def fully_served(client: CalispecClient) -> bool:
    """One request served without degradation (so for the draft: with speculation again)."""
    try:
        return not client.generate(PROMPTS[0], mode="sd", **KWARGS).stats.degraded
    except CalispecRpcError:
        return False


def kill_under_load(stack: LocalStack, name: str) -> list[Outcome]:
    """Kill `name` while clients send requests, restart it on its port, wait until requests are fully served."""
    with Load(stack.coordinator_address) as load, CalispecClient(stack.coordinator_address, REQUEST_TIMEOUT_S) as probe:
        try:
            wait_until(lambda: load.count(BEFORE, SERVED) >= CLIENTS, timeout_s=REQUEST_TIMEOUT_S)
            load.set_stage(DOWN)
            stack.kill_service(name)
            wait_until(lambda: load.count(DOWN) >= 2 * CLIENTS, timeout_s=2 * REQUEST_TIMEOUT_S)
            stack.restart_service(name)
            load.set_stage(RESTARTED)
            wait_until(lambda: fully_served(probe), timeout_s=RECOVERY_TIMEOUT_S)
            load.set_stage(RECOVERED)
            wait_until(lambda: load.count(RECOVERED) >= 2 * CLIENTS, timeout_s=2 * REQUEST_TIMEOUT_S)
        finally:
            report(name, load.outcomes)  # also when it did not recover: what the clients saw
    wait_until(lambda: open_sessions(stack) == 0, timeout_s=10 * SESSION_IDLE_TTL_S)
    return load.outcomes


def open_sessions(stack: LocalStack) -> int:
    """Sessions open on the draft and every target replica (GetStats)."""
    total = 0
    with make_channel(stack.services["draft_service"].address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        total += stub.GetStats(draft_pb2.DraftStatsRequest(), timeout=10).sessions.open_sessions
    for name in stack.target_names:
        with make_channel(stack.services[name].address) as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            total += stub.GetStats(target_pb2.TargetStatsRequest(), timeout=10).sessions.open_sessions
    return total


def report(name: str, outcomes: list[Outcome]) -> None:
    """One line per stage: the figures for the README."""
    for stage in STAGES:
        counts = Counter(o.status for o in outcomes if o.stage == stage)
        failed = ", ".join(f"{code} {n}" for code, n in sorted(counts.items()) if code not in SERVED) or "none"
        print(
            f"fault {name:<17} requests started {stage:<9}: ok {counts['ok']:>3}, "
            f"degraded {counts['degraded']:>3}, failed: {failed}"
        )


def check_served(outcomes: list[Outcome], reference: dict[str, tuple[int, ...]]) -> None:
    for o in outcomes:
        assert o.status in SERVED, o
        if o.mode == "sd":  # lossless: a failover may neither lose nor repeat a token
            assert o.token_ids == reference[o.prompt], o


def test_draft_killed(stack: LocalStack, reference: dict[str, tuple[int, ...]]) -> None:
    outcomes = kill_under_load(stack, "draft_service")
    check_served(outcomes, reference)
    assert all(o.status == "degraded" for o in outcomes if o.stage == DOWN)  # target-only while it was dead
    assert all(o.status == "ok" for o in outcomes if o.stage == RECOVERED)  # speculating again


def test_one_of_two_targets_killed(stack: LocalStack, reference: dict[str, tuple[int, ...]]) -> None:
    outcomes = kill_under_load(stack, "target_service:1")
    check_served(outcomes, reference)
    assert any(o.status == "degraded" for o in outcomes)  # some requests moved to the other replica


def test_memory_killed(stack: LocalStack, reference: dict[str, tuple[int, ...]]) -> None:
    outcomes = kill_under_load(stack, "memory_service")
    check_served(outcomes, reference)
    # what a SIGKILLed memory service may lose (its last group commit) is tested in tests/service/test_memory_crash.py


def test_coordinator_killed(stack: LocalStack, reference: dict[str, tuple[int, ...]]) -> None:
    outcomes = kill_under_load(stack, "coordinator")
    down = [o for o in outcomes if o.stage == DOWN]
    assert down and all(o.status == "UNAVAILABLE" for o in down)  # a clear status, at once, while it is dead
    check_served([o for o in outcomes if o.stage == RECOVERED], reference)
    # in flight at the kill, or sent while the clients reconnect: served or UNAVAILABLE, never a hang
    assert {o.status for o in outcomes if o.stage in (BEFORE, RESTARTED)} <= {*SERVED, "UNAVAILABLE"}


def test_the_restarted_stack_speculates_again(stack: LocalStack, reference: dict[str, tuple[int, ...]]) -> None:
    with CalispecClient(stack.coordinator_address, timeout=REQUEST_TIMEOUT_S) as client:
        for prompt in PROMPTS:
            result = client.generate(prompt, mode="sd", **KWARGS)
            assert tuple(result.token_ids) == reference[prompt] and not result.stats.degraded
            assert result.stats.drafted > 0
