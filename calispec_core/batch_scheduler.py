"""Batches concurrent calls into one model step: Verify on the target, Propose on the draft (no gRPC here).

Handler threads `submit` a row and block on its result. Rows submitted while a step runs queue
up, and the worker thread runs what queued (up to `max_batch`) together as soon as that step ends.
A row that finds the scheduler idle runs at once, called from the caller's own thread (batch 1
skips the batcher thread; the model services' steps themselves run on the compute thread). Under
concurrency that lets batches alternate between 1 and n-1 rows: the first session back from the
coordinator runs alone while the others queue behind it (measured: `ar` at concurrency 8 ran 129
steps of one row and 127 of seven). So an idle scheduler whose recent steps had several rows waits up
to `gather_s` until as many rows are queued again as the largest of its last `RECENT_STEPS` steps had
(Triton's dynamic batcher's `max_queue_delay` idea; 0 turns it off); a lone request (recent steps of
one row) never waits. The largest recent step, not the last one: when one step caught only part of a
lockstep group, waiting for that part alone kept the group split (measured at concurrency 8: target
batches of 5.1 rows on average for 8 requests, 7.0 after).

History cannot re-merge a group that has been split from its start: every step then had part of it.
So callers may say how many rows they send at once (`cohort`: the coordinator's lockstep round
members). An idle scheduler with such rows queued waits for that many, up to `COHORT_GATHER_S`: the
rows leave the coordinator together, but on a busy 2-core host their arrival spreads over several
ms, more than `gather_s`. Measured without it (the AVX2 EPYC, `sd` at concurrency 8): the target ran
every round's 8 rows as two forwards of 4 for a whole load level, the second half came back after the
lockstep's member wait, and the group stayed split into two halves, one drafting while the other
verified (a batch-4 draft step 200-400 ms instead of ~60; `sd` 0.71x `ar`).

A failed batch never fails its honest rows: the step must change nothing when it raises (the
target's round commits only after every row is verified), so each row of a failed batch is
run again alone and only the rows that still fail see an error.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, NamedTuple, TypeVar

from calispec_core.errors import Unavailable, require

log = logging.getLogger(__name__)

Row = TypeVar("Row")
Result = TypeVar("Result")


DEFAULT_GATHER_S = 0.005  # how long an idle scheduler waits for the last step's other rows to come back
RECENT_STEPS = 8  # a step waits for as many rows as the largest of the last RECENT_STEPS steps had
COHORT_GATHER_S = 0.05  # how long an idle scheduler waits for the rest of a cohort its callers announced


class _Split(NamedTuple):
    announced: int  # the cohort its rows announced
    remaining: int  # its rows that had not come when the others left
    left_at: float  # monotonic time they left


class BatchScheduler(Generic[Row, Result]):
    def __init__(
        self,
        step: Callable[[Sequence[Row]], Sequence[Result]],
        max_batch: int,
        name: str = "verify-batcher",
        gather_s: float = DEFAULT_GATHER_S,
    ) -> None:
        require(max_batch >= 1, f"max_batch must be >= 1, got {max_batch}")
        # inf overflowed the worker's wait: it died, and every row queued after it waited forever
        require(0 <= gather_s < math.inf, f"batch gather time must be a finite number >= 0, got {gather_s}")
        self._step = step
        self.max_batch = max_batch
        self.gather_s = gather_s
        self._recent_sizes: deque[int] = deque(maxlen=RECENT_STEPS)  # rows of the last steps
        self._queue: queue.Queue[tuple[Row, Future[Result]]] = queue.Queue()
        # One step at a time (inline or on the worker); `_queued` rows wait for the worker, and while
        # any does no caller may run inline past them.
        self._state = threading.Condition()
        self._busy = False
        self._queued = 0
        self._cohort = 0  # the most rows the queued rows' cohorts still expect (0: none announced one)
        self._announced = 0  # the largest cohort the queued rows announced
        self._split: _Split | None = None  # the last cohort that left without all its rows
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    def submit(self, row: Row, cohort: int = 0) -> Result:
        """Run `row` in the next batch (at once, on this thread, when the scheduler is idle and expects
        nobody else); returns its result or raises its error. `cohort`: how many rows the caller sends at
        this moment, this one included (0: unknown, recent steps decide; 1: alone)."""
        future: Future[Result] = Future()
        with self._state:
            if self._stopped:
                raise Unavailable("the service is shutting down")
            expected = cohort or self._expected()
            inline = not self._busy and self._queued == 0 and (expected <= 1 or self.gather_s <= 0)
            if inline:
                self._busy = True
            else:
                self._cohort = max(self._cohort, self._still_expected(cohort))
                self._announced = max(self._announced, cohort)
                self._queued += 1
                self._queue.put((row, future))
                self._state.notify_all()
        if not inline:
            return future.result()
        try:
            return self._step([row])[0]
        finally:
            self._idle(1)

    def queue_depth(self) -> int:
        """Rows waiting for the next batch (approximate while threads submit)."""
        return self._queue.qsize()

    def stop(self) -> None:
        """Refuse new rows, finish the queued ones, then end the worker."""
        with self._state:
            self._stopped = True
            self._state.notify_all()
        self._thread.join()

    def _idle(self, size: int) -> None:
        with self._state:
            self._busy = False
            self._recent_sizes.append(size)
            if self._queued:  # wake the worker only when rows wait for it (a wake-up is a GIL hand-off)
                self._state.notify_all()

    def _run(self) -> None:
        while True:
            with self._state:
                while self._busy or (self._queued == 0 and not self._stopped):
                    self._state.wait()  # a running step's queued rows join the next batch
                if self._queued == 0:
                    return  # stopped, nothing left
                self._gather()
                self._busy = True
                size = min(self._queued, self.max_batch)
                self._queued -= size
                self._cohort_left(size)
            batch = [self._queue.get_nowait() for _ in range(size)]
            try:
                self._run_batch(batch)
            finally:
                self._idle(size)

    def _gather(self) -> None:
        """(Holding the lock) wait for the announced cohort (up to COHORT_GATHER_S), else for the last
        steps' rows to be queued again (up to gather_s); gather_s = 0 turns both off."""
        if self.gather_s <= 0:
            return
        expected = min(self._cohort or self._expected(), self.max_batch)
        deadline = time.monotonic() + (max(self.gather_s, COHORT_GATHER_S) if self._cohort else self.gather_s)
        while self._queued < expected and not self._stopped and (left := deadline - time.monotonic()) > 0:
            self._state.wait(left)

    def _still_expected(self, cohort: int) -> int:
        """(Holding the lock) how many rows a row announcing `cohort` still waits for: fewer when part of
        its cohort just left without it (a gather that timed out, a cohort larger than max_batch), or the
        late rows would wait the whole COHORT_GATHER_S again for rows that are gone."""
        split = self._split
        if split and cohort == split.announced and time.monotonic() - split.left_at <= COHORT_GATHER_S:
            return split.remaining
        return cohort

    def _cohort_left(self, size: int) -> None:
        """(Holding the lock) `size` rows left for a step; remember what their cohort still expects."""
        remaining = self._cohort - size
        self._split = _Split(self._announced, remaining, time.monotonic()) if remaining > 0 else None
        self._cohort = remaining if remaining > 0 and self._queued else 0
        self._announced = self._announced if self._cohort else 0

    def _expected(self) -> int:
        """How many rows are likely to come back together: the largest recent step's."""
        return max(self._recent_sizes, default=0)

    def _run_batch(self, batch: list[tuple[Row, Future[Result]]]) -> None:
        try:
            results = self._step([row for row, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            log.warning(
                "a batch of %d rows failed (%s: %s); running each row alone", len(batch), type(exc).__name__, exc
            )
            for item in batch:  # isolate the failing row(s): the others complete
                self._run_batch([item])
            return
        for (_, future), result in zip(batch, results, strict=True):
            future.set_result(result)
