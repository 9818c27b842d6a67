"""The generations behind one OpenAI request, driven from the event loop (no gRPC, no HTTP framing here).

A request asks for one choice or several (`n`, a batch of prompts): each choice is a generation of its own,
run by the Orchestrator one round at a time on a worker thread, so the choices of one request verify in one batch
as concurrent requests do. A client that leaves ends every one of them; a choice that fails ends the others, and
the request answers with that failure (as one generation's failure answers it alone). A request first takes a
slot per choice (`GenerationSlots`): at most that many generations run at once, each sure of a thread for its
rounds; the others wait in line, before their first round.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import anyio
from fastapi import Request

from calispec_core.errors import Cancelled, DeadlineExceeded, Unavailable, require
from calispec_core.generation import TokenLogprob
from coordinator.engine import Chunk
from coordinator.openai_protocol import Usage

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Outcome:
    """A whole generation, gathered from its chunks."""

    text: str
    finish: Chunk
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them
    prompt_token_ids: list[int] | None = None  # with prompt log-probabilities (from the first chunk)
    prompt_logprobs: list[TokenLogprob] | None = None


def usage_of(outcomes: Sequence[Outcome], n: int) -> Usage:
    """Each prompt's tokens once (choices k*n .. k*n + n-1 continue prompt k), every choice's new tokens."""
    prompt_tokens = 0
    for outcome in outcomes[::n]:
        assert outcome.finish.stats is not None
        prompt_tokens += outcome.finish.stats.prompt_tokens
    return Usage.of(prompt_tokens, sum(len(o.token_ids) for o in outcomes))


class GenerationSlots:
    """At most `capacity` HTTP generations at once, each sure of a thread for its rounds (`rounds`).

    A generation between two rounds holds no thread, yet it is a member of the lockstep group, whose round start
    waits for it (up to `lockstep_wait_s`). Rounds ran on Starlette's shared pool of 40 threads: past 40 generations
    the pool's threads all waited at the gate for members that had no thread, and every round took the whole wait
    (probed: 41 generations ran 8x slower than 40; three requests of 16 choices timed out). Now a request takes a
    slot per choice before its first round, waiting in line (no thread held, no lockstep membership), and gives
    them back when it ends; the rounds run on threads of their own, without a bound: the slots bound the live
    generations, and a round still in flight of a choice abandoned after its slot went back must not take a thread
    from a member the group waits for. Used on the event loop only."""

    def __init__(self, capacity: int, on_change: Callable[[int, int], None] | None = None) -> None:
        require(capacity >= 1, f"generation slots must be >= 1, got {capacity}")
        self.capacity = capacity
        # not Starlette's pool (40 threads, shared with the responses); threads: about the live generations, plus
        # the rounds still in flight of choices abandoned after their slots went back
        self.rounds = anyio.CapacityLimiter(math.inf)
        self._free = capacity
        self._line: deque[tuple[int, asyncio.Future[None]]] = deque()  # (slots, granted), first come first served
        self._on_change = on_change  # (free slots, choices waiting): the metrics' gauges
        self._changed()

    @property
    def free(self) -> int:
        return self._free

    def waiting(self) -> int:
        """Requests in line (a cancelled one until its task resumes)."""
        return len(self._line)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self._free, sum(n for n, granted in self._line if not granted.done()))

    async def take(self, n: int) -> Callable[[], None]:
        """Wait for `n` slots, all at once (two requests can never each hold part of theirs and wait for the rest);
        returns what gives them back."""
        require(1 <= n <= self.capacity, f"a request takes 1 to {self.capacity} generation slots, got {n}")
        if not self._line and self._free >= n:
            self._free -= n
            self._changed()
            return partial(self._give_back, n)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, granted)
        self._line.append(entry)
        self._changed()
        try:
            await granted
        except BaseException:  # cancelled in line (the client left, its wait ran out, a shutdown)
            if granted.done() and not granted.cancelled():
                self._give_back(n)  # granted just before the cancellation arrived
            else:
                with contextlib.suppress(ValueError):  # `_serve` may have dropped it already
                    self._line.remove(entry)
                self._serve()  # it may have held up smaller requests behind it
            raise
        return partial(self._give_back, n)

    def _give_back(self, n: int) -> None:
        self._free += n
        self._serve()

    def _serve(self) -> None:
        while self._line:
            n, granted = self._line[0]
            if granted.done():  # cancelled in line, its task not yet resumed: it finds itself gone
                self._line.popleft()
                continue
            if n > self._free:
                break
            self._line.popleft()
            self._free -= n
            granted.set_result(None)
        self._changed()


class HttpGeneration:
    """A generation an HTTP request drives from worker threads, one `next` at a time, and can end early.

    A client that leaves (a stream closed mid-way, a request given up on) ends it: the round in flight
    finishes, then the generator is closed, so its sessions are closed and its place in lockstep given
    back at once. Before, an abandoned generator stayed suspended until garbage collection: its sessions
    open until their idle TTL, and the lockstep group waiting for it at every round start. `rounds`: the
    threads its rounds run on (`GenerationSlots.rounds`; None: the event loop's default pool)."""

    def __init__(
        self,
        chunks: Generator[Chunk, None, None],
        gone: threading.Event,
        rounds: anyio.CapacityLimiter | None = None,
        leave_lockstep: Callable[[str], None] | None = None,
    ) -> None:
        self._chunks = chunks
        self._rounds = rounds
        self._leave_lockstep = leave_lockstep  # the orchestrator's Lockstep.leave, for `step_aside`
        self._lock = threading.Lock()  # held by the thread running a round
        self._gone = gone  # the orchestrator's `cancelled`: checked at every round start
        self._done = False  # nothing more to run: its last chunk is out, or it failed or was cancelled
        self._last_out = False  # its last chunk is out: all that is left is its end (its bookkeeping)
        self._ended = False  # the generator returned or raised: nothing at all is left

    def __iter__(self) -> Iterator[Chunk]:
        return self

    def __next__(self) -> Chunk:
        with self._lock:
            if self._gone.is_set():  # abandoned, maybe before its first round: never a silent, empty end
                self._done = True
                raise Cancelled("request cancelled: the client went away")
            try:
                chunk = next(self._chunks)
            except BaseException:
                self._done = self._ended = True
                raise
            self._done = self._last_out = chunk.finish_reason is not None
            return chunk

    def next_or_none(self) -> Chunk | None:
        return next(self, None)

    async def first_round(self) -> Chunk:
        """Its first chunk, computed on a thread of its `rounds`."""
        return await anyio.to_thread.run_sync(self.__next__, limiter=self._rounds)

    async def next_round(self) -> Chunk | None:
        """Its next chunk, computed on a thread of its `rounds`; None once it has ended."""
        return await anyio.to_thread.run_sync(self.next_or_none, limiter=self._rounds)

    def step_aside(self, chunk: Chunk) -> None:
        """After its first round (`chunk`), while this choice waits for its siblings' first rounds before the stream
        starts: out of the lockstep group until its next round, which rejoins it. It stayed a member that came to no
        round start, and a request new to the group (a sibling whose prefill took longer, anyone's) waited for it:
        a streamed n=2 after 20 s idle took 40 s, every other request with it (found by probing)."""
        if self._leave_lockstep is not None and chunk.finish_reason is None:
            self._leave_lockstep(chunk.request_id)

    def abandon(self) -> None:
        """The client is gone: stop at the next round start and close the generator once no round runs
        (on a thread of its own: the caller may be the event loop). A generation whose last chunk is out is
        not cancelled but run to its end (a client gone between its last chunk and the stream's end).
        Both under the caller's context: the request's log line keeps its request id."""
        if self._ended:
            return
        if not self._done:
            self._gone.set()
        run = contextvars.copy_context().run
        threading.Thread(target=run, args=(self._close,), name="http-abandoned", daemon=True).start()

    def _close(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if not self._last_out:  # GeneratorExit at its yield (CANCELLED): the orchestrator's `finally` closes
                self._chunks.close()  # the sessions
                return
            try:  # nothing to cancel: run its end, where it is counted OK and its sessions close
                for _ in self._chunks:
                    pass
            except Exception as exc:  # counted and logged by `tracked`; nobody is left to tell
                log.debug("an abandoned generation failed at its end: %s", exc)


def gather(chunks: Iterable[Chunk]) -> Outcome:
    text: list[str] = []
    ids: list[int] = []
    logprobs: list[TokenLogprob] = []
    first = last = None
    for chunk in chunks:
        text.append(chunk.text)
        ids += chunk.token_ids
        logprobs += chunk.logprobs or ()
        first, last = first or chunk, chunk
    assert first is not None and last is not None and last.finish_reason is not None
    kept = logprobs if last.logprobs is not None else None
    return Outcome("".join(text), last, ids, kept, first.prompt_token_ids, first.prompt_logprobs)


def abandon_all(generations: Sequence[HttpGeneration]) -> None:
    for generation in generations:
        generation.abandon()


def first_failure(failures: Sequence[BaseException | None]) -> BaseException | None:
    """What the request answers: a choice's own failure before the cancellations it caused in the others."""
    real = [f for f in failures if f is not None and not isinstance(f, Cancelled)]
    return real[0] if real else next((f for f in failures if f is not None), None)


async def each_choice(generations: Sequence[HttpGeneration], work: Callable[[HttpGeneration], Awaitable[T]]) -> list[T]:
    """`work` on every choice at once; the first to fail abandons the others (their answers would go nowhere) and
    the request answers with that failure, raised as itself (not wrapped in a task group's ExceptionGroup)."""
    results: list[T | None] = [None] * len(generations)
    failures: list[BaseException | None] = [None] * len(generations)

    async def run(index: int) -> None:
        try:
            results[index] = await work(generations[index])
        except Exception as exc:
            failures[index] = exc
            abandon_all(generations)

    async with anyio.create_task_group() as group:
        for index in range(len(generations)):
            group.start_soon(run, index)
    failure = first_failure(failures)
    if failure is not None:
        raise failure
    return [r for r in results if r is not None]


async def until_disconnect(
    request: Request | None,
    generations: Sequence[HttpGeneration],
    work: Awaitable[T],
    on_disconnect: Callable[[], None],
) -> T:
    """`work`, with `on_disconnect` called if the client disconnects meanwhile (None: no client to watch); `work`'s
    failure raised as itself (not wrapped in the watcher's ExceptionGroup). This request itself cancelled (a
    shutdown): its choices are abandoned, their threads stop at their next round."""
    if request is None:
        return await work

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":  # the body is read: only this is left
            pass
        on_disconnect()

    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as watcher:
            watcher.start_soon(watch)
            try:
                result = await work
            except Exception as exc:
                failure = exc
            watcher.cancel_scope.cancel()
    except BaseException:
        abandon_all(generations)
        raise
    if failure is not None:
        raise failure
    return result


async def admitted(
    slots: GenerationSlots, generations: Sequence[HttpGeneration], request: Request | None, timeout_s: float
) -> Callable[[], None]:
    """A slot for every choice (what gives them back), waiting in line at most `timeout_s` (the request's timeout:
    DeadlineExceeded); a client that leaves meanwhile ends the wait: Cancelled. Either way its choices are
    abandoned (they never started)."""
    line = anyio.CancelScope(deadline=anyio.current_time() + timeout_s)
    gone = False

    def left() -> None:
        nonlocal gone
        gone = True
        line.cancel()

    async def wait() -> Callable[[], None] | None:
        with line:
            return await slots.take(len(generations))
        return None  # the scope was cancelled: the client left, or the wait ran out

    release = await until_disconnect(request, generations, wait(), left)
    if release is not None:
        return release
    abandon_all(generations)
    if gone:
        raise Cancelled("request cancelled: the client went away while it waited for a generation slot")
    raise DeadlineExceeded(
        f"no generation slot came free within {timeout_s:g} s: {slots.capacity} choices generate at once over HTTP "
        "(--http-max-generations), and the requests ahead in line held them"
    )


async def gathered(
    generations: Sequence[HttpGeneration], request: Request | None, stopping: threading.Event | None = None
) -> list[Outcome]:
    """Every choice whole, run at once; all ended early if the client disconnects meanwhile (the answer then
    goes nowhere), when one fails (`each_choice`) or once `stopping` is set (`whole`)."""
    work = each_choice(generations, partial(whole, stopping=stopping))
    return await until_disconnect(request, generations, work, partial(abandon_all, generations))


async def whole(generation: HttpGeneration, stopping: threading.Event | None = None) -> Outcome:
    """A choice's every chunk, a round at a time on a worker thread: between its rounds it holds no thread, so
    that many choices of unary requests never leave streams and other requests without one (they held a thread
    for their whole generation: three requests of 16 choices took more than the pool's 40). Once `stopping` is set
    (the server shuts down after its drain) it ends at its next round with UNAVAILABLE: the server's grace then
    cancelled it, a plain-text 500 and a traceback a request (found by probing)."""
    chunks = []
    while (chunk := await generation.next_round()) is not None:
        chunks.append(chunk)
        if stopping is not None and stopping.is_set() and chunk.finish_reason is None:
            emitted = sum(len(c.token_ids) for c in chunks)
            raise Unavailable(f"the server is shutting down: this request stopped early ({emitted} tokens); retry it")
    return gather(chunks)


async def first_chunks(generations: Sequence[HttpGeneration], request: Request | None = None) -> list[Chunk]:
    """Every choice's first chunk (its first round), at once, so that a bad request still gets its HTTP status
    before a stream starts (`each_choice`); all abandoned if the client disconnects meanwhile (it ran every
    choice's first round, prefill included, for a client long gone)."""

    async def first_aside(generation: HttpGeneration) -> Chunk:
        chunk = await generation.first_round()
        if len(generations) > 1:  # it waits for the others' first rounds
            generation.step_aside(chunk)
        return chunk

    work = each_choice(generations, first_aside)
    return await until_disconnect(request, generations, work, partial(abandon_all, generations))


async def rest_of(first: Chunk, rest: HttpGeneration) -> AsyncIterator[Chunk]:
    """`first`, then the rest, pulled past the last chunk to the generation's end (before the stream's
    `[DONE]`): there the request is counted OK and logged under its id, and its sessions are closed. Stopping
    at the last chunk left the generation suspended until garbage collection ended it, counted CANCELLED."""
    yield first
    while (chunk := await rest.next_round()) is not None:
        yield chunk


async def merged(firsts: Sequence[Chunk], generations: Sequence[HttpGeneration]) -> AsyncIterator[tuple[int, Chunk]]:
    """(choice, chunk) as each choice's rounds end; a choice's failure is raised once the chunks before it are out.

    One task per choice feeds a queue; they are plain asyncio tasks, cancelled when the stream ends, because an
    async generator may be closed from another task than the one that iterates it, which a task group's
    cancel scope does not allow. A cancelled task leaves at most a round in flight: the request's `held`
    abandons every generation."""
    if len(generations) == 1:
        async for chunk in rest_of(firsts[0], generations[0]):
            yield 0, chunk
        return
    # one chunk waiting per choice: a choice runs its next round only once its last chunk is taken (the stream's
    # pace, as with one choice), instead of running ahead of a slow client into memory
    queue: asyncio.Queue[tuple[int, Chunk | None, BaseException | None]] = asyncio.Queue(maxsize=len(generations))

    async def pump(index: int) -> None:
        try:
            async for chunk in rest_of(firsts[index], generations[index]):
                await queue.put((index, chunk, None))
        except Exception as exc:
            await queue.put((index, None, exc))
            return
        await queue.put((index, None, None))  # this choice is done

    tasks = [asyncio.create_task(pump(i)) for i in range(len(generations))]
    try:
        running = len(tasks)
        while running:
            index, chunk, failure = await queue.get()
            if failure is not None:
                raise failure
            if chunk is None:
                running -= 1
            else:
                yield index, chunk
    finally:
        for task in tasks:
            task.cancel()
