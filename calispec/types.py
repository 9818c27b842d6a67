"""The SDK's request-level types: decoding modes, finish reasons, per-request statistics.

Enum values are the proto enums' (calispec.v1.Mode, calispec.v1.FinishReason); the serving
core re-exports these types, so the client and the services share one definition.
"""

from __future__ import annotations

import enum
import json as _json  # `json` is a field name of OutputConstraint.of
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from calispec.v1 import common_pb2, coordinator_pb2

REQUEST_ID_METADATA = "x-request-id"  # every service logs a request under this id
MAX_REQUEST_ID_CHARS = 256  # a verifier's memory flush carries several ids, comma-separated
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:,/+=@-]+")


def is_valid_request_id(value: str) -> bool:
    """Safe to log and to send as gRPC metadata: bounded, printable, no spaces or control characters."""
    return bool(value) and len(value) <= MAX_REQUEST_ID_CHARS and _REQUEST_ID.fullmatch(value) is not None


class Mode(enum.IntEnum):
    """Decoding modes."""

    AR = common_pb2.MODE_AR  # target only
    SD = common_pb2.MODE_SD  # standard speculative decoding (lossless)
    CSD = common_pb2.MODE_CSD  # calibrated speculative decoding (lossy)
    OCM_ONLY = common_pb2.MODE_OCM_ONLY  # ablation: memory count test only
    SCG_ONLY = common_pb2.MODE_SCG_ONLY  # ablation: logit gate only

    @classmethod
    def parse(cls, name: str) -> Mode:
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"unknown mode {name!r}; choose one of {choices}") from None


MODE_NAMES = tuple(m.name.lower() for m in Mode)


class FinishReason(enum.IntEnum):
    LENGTH = coordinator_pb2.FINISH_REASON_LENGTH  # max_new_tokens or the context limit
    EOS = coordinator_pb2.FINISH_REASON_EOS
    STOP = coordinator_pb2.FINISH_REASON_STOP  # a stop string


@dataclass
class GenerationStats:
    """Where a request's tokens and milliseconds went (fields mirror calispec.v1.GenerationStats)."""

    prompt_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0  # includes rescued
    rescued: int = 0
    emitted: int = 0
    draft_ms: float = 0.0
    target_ms: float = 0.0
    memory_ms: float = 0.0
    coordinator_ms: float = 0.0
    total_ms: float = 0.0
    acceptance_rate: float = 0.0
    rejections: int = 0  # rejection events recorded in the correction memory (includes rescued)
    max_batch_size: int = 0  # largest target batch any round of the request ran in
    draft_unavailable_rounds: int = 0  # rounds run target-only because the draft was unavailable
    target_failovers: int = 0  # times the request moved to another target replica
    mean_gamma: float = 0.0  # draft tokens asked for per round (0 in target-only rounds)
    target_only_rounds: int = 0  # rounds without a draft (ar, γ = 0 where drafting would lose, draft down)
    round_overhead_ms: float = 0.0  # round time outside the two models' forwards
    withheld_rescues: int = 0  # rejections CSD would have rescued but the meaning guard refused

    @property
    def degraded(self) -> bool:
        """Served despite a failed service: some rounds without the draft, or moved to another replica."""
        return self.draft_unavailable_rounds > 0 or self.target_failovers > 0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target: the log-softmax of its raw logits at that position
    (before temperature, top-k and top-p, as vLLM's default), with the `top` most likely tokens there when asked."""

    logprob: float
    top_token_ids: tuple[int, ...] = ()  # most likely first
    top_logprobs: tuple[float, ...] = ()

    @classmethod
    def from_pb(cls, msg: common_pb2.TokenLogprobs) -> TokenLogprob:
        return cls(msg.logprob, tuple(msg.top_token_ids), tuple(msg.top_logprobs))

    def to_pb(self) -> common_pb2.TokenLogprobs:
        return common_pb2.TokenLogprobs(
            logprob=self.logprob, top_token_ids=self.top_token_ids, top_logprobs=self.top_logprobs
        )


class ConstraintKind(enum.IntEnum):
    """What an `OutputConstraint` holds; the values are calispec.v1.OutputConstraint.Kind's."""

    JSON = common_pb2.OutputConstraint.KIND_JSON  # a JSON schema
    JSON_OBJECT = common_pb2.OutputConstraint.KIND_JSON_OBJECT  # any JSON object
    REGEX = common_pb2.OutputConstraint.KIND_REGEX
    CHOICE = common_pb2.OutputConstraint.KIND_CHOICE  # one of a list of strings
    GRAMMAR = common_pb2.OutputConstraint.KIND_GRAMMAR  # a Lark grammar (llguidance's dialect)


@dataclass(frozen=True)
class OutputConstraint:
    """Structured output, as vLLM's `structured_outputs`: the grammar a request's new tokens must follow.

    Build one with `OutputConstraint.of(json=...)` (a JSON schema, as a dict or its text), `regex=`, `choice=`
    (a list of strings), `grammar=` (Lark) or `json_object=True`: exactly one of them."""

    kind: ConstraintKind
    spec: str = ""  # the JSON schema's text, the regex or the grammar; "" for JSON_OBJECT and CHOICE
    choices: tuple[str, ...] = ()  # CHOICE's strings
    disable_any_whitespace: bool = False  # JSON kinds: compact JSON, no whitespace outside strings (vLLM's option)

    @classmethod
    def of(
        cls,
        *,
        json: str | Mapping[str, Any] | None = None,
        regex: str | None = None,
        choice: Sequence[str] | None = None,
        grammar: str | None = None,
        json_object: bool | None = None,
        disable_any_whitespace: bool = False,
    ) -> OutputConstraint:
        """vLLM's StructuredOutputsParams fields (unset: None; `json_object` False counts as unset). ValueError names
        what is wrong: none or several set, a field of the wrong type. `disable_any_whitespace`: compact JSON (JSON
        kinds only)."""
        if not isinstance(disable_any_whitespace, bool):
            raise ValueError("disable_any_whitespace must be true or false")
        return replace(
            cls._of(json, regex, choice, grammar, json_object), disable_any_whitespace=disable_any_whitespace
        )

    @classmethod
    def _of(
        cls,
        json: str | Mapping[str, Any] | None,
        regex: str | None,
        choice: Sequence[str] | None,
        grammar: str | None,
        json_object: bool | None,
    ) -> OutputConstraint:
        given = {
            "json": json,
            "regex": regex,
            "choice": choice,
            "grammar": grammar,
            "json_object": json_object or None,
        }
        named = [name for name, value in given.items() if value is not None]
        if len(named) != 1:
            raise ValueError(f"set exactly one of json, regex, choice, grammar, json_object (got {named or 'none'})")
        if json is not None:
            return cls(ConstraintKind.JSON, _schema_text(json))
        if regex is not None:
            return cls(ConstraintKind.REGEX, _text("regex", regex))
        if grammar is not None:
            return cls(ConstraintKind.GRAMMAR, _text("grammar", grammar))
        if choice is not None:
            if isinstance(choice, str) or not all(isinstance(c, str) for c in choice):
                raise ValueError("choice must be a list of strings")
            return cls(ConstraintKind.CHOICE, choices=tuple(choice))
        if json_object is not True:
            raise ValueError("json_object must be true or unset")
        return cls(ConstraintKind.JSON_OBJECT)

    @classmethod
    def from_pb(cls, msg: common_pb2.OutputConstraint) -> OutputConstraint:
        """ValueError for an unknown or unspecified kind."""
        if msg.kind not in ConstraintKind._value2member_map_:
            raise ValueError(f"unknown constraint kind {msg.kind}")
        return cls(ConstraintKind(msg.kind), msg.spec, tuple(msg.choices), msg.disable_any_whitespace)

    def to_pb(self) -> common_pb2.OutputConstraint:
        return common_pb2.OutputConstraint(
            kind=int(self.kind),
            spec=self.spec,
            choices=self.choices,
            disable_any_whitespace=self.disable_any_whitespace,
        )


def _schema_text(schema: object) -> str:
    """A JSON schema's text, from the schema or its text (which must hold a JSON object)."""
    if isinstance(schema, Mapping):
        return _json.dumps(schema)
    if not isinstance(schema, str):
        raise ValueError(f"json must be a JSON schema (an object, or its text), got {type(schema).__name__}")
    try:
        parsed = _json.loads(schema)
    except ValueError as exc:
        raise ValueError(f"json is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("json is nested too deeply") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"json must be a JSON schema (an object), got {type(parsed).__name__}")
    return schema


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {type(value).__name__}")
    return value
