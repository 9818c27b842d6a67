import heapq
import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(order=True)
class Job:
    run_at: datetime
    order: int
    name: str = field(compare=False)
    every: timedelta | None = field(default=None, compare=False)


class Scheduler:
    """Runs named jobs at given times; repeating jobs are put back after each run."""

    def __init__(self) -> None:
        self._queue: list[Job] = []
        self._counter = itertools.count()
        self.log: list[str] = []

    def schedule(self, name: str, run_at: datetime, every: timedelta | None = None) -> None:
        heapq.heappush(self._queue, Job(run_at, next(self._counter), name, every))

    def run_until(self, now: datetime) -> int:
        """Run every job due at or before now; returns how many ran."""
        ran = 0
        while self._queue and self._queue[0].run_at <= now:
            job = heapq.heappop(self._queue)
            self.log.append(f"{job.run_at:%H:%M} {job.name}")
            ran += 1
            if job.every is not None:
                self.schedule(job.name, job.run_at + job.every, job.every)
        return ran

    def next_run(self) -> datetime | None:
        return self._queue[0].run_at if self._queue else None


def parse_duration(text: str) -> timedelta:
    """Parse '1h30m', '45m', '2h' or '90s' into a timedelta."""
    units = {"h": 3600, "m": 60, "s": 1}
    seconds = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            number += char
        elif char in units and number:
            seconds += int(number) * units[char]
            number = ""
        else:
            raise ValueError(f"cannot parse duration {text!r}")
    if number:
        raise ValueError(f"missing unit at the end of {text!r}")
    return timedelta(seconds=seconds)


def business_days_between(start: datetime, end: datetime) -> int:
    """Weekdays from start (inclusive) to end (exclusive)."""
    days = 0
    current = start
    while current < end:
        if current.weekday() < 5:
            days += 1
        current += timedelta(days=1)
    return days
