"""Calispec on a Ray cluster: each service is a Ray actor running the service in-process.

Layout (all actors detached and named in one Ray namespace, so `calispec ray scale|down`
from any machine finds them):

- `controller`: owns the deployment (config, replica list) and does up/scale/down;
- `memory`, `draft`, `target-<k>` (k = 0, 1, ...), `coordinator`: `ServiceActor`s, each with the
  resource requests of its section of the config (num_cpus, num_gpus, custom resources).

Each service actor builds its config with the service's own CLI parser (`parse_config` /
`parse_args`), so the deployment speaks the services' real flags, then calls the service's
`create_server`. The coordinator is told the replica set by the controller (`set_targets`,
a push through Ray, no extra RPC in the public API) and keeps it in a `ReplicaSet`. Scaling
down takes a replica out of the coordinator's rotation first, then waits until its open
sessions reach 0 (or `drain_timeout_s`) before stopping it: requests finish, or fail with
UNAVAILABLE after the drain timeout; none hang. `down` drains the coordinator first, as SIGTERM
does outside Ray (its running requests finish, new ones get UNAVAILABLE, for at most the drain
timeout), then stops the targets, the draft and the memory service.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from calispec_core.limits import host_port
from calispec_tools.deploy.ray_config import (
    DEFAULT_NAMESPACE,
    DeploymentError,
    RayDeployConfig,
    ServiceSpec,
    parsed_service_flags,
)
from calispec_tools.pems import pem_files, write_pems
from calispec_tools.shipped_calibration import SeedResult, chosen_lambdas, is_shipped, seed_namespace, served_lambda
from calispec_tools.stack_state import private_temp_dir

log = logging.getLogger(__name__)

CONTROLLER = "controller"
STOP_GRACE_S = 5.0
# A quick question to a service actor (its dtype, its sessions, its stats, new targets): an actor that does not
# answer in this time is hung, and the controller must not hang with it (every later ray command would queue).
CALL_TIMEOUT_S = 60.0
STOP_ORDER = ("coordinator", "target", "draft", "memory")  # `down`: no new requests first, memory flushes last
CSD_DEFAULT_FLAGS = ("--default-tau", "--default-lambda")  # coordinator flags: the deployment set its own defaults


# -- one service, in-process in an actor --------------------------------------------------------


class ServiceHost:
    """Runs one Calispec service inside this actor process (the gRPC server has its own threads)."""

    def __init__(self) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.kind = ""
        self.address = ""
        self._stop: list[Any] = []  # callables, run in order by stop()
        self._secrets = private_temp_dir("secrets")  # a later stack on this node removes it if the actor is killed
        self._replicas: Any = None  # the coordinator's ReplicaSet
        self._connect: Any = None
        self._engine: Any = None  # the target's engine (open sessions for draining)
        self._drain: Callable[[float], bool] | None = None  # the coordinator's ManagedServer.drain
        self._events_counted = 0  # rejection events this target counted (a test/metrics figure)
        self._table: Any = None
        self._serves: dict[str, Any] = {}  # the target's resolved dtype and meaning guard

    def start(
        self,
        kind: str,
        host: str,
        port: int,
        args: list[str],
        writer_token: str | None = None,
        tls: dict[str, str] | None = None,
    ) -> str:
        """Start the service; returns its HOST:PORT once it serves. `tls`: its PEMs (cert, key, ca)."""
        host = ray.util.get_node_ip_address() if host == "auto" else host
        argv = ["--host", host, "--port", str(port), *args, *self._tls_args(tls)]
        if writer_token is not None:
            token_file = self._secrets / "writer-token"
            token_file.touch(mode=0o600)
            token_file.write_text(writer_token + "\n", encoding="utf-8")
            flag = "--writer-token-file" if kind == "memory" else "--memory-writer-token-file"
            argv += [flag, str(token_file)]
        bound = getattr(self, f"_start_{kind}")(argv)
        # Peers check the role name in the certificate (calispec_core.credentials), not the node IP.
        self.kind, self.address = kind, host_port(host, bound)
        log.info("%s listening on %s", kind, self.address)
        return self.address

    def _tls_args(self, tls: dict[str, str] | None) -> list[str]:
        """Write the PEMs to this actor's private directory (0600) and point the service's flags at them."""
        if tls is None:
            return []
        return [arg for part, path in write_pems(self._secrets, tls).items() for arg in (f"--tls-{part}", str(path))]

    def _start_memory(self, argv: list[str]) -> int:
        import memory_service.__main__ as cli
        from memory_service.server import create_server

        config, _ = parsed_service_flags(cli.parse_args, argv)
        server, port, store = create_server(config)
        server.start()
        store.announce(replace(config, port=port).address)  # named to a second memory service refused its database
        # The order of the service's own shutdown: end Watch streams, stop serving, then commit and close.
        self._stop = [store.hub.close, lambda: server.stop(STOP_GRACE_S).wait(), store.close]
        return port

    def _start_draft(self, argv: list[str]) -> int:
        import draft_service.__main__ as cli
        from draft_service.server import create_server

        config, _ = parsed_service_flags(cli.parse_config, argv)
        server, port = create_server(config)
        server.start()
        self._stop = [lambda: server.stop(STOP_GRACE_S).wait()]
        return port

    def _start_target(self, argv: list[str]) -> int:
        import target_service.__main__ as cli
        from target_service.server import create_server

        config, _ = parsed_service_flags(cli.parse_config, argv)
        server, port, runtime = create_server(config)
        self._engine, self._table = runtime.engine, runtime.engine.table
        self._serves = {"dtype": runtime.engine.runner.dtype_name, "meaning_guard": config.meaning_guard}
        self._count_events(self._table)
        server.start()
        # runtime.stop() after the server: finish queued rounds, then ship the last events to memory.
        self._stop = [lambda: server.stop(STOP_GRACE_S).wait(), runtime.stop]
        return port

    def _count_events(self, table: Any) -> None:
        """Count the rejection events this replica records (to show that every replica wrote to memory)."""
        add_local = table.add_local

        def counted(draft_ids: Any, target_ids: Any) -> None:
            add_local(draft_ids, target_ids)
            self._events_counted += int(draft_ids.numel())

        table.add_local = counted

    def _start_coordinator(self, argv: list[str]) -> int:
        import coordinator.__main__ as cli
        from coordinator.replicas import checked_connector
        from coordinator.server import build_orchestrator, create_server

        config, _ = parsed_service_flags(cli.parse_config, argv)
        orchestrator = build_orchestrator(config)
        self._replicas = orchestrator.replicas
        reference = self._replicas.backends()[0].info(config.rpc_timeout_s)
        self._connect = checked_connector(reference, config.connect_timeout_s, config.tls)
        server, port = create_server(config, orchestrator)
        server.start()
        self._drain = server.drain
        self._stop = [lambda: server.stop(STOP_GRACE_S).wait()]
        return port

    # -- control --------------------------------------------------------------------------------

    def set_targets(self, addresses: list[str]) -> list[str]:
        """Coordinator only: serve exactly these target replicas (new ones are connected and checked)."""
        self._replicas.update(addresses, self._connect)
        return self._replicas.addresses()

    def serves(self) -> dict[str, Any]:
        """Target only: its served dtype (what `auto` resolved to on its node) and whether its meaning guard is on."""
        return dict(self._serves)

    def open_sessions(self) -> int:
        """Target/draft: sessions open now (0 means a removed replica may be stopped)."""
        return len(self._engine.sessions) if self._engine is not None else 0

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "address": self.address, "pid": os.getpid()}
        if self._replicas is not None:
            out["picks"] = dict(self._replicas.picks)
            out["targets"] = self._replicas.addresses()
        if self._table is not None:
            table = self._table.stats()
            out.update(
                open_sessions=self.open_sessions(),
                events_counted=self._events_counted,
                events_unshipped=table.local_events,
                batches_in_flight=table.in_flight_batches,
            )
        return out

    def stop(self, drain_timeout_s: float | None = None) -> None:
        """With a drain timeout, the coordinator first drains as on SIGTERM (NOT_SERVING, new requests
        UNAVAILABLE, running ones finish, for at most that long); then the service stops."""
        if drain_timeout_s is not None and self._drain is not None:
            try:
                self._drain(drain_timeout_s)
            except Exception:  # the stop below must still run
                log.exception("draining %s", self.kind)
        for step in self._stop:
            try:
                step()
            except Exception:  # stopping must go on: the next step may still save data
                log.exception("stopping %s", self.kind)
        self._stop = []
        # its writer token and TLS key: they outlived every deployment before (one directory per actor)
        shutil.rmtree(self._secrets, ignore_errors=True)


ServiceActor = ray.remote(ServiceHost)


# -- the controller ------------------------------------------------------------------------------


class Controller:
    """Owns one deployment. Its methods run one at a time (Ray's default actor concurrency)."""

    def __init__(self, config: RayDeployConfig, tls: dict[str, dict[str, str]] | None = None) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.config = config
        self.tls = tls or {}  # service -> its PEMs, read by the driver from config.tls_dir
        # One random writer token per deployment, handed only to the memory service and the verifiers.
        self.writer_token = secrets.token_urlsafe(32)
        self.actors: dict[str, Any] = {}  # name -> handle, in start order
        self.addresses: dict[str, str] = {}
        self.targets: list[str] = []  # target actor names, in rotation order
        self._next_target = 0
        self._push_pending = False  # the coordinator may not hold self.targets (a push failed)
        self.memory_namespace = ""  # resolved by up (auto: the pair's)
        self.calibration: SeedResult | None = None  # what seeding the calibration did
        self.default_lambda: int | None = None  # the coordinator's λ chosen for that calibration

    def up(self) -> dict[str, Any]:
        c = self.config
        try:
            self.memory_namespace = c.resolved_memory_namespace()
            memory = self._start("memory", c.memory, ["--db", c.memory_db, *c.memory.args], self.writer_token)
            calibration = c.calibration_file(self.memory_namespace)
            if calibration is not None:  # before the targets start: their first snapshot holds it
                self.calibration = self._seed(memory, calibration)
            self._start("draft", c.draft, self._model_args(c.draft_model, c.draft))
            for _ in range(c.target_replicas):
                self.targets.append(self._start_target(memory))
            self.default_lambda = self._calibrated_lambda(calibration)
            self._start(
                "coordinator",
                c.coordinator,
                [
                    "--tokenizer", c.target_model, "--draft-addr", self.addresses["draft"],
                    *[a for name in self.targets for a in ("--target-addr", self.addresses[name])],
                    *([] if self.default_lambda is None else ["--default-lambda", str(self.default_lambda)]),
                    *c.coordinator.args,
                ],
            )  # fmt: skip
        except BaseException:
            self.down()
            raise
        return self.status()

    def _seed(self, memory_address: str, path: Path) -> SeedResult:
        """Load the calibration into a never-written namespace with the verifiers' credentials (`calispec up`'s
        rule: shipped_calibration.py)."""
        with pem_files(self.tls.get("target")) as tls:  # the verifiers' client certificate
            result = seed_namespace(memory_address, self.memory_namespace, path, self.writer_token, tls)
        log.info("%s", result.message)
        return result

    def _calibrated_lambda(self, calibration: Path | None) -> int | None:
        """The λ chosen for a seeded shipped calibration where it holds (the file is in the memory, the
        coordinator's args set no τ or λ of their own, the guard is on and the target serves a dtype λ was
        chosen on); None: the coordinator's default (the paper's)."""
        own = any(a.split("=")[0] in CSD_DEFAULT_FLAGS for a in self.config.coordinator.args)
        if calibration is None or own:
            return None  # the coordinator's args decide
        serves = ray.get(self.actors[self.targets[0]].serves.remote(), timeout=CALL_TIMEOUT_S)
        seeded = self.calibration is not None and self.calibration.present
        choices = dict(chosen_lambdas(calibration.stem, meaning_guard=True)) if is_shipped(calibration) else {}
        return served_lambda(
            choices, serves["dtype"], seeded=seeded, meaning_guard=serves["meaning_guard"], papers_tau=True
        )

    def _model_args(self, model: str, spec: ServiceSpec) -> list[str]:
        return ["--model", model, *spec.args]

    def _start_target(self, memory_address: str) -> str:
        name = f"target-{self._next_target}"
        self._next_target += 1
        args = [
            *self._model_args(self.config.target_model, self.config.target),
            "--memory-addr", memory_address, "--memory-namespace", self.memory_namespace,
        ]  # fmt: skip
        self._start(name, self.config.target, args, self.writer_token)
        return name

    def _start(self, name: str, spec: ServiceSpec, args: list[str], token: str | None = None) -> str:
        actor = ServiceActor.options(**spec.actor_options(name, self.config.namespace)).remote()
        self.actors[name] = actor
        kind = name.split("-")[0]
        ref = actor.start.remote(kind, self.config.host, spec.port, args, token, self.tls.get(kind))
        self.addresses[name] = ray.get(ref, timeout=self.config.start_timeout_s)
        return self.addresses[name]

    def scale(self, replicas: int) -> dict[str, Any]:
        """Add or remove target replicas while serving (removal drains first)."""
        if replicas < 1:
            raise ValueError("at least one target replica must stay")
        while len(self.targets) < replicas:
            name = self._start_target(self.addresses["memory"])
            self.targets.append(name)
            self._push_targets()
        while len(self.targets) > replicas:
            name = self.targets.pop()  # the newest goes first
            try:
                self._push_targets()
            except Exception:
                # the coordinator may still route to it: it keeps serving, listed, until a push succeeds
                self.targets.append(name)
                raise
            self._drain(name)
            self._stop_actor(name)
        if self._push_pending:  # a push that failed may still have landed (a timeout cancels nothing): send the list
            self._push_targets()
        return self.status()

    def _push_targets(self) -> None:
        self._push_pending = True  # until the coordinator acknowledges this list
        targets = [self.addresses[n] for n in self.targets]
        ray.get(self.actors["coordinator"].set_targets.remote(targets), timeout=CALL_TIMEOUT_S)
        self._push_pending = False

    def _drain(self, name: str) -> None:
        """Wait until the replica (already out of rotation) has no open sessions, or the drain timeout."""
        actor = self.actors[name]
        deadline = time.monotonic() + self.config.drain_timeout_s
        idle_polls = 0
        time.sleep(0.2)  # a request that picked it just before the push is about to open its session
        while time.monotonic() < deadline:
            try:
                wait_s = min(CALL_TIMEOUT_S, max(deadline - time.monotonic(), 0.1))
                sessions = ray.get(actor.open_sessions.remote(), timeout=wait_s)
            except GetTimeoutError:
                log.warning("%s does not answer; stopping it", name)
                return
            idle_polls = idle_polls + 1 if sessions == 0 else 0
            if idle_polls >= 2:
                return
            time.sleep(0.2)
        timeout = self.config.drain_timeout_s
        log.warning("%s still has sessions after %.0fs; stopping it (they fail UNAVAILABLE)", name, timeout)

    def _stop_actor(self, name: str, drain_timeout_s: float | None = None) -> None:
        actor = self.actors.pop(name)
        self.addresses.pop(name, None)
        try:
            ray.get(actor.stop.remote(drain_timeout_s), timeout=(drain_timeout_s or 0) + STOP_GRACE_S + 30)
        except Exception:
            log.exception("stopping %s", name)
        ray.kill(actor)

    def status(self) -> dict[str, Any]:
        return {
            "namespace": self.config.namespace,
            "coordinator": self.addresses.get("coordinator"),
            "addresses": dict(self.addresses),
            "targets": [self.addresses[n] for n in self.targets if n in self.addresses],
            # False: the last push of that list failed (it may have landed: a timeout cancels nothing), so the
            # coordinator may route to another set until a push succeeds; the next `scale` sends it again
            "targets_confirmed": not self._push_pending,
            "memory_namespace": self.memory_namespace,
            "calibration": self.calibration.message if self.calibration else None,
            "default_lambda": self.default_lambda,  # None: the coordinator's own (the paper's, or its args')
        }

    def stats(self) -> dict[str, dict[str, Any]]:
        refs = [a.stats.remote() for a in self.actors.values()]
        return dict(zip(self.actors, ray.get(refs, timeout=CALL_TIMEOUT_S), strict=True))

    def down(self, drain_timeout_s: float | None = None) -> None:
        """Stop the coordinator first, drained for at most `drain_timeout_s` (None: the config's), then the
        targets, the draft, and the memory last (it flushes). By kind, not start order: a target added by
        `scale` starts after the coordinator, and stopped first it failed the requests it was serving."""
        drain = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        for name in sorted(self.actors, key=lambda n: STOP_ORDER.index(n.split("-")[0])):
            self._stop_actor(name, drain if name == "coordinator" else None)
        self.targets = []


ControllerActor = ray.remote(Controller)


# -- driver side (what the CLI calls) ------------------------------------------------------------


def connect(address: str | None, namespace: str = DEFAULT_NAMESPACE) -> None:
    """Join the cluster as a driver (once per process)."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=False)


def up(config: RayDeployConfig) -> dict[str, Any]:
    try:
        ray.get_actor(CONTROLLER, namespace=config.namespace)
    except ValueError:
        pass
    else:
        raise DeploymentError(f"a deployment already runs in namespace {config.namespace!r}; `calispec ray down` first")
    controller = ControllerActor.options(
        name=CONTROLLER, namespace=config.namespace, lifetime="detached", num_cpus=0
    ).remote(config, config.tls_bundle())
    try:
        return ray.get(controller.up.remote())
    except BaseException:
        ray.kill(controller)
        raise


def controller(namespace: str = DEFAULT_NAMESPACE) -> Any:
    try:
        return ray.get_actor(CONTROLLER, namespace=namespace)
    except ValueError:
        raise DeploymentError(
            f"no Calispec deployment in Ray namespace {namespace!r} (`calispec ray up` first)"
        ) from None


def scale(replicas: int, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    return ray.get(controller(namespace).scale.remote(replicas))


def status(namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
    return ray.get(controller(namespace).status.remote())


def stats(namespace: str = DEFAULT_NAMESPACE) -> dict[str, dict[str, Any]]:
    return ray.get(controller(namespace).stats.remote())


def down(namespace: str = DEFAULT_NAMESPACE, drain_timeout_s: float | None = None) -> None:
    """Drain the coordinator (at most `drain_timeout_s`; None: the deployment's), stop every service, and
    remove the controller."""
    ctl = controller(namespace)
    try:
        ray.get(ctl.down.remote(drain_timeout_s))
    finally:
        ray.kill(ctl)
