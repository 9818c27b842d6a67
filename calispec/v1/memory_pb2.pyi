from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchUpdateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WATCH_UPDATE_KIND_UNSPECIFIED: _ClassVar[WatchUpdateKind]
    WATCH_UPDATE_KIND_SNAPSHOT: _ClassVar[WatchUpdateKind]
    WATCH_UPDATE_KIND_DELTA: _ClassVar[WatchUpdateKind]
    WATCH_UPDATE_KIND_HEARTBEAT: _ClassVar[WatchUpdateKind]
WATCH_UPDATE_KIND_UNSPECIFIED: WatchUpdateKind
WATCH_UPDATE_KIND_SNAPSHOT: WatchUpdateKind
WATCH_UPDATE_KIND_DELTA: WatchUpdateKind
WATCH_UPDATE_KIND_HEARTBEAT: WatchUpdateKind

class PairCount(_message.Message):
    __slots__ = ("draft_token_id", "target_token_id", "count")
    DRAFT_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    draft_token_id: int
    target_token_id: int
    count: int
    def __init__(self, draft_token_id: _Optional[int] = ..., target_token_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class RecordEventsRequest(_message.Message):
    __slots__ = ("namespace", "events", "wait_durable", "vocab_size", "only_if_empty", "write_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_DURABLE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_EMPTY_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    events: _containers.RepeatedCompositeFieldContainer[PairCount]
    wait_durable: bool
    vocab_size: int
    only_if_empty: bool
    write_id: str
    def __init__(self, namespace: _Optional[str] = ..., events: _Optional[_Iterable[_Union[PairCount, _Mapping]]] = ..., wait_durable: _Optional[bool] = ..., vocab_size: _Optional[int] = ..., only_if_empty: _Optional[bool] = ..., write_id: _Optional[str] = ...) -> None: ...

class RecordEventsResponse(_message.Message):
    __slots__ = ("recorded", "version", "durable")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    version: int
    durable: bool
    def __init__(self, recorded: _Optional[int] = ..., version: _Optional[int] = ..., durable: _Optional[bool] = ...) -> None: ...

class GetPairsRequest(_message.Message):
    __slots__ = ("namespace", "min_count", "max_pairs")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_PAIRS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    min_count: int
    max_pairs: int
    def __init__(self, namespace: _Optional[str] = ..., min_count: _Optional[int] = ..., max_pairs: _Optional[int] = ...) -> None: ...

class GetPairsResponse(_message.Message):
    __slots__ = ("pairs", "version")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    pairs: _containers.RepeatedCompositeFieldContainer[PairCount]
    version: int
    def __init__(self, pairs: _Optional[_Iterable[_Union[PairCount, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("namespace", "top_k")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    top_k: int
    def __init__(self, namespace: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class CountBucket(_message.Message):
    __slots__ = ("min_count", "max_count", "pairs", "events")
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    min_count: int
    max_count: int
    pairs: int
    events: int
    def __init__(self, min_count: _Optional[int] = ..., max_count: _Optional[int] = ..., pairs: _Optional[int] = ..., events: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("total_events", "distinct_pairs", "version", "table_events", "top_pairs", "top20_share", "count_histogram", "db_bytes", "max_pairs", "max_pairs_per_draft", "half_life_s", "vocab_size")
    TOTAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TABLE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TOP_PAIRS_FIELD_NUMBER: _ClassVar[int]
    TOP20_SHARE_FIELD_NUMBER: _ClassVar[int]
    COUNT_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    DB_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PAIRS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAIRS_PER_DRAFT_FIELD_NUMBER: _ClassVar[int]
    HALF_LIFE_S_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    total_events: int
    distinct_pairs: int
    version: int
    table_events: int
    top_pairs: _containers.RepeatedCompositeFieldContainer[PairCount]
    top20_share: float
    count_histogram: _containers.RepeatedCompositeFieldContainer[CountBucket]
    db_bytes: int
    max_pairs: int
    max_pairs_per_draft: int
    half_life_s: float
    vocab_size: int
    def __init__(self, total_events: _Optional[int] = ..., distinct_pairs: _Optional[int] = ..., version: _Optional[int] = ..., table_events: _Optional[int] = ..., top_pairs: _Optional[_Iterable[_Union[PairCount, _Mapping]]] = ..., top20_share: _Optional[float] = ..., count_histogram: _Optional[_Iterable[_Union[CountBucket, _Mapping]]] = ..., db_bytes: _Optional[int] = ..., max_pairs: _Optional[int] = ..., max_pairs_per_draft: _Optional[int] = ..., half_life_s: _Optional[float] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceInfo(_message.Message):
    __slots__ = ("namespace", "distinct_pairs", "table_events", "total_events", "version")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    TABLE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    distinct_pairs: int
    table_events: int
    total_events: int
    version: int
    def __init__(self, namespace: _Optional[str] = ..., distinct_pairs: _Optional[int] = ..., table_events: _Optional[int] = ..., total_events: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class ListNamespacesResponse(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceInfo]
    def __init__(self, namespaces: _Optional[_Iterable[_Union[NamespaceInfo, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("namespace", "resume_version", "vocab_size")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESUME_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    resume_version: int
    vocab_size: int
    def __init__(self, namespace: _Optional[str] = ..., resume_version: _Optional[int] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("kind", "version", "pairs", "last_chunk")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    kind: WatchUpdateKind
    version: int
    pairs: _containers.RepeatedCompositeFieldContainer[PairCount]
    last_chunk: bool
    def __init__(self, kind: _Optional[_Union[WatchUpdateKind, str]] = ..., version: _Optional[int] = ..., pairs: _Optional[_Iterable[_Union[PairCount, _Mapping]]] = ..., last_chunk: _Optional[bool] = ...) -> None: ...
