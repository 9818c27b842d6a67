"""The verifier's copy of the Online Correction Memory: (draft, target) pair -> count, as tensors.

The memory service owns the durable counts; each target replica keeps a local table so that a
rescue decision is a tensor lookup, never an RPC. The table a lookup sees is

    count(d, t) = snapshot(d, t) + local(d, t)

- *snapshot*: the latest pair list fetched from the memory service (GetPairs) and its version;
- *local*: this verifier's own rejection events that the installed snapshot does not reflect
  yet. They count from the moment verify() produced them (the paper's online update), long
  before the memory service has recorded them and a new snapshot has come back.

Both parts are immutable sorted key/count tensors (key = draft * V + target), looked up with
torch.searchsorted; writers build new tensors and swap one reference under a lock, so the
verify thread reads without locking while a refresher thread replaces the snapshot.

Protocol (the local events live in batches; batch ids are this table's own):

1. verify thread: `add_local(draft_ids, target_ids)` — events join the *open* batch.
2. flusher: `take_unflushed()` closes the open batch and returns it (aggregated pairs) to send
   with RecordEvents; its events stay counted locally while in flight.
3. flusher, on the reply: `mark_flushed(batch_id, version)` — the memory service recorded the
   batch in the write that produced `version`, so every snapshot of version >= v contains it.
   When the service refused it: `mark_failed(batch_id)` puts the events back into the open batch
   (sent again with the next flush). A lost reply leaves the batch in flight: the flusher sends it
   again as it was, with the same write_id, which the memory service counts at most once.
4. refresher: `replace_snapshot(pairs, version)` installs a newer snapshot and drops every
   acknowledged batch with version <= the snapshot's. Older snapshots than the installed one
   are ignored (replies can arrive out of order). An acknowledgement for a version the
   installed snapshot already covers drops the batch at once.

So no event is lost (a batch leaves the local part only once a snapshot containing it is
installed) and none is counted twice, with one bounded exception: a snapshot fetched after
the service recorded an in-flight batch but installed before that batch's acknowledgement
counts the batch twice until the acknowledgement arrives (the snapshot cannot say which
batches it holds). A refresher that skips fetching while `in_flight()` avoids it entirely.

Snapshots filtered by GetPairs(min_count, max_pairs) stay correct for rescue decisions as
long as min_count <= λ + 1 and max_pairs covers every pair with count > λ.

A snapshot pair this verifier cannot use (a token id outside its vocabulary: another model
pair wrote to the namespace, or a writer from before namespaces recorded their vocabulary)
is skipped and counted (`PairTableStats.skipped_pairs`), never a reason to refuse the rest:
one bad pair must not cut every verifier off the shared memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from calispec_core.errors import InvalidArgument, require

log = logging.getLogger(__name__)

Pair = tuple[int, int, int]  # (draft_token_id, target_token_id, count)
PairTensors = tuple[Tensor, Tensor, Tensor]  # draft_ids [N], target_ids [N], counts [N]
NO_SNAPSHOT = -1  # version before the first snapshot (the memory service's versions start at 0)


@dataclass(frozen=True)
class _Counts:
    """Immutable sorted unique keys with their counts."""

    keys: Tensor  # [N] int64 sorted, unique: draft * V + target
    counts: Tensor  # [N] int64

    @staticmethod
    def empty(device: torch.device) -> _Counts:
        return _Counts(
            torch.empty(0, dtype=torch.int64, device=device), torch.empty(0, dtype=torch.int64, device=device)
        )

    @staticmethod
    def from_keys(keys: Tensor, counts: Tensor) -> _Counts:  # [N] (may repeat), [N]
        """Sum counts per key."""
        unique, inverse = torch.unique(keys, sorted=True, return_inverse=True)  # [U], [N]
        summed = torch.zeros_like(unique).index_add_(0, inverse, counts)  # [U]
        return _Counts(unique, summed)

    def plus(self, *others: _Counts) -> _Counts:
        parts = (self, *others)
        return _Counts.from_keys(torch.cat([p.keys for p in parts]), torch.cat([p.counts for p in parts]))

    def split(self, max_pairs: int, max_events: int) -> tuple[_Counts, _Counts]:
        """(the first pairs, at most max_pairs of them with at most max_events in all; the rest). A first pair
        counted more than max_events is split: max_events of it now, the remainder stays."""
        within = int((self.counts.cumsum(0) <= max_events).sum())  # the prefix whose events fit
        n = min(within, max_pairs)
        if n == 0:  # the first pair alone is over the limit
            first = self.counts[:1].clamp(max=max_events)  # [1]
            rest = self.counts.clone()  # [N]
            rest[0] -= first[0]
            return _Counts(self.keys[:1], first), _Counts(self.keys[rest > 0], rest[rest > 0])
        return _Counts(self.keys[:n], self.counts[:n]), _Counts(self.keys[n:], self.counts[n:])

    def lookup(self, keys: Tensor) -> Tensor:  # [...] int64 -> [...] int64; unknown keys -> 0
        if self.keys.numel() == 0:
            return torch.zeros_like(keys)
        index = torch.searchsorted(self.keys, keys).clamp_(max=self.keys.numel() - 1)  # [...]
        return torch.where(self.keys[index] == keys, self.counts[index], 0)


@dataclass(frozen=True)
class _View:
    """What a lookup reads; replaced as a whole, never mutated."""

    snapshot: _Counts
    local: _Counts
    version: int
    skipped: int = 0  # pairs of the snapshot left out: ids outside the vocabulary


@dataclass
class _Batch:
    events: _Counts
    acked_version: int | None = None  # set by mark_flushed


@dataclass(frozen=True)
class FlushBatch:
    """Local events to send to the memory service (RecordEvents), aggregated by pair."""

    batch_id: int
    draft_ids: Tensor  # [M] int64, CPU
    target_ids: Tensor  # [M] int64, CPU
    counts: Tensor  # [M] int64, CPU, >= 1

    def pairs(self) -> list[Pair]:
        return list(zip(self.draft_ids.tolist(), self.target_ids.tolist(), self.counts.tolist(), strict=True))


@dataclass(frozen=True)
class PairTableStats:
    version: int  # installed snapshot version, NO_SNAPSHOT before the first
    snapshot_pairs: int
    local_pairs: int
    local_events: int  # events counted locally, not yet reflected in the installed snapshot
    in_flight_batches: int  # taken for sending, not yet acknowledged
    skipped_pairs: int = 0  # pairs of the installed snapshot left out: ids outside the vocabulary


class PairTable:
    """Correction-memory counts for one vocabulary; thread-safe, looked up as a tensor op."""

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu") -> None:
        require(vocab_size > 0, f"vocab_size must be > 0, got {vocab_size}")
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        empty = _Counts.empty(self.device)
        self._lock = threading.Lock()  # serialises writers; readers take self._view without it
        self._view = _View(snapshot=empty, local=empty, version=NO_SNAPSHOT)
        self._open = empty  # events not yet taken by the flusher
        self._batches: dict[int, _Batch] = {}  # taken by the flusher, not yet covered by a snapshot
        self._next_batch_id = 0

    # -- hot path -------------------------------------------------------------------------------

    def counts(self, draft_ids: Tensor, target_ids: Tensor) -> Tensor:
        """Counts per pair ([...] -> [...] int64, on the table's device); unknown or out-of-vocab -> 0.

        Lock-free: one read of an immutable view (a reference read is atomic in CPython).
        """
        view = self._view
        keys = self._keys(draft_ids, target_ids)  # [...]
        return view.snapshot.lookup(keys) + view.local.lookup(keys)

    def add_local(self, draft_ids: Tensor, target_ids: Tensor) -> None:
        """Count this verifier's rejection events ([E], [E]) now; ids must be in the vocabulary."""
        require(draft_ids.shape == target_ids.shape, "draft_ids and target_ids must have the same shape")
        keys = self._keys(draft_ids.reshape(-1), target_ids.reshape(-1))  # [E]
        if keys.numel() == 0:
            return
        if bool((keys < 0).any()):
            raise InvalidArgument(f"event token ids must be in [0, {self.vocab_size})")
        new = _Counts.from_keys(keys, torch.ones_like(keys))
        with self._lock:
            self._open = self._open.plus(new)
            view = self._view
            self._view = _View(view.snapshot, view.local.plus(new), view.version, view.skipped)

    # -- flusher --------------------------------------------------------------------------------

    def take_unflushed(self, max_pairs: int | None = None, max_events: int | None = None) -> FlushBatch | None:
        """Close (a first part of) the open batch and hand it to the flusher; None when there is nothing
        to send. `max_pairs` / `max_events` bound one batch (the memory service refuses larger writes);
        what is left stays open for the next call."""
        require(all(limit is None or limit > 0 for limit in (max_pairs, max_events)), "flush limits must be > 0")
        with self._lock:
            events = self._open
            if events.keys.numel() == 0:
                return None
            rest = _Counts.empty(self.device)
            if max_pairs is not None or max_events is not None:
                events, rest = events.split(max_pairs or events.keys.numel(), max_events or int(events.counts.sum()))
            batch_id = self._next_batch_id
            self._next_batch_id += 1
            self._batches[batch_id] = _Batch(events)
            self._open = rest
        keys = events.keys.cpu()
        return FlushBatch(batch_id, keys // self.vocab_size, keys % self.vocab_size, events.counts.cpu())

    def mark_flushed(self, batch_id: int, version: int) -> None:
        """The memory service recorded the batch at `version`; drop it once a snapshot covers that."""
        with self._lock:
            batch = self._taken(batch_id)
            require(batch.acked_version is None, f"batch {batch_id} was already acknowledged")
            batch.acked_version = version
            if version <= self._view.version:
                self._install(self._view.snapshot, self._view.version, self._view.skipped)

    def mark_failed(self, batch_id: int) -> None:
        """Sending the batch failed: its events go back to the open batch (still counted locally)."""
        with self._lock:
            batch = self._taken(batch_id)
            require(batch.acked_version is None, f"batch {batch_id} was already acknowledged")
            del self._batches[batch_id]
            self._open = self._open.plus(batch.events)

    def unsent_events(self) -> int:
        """Events the memory service has not acknowledged: the open batch's and those of batches taken but unacked."""
        with self._lock:
            unacked = (b.events for b in self._batches.values() if b.acked_version is None)
            return int(self._open.counts.sum()) + sum(int(e.counts.sum()) for e in unacked)

    def in_flight(self) -> bool:
        """True while a taken batch awaits its acknowledgement."""
        with self._lock:
            return any(b.acked_version is None for b in self._batches.values())

    # -- refresher ------------------------------------------------------------------------------

    def replace_snapshot(self, pairs: Sequence[Pair] | PairTensors, version: int, force: bool = False) -> bool:
        """Install the memory service's pairs at `version`; False (ignored) if older than the installed.

        force=True installs an older version too: the memory service's version went backwards
        (it lost its last flush in a crash), and its table is now the truth.
        """
        snapshot, skipped = self._snapshot_counts(pairs)  # the expensive part, outside the lock
        with self._lock:
            if version < self._view.version and not force:
                return False
            self._install(snapshot, version, skipped)
        if skipped:
            log.warning(
                "memory snapshot v%d: skipped %d pair(s) with token ids outside this vocabulary [0, %d)",
                version,
                skipped,
                self.vocab_size,
            )
        return True

    def stats(self) -> PairTableStats:
        with self._lock:
            view = self._view
            in_flight = sum(b.acked_version is None for b in self._batches.values())
        return PairTableStats(
            version=view.version,
            snapshot_pairs=view.snapshot.keys.numel(),
            local_pairs=view.local.keys.numel(),
            local_events=int(view.local.counts.sum()),
            in_flight_batches=in_flight,
            skipped_pairs=view.skipped,
        )

    @property
    def version(self) -> int:
        return self._view.version

    # -- internals ------------------------------------------------------------------------------

    def _keys(self, draft_ids: Tensor, target_ids: Tensor) -> Tensor:  # [...] -> [...] int64, -1 if invalid
        d = draft_ids.to(device=self.device, dtype=torch.int64)
        t = target_ids.to(device=self.device, dtype=torch.int64)
        vocab = self.vocab_size
        in_vocab = (d >= 0) & (d < vocab) & (t >= 0) & (t < vocab)
        return torch.where(in_vocab, d * vocab + t, -1)

    def _taken(self, batch_id: int) -> _Batch:
        batch = self._batches.get(batch_id)
        require(batch is not None, f"unknown or already dropped batch {batch_id}")
        assert batch is not None  # for the type checker
        return batch

    def _install(self, snapshot: _Counts, version: int, skipped: int) -> None:
        """Under the lock: install (snapshot, version); keep local only what it does not cover."""
        self._batches = {i: b for i, b in self._batches.items() if b.acked_version is None or b.acked_version > version}
        local = self._open.plus(*(b.events for b in self._batches.values()))
        self._view = _View(snapshot, local, version, skipped)

    def _snapshot_counts(self, pairs: Sequence[Pair] | PairTensors) -> tuple[_Counts, int]:
        """The usable pairs as counts, and how many were skipped (ids outside the vocabulary)."""
        if len(pairs) == 3 and all(isinstance(x, Tensor) for x in pairs):
            draft, target, counts = (torch.as_tensor(x, dtype=torch.int64).reshape(-1) for x in pairs)
        else:
            rows = torch.tensor(list(pairs), dtype=torch.int64).reshape(-1, 3)  # [N, 3]
            draft, target, counts = rows.unbind(dim=1)
        require(draft.shape == target.shape == counts.shape, "snapshot tensors must have the same length")
        keys = self._keys(draft, target)  # [N], -1 where an id is outside the vocabulary
        counts = counts.to(self.device)
        require(not bool((counts < 0).any()), "snapshot counts must be >= 0")
        usable = keys >= 0  # [N]
        skipped = int((~usable).sum())
        return _Counts.from_keys(keys[usable], counts[usable]), skipped
