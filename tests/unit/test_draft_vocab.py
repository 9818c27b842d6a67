"""A vocabulary-pruned draft output layer (calispec_core/vocab_pruning.py): cheaper drafting, `sd` unchanged."""

from __future__ import annotations

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core.errors import InvalidArgument
from calispec_core.generation import GenerationParams, Mode
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.sparse_q import truncate
from calispec_core.timing import Deadline, Stopwatch
from calispec_core.vocab_pruning import kept_token_ids
from calispec_tools.bench.draft_head import head_variants
from calispec_tools.bench.draft_head import main as bench_draft_head
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator
from draft_service.proposer import Proposal, Proposer
from tests.conftest import TinyPair
from tests.service.test_seeded_sampling import ConstantRunner

KEEP = 256  # of the tiny pair's 384 ids: the tiny target often wants one of the others
PROMPTS = ["def add(a, b):", "The robot counted", "Question: what is 7 times 6?"]


@pytest.fixture(scope="module")
def pruned_draft(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"), output_vocab=KEEP)


def test_kept_ids_are_the_first_k_the_special_ones_and_everything_past_the_regular_vocabulary() -> None:
    kept = kept_token_ids(4, vocab_rows=12, regular_vocab=9, special_ids=[6, 99])
    assert kept.tolist() == [0, 1, 2, 3, 6, 9, 10, 11]


@torch.inference_mode()
def test_the_pruned_layer_computes_exactly_the_kept_rows_of_the_full_one(
    pruned_draft: ModelRunner, draft_runner: ModelRunner
) -> None:
    columns = pruned_draft.logit_columns
    assert columns.kept is not None and columns.width == KEEP
    assert pruned_draft.vocab_size == draft_runner.vocab_size == columns.vocab_size  # the service still speaks V
    ids = [5, 17, 42, 8, 99, 300]
    full = draft_runner.forward(ids, draft_runner.new_cache(), 3)  # [1, 3, V]
    pruned = pruned_draft.forward(ids, pruned_draft.new_cache(), 3)  # [1, 3, KEEP]
    torch.testing.assert_close(pruned, full[..., columns.kept])


def test_int8_prunes_before_quantising(tiny_pair: TinyPair) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"), output_vocab=KEEP)
    head = runner.model.get_output_embeddings()
    assert isinstance(head, DynamicQuantizedLinear) and head.out_features == KEEP
    assert runner.forward([5, 17], runner.new_cache(), 1).shape == (1, 1, KEEP)


@pytest.mark.parametrize(("keep", "message"), [(-1, "must be >= 0"), (385, "larger than the model's vocabulary")])
def test_a_bad_draft_vocab_is_refused(tiny_pair: TinyPair, keep: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"), output_vocab=keep)


def test_draft_vocab_of_the_whole_vocabulary_keeps_the_full_layer(tiny_pair: TinyPair) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"), output_vocab=384)
    assert runner.logit_columns.kept is None and runner.logit_columns.width == 384


def full_width_q(p: Proposal, vocab_size: int) -> torch.Tensor:  # [k, V] as the target sees it
    if p.sparse is not None:
        return p.sparse.densify(vocab_size, "cpu")
    assert p.probs is not None
    return p.probs


@pytest.mark.parametrize("proposal_top_k", [0, 64], ids=["dense-q", "sparse-q"])
@torch.inference_mode()
def test_sampled_proposals_are_kept_ids_and_q_is_the_renormalised_draft_distribution(
    pruned_draft: ModelRunner, draft_runner: ModelRunner, proposal_top_k: int
) -> None:
    proposer = Proposer(pruned_draft, max_sessions=4, proposal_top_k=proposal_top_k)
    kept = pruned_draft.logit_columns.kept
    assert kept is not None
    outside = torch.ones(pruned_draft.vocab_size, dtype=torch.bool)
    outside[kept] = False
    prompt = pruned_draft.tokenizer.encode("The robot counted")
    temperature = 1.5
    try:
        for seed in range(6):
            proposer.prefill(f"s{seed}", prompt, SamplingConfig(temperature=temperature, seed=seed), Stopwatch())
            p = proposer.propose(f"s{seed}", 5, None, [], Stopwatch())
            q = full_width_q(p, pruned_draft.vocab_size)  # [5, V] over the whole vocabulary
            assert not outside[p.token_ids].any()  # only kept ids are proposed
            assert (q[:, outside] == 0).all()
            torch.testing.assert_close(q.sum(-1), torch.ones(5))
            torch.testing.assert_close(q[torch.arange(5), p.token_ids], torch.tensor(p.token_probs))
            proposer.close(f"s{seed}")
        # the first row: the full draft's softmax restricted to the kept ids and renormalised (then truncated)
        logits = draft_runner.forward(prompt, draft_runner.new_cache(), 1)[0, -1] / temperature  # [V]
        expected = torch.zeros_like(logits)
        expected[kept] = logits[kept].softmax(-1)
        if proposal_top_k:
            ids, probs = truncate(expected, proposal_top_k)
            expected = torch.zeros_like(logits).index_put_((ids,), probs)
        torch.testing.assert_close(q[0], expected)
    finally:
        proposer.stop()


def test_early_stop_reads_the_confidence_of_the_logit_column_not_the_token_id() -> None:
    """Column 1 is token 2 (softmax over the kept columns: 0.25, 0.75); token 2 indexes no column."""
    runner = ConstantRunner([0.0, float(torch.tensor(3.0).log())], kept=[0, 2], vocab_size=3)
    proposer = Proposer(runner, max_sessions=2)  # type: ignore[arg-type]
    try:
        proposer.prefill("a", [0], SamplingConfig(), Stopwatch())
        sure = proposer.propose("a", 4, None, [], Stopwatch(), min_confidence=0.7)
        unsure = proposer.propose("a", 4, 1, [], Stopwatch(), min_confidence=0.8)
    finally:
        proposer.stop()
    assert sure.token_ids == [2, 2, 2, 2] and unsure.token_ids == [2]


def greedy_run(draft: ModelRunner, target: ModelRunner, prompt: str, mode: Mode) -> tuple[list[int], int]:
    """(tokens, accepted drafts) of one greedy request through the real propose/verify loop in process."""
    backend = InProcessTarget(target)
    params = GenerationParams(32, SamplingConfig(), (), 4, mode, 0.01, 6)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate(prompt, params, Deadline(120)))
    finally:
        backend.stop()
    stats = chunks[-1].stats
    assert stats is not None
    return [t for c in chunks for t in c.token_ids], stats.accepted


def test_greedy_sd_with_a_pruned_draft_equals_ar(pruned_draft: ModelRunner, target_runner: ModelRunner) -> None:
    outside_emitted = accepted = 0
    for prompt in PROMPTS:
        ar, _ = greedy_run(pruned_draft, target_runner, prompt, Mode.AR)
        sd, sd_accepted = greedy_run(pruned_draft, target_runner, prompt, Mode.SD)
        assert sd == ar, prompt
        outside_emitted += sum(t >= KEEP for t in ar)
        accepted += sd_accepted
    assert outside_emitted > 0  # the target emitted tokens the pruned draft cannot propose...
    assert accepted > 0  # ...and still accepted some drafts


def test_the_forward_bench_compares_the_layers_the_service_would_serve(
    tiny_pair: TinyPair, pruned_draft: ModelRunner, draft_runner: ModelRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    heads = head_variants(draft_runner, [0, KEEP])
    assert heads[0].layer is draft_runner.model.get_output_embeddings()
    torch.testing.assert_close(heads[KEEP].layer.weight, pruned_draft.model.get_output_embeddings().weight)
    args = ["--model", str(tiny_pair.draft), "--dtype", "float32", "--threads", "1", "--tokens", "1,2"]
    threads = torch.get_num_threads()
    try:
        bench_draft_head([*args, "--draft-vocab", "0,256", "--rounds", "1", "--reps", "1"])
    finally:
        torch.set_num_threads(threads)  # the bench sets this process's threads
    out = capsys.readouterr().out
    assert "full head" in out and "256 rows" in out and "2 new token(s)" in out
