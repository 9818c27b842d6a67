"""Teacher-forced calibration reproduces a real greedy SD run's rejection events exactly (tiny pair).

The SD run is the real one: `coordinator.engine.Orchestrator` over the draft `Proposer` and the
`TargetEngine` in process (the services' own code), its events read from every verified round.
"""

from __future__ import annotations

from collections import Counter

import pytest

from calispec_core.generation import GenerationParams, Mode
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from calispec_tools.calibrate.corpus import Document
from calispec_tools.calibrate.job import CalibrateConfig, Calibrator, Summary
from calispec_tools.calibrate.teacher import greedy_predictions, own_predictions
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator

PROMPTS = ["def add(a, b):", "The robot counted", "Question: what is 7 times 6?", "zebra quantum"]


def sd_run(draft: ModelRunner, target: ModelRunner, prompt: str, gamma: int, budget: int) -> tuple[list[int], Counter]:
    events: Counter = Counter()

    def observe(batch, out) -> None:
        d, t = out.events(batch.draft_tokens)
        events.update(zip(d.tolist(), t.tolist(), strict=True))

    backend = InProcessTarget(target, observer=observe)
    params = GenerationParams(budget, SamplingConfig(), (), gamma, Mode.SD, 0.01, 6)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate(prompt, params, Deadline(120)))
    finally:
        backend.stop()
    return [t for c in chunks for t in c.token_ids], events


@pytest.mark.parametrize(
    ("gamma", "budget"),
    [(4, 24), pytest.param(2, 20, marks=pytest.mark.slow), pytest.param(6, 40, marks=pytest.mark.slow)],
)
def test_sd_mode_reproduces_the_events_of_greedy_sd(
    draft_runner: ModelRunner, target_runner: ModelRunner, gamma: int, budget: int
) -> None:
    docs = [Document(p, True, "test") for p in PROMPTS]
    config = CalibrateConfig(mode="sd", generate=True, gamma=gamma, max_new_tokens=budget, batch_size=3)
    exact = Calibrator(draft_runner, target_runner, config).run(docs)
    expected: Counter = Counter()
    for prompt in PROMPTS:
        expected += sd_run(draft_runner, target_runner, prompt, gamma, budget)[1]
    assert sum(expected.values()) > 0  # the tiny draft disagrees with its target somewhere
    assert exact.pairs == expected  # the same events, the same counts
    # The continuations are the target's own greedy output, so calibration reads the target's
    # predictions off them instead of a second target forward; a batched forward agrees.
    calibrator = Calibrator(draft_runner, target_runner, config)
    rows = [r for batch in calibrator.batches(docs, Summary()) for r in batch]
    assert rows and all(r.target_written for r in rows)
    batched = greedy_predictions(target_runner, [r.tokens for r in rows])
    for row, predicted in zip(rows, batched, strict=True):
        own = own_predictions(row)
        assert predicted[row.start - 1 : -1] == own[row.start - 1 : -1]

    dense = Calibrator(draft_runner, target_runner, CalibrateConfig(mode="dense", generate=True,
                                                                    max_new_tokens=budget)).run(docs)  # fmt: skip
    assert all(dense.pairs[p] >= c for p, c in expected.items())  # dense is a superset...
    assert dense.events > exact.events  # ...strictly: it also counts bonus positions and text past EOS


def test_continuation_is_what_greedy_sd_emits(draft_runner: ModelRunner, target_runner: ModelRunner) -> None:
    from calispec_tools.calibrate.generate import continue_greedy

    ids = [target_runner.tokenizer.encode(p) for p in PROMPTS]
    continued = continue_greedy(target_runner, ids, 24)
    for prompt, out in zip(PROMPTS, continued, strict=True):
        emitted = sd_run(draft_runner, target_runner, prompt, 4, 24)[0]
        assert len(out) == 24 and out[: len(emitted)] == emitted  # it goes on past EOS, SD stops there
