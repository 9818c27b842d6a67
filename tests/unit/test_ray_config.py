"""The Ray deployment config and CLI parsing (no cluster needed)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import calispec_tools.deploy
from calispec_tools import cli_ray
from calispec_tools.deploy.ray_config import RayDeployConfig, check_reachable

REPO = Path(__file__).resolve().parents[2]


def test_the_example_config_loads() -> None:
    config = RayDeployConfig.load(REPO / "deploy" / "ray" / "calispec.yaml")
    assert config.target_replicas == 2 and config.target.num_gpus == 1 and config.target.resources == {"big_gpu": 1}
    options = config.target.actor_options("target-0", config.namespace)
    assert options["lifetime"] == "detached" and options["namespace"] == "calispec"


def test_toml_and_bad_configs(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[models]\ndraft = "/d"\ntarget = "/t"\n[target]\nreplicas = 3\nnum_cpus = 2\n')
    assert RayDeployConfig.load(path).target_replicas == 3
    with pytest.raises(ValueError, match="unknown"):
        RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, "targt": {}})
    with pytest.raises(ValueError, match="models"):
        RayDeployConfig.from_dict({})
    with pytest.raises(ValueError, match=">= 1"):
        RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, "target": {"replicas": 0}})


def test_cli_registers_its_commands() -> None:
    parser = argparse.ArgumentParser()
    cli_ray.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ray", "scale", "target=3", "--address", "auto"])
    assert args.func.__wrapped__ is cli_ray._scale and args.spec == "target=3"
    assert cli_ray.main(["scale", "draft=2"]) == 2  # a usage error (it exited 1)


def test_ray_commands_without_ray_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails, as without the extra
    monkeypatch.delitem(sys.modules, "calispec_tools.deploy.ray_actors", raising=False)
    # a test that imported it left it on its package too, where `from ... import ray_actors` finds it
    monkeypatch.delattr(calispec_tools.deploy, "ray_actors", raising=False)
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[ray\]'"):
        cli_ray.main(["status"])


@pytest.mark.slow  # Ray itself: `make test-slow` installs it
def test_a_service_actor_removes_its_secrets_when_it_stops(tmp_path: Path) -> None:
    """Each actor's writer token (and TLS key) stayed in a /tmp directory after every deployment."""
    from calispec_tools.deploy.ray_actors import ServiceHost

    host = ServiceHost()  # the actor's class, here in this process
    host.start("memory", "127.0.0.1", 0, ["--db", str(tmp_path / "m.db")], writer_token="a-writer-token-0123456789")
    secrets_dir = host._secrets
    assert (secrets_dir / "writer-token").read_text(encoding="utf-8").strip() == "a-writer-token-0123456789"
    host.stop()
    assert not secrets_dir.exists()


def test_ray_down_hands_its_drain_timeout_to_the_deployment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`calispec ray down` drains the coordinator first: `--drain-timeout-s` bounds it (default: the config's)."""
    downs: list[tuple[str, float | None]] = []

    def down(namespace: str, drain_timeout_s: float | None = None) -> None:
        downs.append((namespace, drain_timeout_s))

    fake = SimpleNamespace(connect=lambda address, namespace: None, down=down)
    monkeypatch.setattr(cli_ray, "_deploy_ray", lambda: fake)
    assert cli_ray.main(["down"]) == 0 and cli_ray.main(["down", "--drain-timeout-s", "0", "--namespace", "n"]) == 0
    assert downs == [("calispec", None), ("n", 0.0)]
    said = capsys.readouterr().out.splitlines()  # the drain waited silently: a user could not tell it from a hang
    assert said[0].startswith("draining the coordinator") and "the deployment's drain_timeout_s" in said[0]
    assert "at most 0 s" in said[2] and said[1] == said[3] == "down"
    with pytest.raises(SystemExit):
        cli_ray.main(["down", "--drain-timeout-s", "-1"])
    assert "--drain-timeout-s" in capsys.readouterr().err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when this returns: nothing listens there


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "[::1]:{port}"])
def test_ray_commands_name_an_address_nothing_answers_at_once(
    form: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray.init` retried an unreachable address for over 90 s before its error (found by probing)."""
    monkeypatch.setattr(cli_ray, "_deploy_ray", lambda: pytest.fail("imported Ray for an address nothing answers"))
    address = form.format(port=closed_port())
    assert cli_ray.main(["status", "--address", address]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: no Ray cluster answers at {address} (") and "\n" not in line


def test_a_reachable_or_unparsed_address_is_left_to_ray() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        check_reachable(f"127.0.0.1:{listener.getsockname()[1]}")
    for address in (None, "auto", "local", "ray://head"):
        check_reachable(address)
