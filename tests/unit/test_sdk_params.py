"""The SDK's request building: what a caller passes is what the coordinator gets (no server needed)."""

from __future__ import annotations

import pytest

from calispec.client import _timeout, _with_request_id, build_params


def test_one_stop_string_is_one_stop_string_not_its_letters() -> None:
    """`stop="abc"` became ["a", "b", "c"], and the output was cut at the first "a"."""
    assert list(build_params(stop="abc").stop) == ["abc"]
    assert list(build_params(stop=["ab", "c"]).stop) == ["ab", "c"]


def test_a_zero_timeout_is_a_deadline_not_none() -> None:
    """`timeout or default` made 0 mean the server's 60 s, while 1e-9 expired at once."""
    assert _timeout(0, 30.0) == 0 and _timeout(None, 30.0) == 30.0 and _timeout(2.5, None) == 2.5


def test_a_request_id_grpc_cannot_send_is_refused_on_the_callers_side() -> None:
    """gRPC failed `request_id="bad\\nid"` as INTERNAL: Invalid metadata."""
    assert _with_request_id((), "req-7") == (("x-request-id", "req-7"),)
    assert _with_request_id((), None) == () == _with_request_id((), "")
    for bad in ("bad\nid", "with space", "x" * 257):
        with pytest.raises(ValueError, match="request_id"):
            _with_request_id((), bad)
