"""OpenMP spinning for model service processes, set before torch (and its libgomp) loads.

libgomp's idle team threads spin up to GOMP_SPINCOUNT iterations (300,000 by default, ~ms) after
each parallel region before they sleep. A model forward's ops come microseconds apart, so a short
spin keeps them fast; but the draft and target services usually share a host, and a process whose
forward just ended keeps its threads spinning on cores the other service now needs. Measured on
2 AVX512-BF16 cores (docs/performance.md, "One compute thread per process"): 10,000 kept the
int8 draft's step at 31-33 ms (concurrency 1) and roughly doubled `sd`'s throughput at concurrency
8 with 2 + 2 threads against libgomp's default (the same `calispec bench compare` command before and
after: 5.03 -> 10.49 tok/s).
"""

from __future__ import annotations

import os

SERVICE_SPIN_COUNT = "10000"


def limit_idle_spinning() -> None:
    """GOMP_SPINCOUNT for this process unless the environment sets it; no effect once libgomp has loaded."""
    os.environ.setdefault("GOMP_SPINCOUNT", SERVICE_SPIN_COUNT)
