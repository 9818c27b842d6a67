"""Small test utilities."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
import torch

from calispec_core.access import ApiKeys, key_line, new_api_key
from calispec_core.modeling import ModelRunner
from calispec_tools.memory_file import dump_export
from calispec_tools.shipped_calibration import SUMS_NAME

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
# `calispec up` on a free port each: a default port (50050..50053, 8000) may be held on the machine running the
# tests (CI's was: wave 55's submission failed there once `up` refused taken ports before it starts).
UP_ON_FREE_PORTS = ["--no-http", "--port", "0", "--draft-port", "0", "--target-port", "0", "--memory-port", "0"]


def wait_until(probe: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy; fail the test after timeout_s.

    For state another process reaches asynchronously (e.g. events flushed to the memory
    service): the test waits on the condition itself, never on a fixed sleep.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s (last value: {value!r})")
        time.sleep(interval_s)


def ports_outside_the_ephemeral_range(*spans: int) -> list[int]:
    """For each span, the first of that many consecutive free loopback ports (a stack's target replicas listen on
    target_port + i), all outside the kernel's ephemeral range: for servers that stop and start again on their port.
    A port of that range (what port 0 gives) can be taken in between as the local port of any outgoing connection, a
    peer's own reconnect to it included (a TCP self-connect), and the restart then finds it in use."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    # below the range and above it (a range that starts low leaves little below); a block of up to 16 ports fits
    candidates = [*range(max(1024, low - 12000), low - 16), *range(high + 1, 65536 - 16)]
    assert max(spans) <= 16, "blocks of more than 16 ports would reach into the range"
    firsts: list[int] = []
    taken: set[int] = set()
    for first in random.sample(candidates, min(400, len(candidates))):
        span = spans[len(firsts)]
        block = set(range(first, first + span))
        if block & taken or not all(_free(port) for port in block):
            continue
        firsts.append(first)
        taken |= block
        if len(firsts) == len(spans):
            return firsts
    pytest.fail(f"not enough free ports outside the ephemeral range {low}-{high}")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rpc_code(fn: Callable[[], object]) -> grpc.StatusCode:
    """Call fn, expecting a grpc.RpcError; return its status code."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code()


@torch.inference_mode()
def reference_greedy(runner: ModelRunner, prompt_ids: list[int], n: int) -> list[int]:
    """Target-only greedy decoding without any cache: the ground truth for SD equality."""
    ids = list(prompt_ids)
    for _ in range(n):
        logits = runner.model(input_ids=torch.tensor([ids])).logits  # [1, S, V]
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids) :]


def spawn_memory_service(
    db: Path, token_file: Path, *extra: str, stderr: int = subprocess.PIPE
) -> tuple[subprocess.Popen[str], str]:
    """`python -m memory_service` on port 0; returns the process and its readiness line (read, so it serves)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "memory_service", "--port", "0", "--db", str(db), "--log-level", "WARNING",
         "--writer-token-file", str(token_file), *extra],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline()  # blocks until the server listens (or the process dies: "")


def one_api_key(directory: Path | None) -> tuple[str | None, ApiKeys | None]:
    """A fresh API key for caller "alice" in `directory`/keys, and the keys file read back; (None, None)
    without a directory (an API open to all)."""
    if directory is None:
        return None, None
    key = new_api_key()
    (directory / "keys").write_text(key_line("alice", key))
    return key, ApiKeys(directory / "keys")


def write_recorded_export(path: Path, namespace: str, pairs: list[tuple[int, int, int]]) -> Path:
    """An export of `pairs` (draft, target, count) for `namespace`, its sha256 recorded in a SHA256SUMS beside it
    (as the shipped calibration's is: a stack or a deployment seeds only such a file)."""
    dump_export(path, namespace, 1, pairs, exported_at="")
    (path.parent / SUMS_NAME).write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    return path


def bench_compare_service_flag(tmp_path: Path, flag: str, *flags: str) -> str | None:
    """The value `bench compare --pair qwen-coder [flags]` gives both model services for `flag` (None: it passes
    none, so the services keep their own default)."""
    from calispec_tools.bench.compare import compare_stack_config
    from calispec_tools.cli import build_parser
    from calispec_tools.stack import LocalStack

    bench = build_parser().parse_args(["bench", "compare", "--pair", "qwen-coder", *flags])
    bench.model_dirs = (tmp_path / "draft", tmp_path / "target")
    args = LocalStack(compare_stack_config(bench, tmp_path)).model_service_args()
    return args[args.index(flag) + 1] if flag in args else None
