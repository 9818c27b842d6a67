"""A target round observer (eval and calibration analyses) that raises never breaks the round."""

from __future__ import annotations

from calispec_core.generation import GenerationParams, Mode
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator


def _tokens(draft: ModelRunner, target: ModelRunner, observer=None) -> list[int]:
    backend = InProcessTarget(target, observer=observer)
    params = GenerationParams(16, SamplingConfig(), (), 3, Mode.SD, 0.01, 6)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate("def add(a, b):", params, Deadline(120)))
    finally:
        backend.stop()
    return [t for c in chunks for t in c.token_ids]


def test_a_raising_observer_leaves_every_round_committed_once(draft_runner: ModelRunner, target_runner: ModelRunner):
    """It ran after the round's events were recorded and before its commits: the sessions kept the
    forward's cache without its tokens, and the rows' rerun recorded their events twice."""
    calls: list[int] = []

    def observer(batch, out) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("analysis bug")

    assert _tokens(draft_runner, target_runner, observer) == _tokens(draft_runner, target_runner)
    assert len(calls) > 1  # later rounds observed too
