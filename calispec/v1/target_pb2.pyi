from calispec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TargetPrefillRequest(_message.Message):
    __slots__ = ("session_id", "token_ids", "sampling", "mode", "rescue", "prompt_logprobs", "constraint", "output_written", "rules")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RESCUE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    mode: _common_pb2.Mode
    rescue: _common_pb2.RescueParams
    prompt_logprobs: int
    constraint: _common_pb2.OutputConstraint
    output_written: int
    rules: _common_pb2.LogitRules
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., rescue: _Optional[_Union[_common_pb2.RescueParams, _Mapping]] = ..., prompt_logprobs: _Optional[int] = ..., constraint: _Optional[_Union[_common_pb2.OutputConstraint, _Mapping]] = ..., output_written: _Optional[int] = ..., rules: _Optional[_Union[_common_pb2.LogitRules, _Mapping]] = ...) -> None: ...

class TargetPrefillResponse(_message.Message):
    __slots__ = ("timing", "prompt_logprobs")
    TIMING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    timing: _common_pb2.Timing
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, timing: _Optional[_Union[_common_pb2.Timing, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "draft_token_ids", "draft_probs", "draft_vocab_size", "draft_sparse_probs", "cohort", "logprobs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SPARSE_PROBS_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: bytes
    draft_vocab_size: int
    draft_sparse_probs: _common_pb2.SparseDistributions
    cohort: int
    logprobs: int
    def __init__(self, session_id: _Optional[str] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[bytes] = ..., draft_vocab_size: _Optional[int] = ..., draft_sparse_probs: _Optional[_Union[_common_pb2.SparseDistributions, _Mapping]] = ..., cohort: _Optional[int] = ..., logprobs: _Optional[int] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("accepted_count", "rescued_positions", "next_token_id", "next_is_bonus", "rejections", "timing", "batch_size", "batch_tokens", "withheld_rescues", "logprobs")
    ACCEPTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESCUED_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_IS_BONUS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_RESCUES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    accepted_count: int
    rescued_positions: _containers.RepeatedScalarFieldContainer[int]
    next_token_id: int
    next_is_bonus: bool
    rejections: int
    timing: _common_pb2.Timing
    batch_size: int
    batch_tokens: int
    withheld_rescues: int
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, accepted_count: _Optional[int] = ..., rescued_positions: _Optional[_Iterable[int]] = ..., next_token_id: _Optional[int] = ..., next_is_bonus: _Optional[bool] = ..., rejections: _Optional[int] = ..., timing: _Optional[_Union[_common_pb2.Timing, _Mapping]] = ..., batch_size: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., withheld_rescues: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class TargetCloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class TargetCloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetModelInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ModelInfo
    def __init__(self, info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class TargetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetStatsResponse(_message.Message):
    __slots__ = ("sessions", "memory_version", "memory_pairs", "memory_pairs_skipped")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PAIRS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PAIRS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    sessions: _common_pb2.SessionStats
    memory_version: int
    memory_pairs: int
    memory_pairs_skipped: int
    def __init__(self, sessions: _Optional[_Union[_common_pb2.SessionStats, _Mapping]] = ..., memory_version: _Optional[int] = ..., memory_pairs: _Optional[int] = ..., memory_pairs_skipped: _Optional[int] = ...) -> None: ...
