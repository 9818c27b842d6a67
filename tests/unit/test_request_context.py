"""Request ids: validated from metadata, bound while a request runs, on every log line, forwarded."""

from __future__ import annotations

import logging

import grpc
import pytest

from calispec_core import request_context as rc


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc-123", "abc-123"),
        ("id1,id2", "id1,id2"),  # a verifier's memory write names several requests
        ("", None),
        ("has space", None),
        ("line\nbreak", None),  # would forge a log line
        ("x" * (rc.MAX_REQUEST_ID_CHARS + 1), None),
    ],
)
def test_only_safe_ids_are_taken_from_metadata(value: str, expected: str | None) -> None:
    assert rc.from_metadata([("other", "v"), (rc.REQUEST_ID_METADATA, value)]) == expected


def test_bound_id_reaches_log_records_and_outgoing_metadata(caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(rc.RequestIdLogFilter())
    log = logging.getLogger("test.request_context")
    with caplog.at_level(logging.INFO, logger="test.request_context"):
        with rc.bound_request_id("req-7"):
            log.info("inside")
            assert rc.request_metadata([("k", "v")]) == [("k", "v"), (rc.REQUEST_ID_METADATA, "req-7")]
        log.info("outside")
    assert [(r.getMessage(), r.request_id) for r in caplog.records] == [("inside", "req-7"), ("outside", "-")]
    assert rc.request_metadata() == []


class _Details(grpc.ClientCallDetails):
    def __init__(self, metadata: list[tuple[str, str]] | None) -> None:
        self.method, self.timeout, self.metadata, self.credentials = "/s/M", 1.0, metadata, None


def test_client_interceptor_forwards_the_current_id_and_keeps_other_metadata() -> None:
    sent: list[grpc.ClientCallDetails] = []
    interceptor = rc.RequestIdClientInterceptor()
    with rc.bound_request_id("req-9"):
        interceptor.intercept_unary_unary(lambda d, r: sent.append(d), _Details([("token", "t")]), object())
    interceptor.intercept_unary_unary(lambda d, r: sent.append(d), _Details(None), object())
    assert (rc.REQUEST_ID_METADATA, "req-9") in sent[0].metadata and ("token", "t") in sent[0].metadata
    assert sent[0].method == "/s/M" and sent[0].timeout == 1.0
    assert not any(k == rc.REQUEST_ID_METADATA for k, _ in sent[1].metadata)
