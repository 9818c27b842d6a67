"""The OpenAI API's per-route HTTP metrics (`http_requests_total{handler,method,status}`,
`http_request_duration_seconds`, as vLLM has them): every response is counted, the refusals answered before
a request is counted in `calispec_requests_total` (schema 400s, 401, 404, 405, 413, 429, CORS preflights)
included, by route template, never by raw path, and a stream once, when its last byte is out.

No model is loaded: a scripted orchestrator stands in, its generations held between their two chunks until
the test lets them go. Samples are read once the server has stopped, so after every response's bookkeeping
(uvicorn's shutdown waits for its requests' tasks)."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import openai
import pytest

from calispec.types import FinishReason, GenerationStats
from calispec_core.access import Quota, QuotaBook
from calispec_core.errors import CalispecError, Unavailable
from calispec_core.generation import Defaults
from calispec_core.metrics import new_registry
from coordinator.engine import Chunk, Orchestrator
from coordinator.metrics import HTTP_METHODS, OTHER_METHOD, CoordinatorMetrics
from coordinator.openai_api import ApiSettings, create_app, start_http_server
from tests.helpers import one_api_key

MODEL = "tiny-chat"
LIMIT = 4096
COMPLETIONS = "/v1/completions"
MODEL_CARD = "/v1/models/{model_id:path}"
ORIGIN = "http://localhost:3000"


class ScriptedOrchestrator:
    """What the HTTP API touches of an orchestrator. Each generation yields one chunk, waits for `release`
    (set from the start unless `held`), then ends; `fail`: the error generations raise instead."""

    context_length = 1023

    def __init__(self, held: bool = False, fail: Exception | None = None) -> None:
        self.replicas = [SimpleNamespace(address="target-0:1")]
        self.release = threading.Event()
        self.fail = fail
        if not held:
            self.release.set()

    def generate(self, prompt: str, params: object, *args: object) -> Iterator[Chunk]:
        if self.fail is not None:
            raise self.fail
        yield Chunk([1], "a", "req")
        if not self.release.wait(timeout=30):
            raise AssertionError("the test never released the generation")
        yield Chunk([2], "b", "req", FinishReason.LENGTH, GenerationStats(prompt_tokens=3))


@dataclass
class Served:
    url: str
    port: int
    key: str | None
    metrics: CoordinatorMetrics

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}

    def count(self, handler: str, method: str, status: int) -> float:
        labels = {"handler": handler, "method": method, "status": str(status)}
        return self.metrics.registry.get_sample_value("http_requests_total", labels) or 0.0

    def series(self, name: str) -> set[tuple[tuple[str, str], ...]]:
        """The label sets of `name`'s samples."""
        return {
            tuple(sorted(s.labels.items()))
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == name
        }


@contextmanager
def served(
    tmp_path: Path | None = None,
    orchestrator: ScriptedOrchestrator | None = None,
    quotas: QuotaBook | None = None,
    allowed_origins: tuple[str, ...] = (),
) -> Iterator[Served]:
    """The HTTP API on a free port, with a registry of its own; with one API key when given a directory."""
    key, keys = one_api_key(tmp_path)
    metrics = CoordinatorMetrics(new_registry())
    settings = ApiSettings(
        MODEL, Defaults(), 60, keys, quotas, metrics, max_body_bytes=LIMIT, allowed_origins=allowed_origins
    )
    app = create_app(cast(Orchestrator, orchestrator or ScriptedOrchestrator()), settings)
    server = start_http_server(app, "127.0.0.1", 0)
    try:
        yield Served(f"http://127.0.0.1:{server.port}", server.port, key, metrics)
    finally:
        server.stop()


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}


def raw_request(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    """One request sent as written (any method token; headers only, whatever Content-Length says)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_every_status_is_counted_under_its_route_template(tmp_path: Path) -> None:
    """Schema 400s, 401, 404, 405 and 413 are answered before the counted part of a request starts:
    `calispec_requests_total` never sees them, and nothing else did."""
    with served(tmp_path) as api:

        def post(body: dict[str, Any]) -> httpx.Response:
            return httpx.post(f"{api.url}{COMPLETIONS}", json=body, headers=api.auth, timeout=30)

        answers = {
            "ok": post(completion()).status_code,
            "models": httpx.get(f"{api.url}/v1/models", headers=api.auth).status_code,
            "health": httpx.get(f"{api.url}/health").status_code,
            "schema": post(completion(max_tokens=-1)).status_code,
            "stops": post(completion(stop=["x"] * 17)).status_code,
            "no key": httpx.get(f"{api.url}/v1/models").status_code,
            "unknown model": httpx.get(f"{api.url}/v1/models/gpt-9", headers=api.auth).status_code,
            "unknown model posted": post(completion(model="gpt-9")).status_code,
            "unknown path": httpx.get(f"{api.url}/v1/engines", headers=api.auth).status_code,
            "wrong method": httpx.get(f"{api.url}{COMPLETIONS}", headers=api.auth).status_code,
            "too large": raw_request(api.port, "POST", COMPLETIONS, {**api.auth, "content-length": str(LIMIT + 1)}),
        }
    assert answers == {
        "ok": 200, "models": 200, "health": 200, "schema": 400, "stops": 400, "no key": 401, "unknown model": 404,
        "unknown model posted": 404, "unknown path": 404, "wrong method": 405, "too large": 413,
    }  # fmt: skip
    assert api.count(COMPLETIONS, "POST", 200) == 1
    assert api.count("/v1/models", "GET", 200) == 1
    assert api.count("/health", "GET", 200) == 1
    assert api.count(COMPLETIONS, "POST", 400) == 2
    assert api.count("/v1/models", "GET", 401) == 1
    assert api.count(MODEL_CARD, "GET", 404) == 1
    assert api.count(COMPLETIONS, "POST", 404) == 1
    assert api.count("none", "GET", 404) == 1  # the unknown path's bucket, never the path itself
    assert api.count(COMPLETIONS, "GET", 405) == 1
    assert api.count(COMPLETIONS, "POST", 413) == 1
    assert sum(v for _, v in _samples(api, "http_requests_total")) == len(answers)
    assert sum(v for _, v in _samples(api, "http_request_duration_seconds_count")) == len(answers)
    # of these only the generation that ran is a request in calispec_requests_total
    assert [v for _, v in _samples(api, "calispec_requests_total")] == [1]


def test_a_path_redirected_for_its_trailing_slash_is_counted_under_none() -> None:
    """FastAPI redirects `/v1/completions/` to `/v1/completions` (307), and the instrumentator labelled that answer
    with the raw path: one series per route's slashed twin, against the docs' "never the raw path"."""
    with served() as api:
        for path in (COMPLETIONS, "/v1/chat/completions", "/health", "/tokenize"):
            assert httpx.get(f"{api.url}{path}/", headers=api.auth).status_code == 307
    assert api.count("none", "GET", 307) == 4
    assert {dict(labels)["handler"] for labels in api.series("http_requests_total")} == {"none"}


def test_the_slashed_twins_of_health_and_the_model_list_are_redirected_too(tmp_path: Path) -> None:
    """`/health/` was a 401 (the key was asked before the redirect, where `/health` needs none) and `/v1/models/` a
    404 naming the model '' (the model route took it with an empty id); found by probing."""
    with served(tmp_path) as api:
        health = httpx.get(f"{api.url}/health/")  # no key
        models = httpx.get(f"{api.url}/v1/models/?x=1", headers=api.auth)
        followed = httpx.get(f"{api.url}/v1/models/", headers=api.auth, follow_redirects=True)
    assert (health.status_code, health.headers["location"]) == (307, f"{api.url}/health")
    assert (models.status_code, models.headers["location"]) == (307, f"{api.url}/v1/models?x=1")
    assert followed.status_code == 200 and followed.json()["data"][0]["id"] == MODEL
    assert api.count("none", "GET", 307) == 1 and api.count(MODEL_CARD, "GET", 307) == 2  # under its route


def _samples(api: Served, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in api.metrics.registry.collect() for s in f.samples if s.name == name]


def test_quota_refusals_and_cors_preflights_are_counted(tmp_path: Path) -> None:
    quotas = QuotaBook(Quota(requests_per_minute=1, burst=1))  # one request, then 429 for a minute
    with served(tmp_path, quotas=quotas, allowed_origins=(ORIGIN,)) as api:
        first = httpx.post(f"{api.url}{COMPLETIONS}", json=completion(), headers=api.auth, timeout=30)
        second = httpx.post(f"{api.url}{COMPLETIONS}", json=completion(), headers=api.auth, timeout=30)
        preflight = httpx.options(
            f"{api.url}{COMPLETIONS}", headers={"origin": ORIGIN, "access-control-request-method": "POST"}
        )
    assert (first.status_code, second.status_code, preflight.status_code) == (200, 429, 200)
    assert api.count(COMPLETIONS, "POST", 200) == 1
    assert api.count(COMPLETIONS, "POST", 429) == 1
    assert api.count(COMPLETIONS, "OPTIONS", 200) == 1  # answered by CORS, without a key


def test_the_api_port_serves_the_coordinators_metrics_behind_its_keys(tmp_path: Path) -> None:
    """vLLM serves /metrics on its API port, where scrape configs written for it look: the same registry as the
    coordinator's --metrics-port, in the format the scraper asks for, behind the API keys when there are some."""
    with served(tmp_path) as api:
        assert httpx.post(f"{api.url}{COMPLETIONS}", json=completion(), headers=api.auth).status_code == 200
        refused = httpx.get(f"{api.url}/metrics")
        text = httpx.get(f"{api.url}/metrics", headers=api.auth)
        openmetrics = httpx.get(f"{api.url}/metrics", headers={**api.auth, "accept": "application/openmetrics-text"})
    assert refused.status_code == 401
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    counted = 'http_requests_total{handler="/v1/completions",method="POST",status="200"} 1.0'
    assert counted in text.text and "calispec_http_generation_slots_free" in text.text
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    assert "/metrics" not in {labels["handler"] for labels, _ in _samples(api, "http_requests_total")}  # not requests


def test_a_stream_is_counted_once_when_its_last_byte_is_out() -> None:
    """The generation is held after its first chunk: the response has started (200, one event out) but
    is not over, so it must not be counted yet; once released it is counted once, with its status."""
    orchestrator = ScriptedOrchestrator(held=True)
    with served(orchestrator=orchestrator) as api:
        body = completion(stream=True)
        with httpx.stream("POST", f"{api.url}{COMPLETIONS}", json=body, timeout=30) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line)
            counted_mid_stream = api.count(COMPLETIONS, "POST", 200)
            timed_mid_stream = _samples(api, "http_request_duration_seconds_count")
            orchestrator.release.set()
            rest = [line for line in lines if line]
    assert response.status_code == 200 and first.startswith("data: ") and rest[-1] == "data: [DONE]"
    assert counted_mid_stream == 0 and timed_mid_stream == []
    assert api.count(COMPLETIONS, "POST", 200) == 1
    assert _samples(api, "http_request_duration_seconds_count") == [({"handler": COMPLETIONS, "method": "POST"}, 1)]


def test_a_bug_is_counted_500() -> None:
    """An unhandled error is answered by Starlette's outermost error middleware, outside the instrumentation:
    the instrumentation counts it 500 all the same."""
    with served(orchestrator=ScriptedOrchestrator(fail=RuntimeError("a bug"))) as api:
        response = httpx.post(f"{api.url}{COMPLETIONS}", json=completion(), timeout=30)
    assert response.status_code == 500
    assert api.count(COMPLETIONS, "POST", 500) == 1


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), CalispecError("a second device failed")])
def test_openai_clients_do_not_retry_a_500(failure: Exception) -> None:
    """The OpenAI SDK retries every 5xx twice by default: a bug (or a request ended INTERNAL) would run three
    times. `x-should-retry: false` on a 500 stops it; a 503 stays retryable."""
    with served(orchestrator=ScriptedOrchestrator(fail=failure)) as api:
        client = openai.OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=2, timeout=30)
        with pytest.raises(openai.InternalServerError) as raised:
            client.completions.create(**completion())
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert api.count(COMPLETIONS, "POST", 500) == 1


def test_a_503_says_nothing_against_a_retry() -> None:
    with served(orchestrator=ScriptedOrchestrator(fail=Unavailable("no target replica"))) as api:
        response = httpx.post(f"{api.url}{COMPLETIONS}", json=completion(), timeout=30)
    assert response.status_code == 503 and "x-should-retry" not in response.headers


def test_series_stay_bounded_whatever_paths_ids_and_methods_clients_send() -> None:
    """One series per raw path, model id or method token would let any client grow the scrape without
    bound: unknown paths share `none`, ids their route's template, unknown method tokens `other`."""
    with served() as api:
        for i in range(40):
            assert httpx.get(f"{api.url}/v1/models/model-{i}").status_code == 404
            assert httpx.get(f"{api.url}/no/such/path/{i}").status_code == 404
            assert httpx.post(f"{api.url}/v1/{i}/completions", json={}).status_code == 404
        # uvicorn's h11 parser takes any method token; the app refuses them (405, or 404 with no route)
        statuses = {raw_request(api.port, f"BREW{i}", "/v1/models") for i in range(20)}
        statuses |= {raw_request(api.port, f"BREW{i}", "/nowhere") for i in range(20)}
    series = api.series("http_requests_total")
    assert series <= {
        (("handler", MODEL_CARD), ("method", "GET"), ("status", "404")),
        (("handler", "none"), ("method", "GET"), ("status", "404")),
        (("handler", "none"), ("method", "POST"), ("status", "404")),
        (("handler", "/v1/models"), ("method", OTHER_METHOD), ("status", "405")),
        (("handler", "none"), ("method", OTHER_METHOD), ("status", "404")),
    }, series
    assert len(series) >= 3  # the three GET/POST buckets at least (the method tokens: only where h11 parses)
    assert all(dict(labels)["method"] in HTTP_METHODS | {OTHER_METHOD} for labels in series)
    assert statuses <= {400, 404, 405}  # 400: a parser that refuses unknown methods itself (not counted)
    routes_and_methods = {(dict(labels)["handler"], dict(labels)["method"]) for labels in series}
    assert len(api.series("http_request_duration_seconds_count")) == len(routes_and_methods)
