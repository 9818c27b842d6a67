"""The load loop: streams requests through AsyncCalispecClient and records what the client sees.

Request slot s runs mode modes[s % M] on prompt (s // M) % P: modes interleave one request at
a time, so every mode meets the same prompts and the same machine noise.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from calispec.client import AsyncCalispecClient, CalispecRpcError
from calispec_tools.bench.arrivals import arrival_times
from calispec_tools.bench.metrics import RequestRecord, summarize_level
from calispec_tools.bench.prompts import Prompt

DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class LoadConfig:
    modes: tuple[str, ...] = ("ar", "sd", "csd")
    num_requests: int = 30  # measured requests per level, all modes together
    duration_s: float | None = None  # stop starting new requests after this (in-flight ones finish)
    warmup_requests: int | None = None  # None: one per mode
    burstiness: float = 1.0  # gamma shape of open-loop gaps; 1 = Poisson
    seed: int = 0
    max_new_tokens: int | None = None  # None: each prompt's own, else DEFAULT_MAX_NEW_TOKENS; set: overrides all
    gamma: int | None = None  # None: the server's default (adaptive γ: no per-position acceptance)
    tau: float | None = None
    lambda_: int | None = None
    temperature: float = 0.0
    timeout_s: float = 300.0
    ignore_eos: bool = False  # every request runs to its token limit: a fixed length, whatever the text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Level:
    """One point of a sweep: a closed loop at `concurrency` or an open loop at `rate` requests/s."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"concurrency={self.concurrency}" if self.concurrency is not None else f"rate={self.rate}/s"


class Progress:
    """One line on stderr, redrawn in place: `[#####.....] 12/40 err 0`."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.done = self.errors = 0

    def update(self, record: RequestRecord) -> None:
        self.done += 1
        self.errors += record.error is not None
        filled = min(self.width, self.width * self.done // self.total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} err {self.errors}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


class Plan:
    """What slot s asks: mode, prompt and request parameters."""

    def __init__(self, prompts: Sequence[Prompt], config: LoadConfig) -> None:
        self.prompts, self.config = list(prompts), config

    def mode(self, slot: int) -> str:
        return self.config.modes[slot % len(self.config.modes)]

    def prompt_index(self, slot: int) -> int:
        return (slot // len(self.config.modes)) % len(self.prompts)

    def max_new_tokens(self, slot: int) -> int:
        c = self.config
        return c.max_new_tokens or self.prompts[self.prompt_index(slot)].max_new_tokens or DEFAULT_MAX_NEW_TOKENS

    def new_record(self, slot: int) -> RequestRecord:
        mode = self.mode(slot)
        gamma = 0 if mode == "ar" else (self.config.gamma or 0)  # 0: adaptive, rounds differ
        return RequestRecord(slot, mode, self.prompt_index(slot), self.max_new_tokens(slot), gamma)

    def params(self, slot: int) -> dict[str, Any]:
        c = self.config
        return {
            "mode": self.mode(slot),
            "max_new_tokens": self.max_new_tokens(slot),
            "num_speculative_tokens": c.gamma,
            "tau": c.tau,
            "lambda_": c.lambda_,
            "temperature": c.temperature,
            "seed": c.seed + slot if c.temperature > 0 else None,
            "ignore_eos": c.ignore_eos,
        }


async def one_request(client: AsyncCalispecClient, plan: Plan, slot: int, t0: float) -> RequestRecord:
    record = plan.new_record(slot)
    prompt = plan.prompts[record.prompt_index].text
    start = time.perf_counter()
    record.start_s = start - t0
    try:
        async for chunk in client.generate_stream(prompt, timeout=plan.config.timeout_s, **plan.params(slot)):
            offset = time.perf_counter() - start
            if record.ttft_s is None:
                record.ttft_s = offset
            record.chunk_offsets_s.append(offset)
            record.chunk_tokens.append(len(chunk.token_ids))
            if chunk.finish_reason is not None:
                record.finish_reason = chunk.finish_reason
                record.stats = chunk.stats.to_dict() if chunk.stats else None
        if record.finish_reason is None:
            record.error = "CLIENT_INCOMPLETE_STREAM"
        else:
            record.e2e_s = time.perf_counter() - start
    except CalispecRpcError as exc:
        record.error = exc.code
    except Exception as exc:  # a load tester reports client failures instead of dying mid-run
        record.error = f"CLIENT_{type(exc).__name__}"
    return record


OnDone = Callable[[RequestRecord], None]


async def closed_loop(
    client: AsyncCalispecClient, plan: Plan, slots: range, concurrency: int, stop_at: float, on_done: OnDone
) -> list[RequestRecord]:
    """`concurrency` workers, each sending its next request as soon as its last one finished."""
    records: list[RequestRecord] = []
    pending = iter(slots)  # shared by the workers; asyncio runs them on one thread
    t0 = time.perf_counter()

    async def worker() -> None:
        for slot in pending:
            if time.perf_counter() >= stop_at:
                return
            record = await one_request(client, plan, slot, t0)
            records.append(record)
            on_done(record)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def open_loop(
    client: AsyncCalispecClient, plan: Plan, slots: range, rate: float, stop_at: float, on_done: OnDone
) -> list[RequestRecord]:
    """Requests start at gamma/Poisson arrival times, whatever is still in flight."""
    c = plan.config
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for slot, offset in zip(slots, arrival_times(rate, len(slots), c.burstiness, c.seed), strict=True):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() >= stop_at:
            break
        task = asyncio.create_task(one_request(client, plan, slot, t0))
        task.add_done_callback(lambda t: on_done(t.result()))
        tasks.append(task)
    return list(await asyncio.gather(*tasks))


async def run_level(
    client: AsyncCalispecClient, plan: Plan, level: Level, progress_stream: TextIO | None = None
) -> dict[str, Any]:
    """Warm-up (closed loop, not counted), then the measured phase; returns the level's figures and records."""
    c = plan.config
    warmup = len(c.modes) if c.warmup_requests is None else c.warmup_requests
    if warmup:
        quiet = Progress(warmup, f"warm-up  {level.label}", progress_stream)
        await closed_loop(client, plan, range(warmup), level.concurrency or 1, float("inf"), quiet.update)
        quiet.close()
    progress = Progress(c.num_requests, f"measured {level.label}", progress_stream)
    slots = range(warmup, warmup + c.num_requests)  # warm-up prompts are not re-measured first
    start = time.perf_counter()
    stop_at = start + c.duration_s if c.duration_s else float("inf")
    if level.concurrency is not None:
        records = await closed_loop(client, plan, slots, level.concurrency, stop_at, progress.update)
    else:
        assert level.rate is not None
        records = await open_loop(client, plan, slots, level.rate, stop_at, progress.update)
    window_s = time.perf_counter() - start
    progress.close()
    records.sort(key=lambda r: r.slot)
    return {
        "level": asdict(level),
        **summarize_level(records, c.modes, window_s),
        "records": [r.to_dict() for r in records],
    }


async def run_sweep(
    address: str,
    prompts: Sequence[Prompt],
    config: LoadConfig,
    levels: Sequence[Level],
    progress: TextIO | None = None,
    client_options: Mapping[str, Any] | None = None,
    client: Any = None,
) -> list[dict[str, Any]]:
    """`client_options`: AsyncCalispecClient's token / tls_ca / tls_server_name. `client`: an
    AsyncCalispecClient look-alike to use instead (bench/openai_client.py drives the HTTP API)."""
    plan = Plan(prompts, config)
    grpc_client = None if client else AsyncCalispecClient(address, timeout=config.timeout_s, **(client_options or {}))
    async with client or grpc_client as client:
        return [await run_level(client, plan, level, progress) for level in levels]
