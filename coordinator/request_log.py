"""One generate request's bookkeeping, shared by both front ends (gRPC servicer, HTTP API).

`tracked` wraps the orchestrator's chunks: it times and counts them into `CoordinatorMetrics`
and writes the one logfmt line per request at INFO, under the request id bound at the door.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from calispec_core.errors import CalispecError
from calispec_core.generation import GenerationStats
from calispec_core.request_context import current_request_id
from coordinator.engine import Chunk
from coordinator.metrics import CoordinatorMetrics, RequestTimer

log = logging.getLogger(__name__)


def tracked(metrics: CoordinatorMetrics, begin: Callable[[RequestTimer], Iterator[Chunk]]) -> Iterator[Chunk]:
    """`begin(timer)`'s chunks, timed and counted; `begin` parses the request (setting `timer.mode`)
    and starts the generation, so that a bad request is counted and logged like any other."""
    timer = metrics.track()
    stats, session = None, None
    try:
        for chunk in begin(timer):
            timer.tokens_out(len(chunk.token_ids))
            stats, session = chunk.stats, chunk.request_id
            yield chunk
    except BaseException as exc:
        finished(timer, status_of(exc), stats, session)
        raise
    finished(timer, "OK", stats, session)


def status_of(exc: BaseException) -> str:
    """The gRPC status name a failed request is counted under (for HTTP too, one vocabulary)."""
    if isinstance(exc, GeneratorExit):
        return "CANCELLED"  # the client went away mid-stream
    return exc.code if isinstance(exc, CalispecError) else "INTERNAL"


def finished(timer: RequestTimer, status: str, stats: GenerationStats | None, session: str | None) -> None:
    """Count (a request's final stats only) and log it: one that ended early with what it had done by then (its
    acceptance from its counts: the rate is set on a finished request only, and a cancelled one logged 0.000)."""
    latency_s = timer.finish(status, stats)
    s = stats or timer.live_stats or GenerationStats()
    session = session or timer.request_id
    ttft_ms = (timer.first_token_ns - timer.start_ns) / 1e6 if timer.first_token_ns else -1.0
    log.info(
        "request id=%s mode=%s status=%s prompt_tokens=%d tokens=%d rounds=%d drafted=%d accepted=%d "
        "rescued=%d acceptance=%.3f ttft_ms=%.1f latency_ms=%.1f session=%s",
        current_request_id() or "-", timer.mode, status, s.prompt_tokens, timer.tokens, s.rounds, s.drafted,
        s.accepted, s.rescued, s.accepted / s.drafted if s.drafted else 0.0, ttft_ms, latency_s * 1e3, session or "-",
    )  # fmt: skip
