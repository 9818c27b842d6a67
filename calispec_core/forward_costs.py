"""What one forward costs by number of new tokens, measured on this service's own model and machine.

The coordinator's cost model (coordinator/cost_model.py) starts from these figures (sent in
`ModelInfo.forward_costs`) to decide whether, and how far, speculation pays; it then corrects
their level online from every round's measured times.
"""

from __future__ import annotations

import statistics
import time

from calispec_core.modeling import ModelRunner, prefill_session

TARGET_TOKEN_COUNTS = (1, 2, 4, 8, 12, 17)  # the verify forward is γ + 1 tokens, γ <= 16
DRAFT_TOKEN_COUNTS = (1, 2)
CONTEXT = 64  # cached tokens before each measured forward (costs grow little with a short context)


def forward_ms(runner: ModelRunner, new_tokens: int, reps: int, context: int = CONTEXT) -> float:
    """Median wall time of one forward of `new_tokens` after `context` cached tokens (after a warm-up call)."""
    context = max(1, min(context, runner.max_context - new_tokens - 1))
    vocab = max(runner.vocab_size - 1, 1)
    session = prefill_session(runner, "forward-cost", [(1000 + i) % vocab for i in range(context)])
    times = []
    for _ in range(reps + 1):  # the first call warms up and is dropped
        start = time.perf_counter()
        runner.forward(session.pending() + [5 % vocab] * (new_tokens - 1), session.cache, new_tokens)
        times.append((time.perf_counter() - start) * 1000)
        session.cache.crop(-new_tokens)  # back to context - 1 cached tokens
    return statistics.median(times[1:])


def measure_forward_costs(runner: ModelRunner, token_counts: tuple[int, ...], reps: int = 2) -> dict[int, float]:
    """{new tokens: ms} at start-up, before the service takes requests."""
    return {n: forward_ms(runner, n, reps) for n in token_counts if n < runner.max_context - 1}
