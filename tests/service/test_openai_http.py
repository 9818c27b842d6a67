"""The OpenAI-compatible API's HTTP layer, probed as real clients and proxies meet it: what is checked
before the body is read (API key, size, media type), error shapes and headers, `/v1/models/{id}`,
`/health`, and the headers of server-sent events. Most requests here are refused before any generation,
so they run against a stub orchestrator; the streaming test uses the tiny pair."""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import openai
import pytest

import coordinator.__main__ as coordinator_cli
import coordinator.openai_api as openai_api
from calispec_core.generation import Defaults
from calispec_core.limits import MAX_PROMPT_CHARS, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from calispec_core.observability import DrainGate
from coordinator.chat import MAX_CHAT_MESSAGES
from coordinator.config import HTTP_MAX_BODY_BYTES
from coordinator.engine import Orchestrator
from coordinator.openai_api import ApiSettings, create_app, start_http_server
from tests.helpers import one_api_key
from tests.service.conftest import Coordinator

MODEL = "tiny-chat"
LIMIT = 4096  # the body limit of the servers below, unless a test says otherwise
JSON = {"content-type": "application/json"}


class StubOrchestrator:
    """All the HTTP layer touches of an orchestrator before a generation starts (/health reads `replicas`, the
    model card `context_length`)."""

    context_length = 1023

    def __init__(self, replicas: int = 1) -> None:
        self.replicas = [SimpleNamespace(address=f"target-{i}:1") for i in range(replicas)]


@dataclass(frozen=True)
class Served:
    port: int
    key: str | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}


@contextmanager
def served(
    tmp_path: Path | None = None,
    orchestrator: object | None = None,
    max_body_bytes: int = LIMIT,
    gate: DrainGate | None = None,
    allowed_origins: tuple[str, ...] = (),
) -> Iterator[Served]:
    """The HTTP API on a free port; with API keys (one, returned) when given a directory for the keys file."""
    key, keys = one_api_key(tmp_path)
    settings = ApiSettings(
        MODEL, Defaults(), 60, keys, gate=gate, max_body_bytes=max_body_bytes, allowed_origins=allowed_origins
    )
    app = create_app(cast(Orchestrator, orchestrator or StubOrchestrator()), settings)
    server = start_http_server(app, "127.0.0.1", 0)
    try:
        yield Served(server.port, key)
    finally:
        server.stop()


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: Any

    @property
    def error(self) -> dict[str, Any]:
        assert set(self.body) == {"error"}, self.body
        error = self.body["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
        return error


def raw(port: int, path: str, headers: dict[str, str], body: bytes | Iterator[bytes] | None = None) -> Reply:
    """One request on a socket of its own. Without a body only the headers are sent (whatever
    Content-Length they declare); an iterator body goes chunked. A server that waits for a body it never
    gets times out here (30 s) and fails the test."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        if body is None:
            conn.putrequest("POST", path, skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, value)
            conn.endheaders()
        else:
            conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return Reply(response.status, response.headers, json.loads(data) if data else None)
    finally:
        conn.close()


# -- the body: authenticated first, limited, JSON only -------------------------------------------------


def test_an_unauthenticated_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A 50 MB body was read and parsed before the 401 (+150 MB of coordinator memory per request). Only the
    headers are sent here: a server that reads the body first never answers."""
    with served(tmp_path, max_body_bytes=HTTP_MAX_BODY_BYTES) as server:
        reply = raw(server.port, "/v1/completions", {**JSON, "content-length": str(50_000_000)})
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert reply.error["type"] == "authentication_error" and reply.error["code"] == "unauthenticated"


def test_a_declared_body_over_the_limit_is_413_before_it_is_read(tmp_path: Path) -> None:
    with served(tmp_path) as server:
        reply = raw(server.port, "/v1/chat/completions", {**JSON, **server.auth, "content-length": str(LIMIT + 1)})
    assert reply.status == 413
    assert reply.error["code"] == "resource_exhausted" and f"limit of {LIMIT} bytes" in reply.error["message"]


def test_a_chunked_body_is_counted_as_it_is_read() -> None:
    """No Content-Length to refuse at once: the body is refused once it passes the limit."""
    opening = b'{"model": "%s", "prompt": "' % MODEL.encode()
    chunks = iter([opening, b"x" * (LIMIT // 2), b"x" * (LIMIT // 2), b'"}'])
    with served() as server:
        reply = raw(server.port, "/v1/completions", JSON, chunks)
    assert reply.status == 413
    assert reply.error["code"] == "resource_exhausted" and reply.error["type"] == "invalid_request_error"


def test_a_body_of_exactly_the_limit_is_read() -> None:
    body = json.dumps({"model": "gpt-9", "prompt": ""}).encode()
    body = body[:-2] + b" " * (LIMIT - len(body)) + body[-2:]  # JSON whitespace up to the limit
    assert len(body) == LIMIT
    with served() as server:
        reply = raw(server.port, "/v1/completions", JSON, body)
    assert reply.status == 404 and reply.error["param"] == "model"  # parsed: the model is unknown


def _longest_valid_requests() -> list[dict[str, Any]]:
    """Completion and chat requests at every limit, written with the longest JSON escapes there are."""
    widest = "\U0001f600"  # json.dumps writes it as a surrogate pair of escapes: 12 bytes
    stop = [widest * MAX_STOP_STRING_CHARS] * MAX_STOP_STRINGS
    share = MAX_PROMPT_CHARS // MAX_CHAT_MESSAGES
    messages = [{"role": "assistant", "content": widest * share} for _ in range(MAX_CHAT_MESSAGES)]
    messages[-1]["content"] += widest * (MAX_PROMPT_CHARS - share * MAX_CHAT_MESSAGES)
    common = {"model": MODEL, "max_tokens": 8192, "temperature": 1.0, "top_p": 1.0, "stop": stop, "seed": 2**63 - 1}
    return [{**common, "prompt": widest * MAX_PROMPT_CHARS}, {**common, "messages": messages}]


def test_the_default_limit_fits_the_longest_valid_request() -> None:
    for request in _longest_valid_requests():
        assert len(json.dumps(request).encode()) <= HTTP_MAX_BODY_BYTES


def test_the_longest_valid_prompt_passes_the_default_limit() -> None:
    body = json.dumps({**_longest_valid_requests()[0], "model": "gpt-9"}).encode()
    with served(max_body_bytes=HTTP_MAX_BODY_BYTES) as server:
        reply = raw(server.port, "/v1/completions", JSON, body)
    assert reply.status == 404, reply.body  # read, parsed and validated: only the model is wrong


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        (JSON, b'{"model": "\xff\xfe", "prompt": "hi"}', "not UTF-8"),
        (JSON, b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (JSON, gzip.compress(b'{"model": "tiny-chat", "prompt": "hi"}'), "not valid JSON"),
        ({**JSON, "content-encoding": "gzip"}, gzip.compress(b'{"model": "x", "prompt": "hi"}'), "Content-Encoding"),
        ({}, b'{"model": "x", "prompt": "hi"}', "Content-Type must be application/json (none was sent)"),
        ({"content-type": "text/plain"}, b'{"model": "x", "prompt": "hi"}', "Content-Type must be application/json"),
        (
            {"content-type": "application/x-www-form-urlencoded"},
            b'{"model": "x", "prompt": "hi"}',
            "Content-Type must be application/json",
        ),
    ],
)
def test_a_body_that_cannot_be_parsed_is_a_400_invalid_argument(
    headers: dict[str, str], body: bytes, message: str
) -> None:
    """Were 400s with `code: null` (the docs promise invalid_argument), or for a missing or other
    Content-Type "body: Input should be a valid dictionary"."""
    with served(max_body_bytes=HTTP_MAX_BODY_BYTES) as server:
        reply = raw(server.port, "/v1/completions", headers, body)
    assert reply.status == 400
    assert reply.error["code"] == "invalid_argument" and reply.error["type"] == "invalid_request_error"
    assert message in reply.error["message"]
    if "content-encoding" in headers:
        assert reply.headers["accept-encoding"] == "identity"


def test_json_with_a_charset_parameter_is_json() -> None:
    with served() as server:
        reply = raw(
            server.port, "/v1/completions", {"content-type": "Application/JSON; charset=utf-8"}, b'{"model": "x"}'
        )
    assert reply.status == 400 and reply.error["param"] == "prompt"  # parsed, then validated


# -- authentication ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer {}", "bearer {}", "BEARER {}", "bEaReR\t{}", "Bearer  \t {}"])
def test_the_bearer_scheme_is_case_insensitive(tmp_path: Path, scheme: str) -> None:
    """RFC 9110 §11.1: `bearer KEY` and `BEARER KEY` were 401s."""
    with served(tmp_path) as server:
        response = httpx.get(f"{server.url}/v1/models", headers={"authorization": scheme.format(server.key)})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("value", ["Basic {}", "Bearer{}", "{}", "Bearer {} extra", "Bearer", ""])
def test_other_authorization_values_are_401_with_a_challenge(tmp_path: Path, value: str) -> None:
    with served(tmp_path) as server:
        response = httpx.get(f"{server.url}/v1/models", headers={"authorization": value.format(server.key)})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthenticated"


# -- the framework's refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allowed"), [("GET", "/v1/completions", "POST"), ("POST", "/v1/models", "GET")]
)
def test_a_wrong_method_is_405_with_allow(method: str, path: str, allowed: str) -> None:
    """The exception handler dropped the framework's `Allow` header, and the code was null."""
    with served() as server:
        response = httpx.request(method, f"{server.url}{path}", json={})
    assert response.status_code == 405 and response.headers["allow"] == allowed
    error = response.json()["error"]
    assert error["code"] == "unimplemented" and f"allowed: {allowed}" in error["message"]


def test_an_unknown_path_is_404_in_openais_shape() -> None:
    with served() as server:
        response = httpx.get(f"{server.url}/v1/engines")
    assert response.status_code == 404
    assert response.json()["error"] | {"message": ""} == {
        "message": "", "type": "not_found_error", "param": None, "code": "not_found"
    }  # fmt: skip


# -- /v1/models/{id} ------------------------------------------------------------------------------------


def test_models_retrieve_and_a_stable_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`client.models.retrieve` failed (no route); `created` was the time of each call. Here the clock moves
    1000 s on every reading: `created` must be the reading at the app's start, whenever it is asked."""
    ticks = itertools.count(1_700_000_000, 1000)
    monkeypatch.setattr(openai_api, "time", SimpleNamespace(time=lambda: float(next(ticks))))
    with served(tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key, max_retries=0, timeout=30)
        card = client.models.retrieve(MODEL)
        listed = [m.created for m in client.models.list().data]
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("gpt-9")
        anonymous = httpx.get(f"{server.url}/v1/models/{MODEL}")
    assert (card.id, card.object, card.owned_by, card.created) == (MODEL, "model", "calispec", 1_700_000_000)
    assert listed == [1_700_000_000]
    error = info.value.response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("not_found_error", "model", "not_found")
    assert anonymous.status_code == 401


def test_a_model_id_with_a_slash_is_retrieved() -> None:
    settings = ApiSettings("Qwen/Qwen2.5-Coder", Defaults(), request_timeout_s=60, max_body_bytes=LIMIT)
    server = start_http_server(create_app(cast(Orchestrator, StubOrchestrator()), settings), "127.0.0.1", 0)
    try:
        response = httpx.get(f"http://127.0.0.1:{server.port}/v1/models/Qwen/Qwen2.5-Coder")
    finally:
        server.stop()
    assert response.status_code == 200 and response.json()["id"] == "Qwen/Qwen2.5-Coder"


# -- /health --------------------------------------------------------------------------------------------


def test_health_is_unauthenticated_and_follows_the_drain(tmp_path: Path) -> None:
    gate = DrainGate(())
    with served(tmp_path, gate=gate) as server:
        serving = httpx.get(f"{server.url}/health")
        gate.start_draining()
        draining = httpx.get(f"{server.url}/health")
    assert serving.status_code == 200 and serving.content == b""
    assert draining.status_code == 503
    assert draining.json()["error"]["type"] == "service_unavailable" and "draining" in draining.text


def test_health_is_503_without_a_target_replica() -> None:
    with served(orchestrator=StubOrchestrator(replicas=0)) as server:
        response = httpx.get(f"{server.url}/health")
    assert response.status_code == 503 and "no target replica" in response.json()["error"]["message"]


# -- server-sent events ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "def add(a, b):"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_event_streams_tell_proxies_not_to_buffer(chat_coordinator: Coordinator, path: str, body: dict) -> None:
    """Without `Cache-Control: no-cache` and `X-Accel-Buffering: no` a buffering proxy (nginx) held the events."""
    request = {"model": MODEL, "max_tokens": 3, "temperature": 0, "stream": True, **body}
    with (
        served(orchestrator=chat_coordinator.orchestrator) as server,
        httpx.stream("POST", f"{server.url}{path}", json=request, timeout=60) as response,
    ):
        raw_events = "".join(response.iter_text())
    assert response.status_code == 200 and raw_events.endswith("data: [DONE]\n\n")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"


ORIGIN = "http://localhost:3000"


def test_cors_admits_the_allowed_origins_preflight_and_all(tmp_path: Path) -> None:
    """Browser clients could not call the API: a preflight carries no API key and was a 405 (401 since)."""
    with served(tmp_path, allowed_origins=(ORIGIN,)) as api:
        base = f"http://127.0.0.1:{api.port}"
        preflight = httpx.options(
            f"{base}/v1/completions",
            headers={"origin": ORIGIN, "access-control-request-method": "POST",
                     "access-control-request-headers": "authorization, content-type"},
        )  # fmt: skip
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        models = httpx.get(f"{base}/v1/models", headers={"origin": ORIGIN, **api.auth})
        assert models.status_code == 200 and models.headers["access-control-allow-origin"] == ORIGIN
        # a 429's Retry-After must be readable by the page (probing found only x-request-id exposed)
        assert "retry-after" in models.headers["access-control-expose-headers"].lower()
        refused = httpx.get(f"{base}/v1/models", headers={"origin": ORIGIN})  # no key: the 401 is readable too
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN
        other = httpx.get(f"{base}/v1/models", headers={"origin": "http://evil.example", **api.auth})
        assert "access-control-allow-origin" not in other.headers


def test_no_cors_headers_unless_origins_are_allowed(tmp_path: Path) -> None:
    with served(tmp_path) as api:
        reply = httpx.get(f"http://127.0.0.1:{api.port}/v1/models", headers={"origin": ORIGIN, **api.auth})
        assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers


def test_the_coordinator_cli_takes_the_allowed_origins() -> None:
    base = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "t"]
    config, _ = coordinator_cli.parse_config([*base, "--http-allowed-origins", f"{ORIGIN}, https://app.example"])
    assert config.http_allowed_origins == (ORIGIN, "https://app.example")
    assert coordinator_cli.parse_config(base)[0].http_allowed_origins == ()
