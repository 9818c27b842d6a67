from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_AR: _ClassVar[Mode]
    MODE_SD: _ClassVar[Mode]
    MODE_CSD: _ClassVar[Mode]
    MODE_OCM_ONLY: _ClassVar[Mode]
    MODE_SCG_ONLY: _ClassVar[Mode]
MODE_UNSPECIFIED: Mode
MODE_AR: Mode
MODE_SD: Mode
MODE_CSD: Mode
MODE_OCM_ONLY: Mode
MODE_SCG_ONLY: Mode

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class RescueParams(_message.Message):
    __slots__ = ("tau", "lambda_")
    TAU_FIELD_NUMBER: _ClassVar[int]
    LAMBDA__FIELD_NUMBER: _ClassVar[int]
    tau: float
    lambda_: int
    def __init__(self, tau: _Optional[float] = ..., lambda_: _Optional[int] = ...) -> None: ...

class OutputConstraint(_message.Message):
    __slots__ = ("kind", "spec", "choices", "disable_any_whitespace")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[OutputConstraint.Kind]
        KIND_JSON: _ClassVar[OutputConstraint.Kind]
        KIND_JSON_OBJECT: _ClassVar[OutputConstraint.Kind]
        KIND_REGEX: _ClassVar[OutputConstraint.Kind]
        KIND_CHOICE: _ClassVar[OutputConstraint.Kind]
        KIND_GRAMMAR: _ClassVar[OutputConstraint.Kind]
    KIND_UNSPECIFIED: OutputConstraint.Kind
    KIND_JSON: OutputConstraint.Kind
    KIND_JSON_OBJECT: OutputConstraint.Kind
    KIND_REGEX: OutputConstraint.Kind
    KIND_CHOICE: OutputConstraint.Kind
    KIND_GRAMMAR: OutputConstraint.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    DISABLE_ANY_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    kind: OutputConstraint.Kind
    spec: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    disable_any_whitespace: bool
    def __init__(self, kind: _Optional[_Union[OutputConstraint.Kind, str]] = ..., spec: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., disable_any_whitespace: _Optional[bool] = ...) -> None: ...

class LogitRules(_message.Message):
    __slots__ = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "logit_bias", "allowed_token_ids", "min_tokens", "end_token_ids", "bad_words", "bad_word_ids")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    END_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORD_IDS_FIELD_NUMBER: _ClassVar[int]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_tokens: int
    end_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    bad_word_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., min_tokens: _Optional[int] = ..., end_token_ids: _Optional[_Iterable[int]] = ..., bad_words: _Optional[_Iterable[str]] = ..., bad_word_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_token_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("total_ns", "forward_ns", "verify_ns", "memory_ns", "prefill_ns")
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_NS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_NS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_NS_FIELD_NUMBER: _ClassVar[int]
    total_ns: int
    forward_ns: int
    verify_ns: int
    memory_ns: int
    prefill_ns: int
    def __init__(self, total_ns: _Optional[int] = ..., forward_ns: _Optional[int] = ..., verify_ns: _Optional[int] = ..., memory_ns: _Optional[int] = ..., prefill_ns: _Optional[int] = ...) -> None: ...

class SparseDistributions(_message.Message):
    __slots__ = ("row_sizes", "token_ids", "probs")
    ROW_SIZES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    row_sizes: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, row_sizes: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "vocab_size", "tokenizer_fingerprint", "max_context", "dtype", "device", "eos_token_ids", "forward_costs", "fp32_linear", "structured_output", "logit_rules")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_COSTS_FIELD_NUMBER: _ClassVar[int]
    FP32_LINEAR_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LOGIT_RULES_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    vocab_size: int
    tokenizer_fingerprint: str
    max_context: int
    dtype: str
    device: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    forward_costs: _containers.RepeatedCompositeFieldContainer[ForwardCost]
    fp32_linear: str
    structured_output: bool
    logit_rules: bool
    def __init__(self, model_id: _Optional[str] = ..., vocab_size: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ..., max_context: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., forward_costs: _Optional[_Iterable[_Union[ForwardCost, _Mapping]]] = ..., fp32_linear: _Optional[str] = ..., structured_output: _Optional[bool] = ..., logit_rules: _Optional[bool] = ...) -> None: ...

class ForwardCost(_message.Message):
    __slots__ = ("new_tokens", "ms")
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    new_tokens: int
    ms: float
    def __init__(self, new_tokens: _Optional[int] = ..., ms: _Optional[float] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("open_sessions", "max_sessions", "idle_ttl_s", "reaped_sessions")
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    REAPED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    open_sessions: int
    max_sessions: int
    idle_ttl_s: float
    reaped_sessions: int
    def __init__(self, open_sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., idle_ttl_s: _Optional[float] = ..., reaped_sessions: _Optional[int] = ...) -> None: ...
