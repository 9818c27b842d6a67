"""Typed request and response models of the OpenAI-compatible HTTP API (pydantic).

The shapes follow OpenAI's `/v1/completions`, `/v1/chat/completions` and `/v1/models`, as vLLM,
SGLang and TGI serve them. Calispec's own parameters ride along as extra body fields
(`extra_body={"mode": "sd", "gamma": 4}` in the `openai` client). Fields a client may send
but Calispec does not implement (echo, penalties, tool calls, JSON mode, ...) are
accepted only at their no-op values and refused with 400 otherwise, rather than silently ignored;
unknown fields are ignored, as vLLM does. An explicit `null` is the field left out, as OpenAI takes it.

Fields' ranges are checked here, so that a 400 names the field under OpenAI's name (`max_tokens`, not the
domain's `max_new_tokens`) in its `param`, before the request is admitted. Every range rule is the domain's
(calispec_core.limits), written once: its refusal's reason is the message, in the gRPC API's words.
`GenerationParams.validate` checks every field again, for every API.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from calispec.types import MODE_NAMES, FinishReason, OutputConstraint
from calispec_core.errors import InvalidArgument, InvalidField
from calispec_core.generation import check_constraint
from calispec_core.limits import (
    HTTP_MAX_CHOICES,
    MAX_PROMPT_CHARS,
    SEED_BOUND,
    check_csd_thresholds,
    check_logprobs,
    check_max_new_tokens,
    check_sampling,
    check_speculative_tokens,
    check_stop_strings,
    check_stop_token_ids,
    require_unicode,
    validate_prompt,
)
from calispec_core.logit_rules import LogitRules
from calispec_core.sampling import MIN_TOP_P
from coordinator.tool_calls import ToolChoice, forced_call_schema

ModeName = Literal[MODE_NAMES]  # type: ignore[valid-type]
# Choices a request may ask for (`n`, times the prompts of a batched completion). Each running choice holds a row of
# the model services' batches (8 by default), a generation slot (openai_generations.GenerationSlots) and, while a
# round of it runs, a worker thread.
MAX_CHOICES = HTTP_MAX_CHOICES
MAX_PROMPT_TOKEN_IDS = MAX_PROMPT_CHARS  # a request's token-id prompts, in all (a text prompt's limit, in ids)
TokenIds = list[StrictInt]
NO_FORCED_CALLS = "the deprecated function_call cannot force a call here: send tools with tool_choice"


def invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is `message` as written (braces included), with no "Value error," prefix."""
    return PydanticCustomError("invalid_value", "{reason}", {"reason": message})


def noop_only(value: Any, field: str, noops: tuple[Any, ...]) -> Any:
    """`value` where it is unset or one of the field's no-op values (the same type too); else a 400 naming them."""
    if value is not None and not any(value == noop and type(value) is type(noop) for noop in noops):
        send = "".join(f"send {json.dumps(noop)} or " for noop in noops)
        raise invalid(f"{field} is not supported: {send}leave it out")
    return value


@contextmanager
def domain_checked() -> Iterator[None]:
    """The domain's refusal of the field being validated, as a validation error: pydantic puts the field's
    OpenAI name in front of it, so an InvalidField gives its reason only (`gamma: must be in [1, 16], got 17`)."""
    try:
        yield
    except InvalidField as exc:
        raise invalid(exc.reason) from None
    except InvalidArgument as exc:
        raise invalid(str(exc)) from None


def _token_count(value: int | None) -> int | None:
    if value is not None:
        with domain_checked():
            check_max_new_tokens(value)
    return value


class OpenAIModel(BaseModel):
    """OpenAI's optional fields take an explicit `null` as "unset": such a field gets its default."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        optional = {key for name, f in cls.model_fields.items() if not f.is_required() for key in (name, f.alias)}
        return {key: value for key, value in data.items() if value is not None or key not in optional}


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's usage in every chunk: not implemented, false only

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool) -> bool:
        return noop_only(value, "continuous_usage_stats", (False,))


# Fields of OpenAI's and vLLM's requests that change the output and are not implemented: each one's no-op value (None:
# none but leaving it out). A client sending the no-op is served; any other value is a 400 naming the field.
NOT_IMPLEMENTED: dict[str, Any] = {
    "use_beam_search": False,
    "guided_whitespace_pattern": None,  # vLLM's JSON whitespace rule: `disable_any_whitespace` is served instead
    "structural_tag": None,
    # vLLM's output and prompt controls (ignored as unknown fields until wave 54: a 200 with other text)
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "truncate_prompt_tokens": None,
    "logits_processors": None,
    "prompt_logprobs": None,  # vLLM's per-choice prompt log-probabilities (here: `echo` with `logprobs`)
    "return_tokens_as_token_ids": False,
    "priority": 0,
    "best_of": 1,
}
CHAT_NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "modalities": (["text"],),
    "audio": (),
}
# apply_chat_template's own arguments: not template variables (chat_template_kwargs reach the template only)
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip


def response_format_constraint(value: Any) -> OutputConstraint | None:
    """OpenAI's `response_format`: {"type": "text"} (free text), {"type": "json_object"} (JSON mode) or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}."""
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        kind = value.get("type") if isinstance(value, dict) else None
        raise ValueError(f'type {kind!r} is not supported: send "text", "json_object" or "json_schema"')
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return OutputConstraint.of(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ValueError('json_schema needs {"name": ..., "schema": {...}} with the schema as an object')
    return OutputConstraint.of(json=spec["schema"])


def structured_outputs_constraint(value: Any) -> OutputConstraint | None:
    """vLLM's `structured_outputs`: {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": ...} |
    {"json_object": true}. Its options that would change the grammar (whitespace, backend choice) are refused."""
    if not isinstance(value, dict):
        raise ValueError('must be an object such as {"json": {...}}, {"regex": ...} or {"choice": [...]}')
    kinds = {key: value[key] for key in ("json", "regex", "choice", "grammar", "json_object") if key in value}
    compact = value.get("disable_any_whitespace") or False
    served = {*kinds, "disable_any_whitespace"}
    others = sorted(key for key, option in value.items() if key not in served and option not in (None, False, ""))
    if others:
        raise ValueError(
            f"{', '.join(others)} not supported: send json, regex, choice, grammar or json_object "
            "(and disable_any_whitespace)"
        )
    return OutputConstraint.of(**kinds, disable_any_whitespace=compact)


STRUCTURED_OUTPUT_FIELDS: dict[str, Callable[[Any], OutputConstraint | None]] = {
    "response_format": response_format_constraint,
    "structured_outputs": structured_outputs_constraint,
    "guided_json": lambda value: OutputConstraint.of(json=value),
    "guided_regex": lambda value: OutputConstraint.of(regex=value),
    "guided_choice": lambda value: OutputConstraint.of(choice=value),
    "guided_grammar": lambda value: OutputConstraint.of(grammar=value),
}


def _token_biases(value: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's logit_bias, whose keys are token ids written as strings."""
    try:
        biases = {int(key): bias for key, bias in (value or {}).items()}
    except ValueError:
        raise invalid("keys must be token ids (integers, written as strings)") from None
    if len(biases) < len(value or {}):  # "5" and "05": one token, two biases
        raise invalid("a token id appears twice (written two ways)")
    return biases


class CalispecParams(OpenAIModel):
    """Sampling and speculative-decoding parameters shared by both endpoints."""

    model: str
    max_tokens: int | None = None  # unset: the server's default
    temperature: float = 1.0  # OpenAI's default; 0 is greedy
    top_p: float = 1.0  # OpenAI's 0 (the most likely token only) becomes MIN_TOP_P: 0 is "off" inside
    n: int = 1  # choices per prompt: independent generations (a seed gives choice i seed + i, as vLLM's)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None  # only with stream: true (as OpenAI)
    user: str | None = None
    # Calispec's own (extra body fields)
    top_k: int = 0  # 0 or -1 (vLLM's "off"): off
    mode: ModeName | None = None
    gamma: int | None = None  # speculative tokens per round
    tau: float | None = None
    lambda_: int | None = Field(default=None, alias="lambda")
    return_token_ids: bool = False  # vLLM's extension: each choice carries its new token ids
    ignore_eos: bool = False  # vLLM's extension: go on past EOS to the token limit (fixed-length load tests)
    stop_token_ids: list[StrictInt] | None = None  # vLLM's extension: a new token among them ends the choice (kept)
    # OpenAI's and vLLM's logit rules (`logit_rules`: calispec_core/logit_rules.py)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: StrictInt = 0
    logit_bias: dict[str, float] | None = None  # token ids (as strings) -> bias
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[StrictStr] | None = None
    # Structured output (`output_constraint`): OpenAI's JSON mode and schemas, vLLM's `structured_outputs` and its
    # older `guided_*` fields; one of them a request. Each becomes an OutputConstraint here (or None: free text).
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # vLLM's sampling extensions that change the output, not implemented: refused unless at their no-op values
    # (they were ignored, as unknown fields are: a request asking for a JSON shape got free text, with a 200)
    use_beam_search: Any = None
    structural_tag: Any = None
    guided_whitespace_pattern: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    logits_processors: Any = None
    prompt_logprobs: Any = None
    return_tokens_as_token_ids: Any = None
    priority: Any = None
    best_of: Any = None

    @field_validator(*STRUCTURED_OUTPUT_FIELDS)
    @classmethod
    def _structured_output(cls, value: Any, info: ValidationInfo) -> OutputConstraint | None:
        """The field's constraint (None: free text); at most one of these fields a request (the first one set wins
        the error: the later is named)."""
        field = info.field_name or ""
        try:
            constraint = STRUCTURED_OUTPUT_FIELDS[field](value) if value is not None else None
        except ValueError as exc:
            raise invalid(str(exc)) from None
        if constraint is not None:
            with domain_checked():
                check_constraint(constraint)
            earlier = next((name for name in STRUCTURED_OUTPUT_FIELDS if info.data.get(name) is not None), None)
            if earlier is not None:
                raise invalid(f"a request has one structured output: {earlier} is set already")
        return constraint

    def output_constraint(self) -> OutputConstraint | None:
        """The grammar the reply must follow (structured output), or None."""
        return next((getattr(self, name) for name in STRUCTURED_OUTPUT_FIELDS if getattr(self, name) is not None), None)

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        return _token_count(value)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float) -> float:
        with domain_checked():
            check_sampling(temperature=value)
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float) -> float:
        with domain_checked():
            check_sampling(top_p=value)
        return MIN_TOP_P if value == 0 else value  # OpenAI's 0 keeps the most likely token; inside, 0 is "off"

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        with domain_checked():
            check_stop_strings(strings)
            # JSON's \ud800 escapes carry lone surrogates, which UTF-8 cannot encode: such a stop string never
            # matches generated text (always valid Unicode), and fails where the text is encoded
            for i, s in enumerate(strings):
                require_unicode(s, f"stop string {i}")
        return value

    @field_validator("n")
    @classmethod
    def _n(cls, value: int) -> int:
        if not 1 <= value <= MAX_CHOICES:
            raise invalid(f"must be in [1, {MAX_CHOICES}] (choices per request), got {value}")
        return value

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None, info: ValidationInfo) -> int | None:
        with domain_checked():
            check_sampling(seed=value)
        n = info.data.get("n", 1)
        if value is not None and value + n > SEED_BOUND:  # choice i samples with seed + i
            raise invalid(f"with n = {n}, seed + n - 1 must be below 2**63 (choice i samples with seed + i)")
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise invalid("only allowed with stream: true")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value == -1:  # vLLM's (and LangChain's VLLMOpenAI default) "off"
            return 0
        with domain_checked():
            check_sampling(top_k=value)
        return value

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, value: int | None) -> int | None:
        with domain_checked():
            check_speculative_tokens(value)
        return value

    @field_validator("tau")
    @classmethod
    def _tau(cls, value: float | None) -> float | None:
        with domain_checked():
            check_csd_thresholds(tau=value)  # as given, and as the target's float32 gets it
        return value

    @field_validator("lambda_")
    @classmethod
    def _lambda(cls, value: int | None) -> int | None:
        with domain_checked():
            check_csd_thresholds(lambda_=value)
        return value

    @field_validator("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens")
    @classmethod
    def _logit_rule(cls, value: float, info: ValidationInfo) -> float:
        with domain_checked():
            LogitRules(**{info.field_name or "": value}).validate()
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        with domain_checked():
            LogitRules.of(logit_bias=_token_biases(value)).validate()
        return value

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise invalid("must hold at least one token id (leave it out for every token)")
        with domain_checked():
            LogitRules.of(allowed_token_ids=value).validate()
        return value

    @field_validator("bad_words")
    @classmethod
    def _bad_words(cls, value: list[str] | None) -> list[str] | None:
        with domain_checked():
            LogitRules.of(bad_words=value).validate()
        return value

    def logit_rules(self) -> LogitRules | None:
        """The request's penalties, logit bias, min_p, allowed ids, bad words and min_tokens; None when they change
        nothing."""
        rules = LogitRules.of(
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
            logit_bias=_token_biases(self.logit_bias),
            allowed_token_ids=self.allowed_token_ids,
            min_tokens=self.min_tokens,
            bad_words=self.bad_words,
        )
        return rules if rules.active else None

    @field_validator(*NOT_IMPLEMENTED, mode="before")
    @classmethod
    def _not_implemented(cls, value: Any, info: ValidationInfo) -> Any:
        noop = NOT_IMPLEMENTED[info.field_name or ""]
        if value is not None and (value != noop or isinstance(value, bool) != isinstance(noop, bool)):
            shown = "leave it out" if noop is None else f"send {json.dumps(noop)} or leave it out"
            raise invalid(f"{info.field_name} is not supported: {shown}")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, value: list[int] | None) -> list[int] | None:
        with domain_checked():
            check_stop_token_ids(value or [])
        return value

    prompt_field: ClassVar[str] = "prompt"  # what the context's refusal names when the prompt alone fills it

    def prompt_count(self) -> int:
        """Prompts the request continues: `n` choices each."""
        return 1

    def choice_count(self) -> int:
        return self.prompt_count() * self.n

    def requested_logprobs(self) -> int | None:
        """None: no log-probabilities; k: each new token's and the k most likely tokens at its position."""
        return None

    def requested_prompt_logprobs(self) -> int | None:
        """None: none; k: each prompt token's (from the second) and the k most likely tokens at its position."""
        return None

    def token_limit(self) -> int | None:
        """The completion's token limit the client sent (None: the server's default)."""
        return self.max_tokens

    def token_limit_field(self) -> str:
        """The field that carries `token_limit()`, as a 400 names it."""
        return "max_tokens"

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(CalispecParams):
    # a text, one tokenized prompt, a batch of either: choice k is prompt k // n's choice k % n. Tried in this order
    # (strict ints: a text "5" is no token id), so a long list of ids is not first tried, item by item, as texts.
    prompt: str | TokenIds | list[TokenIds] | list[str] = Field(union_mode="left_to_right")
    echo: bool = False  # the prompt before each choice's text (and, with logprobs, its tokens' log-probabilities)
    logprobs: int | None = None  # each new token's log-probability and this many most likely (legacy API: an int)
    suffix: Any = None  # not implemented: "" only (OpenAI's no-op)

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value: int | None) -> int | None:
        with domain_checked():
            check_logprobs(value)
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        return noop_only(value, "suffix", ("",))

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_forms(cls, value: Any, info: ValidationInfo) -> Any:
        """OpenAI's four forms, each checked whole (a mixture gets a message of its own), and the request's size
        before any item is validated: at most MAX_CHOICES choices, MAX_PROMPT_TOKEN_IDS ids in all. A text is checked
        here as /tokenize checks it (empty, too long, not valid Unicode), so its 400 names `prompt` (it had none)."""
        if isinstance(value, str):
            with domain_checked():
                validate_prompt(value)
        if not isinstance(value, list):
            return value
        if not value:
            raise invalid("send at least one prompt")
        if len(value) > MAX_PROMPT_TOKEN_IDS:  # before any item is looked at (one list of ids, or far too many prompts)
            raise invalid(f"at most {MAX_PROMPT_TOKEN_IDS} token ids in all")
        # numbers alone are one prompt of ids, each checked below (`[-1]` was "a mixture")
        prompts = [value] if all(isinstance(p, int | float) for p in value) else value
        n = info.data.get("n", 1)
        if len(prompts) * n > MAX_CHOICES:
            raise invalid(
                f"{len(prompts)} prompts x n = {n} make {len(prompts) * n} choices; at most {MAX_CHOICES} a request"
            )
        if all(isinstance(p, str) for p in prompts):
            for i, text in enumerate(prompts):
                try:
                    validate_prompt(text)
                except InvalidArgument as exc:
                    raise invalid(f"prompt {i}: {exc}") from None
            return value
        if not all(isinstance(p, list) for p in prompts):
            raise invalid("a text, a list of texts, a list of token ids or a list of such lists; not a mixture")
        if sum(map(len, prompts)) > MAX_PROMPT_TOKEN_IDS:
            raise invalid(f"at most {MAX_PROMPT_TOKEN_IDS} token ids in all")
        for i, ids in enumerate(prompts):
            bad = next((t for t in ids if not is_token_id(t)), None) if ids else None
            if not ids or bad is not None:
                got = f", got {json.dumps(bad)}" if ids else ""
                raise invalid(f"prompt {i} must be a non-empty list of token ids (integers >= 0){got}")
        return value

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a text, or token ids."""
        return prompt_list(self.prompt)

    def prompt_count(self) -> int:
        return len(self.prompts())

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def requested_prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None


def is_token_id(value: Any) -> bool:
    return type(value) is int and value >= 0  # not a bool (an int subclass)


def prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a `prompt` field's value: one text, one list of token ids, or a list of either."""
    if isinstance(prompt, str) or (prompt and is_token_id(prompt[0])):
        return [prompt]  # type: ignore[list-item]
    return list(prompt)  # type: ignore[arg-type]


def text_of_parts(parts: list[Any]) -> str:
    """A message's content parts as one text, as vLLM renders them for a text-only chat template: the
    text parts joined with newlines; any other part (an image, audio, a file) is refused."""
    texts = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            what = f"has type {kind!r}" if isinstance(kind, str) else "is not a content part with a type"
            raise invalid(f"part {i} {what}: only text parts are supported (the model reads text only)")
        if not isinstance(part.get("text"), str):
            raise invalid(f"part {i} is a text part without a text string")
        texts.append(part["text"])
    return "\n".join(texts)


class FunctionCallIn(OpenAIModel):
    name: str
    arguments: str  # a JSON object's text, as OpenAI's API carries it


class ToolCallIn(OpenAIModel):
    """A call in an assistant message of the conversation sent (OpenAI's form)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(OpenAIModel):
    role: str  # OpenAI's "developer" is taken as "system"; coordinator.chat checks the rest
    # a string, or a list of text parts (joined into one string); null or absent only on an assistant
    # message (then ""). Always a str once validated.
    content: str = Field(default=None, validate_default=True)  # type: ignore[assignment]
    name: str | None = None  # accepted and ignored (chat templates do not render it)
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls (with a --tool-call-parser only)
    tool_call_id: str | None = None  # a tool message's answer to a call (passed to the template)
    function_call: Any = None  # the deprecated form of tool_calls: only null

    @field_validator("role", mode="before")
    @classmethod
    def _developer_is_system(cls, value: Any) -> Any:
        return "system" if value == "developer" else value

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            if info.data.get("role") == "assistant":
                return ""
            raise invalid("must be a string or a list of text parts (null only on an assistant message)")
        return text_of_parts(value) if isinstance(value, list) else value

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, value: Any) -> Any:
        if value:
            raise invalid("function_call is not supported: send tool_calls (or leave it out)")
        return value


def not_forced(value: Any) -> Any:
    """function_call (the deprecated tool_choice): "none" or "auto" only."""
    if value is not None and value not in ("none", "auto"):
        shown = f'"{value}"' if isinstance(value, str) else "a named function"
        raise invalid(f'{shown} is not supported: {NO_FORCED_CALLS} (send "none" or "auto", or leave it out)')
    return value


def names_a_function(value: Any) -> bool:
    """{"type": "function", "function": {"name": ..., ...}}: a tool, or tool_choice naming one."""
    if not isinstance(value, dict) or value.get("type") != "function":
        return False
    function = value.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


def named_function(value: Any) -> Any:
    """tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name": ...}}."""
    if isinstance(value, dict) and not names_a_function(value):
        raise invalid('a named function is {"type": "function", "function": {"name": ...}}')
    return value


class ChatRendering(OpenAIModel):
    """How chat messages become the prompt (vLLM's fields): an open assistant turn ends it, or the last message is
    left open for the reply to continue (assistant prefill); the model's own template only."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: Any = None
    chat_template_kwargs: dict[str, Any] | None = None  # the model's template's variables (Qwen3's enable_thinking)
    # Tool calls are the model's own choice ("auto", where the coordinator parses them: OpenAIApi.check_tools), none,
    # or forced ("required": one call or more; a named function: that one): a forced reply's structured output makes
    # it JSON of the calls' shape (coordinator/tool_calls.py), read without a parser.
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # functions the model may call (with tool_choice "none": not rendered)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _named_function(cls, value: Any) -> Any:
        return named_function(value)

    def calls_tools(self) -> bool:
        """Whether the model may call the tools sent (they are rendered and its reply parsed for calls)."""
        return bool(self.tools) and self.tool_choice != "none"

    def forced_call(self) -> ToolChoice | None:
        """The call the reply must be ("required", or a named function's tool_choice); None: the model's choice."""
        return self.tool_choice if self.tool_choice not in (None, "none", "auto") else None

    def rendered_tools(self) -> list[dict[str, Any]] | None:
        return self.tools if self.calls_tools() else None

    @field_validator("tools")
    @classmethod
    def _function_definitions(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(value or []):
            if not names_a_function(tool):
                raise invalid(f'tool {i} must be {{"type": "function", "function": {{"name": ..., ...}}}}')
            function = tool["function"]
            if function.get("parameters") is not None and not isinstance(function["parameters"], dict):  # a schema
                raise invalid(f"tool {i}'s parameters must be a JSON schema object")
        return value

    @field_validator("continue_final_message")
    @classmethod
    def _one_end(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("add_generation_prompt", True):  # vLLM's rule
            raise invalid(
                "cannot set both continue_final_message and add_generation_prompt to true "
                "(send add_generation_prompt: false to continue the last message)"
            )
        return value

    @field_validator("chat_template", mode="before")
    @classmethod
    def _model_template_only(cls, value: Any) -> Any:
        return noop_only(value, "chat_template", ())  # a client's own Jinja template: the model's only

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if reserved := sorted(RESERVED_TEMPLATE_KWARGS & set(value or ())):
            raise invalid(f"{', '.join(reserved)}: not a template variable (a field of the request, or not one)")
        return value


class ChatCompletionRequest(CalispecParams, ChatRendering):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False  # each new token's log-probability
    top_logprobs: int | None = None  # and this many most likely tokens at each position (needs logprobs)
    # function_call comes before functions so that the second's check sees the first
    function_call: Literal["none", "auto"] | None = None  # OpenAI's deprecated tool_choice
    functions: list[Any] | None = None  # OpenAI's deprecated tools
    # vLLM's chat echo and OpenAI's audio output: not implemented, refused unless at their no-op values
    echo: Any = None
    modalities: Any = None
    audio: Any = None

    @field_validator("max_completion_tokens")
    @classmethod
    def _max_completion_tokens(cls, value: int | None) -> int | None:
        return _token_count(value)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        with domain_checked():
            check_logprobs(value, "top_logprobs")
        # OpenAI's rule (0 with logprobs off is a no-op); a logprobs that failed its own check is reported alone
        if value and "logprobs" in info.data and not info.data["logprobs"]:
            raise invalid("needs logprobs: true")
        return value

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("function_call", mode="before")
    @classmethod
    def _cannot_force_a_function_call(cls, value: Any) -> Any:
        return not_forced(value)

    @field_validator("functions")
    @classmethod
    def _functions_unused(cls, value: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        if value and info.data.get("function_call") != "none":
            raise invalid('functions are not supported: send tools, or function_call "none" (then plain text)')
        return value

    @field_validator(*CHAT_NOT_IMPLEMENTED, mode="before")
    @classmethod
    def _chat_not_implemented(cls, value: Any, info: ValidationInfo) -> Any:
        return noop_only(value, info.field_name or "", CHAT_NOT_IMPLEMENTED[info.field_name or ""])

    prompt_field: ClassVar[str] = "messages"

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def output_constraint(self) -> OutputConstraint | None:
        """A forced call's JSON (OpenAIApi.check_tools refuses one beside another structured output)."""
        forced = self.forced_call()
        if forced is None or not self.tools:
            return super().output_constraint()
        return OutputConstraint.of(json=forced_call_schema(self.tools, forced))

    def token_limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


def context_overflow(prompt_tokens: int, max_tokens: int | None, context_length: int) -> str | None:
    """vLLM's refusal (its wording, for both endpoints) of a request that does not fit the context, or None
    when it fits. With max_tokens set, the prompt plus max_tokens must fit: cut short instead, it would end
    "length" with fewer tokens than asked for. Unset, the prompt must leave room for one token (the server's
    default is then cut to the room left)."""
    limit = f"This model's maximum context length is {context_length} tokens. However, you requested"
    if max_tokens is None:
        if prompt_tokens < context_length:
            return None
        return f"{limit} {prompt_tokens} tokens in the messages, Please reduce the length of the messages."
    if prompt_tokens + max_tokens <= context_length:
        return None
    return (
        f"{limit} {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
        "completion). Please reduce the length of the messages or completion."
    )


# pydantic's union-member tags in an error's location (prompt.str, stop.list[str]): not OpenAI parameters
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def openai_param(loc: Sequence[int | str]) -> str | None:
    """A pydantic error location as OpenAI names the parameter: ("body", "messages", 0, "content") is
    `messages[0].content`; the leading "body" and union-member tags (`str`, `list[str]`) are dropped."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif (part == "body" and not param) or not _FIELD_NAME.fullmatch(part) or part in _TYPE_TAGS:
            continue
        else:
            param += f".{part}" if param else part
    return param or None


def validation_error(error: Mapping[str, Any]) -> tuple[str, str | None]:
    """The message and `param` of OpenAI's error body for one of pydantic's errors (a request that fails
    its schema): "max_tokens: must be in [1, 8192], got 0" and "max_tokens"."""
    param = openai_param(error.get("loc", ()))
    return f"{param or 'body'}: {error.get('msg', 'invalid request')}", param


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


def openai_finish_reason(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    """EOS and stop strings are both OpenAI's "stop"."""
    if reason is None:
        return None
    return "length" if reason == FinishReason.LENGTH else "stop"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class CompletionLogprobs(BaseModel):
    """The completions API's form: per token its text, log-probability, the most likely tokens at its position
    (text -> log-probability, the token itself among them, as vLLM's) and where its text starts in the choice's."""

    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token (nothing before it to condition on)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]  # the token's text in UTF-8


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # most likely first


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None  # with return_token_ids


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object's text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(ToolCall):
    index: int  # the call's place among the choice's calls (a stream sends each call whole, once)


class OmitsNullToolCalls(BaseModel):
    """`tool_calls` is left out unless the model made calls: a reply without calls has OpenAI's plain shape."""

    tool_calls: list[Any] | None = None

    @model_serializer(mode="wrap")
    def _calls_when_made(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class AssistantMessage(OmitsNullToolCalls):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None: a reply of tool calls alone
    tool_calls: list[ToolCall] | None = None  # only when the model called tools


ChatFinish = Literal["stop", "length", "tool_calls"]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: ChatFinish | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(OmitsNullToolCalls):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None  # the choice's calls, whole, in its last chunk


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: ChatFinish | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "calispec"
    # vLLM's field: the longest prompt plus completion a request may ask for (clients size requests by it)
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
