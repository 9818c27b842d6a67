"""All four services as subprocesses over loopback, driven through the client SDK."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlite_utils

from calispec.client import CalispecClient
from calispec_tools import cli
from calispec_tools.memory_reads import memory_events
from calispec_tools.namespaces import pair_namespace
from calispec_tools.stack import LocalStack, StackConfig
from tests.conftest import TinyPair
from tests.helpers import ports_outside_the_ephemeral_range, wait_until, write_recorded_export
from tests.metrics_scrape import scrape, value

PROMPTS = [
    "def fibonacci(n):",
    "Question: what is 12 plus 30?",
    "The robot counted",
    "A rectangle with sides",
    "zebra quantum xylophone",  # out of the tiny corpus: the pair disagrees more
]


def stack_config(tmp: Path, draft: Path, target: Path, device: str = "cpu") -> StackConfig:
    return StackConfig(
        draft_model=draft,
        target_model=target,
        memory_db=tmp / "memory.db",
        log_dir=tmp / "logs",
        coordinator_port=0,
        target_port=0,
        draft_port=0,
        memory_port=ports_outside_the_ephemeral_range(1)[0],  # restarted on it: a free port 0 could be taken meanwhile
        dtype="float32",  # greedy SD == AR exactly holds in float32 (see README on bf16)
        device=device,  # `make test-cuda`: cuda
        memory_sync_interval_s=0.1,
        start_timeout_s=120,
        http_port=0,  # the coordinator's OpenAI-compatible API too
        metrics=True,  # every service serves /metrics on a free port, as `calispec up` runs them
        log_level="DEBUG",  # per-RPC access lines, to follow a request id through every service
    )


@pytest.fixture(scope="module")
def stack(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory, stack_device: str) -> Iterator[LocalStack]:
    config = stack_config(tmp_path_factory.mktemp("stack"), tiny_pair.draft, tiny_pair.target, stack_device)
    with LocalStack(config) as s:
        yield s


class CountingClient(CalispecClient):
    """Sums the rejection events the stack reported, to compare with what the memory recorded."""

    rejections = 0
    _lock = threading.Lock()

    def generate(self, prompt: str, **kwargs):  # type: ignore[override]
        result = super().generate(prompt, **kwargs)
        with CountingClient._lock:
            CountingClient.rejections += result.stats.rejections
        return result


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> Iterator[CountingClient]:
    CountingClient.rejections = 0
    with CountingClient(stack.coordinator_address, timeout=120) as c:
        yield c


def test_model_services_name_their_dtype_and_float32_linear_path(stack: LocalStack, stack_device: str) -> None:
    """`auto` packs a model whose copy fits (the tiny pair always does), so the exactness tests below run
    the packed path on CPU (on CUDA there is no CPU Linear path: `-`); bench compare reports what the banner says."""
    linear = "packed" if stack_device == "cpu" else "-"
    for name in ("draft_service", "target_service"):
        service = stack.services[name]
        assert (service.banner_value("dtype"), service.banner_value("fp32_linear")) == ("float32", linear)
        assert service.banner_value("device") == stack_device
    assert stack.services["memory_service"].banner_value("fp32_linear") is None


def test_greedy_sd_equals_ar_token_for_token(client: CalispecClient) -> None:
    for prompt in PROMPTS:
        ar = client.generate(prompt, max_new_tokens=40, mode="ar")
        for gamma in (1, 3, 6):
            sd = client.generate(prompt, max_new_tokens=40, mode="sd", num_speculative_tokens=gamma)
            assert sd.token_ids == ar.token_ids, (prompt, gamma)
            assert sd.stats.drafted > 0


def test_concurrent_greedy_sd_equals_ar_with_batching_on(client: CountingClient) -> None:
    ar = {p: client.generate(p, max_new_tokens=40, mode="ar").token_ids for p in PROMPTS}
    requests = PROMPTS * 2  # more requests than prompts: the target batches whatever is in flight
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(
            lambda p: client.generate(p, max_new_tokens=40, mode="sd", num_speculative_tokens=3), requests
        ))  # fmt: skip
    for prompt, result in zip(requests, results, strict=True):
        assert result.token_ids == ar[prompt], prompt
        assert 1 <= result.stats.max_batch_size <= 8  # the target's --max-batch-size default


def test_csd_rescues_with_permissive_thresholds_and_reports_it(client: CalispecClient) -> None:
    kwargs = {"max_new_tokens": 40, "mode": "csd", "tau": 1e-9, "lambda_": 0, "num_speculative_tokens": 6}
    first = [client.generate(p, **kwargs) for p in PROMPTS]
    assert sum(r.stats.rejections for r in first) > 0  # the pair disagrees somewhere
    # every rejected pair now has count >= 1 > λ = 0, and τ = 1e-9 passes any sane gate
    again = [client.generate(p, **kwargs) for p in PROMPTS]
    assert sum(r.stats.rescued for r in again) > 0
    for r in again:
        assert r.stats.accepted >= r.stats.rescued
        assert r.stats.acceptance_rate == pytest.approx(r.stats.accepted / r.stats.drafted)


def test_a_request_id_reaches_every_service_log_and_the_metrics_count_the_request(
    stack: LocalStack, client: CountingClient
) -> None:
    request_id = f"e2e-{uuid.uuid4().hex}"
    before = scrape(stack.services["coordinator"].metrics_url)
    r = client.generate(PROMPTS[-1], max_new_tokens=24, mode="sd", num_speculative_tokens=4, request_id=request_id)
    assert r.stats.rejections > 0  # so the verifier ships events, and the memory write names the request
    summary = rf"request id={request_id} mode=sd status=OK .* drafted=(\d+) accepted=(\d+) "
    line = re.search(summary, log_text(stack, "coordinator"))
    assert line is not None and tuple(map(int, line.groups())) == (r.stats.drafted, r.stats.accepted)
    for service, rpc in [("draft_service", "DraftService/Propose"), ("target_service", "TargetService/Verify")]:
        assert re.search(rf"\[{request_id}\]: rpc {rpc} OK", log_text(stack, service)), service
    # the memory write that carries the request's events (or one just before it) names the request
    memory_line = rf"\[[^]]*{request_id}[^]]*\]: rpc MemoryService/RecordEvents OK"
    wait_until(lambda: re.search(memory_line, log_text(stack, "memory_service")))
    after = scrape(stack.services["coordinator"].metrics_url)
    drafted = "calispec_spec_decode_num_draft_tokens_total"
    assert value(after, drafted) - value(before, drafted) == r.stats.drafted
    for name in ["draft_service", "target_service", "memory_service"]:
        assert "calispec_rpc_requests_total" in {n for n, _ in scrape(stack.services[name].metrics_url)}


def log_text(stack: LocalStack, service: str) -> str:
    return stack.services[service].log_path.read_text(errors="replace")


def test_calibrate_seeds_the_memory_with_every_rejection(
    stack: LocalStack, client: CountingClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "calibration.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    memory = stack.memory_address
    args = ["calibrate", "--prompts", str(prompts), "--namespace", stack.memory_namespace,
            "--address", stack.coordinator_address, "--memory-addr", memory, "--max-new-tokens", "30"]  # fmt: skip
    assert cli.main(args) == 0
    summary = re.search(r"(\d+) prompts, (\d+) rejection events, (\d+) recorded", capsys.readouterr().out)
    assert summary is not None
    prompts_run, rejections, recorded = map(int, summary.groups())
    assert prompts_run == len(PROMPTS) and rejections > 0 and recorded >= rejections
    with CountingClient._lock:  # these went through the stack too: the restart test counts them
        CountingClient.rejections += rejections


def test_rejection_counts_reach_sqlite_and_survive_a_memory_restart(stack: LocalStack, client: CountingClient) -> None:
    results = [client.generate(p, max_new_tokens=30, mode="sd", num_speculative_tokens=4) for p in PROMPTS]
    assert sum(r.stats.rejections for r in results) > 0
    memory = stack.services["memory_service"]
    expected = client.rejections  # every request this module sent to the stack, sd and csd alike
    # the target ships events in the background; wait for exactly that total, no more, no less
    namespace = stack.memory_namespace  # derived from the model pair
    assert namespace.startswith("pair/")
    wait_until(lambda: memory_events(memory.address, namespace) == expected)
    db_path = stack.config.memory_db
    assert stack.stop_service("memory_service") == 0
    in_file = (
        sqlite_utils.Database(db_path)
        .execute("select sum(count) from pair_counts where namespace = ?", [namespace])
        .fetchone()[0]
    )
    assert in_file == expected
    # on its port: the target knows that address, so the module's other tests (in any order) get a whole stack
    restarted = stack.restart_service("memory_service")
    assert memory_events(restarted.address, namespace) == expected
    # and the stack records again: the target's link finds the restarted service and ships the new events
    after = [client.generate(p, max_new_tokens=30, mode="sd", num_speculative_tokens=4) for p in PROMPTS]
    assert sum(r.stats.rejections for r in after) > 0
    wait_until(lambda: memory_events(restarted.address, namespace) == client.rejections)


def test_identical_draft_gives_full_acceptance(tiny_pair: TinyPair, tmp_path: Path, stack_device: str) -> None:
    """Also: a seeded calibration's λ reaches the coordinator, for the dtype the target's banner names and only
    for it (no rejections here, so λ changes nothing else)."""
    namespace = pair_namespace(tiny_pair.target, tiny_pair.target)
    calibration = write_recorded_export(tmp_path / "tiny.json", namespace, [(1, 2, 3)])
    lambdas = (("bfloat16", 9), ("float32", 2))
    same_pair = stack_config(tmp_path, tiny_pair.target, tiny_pair.target, stack_device)
    config = dataclasses.replace(same_pair, calibration_file=calibration, calibration_lambdas=lambdas)
    with (
        LocalStack(config) as same,
        CalispecClient(same.coordinator_address, timeout=120) as c,
    ):
        assert same.calibration is not None and same.calibration.loaded, same.calibration
        coordinator = same.services["coordinator"].args
        assert coordinator[coordinator.index("--default-lambda") + 1] == "2"
        assert same.csd_defaults_message().startswith("CSD defaults: τ = 0.01, λ = 2 (chosen for")
        for prompt in PROMPTS[:3]:
            r = c.generate(prompt, max_new_tokens=30, mode="sd", num_speculative_tokens=4)
            assert r.stats.drafted > 0
            assert r.stats.accepted == r.stats.drafted and r.stats.acceptance_rate == 1.0


def test_seeded_sampling_with_logprobs_reproduces(client: CalispecClient, stack_device: str) -> None:
    """What `make test-cuda` had never run on a GPU (a CUDA audit): the sampling verifier (per-row generators, warps,
    the inverse CDF), the draft's sparse q and log-probabilities, seeded. Alone a seeded request reproduces on any
    device; beside others too on CPU (on a GPU the kernels may depend on the batch's shape: README)."""
    kwargs = {"max_new_tokens": 24, "mode": "sd", "num_speculative_tokens": 3, "temperature": 0.9, "top_k": 40,
              "top_p": 0.95, "seed": 7, "logprobs": 2, "ignore_eos": True}  # fmt: skip
    first, again = (client.generate(PROMPTS[0], **kwargs) for _ in range(2))
    assert first.token_ids == again.token_ids and len(first.token_ids) == 24 and first.stats.drafted > 0
    assert first.logprobs is not None and len(first.logprobs) == 24
    assert all(lp.logprob <= 0.0 and len(lp.top_token_ids) == 2 for lp in first.logprobs)
    if stack_device == "cpu":
        with ThreadPoolExecutor(4) as pool:
            others = [pool.submit(client.generate, p, max_new_tokens=24, mode="csd") for p in PROMPTS[1:4]]
            beside = pool.submit(client.generate, PROMPTS[0], **kwargs).result()
            for other in others:
                other.result()
        assert beside.token_ids == first.token_ids


def test_a_bfloat16_stack_serves_every_mode(tiny_pair: TinyPair, tmp_path: Path, stack_device: str) -> None:
    """bf16 is what `auto` and the GPU overlay serve on CUDA, and `make test-cuda` ran float32 only (a CUDA audit)."""
    config = dataclasses.replace(
        stack_config(tmp_path, tiny_pair.draft, tiny_pair.target, stack_device), dtype="bfloat16"
    )
    with LocalStack(config) as bf16, CalispecClient(bf16.coordinator_address, timeout=120) as c:
        assert bf16.services["target_service"].banner_value("dtype") == "bfloat16"
        for mode in ("ar", "sd", "csd"):
            greedy = c.generate(PROMPTS[0], max_new_tokens=16, mode=mode, num_speculative_tokens=3, ignore_eos=True)
            sampled = c.generate(PROMPTS[1], max_new_tokens=16, mode=mode, temperature=0.8, seed=3, logprobs=1,
                                 num_speculative_tokens=3, ignore_eos=True)  # fmt: skip
            assert len(greedy.token_ids) == len(sampled.token_ids) == 16, mode
            assert sampled.logprobs is not None and all(lp.logprob <= 0.0 for lp in sampled.logprobs), mode


def test_openai_api_in_the_coordinator_process(stack: LocalStack, client: CalispecClient) -> None:
    import openai

    assert stack.http_url is not None and stack.http_url.startswith("http://127.0.0.1:")
    oai = openai.OpenAI(base_url=stack.http_url, api_key="unused", max_retries=0, timeout=120)
    (model,) = [m.id for m in oai.models.list().data]
    done = oai.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0, extra_body={"mode": "sd"}
    )
    expected = client.generate(PROMPTS[0], max_new_tokens=16, mode="sd")
    assert done.choices[0].text == expected.text
    assert done.usage is not None and done.usage.completion_tokens == len(expected.token_ids)


def test_demo_serves_one_request_end_to_end(
    tiny_pair: TinyPair, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` is `calispec demo`: it must start the stack, answer and stop (it once crashed on client flags,
    and then on the credentials `calispec up --tls` tells users to export: the demo's stack is plaintext)."""
    monkeypatch.setenv("CALISPEC_TLS_CA", str(tmp_path / "an-old-ca.pem"))
    monkeypatch.setenv("CALISPEC_TOKEN", "a-key-of-another-stack")
    args = ["demo", "--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target), "--dtype", "float32"]
    args += ["--memory-db", str(tmp_path / "memory.db"), "--log-dir", str(tmp_path / "logs")]
    args += ["--prompt", "def add(a, b):", "--mode", "sd", "--max-new-tokens", "8"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "CSD defaults: τ = 0.01, λ = 6 (the paper's)" in err  # explicit models: no shipped calibration
    assert re.search(r"\] \d+ tokens in \d+ ms \| rounds \d+", err), err
