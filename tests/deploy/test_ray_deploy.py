"""deploy/ray, checked offline: the example config speaks the services' real flags, `down` drains the coordinator
first; no Ray cluster."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import coordinator.__main__ as coordinator_cli
import draft_service.__main__ as draft_cli
import memory_service.__main__ as memory_cli
import target_service.__main__ as target_cli
from calispec.client import CalispecClient, CalispecRpcError
from calispec_core.generation import FinishReason, GenerationStats
from calispec_core.grpc_server import make_channel
from calispec_tools import cli_ray
from calispec_tools.cli import main as calispec_main
from calispec_tools.deploy.ray_config import DeploymentError, RayDeployConfig, ServiceSpec, parsed_service_flags
from calispec_tools.namespaces import pair_namespace
from calispec_tools.shipped_calibration import SeedResult, chosen_lambda, shipped_file
from coordinator.engine import Chunk
from coordinator.server import SERVICE_NAME as COORDINATOR
from tests.conftest import TinyPair
from tests.helpers import wait_until, write_recorded_export

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "ray" / "calispec.yaml"


def _argv(config: RayDeployConfig, token_file: Path) -> dict[str, list[str]]:
    """Each service's command line as the controller and its actor build it (ray_actors.Controller.up and
    ServiceHost.start), on loopback so that no TLS files are needed."""
    server = ["--host", "127.0.0.1", "--port", "0"]
    return {
        "memory": [*server, "--db", config.memory_db, *config.memory.args, "--writer-token-file", str(token_file)],
        "draft": [*server, "--model", config.draft_model, *config.draft.args],
        "target": [
            *server, "--model", config.target_model, *config.target.args,
            "--memory-addr", "127.0.0.1:1", "--memory-namespace", config.memory_namespace,
            "--memory-writer-token-file", str(token_file),
        ],
        "coordinator": [
            *server, "--tokenizer", config.target_model, "--draft-addr", "127.0.0.1:2",
            "--target-addr", "127.0.0.1:3", *config.coordinator.args,
        ],
    }  # fmt: skip


def test_the_example_config_speaks_the_services_flags_and_threads_match_num_cpus(tmp_path: Path) -> None:
    """docs/performance.md: give each actor num_cpus=N and the service --threads N."""
    config = RayDeployConfig.load(EXAMPLE)
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    argv = _argv(config, token_file)
    memory_cli.parse_args(argv["memory"])  # argparse exits on an unknown flag
    coordinator_cli.parse_config(argv["coordinator"])
    for name, parse in [("draft", draft_cli.parse_config), ("target", target_cli.parse_config)]:
        parsed, _ = parse(argv[name])
        num_cpus = getattr(config, name).num_cpus
        assert parsed.model.threads == max(1, math.floor(num_cpus)), f"{name}: --threads vs num_cpus {num_cpus}"


@pytest.mark.slow  # needs the `ray` extra, which `make test-slow` installs (importing it starts nothing)
def test_a_drain_that_runs_out_logs_its_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning printed the monotonic deadline (hours since boot) as the time waited."""
    from calispec_tools.deploy import ray_actors

    controller = ray_actors.Controller(
        RayDeployConfig(draft_model="/d", target_model="/t", memory_db="/m", drain_timeout_s=1.0)
    )
    controller.actors["target-1"] = SimpleNamespace(open_sessions=SimpleNamespace(remote=lambda: 1))  # never idle
    monkeypatch.setattr(ray_actors, "ray", SimpleNamespace(get=lambda ref, **_: ref))
    with caplog.at_level(logging.WARNING, logger=ray_actors.__name__):
        controller._drain("target-1")
    assert "target-1 still has sessions after 1s;" in caplog.text


@pytest.mark.slow  # needs the `ray` extra (importing it starts nothing)
def test_the_controller_bounds_its_questions_to_actors_and_stops_one_that_hangs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller asked its actors (stats, sessions, new targets) without a timeout: one hung actor hung the
    controller, and every later `calispec ray` command queued behind it."""
    from ray.exceptions import GetTimeoutError

    from calispec_tools.deploy import ray_actors

    timeouts: list[float | None] = []

    def get(ref: object, timeout: float | None = None) -> object:
        timeouts.append(timeout)
        if ref == "hung":
            raise GetTimeoutError("no answer")
        return ref

    monkeypatch.setattr(ray_actors, "ray", SimpleNamespace(get=get))
    controller = ray_actors.Controller(RayDeployConfig(draft_model="/d", target_model="/t", memory_db="/m"))
    controller.actors["coordinator"] = SimpleNamespace(
        set_targets=SimpleNamespace(remote=lambda targets: targets), stats=SimpleNamespace(remote=lambda: {})
    )
    controller.actors["target-1"] = SimpleNamespace(open_sessions=SimpleNamespace(remote=lambda: "hung"))
    controller.addresses["target-1"] = "127.0.0.1:1"
    controller.targets = ["target-1"]
    controller._push_targets()
    with caplog.at_level(logging.WARNING, logger=ray_actors.__name__):
        controller._drain("target-1")  # returns: the hung replica is stopped, not waited for forever
    controller.actors.pop("target-1")
    assert controller.stats() == {"coordinator": {}}
    assert "target-1 does not answer; stopping it" in caplog.text
    assert timeouts[0] == timeouts[2] == ray_actors.CALL_TIMEOUT_S
    assert 0 < timeouts[1] <= controller.config.drain_timeout_s  # a drain poll never outlasts the drain


@pytest.mark.slow  # needs the `ray` extra (importing it starts nothing)
def test_a_scale_down_whose_push_times_out_keeps_the_replica_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scale-down popped the newest replica before pushing the shorter list: when the push timed out, the
    coordinator could still route to a replica the controller no longer listed, and no later scale touched it (nor
    re-sent a list the coordinator may have taken late)."""
    from ray.exceptions import GetTimeoutError

    from calispec_tools.deploy import ray_actors

    stopped: list[str] = []

    def get(ref: object, timeout: float | None = None) -> object:
        if ref == "push":
            raise GetTimeoutError("the coordinator does not answer")
        return ref

    monkeypatch.setattr(ray_actors, "ray", SimpleNamespace(get=get, kill=lambda actor: stopped.append(actor)))
    controller = ray_actors.Controller(RayDeployConfig(draft_model="/d", target_model="/t", memory_db="/m"))
    controller.actors["coordinator"] = SimpleNamespace(set_targets=SimpleNamespace(remote=lambda targets: "push"))
    for name in ["target-0", "target-1"]:
        controller.actors[name] = SimpleNamespace(name=name)
        controller.addresses[name] = f"127.0.0.1:{name[-1]}"
    controller.targets = ["target-0", "target-1"]
    with pytest.raises(GetTimeoutError):
        controller.scale(1)
    assert controller.targets == ["target-0", "target-1"]
    assert controller.status()["targets"] == ["127.0.0.1:0", "127.0.0.1:1"]
    assert controller.status()["targets_confirmed"] is False  # an operator sees that the coordinator may differ
    assert stopped == []
    # the timed-out push may have landed after all: the next scale sends the list again, even with nothing to change
    pushed: list[list[str]] = []
    controller.actors["coordinator"] = SimpleNamespace(set_targets=SimpleNamespace(remote=pushed.append))
    controller.scale(2)
    assert pushed == [["127.0.0.1:0", "127.0.0.1:1"]]
    assert controller.status()["targets_confirmed"] is True
    controller.scale(2)
    assert len(pushed) == 1  # acknowledged: nothing to send


class StopRecorder:
    """Fake actors and `ray` for the controller: records each actor's stop (with its drain) and get's bound."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None, float | None]] = []  # (actor, drain timeout, get's timeout)

    def actor(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(stop=SimpleNamespace(remote=lambda drain=None: (name, drain)))

    def get(self, ref: tuple[str, float | None], timeout: float | None = None) -> None:
        self.calls.append((*ref, timeout))


@pytest.mark.slow  # needs the `ray` extra (importing it starts nothing)
def test_ray_down_drains_the_coordinator_first_then_stops_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """`down` stopped the coordinator without a drain (its running requests were cut, where SIGTERM drains),
    and in reverse start order: a target added by `scale` after the coordinator was stopped before it."""
    from calispec_tools.deploy import ray_actors

    fake = StopRecorder()
    monkeypatch.setattr(ray_actors, "ray", SimpleNamespace(get=fake.get, kill=lambda actor: None))
    controller = ray_actors.Controller(
        RayDeployConfig(draft_model="/d", target_model="/t", memory_db="/m", drain_timeout_s=45.0)
    )
    for name in ["memory", "draft", "target-0", "coordinator", "target-1"]:  # target-1: a scale-up
        controller.actors[name] = fake.actor(name)
    controller.down()
    grace = ray_actors.STOP_GRACE_S + 30
    assert fake.calls == [("coordinator", 45.0, 45.0 + grace), ("target-0", None, grace), ("target-1", None, grace),
                          ("draft", None, grace), ("memory", None, grace)]  # fmt: skip
    controller.actors["coordinator"] = fake.actor("coordinator")
    controller.down(drain_timeout_s=0.0)  # `calispec ray down --drain-timeout-s 0`
    assert fake.calls[-1] == ("coordinator", 0.0, grace)


class HeldOrchestrator:
    """Streams one chunk, then waits for `release`; has the replica set the Ray coordinator host reads."""

    def __init__(self) -> None:
        self.release = threading.Event()
        reference = SimpleNamespace(info=lambda timeout: None)
        self.replicas = SimpleNamespace(backends=lambda: [reference])

    def generate(
        self, prompt: object, params: object, deadline: object, cancelled: object = None, **hooks: object
    ) -> Iterator[Chunk]:
        yield Chunk([1], "a", "session-1")
        assert self.release.wait(60)
        yield Chunk([2], "b", "session-1", FinishReason.LENGTH, GenerationStats(rounds=2, emitted=2))


def coordinator_health(address: str) -> int:
    with make_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=COORDINATOR)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


@pytest.mark.slow  # needs the `ray` extra (the host runs in-process here: no cluster)
def test_the_ray_coordinator_drains_before_it_stops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Its stop went straight to the gRPC server's 5 s grace: a request running at `ray down` was cut."""
    import coordinator.replicas
    import coordinator.server
    from calispec_tools.deploy import ray_actors

    orchestrator = HeldOrchestrator()
    monkeypatch.setattr(coordinator.server, "build_orchestrator", lambda config: orchestrator)
    monkeypatch.setattr(coordinator.replicas, "checked_connector", lambda *args: None)
    host = ray_actors.ServiceHost()
    argv = ["--tokenizer", str(tmp_path), "--draft-addr", "127.0.0.1:1", "--target-addr", "127.0.0.1:2"]
    address = host.start("coordinator", "127.0.0.1", 0, argv)
    stopper = threading.Thread(target=host.stop, args=(60.0,))
    try:
        with CalispecClient(address, timeout=60) as client:
            stream = client.generate_stream("hello", max_new_tokens=2)
            assert next(stream).text == "a"  # the request is running
            stopper.start()
            wait_until(lambda: coordinator_health(address) == health_pb2.HealthCheckResponse.NOT_SERVING)
            with pytest.raises(CalispecRpcError) as refused:
                client.generate("a new request", max_new_tokens=2)
            assert refused.value.code == "UNAVAILABLE" and stopper.is_alive()  # the stop waits for the running one
            orchestrator.release.set()
            rest = list(stream)
        assert rest[-1].finish_reason == "length" and rest[-1].text == "b"
        stopper.join(60)
        assert not stopper.is_alive()
    finally:
        orchestrator.release.set()
        if not stopper.is_alive():
            host.stop()


@pytest.mark.slow  # needs the `ray` extra (the host runs in-process here: no cluster)
def test_a_ray_memory_service_names_its_address_to_a_second_one_on_its_database(tmp_path: Path) -> None:
    """The database lock's line named pid and host but not where the holder serves (the actor never said)."""
    from calispec_tools.deploy import ray_actors
    from memory_service.db_lock import DatabaseInUse
    from memory_service.store import CorrectionStore

    host = ray_actors.ServiceHost()
    db = tmp_path / "memory.db"
    address = host.start("memory", "127.0.0.1", 0, ["--db", str(db), "--allow-unauthenticated-writes"])
    try:
        with pytest.raises(DatabaseInUse) as refused:
            CorrectionStore(db)
        assert f"serving {address}" in str(refused.value)
    finally:
        host.stop()


def test_a_ray_deployment_derives_the_pairs_namespace_and_finds_its_shipped_calibration(
    tiny_pair: TinyPair, tmp_path: Path
) -> None:
    """The deployment wrote to a namespace called `default`, which no shipped calibration is for: Ray users
    got λ = 6 on an empty memory while `calispec up` rescued from the first request."""
    models = {"draft": str(tiny_pair.draft), "target": str(tiny_pair.target)}
    config = RayDeployConfig.from_dict({"models": models})
    assert (config.memory_namespace, config.calibration) == ("auto", "shipped")
    assert config.resolved_memory_namespace() == pair_namespace(tiny_pair.draft, tiny_pair.target)
    assert config.calibration_file(config.resolved_memory_namespace()) is None  # no file ships for the tiny pair
    shipped = shipped_file("qwen-coder")
    assert shipped is not None
    qwen_namespace = json.loads(shipped.read_text(encoding="utf-8"))["namespace"]
    assert config.calibration_file(qwen_namespace) == shipped
    assert RayDeployConfig.from_dict({"models": models, "calibration": "none"}).calibration_file(qwen_namespace) is None
    explicit = RayDeployConfig.from_dict({"models": models, "memory_namespace": "team-a"})
    assert explicit.resolved_memory_namespace() == "team-a"
    own = tmp_path / "own.json"
    own.write_text("{}", encoding="utf-8")
    assert RayDeployConfig.from_dict({"models": models, "calibration": str(own)}).calibration_file("x") == own


def test_a_ray_deployment_refuses_a_namespace_or_calibration_it_cannot_resolve(tmp_path: Path) -> None:
    unseen = RayDeployConfig(draft_model=str(tmp_path / "d"), target_model=str(tmp_path / "t"), memory_db="/m")
    with pytest.raises(ValueError, match=r"cannot read .*/d/config.json: put the models"):
        unseen.resolved_memory_namespace()  # a name without the config's hash would name no pair
    missing = RayDeployConfig(draft_model="/d", target_model="/t", memory_db="/m", calibration=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"calibration file .*x not found"):
        missing.calibration_file("ns")
    for key in ("calibration", "memory_namespace"):
        with pytest.raises(ValueError, match="must not be empty"):
            RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, key: ""})
    with pytest.raises(ValueError, match="memory_namespace must be auto or 1-128 characters"):  # review, wave 55
        RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, "memory_namespace": "a b"})
    assert RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, "memory_namespace": "p/a+b"})


def test_the_lambda_chosen_for_a_shipped_calibration_holds_only_where_it_was_chosen(tmp_path: Path) -> None:
    shipped = shipped_file("qwen-coder")
    assert shipped is not None
    assert chosen_lambda(shipped, "float32", meaning_guard=True) == 4  # wave 46, on the dev tasks (wave 26's file: 6)
    assert chosen_lambda(shipped, "bfloat16", meaning_guard=True) == 4  # wave 45, on the dev tasks
    assert chosen_lambda(shipped, "float16", meaning_guard=True) is None  # never chosen
    assert chosen_lambda(shipped, "float32", meaning_guard=False) is None
    copy = tmp_path / shipped.name
    copy.write_bytes(shipped.read_bytes())
    assert chosen_lambda(copy, "float32", meaning_guard=True) is None  # only the repo's own file


@pytest.mark.slow  # needs the `ray` extra (importing it starts nothing)
def test_the_ray_controller_serves_the_lambda_chosen_for_the_calibration_it_seeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from calispec_tools.deploy import ray_actors

    shipped = shipped_file("qwen-coder")
    serves = {"dtype": "float32", "meaning_guard": True}  # what the first target reports
    monkeypatch.setattr(ray_actors, "ray", SimpleNamespace(get=lambda ref, **_: ref))

    def controller(args: tuple[str, ...] = (), present: bool = True) -> ray_actors.Controller:
        config = RayDeployConfig(
            draft_model="/d", target_model="/t", memory_db="/m", coordinator=ServiceSpec(args=args)
        )
        made = ray_actors.Controller(config)
        made.targets = ["target-0"]
        made.actors["target-0"] = SimpleNamespace(serves=SimpleNamespace(remote=lambda: dict(serves)))
        made.calibration = SeedResult(present, "seeded", present=present)
        return made

    assert controller()._calibrated_lambda(shipped) == 4  # float32: wave 46's choice (6 before)
    assert controller()._calibrated_lambda(None) is None  # nothing seeded
    assert controller(present=False)._calibrated_lambda(shipped) is None  # the file was refused
    assert controller(("--default-lambda", "5"))._calibrated_lambda(shipped) is None  # the deployment's own
    assert controller(("--default-tau=0.1",))._calibrated_lambda(shipped) is None  # λ was chosen at the paper's τ
    serves["dtype"] = "bfloat16"
    assert controller()._calibrated_lambda(shipped) == 4
    serves["dtype"] = "float16"
    assert controller()._calibrated_lambda(shipped) is None  # no λ chosen on it


@pytest.mark.slow  # needs the `ray` extra (the memory service runs in-process here: no cluster)
def test_the_ray_controller_seeds_over_mutual_tls_with_the_verifiers_credentials(tmp_path: Path) -> None:
    """With tls_dir the memory service takes only certificates of the deployment's CA: the controller seeds
    with the targets' client certificate (written to a private directory for the call) and writer token."""
    from calispec_tools.certs import make_dev_certs
    from calispec_tools.deploy import ray_actors
    from calispec_tools.memory_reads import memory_events

    certs = make_dev_certs(tmp_path / "tls")
    config = RayDeployConfig(
        draft_model="/d", target_model="/t", memory_db=str(tmp_path / "m.db"), tls_dir=str(certs.directory)
    )
    bundle = config.tls_bundle()
    controller = ray_actors.Controller(config, bundle)
    controller.memory_namespace = "pair/a+b/c"
    export = write_recorded_export(tmp_path / "seed.json", controller.memory_namespace, [(1, 2, 4)])
    host = ray_actors.ServiceHost()
    address = host.start(
        "memory", "127.0.0.1", 0, ["--db", config.memory_db], controller.writer_token, bundle["memory"]
    )
    try:
        seeded = controller._seed(address, export)
        assert (seeded.loaded, seeded.message) == (True, "calibration: loaded 1 pairs (4 events) from seed.json")
        again = controller._seed(address, export)  # a namespace that holds counts is never seeded twice
        assert (again.loaded, again.present) == (False, True)
        assert memory_events(address, controller.memory_namespace, tls=certs.tls("coordinator")) == 4
    finally:
        host.stop()


# -- `calispec ray`: an operator's mistakes are one line (each was a traceback; found by probing) ----------

BAD_CONFIGS = {
    "unknown-key": ("models: {draft: /a, target: /b}\nbogus: 1\n", "unknown config keys: ['bogus']"),
    "half-a-pair": ("models: {draft: /a}\n", "models.draft"),
    "no-replicas": ("target: {replicas: 0}\nmodels: {draft: a, target: b}\n", "replicas must be >= 1"),
    "yaml-syntax": ("models: [\n", "config "),
    "a-list": ("- models\n", "expected a mapping of settings, got a list"),
    "section-shape": ("models: {draft: /a, target: /b}\ntarget: 3\n", "config "),
    "not-utf-8": ("\udcff\udcfemodels: {}\n", "is not UTF-8 text"),
}


@pytest.mark.parametrize("text, expected", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_ray_up_with_a_config_it_cannot_use_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    """Refused before Ray is joined: the address is a closed port nothing would answer on."""
    config = tmp_path / "c.yaml"
    config.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert calispec_main(["ray", "up", "--config", str(config), "--address", "127.0.0.1:1"]) == 2
    line = one_line(capsys)
    assert line.startswith(f"error: config {config}") and expected in line


def test_ray_up_with_a_missing_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert calispec_main(["ray", "up", "--config", str(tmp_path / "no.yaml"), "--address", "127.0.0.1:1"]) == 2
    assert one_line(capsys) == f"error: cannot read the config {tmp_path / 'no.yaml'}: No such file or directory"


def test_ray_scale_with_a_bad_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert calispec_main(["ray", "scale", "target=x", "--address", "127.0.0.1:1"]) == 2  # it exited 1
    assert one_line(capsys) == "error: scale takes target=N, got 'target=x'"


def test_a_services_bad_flags_carry_argparses_message() -> None:
    """It said "see the actor's log for argparse's message"."""
    with pytest.raises(
        DeploymentError, match=r"bad service flags .*: python -m draft_service: error: unrecognized arguments: --bogus"
    ):
        parsed_service_flags(draft_cli.parse_config, ["--model", "/m", "--bogus"])


@pytest.mark.slow  # needs the `ray` extra (Ray's exception classes only: no cluster)
def test_a_ray_task_that_failed_is_named_by_its_innermost_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """The controller's call to a service actor failed: two RayTaskErrors around the service's DeploymentError."""
    exceptions = pytest.importorskip("ray.exceptions", reason="`make test-slow` installs the ray extra")
    RayTaskError = exceptions.RayTaskError

    bad_flags = DeploymentError("bad service flags ['--bogus']: draft: error: unrecognized arguments: --bogus")
    direct = RayTaskError("ServiceHost.start", "Traceback ...", bad_flags).as_instanceof_cause()  # ray.get's
    assert isinstance(direct, DeploymentError)  # so `except DeploymentError` took it, and printed Ray's traceback

    def fails_directly(_args: object) -> int:
        raise direct

    assert cli_ray.reported(fails_directly)(SimpleNamespace()) == 1
    assert one_line(capsys) == f"error: {bad_flags}"
    outer = RayTaskError("Controller.up", "Traceback ...", direct)  # through the controller's own call

    def fails(_args: object) -> int:
        raise outer

    assert cli_ray.reported(fails)(SimpleNamespace()) == 1
    assert one_line(capsys) == f"error: {bad_flags}"
    assert cli_ray.ray_task_failure(RayTaskError("f", "tb", KeyError("k"))) == (
        "error: a Ray task failed: KeyError: 'k' (its traceback is in the actor's log)"
    )


def test_no_deployment_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def status(_args: object) -> int:
        raise DeploymentError("no Calispec deployment in Ray namespace 'calispec': `calispec ray up` one")

    assert cli_ray.reported(status)(SimpleNamespace()) == 1
    assert one_line(capsys).startswith("error: no Calispec deployment in Ray namespace 'calispec'")


def test_a_bug_keeps_its_traceback() -> None:
    def buggy(_args: object) -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        cli_ray.reported(buggy)(SimpleNamespace())


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
