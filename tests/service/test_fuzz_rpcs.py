"""Every RPC of every service, fed random and malformed requests (hypothesis).

The contract (docs/robustness.md): a request gets OK or a documented refusal, never INTERNAL or
UNKNOWN; no service dies; and a refused request changes no state (open sessions of draft and
target, the memory's counts). Requests are built from the message descriptors, so a field
added to the proto is fuzzed without touching this file. The default run is bounded (a few
examples per RPC); `-m slow` runs the bigger profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calispec.v1 import coordinator_pb2, draft_pb2, memory_pb2, target_pb2
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from calispec_core.modeling import ModelRunner, ModelSpec
from coordinator.config import CoordinatorConfig
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from memory_service.config import MemoryConfig
from memory_service.server import create_server as create_memory
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair

TOKEN = "fuzz-writer-token-0123456789"
SESSIONS = ("s0", "s1")  # opened before fuzzing, so session RPCs get past NOT_FOUND
NAMESPACES = ("ns", "fresh")
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}
DEFAULT_EXAMPLES = 8
SLOW_EXAMPLES = 150


# -- requests from descriptors ----------------------------------------------------------------------

_INTS = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
}


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    # Mostly small values (where the valid requests are), sometimes the extremes and anything between.
    # Never 0 for a signed field: 0 means "server default", e.g. a long generation.
    small = st.integers(max(lo, -3), min(hi, 40)).filter(lambda v: lo >= 0 or v != 0)
    return st.one_of(small, st.sampled_from([lo, hi, 100_000]), st.integers(lo, hi))


def _text() -> st.SearchStrategy[str]:
    known = st.sampled_from(SESSIONS) | st.sampled_from(NAMESPACES)  # so requests get past NOT_FOUND
    return st.one_of(known, known, st.text(max_size=12), st.just("x" * 300))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in _INTS:
        return _int(*_INTS[field.type])
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32) | st.floats(-1, 2, width=32)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return _text()
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.integers(-1, 8)  # includes values the enum does not define
    raise AssertionError(f"no strategy for {field.full_name}")


def messages(descriptor: Any, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random instances of a message type: any field set or not, any value of its type."""
    cls = GetMessageClass(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        for field in descriptor.fields:
            if not draw(st.booleans()):
                continue
            is_message = field.type == FieldDescriptor.TYPE_MESSAGE
            if is_message and field.message_type.GetOptions().map_entry:  # a map: its keys and values as scalars
                key, value = (_scalar(field.message_type.fields_by_name[n]) for n in ("key", "value"))
                getattr(msg, field.name).update(draw(st.dictionaries(key, value, max_size=6)))
                continue
            if is_message and depth >= 2:
                continue
            element = messages(field.message_type, depth + 1) if is_message else _scalar(field)
            if field.is_repeated:
                plausible = _int(0, 40) if field.type in _INTS else element  # e.g. a prompt of real token ids
                values = draw(st.lists(element, max_size=6) | st.lists(plausible, min_size=1, max_size=6))
                getattr(msg, field.name).extend(values)
            elif is_message:
                getattr(msg, field.name).CopyFrom(draw(element))
            else:
                setattr(msg, field.name, draw(element))
        return msg

    return build()


# -- the services ---------------------------------------------------------------------------------


@dataclass
class Stack:
    channels: dict[str, grpc.Channel]
    memory_store: Any
    # per model service, the session ids a Close found no session for: the service remembers each, and refuses the
    # next Prefill of it CANCELLED (docs/robustness.md); the fuzzing of Close may run before that of Prefill
    closed_unknown: dict[str, set[str]] = dataclass_field(default_factory=lambda: {"draft": set(), "target": set()})

    def call(self, service: str, method: MethodDescriptor, request: bytes, metadata: tuple) -> grpc.StatusCode:
        """Send raw request bytes; the status code (OK included) of the call."""
        path = f"/{method.containing_service.full_name}/{method.name}"
        channel = self.channels[service]
        try:
            if method.server_streaming:
                stream = channel.unary_stream(path)(request, timeout=60, metadata=metadata)
                for i, _ in enumerate(stream):
                    if service == "memory" and i >= 1:  # Watch never ends by itself
                        stream.cancel()
                        break
            else:
                channel.unary_unary(path)(request, timeout=60, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and service == "memory":
                return grpc.StatusCode.OK  # our own cancel of a healthy Watch
            return exc.code()
        return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner) -> Iterator:
    db = tmp_path_factory.mktemp("fuzz") / "memory.db"
    memory, memory_port, store = create_memory(
        MemoryConfig(port=0, db_path=db, writer_token=TOKEN, flush_interval_s=0.05, watch_heartbeat_s=0.1)
    )
    draft, draft_port = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0, max_sessions=6), draft_runner)
    target, target_port, runtime = create_target(
        TargetConfig(ModelSpec(tiny_pair.target), port=0, max_sessions=6), target_runner
    )
    for server in (memory, draft, target):
        server.start()
    coordinator, coordinator_port = create_coordinator(
        CoordinatorConfig(
            draft_address=f"127.0.0.1:{draft_port}",
            target_addresses=(f"127.0.0.1:{target_port}",),
            tokenizer=Path(tiny_pair.target),
            port=0,
        )
    )
    coordinator.start()
    ports = {"memory": memory_port, "draft": draft_port, "target": target_port, "coordinator": coordinator_port}
    channels = {name: make_channel(f"127.0.0.1:{port}") for name, port in ports.items()}
    fuzz = Stack(channels, store)
    yield fuzz
    for channel in channels.values():
        channel.close()
    store.hub.close()
    for server in (coordinator, target, draft, memory):
        server.stop(None)
    runtime.stop()
    store.close()


@pytest.fixture
def fuzzed(stack: Stack) -> Stack:
    """The module's stack with its sessions SESSIONS open (again: the fuzzing of Close may have closed them, in
    whatever order the tests run), so session RPCs get past NOT_FOUND."""
    for service, module, name in (("draft", draft_pb2, "DraftService"), ("target", target_pb2, "TargetService")):
        prefill = _method(module, name, "Prefill")
        for sid in SESSIONS:
            request = _prefill(GetMessageClass(prefill.input_type), sid)
            code = stack.call(service, prefill, request, ())
            if code == grpc.StatusCode.CANCELLED and sid in stack.closed_unknown[service]:  # one Close, one Prefill
                stack.closed_unknown[service].discard(sid)
                code = stack.call(service, prefill, request, ())
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS), (service, sid, code)
    assert all(n >= len(SESSIONS) for n in _open_sessions(stack))  # each service (a tuple compares lexically)
    return stack


def _method(module: Any, service: str, name: str) -> MethodDescriptor:
    return module.DESCRIPTOR.services_by_name[service].methods_by_name[name]


def _prefill(cls: type[Message], sid: str) -> bytes:
    return cls(session_id=sid, token_ids=[5, 17, 42]).SerializeToString()


def _open_sessions(stack: Stack) -> tuple[int, int]:
    draft = draft_pb2.DraftStatsResponse.FromString(
        stack.channels["draft"].unary_unary("/calispec.v1.DraftService/GetStats")(b"", timeout=30)
    )
    target = target_pb2.TargetStatsResponse.FromString(
        stack.channels["target"].unary_unary("/calispec.v1.TargetService/GetStats")(b"", timeout=30)
    )
    return draft.sessions.open_sessions, target.sessions.open_sessions


def _memory_counts(stack: Stack) -> list[tuple[int, int, int]]:
    stack.memory_store.flush()  # whatever a request was accepted into is committed now
    return [stack.memory_store.stats(ns) for ns in NAMESPACES]


def _all_rpcs() -> list[tuple[str, MethodDescriptor]]:
    services = [
        ("draft", draft_pb2, "DraftService"),
        ("target", target_pb2, "TargetService"),
        ("memory", memory_pb2, "MemoryService"),
        ("coordinator", coordinator_pb2, "Coordinator"),
    ]
    return [
        (name, method)
        for name, module, service in services
        for method in module.DESCRIPTOR.services_by_name[service].methods
    ]


RPCS = _all_rpcs()


def _requests(method: MethodDescriptor) -> st.SearchStrategy[bytes]:
    """Well-formed random messages mostly, sometimes bytes that are no message at all."""
    well_formed = messages(method.input_type).map(lambda m: m.SerializeToString())
    return st.one_of(well_formed, well_formed, well_formed, st.binary(min_size=1, max_size=32))


def _session_id(method: MethodDescriptor, request: bytes) -> str | None:
    try:
        return GetMessageClass(method.input_type).FromString(request).session_id
    except DecodeError:  # not a message: the service refused it before it read an id
        return None


def _check_one(stack: Stack, service: str, method: MethodDescriptor, request: bytes, authenticated: bool) -> None:
    metadata = writer_metadata(TOKEN) if authenticated else ()
    sessions, counts = _open_sessions(stack), _memory_counts(stack)
    code = stack.call(service, method, request, metadata)
    if code == grpc.StatusCode.CANCELLED and method.name == "Prefill" and service in stack.closed_unknown:
        # documented, and only for the Prefill of an id a refused Close named (one Close cancels one Prefill)
        sid = _session_id(method, request)
        assert sid in stack.closed_unknown[service], f"{method.full_name} of {sid!r} answered {code}"
        stack.closed_unknown[service].discard(sid)
    else:
        assert code == grpc.StatusCode.OK or code in REFUSALS, f"{method.full_name} answered {code}"
    if code == grpc.StatusCode.NOT_FOUND and method.name == "Close" and service in stack.closed_unknown:
        stack.closed_unknown[service].add(str(_session_id(method, request)))
    if code != grpc.StatusCode.OK:
        assert _open_sessions(stack) == sessions, f"a refused {method.name} changed the open sessions"
        assert _memory_counts(stack) == counts, f"a refused {method.name} changed the memory"
    elif service == "coordinator":
        assert _open_sessions(stack) == sessions, "a finished generation left sessions open"
    elif method.name == "Prefill":  # keep the capacity for the next example
        sid = GetMessageClass(method.input_type).FromString(request).session_id
        if sid not in SESSIONS:
            close = "DraftService" if service == "draft" else "TargetService"
            stack.channels[service].unary_unary(f"/calispec.v1.{close}/Close")(
                GetMessageClass(method.containing_service.methods_by_name["Close"].input_type)(
                    session_id=sid
                ).SerializeToString(),
                timeout=30,
            )


def _fuzz(examples: int) -> Callable:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=examples <= DEFAULT_EXAMPLES,  # the default suite is reproducible
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def run(stack: Stack, service: str, method: MethodDescriptor, data: st.DataObject) -> None:
        request = data.draw(_requests(method), label="request")
        authenticated = data.draw(st.booleans(), label="authenticated")
        _check_one(stack, service, method, request, authenticated)

    return run


_fuzz_default = _fuzz(DEFAULT_EXAMPLES)
_fuzz_slow = _fuzz(SLOW_EXAMPLES)


@pytest.mark.parametrize(("service", "method"), RPCS, ids=[m.full_name for _, m in RPCS])
def test_random_requests_get_documented_codes_and_refusals_change_nothing(fuzzed, service, method) -> None:
    _fuzz_default(fuzzed, service, method)
    _still_serves(fuzzed, f"after-{method.full_name}")  # whatever the module fuzzed before: each test checks its own


@pytest.mark.slow
@pytest.mark.parametrize(("service", "method"), RPCS, ids=[m.full_name for _, m in RPCS])
def test_random_requests_bigger_profile(fuzzed, service, method) -> None:
    _fuzz_slow(fuzzed, service, method)
    _still_serves(fuzzed, f"after-{method.full_name}")


def _still_serves(stack: Stack, session_id: str) -> None:
    for service, module, name in (("draft", draft_pb2, "DraftService"), ("target", target_pb2, "TargetService")):
        prefill, close = _method(module, name, "Prefill"), _method(module, name, "Close")
        request = _prefill(GetMessageClass(prefill.input_type), session_id)
        assert stack.call(service, prefill, request, ()) == grpc.StatusCode.OK  # capacity left, model fine
        request = GetMessageClass(close.input_type)(session_id=session_id).SerializeToString()
        assert stack.call(service, close, request, ()) == grpc.StatusCode.OK  # its slot back, for the next test
    for service, method in RPCS:
        if service in ("draft", "target") and method.name in ("GetModelInfo", "GetStats"):
            assert stack.call(service, method, b"", ()) == grpc.StatusCode.OK


def test_every_service_still_serves_after_the_fuzzing(stack: Stack) -> None:
    _still_serves(stack, "after-fuzz")
