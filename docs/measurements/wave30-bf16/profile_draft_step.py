"""Scratch (wave 30): torch profile of the int8 draft's one-token step for B rows (the services' packed pass).

`python profile_draft_step.py B`: the wall ms per forward of B sessions (200 + 16·b cached tokens), then the
profiler's table of 5 forwards, run on the process's compute thread (where the services run them).
"""

import sys
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec

DRAFT = Path.home() / ".cache/calispec/models/qwen-coder/draft"


def main(rows: int) -> None:
    runner = ModelRunner(ModelSpec(DRAFT, dtype="int8", device="cpu", threads=2, fp32_linear="default"))
    sessions = [context_session(runner, 200 + 16 * b, 2) for b in range(rows)]

    def measure() -> None:
        for _ in range(3):
            forward_ms(runner, sessions, 1)
        start = time.perf_counter()
        for _ in range(10):
            forward_ms(runner, sessions, 1)
        print(f"{(time.perf_counter() - start) * 100:.1f} ms per forward")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                forward_ms(runner, sessions, 1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))

    compute_thread().run(measure)


if __name__ == "__main__":
    main(int(sys.argv[1]))
