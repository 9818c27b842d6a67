"""The SDK's request building: what a caller passes is what the coordinator gets (no server needed)."""

from __future__ import annotations

import pytest

from calispec.client import NO_DEADLINE_S, _requests, _timeout, _with_request_id, build_params
from calispec.types import Mode


def test_one_stop_string_is_one_stop_string_not_its_letters() -> None:
    """`stop="abc"` became ["a", "b", "c"], and the output was cut at the first "a"."""
    assert list(build_params(stop="abc").stop) == ["abc"]
    assert list(build_params(stop=["ab", "c"]).stop) == ["ab", "c"]


def test_a_zero_timeout_is_a_deadline_not_none() -> None:
    """`timeout or default` made 0 mean the server's 60 s, while 1e-9 expired at once."""
    assert _timeout(0, 30.0) == 0 and _timeout(None, 30.0) == 30.0 and _timeout(2.5, None) == 2.5


@pytest.mark.parametrize("timeout", [NO_DEADLINE_S, 1e10, float("inf")])
def test_a_timeout_past_grpcs_clock_is_no_deadline(timeout: float) -> None:
    """grpcio's deadline overflowed past ~7.4e9 s: the call failed at once with DEADLINE_EXCEEDED (wave 50)."""
    assert _timeout(timeout, None) is None and _timeout(None, timeout) is None
    assert _timeout(NO_DEADLINE_S / 2, None) == NO_DEADLINE_S / 2


def test_a_nan_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="nan"):
        _timeout(float("nan"), None)
    with pytest.raises(ValueError, match="nan"):
        _timeout(None, float("nan"))  # the client's default


@pytest.mark.parametrize("prompt", [b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_a_bytes_prompt_is_refused_not_sent_as_token_ids(prompt: bytes) -> None:
    """`generate(b"abc")` sent token ids [97, 98, 99] (wave 50)."""
    with pytest.raises(TypeError, match="not bytes"):
        _requests(prompt, None, {})
    assert list(_requests([97, 98], None, {})[0].prompt_token_ids.ids) == [97, 98]


def test_a_request_id_grpc_cannot_send_is_refused_on_the_callers_side() -> None:
    """gRPC failed `request_id="bad\\nid"` as INTERNAL: Invalid metadata."""
    assert _with_request_id((), "req-7") == (("x-request-id", "req-7"),)
    assert _with_request_id((), None) == () == _with_request_id((), "")
    for bad in ("bad\nid", "with space", "x" * 257):
        with pytest.raises(ValueError, match="request_id"):
            _with_request_id((), bad)


@pytest.mark.parametrize(
    ("argument", "value", "error"),
    [
        ("seed", -1, ValueError),
        ("max_new_tokens", 2**31, ValueError),
        ("logprobs", -1, ValueError),
        ("stop_token_ids", [-1], ValueError),
        ("stop", [1], TypeError),
        ("temperature", "hot", TypeError),
        ("logit_bias", {-1: 2.0}, ValueError),
        ("allowed_token_ids", [2**32], ValueError),
        ("min_tokens", -1, ValueError),
        ("repetition_penalty", 0.0, ValueError),  # the wire's "unset": it was sent as off (review)
    ],
)
def test_an_argument_the_request_cannot_carry_is_named(argument: str, value: object, error: type[Exception]) -> None:
    """protobuf's own words named nothing: "Value out of range: -1", "bad argument type for built-in operation"
    (found by probing the SDK)."""
    with pytest.raises(error, match=f"^{argument}: "):
        build_params(**{argument: value})


def test_no_stop_is_none_as_well_and_the_fields_arrive_as_given() -> None:
    params = build_params(stop=None, seed=7, ignore_eos=True, top_k=5, mode="sd", stop_token_ids=[3])
    assert list(params.stop) == [] and (params.seed, params.ignore_eos, params.top_k) == (7, True, 5)
    assert params.mode == Mode.SD and list(params.stop_token_ids) == [3]


@pytest.mark.parametrize(
    ("prompt", "messages", "match"),
    [
        ([-1], None, "^prompt: "),
        (None, [{"role": "user"}], r"^messages\[0\] must be a mapping with a 'role' and a 'content'"),
        (None, ["hi"], r"^messages\[0\] must be"),
        (None, [{"role": "user", "content": "ok"}, {"role": "user", "content": "caf\udce9"}], r"^messages\[1\]: "),
    ],
)
def test_a_prompt_or_message_the_request_cannot_carry_is_named(
    prompt: list[int] | None, messages: list[dict[str, str]] | None, match: str
) -> None:
    """A message without its content was a bare KeyError: 'content'; text with lone surrogates (stdin read with
    surrogateescape) protobuf's UnicodeEncodeError."""
    with pytest.raises(ValueError, match=match):
        _requests(prompt, messages, {})


def test_logit_rules_arrive_as_given_and_leave_none_when_off() -> None:
    params = build_params(presence_penalty=0.5, repetition_penalty=1.25, min_tokens=3, logit_bias={7: -2.0})
    assert params.HasField("rules") and params.rules.min_tokens == 3 and dict(params.rules.logit_bias) == {7: -2.0}
    assert (params.rules.presence_penalty, params.rules.repetition_penalty) == (0.5, 1.25)
    assert not build_params(repetition_penalty=1.0, logit_bias={}, allowed_token_ids=[]).HasField("rules")
    assert list(build_params(bad_words="abc").rules.bad_words) == ["abc"]  # one word: not its letters
