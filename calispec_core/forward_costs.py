"""What one forward costs by number of new tokens, measured on this service's own model and machine.

The coordinator's cost model (coordinator/cost_model.py) starts from these figures (sent in
`ModelInfo.forward_costs`) to decide whether, and how far, speculation pays; it then corrects
their level online from every round's measured times.
"""

from __future__ import annotations

import statistics
import time

from calispec_core.batch_forward import forward_rows
from calispec_core.modeling import ModelRunner, Session, prefill_session, wait_for

# A verify forward is γ + 1 tokens per row (γ <= 16); a batch of B rows costs about one row of
# B·(γ+1) tokens, so the curve reaches past one row's worth. A draft step is one token per row. 6 and 7:
# oneDNN's packed bf16 product costs ~1.18x at 7 rows what it costs at 6 (wave 33), a step between 4 and 8
# that a straight line would spread over 5-7 (γ = 4-6 at batch 1).
TARGET_TOKEN_COUNTS = (1, 2, 4, 6, 7, 8, 12, 17, 32, 64)
DRAFT_TOKEN_COUNTS = (1, 2, 4, 8)
CONTEXT = 64  # cached tokens before each measured forward (costs grow little with a short context)


def context_session(runner: ModelRunner, context: int = CONTEXT, headroom: int = 17) -> Session:
    """A session with `context` - 1 cached tokens and one pending, leaving room for `headroom` more."""
    context = max(1, min(context, runner.max_context - headroom - 1))
    vocab = max(runner.vocab_size - 1, 1)
    return prefill_session(runner, "forward-cost", [(1000 + i) % vocab for i in range(context)])


def forward_ms(runner: ModelRunner, sessions: list[Session], new_tokens: int) -> float:
    """Wall time of one forward of `new_tokens` per session, on the path rounds take (`forward_rows`, one
    row or several); the caches are left as they were."""
    filler = [5 % max(runner.vocab_size - 1, 1)] * (new_tokens - 1)
    start = time.perf_counter()
    forward_rows(
        runner, [s.cache for s in sessions], [s.pending() + filler for s in sessions], [new_tokens] * len(sessions)
    )
    wait_for(runner.device)
    elapsed = (time.perf_counter() - start) * 1000
    for session in sessions:
        session.cache.crop(-new_tokens)  # back to the cached prefix
    return elapsed


def measure_forward_costs(runner: ModelRunner, token_counts: tuple[int, ...], reps: int = 3) -> dict[int, float]:
    """{new tokens: median ms} at start-up, before the service takes requests.

    The counts take turns (one forward of each per repetition, after one warm-up pass), so a burst
    of load from a neighbour (the other model service starting on the same cores) slows them alike
    instead of bending the curve's shape, which is what decides γ.
    """
    counts = [n for n in token_counts if n < runner.max_context - 1]
    if not counts:
        return {}
    session = context_session(runner, CONTEXT, headroom=max(counts))
    times: dict[int, list[float]] = {n: [] for n in counts}
    for rep in range(reps + 1):
        for n in counts:
            elapsed = forward_ms(runner, [session], n)
            if rep:  # the first pass warms up and is dropped
                times[n].append(elapsed)
    return {n: statistics.median(ts) for n, ts in times.items()}
