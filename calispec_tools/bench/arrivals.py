"""Open-loop arrival processes: inter-arrival gaps in seconds, from a seeded RNG.

A gamma distribution with shape k and mean 1/rate generalises Poisson arrivals: k = 1 is the
exponential (Poisson process); k < 1 is burstier (same mean, larger variance, CV = 1/sqrt(k));
k > 1 is more regular. This is what vLLM's `--burstiness` does too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator


def gamma_gaps(rate: float, shape: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless inter-arrival gaps with mean 1/rate; rate = inf gives all requests at once."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if shape <= 0:
        raise ValueError(f"burstiness (gamma shape) must be > 0, got {shape}")
    rng = random.Random(seed)
    while True:
        if math.isinf(rate):
            yield 0.0
        else:
            # gammavariate(alpha, beta) has mean alpha * beta; beta = 1 / (rate * shape) keeps it 1/rate
            yield rng.gammavariate(shape, 1.0 / (rate * shape))


def arrival_times(rate: float, count: int, shape: float = 1.0, seed: int = 0) -> list[float]:
    """Offsets (seconds from the start) of the first `count` arrivals; the first is at 0."""
    times: list[float] = []
    t = 0.0
    gaps = gamma_gaps(rate, shape, seed)
    for i in range(count):
        if i:
            t += next(gaps)
        times.append(t)
    return times
