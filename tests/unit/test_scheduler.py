"""The verify batcher: lone rows run at once, rows that queue during a forward run together."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from calispec_core import batch_scheduler
from calispec_core.batch_scheduler import BatchScheduler
from tests.helpers import wait_until


class GatedStep:
    """A step function whose first call blocks until released, recording every batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, rows: Sequence[int]) -> list[int]:
        self.batches.append(list(rows))
        if len(self.batches) == 1:
            self.entered.set()
            self.release.wait(timeout=30)
        if -1 in rows:
            raise RuntimeError("bad row")
        return [r * 10 for r in rows]


def test_rows_queued_during_a_forward_form_the_next_batch() -> None:
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=3)
    results: dict[int, int] = {}

    def submit(row: int) -> None:
        results[row] = scheduler.submit(row)

    threads = [threading.Thread(target=submit, args=(0,))]
    threads[0].start()
    assert step.entered.wait(timeout=30)
    for row in (1, 2, 3, 4):
        threads.append(threading.Thread(target=submit, args=(row,)))
        threads[-1].start()
    wait_until(lambda: scheduler._queue.qsize() == 4)
    step.release.set()
    for t in threads:
        t.join(timeout=30)
    scheduler.stop()
    assert step.batches[0] == [0]
    assert sorted(len(b) for b in step.batches[1:]) == [1, 3]  # capped at max_batch
    assert results == {r: r * 10 for r in range(5)}


def test_a_failing_batch_fails_its_callers_and_the_scheduler_goes_on() -> None:
    step = GatedStep()
    step.release.set()
    scheduler = BatchScheduler(step, max_batch=4)
    with pytest.raises(RuntimeError, match="bad row"):
        scheduler.submit(-1)
    assert scheduler.submit(7) == 70
    scheduler.stop()


def test_a_failing_row_fails_only_its_own_caller_and_the_rest_of_its_batch_completes() -> None:
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4)
    results: dict[int, int | Exception] = {}

    def submit(row: int) -> None:
        try:
            results[row] = scheduler.submit(row)
        except RuntimeError as exc:
            results[row] = exc

    threads = [threading.Thread(target=submit, args=(0,))]
    threads[0].start()
    assert step.entered.wait(timeout=30)
    for row in (1, -1, 2):
        threads.append(threading.Thread(target=submit, args=(row,)))
        threads[-1].start()
    wait_until(lambda: scheduler._queue.qsize() == 3)
    step.release.set()
    for t in threads:
        t.join(timeout=30)
    scheduler.stop()
    assert sorted(step.batches[1]) == [-1, 1, 2]  # they did share a batch, which failed
    assert sorted(b[0] for b in step.batches[2:]) == [-1, 1, 2]  # then each row ran alone
    assert isinstance(results.pop(-1), RuntimeError)
    assert results == {0: 0, 1: 10, 2: 20}


def test_a_lone_row_runs_on_the_callers_thread_without_a_hand_off() -> None:
    threads: list[threading.Thread] = []

    def step(rows: Sequence[int]) -> list[int]:
        threads.append(threading.current_thread())
        return [r + 1 for r in rows]

    scheduler = BatchScheduler(step, max_batch=4)
    assert scheduler.submit(1) == 2
    assert scheduler.submit(2) == 3
    scheduler.stop()
    assert threads == [threading.current_thread()] * 2


def test_a_row_queued_behind_a_running_step_is_not_overtaken_by_a_later_inline_one() -> None:
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4)
    results: dict[int, int] = {}

    def submit(row: int) -> None:
        results[row] = scheduler.submit(row)

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    assert step.entered.wait(timeout=30)  # row 0 runs inline and holds the step
    queued = threading.Thread(target=submit, args=(1,))
    queued.start()
    wait_until(lambda: scheduler._queue.qsize() == 1)
    step.release.set()
    first.join(timeout=30)
    submit(2)  # the worker may not have picked row 1 up yet: row 2 must not run before it
    queued.join(timeout=30)
    scheduler.stop()
    batch_of = {row: i for i, batch in enumerate(step.batches) for row in batch}
    assert batch_of[1] <= batch_of[2]
    assert results == {0: 0, 1: 10, 2: 20}


def test_rows_of_a_batch_coming_back_one_by_one_are_gathered_into_one_batch() -> None:
    """Without the gather, the first row back would run alone and batches would alternate 1 / n-1."""
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4, gather_s=30.0)  # long: the test never depends on timing
    results: dict[int, int] = {}

    def submit(row: int) -> None:
        results[row] = scheduler.submit(row)

    def run(*rows: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=submit, args=(r,)) for r in rows]
        for t in threads:
            t.start()
        return threads

    first = run(0)
    assert step.entered.wait(timeout=30)  # row 0 runs inline (nothing ran before it) and holds the step
    queued = run(1, 2)
    wait_until(lambda: scheduler._queue.qsize() == 2)
    step.release.set()
    for t in first + queued:
        t.join(timeout=30)
    assert step.batches == [[0], [1, 2]]  # the last step had two rows...
    back = run(3)
    wait_until(lambda: scheduler._queue.qsize() == 1)  # ...so the first one back waits for the other
    back += run(4)
    for t in back:
        t.join(timeout=30)
    scheduler.stop()
    assert sorted(step.batches[2]) == [3, 4] and len(step.batches) == 3
    assert results == {r: r * 10 for r in range(5)}


def _one_then_the_rest(step: GatedStep, scheduler: BatchScheduler, rows: list[int]) -> None:
    """rows[0] runs inline and holds the step while the others queue; then all complete (two batches)."""
    threads = [threading.Thread(target=scheduler.submit, args=(r,)) for r in rows]
    threads[0].start()
    assert step.entered.wait(timeout=30)
    for t in threads[1:]:
        t.start()
    wait_until(lambda: scheduler._queue.qsize() == len(rows) - 1)
    step.release.set()
    for t in threads:
        t.join(timeout=30)


def test_a_gather_nobody_joins_ends_and_the_row_runs() -> None:
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4, gather_s=0.01)
    _one_then_the_rest(step, scheduler, [0, 1, 2])
    assert scheduler.submit(5) == 50  # the other row of the last batch never comes back
    scheduler.stop()
    assert step.batches[-1] == [5]


def test_a_negative_gather_time_is_refused() -> None:
    from calispec_core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="gather"):
        BatchScheduler(lambda rows: list(rows), max_batch=2, gather_s=-1)


def test_a_group_split_by_one_short_step_is_gathered_whole_again() -> None:
    """Under lockstep the coordinator sends a group's rows together; one step that caught only part of
    them (a straggler, a member left behind) must not make the next steps wait for that part only, or
    the group stays split (measured at concurrency 8: target batches of 5.1 rows on average, not 8)."""
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4, gather_s=0.01)
    _one_then_the_rest(step, scheduler, [0, 1, 2, 3])
    assert scheduler.submit(4) == 40  # after a step of 3 it gathers; nobody joins: a step of one row
    assert step.batches == [[0], [1, 2, 3], [4]]
    scheduler.gather_s = 30.0  # from here on the test never depends on timing
    late = [threading.Thread(target=scheduler.submit, args=(5,))]
    late[0].start()
    wait_until(lambda: scheduler._queue.qsize() == 1)  # waits for the group of 3 seen two steps ago
    late += [threading.Thread(target=scheduler.submit, args=(r,)) for r in (6, 7)]
    for t in late[1:]:
        t.start()
    for t in late:
        t.join(timeout=30)
    scheduler.stop()
    assert sorted(step.batches[-1]) == [5, 6, 7] and len(step.batches) == 4


def test_an_announced_cohort_is_gathered_whole_even_when_recent_steps_were_single() -> None:
    """History alone cannot re-merge a group split from its start (every step had part of it): the
    coordinator's cohort does. Measured without it: a concurrency-8 level whose every round's 8 Verify
    rows ran as two forwards of 4."""
    step = GatedStep()
    step.release.set()
    scheduler = BatchScheduler(step, max_batch=4, gather_s=30.0)  # long: the test never depends on timing
    assert scheduler.submit(9) == 90  # a lone step: history now says one row
    rows = [threading.Thread(target=scheduler.submit, args=(0, 3))]
    rows[0].start()
    wait_until(lambda: scheduler._queue.qsize() == 1)  # announced three: it waits instead of running alone
    rows += [threading.Thread(target=scheduler.submit, args=(r, 3)) for r in (1, 2)]
    for t in rows[1:]:
        t.start()
    for t in rows:
        t.join(timeout=30)
    scheduler.stop()
    assert step.batches[0] == [9] and sorted(step.batches[1]) == [0, 1, 2] and len(step.batches) == 2


def test_a_row_announced_alone_runs_at_once_whatever_recent_steps_had() -> None:
    """A straggler out of step (cohort 1) must not wait for a group it is not part of."""
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=4, gather_s=30.0)
    _one_then_the_rest(step, scheduler, [0, 1, 2])  # recent steps: 1 and 2 rows
    assert scheduler._expected() == 2
    done = threading.Thread(target=scheduler.submit, args=(5, 1))
    done.start()
    assert _ends(done)  # with the history's expectation it would wait the 30 s gather
    scheduler.stop()
    assert step.batches[-1] == [5]


def _ends(thread: threading.Thread) -> bool:
    thread.join(timeout=10)
    return not thread.is_alive()


def test_the_late_rows_of_a_cohort_that_left_without_them_wait_only_for_each_other(monkeypatch) -> None:
    """A cohort larger than a batch (or whose gather timed out) leaves in part; its late rows used to
    announce the whole cohort again and wait the full gather for rows that had already gone."""
    monkeypatch.setattr(batch_scheduler, "COHORT_GATHER_S", 30.0)  # long: the test never depends on timing
    step = GatedStep()
    scheduler = BatchScheduler(step, max_batch=2, gather_s=30.0)
    first = [threading.Thread(target=scheduler.submit, args=(r, 3)) for r in (0, 1)]
    for t in first:
        t.start()
    assert step.entered.wait(timeout=30)  # two of the three left (a batch holds two)
    late = threading.Thread(target=scheduler.submit, args=(2, 3))
    late.start()
    wait_until(lambda: scheduler._queue.qsize() == 1)
    step.release.set()
    assert _ends(late)  # before: it waited the 30 s gather for a second row that never came
    assert all(_ends(t) for t in first)
    scheduler.stop()
    assert [sorted(b) for b in step.batches] == [[0, 1], [2]]


def test_rows_of_a_cohort_larger_than_a_batch_queued_together_leave_in_full_batches(monkeypatch) -> None:
    monkeypatch.setattr(batch_scheduler, "COHORT_GATHER_S", 30.0)
    step = GatedStep()
    step.release.set()
    scheduler = BatchScheduler(step, max_batch=2, gather_s=30.0)
    rows = [threading.Thread(target=scheduler.submit, args=(r, 3)) for r in (0, 1, 2)]
    for t in rows:
        t.start()
    assert all(_ends(t) for t in rows)  # the third row's batch expects one row, not the cohort's three
    scheduler.stop()
    assert sorted(len(b) for b in step.batches) == [1, 2]
