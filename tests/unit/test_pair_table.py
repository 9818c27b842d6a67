"""The verifier-side correction-memory table: lookups, and no event lost or counted twice."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import torch

from calispec_core.errors import InvalidArgument
from target_service.pair_table import NO_SNAPSHOT, FlushBatch, PairTable

VOCAB = 5
ALL_PAIRS = [(d, t) for d in range(VOCAB) for t in range(VOCAB)]


def _count(table: PairTable, draft: int, target: int) -> int:
    return int(table.counts(torch.tensor([draft]), torch.tensor([target]))[0])


def _table_counts(table: PairTable) -> Counter[tuple[int, int]]:
    drafts, targets = zip(*ALL_PAIRS, strict=True)
    counts = table.counts(torch.tensor(drafts), torch.tensor(targets)).tolist()
    return Counter({pair: c for pair, c in zip(ALL_PAIRS, counts, strict=True) if c})


def _add(table: PairTable, events: list[tuple[int, int]]) -> None:
    table.add_local(torch.tensor([d for d, _ in events]), torch.tensor([t for _, t in events]))


def test_lookup_known_unknown_and_out_of_vocabulary_pairs() -> None:
    table = PairTable(VOCAB)
    assert table.version == NO_SNAPSHOT
    assert table.counts(torch.tensor([1]), torch.tensor([2])).tolist() == [0]  # empty table
    assert table.replace_snapshot([(1, 2, 7), (3, 0, 2), (1, 2, 1)], version=4)  # duplicates add up
    draft = torch.tensor([[1, 3], [2, -1], [VOCAB, 1]])  # any shape
    target = torch.tensor([[2, 0], [2, 2], [2, VOCAB]])
    assert table.counts(draft, target).tolist() == [[8, 2], [0, 0], [0, 0]]
    assert table.version == 4


def test_snapshot_from_tensors() -> None:
    table = PairTable(VOCAB)
    table.replace_snapshot((torch.tensor([4, 0]), torch.tensor([4, 1]), torch.tensor([9, 3])), version=1)
    assert _table_counts(table) == Counter({(4, 4): 9, (0, 1): 3})


def test_pairs_outside_the_vocabulary_are_skipped_and_counted_not_fatal() -> None:
    """One bad pair in the shared memory must not cost a verifier the rest of the table."""
    table = PairTable(VOCAB)
    assert table.replace_snapshot([(1, 2, 7), (VOCAB, 0, 1), (0, 2**32 - 1, 5), (3, 4, 2)], version=1)
    assert _table_counts(table) == Counter({(1, 2): 7, (3, 4): 2})
    assert table.stats().skipped_pairs == 2
    assert table.stats().snapshot_pairs == 2
    assert table.replace_snapshot([(1, 2, 8)], version=2)  # a clean snapshot clears the figure
    assert table.stats().skipped_pairs == 0


def test_bad_input_is_rejected() -> None:
    table = PairTable(VOCAB)
    with pytest.raises(InvalidArgument):
        table.replace_snapshot([(0, 0, -1)], version=1)
    with pytest.raises(InvalidArgument):
        _add(table, [(0, -1)])
    with pytest.raises(InvalidArgument):
        table.mark_flushed(99, version=1)


def test_local_events_count_at_once() -> None:
    table = PairTable(VOCAB)
    table.replace_snapshot([(1, 2, 3)], version=1)
    _add(table, [(1, 2), (1, 2), (0, 4)])
    assert _table_counts(table) == Counter({(1, 2): 5, (0, 4): 1})
    _add(table, [])  # no events: nothing changes
    assert table.stats().local_events == 3


def test_acknowledged_batch_is_dropped_when_a_covering_snapshot_arrives() -> None:
    table = PairTable(VOCAB)
    _add(table, [(1, 2), (1, 2), (3, 4)])
    batch = table.take_unflushed()
    assert isinstance(batch, FlushBatch)
    assert sorted(batch.pairs()) == [(1, 2, 2), (3, 4, 1)]
    assert table.take_unflushed() is None  # nothing new
    table.mark_flushed(batch.batch_id, version=3)
    table.replace_snapshot([(0, 0, 1)], version=2)  # older than the ack: the batch stays local
    assert _table_counts(table) == Counter({(1, 2): 2, (3, 4): 1, (0, 0): 1})
    table.replace_snapshot([(0, 0, 1), (1, 2, 2), (3, 4, 1)], version=3)
    assert _table_counts(table) == Counter({(1, 2): 2, (3, 4): 1, (0, 0): 1})
    assert table.stats().local_events == 0


def test_ack_after_the_covering_snapshot_heals_the_transient_double_count() -> None:
    table = PairTable(VOCAB)
    _add(table, [(1, 2)])
    batch = table.take_unflushed()
    assert batch is not None and table.in_flight()
    table.replace_snapshot([(1, 2, 1)], version=1)  # the service recorded it; the ack is still on its way
    assert _count(table, 1, 2) == 2  # the documented transient
    table.mark_flushed(batch.batch_id, version=1)
    assert _count(table, 1, 2) == 1 and not table.in_flight()


def test_failed_send_returns_events_to_the_next_flush() -> None:
    table = PairTable(VOCAB)
    _add(table, [(1, 2)])
    first = table.take_unflushed()
    assert first is not None
    _add(table, [(1, 2), (2, 3)])
    table.mark_failed(first.batch_id)
    assert _count(table, 1, 2) == 2  # still counted
    second = table.take_unflushed()
    assert second is not None and sorted(second.pairs()) == [(1, 2, 2), (2, 3, 1)]
    with pytest.raises(InvalidArgument):
        table.mark_flushed(first.batch_id, version=1)  # gone: its events travel in `second`


def test_a_flush_takes_at_most_the_limits_and_leaves_the_rest_open() -> None:
    table = PairTable(VOCAB)
    _add(table, [(0, 1)] * 5 + [(1, 2)] * 2 + [(2, 3)])  # pairs in key order, counts 5, 2, 1
    by_pairs = table.take_unflushed(max_pairs=2)
    assert by_pairs is not None and by_pairs.pairs() == [(0, 1, 5), (1, 2, 2)]
    table.mark_failed(by_pairs.batch_id)
    by_events = table.take_unflushed(max_events=3)  # the first pair alone is over: 3 of its 5 now
    assert by_events is not None and by_events.pairs() == [(0, 1, 3)]
    rest = table.take_unflushed(max_events=4)
    assert rest is not None and rest.pairs() == [(0, 1, 2), (1, 2, 2)]
    last = table.take_unflushed(max_pairs=10, max_events=10)
    assert last is not None and last.pairs() == [(2, 3, 1)]
    assert table.take_unflushed() is None
    assert table.stats().local_events == 8  # all still counted locally while in flight
    with pytest.raises(InvalidArgument):
        table.take_unflushed(max_events=0)


def test_stale_snapshot_is_ignored() -> None:
    table = PairTable(VOCAB)
    assert table.replace_snapshot([(1, 1, 5)], version=5)
    assert not table.replace_snapshot([(1, 1, 3)], version=4)
    assert _count(table, 1, 1) == 5 and table.version == 5


class FakeMemoryService:
    """Records batches atomically, one version per write; snapshots are (pairs, version)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int, int]] = Counter()
        self.version = 0

    def record(self, batch: FlushBatch) -> int:
        for d, t, c in batch.pairs():
            self.counts[(d, t)] += c
        self.version += 1
        return self.version

    def snapshot(self) -> tuple[list[tuple[int, int, int]], int]:
        return [(d, t, c) for (d, t), c in self.counts.items()], self.version


@pytest.mark.parametrize("seed", range(8))
def test_random_interleavings_lose_nothing_and_double_count_only_unacked_batches(seed: int) -> None:
    rng = random.Random(seed)
    table, service = PairTable(VOCAB), FakeMemoryService()
    truth: Counter[tuple[int, int]] = Counter()  # every event this verifier produced
    in_flight: list[FlushBatch] = []
    acks: list[tuple[FlushBatch, int]] = []  # recorded by the service, ack not yet delivered
    fetched: list[tuple[list[tuple[int, int, int]], int]] = []

    def check() -> None:
        # Over-count allowed only for recorded batches the installed snapshot holds but not yet acked.
        extra: Counter[tuple[int, int]] = Counter()
        for batch, version in acks:
            if version <= table.version:
                extra.update({(d, t): c for d, t, c in batch.pairs()})
        assert _table_counts(table) == truth + extra

    for _ in range(300):
        op = rng.choice(["add", "add", "take", "send", "send", "ack", "fetch", "install"])
        if op == "add":
            events = [rng.choice(ALL_PAIRS[:8]) for _ in range(rng.randint(1, 4))]
            _add(table, events)
            truth.update(events)
        elif op == "take" and (batch := table.take_unflushed()) is not None:
            in_flight.append(batch)
        elif op == "send" and in_flight:
            batch = in_flight.pop(rng.randrange(len(in_flight)))
            if rng.random() < 0.2:
                table.mark_failed(batch.batch_id)
            else:
                acks.append((batch, service.record(batch)))
        elif op == "ack" and acks:
            batch, version = acks.pop(rng.randrange(len(acks)))  # replies may arrive out of order
            table.mark_flushed(batch.batch_id, version)
        elif op == "fetch":
            fetched.append(service.snapshot())
        elif op == "install" and fetched:
            table.replace_snapshot(*fetched.pop(rng.randrange(len(fetched))))  # possibly stale
        check()

    # Drain: flush everything, deliver every ack, install the latest snapshot.
    while (batch := table.take_unflushed()) is not None:
        in_flight.append(batch)
    acks += [(batch, service.record(batch)) for batch in in_flight]
    for batch, version in acks:
        table.mark_flushed(batch.batch_id, version)
    table.replace_snapshot(*service.snapshot())
    assert _table_counts(table) == truth == service.counts
    assert table.stats().local_events == 0 and table.stats().in_flight_batches == 0


def test_lookups_while_another_thread_replaces_snapshots() -> None:
    table = PairTable(VOCAB)
    table.replace_snapshot([(1, 1, 0)], version=0)
    stop = threading.Event()
    seen: set[int] = set()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                seen.add(_count(table, 1, 1))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for version in range(1, 300):
        table.replace_snapshot([(1, 1, version), (2, 2, 1)], version=version)
        _add(table, [(3, 3)])
    stop.set()
    thread.join(timeout=10)
    assert not errors and not thread.is_alive()
    assert seen and seen <= set(range(300))  # always some whole snapshot, never garbage
    assert _count(table, 3, 3) == 299
