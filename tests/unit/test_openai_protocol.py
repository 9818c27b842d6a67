"""coordinator.openai_protocol: how OpenAI's request shapes become Calispec's (no server, no model)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from calispec_core.errors import InvalidArgument, InvalidField
from calispec_core.generation import Defaults, GenerationParams
from calispec_core.limits import SEED_BOUND
from calispec_core.sampling import MIN_TOP_P, SamplingConfig
from coordinator import openai_protocol as protocol
from coordinator.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    context_overflow,
    openai_param,
    text_of_parts,
    validation_error,
)

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def first_error(model: type, body: dict[str, Any]) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return validation_error(info.value.errors()[0])


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "max_tokens"), "max_tokens"),
        (("body", "messages", 0, "content"), "messages[0].content"),
        (("body", "messages", 12, "role"), "messages[12].role"),
        (("body", "prompt", "str"), "prompt"),  # union-member tags are pydantic's, not OpenAI's
        (("body", "stop", "list[str]", 3), "stop[3]"),
        (("body", "stream_options", "StreamOptions", "include_usage"), "stream_options.include_usage"),
        (("body",), None),
    ],
)
def test_pydantic_locations_become_openai_params(loc: tuple, param: str | None) -> None:
    """The HTTP errors' param read `messages.0.content` and `prompt.str`."""
    assert openai_param(loc) == param


def test_validation_errors_name_the_openai_field() -> None:
    message, param = first_error(ChatCompletionRequest, {"model": "m", "messages": USER, "max_completion_tokens": 0})
    assert (message, param) == ("max_completion_tokens: must be in [1, 8192], got 0", "max_completion_tokens")
    content = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]
    message, param = first_error(
        ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": content}]}
    )
    assert param == "messages[0].content" and "part 1 has type 'image_url'" in message


def test_text_parts_are_joined_with_newlines_as_vllm_does() -> None:
    assert text_of_parts([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert text_of_parts([]) == ""
    assert chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]).messages[0].content == "x"


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "type 'input_audio'"),
        ({"role": "user", "content": ["hi"]}, "part 0 is not a content part"),
        ({"role": "user", "content": [{"type": "text"}]}, "without a text string"),
        ({"role": "user", "content": None}, "null only on an assistant message"),
        ({"role": "user"}, "null only on an assistant message"),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}, "Field required"),  # no function
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            "Input should be a valid string",  # arguments: a JSON object's text, as OpenAI's API carries it
        ),
        ({"role": "assistant", "content": None, "function_call": {"name": "f"}}, "function_call is not supported"),
    ],
)
def test_bad_messages_are_refused(message: dict[str, Any], fragment: str) -> None:
    text, _ = first_error(ChatCompletionRequest, {"model": "m", "messages": [message]})
    assert fragment in text


def test_developer_is_system_and_assistant_content_may_be_null() -> None:
    messages = [
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "assistant"},
    ]
    parsed = chat(messages=messages).messages
    assert [(m.role, m.content) for m in parsed] == [
        ("system", "Be brief."),
        ("user", "hi"),
        ("assistant", ""),
        ("assistant", ""),
    ]


def test_top_p_zero_is_the_most_likely_token_not_off() -> None:
    """Inside, top_p 0 means "off"; OpenAI's 0 keeps only the most likely token."""
    assert chat(top_p=0).top_p == MIN_TOP_P
    assert chat(top_p=0.5).top_p == 0.5 and chat().top_p == 1.0


def test_top_k_minus_one_is_off_as_in_vllm() -> None:
    assert chat(top_k=-1).top_k == 0
    assert first_error(ChatCompletionRequest, {"model": "m", "messages": USER, "top_k": -2})[1] == "top_k"


def test_a_tau_the_target_gets_as_zero_is_a_400_naming_tau() -> None:
    """1e-46 is in (0, 1] but reaches the target as float32 0.0, which it refuses: a failed request."""
    message, param = first_error(ChatCompletionRequest, {"model": "m", "messages": USER, "tau": 1e-46})
    assert (message, param) == ("tau: must be in (0, 1], got 1e-46 (0.0 as the target's float32)", "tau")
    assert chat(tau=1e-45).tau == 1e-45  # float32's smallest subnormal: 1.4e-45 there
    assert first_error(CompletionRequest, {"model": "m", "prompt": "p", "tau": 1.5})[1] == "tau"


def test_seed_takes_the_shared_bound_exclusive() -> None:
    assert chat(seed=SEED_BOUND - 1).seed == SEED_BOUND - 1
    message, param = first_error(ChatCompletionRequest, {"model": "m", "messages": USER, "seed": SEED_BOUND})
    assert param == "seed" and message == f"seed: must be in [0, 2**63), got {SEED_BOUND}"


def test_null_is_unset() -> None:
    nullable = ("temperature", "top_p", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty",
                "top_k", "return_token_ids", "seed", "stop", "max_tokens", "lambda", "logprobs", "top_logprobs",
                "tool_choice", "tools", "response_format")  # fmt: skip
    request = chat(**dict.fromkeys(nullable))
    assert request.model_dump() == chat().model_dump()
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "p", "echo": None, "logprobs": None})
    assert completion.echo is False
    with_usage = chat(stream=True, stream_options={"include_usage": None})
    assert with_usage.include_usage_chunk is False


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ([[1, 2], "p"], "not a mixture"),
        ([[1], [2, "3"]], "prompt 1 must be a non-empty list of token ids"),
        ([-1], "prompt 0 must be a non-empty list of token ids (integers >= 0), got -1"),  # said "not a mixture"
        ([True, False], "prompt 0 must be a non-empty list of token ids (integers >= 0), got true"),
        ([1.0, 2.0], "prompt 0 must be a non-empty list of token ids (integers >= 0), got 1.0"),
        ([], "at least one prompt"),
        (["p"] * 17, "17 prompts x n = 1 make 17 choices; at most 16 a request"),
        ([[1]] * 17, "17 prompts x n = 1 make 17 choices; at most 16 a request"),
    ],
)
def test_malformed_prompts_are_refused_with_param_prompt(prompt: list, fragment: str) -> None:
    message, param = first_error(CompletionRequest, {"model": "m", "prompt": prompt})
    assert param == "prompt" and fragment in message


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("one", ["one"]), (["one", "two"], ["one", "two"]), ([5, 0], [[5, 0]]), ([[5], [6, 7]], [[5], [6, 7]])],
)
def test_openai_s_four_prompt_forms_are_each_a_list_of_prompts(prompt: object, prompts: list) -> None:
    request = CompletionRequest.model_validate({"model": "m", "prompt": prompt, "n": 2})
    assert request.prompts() == prompts and request.choice_count() == 2 * len(prompts)


def test_texts_of_digits_stay_texts_and_token_ids_are_bounded_before_their_items_are_checked() -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["1", "2"]}).prompts() == ["1", "2"]
    limit = protocol.MAX_PROMPT_TOKEN_IDS
    for prompt in ([[1] * limit, [1]], [1] * (limit + 1)):
        message, param = first_error(CompletionRequest, {"model": "m", "prompt": prompt})
        assert param == "prompt" and f"at most {limit} token ids in all" in message
    message, _ = first_error(CompletionRequest, {"model": "m", "prompt": [[1]] * 9, "n": 2})
    assert "9 prompts x n = 2 make 18 choices" in message


def test_a_batch_of_prompts_makes_n_choices_each() -> None:
    batch = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"], "n": 3})
    assert (batch.prompts(), batch.choice_count()) == (["a", "b"], 6)
    assert CompletionRequest.model_validate({"model": "m", "prompt": "a"}).choice_count() == 1
    assert chat(n=16).choice_count() == 16
    message, param = first_error(CompletionRequest, {"model": "m", "prompt": ["a", "b"], "n": 9})
    assert (param, message) == ("prompt", "prompt: 2 prompts x n = 9 make 18 choices; at most 16 a request")


@pytest.mark.parametrize("n", [0, -1, 17])
def test_n_out_of_range_is_refused_with_param_n(n: int) -> None:
    message, param = first_error(CompletionRequest, {"model": "m", "prompt": "p", "n": n})
    assert (param, message) == ("n", f"n: must be in [1, 16] (choices per request), got {n}")


def test_a_seed_leaves_room_for_every_choices_seed() -> None:
    """Choice i samples with seed + i, which must stay a seed (below 2**63)."""
    assert chat(n=2, seed=2**63 - 2).seed == 2**63 - 2
    message, param = first_error(CompletionRequest, {"model": "m", "prompt": "p", "n": 2, "seed": 2**63 - 1})
    assert param == "seed" and "seed + n - 1 must be below 2**63" in message


def test_stream_options_need_streaming() -> None:
    assert first_error(CompletionRequest, {"model": "m", "prompt": "p", "stream_options": {}})[1] == "stream_options"
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage_chunk


def test_tools_are_called_by_the_models_choice_or_forced() -> None:
    """`auto` (or no tool_choice) lets the model call them, where the server parses calls (OpenAIApi.check_tools:
    a 400 without a parser); "required" or a named function forces a call (wave 59: test_tool_calls_http.py)."""
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert chat(tools=tools, tool_choice="none").rendered_tools() is None
    assert chat(tools=tools).rendered_tools() == tools
    assert chat(tools=tools, tool_choice="auto").calls_tools()
    assert not chat(tool_choice="auto").calls_tools()  # no tools: nothing to call
    for fields, param in (
        ({"tools": [{"type": "function", "function": {}}]}, "tools"),
        ({"tools": [{"name": "f"}]}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {}}, "response_format"),
    ):
        assert first_error(ChatCompletionRequest, {"model": "m", "messages": USER, **fields})[1] == param, fields


@pytest.mark.parametrize("stop", ["\ud800", ["ok", "x\udc00y"]])
def test_a_stop_string_with_a_lone_surrogate_is_refused(stop: str | list[str]) -> None:
    """It was accepted: it can never match generated text, and fails wherever the text is encoded."""
    message, param = first_error(CompletionRequest, {"model": "m", "prompt": "hi", "stop": stop})
    assert param == "stop" and "is not valid Unicode (a lone surrogate" in message


LIMIT = "This model's maximum context length is 100 tokens. However, you requested"


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "message"),
    [
        (60, 40, None),  # exactly fills the context
        (99, None, None),  # leaves room for the server's default, cut to one token
        (
            60,
            41,
            f"{LIMIT} 101 tokens (60 in the messages, 41 in the completion). "
            "Please reduce the length of the messages or completion.",
        ),
        (100, None, f"{LIMIT} 100 tokens in the messages, Please reduce the length of the messages."),
        (
            120,
            1,
            f"{LIMIT} 121 tokens (120 in the messages, 1 in the completion). "
            "Please reduce the length of the messages or completion.",
        ),
    ],
)
def test_context_overflow_is_worded_as_vllm_words_it(prompt_tokens: int, max_tokens: int | None, message) -> None:
    assert context_overflow(prompt_tokens, max_tokens, 100) == message


def test_the_token_limit_and_the_field_that_carries_it() -> None:
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "max_tokens": 5})
    assert (completion.token_limit(), completion.token_limit_field()) == (5, "max_tokens")
    both = chat(max_tokens=5, max_completion_tokens=7)
    assert (both.token_limit(), both.token_limit_field()) == (7, "max_completion_tokens")
    assert (chat(max_tokens=5).token_limit_field(), completion.prompt_field, both.prompt_field) == (
        "max_tokens",
        "prompt",
        "messages",
    )


@pytest.mark.parametrize(
    ("fields", "parsed"),
    [
        ({"max_tokens": 1, "max_completion_tokens": 8192}, {"max_tokens": 1, "max_completion_tokens": 8192}),
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"temperature": -0.0}, {"temperature": 0.0}),
        ({"temperature": 100}, {"temperature": 100.0}),
        ({"top_p": 0}, {"top_p": MIN_TOP_P}),
        ({"top_p": 1}, {"top_p": 1.0}),
        ({"top_k": -1}, {"top_k": 0}),
        ({"top_k": 2**31 - 1}, {"top_k": 2**31 - 1}),
        ({"seed": 0}, {"seed": 0}),
        ({"seed": SEED_BOUND - 1}, {"seed": SEED_BOUND - 1}),
        ({"gamma": 1}, {"gamma": 1}),
        ({"gamma": 16}, {"gamma": 16}),
        ({"tau": 1}, {"tau": 1.0}),
        ({"tau": 1e-40}, {"tau": 1e-40}),  # a float32 subnormal: not 0 on the wire
        ({"lambda": 0}, {"lambda_": 0}),
        ({"lambda": 2**31 - 1}, {"lambda_": 2**31 - 1}),
        ({"stop": "a" * 256}, {"stop": "a" * 256}),
        ({"stop": ["x"] * 16}, {"stop": ["x"] * 16}),
    ],
)
def test_each_fields_edge_values_are_taken(fields: dict[str, Any], parsed: dict[str, Any]) -> None:
    """The other side of tests/service/test_openai_api.py's RANGE_ERRORS: the values on each bound."""
    req = chat(**fields)
    assert {name: getattr(req, name) for name in parsed} == parsed


# One refused value per field whose two APIs' words once differed: the HTTP 400 now gives the domain's own reason
ONE_WORDING: list[dict[str, Any]] = [
    {"temperature": 500.0},
    {"top_p": 2.0},
    {"seed": -1},
    {"lambda": -1},
    {"lambda": 2**31},
    {"tau": 1e-46},  # in (0, 1], but 0.0 as the target's float32
    {"stop": ["x"] * 17},
]


def domain_refusal(fields: dict[str, Any]) -> str:
    """What GenerationParams.validate (the gRPC API's path) says of these fields, without the domain's field name."""
    defaults = Defaults()
    sampling = {k: v for k, v in fields.items() if k in ("temperature", "top_p", "seed")}
    params = GenerationParams(
        max_new_tokens=defaults.max_new_tokens,
        sampling=SamplingConfig(**sampling),
        stop=tuple(fields.get("stop", ())),
        num_speculative_tokens=None,
        mode=defaults.mode,
        tau=fields.get("tau", defaults.tau),
        lambda_=fields.get("lambda", defaults.lambda_),
    )
    with pytest.raises(InvalidArgument) as info:
        params.validate()
    return info.value.reason if isinstance(info.value, InvalidField) else str(info.value)


@pytest.mark.parametrize("fields", ONE_WORDING, ids=[str(f)[:40] for f in ONE_WORDING])
def test_a_range_error_has_one_wording_for_both_apis(fields: dict[str, Any]) -> None:
    """The HTTP models call the domain's checks: no second rule, no second wording (only the field's name differs)."""
    (name,) = fields
    message, param = first_error(ChatCompletionRequest, {"model": "m", "messages": USER, **fields})
    assert (param, message) == (name, f"{name}: {domain_refusal(fields)}")


def test_top_logprobs_need_logprobs_and_a_bad_logprobs_is_reported_alone() -> None:
    assert chat(logprobs=True, top_logprobs=20).requested_logprobs() == 20
    assert chat(logprobs=True).requested_logprobs() == 0 and chat(top_logprobs=0).requested_logprobs() is None
    assert first_error(ChatCompletionRequest, {"model": "m", "messages": USER, "top_logprobs": 2})[1] == "top_logprobs"
    with pytest.raises(ValidationError) as info:
        chat(logprobs="maybe", top_logprobs=2)
    assert [e["loc"] for e in info.value.errors()] == [("logprobs",)]  # not also "top_logprobs: needs logprobs"
