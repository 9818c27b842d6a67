"""One client can never fail another's request, and a failed round leaves its session untouched.

Rounds run on the real TargetEngine with the tiny target; sessions are made to share a batch by
holding the scheduler on a first lone round until the others have queued behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from calispec_core.generation import Mode
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from target_service.engine import RescueConfig, TargetEngine, VerifyResult
from target_service.pair_table import PairTable
from tests.helpers import reference_greedy, wait_until

PROMPT = [5, 17, 42, 8, 99]
HOLDER = "holder"


class SwitchableTable(PairTable):
    """The real pair table, whose lookups can be made to fail (a fault inside verification)."""

    failing = False

    def counts(self, draft_ids: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        if self.failing:
            raise RuntimeError("memory lookup failed")
        return super().counts(draft_ids, target_ids)


@pytest.fixture
def engine(target_runner: ModelRunner) -> Iterator[TargetEngine]:
    table = SwitchableTable(target_runner.vocab_size, target_runner.device)
    engine = TargetEngine(target_runner, max_sessions=16, table=table, max_batch=8)
    prefill(engine, HOLDER)
    yield engine
    engine.stop()


def prefill(engine: TargetEngine, sid: str, mode: Mode = Mode.SD, **sampling: float) -> None:
    engine.prefill(sid, PROMPT, SamplingConfig(**sampling), RescueConfig(mode), Stopwatch())


def verify(engine: TargetEngine, sid: str, draft: list[int], probs: torch.Tensor | None = None) -> VerifyResult:
    return engine.verify(sid, draft, probs, Stopwatch())


def one_batch(engine: TargetEngine, calls: Sequence[Callable[[], VerifyResult]]) -> list[VerifyResult | Exception]:
    """Run `calls` concurrently as one batched round (each returns its result or its error)."""
    scheduler = engine.scheduler
    step, entered, release = scheduler._step, threading.Event(), threading.Event()

    def held(rows: Sequence) -> list:  # the holder's lone round waits until every call has queued
        if not entered.is_set():
            entered.set()
            release.wait(timeout=60)
        return step(rows)

    scheduler._step = held
    outcomes: list[VerifyResult | Exception] = [RuntimeError("never ran")] * len(calls)

    def run(i: int) -> None:
        try:
            outcomes[i] = calls[i]()
        except Exception as exc:
            outcomes[i] = exc

    holder = threading.Thread(target=verify, args=(engine, HOLDER, []))
    holder.start()
    assert entered.wait(timeout=60)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    wait_until(lambda: scheduler._queue.qsize() == len(calls))
    release.set()
    for t in [holder, *threads]:
        t.join(timeout=60)
    scheduler._step = step
    return outcomes


def snapshot(engine: TargetEngine, sid: str) -> tuple[list[int], int]:
    session = engine.sessions.get(sid).session
    return list(session.tokens), session.cached_len


def test_a_client_sending_a_tiny_temperature_fails_nobody(engine: TargetEngine, target_runner: ModelRunner) -> None:
    truth = reference_greedy(target_runner, PROMPT, 4)
    prefill(engine, "tiny", temperature=1e-45, seed=3)
    for sid in ("h1", "h2"):
        prefill(engine, sid)
    emitted: dict[str, list[int]] = {"tiny": [], "h1": [], "h2": []}
    for _ in range(2):  # the second round once failed on the out-of-vocabulary token the first committed
        calls = [lambda sid=sid: verify(engine, sid, []) for sid in emitted]
        for sid, outcome in zip(emitted, one_batch(engine, calls), strict=True):
            assert isinstance(outcome, VerifyResult), outcome
            assert outcome.batch_size == 3
            emitted[sid].append(outcome.next_token)
    assert emitted == {sid: truth[:2] for sid in emitted}  # a tiny temperature decodes greedily


def test_a_row_whose_verification_raises_fails_only_its_own_request(
    engine: TargetEngine, target_runner: ModelRunner
) -> None:
    truth = reference_greedy(target_runner, PROMPT, 4)
    prefill(engine, "csd", mode=Mode.CSD)  # only CSD rows look up the memory
    for sid in ("sd1", "sd2"):
        prefill(engine, sid)
    before = snapshot(engine, "csd")
    engine.table.failing = True
    calls = [lambda sid=sid: verify(engine, sid, truth[:2]) for sid in ("csd", "sd1", "sd2")]
    failed, *honest = one_batch(engine, calls)
    assert isinstance(failed, RuntimeError) and "memory lookup failed" in str(failed)
    for result in honest:
        assert isinstance(result, VerifyResult), result
        assert (result.accepted_count, result.next_token) == (2, truth[2])
    assert snapshot(engine, "csd") == before  # the failed request changed nothing
    engine.table.failing = False
    result = verify(engine, "csd", truth[:2])
    assert (result.accepted_count, result.next_token) == (2, truth[2])


def test_a_lone_round_that_raises_leaves_cache_tokens_and_randomness_as_they_were(
    engine: TargetEngine, target_runner: ModelRunner
) -> None:
    vocab = target_runner.vocab_size
    uniform = torch.full((2, vocab), 1.0 / vocab)
    for sid in ("failed", "twin"):
        prefill(engine, sid, mode=Mode.CSD, temperature=1.0, seed=11)
    before = snapshot(engine, "failed")
    engine.table.failing = True
    with pytest.raises(RuntimeError, match="memory lookup failed"):
        verify(engine, "failed", [1, 2], uniform)
    assert snapshot(engine, "failed") == before  # the lone forward extended the cache: cropped back
    engine.table.failing = False
    results = [verify(engine, sid, [1, 2], uniform) for sid in ("failed", "twin")]
    assert results[0] == results[1]  # same seed, same draws: the failed round consumed no randomness
    assert snapshot(engine, "failed") == snapshot(engine, "twin")


def layer_lengths(engine: TargetEngine, sid: str) -> list[int]:
    return [layer.get_seq_length() for layer in engine.sessions.get(sid).session.cache.layers]


@pytest.mark.parametrize("batched", [False, True], ids=["lone", "batched"])
def test_a_forward_that_raises_part_of_the_way_through_leaves_every_layer_as_it_was(
    engine: TargetEngine, target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    """Caches grow in place, layer by layer: a fault in the second layer leaves the first extended. The
    undo used to crop every layer by the first one's excess, cutting real entries out of the others."""
    truth = reference_greedy(target_runner, PROMPT, 4)
    assert len(target_runner.model.model.layers) >= 2
    sids = ("faulty", "other") if batched else ("faulty",)
    for sid in sids:
        prefill(engine, sid)
    before = {sid: layer_lengths(engine, sid) for sid in sids}

    projection = target_runner.model.model.layers[1].self_attn.k_proj
    original, forwards = projection.forward, []

    def broken(hidden: torch.Tensor) -> torch.Tensor:
        forwards.append(1)
        if batched and len(forwards) == 1:
            return original(hidden)  # the holder's lone round (one_batch) goes through
        raise RuntimeError("out of memory")

    monkeypatch.setattr(projection, "forward", broken)
    calls = [lambda sid=sid: verify(engine, sid, truth[:2]) for sid in sids]
    outcomes = one_batch(engine, calls) if batched else [_raises(calls[0])]
    assert all(isinstance(o, RuntimeError) and "out of memory" in str(o) for o in outcomes)
    assert {sid: layer_lengths(engine, sid) for sid in sids} == before
    monkeypatch.undo()
    for sid in sids:
        result = verify(engine, sid, truth[:2])
        assert (result.accepted_count, result.next_token) == (2, truth[2])
        assert verify(engine, sid, [truth[3]]).accepted_count == 1


def _raises(call: Callable[[], VerifyResult]) -> Exception:
    with pytest.raises(RuntimeError) as info:
        call()
    return info.value
