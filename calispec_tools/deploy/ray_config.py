"""The Ray deployment's configuration (no Ray import: the CLI and tests read it without Ray)."""

from __future__ import annotations

import contextlib
import io
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calispec_core.limits import NAMESPACE_PATTERN
from calispec_tools.namespaces import pair_namespace

DEFAULT_NAMESPACE = "calispec"
SERVICES = ("memory", "draft", "target", "coordinator")
AUTO_NAMESPACE = "auto"  # memory_namespace: the pair's, derived from the models as `calispec up` does
SHIPPED, NO_CALIBRATION = "shipped", "none"


class ConfigError(ValueError):
    """A deployment config that cannot be used: the file and what is wrong (`calispec ray up`'s one line)."""


class DeploymentError(RuntimeError):
    """What `calispec ray` reports as one line: no deployment, one already running, a service's bad flags."""


REACH_TIMEOUT_S = 5.0  # a cluster's head answers a TCP connect at once; Ray's own retries took over 90 s


def check_reachable(address: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """DeploymentError at once where nothing answers at an explicit `host:port` (or `ray://host:port`) address:
    `ray.init` retried such an address for over 90 s before its error (found by probing). Other forms (None,
    "auto", "local") are Ray's to resolve."""
    host, sep, port = (address or "").removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__  # a timeout has no strerror
        raise DeploymentError(
            f"no Ray cluster answers at {address} ({why}): is it running, is the port right?"
        ) from None


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSpec:
    """Resource requests and extra CLI flags of one service (per replica for the target)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources, e.g. {"a100": 1}
    args: tuple[str, ...] = ()  # extra flags of `python -m <service>`, e.g. ("--max-batch-size", "8")
    port: int = 0  # 0: any free port (the coordinator usually gets a fixed one)

    def actor_options(self, name: str, namespace: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": namespace,
            "lifetime": "detached",  # outlives the `calispec ray up` driver
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "resources": dict(self.resources),
            "max_concurrency": 4,  # status calls while a drain waits
        }


@dataclass(frozen=True)
class RayDeployConfig:
    draft_model: str  # paths as seen on the nodes (a shared filesystem or the same path everywhere)
    target_model: str
    memory_db: str
    namespace: str = DEFAULT_NAMESPACE
    target_replicas: int = 1
    host: str = "auto"  # interface services bind and advertise; auto: the node's Ray IP
    drain_timeout_s: float = 60.0
    start_timeout_s: float = 600.0
    # the correction memory's namespace: auto = the pair's (calispec_tools/namespaces.py), from the models' files
    # as the controller's node sees them, so a shipped calibration finds its pair
    memory_namespace: str = AUTO_NAMESPACE
    # seeded into a never-written namespace before the targets start: shipped (the file the repo ships for the
    # pair, if any: calispec_tools/shipped_calibration.py), none, or an export file as the controller's node sees
    # it, whose sha256 a SHA256SUMS file beside it records
    calibration: str = SHIPPED
    memory: ServiceSpec = field(default_factory=ServiceSpec)
    draft: ServiceSpec = field(default_factory=ServiceSpec)
    target: ServiceSpec = field(default_factory=ServiceSpec)
    coordinator: ServiceSpec = field(default_factory=lambda: ServiceSpec(port=50050))
    # `calispec certs dev` layout (ca.pem, <service>.pem, <service>-key.pem), read on the driver:
    # each actor gets its own service's PEMs through Ray. None: plaintext (loopback hosts only).
    tls_dir: str | None = None

    def __post_init__(self) -> None:
        if self.target_replicas < 1:
            raise ValueError(f"target replicas must be >= 1, got {self.target_replicas}")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")
        if not self.memory_namespace or not self.calibration:
            raise ValueError(f"memory_namespace and calibration must not be empty (calibration: {SHIPPED}, "
                             f"{NO_CALIBRATION} or an export file)")  # fmt: skip
        if self.memory_namespace != AUTO_NAMESPACE and NAMESPACE_PATTERN.fullmatch(self.memory_namespace) is None:
            # the target actor refuses it (wave 55), after the memory and the draft have started (found by review)
            raise ValueError(f"memory_namespace must be {AUTO_NAMESPACE} or 1-128 characters of [A-Za-z0-9._:/+-], "
                             f"got {self.memory_namespace[:140]!r}")  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayDeployConfig:
        data = dict(data)
        models = data.pop("models", {})
        specs = {name: _spec(name, data.pop(name, {})) for name in SERVICES}
        replicas = data.pop("target_replicas", None)
        if replicas is None:  # `target: {replicas: N}` reads better in a config file
            replicas = specs["target"][1]
        known = {
            "namespace", "host", "drain_timeout_s", "start_timeout_s", "memory_db", "memory_namespace", "tls_dir",
            "calibration",
        }  # fmt: skip
        if unknown := set(data) - known:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        try:
            draft, target = models["draft"], models["target"]
        except KeyError as exc:
            raise ValueError("config needs models.draft and models.target") from exc
        return cls(
            draft_model=str(draft),
            target_model=str(target),
            memory_db=str(data.pop("memory_db", "calispec-memory.db")),
            target_replicas=int(replicas),
            **data,
            **{name: spec for name, (spec, _) in specs.items()},
        )

    def resolved_memory_namespace(self) -> str:
        """memory_namespace, or for auto the pair's, from the models' files as this node sees them."""
        if self.memory_namespace != AUTO_NAMESPACE:
            return self.memory_namespace
        for model in (self.draft_model, self.target_model):
            if not (Path(model) / "config.json").is_file():  # a namespace without its hash names no pair
                raise ValueError(
                    f"memory_namespace auto derives the pair's namespace from the models' files, and the Ray "
                    f"controller's node cannot read {model}/config.json: put the models at the same path on "
                    "every node (or a shared filesystem), or set memory_namespace"
                )
        return pair_namespace(Path(self.draft_model), Path(self.target_model))

    def calibration_file(self, memory_namespace: str) -> Path | None:
        """The export to seed into `memory_namespace`: shipped -> the repo's file for that pair (None when it ships
        none), none -> None, else the configured file (which must exist where the controller runs)."""
        if self.calibration == NO_CALIBRATION:
            return None
        if self.calibration == SHIPPED:
            from calispec_tools.shipped_calibration import shipped_for_namespace

            return shipped_for_namespace(memory_namespace)
        path = Path(self.calibration)
        if not path.is_file():
            raise ValueError(f"calibration file {path} not found on the Ray controller's node")
        return path

    def tls_bundle(self) -> dict[str, dict[str, str]]:
        """{service: {"cert", "key", "ca"}: PEM text} from tls_dir; empty without one."""
        if self.tls_dir is None:
            return {}
        directory = Path(self.tls_dir)
        ca = (directory / "ca.pem").read_text(encoding="utf-8")
        return {
            name: {
                "cert": (directory / f"{name}.pem").read_text(encoding="utf-8"),
                "key": (directory / f"{name}-key.pem").read_text(encoding="utf-8"),
                "ca": ca,
            }
            for name in SERVICES
        }

    @classmethod
    def load(cls, path: Path) -> RayDeployConfig:
        """YAML (.yaml/.yml) or TOML (.toml); ConfigError naming the file and what is wrong with it."""
        import yaml  # a Ray dependency

        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the config {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config {path} is not UTF-8 text: {exc}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text) or {}
            if not isinstance(data, dict):
                raise ValueError(f"expected a mapping of settings, got a {type(data).__name__}")
            return cls.from_dict(data)
        except (ValueError, TypeError, AttributeError, yaml.YAMLError) as exc:  # a section of the wrong shape too
            raise ConfigError(f"config {path}: {' '.join(str(exc).split())}") from None


def _spec(name: str, section: dict[str, Any]) -> tuple[ServiceSpec, int]:
    section = dict(section)
    replicas = int(section.pop("replicas", 1)) if name == "target" else 1
    unknown = set(section) - {"num_cpus", "num_gpus", "resources", "args", "port"}
    if unknown:
        raise ValueError(f"unknown keys in {name}: {sorted(unknown)}")
    section["args"] = tuple(str(a) for a in section.get("args", ()))
    section["resources"] = {str(k): float(v) for k, v in section.get("resources", {}).items()}
    return ServiceSpec(**section), replicas


def parsed_service_flags(parse: Any, argv: list[str]) -> Any:
    """Run a service's argparse parser; its usage errors (SystemExit) become a readable exception that carries
    argparse's message (it went to the actor's log only: `calispec ray up` said "see the actor's log")."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parse(argv)
    except SystemExit as exc:
        message = said.getvalue().strip().splitlines()[-1:] or ["(no message)"]
        raise DeploymentError(f"bad service flags {argv!r}: {message[0]}") from exc
