"""Structured output on the tiny pair: the target masks every position it verifies by the request's grammar."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pytest

from calispec_core.constraints import BITS, MAX_GBNF_CHARS, ConstraintCompiler
from calispec_core.errors import CalispecError, FailedPrecondition, InvalidArgument
from calispec_core.generation import FinishReason, GenerationParams, Mode, OutputConstraint, SessionOutput
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline, Stopwatch
from calispec_tools.inprocess import InProcessDraft, InProcessTarget, in_process_orchestrator
from coordinator.engine import Orchestrator
from draft_service.proposer import Proposer
from target_service.engine import RescueConfig, TargetEngine
from target_service.logprobs import FORBIDDEN_LOGPROB
from target_service.pair_table import PairTable

PROMPT = "def add(a, b):"
REGEX = r"[0-9]{3}-[a-z]{2,6}"
CHOICES = ("yes", "no way", "maybe not")


def generate(
    draft: ModelRunner, target: ModelRunner, mode: Mode, constraint: OutputConstraint, sampling: SamplingConfig
) -> tuple[list[int], str, FinishReason | None]:
    backend = InProcessTarget(target)
    gamma = None if mode == Mode.AR else 3
    params = GenerationParams(40, sampling, (), gamma, mode, 0.01, 6, constraint=constraint)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate(PROMPT, params, Deadline(120)))
    finally:
        backend.stop()
    return [t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks), chunks[-1].finish_reason


@pytest.mark.parametrize(
    ("constraint", "follows"),
    [
        (OutputConstraint.of(regex=REGEX), lambda text: re.fullmatch(REGEX, text) is not None),
        (OutputConstraint.of(choice=list(CHOICES)), lambda text: text in CHOICES),
    ],
    ids=["regex", "choice"],
)
def test_greedy_sd_and_csd_write_ar_s_constrained_output(draft_runner, target_runner, constraint, follows) -> None:
    """Greedy SD under a grammar is exact: the same tokens as target-only decoding under it, ending at EOS."""
    outputs = {mode: generate(draft_runner, target_runner, mode, constraint, SamplingConfig()) for mode in Mode}
    ar_tokens, ar_text, finish = outputs[Mode.AR]
    assert follows(ar_text) and finish == FinishReason.EOS, ar_text
    assert outputs[Mode.SD][0] == ar_tokens
    for mode, (_, text, finish) in outputs.items():
        assert follows(text) and finish == FinishReason.EOS, (mode, text)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_outputs_follow_the_grammar(draft_runner, target_runner, seed: int) -> None:
    for mode in (Mode.AR, Mode.SD, Mode.CSD):
        _, text, finish = generate(
            draft_runner, target_runner, mode, OutputConstraint.of(regex=REGEX), SamplingConfig(1.0, seed=seed)
        )
        assert re.fullmatch(REGEX, text) and finish == FinishReason.EOS, (mode, text)


def allowed(bitmask_row) -> set[int]:
    return {t for t in range(bitmask_row.numel() * BITS) if (int(bitmask_row[t // BITS]) >> (t % BITS)) & 1}


def test_masks_walk_the_drafts_allowed_prefix_and_leave_the_grammar_where_it_was(target_runner: ModelRunner) -> None:
    tokenizer = target_runner.tokenizer
    grammar = ConstraintCompiler(target_runner).compile(OutputConstraint.of(regex="ab+c"))
    a, b, c = (tokenizer.convert_tokens_to_ids(t) for t in "abc")
    draft = [a, b, a, b]  # the second `a` is refused
    masks = grammar.masks(draft)  # [5, W]
    assert masks.shape[0] == len(draft) + 1
    assert a in allowed(masks[0]) and b not in allowed(masks[0])
    assert b in allowed(masks[1]) and a not in allowed(masks[1])
    assert {b, c} <= allowed(masks[2]) and a not in allowed(masks[2])
    assert allowed(masks[3]) == allowed(masks[4]) == set(range(masks.shape[1] * BITS))  # past the refusal: unmasked
    assert (grammar.masks(draft) == masks).all()  # nothing was committed
    grammar.commit([a, b])
    assert c in allowed(grammar.masks([])[0])


@pytest.fixture
def engine(target_runner: ModelRunner) -> Iterator[TargetEngine]:
    engine = TargetEngine(target_runner, 8, PairTable(target_runner.vocab_size, target_runner.device))
    yield engine
    engine.stop()


def open_session(engine: TargetEngine, sid: str, ids: list[int], written: int = 0) -> None:
    constraint = OutputConstraint.of(choice=list(CHOICES))
    engine.prefill(
        sid, ids, SamplingConfig(), RescueConfig(Mode.AR), Stopwatch(), None, SessionOutput(constraint, None, written)
    )


def step(engine: TargetEngine, sid: str, logprobs: int | None = None):
    return engine.verify(sid, [], None, Stopwatch(), logprobs=logprobs)


def test_a_reopened_session_replays_the_output_written_before_it(engine: TargetEngine, target_runner) -> None:
    """A failover reopens the target session from prompt + output: its grammar must start past that output."""
    prompt = target_runner.tokenizer.encode(PROMPT)
    open_session(engine, "first", prompt)
    written = [step(engine, "first").next_token for _ in range(2)]
    open_session(engine, "reopened", [*prompt, *written], written=len(written))
    for _ in range(3):
        assert step(engine, "reopened").next_token == step(engine, "first").next_token


def test_output_that_breaks_the_grammar_and_grammars_that_do_not_compile_open_no_session(
    engine: TargetEngine, target_runner
) -> None:
    prompt = target_runner.tokenizer.encode(PROMPT)
    broken = target_runner.tokenizer.encode("xyz")
    with pytest.raises(InvalidArgument, match="does not follow the structured output"):
        open_session(engine, "broken", [*prompt, *broken], written=len(broken))
    for constraint, fragment in (
        (OutputConstraint.of(regex="[a-"), "regex does not compile"),
        (OutputConstraint.of(json='{"type": "nope"}'), "json does not compile"),
        (OutputConstraint.of(grammar="start: undefined_rule"), "grammar does not compile"),
    ):
        with pytest.raises(InvalidArgument, match=fragment):
            engine.prefill(
                "bad", prompt, SamplingConfig(), RescueConfig(Mode.AR), Stopwatch(), None, SessionOutput(constraint)
            )
    with pytest.raises(InvalidArgument, match="output_written"):
        open_session(engine, "too-long", prompt, written=len(prompt) + 1)
    assert engine.sessions.stats().open_sessions == 0


def test_top_logprobs_of_forbidden_tokens_are_vllms_stand_in_not_minus_infinity(engine: TargetEngine, target_runner):
    """A choice allows a few tokens at a position: the others' log-probabilities were -inf, which JSON cannot carry."""
    open_session(engine, "s", target_runner.tokenizer.encode(PROMPT))
    [entry] = step(engine, "s", logprobs=20).logprobs
    assert all(math.isfinite(v) for v in entry.top_logprobs) and FORBIDDEN_LOGPROB in entry.top_logprobs
    assert math.isfinite(entry.logprob) and entry.logprob > FORBIDDEN_LOGPROB


def test_a_target_without_structured_output_refuses_a_constraint(target_runner: ModelRunner) -> None:
    engine = TargetEngine(
        target_runner, 8, PairTable(target_runner.vocab_size, target_runner.device), structured_output=False
    )
    try:
        with pytest.raises(FailedPrecondition, match="--no-structured-output"):
            open_session(engine, "s", [1, 2, 3])
        engine.prefill("free", [1, 2, 3], SamplingConfig(), RescueConfig(Mode.AR), Stopwatch())
    finally:
        engine.stop()


@pytest.fixture
def proposer(draft_runner: ModelRunner) -> Iterator[Proposer]:
    proposer = Proposer(draft_runner, 8)
    yield proposer
    proposer.stop()


def test_the_drafts_proposals_follow_the_grammar_through_rollbacks(proposer: Proposer, draft_runner) -> None:
    """The draft drafted freely (the tiny draft: any token), so a structured output's drafts were mostly refused."""
    tokenizer = draft_runner.tokenizer
    prompt = tokenizer.encode(PROMPT)
    constraint = OutputConstraint.of(regex=REGEX)
    proposer.prefill("s", prompt, SamplingConfig(), Stopwatch(), SessionOutput(constraint))
    first = proposer.propose("s", 6, None, [], Stopwatch()).token_ids
    assert re.fullmatch(r"[0-9]{0,3}|[0-9]{3}-[a-z]{0,6}", tokenizer.decode(first)), tokenizer.decode(first)
    two = tokenizer.encode("42")
    proposer.prefill(
        "reopened", [*prompt, *two], SamplingConfig(), Stopwatch(), SessionOutput(constraint, None, len(two))
    )
    for sid, written in (("s", []), ("reopened", two)):
        # the target kept none of the drafts and wrote "42" (s), then one more digit and a dash (both)
        tokens = [*two, *tokenizer.encode("7-")]
        following = proposer.propose(sid, 5, len(prompt) + len(written), tokens[len(written) :], Stopwatch())
        # then every draft kept: it drafts on from its own last token (the grammar took that one too)
        more = proposer.propose(sid, 5, None, [], Stopwatch())
        text = tokenizer.decode([*tokens, *following.token_ids, *more.token_ids], skip_special_tokens=True)
        assert re.fullmatch(r"427-[a-z]{0,6}", text), (sid, text)


def test_the_grammar_takes_a_full_proposals_last_token_too(proposer: Proposer, draft_runner) -> None:
    """A proposal that reached its length skipped the grammar for its last token: the next one drafted from a stale
    state (its first token after the wrong letter)."""
    tokenizer = draft_runner.tokenizer
    proposer.prefill(
        "s",
        tokenizer.encode(PROMPT),
        SamplingConfig(),
        Stopwatch(),
        SessionOutput(OutputConstraint.of(regex="(ab){1,40}")),
    )
    drafted = [t for _ in range(4) for t in proposer.propose("s", 3, None, [], Stopwatch()).token_ids]
    fresh = ConstraintCompiler(draft_runner).compile(OutputConstraint.of(regex="(ab){1,40}"))
    assert fresh.commit(drafted), tokenizer.decode(drafted)  # every drafted token allowed where it stands


def test_masks_of_a_draft_ending_past_a_complete_grammar_leave_the_commits_alone(target_runner: ModelRunner) -> None:
    """A draft that completes the grammar and adds the end-of-sequence token: both count as allowed, but a stopped
    matcher records nothing for the second, so rolling back both undid a committed token (found by review: a free
    draft then made `sd` end a choice half-written)."""
    tokenizer = target_runner.tokenizer
    grammar = ConstraintCompiler(target_runner).compile(OutputConstraint.of(choice=["abc", "abdefghij"]))
    a, b, c = (tokenizer.convert_tokens_to_ids(t) for t in "abc")
    assert grammar.commit([a])
    grammar.masks([b, c, tokenizer.eos_token_id])
    assert grammar.consumed == 1 and grammar.commit([b, c]) and grammar.stopped


def test_greedy_sd_with_a_draft_that_drafts_freely_is_still_exact(draft_runner, target_runner) -> None:
    """A draft without structured output (--no-structured-output, or one that gave its grammar up) drafts freely."""
    constraint = OutputConstraint.of(choice=list(CHOICES))
    expected = generate(draft_runner, target_runner, Mode.AR, constraint, SamplingConfig())[0]
    free, backend = InProcessDraft(draft_runner), InProcessTarget(target_runner)
    free.proposer.constraints = None
    eos = tuple(target_runner.eos_token_ids)
    orchestrator = Orchestrator(target_runner.tokenizer, free, [backend], eos, target_runner.max_context)
    params = GenerationParams(40, SamplingConfig(), (), 3, Mode.SD, 0.01, 6, constraint=constraint)
    try:
        chunks = list(orchestrator.generate(PROMPT, params, Deadline(120)))
    finally:
        backend.stop()
        free.proposer.stop()
    assert [t for c in chunks for t in c.token_ids] == expected and chunks[-1].stats.drafted > 0


def test_a_session_whose_grammar_refused_a_committed_token_fails_its_next_round(engine: TargetEngine, target_runner):
    """Only a bug can commit a token the masks refused; the session went on writing whatever its broken grammar
    allowed (the end-of-sequence token) as a success."""
    open_session(engine, "s", target_runner.tokenizer.encode(PROMPT))
    assert not engine.sessions.get("s").grammar.commit(target_runner.tokenizer.encode("zzz"))
    with pytest.raises(CalispecError, match="no longer holds"):
        step(engine, "s")


def test_a_large_gbnf_grammar_is_refused_before_its_slow_conversion_and_lark_is_not(target_runner) -> None:
    rules = "".join(f'r{i} ::= "x{i}"\n' for i in range(600))
    gbnf = f"root ::= {' | '.join(f'r{i}' for i in range(600))}\n{rules}"
    assert len(gbnf) > MAX_GBNF_CHARS
    with pytest.raises(InvalidArgument, match="GBNF grammar may hold"):
        ConstraintCompiler(target_runner).compile(OutputConstraint.of(grammar=gbnf))
    lark = "start: " + " | ".join(f'"x{i}"' for i in range(1500))
    assert len(lark) > MAX_GBNF_CHARS
    ConstraintCompiler(target_runner).compile(OutputConstraint.of(grammar=lark))


def test_a_drafting_batch_that_fails_leaves_the_grammar_where_it_was(proposer: Proposer, draft_runner) -> None:
    """A failed batch restores each session's tokens and cache, and its grammar must go back with them."""
    constraint = OutputConstraint.of(regex="(ab){1,40}")
    proposer.prefill(
        "s", draft_runner.tokenizer.encode(PROMPT), SamplingConfig(), Stopwatch(), SessionOutput(constraint)
    )
    drafted = proposer.propose("s", 3, None, [], Stopwatch()).token_ids
    forward, steps = proposer._forward, []

    def fails_at_the_second_step(jobs):
        steps.append(1)
        if len(steps) == 2:
            raise RuntimeError("device lost")
        return forward(jobs)

    proposer._forward = fails_at_the_second_step  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="device lost"):
        proposer.propose("s", 3, None, [], Stopwatch())
    proposer._forward = forward  # type: ignore[method-assign]
    drafted += proposer.propose("s", 3, None, [], Stopwatch()).token_ids
    fresh = ConstraintCompiler(draft_runner).compile(constraint)
    assert fresh.commit(drafted), draft_runner.tokenizer.decode(drafted)


def test_a_pruned_drafts_proposals_follow_the_grammar_over_its_columns(tiny_pair) -> None:
    """A pruned output layer's logits are columns, not token ids: the grammar's mask is read through them."""
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"), output_vocab=128)
    assert runner.logit_columns.kept is not None
    proposer = Proposer(runner, 8)
    constraint = OutputConstraint.of(regex="(ab){1,40}")
    try:
        proposer.prefill("s", runner.tokenizer.encode(PROMPT), SamplingConfig(), Stopwatch(), SessionOutput(constraint))
        drafted = [t for _ in range(3) for t in proposer.propose("s", 3, None, [], Stopwatch()).token_ids]
    finally:
        proposer.stop()
    assert ConstraintCompiler(runner).compile(constraint).commit(drafted), runner.tokenizer.decode(drafted)
