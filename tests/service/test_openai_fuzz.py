"""The OpenAI HTTP API fed random bodies (hypothesis): every answer is a success of the shape asked for or a
4xx in OpenAI's error shape, never a 500; the fields a body mixes are drawn from valid and invalid values alike.
The default run is bounded and reproducible; `-m slow` runs the bigger profile."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.openai_protocol import ChatCompletionRequest, CompletionRequest
from tests.service.conftest import Coordinator
from tests.service.test_openai_api import MESSAGES, MODEL, PROMPT, serve

DEFAULT_EXAMPLES = 20
SLOW_EXAMPLES = 120
ANY_JSON = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))


COMMON = {  # valid values; a body may then have one field spoiled (`_bodies`)
    "max_tokens": st.integers(1, 3),
    "temperature": st.sampled_from([0, 0.5, 2.0]),
    "top_p": st.floats(0, 1),
    "n": st.integers(1, 4),
    "seed": st.integers(0, 2**63 - 4),
    "stop": st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=3)),
    "stream": st.booleans(),
    "mode": st.sampled_from(["ar", "sd", "csd", "ocm_only", "scg_only"]),
    "gamma": st.integers(1, 16),
    "ignore_eos": st.booleans(),
    "return_token_ids": st.booleans(),
    "stop_token_ids": st.lists(st.integers(0, 420), max_size=3),
}
TOKEN_IDS = st.lists(st.integers(0, 420), min_size=1, max_size=6)  # the tiny tokenizer has 384 ids: some past them
PROMPTS = st.one_of(
    st.just(PROMPT),
    st.lists(st.sampled_from([PROMPT, "x = 1"]), min_size=1, max_size=3),
    TOKEN_IDS,
    st.lists(TOKEN_IDS, min_size=1, max_size=3),
)
COMPLETION = ({"prompt": PROMPTS}, {**COMMON, "logprobs": st.integers(0, 20), "echo": st.booleans()})
CHAT = ({"messages": st.just(MESSAGES)}, {**COMMON, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20)})
ITEMS = [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]
RESPONSES = (  # OpenAI's Responses API (wave 61): its own fields, chat's extensions passed through
    {"input": st.sampled_from([PROMPT, MESSAGES, ITEMS])},
    {
        "instructions": st.text(max_size=8),
        "max_output_tokens": st.integers(1, 3),
        **{key: COMMON[key] for key in ("temperature", "top_p", "seed", "stream", "mode", "gamma", "stop")},
        "include": st.just(["message.output_text.logprobs"]),
        "top_logprobs": st.integers(0, 20),
        "text": st.sampled_from([{"format": {"type": "text"}}, {"format": {"type": "json_object"}}]),
        "metadata": st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        "store": st.booleans(),
        "truncation": st.just("disabled"),
    },
)
RESPONSE = pydantic.TypeAdapter(openai.types.responses.Response)
RESPONSE_EVENT = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)


@st.composite
def _bodies(draw: st.DrawFn, fields: tuple[dict[str, st.SearchStrategy], dict[str, st.SearchStrategy]]) -> dict:
    """A valid body, or (half the time) one with one field replaced by anything JSON holds."""
    required, optional = fields
    body = draw(st.fixed_dictionaries(required, optional=optional))
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted({**required, **optional})))] = draw(ANY_JSON)
    return {"model": MODEL, **body}


@pytest.fixture(scope="module")
def base_url(chat_coordinator: Coordinator) -> Iterator[str]:
    server, url = serve(chat_coordinator)
    yield url
    server.stop()  # type: ignore[attr-defined]


def _answers(base_url: str, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The status and the JSON payloads: one for a plain answer, every `data:` event of a stream."""
    with httpx.stream("POST", f"{base_url}{path}", content=json.dumps(body), timeout=60,
                      headers={"content-type": "application/json"}) as response:  # fmt: skip
        text = response.read().decode()
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            return response.status_code, [json.loads(text)]
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]", "a stream ends with [DONE]"
    return response.status_code, [json.loads(e) for e in events[:-1]]


def _check(base_url: str, path: str, body: dict[str, Any]) -> None:
    status, payloads = _answers(base_url, path, body)
    assert status in (200, 400), f"{path} answered {status}: {payloads}"
    if status == 400:
        error = payloads[0]["error"]
        assert error["type"] == "invalid_request_error" and error["code"] in ("invalid_argument", "failed_precondition")
        return
    errors = [p["error"] for p in payloads if "error" in p]
    assert not errors, f"a stream that started failed: {errors}"
    request = (CompletionRequest if path == "/completions" else ChatCompletionRequest).model_validate(body)
    choices = [c for p in payloads for c in p.get("choices", [])]
    assert {c["index"] for c in choices} == set(range(request.choice_count())), "every choice, under its index"
    asked = request.requested_logprobs() is not None
    ends = [c for c in choices if c.get("finish_reason") or not request.stream]
    assert all((c.get("logprobs") is not None) == asked for c in ends), "log-probabilities exactly when asked for"


def _check_response(base_url: str, body: dict[str, Any]) -> None:
    """A Response the SDK's types read, or its stream's events ending with the whole Response; or a 400."""
    with httpx.stream("POST", f"{base_url}/responses", content=json.dumps(body), timeout=60,
                      headers={"content-type": "application/json"}) as response:  # fmt: skip
        text, status = response.read().decode(), response.status_code
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    assert status in (200, 400), f"/responses answered {status}: {text}"
    if status == 400:
        assert json.loads(text)["error"]["code"] in ("invalid_argument", "failed_precondition"), text
        return
    if not streamed:
        assert RESPONSE.validate_json(text).status in ("completed", "incomplete")
        return
    blocks = [block for block in text.strip().split("\n\n") if block != ": keep-alive"]  # a chunk without text
    events = [RESPONSE_EVENT.validate_json(block.split("\ndata: ", 1)[1]) for block in blocks]
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    assert not [e for e in events if e.type == "error"]


def _fuzz(examples: int) -> Callable:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=examples <= DEFAULT_EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def run(base_url: str, path: str, data: st.DataObject) -> None:
        fields = {"/completions": COMPLETION, "/chat/completions": CHAT, "/responses": RESPONSES}[path]
        body = data.draw(_bodies(fields), label="body")
        if path == "/responses":
            _check_response(base_url, body)
        else:
            _check(base_url, path, body)

    return run


_fuzz_default = _fuzz(DEFAULT_EXAMPLES)
_fuzz_slow = _fuzz(SLOW_EXAMPLES)


@pytest.mark.parametrize("path", ["/completions", "/chat/completions", "/responses"])
def test_random_bodies_get_a_success_of_their_shape_or_a_400(base_url: str, path: str) -> None:
    _fuzz_default(base_url, path)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/completions", "/chat/completions", "/responses"])
def test_random_bodies_bigger_profile(base_url: str, path: str) -> None:
    _fuzz_slow(base_url, path)
