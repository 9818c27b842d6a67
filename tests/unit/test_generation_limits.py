"""The domain's range errors, as the coordinator's gRPC API words them (INVALID_ARGUMENT with this message), pinned
on each field's edge values: `params_from_pb` then `GenerationParams.validate`, the servicer's path."""

from __future__ import annotations

import pickle

import pytest

from calispec.v1 import coordinator_pb2
from calispec_core.errors import InvalidArgument, InvalidField
from calispec_core.generation import Defaults
from calispec_core.limits import check_speculative_tokens
from coordinator.server import params_from_pb

# a wire request's fields (float32 and int32 as protobuf carries them) -> the refusal's message
REFUSED: list[tuple[dict, str]] = [
    ({"max_new_tokens": -1}, "max_new_tokens must be in [1, 8192], got -1"),
    ({"max_new_tokens": 8193}, "max_new_tokens must be in [1, 8192], got 8193"),
    ({"temperature": -0.5}, "temperature must be in [0.0, 100.0], got -0.5"),
    ({"temperature": 100.5}, "temperature must be in [0.0, 100.0], got 100.5"),
    ({"temperature": float("nan")}, "temperature must be in [0.0, 100.0], got nan"),
    ({"temperature": float("inf")}, "temperature must be in [0.0, 100.0], got inf"),
    ({"top_p": -0.5}, "top_p must be in [0.0, 1.0], got -0.5"),
    ({"top_p": 1.5}, "top_p must be in [0.0, 1.0], got 1.5"),
    ({"top_p": float("nan")}, "top_p must be in [0.0, 1.0], got nan"),
    ({"top_k": -1}, "top_k must be in [0, 2147483647], got -1"),
    ({"seed": 2**63}, "seed must be in [0, 2**63), got 9223372036854775808"),
    ({"seed": 2**64 - 1}, "seed must be in [0, 2**63), got 18446744073709551615"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be in [1, 16], got 0"),
    ({"num_speculative_tokens": -1}, "num_speculative_tokens must be in [1, 16], got -1"),
    ({"num_speculative_tokens": 17}, "num_speculative_tokens must be in [1, 16], got 17"),
    ({"tau": 0.0}, "tau must be in (0, 1], got 0.0"),
    ({"tau": -0.5}, "tau must be in (0, 1], got -0.5"),
    ({"tau": 1.5}, "tau must be in (0, 1], got 1.5"),
    ({"tau": float("nan")}, "tau must be in (0, 1], got nan"),
    ({"lambda_": -1}, "lambda must be in [0, 2147483647], got -1"),
    ({"stop": [""]}, "stop strings must be 1 to 256 characters"),
    ({"stop": ["ok", "a" * 257]}, "stop strings must be 1 to 256 characters"),
    ({"stop": ["x"] * 17}, "at most 16 stop strings, got 17"),
    # two faults: the domain's order (lengths, sampling, CSD thresholds, stop strings)
    ({"temperature": 500, "num_speculative_tokens": 99}, "num_speculative_tokens must be in [1, 16], got 99"),
    ({"top_k": -1, "temperature": 500}, "temperature must be in [0.0, 100.0], got 500.0"),
    ({"lambda_": -1, "top_p": 2}, "top_p must be in [0.0, 1.0], got 2.0"),
    ({"stop": [""], "tau": 2}, "tau must be in (0, 1], got 2.0"),
]
# what only a request that skips the wire (a float64 τ, an int past int32) or a server's own setting reaches
REFUSED_UNROUNDED: list[tuple[dict, str]] = [
    ({"tau": 1e-46}, "tau must be in (0, 1], got 1e-46 (0.0 as the target's float32)"),
    ({"lambda_": 2**31}, "lambda must be in [0, 2147483647], got 2147483648"),
]


@pytest.mark.parametrize(("fields", "message"), REFUSED, ids=[str(f)[:60] for f, _ in REFUSED])
def test_each_fields_range_error_keeps_its_grpc_message(fields: dict, message: str) -> None:
    params = params_from_pb(coordinator_pb2.GenerationParams(**fields), Defaults())
    with pytest.raises(InvalidArgument) as info:
        params.validate()
    assert str(info.value) == message


@pytest.mark.parametrize(("fields", "message"), REFUSED_UNROUNDED)
def test_unrounded_values_keep_their_messages(fields: dict, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Defaults(**fields)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "fields",
    [
        {"max_new_tokens": 1},
        {"max_new_tokens": 8192},
        {"temperature": 100.0, "top_p": 1.0, "top_k": 2**31 - 1, "seed": 2**63 - 1},
        {"num_speculative_tokens": 1},
        {"num_speculative_tokens": 16},
        {"tau": 1.0, "lambda_": 0},
        {"tau": 1e-40, "lambda_": 2**31 - 1},
        {"stop": ["a" * 256] + ["x"] * 15},
    ],
)
def test_each_fields_edge_values_are_taken(fields: dict) -> None:
    params_from_pb(coordinator_pb2.GenerationParams(**fields), Defaults()).validate()


def test_a_fields_refusal_carries_the_field_and_its_reason() -> None:
    """What the OpenAI HTTP API words its 400 with (`gamma: must be in [1, 16], got 17`); it pickles as itself."""
    with pytest.raises(InvalidField) as info:
        check_speculative_tokens(17)
    refusal = pickle.loads(pickle.dumps(info.value))
    assert (refusal.field, refusal.reason) == ("num_speculative_tokens", "must be in [1, 16], got 17")
    assert str(refusal) == "num_speculative_tokens must be in [1, 16], got 17" and refusal.code == "INVALID_ARGUMENT"


def test_the_drafts_gamma_is_refused_under_its_own_name() -> None:
    """The draft's Propose keeps γ's rule under its field's name (num_tokens), in the same words."""
    with pytest.raises(InvalidField) as info:
        check_speculative_tokens(0, "num_tokens")
    assert str(info.value) == "num_tokens must be in [1, 16], got 0"
