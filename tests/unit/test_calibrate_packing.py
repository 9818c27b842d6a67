"""Teacher-forced rows packed end to end predict exactly what each row alone does (float32, tiny pair)."""

from __future__ import annotations

import random
import threading

import pytest

from calispec_core.compute import compute_thread
from calispec_core.modeling import ModelRunner
from calispec_tools.calibrate import generate, job, teacher
from calispec_tools.calibrate.corpus import Document
from calispec_tools.calibrate.job import CalibrateConfig, Calibrator, Summary
from calispec_tools.calibrate.teacher import greedy_predictions, pack_rows


def test_bins_hold_every_row_once_within_capacity() -> None:
    lengths = [24, 512, 137, 300, 90, 212, 7, 400]
    bins = pack_rows(lengths, 512)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 512 for b in bins)
    assert len(bins) == 4  # 2,082 tokens: five bins if every row of 24..212 tokens sat alone with a long one


def test_packed_rows_predict_what_each_row_alone_predicts(target_runner: ModelRunner) -> None:
    rng = random.Random(0)
    vocab = target_runner.vocab_size
    rows = [[rng.randrange(vocab) for _ in range(n)] for n in (5, 40, 17, 33, 2, 28)]
    alone = [greedy_predictions(target_runner, [row])[0] for row in rows]
    packed = greedy_predictions(target_runner, rows, capacity=48)  # several rows share a sequence
    assert len(pack_rows([len(r) for r in rows], 48)) < len(rows)
    assert packed == alone


def test_text_batches_follow_a_token_budget(target_runner: ModelRunner, draft_runner: ModelRunner) -> None:
    config = CalibrateConfig(max_tokens=16, batch_size=2)  # 32 tokens a batch
    text = " ".join(f"word{i}" for i in range(60))
    docs = [Document(text, False, "test"), Document("a short one here", False, "test")]
    batches = list(Calibrator(draft_runner, target_runner, config).batches(docs, Summary()))
    assert len(batches) > 1 and all(sum(len(r.tokens) for r in b) <= 32 for b in batches)


def test_prompts_the_target_continues_with_nothing_make_no_batch(
    target_runner: ModelRunner, draft_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of prompts whose continuations are all empty (the target ends at once) was yielded as an empty
    batch, and packing no rows failed (`max()` of nothing), ending an hour's calibration at whatever batch it came."""
    monkeypatch.setattr(job, "continue_greedy", lambda runner, group, budget: [[] for _ in group])
    config = CalibrateConfig(generate=True, batch_size=1)
    docs = [Document("def first(x):", True, "test"), Document("def second(y):", True, "test")]
    summary = Calibrator(draft_runner, target_runner, config).run(docs)
    assert (summary.rows, summary.rows_planned, summary.events) == (0, 0, 0)


def test_packed_sequences_go_through_the_model_a_few_at_a_time(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All sequences of a batch went through one forward, whose activations glibc faulted in afresh every time:
    the int8 draft ran 1.6-1.9× slower over 13 sequences of 512 tokens at once than one at a time."""
    rng = random.Random(1)
    vocab = target_runner.vocab_size
    rows = [[rng.randrange(vocab) for _ in range(n)] for n in (30, 25, 12, 40, 9, 33, 21)]
    alone = [greedy_predictions(target_runner, [row])[0] for row in rows]
    monkeypatch.setattr(teacher, "FORWARD_TOKENS", 96)  # two sequences of 48
    shapes: list[tuple[int, int]] = []
    hook = target_runner.model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        packed = greedy_predictions(target_runner, rows, capacity=48)
    finally:
        hook.remove()
    assert len(pack_rows([len(r) for r in rows], 48)) == 4
    assert shapes == [(2, 48), (2, 48)]  # two sequences of 48 a forward, never all four at once
    assert packed == alone


def test_continuations_compute_on_the_compute_thread(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """continue_greedy's own ops (argmax, concatenations) ran on the caller's thread and started a second OpenMP
    team there, whose idle threads slowed every later forward of the process: the draft's teacher-forced pass over
    the corpus text took 13.5 s after a 2-token continuation against 10.4 s without (wave 43)."""
    threads = []
    argmax = generate.argmax_last
    monkeypatch.setattr(generate, "argmax_last", lambda x: threads.append(threading.get_ident()) or argmax(x))
    generate.continue_greedy(target_runner, [[5, 6, 7], [8, 9]], 3)
    assert threads and set(threads) == {compute_thread().ident} != {threading.get_ident()}
