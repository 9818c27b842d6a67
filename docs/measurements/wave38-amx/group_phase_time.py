"""Scratch (wave 38): what planning a round start costs under the group phase, wave 37's search (every candidate
priced afresh) against wave 38's (sums kept up to date member by member).

`git show 4bbee55:coordinator/round_plan.py > /tmp/round_plan_wave37.py`, then
`python docs/measurements/wave38-amx/group_phase_time.py /tmp/round_plan_wave37.py`: median µs a plan over 8 and 32
members (alike at 80 % acceptance, and spread over 55-95 %), γ_max 10, on wave 37's AMX cost curves.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from collections.abc import Callable

from coordinator.cost_model import CostCurve, CostModel
from coordinator.round_plan import Wish, group_phase


def old_rule(path: str) -> Callable[[CostModel, list[Wish]], list[int]]:
    spec = importlib.util.spec_from_file_location("round_plan_wave37", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.group_phase


def micros(plan: Callable[[CostModel, list[Wish]], list[int]], costs: CostModel, wishes: list[Wish]) -> float:
    times = []
    for _ in range(200):
        start = time.perf_counter()
        plan(costs, wishes)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main() -> None:
    old = old_rule(sys.argv[1])
    costs = CostModel(CostCurve.of({1: 213.0, 16: 215.0, 64: 290.0}), CostCurve.of({1: 35.0, 8: 50.0}))
    for members in (8, 32):
        for label, alphas in (
            ("alike", [0.8] * members),
            ("spread", [0.55 + 0.4 * i / members for i in range(members)]),
        ):
            wishes = [Wish(1, True, 10, 0, 0, a) for a in alphas]
            assert old(costs, wishes) == group_phase(costs, wishes)
            print(f"{members} members {label}: wave 37 {micros(old, costs, wishes):.0f} µs, "
                  f"wave 38 {micros(group_phase, costs, wishes):.0f} µs a plan")  # fmt: skip


if __name__ == "__main__":
    main()
