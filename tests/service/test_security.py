"""A TLS stack with API keys and quotas: who may call what, over real gRPC with `certs dev` certificates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from calispec.client import CalispecClient, CalispecRpcError
from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc, memory_pb2, memory_pb2_grpc, target_pb2, target_pb2_grpc
from calispec_core.access import ApiKeyInterceptor, ApiKeys, Quota, key_line
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import create_grpc_server, make_channel
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.certs import DevCerts, make_dev_certs
from coordinator.config import CoordinatorConfig
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from memory_service.config import MemoryConfig
from memory_service.server import create_server as create_memory
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair
from tests.helpers import reference_greedy, rpc_code

KEYS = {name: f"csk_test-key-of-{name}-0123456789" for name in ("alice", "quota", "reload", "scheme")}
TOKEN = "test-writer-token-0123456789"


@dataclass
class Stack:
    certs: DevCerts
    address: str
    target_address: str
    health_port: int
    keys_file: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return make_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    certs: DevCerts,
    tiny_pair: TinyPair,
    draft_runner: ModelRunner,
    target_runner: ModelRunner,
) -> Iterator[Stack]:
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text("# test keys\n" + "".join(key_line(n, k) for n, k in KEYS.items() if n != "reload"))
    draft, draft_port = create_draft(
        DraftConfig(ModelSpec(tiny_pair.draft), port=0, tls=certs.tls("draft")), runner=draft_runner
    )
    target, target_port, runtime = create_target(
        TargetConfig(ModelSpec(tiny_pair.target), port=0, tls=certs.tls("target")), runner=target_runner
    )
    draft.start()
    target.start()
    health_port = _free_port()
    config = CoordinatorConfig(
        draft_address=f"127.0.0.1:{draft_port}",
        target_addresses=(f"127.0.0.1:{target_port}",),
        tokenizer=tiny_pair.target,
        port=0,
        tls=certs.tls("coordinator"),
        api_keys_file=keys_file,
        quota=Quota(requests_per_minute=0.001, burst=3),  # 3 requests per key, then (practically) no refill
        health_port=health_port,
    )
    coordinator, port = create_coordinator(config)
    coordinator.start()
    yield Stack(certs, f"127.0.0.1:{port}", f"127.0.0.1:{target_port}", health_port, keys_file)
    for server in (coordinator, target, draft):
        server.stop(None)
    runtime.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _generate(stack: Stack, token: str | None, ca: Path | None = None) -> list[int]:
    with CalispecClient(stack.address, timeout=30, token=token, tls_ca=ca or stack.certs.ca) as client:
        return client.generate("hello", max_new_tokens=4, mode="sd").token_ids


def test_a_tls_stack_serves_an_authenticated_client(stack: Stack, target_runner: ModelRunner) -> None:
    ids = _generate(stack, KEYS["alice"])  # coordinator -> draft/target over mutual TLS
    prompt = target_runner.tokenizer("hello")["input_ids"]
    assert ids == reference_greedy(target_runner, prompt, 4)


def test_plaintext_and_wrong_ca_clients_are_refused(stack: Stack, tmp_path: Path) -> None:
    with (
        CalispecClient(stack.address, timeout=10, token=KEYS["alice"]) as plaintext,
        pytest.raises(CalispecRpcError) as info,
    ):
        plaintext.generate("hello", max_new_tokens=1)
    assert info.value.code == "UNAVAILABLE"
    other_ca = make_dev_certs(tmp_path / "other").ca
    with pytest.raises(CalispecRpcError) as info:
        _generate(stack, KEYS["alice"], ca=other_ca)
    assert info.value.code == "UNAVAILABLE"


@pytest.mark.parametrize("token", [None, "csk_not-a-key-0123456789"])
def test_a_request_without_a_valid_key_is_unauthenticated(stack: Stack, token: str | None) -> None:
    with pytest.raises(CalispecRpcError) as info:
        _generate(stack, token)
    assert info.value.code == "UNAUTHENTICATED"


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(stack: Stack, scheme: str) -> None:
    """RFC 9110 §11.1: `authorization: bearer KEY` was UNAUTHENTICATED (the SDK always sends `Bearer`)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=stack.certs.ca.read_bytes())
    request = coordinator_pb2.GenerateRequest(prompt="hello", params=coordinator_pb2.GenerationParams(max_new_tokens=2))
    with grpc.secure_channel(stack.address, credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        reply = stub.Generate(request, metadata=[("authorization", f"{scheme} {KEYS['scheme']}")], timeout=30)
    assert len(reply.token_ids) == 2


def test_a_key_over_its_quota_gets_resource_exhausted(stack: Stack) -> None:
    for _ in range(3):
        _generate(stack, KEYS["quota"])
    with pytest.raises(CalispecRpcError) as info:
        _generate(stack, KEYS["quota"])
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert _generate(stack, KEYS["alice"])  # another key's budget is untouched
    # when to retry, as gRPC's retry policies read it (none came: found by probing); 0.001/min: ~60,000 s
    credentials = grpc.ssl_channel_credentials(root_certificates=stack.certs.ca.read_bytes())
    request = coordinator_pb2.GenerateRequest(prompt="hello", params=coordinator_pb2.GenerationParams(max_new_tokens=2))
    with grpc.secure_channel(stack.address, credentials) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(request, metadata=[("authorization", f"Bearer {KEYS['quota']}")], timeout=30)
    pushback = dict(refused.value.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert 50_000_000 < int(pushback["grpc-retry-pushback-ms"]) <= 60_000_000


def test_a_key_added_to_the_file_is_accepted_without_a_restart(stack: Stack) -> None:
    with pytest.raises(CalispecRpcError):
        _generate(stack, KEYS["reload"])
    with stack.keys_file.open("a") as f:
        f.write(key_line("reload", KEYS["reload"]))
    # the file is re-read at most once a second: wait for the reload, not for a fixed time
    from tests.helpers import wait_until

    wait_until(lambda: _accepted(stack, KEYS["reload"]), timeout_s=20)


def _accepted(stack: Stack, token: str) -> bool:
    try:
        return bool(_generate(stack, token))
    except CalispecRpcError as exc:
        assert exc.code == "UNAUTHENTICATED"
        return False


def test_the_target_serves_the_coordinator_only(stack: Stack) -> None:
    request = target_pb2.TargetPrefillRequest(session_id="direct", token_ids=[1, 2, 3])
    with make_channel(stack.target_address, stack.certs.tls("client"), server_name="target") as channel:
        stub = target_pb2_grpc.TargetServiceStub(channel)
        assert rpc_code(lambda: stub.Prefill(request, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    with make_channel(stack.target_address, stack.certs.tls("coordinator"), server_name="target") as channel:
        info = target_pb2_grpc.TargetServiceStub(channel).GetModelInfo(target_pb2.TargetModelInfoRequest(), timeout=10)
        assert info.info.vocab_size > 0
    with make_channel(stack.target_address) as channel:  # no certificate at all: the handshake fails
        stub = target_pb2_grpc.TargetServiceStub(channel)
        assert rpc_code(lambda: stub.Prefill(request, timeout=10)) == grpc.StatusCode.UNAVAILABLE


def test_probes_reach_the_plaintext_health_port(stack: Stack) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{stack.health_port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_memory_takes_writes_from_verifiers_only(certs: DevCerts, tmp_path: Path) -> None:
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, tls=certs.tls("memory"))
    server, port, store = create_memory(config)
    server.start()
    request = memory_pb2.RecordEventsRequest(
        namespace="ns", events=[memory_pb2.PairCount(draft_token_id=1, target_token_id=2, count=1)]
    )
    try:
        for role in ("client", "coordinator"):  # valid certificates of the CA, but not verifiers
            with make_channel(f"127.0.0.1:{port}", certs.tls(role), server_name="memory") as channel:
                stub = memory_pb2_grpc.MemoryServiceStub(channel)
                write = lambda s=stub: s.RecordEvents(request, metadata=writer_metadata(TOKEN, "w"), timeout=10)  # noqa: E731
                assert rpc_code(write) == grpc.StatusCode.PERMISSION_DENIED
                assert stub.GetPairs(memory_pb2.GetPairsRequest(namespace="ns"), timeout=10).version == 0  # reads open
        with make_channel(f"127.0.0.1:{port}", certs.tls("target"), server_name="memory") as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            assert stub.RecordEvents(request, metadata=writer_metadata(TOKEN, "w"), timeout=10).recorded == 1
    finally:
        server.stop(None)
        store.close()


def test_memory_tools_speak_mutual_tls(certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from calispec_tools import cli_memory

    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, tls=certs.tls("memory"))
    server, port, store = create_memory(config)
    server.start()
    store.record("ns", [(1, 2, 7)], durable=True)
    parser = argparse.ArgumentParser()
    cli_memory.register(parser.add_subparsers(dest="command", required=True))
    base = ["memory", "stats", "--namespace", "ns", "--memory-addr", f"127.0.0.1:{port}", "--json"]
    client = ["--memory-tls-cert", str(certs.cert("client")), "--memory-tls-key", str(certs.key("client"))]
    try:
        args = parser.parse_args([*base, *client, "--memory-tls-ca", str(certs.ca)])
        assert args.func(args) == 0
        assert json.loads(capsys.readouterr().out)["total_events"] == "7"  # int64 in proto JSON
        with pytest.raises(SystemExit) as exited:
            args = parser.parse_args([*base, *client])
            args.func(args)
        assert exited.value.code == 2 and "all three" in capsys.readouterr().err  # a usage error
    finally:
        server.stop(None)
        store.close()


def test_memory_tools_take_the_running_tls_stacks_certificates(
    certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against `calispec up --tls`'s memory they dialled plaintext without --memory-tls-* (gRPC's "Socket closed";
    found by probing): now reads take its `client` certificate and writes (import) the verifiers' `target` one."""
    import argparse
    import json
    import os

    from calispec_tools import cli_memory
    from calispec_tools.stack_state import StackState

    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, tls=certs.tls("memory"))
    server, port, store = create_memory(config)
    server.start()
    store.record("ns", [(1, 2, 7)], durable=True)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    state = StackState(os.getpid(), "c", f"127.0.0.1:{port}", "ns", "d", "t", str(token), tls_dir=str(certs.directory))
    state.write()
    parser = argparse.ArgumentParser()
    cli_memory.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> int:
        args = parser.parse_args(argv)
        return args.func(args)

    out = tmp_path / "ns.json"

    def certificate(*argv: str, writes: bool = False) -> str | None:
        tls = cli_memory.memory_tls(parser.parse_args(["memory", "stats", *argv]), writes)
        return tls.cert.name if tls is not None else None

    assert (certificate(), certificate(writes=True)) == ("client.pem", "target.pem")  # reads, then the writers'
    assert certificate("--memory-addr", f"localhost:{port}") == "client.pem"  # the stack's, named another way
    assert certificate("--memory-addr", "127.0.0.1:1") is None  # another service: not the stack's certificates
    try:
        assert run("memory", "stats", "--json") == 0
        assert json.loads(capsys.readouterr().out)["total_events"] == "7"
        assert run("memory", "export", "--out", str(out)) == 0
        assert run("memory", "import", "--file", str(out)) == 0  # a write: the target's certificate, the token
        store.flush()
        assert store.snapshot("ns")[0] == [(1, 2, 14)]
        replace(state, tls_dir="").write()  # a plaintext stack's state: no certificate, refused
        assert run("memory", "stats") == 1
        assert "UNAVAILABLE" in capsys.readouterr().err
    finally:
        server.stop(None)
        store.close()


def test_memory_seed_writes_only_with_a_verifiers_certificate(
    certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What deploy/k8s/calibration-seed runs: the target's certificate loads the shipped file; another role's
    certificate of the same CA is refused (exit 1, nothing written)."""
    import argparse

    from calispec_tools import cli_memory
    from calispec_tools.shipped_calibration import file_namespace, shipped_file

    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, tls=certs.tls("memory"))
    server, port, store = create_memory(config)
    server.start()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    parser = argparse.ArgumentParser()
    cli_memory.register(parser.add_subparsers(dest="command", required=True))
    base = ["memory", "seed", "--memory-addr", f"127.0.0.1:{port}", "--writer-token-file", str(token)]
    shipped = shipped_file("qwen-coder")
    assert shipped is not None
    namespace = file_namespace(shipped)

    def seed(role: str) -> int:
        tls = ["--memory-tls-cert", str(certs.cert(role)), "--memory-tls-key", str(certs.key(role))]
        args = parser.parse_args([*base, *tls, "--memory-tls-ca", str(certs.ca)])
        return args.func(args)

    try:
        assert seed("coordinator") == 1
        assert "PERMISSION_DENIED" in capsys.readouterr().err and store.stats(namespace)[0] == 0
        assert seed("target") == 0
        assert "calibration: loaded" in capsys.readouterr().out
        store.flush()
        assert store.stats(namespace)[0] > 1000
    finally:
        server.stop(None)
        store.close()


def test_pems_sent_as_text_write_under_mutual_tls_and_leave_no_file(certs: DevCerts, tmp_path: Path) -> None:
    """What a `calibrate --ray` worker gets (its node may lack the driver's files): the writing certificate's PEMs
    as text, written to a private directory while its channel is made, removed after. Without them a worker writes
    in plaintext, which a `calispec up --tls` stack's memory refuses."""
    from calispec_tools.calibrate.sink import MemoryWriter
    from calispec_tools.pems import pem_files, pem_texts

    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, tls=certs.tls("memory"))
    server, port, store = create_memory(config)
    server.start()
    address = f"127.0.0.1:{port}"
    try:
        with pytest.raises(grpc.RpcError) as plaintext:
            MemoryWriter(address, "tls-ns", TOKEN, vocab_size=64).check(timeout_s=5)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
        with pem_files(pem_texts(certs.tls("target"))) as tls:
            assert tls is not None and tls.cert is not None
            directory = tls.cert.parent
            assert directory.stat().st_mode & 0o077 == 0 and tls.key.stat().st_mode & 0o077 == 0  # type: ignore[union-attr]
            writer = MemoryWriter(address, "tls-ns", TOKEN, vocab_size=64, tls=tls)
        assert not directory.exists()  # the channel read them when it was made
        writer.send(Counter({(1, 2): 3}))
        writer.close()
        assert store.stats("tls-ns")[0] == 3
    finally:
        server.stop(None)
        store.close()


class _Streaming(grpc.GenericRpcHandler):
    """Client- and bidi-streaming RPCs (the services have none yet; reflection, exempt, is one)."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == "/test.Streaming/Count":
            return grpc.stream_unary_rpc_method_handler(lambda requests, _: b"%d" % sum(1 for _ in requests))
        if details.method == "/test.Streaming/Echo":
            return grpc.stream_stream_rpc_method_handler(lambda requests, _: iter(requests))
        return None


def test_client_streaming_rpcs_are_guarded_too(tmp_path: Path) -> None:
    """The access guards passed client- and bidi-streaming handlers through unchecked: such an RPC, once added,
    would have been served to callers without a key (or of another role)."""
    keys_file = tmp_path / "api-keys"
    keys_file.write_text(key_line("alice", KEYS["alice"]))
    register = lambda s: s.add_generic_rpc_handlers((_Streaming(),))  # noqa: E731
    server, port, _ = create_grpc_server(
        "127.0.0.1:0", [register], [], interceptors=[ApiKeyInterceptor(ApiKeys(keys_file))]
    )
    server.start()
    key = [("authorization", f"Bearer {KEYS['alice']}")]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            count, echo = channel.stream_unary("/test.Streaming/Count"), channel.stream_stream("/test.Streaming/Echo")
            assert rpc_code(lambda: count(iter([b"a", b"b"]), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
            assert rpc_code(lambda: list(echo(iter([b"a"]), timeout=10))) == grpc.StatusCode.UNAUTHENTICATED
            assert count(iter([b"a", b"b"]), timeout=10, metadata=key) == b"2"
            assert list(echo(iter([b"a"]), timeout=10, metadata=key)) == [b"a"]
    finally:
        server.stop(None).wait()


def test_the_coordinator_reads_no_request_larger_than_a_valid_one(stack: Stack) -> None:
    """It read and parsed up to 64 MiB before it checked the API key: 16 such requests without a key grew it by
    525 MB. A request past what a valid one needs is now refused by gRPC, unread; the largest valid one is read."""
    from calispec_core.limits import MAX_PROMPT_CHARS
    from coordinator.config import GRPC_MAX_REQUEST_BYTES
    from coordinator.server import SERVICE_NAME

    largest = coordinator_pb2.GenerateRequest(prompt="\U0001f600" * MAX_PROMPT_CHARS)  # 4 UTF-8 bytes a character
    oversized = coordinator_pb2.GenerateRequest(prompt="a" * GRPC_MAX_REQUEST_BYTES)
    credentials = grpc.ssl_channel_credentials(root_certificates=stack.certs.ca.read_bytes())
    with grpc.secure_channel(stack.address, credentials, options=[("grpc.max_send_message_length", -1)]) as channel:
        generate = channel.unary_unary(f"/{SERVICE_NAME}/Generate")  # bytes as they are
        assert rpc_code(lambda: generate(largest.SerializeToString(), timeout=30)) == grpc.StatusCode.UNAUTHENTICATED
        assert (
            rpc_code(lambda: generate(oversized.SerializeToString(), timeout=30)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        )


def test_the_memory_service_reads_no_request_larger_than_a_valid_one(tmp_path: Path) -> None:
    """Any holder of a CA certificate could make it read and parse 64 MiB; the largest valid write still fits."""
    from memory_service.server import MAX_REQUEST_BYTES
    from memory_service.store import MAX_EVENTS_PER_RECORD

    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, writer_events_per_s=0)
    server, port, store = create_memory(config)
    server.start()
    widest = memory_pb2.PairCount(draft_token_id=2**32 - 1, target_token_id=2**32 - 2, count=2**40)  # as wide
    largest = memory_pb2.RecordEventsRequest(namespace="n" * 128, events=[widest] * MAX_EVENTS_PER_RECORD)
    oversized = memory_pb2.RecordEventsRequest(namespace="ns", events=[widest] * (MAX_REQUEST_BYTES // 20))
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            assert stub.RecordEvents(largest, metadata=writer_metadata(TOKEN), timeout=60).recorded > 0
            assert rpc_code(lambda: stub.RecordEvents(oversized, timeout=60)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop(None).wait()
        store.close()
