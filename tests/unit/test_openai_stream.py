"""The OpenAI API gives back what a request holds however its response ends: its drain and quota slots,
and its generation (the orchestrator's sessions and place in lockstep) when the client leaves early."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Generator, Iterator
from contextlib import ExitStack

import anyio
import pytest
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from calispec_core.errors import Cancelled, InvalidArgument, Unavailable
from calispec_core.generation import FinishReason, GenerationStats
from calispec_core.metrics import new_registry
from calispec_core.request_context import bound_request_id
from calispec_core.timing import Deadline
from coordinator.engine import Chunk, Orchestrator, SpeculationConfig
from coordinator.metrics import CoordinatorMetrics, RequestTimer
from coordinator.openai_api import StreamBounds, stream
from coordinator.openai_generations import GenerationSlots, HttpGeneration, first_chunks, gathered, merged
from coordinator.request_log import tracked
from tests.helpers import wait_until
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_orchestrator import alphabet_target, params, sloppy_draft


class Event(BaseModel):
    text: str


def _held() -> tuple[ExitStack, list[str]]:
    released: list[str] = []
    held = ExitStack()
    held.callback(released.append, "slot")
    return held, released


def _chunks() -> list[Chunk]:
    return [Chunk([1], "a", "r"), Chunk([2], "b", "r")]


async def _serve(held: ExitStack, send, generation: HttpGeneration | None = None) -> None:
    generation = generation or HttpGeneration((c for c in _chunks()), threading.Event())
    response = await stream([generation], 1, held, [], lambda i, c: Event(text=c.text), None)

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client says nothing more
        return {"type": "http.disconnect"}

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)


def test_a_client_gone_before_the_first_byte_still_gives_its_slot_back() -> None:
    """The body's generator never starts when the first send fails, so its own `with held` never ran: every
    such client used to keep a quota slot and the drain's count for good."""
    held, released = _held()

    async def gone(message: dict) -> None:
        raise OSError("connection reset by peer")

    with pytest.raises(ClientDisconnect):
        asyncio.run(_serve(held, gone))
    assert released == ["slot"]


def test_a_stream_that_ends_gives_its_slot_back_once() -> None:
    held, released = _held()
    body: list[bytes] = []

    async def client(message: dict) -> None:
        body.append(message.get("body", b""))

    asyncio.run(_serve(held, client))
    assert released == ["slot"]
    text = b"".join(body).decode()
    assert '"text":"a"' in text and '"text":"b"' in text and "[DONE]" in text


class EndlessGeneration:
    """Chunks until the request is cancelled (as the orchestrator checks `cancelled` at each round start);
    records whether its `finally` ran: the orchestrator's closes its sessions and leaves lockstep there."""

    def __init__(self) -> None:
        self.gone = threading.Event()
        self.closed = threading.Event()
        self.in_round = threading.Event()

    def chunks(self, block: bool = False) -> Generator[Chunk, None, None]:
        try:
            while True:
                self.in_round.set()
                if block and not self.gone.wait(timeout=20):  # a round that lasts until the client leaves
                    raise AssertionError("the client's disconnect never reached the generation")
                if self.gone.is_set():
                    raise Cancelled("request cancelled by the client")
                yield Chunk([1], "a", "r")
        finally:
            self.closed.set()


def test_a_client_gone_mid_stream_ends_its_generation() -> None:
    """An abandoned generator stayed suspended until garbage collection: its draft and target sessions
    open until their idle TTL (probed: 121 s), and its lockstep group waiting for it at every round start."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(), endless.gone)
    held, released = _held()
    sent: list[dict] = []

    async def gone_after_two_events(message: dict) -> None:
        sent.append(message)
        if len(sent) > 2:
            raise OSError("connection reset by peer")

    with pytest.raises(ClientDisconnect):
        asyncio.run(_serve(held, gone_after_two_events, generation))
    assert released == ["slot"]
    wait_until(endless.closed.is_set)  # closed on a thread of its own, once no round runs
    assert endless.gone.is_set()


def test_a_client_that_disconnects_from_a_unary_request_ends_its_generation() -> None:
    """A non-streaming request ran to the end of its generation after its client had left."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(block=True), endless.gone)

    class LeftRequest:
        async def receive(self) -> dict:  # the client leaves while the first round runs
            assert await asyncio.to_thread(endless.in_round.wait, 20)
            return {"type": "http.disconnect"}

    with pytest.raises(Cancelled):  # itself, not wrapped in an ExceptionGroup by the watcher's task group
        asyncio.run(gathered([generation], LeftRequest()))  # type: ignore[arg-type]
    wait_until(endless.closed.is_set)


def test_a_unary_request_still_running_when_the_server_stops_ends_unavailable_at_its_next_round() -> None:
    """After the drain, the server's grace cancelled what still ran: a non-streaming request got a plain-text 500
    and the log a traceback (found by probing), where streams ended with an UNAVAILABLE event."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(), endless.gone)
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(Unavailable, match=r"shutting down: this request stopped early \(1 tokens\)"):
        asyncio.run(gathered([generation], None, stopping))
    wait_until(endless.closed.is_set)  # its sessions closed


def test_a_client_that_disconnects_before_a_streams_first_event_ends_its_generation() -> None:
    """The first rounds (every choice's, prefills included) ran to their end for a client long gone: probed, 30
    such streams kept the server busy for ~2.5 minutes after their client had exited (wave 50)."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(block=True), endless.gone)
    held, released = _held()

    class LeftRequest:
        async def receive(self) -> dict:  # the client leaves while the first round runs
            assert await asyncio.to_thread(endless.in_round.wait, 20)
            return {"type": "http.disconnect"}

    async def serve():
        return await stream([generation], 1, held, [], _text_event, None, request=LeftRequest())  # type: ignore[arg-type]

    response = asyncio.run(serve())
    assert response.status_code == 499 and released == ["slot"]  # CANCELLED, as a unary request's
    wait_until(endless.closed.is_set)


def test_a_stream_whose_client_stops_reading_lets_go_of_what_it_holds_at_its_deadline() -> None:
    """A client that stopped reading without leaving blocked the stream in `send`: it held its slots and its
    generation for as long as its connection lived (found by review, wave 50; gRPC cancels such a call)."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(), endless.gone)
    held, released = _held()
    stalled = asyncio.Event()

    async def never_reads(message: dict) -> None:
        if message.get("body"):
            stalled.set()
            await asyncio.Event().wait()  # the socket's buffer is full: this send never returns

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def main() -> None:
        bounds = StreamBounds(GenerationSlots(16), 0.0, threading.Event())  # let go at once: 0 s + the grace
        response = await stream([generation], 1, held, [], _text_event, None, bounds=bounds)
        serving = asyncio.create_task(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, never_reads))
        await stalled.wait()
        await asyncio.to_thread(wait_until, lambda: released == ["slot"])  # let go with the send still waiting
        assert not serving.done()
        serving.cancel()

    asyncio.run(main())
    wait_until(endless.closed.is_set)  # its generation ended too


def test_a_stream_running_when_the_server_stops_ends_with_an_error_event() -> None:
    """uvicorn's grace ran out and cut such streams mid-body: no error event, no [DONE] (found by probing, wave 50)."""
    endless = EndlessGeneration()
    generation = HttpGeneration(endless.chunks(), endless.gone)
    held, released = _held()
    stopping = threading.Event()
    body: list[bytes] = []

    async def client(message: dict) -> None:
        body.append(message.get("body", b""))
        if len(body) == 3:  # the response start, then the first event: the server begins to stop
            stopping.set()

    async def receive() -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def main() -> None:
        bounds = StreamBounds(GenerationSlots(16), 60.0, stopping)
        response = await stream([generation], 1, held, [], _text_event, None, bounds=bounds)
        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, client)

    asyncio.run(main())
    text = b"".join(body).decode()
    assert '"code":"unavailable"' in text and "shutting down" in text and text.rstrip().endswith("data: [DONE]")
    assert released == ["slot"]
    wait_until(endless.closed.is_set)


def _text_event(index: int, chunk: Chunk) -> Event:
    return Event(text=chunk.text)


def test_a_generation_that_finished_is_not_abandoned() -> None:
    chunks = (c for c in [Chunk([1], "a", "r"), Chunk([2], "b", "r", FinishReason.STOP)])
    gone = threading.Event()
    generation = HttpGeneration(chunks, gone)
    assert [c.text for c in generation] == ["a", "b"]
    generation.abandon()
    assert not gone.is_set()


def test_a_generation_abandoned_before_its_first_round_is_cancelled_not_empty() -> None:
    gone = threading.Event()
    generation = HttpGeneration((c for c in [Chunk([1], "a", "r", FinishReason.STOP)]), gone)
    generation.abandon()
    with pytest.raises(Cancelled):
        next(generation)


def _tracked(metrics: CoordinatorMetrics, chunks: list[Chunk]) -> HttpGeneration:
    """A generation with the HTTP API's bookkeeping (`tracked`), of these chunks."""

    def begin(timer: RequestTimer) -> Iterator[Chunk]:
        timer.mode = "sd"
        return iter(chunks)

    return HttpGeneration(tracked(metrics, begin), threading.Event())


def _finishing_chunks() -> list[Chunk]:
    return [Chunk([1], "a", "r"), Chunk([2], "b", "r", FinishReason.STOP, GenerationStats(prompt_tokens=1))]


def _requests(metrics: CoordinatorMetrics, status: str) -> float:
    return metrics.requests.labels("sd", status)._value.get()


def _log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "coordinator.request_log"]


def test_a_stream_that_ends_is_counted_ok_under_its_request_id_before_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stream stopped pulling at the last chunk: the generation stayed suspended until garbage collection
    closed it, and every completed HTTP stream was counted CANCELLED, its log line at times under `id=-`."""
    metrics = CoordinatorMetrics(new_registry())
    generation = _tracked(metrics, _finishing_chunks())
    held, released = _held()

    async def client(message: dict) -> None:
        pass

    with caplog.at_level(logging.INFO, logger="coordinator.request_log"), bound_request_id("http-req-9"):
        asyncio.run(_serve(held, client, generation))
        assert (_requests(metrics, "OK"), _requests(metrics, "CANCELLED")) == (1, 0)  # while `generation` lives
    assert released == ["slot"]
    assert [line.split(" tokens=")[0] for line in _log_lines(caplog)] == [
        "request id=http-req-9 mode=sd status=OK prompt_tokens=1"
    ]


def test_a_client_gone_after_the_last_chunk_leaves_a_finished_request_not_a_cancelled_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its last chunk is out: abandoning it runs its end (counted OK, sessions closed), under its request id."""
    metrics = CoordinatorMetrics(new_registry())
    generation = _tracked(metrics, _finishing_chunks())
    assert [next(generation).text, next(generation).text] == ["a", "b"]  # the end not yet pulled
    with caplog.at_level(logging.INFO, logger="coordinator.request_log"):
        with bound_request_id("http-req-10"):
            generation.abandon()
        wait_until(lambda: _log_lines(caplog))  # run on a thread of its own, logged last
    assert (_requests(metrics, "OK"), _requests(metrics, "CANCELLED")) == (1, 0)
    assert _log_lines(caplog)[0].startswith("request id=http-req-10 mode=sd status=OK ")


def test_a_client_gone_mid_stream_is_cancelled_under_its_request_id(caplog: pytest.LogCaptureFixture) -> None:
    """The generation is closed on a thread of its own: its log line said `id=-`."""
    metrics = CoordinatorMetrics(new_registry())
    generation = _tracked(metrics, _finishing_chunks())
    assert next(generation).text == "a"
    with caplog.at_level(logging.INFO, logger="coordinator.request_log"):
        with bound_request_id("http-req-11"):
            generation.abandon()
        wait_until(lambda: _log_lines(caplog))
    assert (_requests(metrics, "OK"), _requests(metrics, "CANCELLED")) == (0, 1)
    assert _log_lines(caplog)[0].startswith("request id=http-req-11 mode=sd status=CANCELLED ")


def _fails_at_second_round(text: str, others_started: threading.Event) -> HttpGeneration:
    """A choice whose second round fails, once the other choice's first round has begun: a choice abandoned before
    its first round never starts its generator (nothing to close, `closed` never set), and under a loaded test run
    the thread pool could start it after this one's two rounds (a 30 s `wait_until` failure, seen once)."""

    def chunks() -> Generator[Chunk, None, None]:
        yield Chunk([1], text, "r")
        assert others_started.wait(timeout=20)
        raise InvalidArgument(f"choice {text!r} failed")

    return HttpGeneration(chunks(), threading.Event())


def test_a_choice_that_fails_ends_the_others_and_answers_the_request() -> None:
    """n choices are n generations: one's failure is the request's answer, and the others stop at their next
    round start instead of running to their end for an answer that goes nowhere."""
    endless = EndlessGeneration()
    others = HttpGeneration(endless.chunks(block=True), endless.gone)

    class StillThere:
        async def receive(self) -> dict:
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

    with pytest.raises(InvalidArgument, match="choice 'b' failed"):  # not the Cancelled it caused in the other
        asyncio.run(gathered([others, _fails_at_second_round("b", endless.in_round)], StillThere()))  # type: ignore[arg-type]
    wait_until(endless.closed.is_set)


def test_a_choice_that_fails_mid_stream_ends_the_stream_and_the_others() -> None:
    endless = EndlessGeneration()
    generations = [HttpGeneration(endless.chunks(), endless.gone), _fails_at_second_round("b", endless.in_round)]
    held, released = _held()
    body: list[bytes] = []

    async def serve() -> None:
        response = await stream(generations, 1, held, [], lambda i, c: Event(text=f"{i}{c.text}"), None)

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        async def client(message: dict) -> None:
            body.append(message.get("body", b""))

        await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, client)

    asyncio.run(serve())
    text = b"".join(body).decode()
    assert '"text":"1b"' in text and '"text":"0a"' in text  # both choices streamed, each under its index
    assert "choice 'b' failed" in text and text.endswith("data: [DONE]\n\n")
    assert released == ["slot"]
    wait_until(endless.closed.is_set)


def test_a_unary_request_holds_a_worker_thread_per_round_not_per_generation() -> None:
    """Its choices each held one of the HTTP server's worker threads for their whole generation, so enough of them
    left streams and other requests no thread between rounds. With one thread here, choice a's second round waits
    for choice b's first, which runs only if a gives the thread back between its rounds."""
    b_ran = threading.Event()

    def a() -> Iterator[Chunk]:
        yield Chunk([1], "a", "r")
        if not b_ran.wait(10):
            raise AssertionError("choice b never got the thread")
        yield Chunk([2], "a", "r", FinishReason.LENGTH, GenerationStats())

    def b() -> Iterator[Chunk]:
        b_ran.set()
        yield Chunk([3], "b", "r", FinishReason.LENGTH, GenerationStats())

    class StillThere:
        async def receive(self) -> dict:
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

    async def on_one_thread() -> list:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        choices = [HttpGeneration(a(), threading.Event()), HttpGeneration(b(), threading.Event())]
        return await gathered(choices, StillThere())  # type: ignore[arg-type]

    assert [outcome.text for outcome in asyncio.run(on_one_thread())] == ["aa", "b"]


def test_a_choice_waiting_for_its_siblings_first_rounds_holds_no_round_start() -> None:
    """A streamed n=2: the choice whose first round ended first stayed a lockstep member while it waited for its
    sibling's first round, and the sibling (its prefill slower), a newcomer at the round start, waited for it up to
    max_wait_s plus twice a round; after idle time up to the 60 s timeout, every other request with it (found by
    probing). Here the lockstep would wait a minute: the choices' first rounds must not."""
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    orchestrator = Orchestrator(
        CharTokenizer(), draft, [target], (EOS,), 4096, speculation=SpeculationConfig(lockstep_wait_s=60)
    )
    first_verified, prefills, lock = threading.Event(), [], threading.Lock()
    real_prefill, real_verify = target.prefill, target.verify

    def prefill(*args: object, **kwargs: object) -> object:
        with lock:
            prefills.append(args[0])
            second = len(prefills) == 2
        if second:  # the sibling's prefill ends after the first choice's first round
            assert first_verified.wait(30)
        return real_prefill(*args, **kwargs)

    def verify(*args: object, **kwargs: object) -> object:
        verdict = real_verify(*args, **kwargs)
        first_verified.set()
        return verdict

    target.prefill, target.verify = prefill, verify  # type: ignore[method-assign]
    generations = [
        HttpGeneration(
            orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=6), Deadline(60)),
            threading.Event(),
            leave_lockstep=orchestrator.lockstep.leave,
        )
        for _ in range(2)
    ]

    async def run() -> list[str]:
        with anyio.fail_after(20):
            firsts = await first_chunks(generations)
            assert orchestrator.lockstep.members() == 0  # both out of the group until their next rounds
            texts = ["", ""]
            async for index, chunk in merged(firsts, generations):
                texts[index] += chunk.text
            return texts

    assert anyio.run(run) == ["defghi", "defghi"]
