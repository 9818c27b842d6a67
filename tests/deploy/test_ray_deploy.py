"""deploy/ray, checked offline: the example config speaks the services' real flags; no Ray cluster."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

import coordinator.__main__ as coordinator_cli
import draft_service.__main__ as draft_cli
import memory_service.__main__ as memory_cli
import target_service.__main__ as target_cli
from calispec_tools.deploy.ray_config import RayDeployConfig

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
