"""Batches concurrent calls into one model step: Verify on the target, Propose on the draft (no gRPC here).

Handler threads `submit` a row and block on its result; one worker thread takes whatever rows
are waiting (up to `max_batch`) and runs them together. There is no batching window: an idle
service runs a lone row at once, a busy one batches exactly what queued up during the previous
forward — latency is never traded for batch size.

A failed batch never fails its honest rows: the step must change nothing when it raises (the
target's round commits only after every row is verified), so each row of a failed batch is
run again alone and only the rows that still fail see an error.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from calispec_core.errors import Unavailable

log = logging.getLogger(__name__)

Row = TypeVar("Row")
Result = TypeVar("Result")

_STOP = object()


class BatchScheduler(Generic[Row, Result]):
    def __init__(
        self, step: Callable[[Sequence[Row]], Sequence[Result]], max_batch: int, name: str = "verify-batcher"
    ) -> None:
        self._step = step
        self.max_batch = max_batch
        self._queue: queue.Queue[tuple[Row, Future[Result]] | object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    def submit(self, row: Row) -> Result:
        """Run `row` in the next batch; returns its result or raises its error."""
        if self._stopped:
            raise Unavailable("the target is shutting down")
        future: Future[Result] = Future()
        self._queue.put((row, future))
        return future.result()

    def queue_depth(self) -> int:
        """Rows waiting for the next batch (approximate while threads submit)."""
        return self._queue.qsize()

    def stop(self) -> None:
        self._stopped = True
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    self._queue.put(_STOP)  # finish this batch, then stop
                    break
                batch.append(item)
            self._run_batch(batch)  # type: ignore[arg-type]

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
