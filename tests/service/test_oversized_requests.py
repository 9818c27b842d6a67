"""A request too long for the model is refused from its repeated field's length, before any Python list is built.

A 62 MiB Prefill (65 M token ids, under the 64 MiB gRPC cap) used to become a 65 M-int list (~440 MB, seconds of
CPU) on the target and the draft before prefill_session refused it. The servicers get requests whose ids can tell
their length but cannot be iterated: converting them fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calispec.v1 import draft_pb2, target_pb2
from calispec_core.errors import InvalidArgument
from calispec_core.limits import MAX_SPECULATIVE_TOKENS
from calispec_core.modeling import ModelRunner
from draft_service.proposer import Proposer
from draft_service.server import DraftServicer
from target_service.engine import TargetEngine
from target_service.pair_table import PairTable
from target_service.server import TargetServicer

PROBE_TOKENS = 62 << 20  # the probe's 62 MiB of one-byte varints


class LengthOnly:
    """A repeated field that only tells its length (O(1), as protobuf's does)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        raise AssertionError(f"{self.length} token ids were converted before their count was checked")


class Oversized:
    """A real request whose `field` is replaced by a LengthOnly of `length`."""

    def __init__(self, request: object, field: str, length: int) -> None:
        self._request = request
        setattr(self, field, LengthOnly(length))

    def __getattr__(self, name: str) -> object:
        return getattr(self._request, name)


@pytest.fixture
def target(target_runner: ModelRunner) -> Iterator[TargetServicer]:
    engine = TargetEngine(target_runner, max_sessions=2, table=PairTable(target_runner.vocab_size, "cpu"))
    yield TargetServicer(engine)
    engine.stop()


def context_message(runner: ModelRunner) -> str:
    return f"prompt of {PROBE_TOKENS} tokens does not fit the context \\({runner.max_context}\\)"


def test_the_target_refuses_a_prompt_longer_than_its_context_before_converting_it(
    target: TargetServicer, target_runner: ModelRunner
) -> None:
    request = Oversized(target_pb2.TargetPrefillRequest(session_id="long"), "token_ids", PROBE_TOKENS)
    with pytest.raises(InvalidArgument, match=context_message(target_runner)):
        target.Prefill(request, None)
    assert len(target.engine.sessions) == 0


def test_the_draft_refuses_a_prompt_longer_than_its_context_before_converting_it(draft_runner: ModelRunner) -> None:
    proposer = Proposer(draft_runner, max_sessions=2)
    try:
        request = Oversized(draft_pb2.DraftPrefillRequest(session_id="long"), "token_ids", PROBE_TOKENS)
        with pytest.raises(InvalidArgument, match=context_message(draft_runner)):
            DraftServicer(proposer).Prefill(request, None)
        assert len(proposer.sessions) == 0
    finally:
        proposer.stop()


@pytest.mark.parametrize("rpc", ["Propose", "Rollback"])
def test_the_draft_refuses_an_append_longer_than_its_context_before_converting_it(
    draft_runner: ModelRunner, rpc: str
) -> None:
    proposer = Proposer(draft_runner, max_sessions=2)
    try:
        message = getattr(draft_pb2, f"{rpc}Request")(session_id="any")
        request = Oversized(message, "append_token_ids", PROBE_TOKENS)
        with pytest.raises(InvalidArgument, match=f"{PROBE_TOKENS} append_token_ids cannot fit the context"):
            getattr(DraftServicer(proposer), rpc)(request, None)
    finally:
        proposer.stop()


def test_the_target_refuses_too_many_draft_tokens_before_converting_them(target: TargetServicer) -> None:
    request = Oversized(target_pb2.VerifyRequest(session_id="any"), "draft_token_ids", PROBE_TOKENS)
    with pytest.raises(InvalidArgument, match=f"at most {MAX_SPECULATIVE_TOKENS} draft tokens, got {PROBE_TOKENS}"):
        target.Verify(request, None)


def test_a_prompt_that_fits_still_opens(target: TargetServicer, target_runner: ModelRunner) -> None:
    longest = [1] * (target_runner.max_context - 1)
    target.Prefill(target_pb2.TargetPrefillRequest(session_id="fits", token_ids=longest), None)
    assert len(target.engine.sessions) == 1
