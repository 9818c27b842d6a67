"""The meaning guard: CSD never rescues a pair that changes a numeral, an operator or a special token.

The shipped calibration counts `'1'` for `'2'` 42 times: without the guard a frequent digit confusion
that passes the gate is rescued, and the answer of a word problem changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from target_service.__main__ import parse_config
from target_service.config import TargetConfig
from target_service.engine import RescueConfig, TargetEngine, VerifyResult
from target_service.meaning_guard import NO_KEY, meaning_key, meaning_keys
from target_service.metrics import TargetMetrics
from target_service.pair_table import PairTable
from target_service.server import create_server
from target_service.verifier import Mode, verify
from tests.unit.test_verifier_csd import LAMBDA, Counts, _input

KEYS = [
    (" the", ""), ("\n\n", ""), (" 12", "12"), ("12", "12"), (" -", "-"), (" <=", "<="), ("x2", "2"),
    ("٣", "٣"), ("x²", "²"), (" ≤", "≤"), ("×", "×"),
    (" two", "2"), ("Two", "2"), (" nineteen", "19"), (" forty", "40"), ("zero", "0"),
    (" hundred", "#hundred"), (" dozen", "#dozen"),
    (" someone", ""), (" once", ""), (" twofold", ""),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key"), KEYS)
def test_key_keeps_digits_and_operators(text: str, key: str) -> None:
    assert meaning_key(text) == key


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_pair):
    return AutoTokenizer.from_pretrained(tiny_pair.target)


def test_keys_of_a_real_tokenizer(tiny_tokenizer) -> None:
    vocab = len(tiny_tokenizer) + 3  # models pad their output layer past the tokenizer
    keys = meaning_keys(tiny_tokenizer, vocab)  # [V]
    assert keys.shape == (vocab,) and keys.dtype == torch.int64
    ids = {text: tiny_tokenizer.convert_tokens_to_ids(text) for text in ("1", "2", "a", "b")}
    assert keys[ids["a"]] == keys[ids["b"]] == NO_KEY
    assert keys[ids["1"]] != keys[ids["2"]] and NO_KEY not in (keys[ids["1"]], keys[ids["2"]])
    special = [i for i in tiny_tokenizer.all_special_ids if i < vocab]
    assert special, "the tiny tokenizer has special tokens"
    own = keys[special + list(range(len(tiny_tokenizer), vocab))]
    assert (own < 0).all() and own.unique().numel() == own.numel()  # each its own key: never rescuable


def test_every_added_token_has_a_key_of_its_own(tiny_pair) -> None:
    """Only *special* added tokens had one: Qwen's `<tool_call>` and `</tool_call>` are not special, and
    keyed by their characters alone they could stand in for each other (both '<>' and '</>' alike)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair.target)
    tokenizer.add_tokens(["<call>", "<done>"])  # added, not special
    keys = meaning_keys(tokenizer, len(tokenizer))
    call, done = tokenizer.convert_tokens_to_ids(["<call>", "<done>"])
    assert meaning_key("<call>") == meaning_key("<done>")  # what their characters alone would say
    assert keys[call] != keys[done] and min(keys[call], keys[done]) < 0


def _guarded(keys: torch.Tensor | None, mode: Mode = Mode.CSD):
    """Position 0: t* = 1, x̃ = 3, counted often and within the gate: rescued unless the keys differ."""
    inp = _input([([1, 2], [3, 2], [-1.0, 0.0])], [mode])
    return verify(inp, Counts({(3, 1): LAMBDA + 1}), keys)


def test_without_keys_the_frequent_pair_is_rescued() -> None:
    out = _guarded(None)
    assert out.rescued[0, 0].item() and not out.withheld.any()


@pytest.mark.parametrize("mode", [Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY])
def test_different_keys_block_the_rescue(mode: Mode) -> None:
    keys = torch.zeros(16, dtype=torch.int64)
    keys[1], keys[3] = 1, 2  # '1' and '2', say
    out = _guarded(keys, mode)
    assert not out.rescued.any()
    assert out.accepted_count.tolist() == [0] and out.next_token.tolist() == [1]  # t*, as SD would emit
    assert out.event_mask[0, 0].item()  # the memory still counts the event
    assert out.withheld.tolist() == [[True, False]]  # for the metric: the guard ended the round here


def test_a_refusal_after_the_round_ended_is_not_counted() -> None:
    """Position 0 is rejected without a counted pair: the round ends there, and the guard's refusal at
    position 1 was never reached (withheld counts the refusal that ended a round, at most one)."""
    keys = torch.zeros(16, dtype=torch.int64)
    keys[2], keys[4] = 1, 2
    inp = _input([([1, 2], [3, 4], [-1.0, -1.0])], [Mode.CSD])
    out = verify(inp, Counts({(4, 2): LAMBDA + 1}), keys)
    assert out.accepted_count.tolist() == [0] and not out.rescued.any()
    assert not out.withheld.any()


def test_equal_keys_rescue() -> None:
    keys = torch.zeros(16, dtype=torch.int64)
    keys[1] = keys[3] = 7  # ' 12' and '12', say
    out = _guarded(keys)
    assert out.rescued[0, 0].item() and not out.withheld.any()


def _rescued_through_the_engine(target_runner: ModelRunner, guard: bool) -> tuple[list[int], int]:
    """One round of the real target: the draft proposes a digit the target does not emit, a pair the memory
    counted more than λ times, within a gate that passes anything (τ = 1e-30). Returns the rescued positions
    and the withheld rescues."""
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size), meaning_guard=guard)
    prompt = target_runner.tokenizer("x = ")["input_ids"]
    rescue = RescueConfig(Mode.CSD, tau=1e-30, lambda_=LAMBDA)
    try:
        engine.prefill("probe", prompt, SamplingConfig(), rescue, Stopwatch())
        emitted = engine.verify("probe", [], None, Stopwatch()).next_token  # t*, the greedy next token
        digit = next(d for d in ("1", "2") if target_runner.tokenizer.decode([emitted]) != d)
        draft = target_runner.tokenizer.convert_tokens_to_ids(digit)
        engine.table.add_local(torch.tensor([draft] * (LAMBDA + 1)), torch.tensor([emitted] * (LAMBDA + 1)))
        engine.prefill("round", prompt, SamplingConfig(), rescue, Stopwatch())
        result = engine.verify("round", [draft], None, Stopwatch())
        return result.rescued_positions, result.withheld_rescues
    finally:
        engine.stop()


def test_the_served_target_guards_by_default(target_runner: ModelRunner) -> None:
    assert _rescued_through_the_engine(target_runner, guard=False) == ([0], 0)  # the paper's rule rescues it
    assert _rescued_through_the_engine(target_runner, guard=True) == ([], 1)
    assert TargetConfig(model=ModelSpec(Path("m"))).meaning_guard


def test_the_served_target_builds_its_engine_with_the_configured_guard(target_runner: ModelRunner) -> None:
    for guard in (True, False):
        config = TargetConfig(model=ModelSpec(Path("m")), port=0, meaning_guard=guard, measure_forward_costs=False)
        server, _, runtime = create_server(config, target_runner)
        try:
            assert (runtime.engine.meaning_keys is not None) is guard
        finally:
            server.stop(grace=None)
            runtime.stop()


def test_the_flag_turns_it_off() -> None:
    config, _ = parse_config(["--model", "m"])
    assert config.meaning_guard
    config, _ = parse_config(["--model", "m", "--no-meaning-guard"])
    assert not config.meaning_guard


def test_withheld_rescues_are_a_metric(target_runner: ModelRunner) -> None:
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size), meaning_guard=False)
    registry = CollectorRegistry()
    metrics = TargetMetrics(registry, engine, None)
    try:
        metrics.verified(1, VerifyResult(0, [], 5, False, 1, 1, 2, withheld_rescues=1))
        metrics.verified(1, VerifyResult(1, [], 5, True, 0, 1, 2))
        assert registry.get_sample_value("calispec_verify_withheld_rescues_total") == 1
    finally:
        engine.stop()
