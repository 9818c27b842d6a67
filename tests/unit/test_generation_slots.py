"""The OpenAI API's generation slots: at most so many HTTP choices generate at once, each sure of a thread for its
rounds; the rest wait in line, first come first served, a request's choices all at once (wave 50, found by probing:
past Starlette's 40 threads every lockstep round waited out `lockstep_wait_s` for a member without a thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator

import pytest

from calispec_core.errors import Cancelled
from calispec_core.generation import FinishReason
from coordinator.engine import Chunk
from coordinator.openai_generations import GenerationSlots, HttpGeneration, admitted, gathered

ROUNDS = 3


def gated_chunks(gate: threading.Barrier) -> Generator[Chunk, None, None]:
    """A lockstep member's rounds: each starts only once every member of the group is in a round (the barrier's
    timeout stands for lockstep's wait: a member without a thread breaks it)."""
    for i in range(ROUNDS):
        gate.wait()
        yield Chunk([i], "x", "r", FinishReason.LENGTH if i == ROUNDS - 1 else None)


async def three_requests_of_16(slots: GenerationSlots, rounds, gate: threading.Barrier) -> list[int]:
    async def one_request() -> int:
        generations = [HttpGeneration(gated_chunks(gate), threading.Event(), rounds) for _ in range(16)]
        release = await admitted(slots, generations, None, 60)
        try:
            return len(await gathered(generations, None))
        finally:
            release()

    return list(await asyncio.gather(*(one_request() for _ in range(3))))


def test_more_choices_than_starlettes_pool_run_their_rounds_together() -> None:
    slots = GenerationSlots(48)
    gate = threading.Barrier(48, timeout=60)
    assert asyncio.run(three_requests_of_16(slots, slots.rounds, gate)) == [16, 16, 16]
    assert slots.free == 48 and slots.waiting() == 0


def test_on_starlettes_pool_the_same_choices_cannot_all_be_in_a_round() -> None:
    """The defect the slots' threads fix, reproduced: 40 threads for 48 members."""
    slots = GenerationSlots(48)
    gate = threading.Barrier(48, timeout=3)
    with pytest.raises(threading.BrokenBarrierError):
        asyncio.run(three_requests_of_16(slots, None, gate))  # None: the event loop's default pool (40)


def test_slots_are_taken_whole_and_first_come_first_served() -> None:
    async def main() -> list[str]:
        slots, order = GenerationSlots(16), []
        first = await slots.take(10)

        async def request(name: str, n: int) -> None:
            release = await slots.take(n)
            order.append(name)
            release()

        big = asyncio.create_task(request("big", 16))  # waits for all 16, though 6 are free
        await asyncio.sleep(0)  # in line before the small one (an event loop turn, not a wait for time)
        small = asyncio.create_task(request("small", 2))  # fits now, but a request ahead waits
        await asyncio.sleep(0)
        assert order == [] and slots.waiting() == 2 and slots.free == 6
        first()
        await asyncio.gather(big, small)
        assert slots.free == 16
        return order

    assert asyncio.run(main()) == ["big", "small"]


def test_a_request_that_leaves_the_line_lets_the_next_one_in() -> None:
    async def main() -> None:
        slots = GenerationSlots(16)
        held = await slots.take(10)
        big = asyncio.create_task(slots.take(16))
        await asyncio.sleep(0)
        small = asyncio.create_task(slots.take(6))
        await asyncio.sleep(0)
        assert not small.done()  # behind the big one
        big.cancel()
        release_small = await small  # served once the request ahead left the line
        assert slots.waiting() == 0 and slots.free == 0
        release_small()
        held()
        assert slots.free == 16

    asyncio.run(main())


def test_a_request_granted_as_it_is_cancelled_gives_its_slots_back() -> None:
    async def main() -> None:
        slots = GenerationSlots(16)
        held = await slots.take(16)
        waiting = asyncio.create_task(slots.take(4))
        await asyncio.sleep(0)
        held()  # grants the waiter's slots...
        waiting.cancel()  # ...before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert slots.free == 16

    asyncio.run(main())


def test_a_request_cancelled_in_line_as_another_gives_back_loses_no_slot() -> None:
    """Cancelling the waiter cancels its future at once, but its entry stayed in line until its task resumed: a
    release in between granted the cancelled entry (InvalidStateError in the releasing request, ValueError in the
    leaving one) and the slots were gone for good (found by review, wave 50)."""

    async def main() -> tuple[int, int]:
        slots = GenerationSlots(16)
        held = await slots.take(16)
        waiting = asyncio.create_task(slots.take(4))
        behind = asyncio.create_task(slots.take(2))
        await asyncio.sleep(0)
        waiting.cancel()  # the client left...
        held()  # ...and another request ended, in the same pass of the loop
        with pytest.raises(asyncio.CancelledError):
            await waiting
        (await behind)()  # the one behind it was served
        return slots.free, slots.waiting()

    assert asyncio.run(main()) == (16, 0)


def test_a_wait_in_line_past_the_requests_timeout_is_deadline_exceeded() -> None:
    from calispec_core.errors import DeadlineExceeded

    async def main() -> list[HttpGeneration]:
        slots = GenerationSlots(16)
        held = await slots.take(16)
        generations = [HttpGeneration(gated_chunks(threading.Barrier(1)), threading.Event()) for _ in range(2)]
        with pytest.raises(DeadlineExceeded, match=r"no generation slot came free within 0\.05 s"):
            await admitted(slots, generations, None, 0.05)
        assert slots.waiting() == 0
        held()
        assert slots.free == 16
        return generations

    for generation in asyncio.run(main()):
        with pytest.raises(Cancelled):  # abandoned: it never starts
            next(generation)


def test_the_gauges_follow_the_free_slots_and_the_choices_in_line() -> None:
    seen: list[tuple[int, int]] = []

    async def main() -> None:
        slots = GenerationSlots(16, lambda free, waiting: seen.append((free, waiting)))
        first = await slots.take(10)
        big = asyncio.create_task(slots.take(16))
        await asyncio.sleep(0)
        first()
        (await big)()

    asyncio.run(main())
    assert seen == [(16, 0), (6, 0), (6, 16), (0, 0), (16, 0)]


@pytest.mark.parametrize("n", [0, 17])
def test_a_request_takes_one_to_capacity_slots(n: int) -> None:
    with pytest.raises(Exception, match="generation slots"):
        asyncio.run(GenerationSlots(16).take(n))


def test_a_client_that_leaves_while_in_line_is_cancelled_and_its_choices_abandoned() -> None:
    async def main() -> list[HttpGeneration]:
        slots = GenerationSlots(16)
        await slots.take(16)  # all taken: the request waits in line
        generations = [HttpGeneration(gated_chunks(threading.Barrier(1)), threading.Event()) for _ in range(2)]

        class Leaves:
            async def receive(self) -> dict:
                return {"type": "http.disconnect"}

        with pytest.raises(Cancelled, match="while it waited for a generation slot"):
            await admitted(slots, generations, Leaves(), 60)  # type: ignore[arg-type]
        assert slots.waiting() == 0 and slots.free == 0
        return generations

    for generation in asyncio.run(main()):
        with pytest.raises(Cancelled):  # abandoned before its first round
            next(generation)


def test_the_coordinator_gives_its_http_api_the_slots_it_was_configured_with(tmp_path) -> None:
    from types import SimpleNamespace

    import coordinator.__main__ as coordinator_cli
    from coordinator.config import HTTP_MAX_GENERATIONS
    from coordinator.openai_api import OpenAIApi, api_settings
    from coordinator.openai_protocol import CompletionRequest

    base = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", str(tmp_path)]
    assert coordinator_cli.parse_config(base)[0].http_max_generations == HTTP_MAX_GENERATIONS
    config = coordinator_cli.parse_config([*base, "--http-max-generations", "20"])[0]
    api = OpenAIApi(SimpleNamespace(tokenizer=None), api_settings(config, None, None))  # type: ignore[arg-type]
    assert api.slots.capacity == 20
    request = CompletionRequest(model=config.model_name, prompt="hi")
    assert all(g._rounds is api.slots.rounds for g in api.generations([lambda: "hi"], request))


def test_fewer_slots_than_a_requests_choices_are_refused(tmp_path, capsys) -> None:
    import coordinator.__main__ as coordinator_cli
    from coordinator.config import CoordinatorConfig

    with pytest.raises(ValueError, match="http_max_generations must be >= 16"):
        CoordinatorConfig("d:1", ("t:1",), tmp_path, http_max_generations=15)
    with pytest.raises(SystemExit):
        coordinator_cli.parse_config(["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "t",
                                      "--http-max-generations", "15"])  # fmt: skip
    assert "--http-max-generations: must be >= 16" in capsys.readouterr().err
