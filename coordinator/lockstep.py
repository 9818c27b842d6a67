"""Lockstep rounds: the requests in flight draft together, then verify together (no gRPC here).

Left alone, concurrent requests drift out of step: proposals end at different lengths (early
stops, different γ), so while one request's draft computes, another's target forward runs. On
a host where both models share the cores they then compute at the same time and each runs at
a fraction of its speed, and the target sees batches of one or two rows (measured at
concurrency 8: mostly 1–2 rows for `sd` against 4–8 for `ar`). vLLM's scheduler runs one step
for every running request; this is the same shape across services. A round has two gates:

- `start_round`: the group's rounds start together once every member has arrived, so their
  Propose calls reach the draft service together and draft as one batch. A request that is
  new (or fell out of step) while the group drafts joins that round at once with γ = 0: its
  row rides in the round's verify (its first token; its prompt's prefill with it, where the
  target defers short prefills to the first forward) and it drafts from the next round start.
  Waiting for the round to end instead left its row empty for the whole round (measured at
  concurrency 8 with the prefill before it: ~2 s a newcomer, docs/performance.md "Prefills that
  ride"). A request new while the group verifies waits for the members to come back. A seeded
  sampling request (`Wish.reproducible`) never joins a drafting round: a round of γ 0 where it
  would have drafted changes which random draws make its tokens, so its output depended on when
  others ran (wave 51, found by probing); it waits, as a newcomer, for the next round start. So
  does a rescuing request (csd, ocm_only, scg_only) with a fixed γ: only a drafted token can be
  rescued (wave 56); it gives up the riding newcomer's earlier first token for that.
- `before_verify`: the Verify calls leave together once every member has its proposal (a
  request that drafts nothing this round arrives at once), so the target verifies them as one
  batch and no target forward overlaps a draft forward of the same group.

A member that keeps the others waiting longer than `max_wait_s` (a draft prefill, an outage
waiting for its timeout, a slow client) is left behind: the group goes on without it, and it
rejoins as a newcomer. A newcomer waits longer, `max_wait_s` plus twice a typical round's work (the median, over
the last ROUNDS_KEPT rounds, of the time from a round's start to its first member's verdict, `verified`), at
the round start or at the verify gate of the round it joined: the members it waits for are busy
with the round in progress, not late (bounded by `max_wait_s`, a newcomer that arrived while the
group verified for longer than that left the whole group behind). The last round start to start, idle time and
a member's client pacing it included, let a request after 20 s of idle wait 40 s for a member that was not coming,
and that round then lengthened the next newcomer's wait (found by probing). `max_wait_s` = 0 turns lockstep off.

The round start also decides every member's γ at once (`round_plan.py`: a rule given each arrived
member's `Wish`, wave 6's median cap unless told otherwise): the group's drafting lasts as long as
its longest proposal and its verify is as wide as all of them, so the rows' γ are one decision.

Each gate also says how many members leave it together (the round's drafters, its verifiers): the
coordinator passes that on as the calls' `cohort`, so the model service batches exactly them (a
batcher that guessed from its recent steps could stay split for good, `batch_scheduler.py`).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from calispec_core.errors import require
from coordinator.round_plan import Wish, median_cap

Planner = Callable[[Sequence[Wish]], list[int]]  # each member's γ, in the order of the wishes given

log = logging.getLogger(__name__)

ROUNDS_KEPT = 5  # rounds whose median is a typical round's work (one slowed by a prefill is an outlier)


class RoundStart(NamedTuple):
    gamma: int  # this member's γ for the round (the round start's rule; its own wish when it runs alone)
    cohort: int  # members whose Propose calls leave together (0: lockstep off; 1: out of step)


class Lockstep:
    """Two alternating gates for a group whose members come and go: a request joins at a round
    start and leaves when its rounds end (however they end), so nobody waits for one that is gone."""

    def __init__(self, max_wait_s: float, plan: Planner = median_cap) -> None:
        require(max_wait_s >= 0, f"lockstep max wait must be >= 0, got {max_wait_s}")
        self.max_wait_s = max_wait_s
        self.plan = plan
        self._state = threading.Condition()
        self._group: set[Hashable] = set()  # members of the round in progress (or gathering)
        self._arrived: set[Hashable] = set()  # members at the current gate
        self._joined: set[Hashable] = set()  # requests that joined the drafting round at its verify (γ 0)
        self._awaiting: set[Hashable] = set()  # reproducible newcomers waiting for the drafting round to verify
        self._drafting = False  # gate: False = round start, True = before verify
        self._generation = 0  # counts opened gates: a waiter is free once it moves on
        self._wishes: dict[Hashable, Wish] = {}  # what each member brings to this round start
        self._planned: dict[Hashable, int] = {}  # each member's γ, planned when the last round started
        self._drafters = 0  # members planned to draft at the last round start
        self._verifying: set[Hashable] = set()  # members of the round now verifying (its gate opened)
        self._shards: dict[Hashable, Hashable] = {}  # each member's target replica at its last verify gate
        self._round_started = 0.0  # monotonic time the last round started
        self._round_measured = True  # its work is recorded already (its first verdict came)
        self._rounds_s: deque[float] = deque(maxlen=ROUNDS_KEPT)  # the last rounds' work (start to first verdict)
        self._round_s = 0.0  # a typical round's work: their median
        self._plan_failures = 0  # round plans that raised (a bug in the rule), for the log

    def waiting(self) -> int:
        """Requests waiting now at the current gate."""
        with self._state:
            return len(self._arrived)

    def members(self) -> int:
        """Requests in the group now."""
        with self._state:
            return len(self._group)

    def start_round(self, member: Hashable, timeout_s: float, wish: Wish) -> RoundStart:
        """Wait until every member is ready to start a round; a request that is not a member while the group
        drafts (new, or left behind) joins that round at once with γ 0, unless its wish is reproducible: that one
        waits for the next round start (module doc). `wish`: what this member
        would draft alone, and its bounds; returns its γ under the round's rule (`plan`, over everyone starting the
        round) and how many members draft it. With lockstep off a request drafts its own wish."""
        if self.max_wait_s == 0:
            return RoundStart(wish.gamma, 0)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._state:
            while self._drafting and member not in self._group:
                if not wish.reproducible:
                    self._group.add(member)
                    self._joined.add(member)
                    return RoundStart(0, max(self._drafters, 1))
                if not self._await_round_start(member, deadline):  # the round outlasted a newcomer's wait
                    return RoundStart(wish.gamma, 1)  # out of step: its own γ, alone
            timeout_s = deadline - time.monotonic()  # what is left of it after any wait above
            # a newcomer's wait is bounded by the round in progress, a member's by max_wait_s (module doc)
            newcomer = member not in self._verifying  # not back from the round in progress
            self._group.add(member)
            self._wishes[member] = wish
            self._arrive(member, self._end(timeout_s, self._newcomer_wait_s() if newcomer else None))
            # decided when this gate opened (a later one opens only once this member is left behind)
            return RoundStart(self._planned.get(member, wish.gamma), max(self._drafters, 1))

    def before_verify(self, member: Hashable, timeout_s: float, shard: Hashable = None) -> int:
        """Wait until every member of this round has its proposal; returns how many of them verify together
        on this member's `shard` (its target replica: each replica batches only its own rows; 0: lockstep
        off; 1: this member is out of step)."""
        if self.max_wait_s == 0:
            return 0
        with self._state:
            if not (self._drafting and member in self._group):
                return 1  # out of step: verify at once
            self._shards[member] = shard
            # one that joined this round waits for members busy drafting, not late ones (module doc)
            self._arrive(member, self._end(timeout_s, self._newcomer_wait_s() if member in self._joined else None))
            return max(sum(1 for m in self._verifying if self._shards.get(m) == shard), 1)

    def verified(self, member: Hashable) -> None:
        """`member` has its verdict: the round's first one ends the round's work (what a newcomer waits for). What
        follows, a member's trip back to the next round start, is its client's pace or idle time, not the round's."""
        if self.max_wait_s == 0:
            return
        with self._state:
            if self._round_measured or member not in self._verifying:  # measured, or it verified out of step
                return
            self._round_measured = True
            self._rounds_s.append(time.monotonic() - self._round_started)
            self._round_s = statistics.median(self._rounds_s)

    def leave(self, member: Hashable) -> None:
        with self._state:
            self._group.discard(member)
            self._arrived.discard(member)
            self._wishes.pop(member, None)
            self._shards.pop(member, None)
            self._joined.discard(member)
            if self._arrived and self._arrived >= self._group:  # the gate waited only for this one
                self._open()
            elif self._drafting and not self._group:  # the round lost its last member: back to a round
                self._open()  # start, or the gate stayed shut and every later request ran out of step

    def _await_round_start(self, member: Hashable, deadline: float) -> bool:
        """(Holding the lock) wait, as a newcomer, for the drafting round to go to its verify, which makes `member`
        one of the group the next round start waits for (`_open`: woken, it could find that gate opened without
        it; found by review); False if that did not happen within the wait. A reproducible request's rounds must
        not hang on when it came: a round it joined with γ 0 shifted every later one (seeded `sd` output changed
        under load)."""
        end = self._end(deadline - time.monotonic(), self._newcomer_wait_s())
        self._awaiting.add(member)
        try:
            while self._drafting and (left := end - time.monotonic()) > 0:
                self._state.wait(left)
        finally:
            self._awaiting.discard(member)
        return not self._drafting

    def _newcomer_wait_s(self) -> float:
        """(Holding the lock) how long a request new to the round in progress may wait for its members."""
        return self.max_wait_s + 2 * self._round_s

    def _end(self, timeout_s: float, wait_s: float | None = None) -> float:
        return time.monotonic() + min(self.max_wait_s if wait_s is None else wait_s, max(timeout_s, 0.0))

    def _arrive(self, member: Hashable, end: float) -> None:
        """(Holding the lock) wait at the current gate until everyone is there or `end`."""
        self._arrived.add(member)
        if self._arrived >= self._group:
            self._open()
            return
        generation = self._generation
        while self._generation == generation and (left := end - time.monotonic()) > 0:
            self._state.wait(left)
        if self._generation == generation:  # waited long enough: go without the ones missing
            self._group &= self._arrived
            self._open()

    def _plan_round(self, wishes: list[Wish]) -> list[int]:
        """The rule's γ for each wish; each member's own wish if the rule fails. It runs at a gate that every
        member waits on: a rule that raised used to leave the gate shut, so the others waited out their
        max_wait_s and met the same error in turn (a bug in a rule must cost a plan, not the group's rounds)."""
        try:
            planned = self.plan(wishes)
            if len(planned) != len(wishes):
                raise ValueError(f"a round plan gave {len(planned)} γ for {len(wishes)} members")
            return planned
        except Exception:
            self._plan_failures += 1
            if self._plan_failures & (self._plan_failures - 1) == 0:  # the 1st, 2nd, 4th, 8th...: not every round
                log.exception(
                    "the lockstep's round plan failed (%d times so far); each member drafts its own wish",
                    self._plan_failures,
                )
            return [wish.gamma for wish in wishes]

    def _open(self) -> None:
        if not self._drafting:  # a round starts: one decision for the γ of everyone starting it
            members = list(self._arrived)
            planned = self._plan_round([self._wishes[m] for m in members])
            self._planned = dict(zip(members, planned, strict=True))
            self._drafters = sum(1 for gamma in planned if gamma > 0)
            self._wishes.clear()
            self._round_started, self._round_measured = time.monotonic(), False
            self._verifying = set()
        else:  # the group verifies
            self._verifying = set(self._group)
            self._joined.clear()
            self._group |= self._awaiting  # newcomers of the next round start: the members back from verify wait
        self._generation += 1
        self._drafting = not self._drafting
        self._arrived.clear()
        self._state.notify_all()
