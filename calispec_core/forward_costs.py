"""What one forward costs by number of new tokens, measured on this service's own model and machine.

The coordinator's cost model (coordinator/cost_model.py) starts from these figures (sent in
`ModelInfo.forward_costs`) to decide whether, and how far, speculation pays; it then corrects
their level online from every round's measured times.
"""

from __future__ import annotations

import statistics
import time

from calispec_core.modeling import ModelRunner, Session, prefill_session

TARGET_TOKEN_COUNTS = (1, 2, 4, 8, 12, 17)  # the verify forward is γ + 1 tokens, γ <= 16
DRAFT_TOKEN_COUNTS = (1, 2)
CONTEXT = 64  # cached tokens before each measured forward (costs grow little with a short context)


def context_session(runner: ModelRunner, context: int = CONTEXT, headroom: int = 17) -> Session:
    """A session with `context` - 1 cached tokens and one pending, leaving room for `headroom` more."""
    context = max(1, min(context, runner.max_context - headroom - 1))
    vocab = max(runner.vocab_size - 1, 1)
    return prefill_session(runner, "forward-cost", [(1000 + i) % vocab for i in range(context)])


def one_forward_ms(runner: ModelRunner, session: Session, new_tokens: int) -> float:
    """Wall time of one forward of `new_tokens` after the session's cache; the cache is left as it was."""
    filler = [5 % max(runner.vocab_size - 1, 1)] * (new_tokens - 1)
    start = time.perf_counter()
    runner.forward(session.pending() + filler, session.cache, new_tokens)
    elapsed = (time.perf_counter() - start) * 1000
    session.cache.crop(-new_tokens)  # back to the cached prefix
    return elapsed


def forward_ms(runner: ModelRunner, new_tokens: int, reps: int, context: int = CONTEXT) -> float:
    """Median wall time of one forward of `new_tokens` after `context` cached tokens (after a warm-up call)."""
    session = context_session(runner, context, headroom=new_tokens)
    times = [one_forward_ms(runner, session, new_tokens) for _ in range(reps + 1)]
    return statistics.median(times[1:])  # the first call warms up and is dropped


def measure_forward_costs(runner: ModelRunner, token_counts: tuple[int, ...], reps: int = 2) -> dict[int, float]:
    """{new tokens: ms} at start-up, before the service takes requests."""
    return {n: forward_ms(runner, n, reps) for n in token_counts if n < runner.max_context - 1}
