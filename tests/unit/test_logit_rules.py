"""Logit rules (vLLM's penalties, logit bias, min_p, allowed token ids, min_tokens) against a slow reference, their
checks, and the verifier's rule that a shaped row records no correction-memory events."""

from __future__ import annotations

import math

import pytest
import torch

from calispec_core.errors import InvalidField
from calispec_core.limits import as_float32
from calispec_core.logit_rules import LogitRules, SessionRules, rules_from_wire
from calispec_core.vocab_pruning import LogitColumns
from target_service.verifier import Mode, VerifyInput, verify

VOCAB = 40
CPU = torch.device("cpu")


def reference(
    logits: torch.Tensor, rules: LogitRules, prompt: list[int], output: list[int], drafts: list[int], temperature: float
) -> torch.Tensor:
    """vLLM's rules written out position by position and token by token."""
    out = logits.clone()
    for i in range(out.shape[0]):
        written = [*output, *drafts[:i]]
        banned = {seq[-1] for seq in rules.bad_word_ids if tuple(written[len(written) - len(seq) + 1 :]) == seq[:-1]}
        for token in range(VOCAB):
            z = out[i, token].item()
            if rules.allowed_token_ids and token not in rules.allowed_token_ids:
                z = -math.inf
            if token in banned:
                z = -math.inf
            if len(written) < rules.min_tokens and token in rules.end_token_ids:
                z = -math.inf
            z += dict(rules.logit_bias).get(token, 0.0)
            if token in prompt or token in written:
                z = z / rules.repetition_penalty if z > 0 else z * rules.repetition_penalty
            z -= rules.frequency_penalty * written.count(token) + rules.presence_penalty * (token in written)
            out[i, token] = z
        if rules.min_p > 0 and temperature > 0:
            probs = torch.softmax(out[i] / temperature, dim=-1)
            out[i] = torch.where(probs >= rules.min_p * probs.max(), out[i], -math.inf)
    return out


RULES = [
    LogitRules.of(presence_penalty=0.5),
    LogitRules.of(frequency_penalty=-0.75, presence_penalty=1.5),
    LogitRules.of(repetition_penalty=1.5),
    LogitRules.of(repetition_penalty=0.5, frequency_penalty=0.25, logit_bias={3: 2.5, 7: -100.0}),
    LogitRules.of(allowed_token_ids=[1, 2, 3, 5, 8, 13, 21, 34], logit_bias={8: 1.0}),
    LogitRules.of(min_tokens=5).ending([0, 9]),
    LogitRules(bad_word_ids=((13,), (9, 3), (3, 11), (11, 7, 2), (5, 5, 11)), frequency_penalty=0.5),
    LogitRules.of(min_p=0.2, presence_penalty=-1.0),
]


@pytest.mark.parametrize("rules", RULES, ids=range(len(RULES)))
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_rules_match_vllms_formulas_at_every_position(rules: LogitRules, temperature: float) -> None:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(4, VOCAB, generator=generator) * 3  # [S, V]: position i after output + drafts[:i]
    prompt, output, drafts = [4, 5, 5, 6], [7, 3, 3, 9], [3, 11, 7]
    expected = reference(logits, rules, prompt, output, drafts, temperature)
    applied = logits.clone()
    SessionRules(rules, prompt, VOCAB, CPU).apply(applied, output, drafts, temperature)
    torch.testing.assert_close(applied, expected)


@pytest.mark.parametrize("rules", RULES[:-1], ids=range(len(RULES) - 1))  # min_p: relative to the layer's own top
def test_a_pruned_output_layer_gets_the_kept_columns_of_the_same_rules(rules: LogitRules) -> None:
    """The draft's pruned layer: its columns are the kept ids (the rules index them by column, not by id)."""
    kept = torch.tensor([0, 1, 3, 5, 7, 8, 9, 11, 13, 20, 34, 39])
    columns = LogitColumns(VOCAB, kept)
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    prompt, output, drafts = [5, 6], [7, 3, 12], [3]
    full = logits.clone()
    SessionRules(rules, prompt, VOCAB, CPU).apply(full, output, drafts, 0.7)
    pruned = logits[:, kept].clone()
    SessionRules(rules, prompt, VOCAB, CPU).apply(pruned, output, drafts, 0.7, columns)
    torch.testing.assert_close(pruned, full[:, kept])


def test_min_tokens_keeps_an_end_id_where_it_is_the_only_token_left() -> None:
    """A structured output done (only the end-of-sequence token allowed) or allowed ids of end ids only: holding
    the end back would leave no token at all (a greedy argmax over -inf, a NaN distribution)."""
    logits = torch.full((3, VOCAB), -math.inf)
    logits[:, 0] = 1.0  # only the end id
    logits[1, 4] = 2.0  # position 1 has another token
    SessionRules(LogitRules.of(min_tokens=9).ending([0]), [], VOCAB, CPU).apply(logits, [], [4, 4], 0.0)
    assert logits[0, 0] == 1.0 and logits[2, 0] == 1.0  # kept: nothing else there
    assert logits[1, 0] == -math.inf and logits[1, 4] == 2.0


def test_positions_allowed_ids_leave_without_a_token_are_zeroed_and_reported() -> None:
    """A structured output's grammar past a draft can allow none of the ids: the position is finite for the verifier
    and reported, so that only a round that reaches it fails its request (the target's `_check_reached`)."""
    logits = torch.zeros(2, VOCAB)
    logits[1, :5] = -math.inf  # position 1's grammar refuses ids 0-4
    empty = SessionRules(LogitRules.of(allowed_token_ids=[1, 2]), [], VOCAB, CPU).apply(logits, [], [1], 0.0)
    assert empty is not None and empty.tolist() == [False, True] and (logits[1] == 0).all()
    assert SessionRules(LogitRules.of(presence_penalty=1.0), [], VOCAB, CPU).apply(logits, [], [1], 0.0) is None


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        (LogitRules.of(presence_penalty=2.5), "presence_penalty"),
        (LogitRules.of(frequency_penalty=float("nan")), "frequency_penalty"),
        (LogitRules.of(repetition_penalty=0.0), "repetition_penalty"),
        (LogitRules.of(repetition_penalty=1e-38), "repetition_penalty"),  # z / 1e-38 overflows to +inf
        (LogitRules.of(repetition_penalty=2.5), "repetition_penalty"),
        (LogitRules.of(min_p=1.5), "min_p"),
        (LogitRules.of(min_tokens=-1), "min_tokens"),
        (LogitRules.of(min_tokens=10**6), "min_tokens"),
        (LogitRules.of(logit_bias={1: 101.0}), "logit_bias"),
        (LogitRules.of(logit_bias={-1: 1.0}), "logit_bias"),
        (LogitRules.of(logit_bias={i: 1.0 for i in range(1025)}), "logit_bias"),
        (LogitRules.of(allowed_token_ids=[VOCAB]), "allowed_token_ids"),
        (LogitRules.of(bad_words=[" \t"]), "bad_words"),  # bans nothing, yet made the request a shaped one
        (LogitRules.of(bad_words=["x" * 257]), "bad_words"),
    ],
)
def test_out_of_range_rules_name_their_field(rules: LogitRules, field: str) -> None:
    with pytest.raises(InvalidField) as caught:
        rules.validate(VOCAB)
    assert caught.value.field == field


def test_rules_cross_the_wire_unchanged_and_a_clients_end_ids_are_dropped() -> None:
    rules = LogitRules.of(
        presence_penalty=0.5, repetition_penalty=1.25, min_p=0.5, logit_bias={3: -1.5}, allowed_token_ids=[3, 1]
    )
    assert LogitRules.from_pb(rules.to_pb()) == rules
    held = LogitRules.of(min_tokens=3).ending([2, 9])
    assert LogitRules.from_pb(held.to_pb()) == held
    assert rules_from_wire(held.to_pb(), True, from_client=True) == LogitRules.of(min_tokens=3)
    assert rules_from_wire(LogitRules().to_pb(), True) is None  # changes nothing
    assert not LogitRules.of(repetition_penalty=1.0, logit_bias={}).active


def test_a_shaped_row_records_no_events_and_still_rescues() -> None:
    """A row whose logits a request's rules changed: its (x̃, t*) pairs would teach the shared memory that request's
    preferences (a penalty, a bias), not the draft's confusions."""
    logits = torch.zeros(2, 3, 8)  # [B, G+1, V]
    logits[:, 0, 1], logits[:, 0, 2] = 10.0, 9.5  # t* = 1, the draft's 2 just below it
    logits[:, 1, 3] = 10.0
    inp = VerifyInput(
        target_logits=logits,
        draft_tokens=torch.tensor([[2, 3], [2, 3]]),
        num_draft=torch.tensor([2, 2]),
        draft_probs=None,
        temperature=torch.zeros(2),
        top_k=torch.zeros(2, dtype=torch.int64),
        top_p=torch.zeros(2),
        mode=torch.tensor([int(Mode.CSD)] * 2),
        log_tau=torch.full((2,), math.log(0.01)),
        lambda_=torch.zeros(2, dtype=torch.int64),
        generators=[torch.Generator(), torch.Generator()],
        shaped=torch.tensor([False, True]),
    ).validate()
    out = verify(inp, lambda d, t: torch.full_like(d, 9))
    assert out.rescued[:, 0].tolist() == [True, True]
    assert out.event_mask[:, 0].tolist() == [True, False]


def test_the_repetition_penaltys_floor_is_taken_as_its_float32_carries_it() -> None:
    """0.01 travels as 0.0099999998: the documented bound was refused by the SDK, the CLI and the services."""
    LogitRules.of(repetition_penalty=as_float32(0.01)).validate()
    with pytest.raises(InvalidField):
        LogitRules.of(repetition_penalty=0.0099).validate()
