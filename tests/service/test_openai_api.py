"""The OpenAI-compatible HTTP API, driven by the official `openai` client against the tiny pair."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import httpx
import openai
import pytest

import calispec
from calispec.client import CalispecClient, CalispecRpcError
from calispec_core.access import ApiKeys, Quota, QuotaBook, key_line, new_api_key
from calispec_core.errors import Unavailable
from calispec_core.generation import Defaults
from calispec_core.limits import MAX_LAMBDA
from calispec_core.metrics import new_registry
from coordinator import openai_protocol
from coordinator.chat import ChatTurn, render_chat
from coordinator.metrics import CoordinatorMetrics
from coordinator.openai_api import ApiSettings, create_app, domain_error_response, start_http_server
from tests.helpers import wait_until
from tests.service.conftest import Coordinator

MODEL = "tiny-chat"
PROMPT = "def add(a, b):"
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]
SD = {"mode": "sd", "gamma": 3}


def serve(
    coordinator: Coordinator, keys: ApiKeys | None = None, quotas: QuotaBook | None = None, tools: str | None = None
) -> tuple[object, str]:
    settings = ApiSettings(MODEL, Defaults(), request_timeout_s=60, keys=keys, quotas=quotas, tool_call_parser=tools)
    server = start_http_server(create_app(coordinator.orchestrator, settings), "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.port}/v1"


@pytest.fixture(scope="module")
def base_url(chat_coordinator: Coordinator) -> Iterator[str]:
    server, url = serve(chat_coordinator)
    yield url
    server.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def oai(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def grpc_client(chat_coordinator: Coordinator) -> Iterator[CalispecClient]:
    with CalispecClient(chat_coordinator.address, timeout=60) as c:
        yield c


def test_models_lists_the_served_model(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list().data] == [MODEL]


def test_model_card_advertises_the_context_length_as_vllm_does(oai: openai.OpenAI) -> None:
    # the tiny pair's 1,024 positions less the spare one: the limit the context 400 quotes
    assert oai.models.retrieve(MODEL).model_extra == {"max_model_len": 1023}
    assert [m.model_extra for m in oai.models.list().data] == [{"max_model_len": 1023}]


def test_completion_matches_grpc_with_usage(oai: openai.OpenAI, grpc_client: CalispecClient) -> None:
    expected = grpc_client.generate(PROMPT, max_new_tokens=12, mode="sd", num_speculative_tokens=3)
    done = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=SD)
    assert done.choices[0].text == expected.text
    assert done.choices[0].finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert done.usage is not None
    assert done.usage.prompt_tokens == expected.stats.prompt_tokens
    assert done.usage.completion_tokens == len(expected.token_ids)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


def test_streamed_completion_equals_unary(oai: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "extra_body": SD}
    unary = oai.completions.create(**kwargs)
    events = list(oai.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text_events = [e for e in events if e.choices]
    assert "".join(e.choices[0].text for e in text_events) == unary.choices[0].text
    assert text_events[-1].choices[0].finish_reason == unary.choices[0].finish_reason
    assert all(e.choices[0].finish_reason is None for e in text_events[:-1])
    assert events[-1].usage == unary.usage and not events[-1].choices


def test_every_chunk_of_a_stream_has_the_responses_created(oai: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk took the time it was built: one 300-token stream showed 5 values (found by probing); OpenAI and
    vLLM give a response's chunks one `created`, which clients group by."""
    ticks = iter(range(1_800_000_000, 1_900_000_000))
    monkeypatch.setattr(openai_protocol.time, "time", lambda: next(ticks))
    kwargs = {"model": MODEL, "max_tokens": 6, "temperature": 0, "stream": True, "extra_body": {"mode": "ar"}}
    chunks = list(oai.completions.create(prompt=PROMPT, **kwargs))
    chat = list(oai.chat.completions.create(messages=MESSAGES, stream_options={"include_usage": True}, **kwargs))
    assert len(chunks) > 1 and len({c.created for c in chunks}) == 1
    assert len(chat) > 2 and len({c.created for c in chat}) == 1


def test_chat_matches_grpc_chat_streaming_and_not(oai: openai.OpenAI, grpc_client: CalispecClient) -> None:
    expected = grpc_client.chat(MESSAGES, max_new_tokens=10, mode="ar")
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "extra_body": {"mode": "ar"}}
    done = oai.chat.completions.create(**kwargs)
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == expected.text
    assert done.usage is not None and done.usage.completion_tokens == len(expected.token_ids)
    chunks = list(oai.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("mode", ["ar", "sd", "csd"])
def test_a_response_is_the_chat_completion_it_asks_for(oai: openai.OpenAI, mode: str) -> None:
    """The Responses API (wave 61) on the tiny pair: chat's reply, tokens and log-probabilities, streamed or not."""
    extra = {"mode": mode, "gamma": 3}
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, *MESSAGES], max_tokens=10, temperature=0,
        logprobs=True, top_logprobs=2, extra_body=extra,
    )  # fmt: skip
    asked = {"model": MODEL, "instructions": "Be brief.", "input": PROMPT, "max_output_tokens": 10, "temperature": 0}
    logprobs = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    done = oai.responses.create(**asked, **logprobs, extra_body=extra)  # type: ignore[call-overload]
    choice = chat.choices[0]
    assert done.output_text == choice.message.content and done.usage is not None and chat.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (
        chat.usage.prompt_tokens,
        chat.usage.completion_tokens,
    )
    assert done.status == ("incomplete" if choice.finish_reason == "length" else "completed")
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = done.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert [e.token for e in entries] == [e.token for e in choice.logprobs.content]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in choice.logprobs.content], abs=1e-5)
    streamed = list(oai.responses.create(**asked, stream=True, extra_body=extra))  # type: ignore[call-overload]
    deltas = [e.delta for e in streamed if e.type == "response.output_text.delta"]
    assert "".join(deltas) == done.output_text and len(deltas) > 1  # chunk by chunk
    last = streamed[-1]
    assert last.type == f"response.{done.status}" and last.response.output_text == done.output_text


SAMPLED = {"max_tokens": 10, "temperature": 5.0, "extra_body": {"mode": "ar"}}  # hot: the tiny pair is peaked


def test_n_choices_are_the_requests_with_seed_plus_i(oai: openai.OpenAI) -> None:
    """vLLM's rule: with a seed, choice i samples as a request of its own with seed + i would."""
    many = oai.completions.create(model=MODEL, prompt=PROMPT, n=3, seed=11, **SAMPLED)
    singles = [oai.completions.create(model=MODEL, prompt=PROMPT, seed=11 + i, **SAMPLED) for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.text for c in many.choices] == [s.choices[0].text for s in singles]
    assert len({c.text for c in many.choices}) == 3  # three samples, not one repeated
    assert many.usage is not None and singles[0].usage is not None
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt once
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles if s.usage)


def test_a_batch_of_prompts_answers_each_as_a_request_of_its_own(oai: openai.OpenAI) -> None:
    prompts = [PROMPT, "class Stack:"]
    batch = oai.completions.create(model=MODEL, prompt=prompts, n=2, seed=5, **SAMPLED)
    expected = [oai.completions.create(model=MODEL, prompt=p, seed=5 + j, **SAMPLED) for p in prompts for j in (0, 1)]
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]  # choice k: prompt k // n, its choice k % n
    assert [c.text for c in batch.choices] == [e.choices[0].text for e in expected]
    usage = [e.usage for e in expected]
    assert batch.usage is not None and all(usage)
    assert batch.usage.prompt_tokens == usage[0].prompt_tokens + usage[2].prompt_tokens  # type: ignore[union-attr]
    assert batch.usage.completion_tokens == sum(u.completion_tokens for u in usage)  # type: ignore[union-attr]


def test_greedy_speculative_choices_are_each_the_greedy_answer(oai: openai.OpenAI) -> None:
    """n rows of one request verify in one batch: each still equals target-only greedy decoding (float32). `csd`
    with a λ no count reaches: the module's other requests grow the memory, so that it rescued when they ran first."""
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    alone = oai.chat.completions.create(**kwargs, extra_body={"mode": "ar"}).choices[0].message.content
    for mode, more in (("sd", {}), ("csd", {"lambda": MAX_LAMBDA})):
        done = oai.chat.completions.create(**kwargs, n=3, extra_body={"mode": mode, "gamma": 3, **more})
        assert [c.message.content for c in done.choices] == [alone] * 3
        assert [c.index for c in done.choices] == [0, 1, 2]


def test_streamed_choices_each_equal_their_unary_choice(oai: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": MESSAGES, "n": 2, "seed": 3, **SAMPLED}
    unary = oai.chat.completions.create(**kwargs)
    events = list(oai.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert [e.choices[0].index for e in events[:2]] == [0, 1]  # each choice's role first, as vLLM's
    assert all(e.choices[0].delta.role == "assistant" for e in events[:2])
    texts, finishes = {0: "", 1: ""}, {}
    for event in events[:-1]:
        (choice,) = event.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            assert choice.index not in finishes  # one end per choice
            finishes[choice.index] = choice.finish_reason
    assert [texts[0], texts[1]] == [c.message.content for c in unary.choices]
    assert finishes == {c.index: c.finish_reason for c in unary.choices}
    assert events[-1].usage == unary.usage and not events[-1].choices  # after both ends


def test_a_request_of_n_choices_takes_n_quota_slots(chat_coordinator: Coordinator) -> None:
    server, url = serve(chat_coordinator, quotas=QuotaBook(Quota(max_concurrent=2)))
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as never:  # a 429: clients retried what no wait admits
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, n=3)
        error = never.value.response.json()["error"]
        assert error["param"] == "n" and error["message"].startswith("n: counts as 3 requests (one per choice)")
        assert "retry-after" not in never.value.response.headers
        done = client.completions.create(model=MODEL, prompt=[PROMPT, "x ="], max_tokens=2, temperature=0)
        assert len(done.choices) == 2  # two slots, given back: the next one fits again
        assert len(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=2).choices) == 2
    finally:
        server.stop()  # type: ignore[attr-defined]


def test_ignore_eos_goes_on_past_eos_to_the_token_limit(oai: openai.OpenAI, grpc_client: CalispecClient) -> None:
    """vLLM's `ignore_eos` (load tests ask for outputs of a fixed length): the EOS is kept and decoding goes on, on
    both APIs; greedy `sd` still equals `ar` token for token past it."""
    ended = grpc_client.generate(PROMPT, max_new_tokens=40, mode="ar")
    assert ended.finish_reason == "eos" and len(ended.token_ids) < 40  # the tiny pair ends this one by itself
    longer = {
        mode: grpc_client.generate(PROMPT, max_new_tokens=40, mode=mode, num_speculative_tokens=3, ignore_eos=True)
        for mode in ("ar", "sd", "csd")
    }
    for result in longer.values():
        assert result.finish_reason == "length" and len(result.token_ids) == 40
    assert longer["ar"].token_ids[: len(ended.token_ids)] == ended.token_ids  # its EOS among them
    assert longer["sd"].token_ids == longer["ar"].token_ids
    extra = {"mode": "sd", "gamma": 3, "ignore_eos": True, "return_token_ids": True}
    http = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, extra_body=extra)
    choice = http.choices[0]
    assert choice.finish_reason == "length" and (choice.model_extra or {})["token_ids"] == longer["ar"].token_ids


def test_logprobs_are_the_targets_on_both_apis_and_alike_for_every_mode(
    oai: openai.OpenAI, grpc_client: CalispecClient
) -> None:
    """Greedy `sd` and `csd` emit `ar`'s tokens here, so their log-probabilities (the target's, at the same
    positions, from verify forwards of other widths) agree with `ar`'s; the HTTP forms carry the same numbers."""
    results = {m: grpc_client.generate(PROMPT, max_new_tokens=10, mode=m, num_speculative_tokens=3, logprobs=2,
                                       ignore_eos=True)  # the tiny pair ends at 7 tokens: 10 with its EOS inside
               for m in ("ar", "sd")}  # fmt: skip
    ar = results["ar"]
    assert ar.logprobs is not None and len(ar.logprobs) == len(ar.token_ids) == 10
    assert grpc_client.generate(PROMPT, max_new_tokens=4, mode="ar").logprobs is None  # not asked: none
    assert results["sd"].token_ids == ar.token_ids
    for a, s, token in zip(ar.logprobs, results["sd"].logprobs or [], ar.token_ids, strict=True):
        assert s.logprob == pytest.approx(a.logprob, abs=1e-4)
        assert a.top_token_ids[0] == token and len(a.top_token_ids) == 2  # greedy: the likeliest
        assert a.logprob == pytest.approx(a.top_logprobs[0]) and a.top_logprobs[0] >= a.top_logprobs[1]
    kwargs = {"model": MODEL, "max_tokens": 10, "temperature": 0, "extra_body": {"mode": "ar", "ignore_eos": True}}
    legacy = oai.completions.create(prompt=PROMPT, logprobs=2, **kwargs).choices[0].logprobs
    assert legacy is not None and legacy.token_logprobs == pytest.approx([lp.logprob for lp in ar.logprobs])
    assert legacy.text_offset == [sum(map(len, legacy.tokens[:i])) for i in range(10)]
    assert legacy.top_logprobs is not None and all(len(top) >= 2 for top in legacy.top_logprobs)
    chat = oai.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=3, **kwargs)
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.token == entry.top_logprobs[0].token and len(entry.top_logprobs) == 3
        assert entry.bytes == list(entry.token.encode())
    streamed = oai.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=3, stream=True, **kwargs)
    pieces = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    # the same tokens; the figures to float32 rounding: run alone, the first of the two requests prefills the
    # prompt and the second finds it in the prefix cache (a forward of another shape; the test failed alone)
    assert [e.token for e in pieces] == [e.token for e in content]
    assert [e.logprob for e in pieces] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = oai.chat.completions.create(messages=MESSAGES, **kwargs)
    assert plain.choices[0].logprobs is None
    grpc_chat = grpc_client.chat(MESSAGES, max_new_tokens=10, mode="ar", logprobs=3, ignore_eos=True)
    assert [e.logprob for e in content] == pytest.approx([lp.logprob for lp in grpc_chat.logprobs or []], abs=1e-5)


def test_choices_verified_in_one_batch_report_the_logprobs_of_one_alone(oai: openai.OpenAI) -> None:
    """n choices share verify rounds (rows of a padded batch): each row's log-probabilities are its own."""
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 2}
    alone = oai.completions.create(**kwargs, extra_body={"mode": "ar", "ignore_eos": True}).choices[0].logprobs
    batch = oai.completions.create(**kwargs, n=3, extra_body={"mode": "sd", "gamma": 3, "ignore_eos": True})
    assert alone is not None and len(batch.choices) == 3
    for choice in batch.choices:
        assert choice.logprobs is not None and choice.logprobs.tokens == alone.tokens
        assert choice.logprobs.token_logprobs == pytest.approx(alone.token_logprobs, abs=1e-4)


def test_sse_framing_ends_with_done(base_url: str) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = "".join(response.iter_text())
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


@pytest.mark.parametrize(
    ("call", "status", "param"),
    [
        (lambda c: c.completions.create(model="gpt-9", prompt="hi"), 404, "model"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", max_tokens=-1), 400, "max_tokens"),
        # checked in the generation, it named no param (wave 50: checked with the schema, as /tokenize checks it)
        (lambda c: c.completions.create(model=MODEL, prompt="", max_tokens=4), 400, "prompt"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", extra_body={"mode": "fast"}), 400, "mode"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", extra_body={"tau": 5.0}), 400, "tau"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", extra_body={"lambda": 2**40}), 400, "lambda"),
        (
            lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}]),
            400,
            "messages[0].role",
        ),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", stream=True, max_tokens=0), 400, "max_tokens"),
        # range errors named the domain's fields (max_new_tokens, num_speculative_tokens), with no param
        (lambda c: c.completions.create(model=MODEL, prompt="hi", extra_body={"gamma": 99}), 400, "gamma"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", temperature=500), 400, "temperature"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", top_p=2), 400, "top_p"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", seed=-1), 400, "seed"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", stop=["x"] * 17), 400, "stop"),
        (lambda c: c.completions.create(model=MODEL, prompt="hi", max_tokens=8193), 400, "max_tokens"),
        (
            lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=9000),
            400,
            "max_completion_tokens",
        ),
    ],
)
def test_errors_have_openais_shape_and_status(oai: openai.OpenAI, call, status: int, param: str | None) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        call(oai)
    assert info.value.status_code == status
    error = info.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["param"] == param


def _post_raw(base_url: str, path: str, body_json: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}{path}", content=body_json.encode(), headers={"content-type": "application/json"}, timeout=60
    )


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        # JSON may escape a lone surrogate, which no UTF-8 encodes: the tokenizer failed on it (500)
        (
            "/completions",
            '{"model": "%s", "prompt": "abc \\ud800 def", "max_tokens": 4}',
            "prompt is not valid Unicode",
        ),
        (
            "/completions",
            '{"model": "%s", "prompt": "abc \\ud800", "max_tokens": 4, "stream": true}',
            "prompt is not valid Unicode",
        ),
        (
            "/chat/completions",
            '{"model": "%s", "messages": [{"role": "user", "content": "x \\udfff"}], "max_tokens": 4}',
            "messages[0].content is not valid Unicode",
        ),
        # past the wire's integer: packing it into the services' request failed (500)
        ("/completions", '{"model": "%s", "prompt": "hi", "max_tokens": 4, "top_k": 4294967296}', "top_k: must be"),
        ("/completions", '{"model": "%s", "prompt": "hi", "presence_penalty": 2.5}', "must be in [-2, 2], got 2.5"),
        ("/completions", '{"model": "%s", "prompt": "hi", "logit_bias": {"a": 2}}', "keys must be token ids"),
        # past the wire's uint32: packing it into the services' request would fail (500)
        ("/completions", '{"model": "%s", "prompt": "hi", "logit_bias": {"4294967296": 2}}', "in [0, 4294967296)"),
        ("/completions", '{"model": "%s", "prompt": "hi",', "not valid JSON"),
        # valid JSON, past Python's int_max_str_digits: it said "not valid JSON" and to call sys.set_int_max_str_digits
        ("/completions", '{"model": "%s", "prompt": "hi", "seed": 1' + "0" * 5000 + "}", "an integer of more than"),
    ],
)
def test_caller_errors_found_by_probing_are_400s(base_url: str, path: str, body: str, message: str) -> None:
    response = _post_raw(base_url, path, body.replace("%s", MODEL))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == "invalid_argument"


def test_no_op_values_of_unimplemented_fields_are_accepted(oai: openai.OpenAI) -> None:
    reply = oai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, presence_penalty=0, frequency_penalty=0,
        logit_bias={}, best_of=1,
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "length"


def test_a_unary_completion_returns_its_token_ids(oai: openai.OpenAI, base_url: str) -> None:
    """`return_token_ids` was honoured only when streaming."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    unary = httpx.post(f"{base_url}/completions", json=body, timeout=60).json()
    with httpx.stream("POST", f"{base_url}/completions", json={**body, "stream": True}, timeout=60) as response:
        events = [e.removeprefix("data: ") for e in "".join(response.iter_text()).split("\n\n") if e]
    streamed = [i for e in events[:-1] for i in json.loads(e)["choices"][0]["token_ids"] or []]
    assert unary["choices"][0]["token_ids"] == streamed and len(streamed) == 5


def test_a_stop_string_ends_the_tokens_and_usage_where_ar_ends_them(base_url: str) -> None:
    """A round's tokens past the one that completed a stop string were kept in `token_ids` and counted in
    `usage`: greedy `sd` reported up to γ more tokens than `ar` for the same text (found by probing)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "temperature": 0, "return_token_ids": True}
    whole = httpx.post(f"{base_url}/completions", json={**body, "mode": "ar"}, timeout=60).json()["choices"][0]
    text = whole["text"]
    stops = {text[i : i + 2] for i in range(1, min(len(text) - 2, 16), 3) if text[i : i + 2].strip()}
    assert stops, text
    for stop in sorted(stops):
        replies = [
            httpx.post(f"{base_url}/completions", json={**body, **mode, "stop": [stop]}, timeout=60).json()
            for mode in ({"mode": "ar"}, {"mode": "sd", "gamma": 8})
        ]
        ar, sd = ([r["choices"][0]["token_ids"], r["choices"][0]["text"], r["usage"]] for r in replies)
        assert sd == ar, stop
        assert ar[2]["completion_tokens"] == len(ar[0]) < len(whole["token_ids"])


def test_api_keys_and_quotas_are_the_coordinators(chat_coordinator: Coordinator, tmp_path) -> None:
    key = new_api_key()
    (tmp_path / "keys").write_text(key_line("alice", key) + "\n")
    quotas = QuotaBook(Quota(requests_per_minute=1, burst=1))  # one request, then 429 for a minute
    server, url = serve(chat_coordinator, ApiKeys(tmp_path / "keys"), quotas)
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert info.value.response.json()["error"]["type"] == "authentication_error"
        alice = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)
        assert alice.models.list().data[0].id == MODEL
        version = f"{url.removesuffix('/v1')}/version"
        assert httpx.get(version).status_code == 401  # behind the keys, as /v1/models
        answer = httpx.get(version, headers={"authorization": f"Bearer {key}"})
        assert answer.json() == {"version": calispec.__version__}  # vLLM's /version
        assert alice.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0).choices[0].text
        with pytest.raises(openai.RateLimitError) as limited:
            alice.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
        assert limited.value.response.json()["error"]["type"] == "rate_limit_error"
        assert 55 <= int(limited.value.response.headers["retry-after"]) <= 60  # the bucket's refill (none came)
    finally:
        server.stop()  # type: ignore[attr-defined]


def test_unavailable_services_are_503() -> None:
    response = domain_error_response(Unavailable("no target replica is reachable"))
    assert response.status_code == 503 and b"service_unavailable" in response.body


def test_failed_requests_give_their_quota_slot_back(chat_coordinator: Coordinator) -> None:
    server, url = serve(chat_coordinator, quotas=QuotaBook(Quota(max_concurrent=1)))
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        for bad in (
            lambda: client.completions.create(model=MODEL, prompt="", max_tokens=2),
            lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, stream=True),
            lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}]),
        ):
            with pytest.raises(openai.BadRequestError):
                bad()
        streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, stream=True)
        assert "".join(e.choices[0].text for e in streamed if e.choices)
        assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0).choices[0].text
    finally:
        server.stop()  # type: ignore[attr-defined]


def test_http_request_is_counted_timed_and_logged_under_its_request_id(
    chat_coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = CoordinatorMetrics(new_registry())
    settings = ApiSettings(MODEL, Defaults(), request_timeout_s=60, metrics=metrics)
    server = start_http_server(create_app(chat_coordinator.orchestrator, settings), "127.0.0.1", 0)
    ok = {"mode": "sd", "status": "OK"}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **SD}
    try:
        with caplog.at_level(logging.INFO, logger="coordinator.request_log"):
            response = httpx.post(
                f"http://127.0.0.1:{server.port}/v1/completions", json=body, headers={"X-Request-Id": "http-req-7"}
            )
            fresh = httpx.post(f"http://127.0.0.1:{server.port}/v1/completions", json=body)
    finally:
        server.stop()
    assert response.status_code == 200 and response.headers["x-request-id"] == "http-req-7"
    assert fresh.headers["x-request-id"] not in ("", "http-req-7")  # one made for it
    sample = metrics.registry.get_sample_value
    assert sample("calispec_requests_total", ok) == 2
    assert sample("calispec_e2e_request_latency_seconds_count") == 2
    assert sample("calispec_generation_tokens_total") == 2 * response.json()["usage"]["completion_tokens"]
    lines = [r.getMessage() for r in caplog.records if r.name == "coordinator.request_log"]
    assert len(lines) == 2
    assert lines[0].startswith("request id=http-req-7 mode=sd status=OK ")
    assert f"id={fresh.headers['x-request-id']} " in lines[1]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"prompt": PROMPT, "max_tokens": 4, **SD}),
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": 4, **SD}),
    ],
)
def test_a_completed_http_stream_is_counted_ok_under_its_request_id(
    chat_coordinator: Coordinator, caplog: pytest.LogCaptureFixture, path: str, body: dict
) -> None:
    """Every stream that ended normally was counted CANCELLED (its generation left suspended after the last
    chunk, then closed by garbage collection), and logged so, at times under `id=-`."""
    metrics = CoordinatorMetrics(new_registry())
    settings = ApiSettings(MODEL, Defaults(), request_timeout_s=60, metrics=metrics)
    server = start_http_server(create_app(chat_coordinator.orchestrator, settings), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/v1{path}"
    request = {"model": MODEL, "temperature": 0, "stream": True, **body}
    try:
        with (
            caplog.at_level(logging.INFO, logger="coordinator.request_log"),
            httpx.stream("POST", url, json=request, headers={"X-Request-Id": "sse-8"}) as response,
        ):
            raw = "".join(response.iter_text())
    finally:
        server.stop()
    assert response.status_code == 200 and raw.endswith("data: [DONE]\n\n")
    sample = metrics.registry.get_sample_value
    assert sample("calispec_requests_total", {"mode": "sd", "status": "OK"}) == 1
    assert not sample("calispec_requests_total", {"mode": "sd", "status": "CANCELLED"})
    lines = [r.getMessage() for r in caplog.records if r.name == "coordinator.request_log"]
    assert len(lines) == 1 and lines[0].startswith("request id=sse-8 mode=sd status=OK ")


def _post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json={"model": MODEL, **body}, timeout=60)


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_argument"
    return error


GREEDY_CHAT = {"max_tokens": 6, "temperature": 0, "mode": "ar"}


def test_content_parts_are_joined_as_vllm_joins_them(oai: openai.OpenAI, grpc_client: CalispecClient) -> None:
    """Content as a list of text parts (LangChain's and the `openai` client's typed form) was a 400."""
    parts = [{"type": "text", "text": "def add"}, {"type": "text", "text": "(a, b):"}]
    expected = grpc_client.chat([{"role": "user", "content": "def add\n(a, b):"}], max_new_tokens=6, mode="ar")
    reply = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=6, temperature=0,
        extra_body={"mode": "ar"},
    )  # fmt: skip
    assert reply.choices[0].message.content == expected.text


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_non_text_content_parts_are_refused_by_name(base_url: str, part: dict) -> None:
    content = [{"type": "text", "text": "what is this?"}, part]
    response = _post(base_url, "/chat/completions", {"messages": [{"role": "user", "content": content}]})
    assert f"part 1 has type {part['type']!r}: only text parts are supported" in _error(response)["message"]


def test_developer_messages_are_system_messages(base_url: str) -> None:
    """OpenAI's newer name for the system role was refused."""

    def reply(role: str) -> str:
        messages = [{"role": role, "content": "You count."}, *MESSAGES]
        response = _post(base_url, "/chat/completions", {"messages": messages, **GREEDY_CHAT})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    assert reply("developer") == reply("system")


def test_an_assistant_turn_may_have_null_content_and_a_name(base_url: str) -> None:
    messages = [
        {"role": "user", "content": "hi", "name": "alice"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "def add(a, b):", "name": "alice"},
    ]
    response = _post(base_url, "/chat/completions", {"messages": messages, **GREEDY_CHAT})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            {"messages": [*MESSAGES, {"role": "tool", "tool_call_id": "c1", "content": "4"}]},
            "messages[1].role",
            "'tool' is not supported: tool calls and their results need",
        ),
        ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tool_choice"),
        ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice", "send the tools it may call"),
        (
            {"messages": MESSAGES, "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            "send the tools it may call",
        ),
        ({"messages": MESSAGES, "functions": [{"name": "f"}]}, "functions", "function_call"),
        ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format", "'yaml'"),
        (
            {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "json_schema needs",
        ),
        ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
    ],
)
def test_tool_calls_json_mode_and_stray_stream_options_are_refused(
    base_url: str, body: dict, param: str, fragment: str
) -> None:
    """tools, tool_choice, functions and response_format were silently ignored: a client asking for a tool
    call or JSON got plain text; a tool message was refused with no param; stream_options without streaming
    was ignored (OpenAI refuses it)."""
    error = _error(_post(base_url, "/chat/completions", body))
    assert error["param"] == param and fragment in error["message"]


NOT_SERVED = [
    ("/completions", {"use_beam_search": True}, "use_beam_search", "send false"),
    ("/chat/completions", {"echo": True}, "echo", "send false or leave it out"),
    ("/chat/completions", {"modalities": ["text", "audio"], "audio": {"voice": "x"}}, "modalities", '["text"]'),
    # ignored as unknown fields until wave 54 (found by probing against vLLM's protocol): each changes the output
    ("/completions", {"structural_tag": {"type": "structural_tag"}}, "structural_tag", "leave it out"),
    ("/completions", {"include_stop_str_in_output": True}, "include_stop_str_in_output", "send false"),
    ("/completions", {"skip_special_tokens": False}, "skip_special_tokens", "send true"),
    ("/completions", {"truncate_prompt_tokens": 2}, "truncate_prompt_tokens", "leave it out"),
    ("/completions", {"logits_processors": ["x"]}, "logits_processors", "leave it out"),
    ("/completions", {"prompt_logprobs": 1}, "prompt_logprobs", "leave it out"),
    ("/chat/completions", {"return_tokens_as_token_ids": True}, "return_tokens_as_token_ids", "send false"),
    ("/completions", {"priority": 1}, "priority", "send 0"),
    ("/completions", {"best_of": 2}, "best_of", "send 1 or leave it out"),
    ("/completions", {"suffix": "x"}, "suffix", 'send ""'),
    ("/completions", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options", "false"),
    ("/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template", "leave it out"),
    ("/chat/completions", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "not a template"),
]
NO_OPS = {"echo": False, "modalities": ["text"], "use_beam_search": False,
          "response_format": {"type": "text"}, "include_stop_str_in_output": False, "skip_special_tokens": True,
          "priority": 0, "best_of": 1, "suffix": "", "return_tokens_as_token_ids": False,
          "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "fragment"), NOT_SERVED, ids=[b[2] for b in NOT_SERVED])
def test_fields_that_would_change_the_output_and_are_not_served_are_refused(
    base_url: str, path: str, body: dict, param: str, fragment: str
) -> None:
    """vLLM's structural tags, min_tokens, repetition_penalty, chat echo and audio output were ignored as unknown
    fields: a 200 with unconstrained text (found by probing). Their no-op values are still served. (Its guided decoding
    was refused here too until wave 59: tests/service/test_structured_output.py.)"""
    prompt = {"messages": MESSAGES} if path == "/chat/completions" else {"prompt": PROMPT}
    error = _error(_post(base_url, path, {**prompt, "max_tokens": 2, **body}))
    assert error["param"].startswith(param) and fragment in error["message"]
    if param in NO_OPS:
        assert _post(base_url, path, {**prompt, "max_tokens": 2, param: NO_OPS[param]}).status_code == 200


def test_an_assistant_prefill_is_continued_and_tokenize_counts_what_the_request_reads(base_url: str) -> None:
    """add_generation_prompt and continue_final_message were ignored as unknown fields (a reply after an open
    assistant turn, whatever was asked), while /tokenize honoured add_generation_prompt: its count was not the
    request's usage.prompt_tokens (found by probing)."""
    messages = [*MESSAGES, {"role": "assistant", "content": "    return"}]
    root = base_url.removesuffix("/v1")
    prompt_tokens = {}
    for name, shape in {
        "reply": {},
        "closed": {"add_generation_prompt": False},
        "prefill": {"add_generation_prompt": False, "continue_final_message": True},
    }.items():
        usage = _post(base_url, "/chat/completions", {"messages": messages, **GREEDY_CHAT, **shape}).json()["usage"]
        counted = httpx.post(f"{root}/tokenize", json={"model": MODEL, "messages": messages, **shape}).json()["count"]
        assert usage["prompt_tokens"] == counted, name
        prompt_tokens[name] = counted
    assert prompt_tokens["prefill"] < prompt_tokens["closed"] < prompt_tokens["reply"]  # "\n", then "<|assistant|>"
    both = {"messages": messages, "continue_final_message": True}
    for error in (_error(_post(base_url, "/chat/completions", both)), httpx.post(f"{root}/tokenize", json=both).json()):
        error = error.get("error", error)
        assert error["param"] == "continue_final_message" and "cannot set both" in error["message"]


def test_no_op_tool_and_format_values_are_accepted(base_url: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra in (
        {"tools": tools, "tool_choice": "none"},
        {"tools": [], "tool_choice": "auto"},
        {"functions": [{"name": "f"}], "function_call": "none"},
        {"response_format": {"type": "text"}},
        {"parallel_tool_calls": False},
    ):
        response = _post(base_url, "/chat/completions", {"messages": MESSAGES, **GREEDY_CHAT, **extra})
        assert response.status_code == 200, (extra, response.text)


def test_an_assistant_tool_call_is_refused(base_url: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]}]
    error = _error(_post(base_url, "/chat/completions", {"messages": messages}))
    assert "--tool-call-parser" in error["message"] and error["param"] == "messages[1].tool_calls"


def test_top_p_zero_keeps_only_the_most_likely_token(base_url: str) -> None:
    """OpenAI's top_p 0 reached the sampler as "top-p off": full sampling (here at temperature 50: near uniform)."""
    body = {"prompt": PROMPT, "max_tokens": 12, "mode": "ar"}
    greedy = _post(base_url, "/completions", {**body, "temperature": 0}).json()["choices"][0]["text"]
    for seed in (1, 2, 3):
        sampled = _post(base_url, "/completions", {**body, "temperature": 50, "top_p": 0, "seed": seed})
        assert sampled.json()["choices"][0]["text"] == greedy


def test_an_explicit_null_is_the_field_left_out(base_url: str) -> None:
    """OpenAI's clients may send null for an optional field: it was a 400 for most of them."""
    nulls = dict.fromkeys(
        ("temperature", "top_p", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty", "seed",
         "stop", "top_k", "return_token_ids", "logit_bias", "best_of", "user", "mode", "gamma", "lambda"),
    )  # fmt: skip
    completion = _post(base_url, "/completions", {"prompt": PROMPT, "max_tokens": 3, **nulls, "echo": None})
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["finish_reason"] == "length"
    chat = _post(
        base_url,
        "/chat/completions",
        {"messages": MESSAGES, "max_tokens": None, "max_completion_tokens": 3, "logprobs": None, **nulls},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] <= 3


def test_token_id_prompts_continue_as_their_texts_do(base_url: str, chat_coordinator: Coordinator) -> None:
    """OpenAI's token-id forms (what lm-eval's local-completions sends by default): one list of ids, or a batch."""
    ids = chat_coordinator.orchestrator.tokenizer.encode(PROMPT)
    body = {"max_tokens": 6, "temperature": 0, "mode": "ar"}
    by_text = _post(base_url, "/completions", {"prompt": PROMPT, **body}).json()
    one = _post(base_url, "/completions", {"prompt": ids, **body}).json()
    batch = _post(base_url, "/completions", {"prompt": [ids, ids[:2]], **body}).json()
    assert one["choices"][0]["text"] == by_text["choices"][0]["text"] == batch["choices"][0]["text"]
    assert one["usage"]["prompt_tokens"] == len(ids) and batch["usage"]["prompt_tokens"] == len(ids) + 2
    assert [c["index"] for c in batch["choices"]] == [0, 1]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([[1, 2], "text"], "not a mixture"),
        ([1, "text"], "not a mixture"),
        ([[1, 2], []], "prompt 1 must be a non-empty list of token ids"),
        ([[1, -2]], "prompt 0 must be a non-empty list of token ids"),
        ([[True]], "prompt 0 must be a non-empty list of token ids"),
        ([], "at least one prompt"),
        # texts checked as /tokenize checks them: their 400s named no param (wave 50, found by probing)
        ("", "prompt must not be empty"),
        (["a", ""], "prompt 1: prompt must not be empty"),
    ],
)
def test_malformed_token_id_prompts_are_refused_clearly(base_url: str, prompt: list, message: str) -> None:
    error = _error(_post(base_url, "/completions", {"prompt": prompt, "max_tokens": 2}))
    assert error["param"] == "prompt" and message in error["message"]


@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_prompt_that_is_not_valid_unicode_names_the_prompt(base_url: str, stream: str) -> None:
    head = json.dumps({"model": MODEL, "max_tokens": 4})[:-1]
    body = head + ', "prompt": ["ok", "abc \\ud800"], "stream": ' + stream + "}"  # a lone surrogate: httpx won't send
    error = _error(_post_raw(base_url, "/completions", body))
    assert error["param"] == "prompt" and "prompt 1: prompt is not valid Unicode" in error["message"]


def test_a_token_id_outside_the_vocabulary_is_a_400(base_url: str, chat_coordinator: Coordinator) -> None:
    size = len(chat_coordinator.orchestrator.tokenizer)
    error = _error(_post(base_url, "/completions", {"prompt": [1, size], "max_tokens": 2}))
    assert f"token id {size} is not a token" in error["message"] and error["param"] == "prompt"


def test_echo_puts_its_own_prompt_before_each_choices_text(base_url: str, chat_coordinator: Coordinator) -> None:
    ids = chat_coordinator.orchestrator.tokenizer.encode(PROMPT)
    other = "x = 1"
    body = {"max_tokens": 5, "temperature": 0, "mode": "sd", "gamma": 3}
    plain = {
        p: _post(base_url, "/completions", {"prompt": p, **body}).json()["choices"][0]["text"] for p in (PROMPT, other)
    }
    echoed = _post(base_url, "/completions", {"prompt": [PROMPT, other], "n": 2, "echo": True, **body}).json()
    assert [c["text"] for c in echoed["choices"]] == [PROMPT + plain[PROMPT]] * 2 + [other + plain[other]] * 2
    by_ids = _post(base_url, "/completions", {"prompt": ids, "echo": True, **body}).json()
    assert by_ids["choices"][0]["text"] == PROMPT + plain[PROMPT]  # token ids echo decoded
    streamed = httpx.post(f"{base_url}/completions", json={"model": MODEL, "prompt": PROMPT, "echo": True,
                          "stream": True, **body}, timeout=60).text  # fmt: skip
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in streamed.split("\n\n") if e.startswith("data: {")]
    assert texts[0].startswith(PROMPT) and "".join(texts) == PROMPT + plain[PROMPT]


def test_an_echoed_prompts_offsets_follow_its_text_special_tokens_and_all(
    base_url: str, chat_coordinator: Coordinator
) -> None:
    """Its tokens' texts were decoded without special tokens while its echoed text kept them: the offsets drifted."""
    tokenizer = chat_coordinator.orchestrator.tokenizer
    ids = [tokenizer.eos_token_id, *tokenizer.encode(PROMPT)]
    body = {"prompt": ids, "max_tokens": 3, "temperature": 0, "mode": "ar", "echo": True, "logprobs": 0}
    choice = _post(base_url, "/completions", body).json()["choices"][0]
    text, logprobs = choice["text"], choice["logprobs"]
    assert text.startswith(tokenizer.eos_token)
    assert logprobs["tokens"][0] == tokenizer.eos_token and logprobs["token_logprobs"][0] is None
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):  # the completion's too
        assert text[offset : offset + len(token)] == token


def _loglikelihood(base_url: str, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """What lm-eval's local-completions does for a loglikelihood request: the whole text as token ids, one new
    token, echo with one log-probability a position; then the continuation's log-probabilities summed, and
    whether each of its tokens was the most likely one."""
    body = {"prompt": [context + continuation], "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
    choice = _post(base_url, "/completions", {**body, "seed": 1234}).json()["choices"][0]
    logprobs, tops = choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
    span = slice(len(context), -1)
    return sum(logprobs[span]), all(lp == max(top.values()) for lp, top in zip(logprobs[span], tops[span], strict=True))


def test_echoed_logprobs_serve_lm_eval_loglikelihood_requests(
    base_url: str, chat_coordinator: Coordinator, grpc_client: CalispecClient
) -> None:
    """The prompt's tokens first (the first without a log-probability: null, as OpenAI's), then the completion's:
    the target's own numbers, as gRPC's `prompt_logprobs` reports them."""
    tokenizer = chat_coordinator.orchestrator.tokenizer
    context, continuation = tokenizer.encode(PROMPT), tokenizer.encode("\n    return a + b")
    ids = context + continuation
    reference = grpc_client.generate(ids, max_new_tokens=1, mode="ar", prompt_logprobs=1, logprobs=1)
    assert reference.prompt_token_ids == ids and reference.prompt_logprobs is not None
    assert len(reference.prompt_logprobs) == len(ids) - 1
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True, "mode": "ar"}
    echoed = _post(base_url, "/completions", body).json()["choices"][0]
    logprobs = echoed["logprobs"]
    assert logprobs["tokens"] == [tokenizer.decode([t], skip_special_tokens=True) for t in [*ids, *reference.token_ids]]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = [lp.logprob for lp in [*reference.prompt_logprobs, *(reference.logprobs or [])]]
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-5)
    assert logprobs["text_offset"] == [sum(map(len, logprobs["tokens"][:i])) for i in range(len(ids) + 1)]
    assert echoed["text"] == tokenizer.decode(ids) + reference.text
    total, greedy = _loglikelihood(base_url, context, continuation)
    continuation_entries = reference.prompt_logprobs[len(context) - 1 :]
    assert total == pytest.approx(sum(lp.logprob for lp in continuation_entries), abs=1e-4)
    tokens_greedy = [lp.top_token_ids[0] == t for lp, t in zip(continuation_entries, continuation, strict=True)]
    assert greedy == all(tokens_greedy)
    streamed = httpx.post(f"{base_url}/completions", json={"model": MODEL, **body, "max_tokens": 3, "stream": True},
                          timeout=60).text  # fmt: skip
    events = [json.loads(e[6:])["choices"][0] for e in streamed.split("\n\n") if e.startswith("data: {")]
    firsts = events[0]["logprobs"]
    assert firsts["token_logprobs"][: len(ids)] == logprobs["token_logprobs"][: len(ids)]
    offsets = [o for e in events if e["logprobs"] for o in e["logprobs"]["text_offset"]]
    tokens = [t for e in events if e["logprobs"] for t in e["logprobs"]["tokens"]]
    assert offsets == [sum(map(len, tokens[:i])) for i in range(len(tokens))]  # one run of offsets over both


def test_schema_errors_name_nested_fields_as_openai_does(base_url: str) -> None:
    """The param of a schema error read `messages.0.content` (pydantic's path) and `prompt.str`."""
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    messages = [*MESSAGES, {"role": "user", "content": image}]
    assert _error(_post(base_url, "/chat/completions", {"messages": messages}))["param"] == "messages[1].content"
    assert _error(_post(base_url, "/completions", {"prompt": 5}))["param"] == "prompt"


def _prompt_tokens(coordinator: Coordinator, path: str, text: str) -> int:
    """How many tokens the coordinator counts for `text` sent as the prompt, or as the one user message."""
    tokenizer = coordinator.orchestrator.tokenizer
    prompt = render_chat(tokenizer, [ChatTurn("user", text)]) if path == "/chat/completions" else text
    return len(tokenizer.encode(prompt))


def _near_the_edge(coordinator: Coordinator, path: str, room: int) -> tuple[dict, int]:
    """A body whose prompt leaves `room` tokens of the context, and its prompt's token count."""
    context = coordinator.orchestrator.context_length
    text = " a" * (context - room)
    while _prompt_tokens(coordinator, path, text) > context - room:  # the chat template's tokens
        text = text[2:]
    prompt_tokens = _prompt_tokens(coordinator, path, text)
    assert prompt_tokens == context - room
    body = {"messages": [{"role": "user", "content": text}]} if path == "/chat/completions" else {"prompt": text}
    return {**body, "temperature": 0, "mode": "ar"}, prompt_tokens


@pytest.mark.parametrize(
    ("path", "field", "stream"),
    [
        ("/completions", "max_tokens", False),
        ("/completions", "max_tokens", True),
        ("/chat/completions", "max_tokens", False),
        ("/chat/completions", "max_completion_tokens", True),
    ],
)
def test_max_tokens_past_the_context_is_a_400_worded_as_vllms(
    base_url: str, chat_coordinator: Coordinator, path: str, field: str, stream: bool
) -> None:
    """It was cut short to what the context held and ended "length", as if max_tokens had been reached."""
    body, prompt_tokens = _near_the_edge(chat_coordinator, path, room=3)
    context = chat_coordinator.orchestrator.context_length
    error = _error(_post(base_url, path, {**body, field: 4, "stream": stream}))
    assert error["param"] == field
    assert error["message"] == (
        f"This model's maximum context length is {context} tokens. However, you requested {prompt_tokens + 4} "
        f"tokens ({prompt_tokens} in the messages, 4 in the completion). "
        "Please reduce the length of the messages or completion."
    )
    fits = _post(base_url, path, {**body, field: 3})  # exactly the room left: every token asked for
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": context}


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_a_prompt_that_fills_the_context_is_a_400_worded_as_vllms(
    base_url: str, chat_coordinator: Coordinator, path: str
) -> None:
    body, prompt_tokens = _near_the_edge(chat_coordinator, path, room=0)
    context = chat_coordinator.orchestrator.context_length
    field = "messages" if path == "/chat/completions" else "prompt"
    unset = _error(_post(base_url, path, body))
    assert unset["param"] == field
    assert unset["message"] == (
        f"This model's maximum context length is {context} tokens. However, you requested {prompt_tokens} tokens "
        "in the messages, Please reduce the length of the messages."
    )
    with_limit = _error(_post(base_url, path, {**body, "max_tokens": 1}))
    assert (
        with_limit["param"] == field
        and f"({prompt_tokens} in the messages, 1 in the completion)" in (with_limit["message"])
    )


def test_without_max_tokens_the_default_is_cut_to_the_room_left(base_url: str, chat_coordinator: Coordinator) -> None:
    body, _ = _near_the_edge(chat_coordinator, "/completions", room=2)
    reply = _post(base_url, "/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] <= 2 < Defaults().max_new_tokens


@pytest.mark.parametrize("stop", ['"\\ud800"', '["ok", "x\\udfff"]'])
def test_a_stop_string_with_a_lone_surrogate_is_a_400_naming_stop(base_url: str, stop: str) -> None:
    """It was accepted, though it can never match the text generated (always valid Unicode)."""
    body = f'{{"model": "{MODEL}", "prompt": "hi", "max_tokens": 2, "stop": {stop}}}'
    error = _error(_post_raw(base_url, "/completions", body))
    assert error["param"] == "stop" and "is not valid Unicode (a lone surrogate" in error["message"]


def test_the_new_400s_are_counted_and_logged_as_the_others_are(
    chat_coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    """The context's 400 is found in the generation (it needs the prompt's tokens): counted INVALID_ARGUMENT and
    logged. The stop string's is a schema error: neither counted nor logged, as too many stop strings are not, nor
    (since wave 50, when the schema began to check a text prompt) an empty prompt."""
    metrics = CoordinatorMetrics(new_registry())
    server = start_http_server(
        create_app(chat_coordinator.orchestrator, ApiSettings(MODEL, Defaults(), 60, metrics=metrics)), "127.0.0.1", 0
    )
    url = f"http://127.0.0.1:{server.port}/v1"
    over, _ = _near_the_edge(chat_coordinator, "/completions", room=1)
    sample = metrics.registry.get_sample_value

    def outcome(post) -> tuple[float, int]:
        """(requests counted INVALID_ARGUMENT, request log lines) that one 400 adds."""
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="coordinator.request_log"):
            assert post().status_code == 400
        lines = [r for r in caplog.records if r.name == "coordinator.request_log"]
        assert all("status=INVALID_ARGUMENT" in r.getMessage() for r in lines)
        return sample("calispec_requests_total", {"mode": "ar", "status": "INVALID_ARGUMENT"}) or 0.0, len(lines)

    try:
        empty_prompt = outcome(lambda: _post(url, "/completions", {"prompt": "", "max_tokens": 2, "mode": "ar"}))
        past_the_context = outcome(lambda: _post(url, "/completions", {**over, "max_tokens": 2}))
        too_many_stops = outcome(lambda: _post(url, "/completions", {"prompt": "hi", "stop": ["x"] * 17}))
        surrogate_stop = outcome(
            lambda: _post_raw(url, "/completions", f'{{"model": "{MODEL}", "prompt": "hi", "stop": "\\ud800"}}')
        )
    finally:
        server.stop()
    assert empty_prompt == (0.0, 0) and past_the_context == (1.0, 1)
    assert too_many_stops == surrogate_stop == (1.0, 0)


NAN, INF = float("nan"), float("inf")
# Every range-checked field's refused edge values -> the 400's param and message, as the HTTP API answers them
# (pinned before its range checks moved to the domain's limits: each is worded there once).
RANGE_ERRORS: list[tuple[str, dict, str, str]] = [
    ("/completions", {"max_tokens": 0}, "max_tokens", "max_tokens: must be in [1, 8192], got 0"),
    ("/completions", {"max_tokens": -1}, "max_tokens", "max_tokens: must be in [1, 8192], got -1"),
    ("/completions", {"max_tokens": 8193}, "max_tokens", "max_tokens: must be in [1, 8192], got 8193"),
    (
        "/completions",
        {"max_tokens": 2**64},
        "max_tokens",
        "max_tokens: must be in [1, 8192], got 18446744073709551616",
    ),
    (
        "/chat/completions",
        {"max_completion_tokens": 0},
        "max_completion_tokens",
        "max_completion_tokens: must be in [1, 8192], got 0",
    ),
    (
        "/chat/completions",
        {"max_completion_tokens": 8193},
        "max_completion_tokens",
        "max_completion_tokens: must be in [1, 8192], got 8193",
    ),
    ("/completions", {"temperature": -0.001}, "temperature", "temperature: must be in [0.0, 100.0], got -0.001"),
    ("/completions", {"temperature": -1e-50}, "temperature", "temperature: must be in [0.0, 100.0], got -1e-50"),
    (
        "/completions",
        {"temperature": 100.000001},
        "temperature",
        "temperature: must be in [0.0, 100.0], got 100.000001",
    ),
    ("/completions", {"temperature": 500}, "temperature", "temperature: must be in [0.0, 100.0], got 500.0"),
    ("/completions", {"temperature": NAN}, "temperature", "temperature: must be in [0.0, 100.0], got nan"),
    ("/chat/completions", {"temperature": INF}, "temperature", "temperature: must be in [0.0, 100.0], got inf"),
    ("/completions", {"top_p": -0.001}, "top_p", "top_p: must be in [0.0, 1.0], got -0.001"),
    ("/completions", {"top_p": 1.00000001}, "top_p", "top_p: must be in [0.0, 1.0], got 1.00000001"),
    ("/completions", {"top_p": 2}, "top_p", "top_p: must be in [0.0, 1.0], got 2.0"),
    ("/chat/completions", {"top_p": NAN}, "top_p", "top_p: must be in [0.0, 1.0], got nan"),
    ("/completions", {"top_k": -2}, "top_k", "top_k: must be in [0, 2147483647], got -2"),
    ("/chat/completions", {"top_k": 2**31}, "top_k", "top_k: must be in [0, 2147483647], got 2147483648"),
    ("/completions", {"seed": -1}, "seed", "seed: must be in [0, 2**63), got -1"),
    (
        "/completions",
        {"seed": 2**63},
        "seed",
        "seed: must be in [0, 2**63), got 9223372036854775808",
    ),
    (
        "/chat/completions",
        {"seed": 2**64},
        "seed",
        "seed: must be in [0, 2**63), got 18446744073709551616",
    ),
    ("/completions", {"logprobs": 21}, "logprobs", "logprobs: must be in [0, 20], got 21"),
    ("/completions", {"logprobs": -1}, "logprobs", "logprobs: must be in [0, 20], got -1"),
    (
        "/chat/completions",
        {"logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "top_logprobs: must be in [0, 20], got 21",
    ),
    ("/chat/completions", {"top_logprobs": 2}, "top_logprobs", "top_logprobs: needs logprobs: true"),
    ("/chat/completions", {"n": 17}, "n", "n: must be in [1, 16] (choices per request), got 17"),
    (
        "/completions",
        {"prompt": ["a", "b"], "n": 9},
        "prompt",
        "prompt: 2 prompts x n = 9 make 18 choices; at most 16 a request",
    ),
    ("/completions", {"gamma": 0}, "gamma", "gamma: must be in [1, 16], got 0"),
    ("/completions", {"gamma": -1}, "gamma", "gamma: must be in [1, 16], got -1"),
    ("/chat/completions", {"gamma": 17}, "gamma", "gamma: must be in [1, 16], got 17"),
    ("/completions", {"tau": 0}, "tau", "tau: must be in (0, 1], got 0.0"),
    ("/completions", {"tau": -0.5}, "tau", "tau: must be in (0, 1], got -0.5"),
    ("/completions", {"tau": 1.0001}, "tau", "tau: must be in (0, 1], got 1.0001"),
    ("/completions", {"tau": NAN}, "tau", "tau: must be in (0, 1], got nan"),
    ("/completions", {"tau": INF}, "tau", "tau: must be in (0, 1], got inf"),
    ("/chat/completions", {"tau": 1e-46}, "tau", "tau: must be in (0, 1], got 1e-46 (0.0 as the target's float32)"),
    ("/completions", {"lambda": -1}, "lambda", "lambda: must be in [0, 2147483647], got -1"),
    ("/completions", {"lambda": 2**31}, "lambda", "lambda: must be in [0, 2147483647], got 2147483648"),
    ("/chat/completions", {"lambda": 2**40}, "lambda", "lambda: must be in [0, 2147483647], got 1099511627776"),
    ("/completions", {"stop": ""}, "stop", "stop: stop strings must be 1 to 256 characters"),
    ("/completions", {"stop": ["ok", ""]}, "stop", "stop: stop strings must be 1 to 256 characters"),
    ("/completions", {"stop": ["a" * 257]}, "stop", "stop: stop strings must be 1 to 256 characters"),
    ("/chat/completions", {"stop": ["x"] * 17}, "stop", "stop: at most 16 stop strings, got 17"),
    (
        "/completions",
        {"stop": ["ok", "x\udc00y"]},
        "stop",
        "stop: stop string 1 is not valid Unicode (a lone surrogate at character 1)",
    ),
    # two faults: the first field in the schema's order is named, before the model, n or the prompt are looked at
    (
        "/completions",
        {"temperature": 500, "gamma": 99},
        "temperature",
        "temperature: must be in [0.0, 100.0], got 500.0",
    ),
    ("/completions", {"top_p": 2, "n": 2}, "top_p", "top_p: must be in [0.0, 1.0], got 2.0"),
    ("/completions", {"tau": 5, "presence_penalty": 3}, "tau", "tau: must be in (0, 1], got 5.0"),
    ("/completions", {"model": "gpt-9", "top_k": -2}, "top_k", "top_k: must be in [0, 2147483647], got -2"),
    ("/completions", {"prompt": "", "max_tokens": 0}, "max_tokens", "max_tokens: must be in [1, 8192], got 0"),
    ("/completions", {"stop": ["x"] * 16 + [""]}, "stop", "stop: at most 16 stop strings, got 17"),
    (
        "/chat/completions",
        {"max_tokens": 0, "max_completion_tokens": 4},
        "max_tokens",
        "max_tokens: must be in [1, 8192], got 0",
    ),
]


@pytest.mark.parametrize(
    ("path", "fields", "param", "message"), RANGE_ERRORS, ids=[str(e[1])[:60] for e in RANGE_ERRORS]
)
def test_each_fields_range_error_is_a_400_naming_it(
    base_url: str, path: str, fields: dict, param: str, message: str
) -> None:
    """Status, type, code, param and message of every field's range error, edges included (NaN and ±inf too)."""
    prompt = {"prompt": "hi"} if path == "/completions" else {"messages": MESSAGES}
    body = json.dumps({"model": MODEL, **prompt, **fields})  # NaN and Infinity, as Python's JSON writes them
    error = _error(_post_raw(base_url, path, body))
    assert (error["param"], error["message"]) == (param, message)


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_top_k_beyond_the_models_vocabulary_is_a_400_naming_it(
    base_url: str, chat_coordinator: Coordinator, path: str
) -> None:
    """The target refused it: "target: top_k must be <= vocab size ...", with no param (wave 50's probe). The
    coordinator now knows the models' vocabulary (build_orchestrator) and refuses it as the request's field."""
    vocab = chat_coordinator.orchestrator.vocab_size
    assert vocab is not None and vocab > 1
    prompt = {"prompt": "hi"} if path == "/completions" else {"messages": MESSAGES}
    body = {"model": MODEL, **prompt, "max_tokens": 2, "temperature": 1.0, "seed": 1}
    error = _error(_post_raw(base_url, path, json.dumps({**body, "top_k": vocab + 1})))
    assert (error["param"], error["message"]) == (
        "top_k",
        f"top_k: must be <= the vocabulary size {vocab}, got {vocab + 1}",
    )
    assert _post_raw(base_url, path, json.dumps({**body, "top_k": vocab})).status_code == 200


def test_top_k_beyond_the_models_vocabulary_is_invalid_argument_over_grpc(
    grpc_client: CalispecClient, chat_coordinator: Coordinator
) -> None:
    vocab = chat_coordinator.orchestrator.vocab_size
    with pytest.raises(CalispecRpcError) as info:
        grpc_client.generate("hi", max_new_tokens=2, temperature=1.0, top_k=(vocab or 0) + 1)
    assert info.value.code == "INVALID_ARGUMENT" and info.value.details.startswith("top_k must be <= the vocabulary")


def test_grpc_streams_the_prompt_report_on_the_first_chunk_only(grpc_client: CalispecClient) -> None:
    unary = grpc_client.generate(PROMPT, max_new_tokens=6, mode="sd", num_speculative_tokens=2, prompt_logprobs=2)
    chunks = list(grpc_client.generate_stream(PROMPT, max_new_tokens=6, mode="sd", num_speculative_tokens=2,
                                              prompt_logprobs=2))  # fmt: skip
    assert chunks[0].prompt_token_ids == unary.prompt_token_ids and unary.prompt_logprobs is not None
    assert [lp.logprob for lp in chunks[0].prompt_logprobs or []] == [lp.logprob for lp in unary.prompt_logprobs]
    assert all(lp.top_token_ids and len(lp.top_token_ids) == 2 for lp in unary.prompt_logprobs)
    assert all(c.prompt_token_ids is None and c.prompt_logprobs is None for c in chunks[1:]) and len(chunks) > 1
    assert unary.to_dict()["prompt_token_ids"] == unary.prompt_token_ids
    assert grpc_client.generate(PROMPT, max_new_tokens=2).prompt_logprobs is None  # not asked: none


def test_an_http_stream_left_mid_way_is_logged_with_what_it_had_done(
    chat_coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    """The request log read only a last chunk's stats: a request that never sent one was logged with
    prompt_tokens=0 rounds=0 session=-."""
    server, url = serve(chat_coordinator)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 500, "ignore_eos": True, "stream": True, **SD}
    try:
        with caplog.at_level(logging.INFO, logger="coordinator.request_log"):
            with httpx.stream("POST", f"{url}/completions", json=body, timeout=60) as response:
                first = next(response.iter_lines())
            wait_until(lambda: any("status=CANCELLED" in r.getMessage() for r in caplog.records))
    finally:
        server.stop()  # type: ignore[attr-defined]
    assert first.startswith("data: {")
    (line,) = [r.getMessage() for r in caplog.records if "status=CANCELLED" in r.getMessage()]
    prompt_tokens = len(chat_coordinator.orchestrator.tokenizer.encode(PROMPT))
    assert f" prompt_tokens={prompt_tokens} " in line and " rounds=0 " not in line and not line.endswith("session=-")


def test_stop_token_ids_end_a_choice_with_the_token_kept(base_url: str, grpc_client: CalispecClient) -> None:
    """vLLM's extension; the gRPC API and the SDK have it too."""
    ids = grpc_client.generate(PROMPT, max_new_tokens=6, mode="ar", ignore_eos=True).token_ids
    stop = ids[2]
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "mode": "ar", "ignore_eos": True}
    choice = _post(base_url, "/completions", {**body, "stop_token_ids": [stop], "return_token_ids": True}).json()
    first = ids.index(stop)  # the first occurrence ends it
    assert choice["choices"][0]["token_ids"] == ids[: first + 1] and choice["choices"][0]["finish_reason"] == "stop"
    by_grpc = grpc_client.generate(PROMPT, max_new_tokens=6, mode="sd", stop_token_ids=[stop], ignore_eos=True)
    assert by_grpc.token_ids == ids[: first + 1] and by_grpc.finish_reason == "stop"
    for bad in ([-1], ["a"], list(range(17))):
        param = _error(_post(base_url, "/completions", {**body, "stop_token_ids": bad}))["param"]
        assert param in ("stop_token_ids", "stop_token_ids[0]")  # a non-integer item is named as itself


def test_choices_past_the_slots_wait_in_line_and_every_slot_comes_back(chat_coordinator: Coordinator) -> None:
    """Two requests of 16 choices with 16 slots, at once: one waits in line for the other (a stream and a unary
    request); then a stream whose client leaves after the headers. Afterwards every slot is free, nobody waits."""
    app = create_app(chat_coordinator.orchestrator, ApiSettings(MODEL, Defaults(), 60, max_generations=16))
    server = start_http_server(app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.port}/v1"
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "n": 16, "mode": "sd"}

    async def both() -> tuple[int, list[str], int]:
        async with httpx.AsyncClient(timeout=60) as client:

            async def streamed() -> tuple[int, list[str]]:
                async with client.stream("POST", f"{url}/completions", json={**body, "stream": True}) as response:
                    return response.status_code, [line async for line in response.aiter_lines() if line]

            (status, events), unary = await asyncio.gather(streamed(), client.post(f"{url}/completions", json=body))
            return status, events, unary.status_code

    try:
        status, events, unary_status = asyncio.run(both())
        assert (status, events[-1], unary_status) == (200, "data: [DONE]", 200)
        with httpx.stream("POST", f"{url}/completions", json={**body, "stream": True}, timeout=60) as response:
            assert response.status_code == 200  # the client reads no further and leaves
        slots, gauge = app.state.api.slots, app.state.api.metrics.registry.get_sample_value
        wait_until(lambda: slots.free == 16 and slots.waiting() == 0)
        assert (gauge("calispec_http_generation_slots_free"), gauge("calispec_http_choices_waiting")) == (16, 0)
    finally:
        server.stop()


# --- tool calls (the coordinator's --tool-call-parser; the parsing itself: tests/unit/test_tool_calls.py) -----------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALLED = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"c": 1}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
]


@pytest.fixture(scope="module")
def tools_url(chat_coordinator: Coordinator) -> Iterator[str]:
    server, url = serve(chat_coordinator, tools="hermes")
    yield url
    server.stop()  # type: ignore[attr-defined]


def test_tools_are_rendered_into_the_prompt_and_counted_as_tokenize_counts_them(tools_url: str, base_url: str) -> None:
    counts = {}
    for name, extra in (("plain", {}), ("tools", {"tools": TOOLS}), ("none", {"tools": TOOLS, "tool_choice": "none"})):
        done = _post(tools_url, "/chat/completions", {"messages": MESSAGES, **extra, **GREEDY_CHAT})
        assert done.status_code == 200, done.text
        counts[name] = done.json()["usage"]["prompt_tokens"]
        for url in (tools_url, base_url):  # without a parser tools are never rendered (the review: they were here)
            root = url.removesuffix("/v1")
            counted = httpx.post(f"{root}/tokenize", json={"model": MODEL, "messages": MESSAGES, **extra}).json()
            assert counted["count"] == (counts[name] if url == tools_url else counts["plain"]), (name, url)
    assert counts["tools"] > counts["plain"] == counts["none"]  # tool_choice "none": the tools are not rendered


def test_a_conversation_with_calls_and_results_is_rendered_where_calls_are_parsed(
    tools_url: str, base_url: str
) -> None:
    root = tools_url.removesuffix("/v1")
    done = _post(tools_url, "/chat/completions", {"messages": CALLED, "tools": TOOLS, **GREEDY_CHAT})
    assert done.status_code == 200, done.text
    counted = httpx.post(f"{root}/tokenize", json={"model": MODEL, "messages": CALLED, "tools": TOOLS}).json()
    assert counted["count"] == done.json()["usage"]["prompt_tokens"]
    short = httpx.post(f"{root}/tokenize", json={"model": MODEL, "messages": MESSAGES, "tools": TOOLS}).json()
    assert counted["count"] > short["count"]
    bad = [*MESSAGES, {**CALLED[1], "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]
    error = _error(_post(tools_url, "/chat/completions", {"messages": bad, **GREEDY_CHAT}))
    assert error["param"] == "messages[1].tool_calls" and "must be a JSON object" in error["message"]
    refused = _error(_post(base_url, "/chat/completions", {"messages": CALLED, **GREEDY_CHAT}))  # no parser
    assert refused["param"] == "messages[1].tool_calls" and "--tool-call-parser" in refused["message"]


def test_a_reply_streamed_with_tools_is_the_unary_reply(tools_url: str) -> None:
    """The stream holds back what may start a call: a reply without calls still arrives whole, the same as unary."""
    client = openai.OpenAI(base_url=tools_url, api_key="unused", max_retries=0, timeout=60)
    kwargs = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 12, "temperature": 0}
    unary = client.chat.completions.create(**kwargs, extra_body={"mode": "sd", "gamma": 3})  # type: ignore[call-overload]
    streamed = client.chat.completions.create(**kwargs, stream=True, extra_body={"mode": "sd", "gamma": 3})  # type: ignore[call-overload]
    chunks = list(streamed)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert "<tool_call>" not in text  # the tiny model writes no call: its reply is content
    assert text == unary.choices[0].message.content and unary.choices[0].message.tool_calls is None
    assert finish == [unary.choices[0].finish_reason]


LOGIT_RULE_ERRORS = [
    ({"frequency_penalty": -3}, "frequency_penalty", "must be in [-2, 2], got -3.0"),
    ({"repetition_penalty": 0}, "repetition_penalty", "must be in [0.01, 2.0], got 0.0"),
    ({"repetition_penalty": 1e-38}, "repetition_penalty", "must be in [0.01, 2.0]"),  # z / 1e-38: +inf (review)
    ({"logit_bias": {"5": 1, "05": -1}}, "logit_bias", "a token id appears twice"),
    ({"min_p": 1.5}, "min_p", "must be in [0, 1], got 1.5"),
    ({"min_tokens": -1}, "min_tokens", "must be in [0, 8192], got -1"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "must be <= max_tokens (4), got 5"),
    ({"logit_bias": {"3": 150}}, "logit_bias", "token 3's bias must be in [-100, 100], got 150.0"),
    ({"logit_bias": {"999999": 1}}, "logit_bias", "token ids must be in [0, "),  # past the vocabulary
    ({"allowed_token_ids": []}, "allowed_token_ids", "must hold at least one token id"),
    ({"allowed_token_ids": [1, 999999]}, "allowed_token_ids", "token ids must be in [0, "),
    ({"bad_words": ["a", ""]}, "bad_words", "must be 1 to 256 characters, word 1 has 0"),
    ({"bad_words": ["x"] * 65}, "bad_words", "at most 64 words, got 65"),
]


@pytest.mark.parametrize(("body", "param", "fragment"), LOGIT_RULE_ERRORS, ids=[e[1] for e in LOGIT_RULE_ERRORS])
def test_logit_rules_out_of_range_are_400s_naming_the_field(base_url: str, body: dict, param: str, fragment: str):
    error = _error(_post(base_url, "/completions", {"prompt": PROMPT, "max_tokens": 8, **body}))
    assert error["param"] == param and fragment in error["message"], error


@pytest.mark.parametrize("mode", ["ar", "sd", "csd"])
def test_logit_bias_and_min_tokens_shape_the_reply(oai: openai.OpenAI, chat_coordinator: Coordinator, mode: str):
    """OpenAI's logit_bias and vLLM's min_tokens (refused with a 400 until wave 60): a +100 bias makes a token the
    reply; on the end-of-sequence token, min_tokens holds it back."""
    forced = oai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={"7": 100},
        extra_body={"mode": mode, "gamma": 3, "return_token_ids": True},
    )  # fmt: skip
    assert (forced.choices[0].model_extra or {})["token_ids"] == [7] * 6
    eos = min(chat_coordinator.orchestrator.eos_token_ids)
    held = oai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logit_bias={str(eos): 100},
        extra_body={"mode": mode, "gamma": 3, "return_token_ids": True, "min_tokens": 5},
    )  # fmt: skip
    token_ids = (held.choices[0].model_extra or {})["token_ids"]
    assert len(token_ids) == 6 and token_ids[-1] == eos and held.choices[0].finish_reason == "stop", token_ids


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_log_probabilities_under_logit_rules_are_the_raw_ones(oai: openai.OpenAI, mode: str) -> None:
    """As vLLM's default (`raw_logprobs`): what the model thinks, before the rules. A +100 bias forces token 7, whose
    reported log-probability stays its raw one, and the first position's top tokens are the unbiased request's (the
    same prompt before it); they were the biased logits' (token 7 at ~0.0) until wave 61."""
    asked = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 5}
    free = oai.completions.create(**asked, extra_body={"mode": mode, "gamma": 3}).choices[0].logprobs
    ruled = oai.completions.create(**asked, logit_bias={"7": 100}, extra_body={"mode": mode, "gamma": 3})
    logprobs = ruled.choices[0].logprobs
    assert free is not None and logprobs is not None and free.top_logprobs and logprobs.top_logprobs
    first = logprobs.top_logprobs[0]  # the 5 likeliest, and the token written (vLLM's form)
    assert {text: first[text] for text in free.top_logprobs[0]} == pytest.approx(free.top_logprobs[0], abs=1e-5)
    assert logprobs.token_logprobs is not None and logprobs.token_logprobs[0] < -1.0  # token 7 is not the model's pick


def test_bad_words_are_not_written(oai: openai.OpenAI) -> None:
    """vLLM's bad_words (a 400 until wave 60): the tiny pair's reply "return a + b" loses its "a"."""
    free = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    extra = {"bad_words": ["a"], **SD}
    ruled = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, extra_body=extra)
    ruled = ruled.choices[0].text
    assert " a " in free and " a " not in ruled and ruled != free
