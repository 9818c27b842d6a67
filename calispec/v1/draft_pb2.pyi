from calispec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftPrefillRequest(_message.Message):
    __slots__ = ("session_id", "token_ids", "sampling", "constraint", "output_written", "rules")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    constraint: _common_pb2.OutputConstraint
    output_written: int
    rules: _common_pb2.LogitRules
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[_common_pb2.OutputConstraint, _Mapping]] = ..., output_written: _Optional[int] = ..., rules: _Optional[_Union[_common_pb2.LogitRules, _Mapping]] = ...) -> None: ...

class DraftPrefillResponse(_message.Message):
    __slots__ = ("timing",)
    TIMING_FIELD_NUMBER: _ClassVar[int]
    timing: _common_pb2.Timing
    def __init__(self, timing: _Optional[_Union[_common_pb2.Timing, _Mapping]] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "num_tokens", "rollback_to", "append_token_ids", "min_confidence", "cohort", "min_path_confidence")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_TO_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    MIN_PATH_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    num_tokens: int
    rollback_to: int
    append_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_confidence: float
    cohort: int
    min_path_confidence: float
    def __init__(self, session_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., rollback_to: _Optional[int] = ..., append_token_ids: _Optional[_Iterable[int]] = ..., min_confidence: _Optional[float] = ..., cohort: _Optional[int] = ..., min_path_confidence: _Optional[float] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("token_ids", "token_probs", "probs", "vocab_size", "timing", "sparse_probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PROBS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    SPARSE_PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_probs: _containers.RepeatedScalarFieldContainer[float]
    probs: bytes
    vocab_size: int
    timing: _common_pb2.Timing
    sparse_probs: _common_pb2.SparseDistributions
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., token_probs: _Optional[_Iterable[float]] = ..., probs: _Optional[bytes] = ..., vocab_size: _Optional[int] = ..., timing: _Optional[_Union[_common_pb2.Timing, _Mapping]] = ..., sparse_probs: _Optional[_Union[_common_pb2.SparseDistributions, _Mapping]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("session_id", "length", "append_token_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    append_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ..., append_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("length",)
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    length: int
    def __init__(self, length: _Optional[int] = ...) -> None: ...

class DraftCloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DraftCloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftModelInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ModelInfo
    def __init__(self, info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class DraftStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftStatsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _common_pb2.SessionStats
    def __init__(self, sessions: _Optional[_Union[_common_pb2.SessionStats, _Mapping]] = ...) -> None: ...
