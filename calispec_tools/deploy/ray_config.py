"""The Ray deployment's configuration (no Ray import: the CLI and tests read it without Ray)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_NAMESPACE = "calispec"
SERVICES = ("memory", "draft", "target", "coordinator")


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
    memory_namespace: str = "default"
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayDeployConfig:
        data = dict(data)
        models = data.pop("models", {})
        specs = {name: _spec(name, data.pop(name, {})) for name in SERVICES}
        replicas = data.pop("target_replicas", None)
        if replicas is None:  # `target: {replicas: N}` reads better in a config file
            replicas = specs["target"][1]
        known = {"namespace", "host", "drain_timeout_s", "start_timeout_s", "memory_db", "memory_namespace", "tls_dir"}
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
        """YAML (.yaml/.yml) or TOML (.toml)."""
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".toml":
            return cls.from_dict(tomllib.loads(text))
        import yaml  # a Ray dependency

        return cls.from_dict(yaml.safe_load(text) or {})


def _spec(name: str, section: dict[str, Any]) -> tuple[ServiceSpec, int]:
    section = dict(section)
    replicas = int(section.pop("replicas", 1)) if name == "target" else 1
    unknown = set(section) - {"num_cpus", "num_gpus", "resources", "args", "port"}
    if unknown:
        raise ValueError(f"unknown keys in {name}: {sorted(unknown)}")
    section["args"] = tuple(str(a) for a in section.get("args", ()))
    section["resources"] = {str(k): float(v) for k, v in section.get("resources", {}).items()}
    return ServiceSpec(**section), replicas
