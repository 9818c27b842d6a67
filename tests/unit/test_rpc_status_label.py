"""The `code` label of `calispec_rpc_requests_total` for a call that ended under its handler: as its client saw it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from calispec_core.observability import DEADLINE_SLACK_S, _status

NO_DEADLINE = 9.2e18  # what gRPC's time_remaining() gives for a call without a deadline


@dataclass
class FakeContext:
    active: bool = True
    left: float = NO_DEADLINE
    set_code: grpc.StatusCode | None = None

    def code(self) -> grpc.StatusCode | None:
        return self.set_code

    def is_active(self) -> bool:
        return self.active

    def time_remaining(self) -> float:
        return self.left


READ_FAILED = grpc.RpcError()  # what reading a request stream raises once the call has ended


@pytest.mark.parametrize(
    ("context", "failed", "label"),
    [
        (FakeContext(), None, "OK"),
        (FakeContext(set_code=grpc.StatusCode.INVALID_ARGUMENT), Exception("aborted"), "INVALID_ARGUMENT"),
        (FakeContext(), RuntimeError("a bug"), "UNKNOWN"),  # the call still active: nothing ended it
        (FakeContext(active=False), READ_FAILED, "CANCELLED"),  # its client left (it was UNKNOWN)
        (FakeContext(active=False), None, "CANCELLED"),  # the read ended as if the stream closed (it was OK)
        (FakeContext(active=False, left=-0.5), READ_FAILED, "DEADLINE_EXCEEDED"),
        (FakeContext(active=False, left=DEADLINE_SLACK_S / 10), None, "DEADLINE_EXCEEDED"),  # the client's is earlier
        (FakeContext(active=False, left=DEADLINE_SLACK_S * 10), None, "CANCELLED"),
        (FakeContext(), GeneratorExit(), "CANCELLED"),  # a stream its client stopped reading
    ],
)
def test_a_call_is_counted_as_its_client_saw_it(context: FakeContext, failed: BaseException | None, label: str) -> None:
    assert _status(context, failed) == label


def test_a_context_without_the_call_state_methods_keeps_the_plain_labels() -> None:
    class Bare:
        def code(self) -> None:
            return None

        def is_active(self) -> bool:  # no time_remaining: the call-state rule is not tried
            return False

    assert _status(Bare(), None) == "OK" and _status(Bare(), RuntimeError()) == "UNKNOWN"
