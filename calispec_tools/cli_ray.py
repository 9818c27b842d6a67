"""`calispec ray up|scale|status|down`: Calispec on a Ray cluster (see calispec_tools/deploy/ray_actors.py).

Wired into `calispec` by `register(subparsers)`; also runs alone: `python -m calispec_tools.cli_ray up ...`.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calispec_tools.arg_types import seconds_or_zero
from calispec_tools.cli_auth import usage_error
from calispec_tools.deploy.ray_config import (
    DEFAULT_NAMESPACE,
    ConfigError,
    DeploymentError,
    RayDeployConfig,
    check_reachable,
)

if TYPE_CHECKING:
    from types import ModuleType

SCALE_SPEC = re.compile(r"^target=(\d+)$")


def register(subparsers: Any) -> None:
    """Add the `ray` command (with its own subcommands) to an argparse subparsers object."""
    ray_parser = subparsers.add_parser("ray", help="deploy on a Ray cluster (up, scale, status, down)")
    add_commands(ray_parser)


def add_commands(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="ray_command", required=True)
    up = commands.add_parser("up", help="place memory, draft, target replicas and coordinator as Ray actors")
    up.add_argument("--config", type=Path, required=True, help="deployment config (YAML or TOML)")
    _common(up)
    up.set_defaults(func=reported(_up))
    scale = commands.add_parser("scale", help="change the number of target replicas while serving")
    scale.add_argument("spec", help="target=N")
    _common(scale)
    scale.set_defaults(func=reported(_scale))
    status = commands.add_parser("status", help="addresses of the services")
    _common(status)
    status.set_defaults(func=reported(_status))
    down = commands.add_parser("down", help="drain the coordinator, then stop everything")
    down.add_argument(
        "--drain-timeout-s", type=seconds_or_zero, default=None,
        help="how long the coordinator's running requests may take to finish (new ones are refused "
        "meanwhile); default: the deployment's drain_timeout_s",
    )  # fmt: skip
    _common(down)
    down.set_defaults(func=reported(_down))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS or a local one)")
    parser.add_argument("--namespace", default=None, help="Ray namespace of the deployment (default: from config)")


def _namespace(args: argparse.Namespace) -> str:
    return args.namespace or DEFAULT_NAMESPACE


def _connected(address: str | None, namespace: str) -> ModuleType:
    """The deployment module, its driver joined to the cluster at `address` (checked first: see check_reachable)."""
    check_reachable(address)
    deploy_ray = _deploy_ray()
    deploy_ray.connect(address, namespace)
    return deploy_ray


def _deploy_ray() -> ModuleType:
    """Imported on use, so `calispec --help` works where Ray (the `ray` extra) is not installed."""
    try:
        from calispec_tools.deploy import ray_actors as deploy_ray
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise SystemExit("Ray is not installed: pip install -e '.[ray]' (the `ray` extra)") from None
    return deploy_ray


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True), flush=True)


def reported(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`command` with an operator's mistakes as one line (each was a traceback, exit 1): a config it cannot use
    (exit 2), no deployment or one already running, and a Ray task's failure by its innermost cause, a service's
    bad flags with argparse's message (exit 1). Anything else is a bug: its traceback stays."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except Exception as exc:
            # first: what ray.get raises for an actor's DeploymentError is a subclass of it too, whose str() is
            # Ray's whole remote traceback (found by review)
            if (line := ray_task_failure(exc)) is not None:
                print(line, file=sys.stderr)
                return 1
            if isinstance(exc, ConfigError):
                return usage_error(exc)
            if isinstance(exc, DeploymentError):
                print(f"error: {exc}", file=sys.stderr)
                return 1
            raise

    return run


def ray_task_failure(exc: BaseException) -> str | None:
    """The line for a Ray task that failed (its innermost cause, through the controller's own calls), or None
    for an exception that is not one."""
    if "ray" not in sys.modules:
        return None
    from ray.exceptions import RayTaskError

    if not isinstance(exc, RayTaskError):
        return None
    cause: BaseException = exc
    while isinstance(cause, RayTaskError) and cause.cause is not None and cause.cause is not cause:
        cause = cause.cause
    if isinstance(cause, DeploymentError | ConfigError):
        return f"error: {cause}"
    return f"error: a Ray task failed: {type(cause).__name__}: {cause} (its traceback is in the actor's log)"


def _up(args: argparse.Namespace) -> int:
    config = RayDeployConfig.load(args.config)  # before Ray is imported: a bad config is a usage error without it
    if args.namespace:
        config = RayDeployConfig(**{**config.__dict__, "namespace": args.namespace})
    deploy_ray = _connected(args.address, config.namespace)
    _print(deploy_ray.up(config))
    return 0


def _scale(args: argparse.Namespace) -> int:
    match = SCALE_SPEC.match(args.spec)  # bad input fails before anything connects
    if match is None:
        return usage_error(f"scale takes target=N, got {args.spec!r}")
    deploy_ray = _connected(args.address, _namespace(args))
    _print(deploy_ray.scale(int(match.group(1)), _namespace(args)))
    return 0


def _status(args: argparse.Namespace) -> int:
    deploy_ray = _connected(args.address, _namespace(args))
    _print(deploy_ray.status(_namespace(args)))
    return 0


def _down(args: argparse.Namespace) -> int:
    deploy_ray = _connected(args.address, _namespace(args))
    bound = "the deployment's drain_timeout_s" if args.drain_timeout_s is None else f"{args.drain_timeout_s:g} s"
    # The drain can take minutes of silence: say what is being waited for, before waiting
    print(f"draining the coordinator (its running requests finish, at most {bound}), then stopping the services...",
          flush=True)  # fmt: skip
    deploy_ray.down(_namespace(args), args.drain_timeout_s)
    print("down", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="calispec ray", description=__doc__)
    add_commands(parser)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
