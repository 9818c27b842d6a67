from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("namespace", "events")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    events: _containers.RepeatedCompositeFieldContainer[PairCount]
    def __init__(self, namespace: _Optional[str] = ..., events: _Optional[_Iterable[_Union[PairCount, _Mapping]]] = ...) -> None: ...

class RecordEventsResponse(_message.Message):
    __slots__ = ("recorded", "version")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    version: int
    def __init__(self, recorded: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("total_events", "distinct_pairs", "version")
    TOTAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    total_events: int
    distinct_pairs: int
    version: int
    def __init__(self, total_events: _Optional[int] = ..., distinct_pairs: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...
