"""/metrics of all four services in-process: the counters move by what the responses report."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from calispec.client import CalispecClient, CalispecRpcError
from calispec.v1 import memory_pb2, memory_pb2_grpc
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
from tests.helpers import wait_until
from tests.metrics_scrape import scrape, total, value

TOKEN = "metrics-test-writer-token-0123456789"
NAMESPACE = "metrics-test"


@dataclass
class Stack:
    coordinator: str
    memory: str
    urls: dict[str, str]  # service -> /metrics URL


@pytest.fixture(scope="module")
def stack(
    tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("metrics")
    (tmp / "token").write_text(TOKEN)
    memory, memory_port, store = create_memory(
        MemoryConfig(port=0, db_path=tmp / "m.db", flush_interval_s=0.05, writer_token=TOKEN, metrics_port=0)
    )
    draft, draft_port = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0, metrics_port=0), draft_runner)
    target_config = TargetConfig(
        ModelSpec(tiny_pair.target),
        port=0,
        metrics_port=0,
        memory_address=f"127.0.0.1:{memory_port}",
        memory_namespace=NAMESPACE,
        memory_sync_interval_s=0.05,
        memory_writer_token_file=tmp / "token",
    )
    target, target_port, runtime = create_target(target_config, target_runner)
    for server in (memory, draft, target):
        server.start()
    config = CoordinatorConfig(
        draft_address=f"127.0.0.1:{draft_port}",
        target_addresses=(f"127.0.0.1:{target_port}",),
        tokenizer=tiny_pair.target,
        port=0,
        metrics_port=0,
    )
    coordinator, port = create_coordinator(config)
    coordinator.start()
    servers = {"coordinator": coordinator, "target": target, "draft": draft, "memory": memory}
    urls = {name: s.metrics_url for name, s in servers.items()}
    yield Stack(f"127.0.0.1:{port}", f"127.0.0.1:{memory_port}", urls)
    for server in (coordinator, target, draft):
        server.stop(None)
    runtime.stop()
    store.hub.close()
    memory.stop(None).wait()
    store.close()


@pytest.fixture
def client(stack: Stack) -> Iterator[CalispecClient]:
    with CalispecClient(stack.coordinator, timeout=60) as c:
        yield c


def deltas(stack: Stack, service: str, before: dict, names: list[str]) -> dict[str, float]:
    after = scrape(stack.urls[service])
    return {n: total(after, n) - total(before, n) for n in names}


def test_a_greedy_sd_request_moves_every_counter_by_its_stats(stack: Stack, client: CalispecClient) -> None:
    before = {name: scrape(url) for name, url in stack.urls.items()}
    r = client.generate("zebra quantum xylophone", max_new_tokens=24, mode="sd", num_speculative_tokens=4)
    s = r.stats
    assert s.drafted > 0 and s.rejections > 0  # the pair disagrees on this prompt: every counter moves

    c = scrape(stack.urls["coordinator"])
    b = before["coordinator"]
    moved = {n: total(c, n) - total(b, n) for n in {n for n, _ in c}}
    assert moved["calispec_spec_decode_num_draft_tokens_total"] == s.drafted
    assert moved["calispec_spec_decode_num_accepted_tokens_total"] == s.accepted
    assert moved["calispec_spec_decode_num_rescued_tokens_total"] == s.rescued == 0  # sd never rescues
    assert moved["calispec_spec_decode_num_withheld_rescues_total"] == s.withheld_rescues == 0
    assert moved["calispec_spec_decode_num_accepted_tokens_per_pos_total"] == s.accepted
    assert value(c, "calispec_rounds_total", mode="sd") - value(b, "calispec_rounds_total", mode="sd") == s.rounds
    assert moved["calispec_spec_decode_num_drafts_total"] == moved["calispec_spec_decode_gamma_count"] > 0
    ok = value(c, "calispec_requests_total", mode="sd", status="OK") - value(
        b, "calispec_requests_total", mode="sd", status="OK"
    )
    assert ok == 1
    assert moved["calispec_generation_tokens_total"] == len(r.token_ids)
    assert moved["calispec_prompt_tokens_total"] == s.prompt_tokens
    for histogram in ("time_to_first_token", "e2e_request_latency", "time_per_output_token"):
        assert moved[f"calispec_{histogram}_seconds_count"] == 1
    pos0 = value(c, "calispec_spec_decode_num_accepted_tokens_per_pos_total", position="0")
    pos3 = value(c, "calispec_spec_decode_num_accepted_tokens_per_pos_total", position="3")
    assert pos0 >= pos3  # a later position is accepted only after every earlier one

    target = deltas(stack, "target", before["target"], [
        "calispec_verify_rounds_total", "calispec_verify_draft_tokens_total",
        "calispec_verify_accepted_tokens_total", "calispec_rejection_events_total",
    ])  # fmt: skip
    assert target == {
        "calispec_verify_rounds_total": s.rounds,
        "calispec_verify_draft_tokens_total": s.drafted,
        "calispec_verify_accepted_tokens_total": s.accepted,
        "calispec_rejection_events_total": s.rejections,
    }
    draft = deltas(stack, "draft", before["draft"], ["calispec_draft_proposed_tokens_total"])
    assert draft == {"calispec_draft_proposed_tokens_total": s.drafted}
    t = scrape(stack.urls["target"])
    assert (
        value(t, "calispec_rpc_requests_total", method="TargetService/Verify", code="OK")
        - value(before["target"], "calispec_rpc_requests_total", method="TargetService/Verify", code="OK")
        == s.rounds
    )
    assert value(t, "calispec_sessions_open") == 0 and value(t, "calispec_verify_queue_depth") == 0


def test_a_refused_request_is_counted_by_its_status(stack: Stack, client: CalispecClient) -> None:
    before = scrape(stack.urls["coordinator"])
    with pytest.raises(CalispecRpcError) as info:
        client.generate("hello", max_new_tokens=10**9, mode="sd")
    assert info.value.code == "INVALID_ARGUMENT"
    after = scrape(stack.urls["coordinator"])
    for name, labels in [
        ("calispec_requests_total", {"mode": "sd", "status": "INVALID_ARGUMENT"}),
        ("calispec_rpc_requests_total", {"method": "Coordinator/Generate", "code": "INVALID_ARGUMENT"}),
    ]:
        assert value(after, name, **labels) - value(before, name, **labels) == 1
    assert value(after, "calispec_requests_running") == 0


def test_memory_events_received_committed_and_dropped(stack: Stack, client: CalispecClient) -> None:
    r = client.generate("zebra quantum xylophone", max_new_tokens=16, mode="sd", num_speculative_tokens=4)
    assert r.stats.rejections > 0

    def settled() -> dict | None:  # the target ships events in the background; wait until all are committed
        m = scrape(stack.urls["memory"])
        received = total(m, "calispec_memory_events_received_total")
        local = total(scrape(stack.urls["target"]), "calispec_rejection_events_total")
        return m if received == local == total(m, "calispec_memory_events_committed_total") else None

    m = wait_until(settled)
    assert value(m, "calispec_memory_table_version", namespace=NAMESPACE) >= 1
    assert value(m, "calispec_memory_table_pairs", namespace=NAMESPACE) > 0

    def table_installed() -> dict | None:  # the verifier follows the memory's table by Watch
        t = scrape(stack.urls["target"])
        return t if value(t, "calispec_memory_table_version") >= 1 else None

    target = wait_until(table_installed)
    assert value(target, "calispec_memory_link_up") == 1 and value(target, "calispec_memory_table_pairs") > 0

    with make_channel(stack.memory) as channel:  # a stranger's write is dropped and counted by reason
        request = memory_pb2.RecordEventsRequest(
            namespace=NAMESPACE, events=[memory_pb2.PairCount(draft_token_id=1, target_token_id=2, count=7)]
        )
        with pytest.raises(grpc.RpcError) as info:
            memory_pb2_grpc.MemoryServiceStub(channel).RecordEvents(request, metadata=writer_metadata("wrong" * 8))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    after = scrape(stack.urls["memory"])
    assert value(after, "calispec_memory_events_dropped_total", code="UNAUTHENTICATED") == 1  # entries, not counts
    assert total(after, "calispec_memory_events_received_total") == total(m, "calispec_memory_events_received_total")


def test_servers_in_one_process_keep_separate_registries(stack: Stack, client: CalispecClient) -> None:
    client.generate("zebra quantum xylophone", max_new_tokens=8, mode="sd", num_speculative_tokens=4)  # run alone too
    draft = scrape(stack.urls["draft"])
    assert total(draft, "calispec_draft_proposed_tokens_total") > 0
    assert ("calispec_draft_proposed_tokens_total", frozenset()) not in scrape(stack.urls["target"])


def test_metrics_are_off_unless_a_port_is_given(tiny_pair: TinyPair, draft_runner: ModelRunner) -> None:
    server, _ = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0), draft_runner)
    assert server.metrics_url is None
    server.stop(None)


def test_a_repeated_prompt_reuses_the_prefix_cache_on_both_model_services(stack: Stack, client: CalispecClient) -> None:
    prompt = "The prefix cache test: " + "one two three four five six seven eight nine ten " * 3
    before = {name: scrape(stack.urls[name]) for name in ("target", "draft")}
    first = client.generate(prompt, max_new_tokens=4, mode="sd", num_speculative_tokens=2)
    client.generate(prompt, max_new_tokens=4, mode="sd", num_speculative_tokens=2)
    for name in ("target", "draft"):
        after = scrape(stack.urls[name])
        hits = value(after, "calispec_prefix_cache_hits_total") - value(
            before[name], "calispec_prefix_cache_hits_total"
        )
        reused = value(after, "calispec_prefix_cache_reused_tokens_total") - value(
            before[name], "calispec_prefix_cache_reused_tokens_total"
        )
        assert hits >= 1 and reused >= first.stats.prompt_tokens - 1, name
        assert value(after, "calispec_prefix_cache_tokens") > 0
