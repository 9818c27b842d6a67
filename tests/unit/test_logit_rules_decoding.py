"""Logit rules on the tiny pair: the target applies them to every position it verifies, so greedy `sd` under them
writes target-only decoding's tokens under them; the draft follows them; a reopened session counts what was written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from calispec_core.errors import InvalidArgument, InvalidField
from calispec_core.generation import FinishReason, GenerationParams, Mode, OutputConstraint, SessionOutput
from calispec_core.logit_rules import LogitRules, tokenize_bad_words
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline, Stopwatch
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator
from draft_service.proposer import Proposer
from target_service.engine import RescueConfig, TargetEngine
from target_service.pair_table import PairTable

PROMPT = "def add(a, b):"
# strong: the tiny target's top logit stands ~8 above the next (a repeated token's must fall below it)
PENALTIES = LogitRules.of(presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=2.0, logit_bias={7: 3.0})


def generate(
    draft: ModelRunner,
    target: ModelRunner,
    mode: Mode,
    rules: LogitRules | None,
    sampling: SamplingConfig = SamplingConfig(),  # noqa: B008 (frozen)
    ignore_eos: bool = False,
) -> tuple[list[int], FinishReason | None]:
    backend = InProcessTarget(target)
    gamma = None if mode == Mode.AR else 3
    params = GenerationParams(40, sampling, (), gamma, mode, 0.01, 6, ignore_eos=ignore_eos, rules=rules)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate(PROMPT, params, Deadline(120)))
    finally:
        backend.stop()
    return [t for c in chunks for t in c.token_ids], chunks[-1].finish_reason


def test_greedy_sd_under_penalties_and_bias_writes_ar_s_tokens_under_them(draft_runner, target_runner) -> None:
    free, _ = generate(draft_runner, target_runner, Mode.AR, None, ignore_eos=True)  # 40 tokens: some repeat
    ruled, _ = generate(draft_runner, target_runner, Mode.AR, PENALTIES, ignore_eos=True)
    assert ruled != free  # the rules change the output
    assert generate(draft_runner, target_runner, Mode.SD, PENALTIES, ignore_eos=True)[0] == ruled


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD, Mode.CSD])
def test_sampled_tokens_are_among_the_allowed_ids(draft_runner, target_runner, mode: Mode) -> None:
    allowed = [5, 9, 11, 17, 23, 42, 64, target_runner.tokenizer.eos_token_id]
    rules = LogitRules.of(allowed_token_ids=allowed, min_p=0.05)
    tokens, _ = generate(draft_runner, target_runner, mode, rules, SamplingConfig(1.0, seed=3))
    assert tokens and set(tokens) <= set(allowed)


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD])
def test_min_tokens_holds_back_the_end_of_sequence(draft_runner, target_runner, mode: Mode) -> None:
    """A bias that makes EOS the first token; min_tokens = 6 keeps it out of the first six."""
    eos = target_runner.tokenizer.eos_token_id
    eager = LogitRules.of(logit_bias={eos: 100.0})
    assert generate(draft_runner, target_runner, mode, eager)[0] == [eos]
    tokens, finish = generate(draft_runner, target_runner, mode, LogitRules.of(logit_bias={eos: 100.0}, min_tokens=6))
    assert len(tokens) == 7 and tokens[-1] == eos and eos not in tokens[:-1] and finish == FinishReason.EOS


@pytest.fixture
def engine(target_runner: ModelRunner) -> Iterator[TargetEngine]:
    engine = TargetEngine(target_runner, 8, PairTable(target_runner.vocab_size, target_runner.device))
    yield engine
    engine.stop()


def test_a_reopened_session_counts_the_output_written_before_it(engine: TargetEngine, target_runner) -> None:
    """A failover reopens the target session from prompt + output: min_tokens and the penalties count that output (as
    the prompt, min_tokens held the end back for six more tokens)."""
    eos = target_runner.tokenizer.eos_token_id
    rules = LogitRules.of(min_tokens=6, logit_bias={eos: 100.0}, frequency_penalty=2.0).ending([eos])
    prompt = target_runner.tokenizer.encode(PROMPT)

    def open_session(sid: str, ids: list[int], written: int) -> None:
        output = SessionOutput(rules=rules, written=written)
        engine.prefill(sid, ids, SamplingConfig(), RescueConfig(Mode.AR), Stopwatch(), None, output)

    def step(sid: str) -> int:
        return engine.verify(sid, [], None, Stopwatch()).next_token

    open_session("first", prompt, 0)
    written = [step("first") for _ in range(4)]
    open_session("reopened", [*prompt, *written], len(written))
    following = [step("first") for _ in range(3)]
    assert following[-1] == eos and [step("reopened") for _ in range(3)] == following


def test_the_drafts_proposals_follow_the_rules(draft_runner: ModelRunner) -> None:
    """The draft drafted freely, so a request with allowed ids had most drafts refused (acceptance only)."""
    proposer = Proposer(draft_runner, 8)
    allowed = [5, 9, 11, 17]
    try:
        prompt = draft_runner.tokenizer.encode(PROMPT)
        output = SessionOutput(rules=LogitRules.of(allowed_token_ids=allowed))
        proposer.prefill("s", prompt, SamplingConfig(), Stopwatch(), output)
        drafted = [t for _ in range(3) for t in proposer.propose("s", 4, None, [], Stopwatch()).token_ids]
    finally:
        proposer.stop()
    assert len(drafted) == 12 and set(drafted) <= set(allowed)


def test_allowed_ids_a_rejected_drafts_grammar_state_leaves_empty_do_not_fail_the_round(draft_runner, target_runner):
    """A choice of "yes" or "no" whose allowed ids spell "no" (and "y" alone): the draft writes "y", the target "n".
    Past the rejected "y" the grammar allows only "es", which the ids refuse: a position the round never reaches had
    no token, and `sd` failed INVALID_ARGUMENT where `ar` wrote "no" (found by review)."""
    tokenizer, prompt = target_runner.tokenizer, "Answer:"
    y, n, o = (tokenizer.convert_tokens_to_ids(t) for t in "yno")
    ids = tokenizer.encode(prompt)
    with torch.inference_mode():
        gaps = [
            (m.model(torch.tensor([ids])).logits[0, -1, [y, n]].float()).tolist() for m in (target_runner, draft_runner)
        ]
    bias = sum(zy - zn for zy, zn in gaps) / 2  # on "n": the target's pick, not the draft's
    assert (gaps[0][0] - gaps[0][1] - bias) * (gaps[1][0] - gaps[1][1] - bias) < 0
    rules = LogitRules.of(allowed_token_ids=[y, n, o, tokenizer.eos_token_id], logit_bias={n: bias})
    written = {}
    for mode in (Mode.AR, Mode.SD):
        backend = InProcessTarget(target_runner)
        params = GenerationParams(8, SamplingConfig(), (), None if mode == Mode.AR else 3, mode, 0.01, 6,
                                  constraint=OutputConstraint.of(choice=["yes", "no"]), rules=rules)  # fmt: skip
        try:
            chunks = list(in_process_orchestrator(draft_runner, backend).generate(prompt, params, Deadline(60)))
        finally:
            backend.stop()
        written[mode] = "".join(c.text for c in chunks)
    assert written[Mode.AR] == written[Mode.SD] == "no"


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD])
@pytest.mark.parametrize("field", ["allowed_token_ids", "bad_words"])
def test_rules_the_structured_output_never_allows_are_the_requests_error(draft_runner, target_runner, mode, field):
    """A choice of "yes" with the ids of "no" only, or with "yes" a bad word: the first position has no token (a
    greedy argmax over -inf, the model blamed for non-finite logits); the refusal names the field."""
    tokenizer = target_runner.tokenizer
    if field == "bad_words":
        rules = LogitRules.of(bad_words=["yes"])
    else:
        rules = LogitRules.of(allowed_token_ids=[tokenizer.convert_tokens_to_ids(t) for t in "no"])
    backend = InProcessTarget(target_runner)
    params = GenerationParams(8, SamplingConfig(), (), None if mode == Mode.AR else 3, mode, 0.01, 6,
                              constraint=OutputConstraint.of(choice=["yes"]), rules=rules)  # fmt: skip
    try:
        with pytest.raises(InvalidField, match=f"^{field} leave no token to write with the structured output"):
            list(in_process_orchestrator(draft_runner, backend).generate(PROMPT, params, Deadline(60)))
    finally:
        backend.stop()


def test_bad_words_are_never_written_and_greedy_sd_stays_exact(draft_runner, target_runner) -> None:
    """vLLM's bad_words (a 400 until wave 60): "a" (one token, as written and after a space) and "+ b" (" +" then " b"
    never follow each other); the tiny pair's free reply is "return a + b"."""
    tokenizer = target_runner.tokenizer
    free, _ = generate(draft_runner, target_runner, Mode.AR, None)
    a, plus, b = (tokenizer.encode(t, add_special_tokens=False)[0] for t in (" a", " +", " b"))
    assert a in free and [plus, b] == free[free.index(plus) : free.index(plus) + 2]
    rules = LogitRules.of(bad_words=["a", "+ b"]).with_bad_word_ids(tokenize_bad_words(tokenizer, ["a", "+ b"]))
    ruled, _ = generate(draft_runner, target_runner, Mode.AR, rules)
    assert a not in ruled and all(ruled[i : i + 2] != [plus, b] for i in range(len(ruled)))
    assert generate(draft_runner, target_runner, Mode.SD, rules)[0] == ruled


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD])
def test_positions_past_a_token_that_ends_the_output_are_never_reached(draft_runner, target_runner, mode) -> None:
    """After stop token 11 nothing is allowed (allowed ids, bad words): `ar` stops there, `sd` failed INVALID_ARGUMENT
    for a position past the kept stop token, which the output never reaches (found by review)."""
    rules = LogitRules(
        logit_bias=((11, 100.0),), allowed_token_ids=(5, 9, 11), bad_word_ids=((11, 5), (11, 9), (11, 11))
    )
    backend = InProcessTarget(target_runner)
    params = GenerationParams(8, SamplingConfig(), (), None if mode == Mode.AR else 3, mode, 0.01, 6,
                              stop_token_ids=(11,), rules=rules)  # fmt: skip
    try:
        chunks = list(in_process_orchestrator(draft_runner, backend).generate(PROMPT, params, Deadline(60)))
    finally:
        backend.stop()
    assert [t for c in chunks for t in c.token_ids] == [11] and chunks[-1].finish_reason == FinishReason.STOP


def test_a_prompt_id_outside_the_vocabulary_is_refused_with_rules_too(engine: TargetEngine, draft_runner) -> None:
    """The repetition penalty's prompt mask indexed it before the prompt's own check: an IndexError (INTERNAL), and
    on a GPU a device-side assert (found by review)."""
    prompt = [1, 2, engine.runner.vocab_size + 5]
    output = SessionOutput(rules=LogitRules.of(repetition_penalty=1.5))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        engine.prefill("s", prompt, SamplingConfig(), RescueConfig(Mode.AR), Stopwatch(), None, output)
    proposer = Proposer(draft_runner, 8)
    try:
        with pytest.raises(InvalidArgument, match="outside the vocabulary"):
            proposer.prefill("s", prompt, SamplingConfig(), Stopwatch(), output)
    finally:
        proposer.stop()
