"""Shared fixtures: the tiny offline model pair, loaded runners, in-process services on port 0."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

import calispec_tools.models.tiny as tiny_models
from calispec_core.modeling import ModelRunner, ModelSpec

REPO = Path(__file__).resolve().parent.parent
TINY_PAIR_DIR = REPO / ".cache" / f"tiny-{hashlib.sha256(Path(tiny_models.__file__).read_bytes()).hexdigest()[:12]}"


def _hermetic_environment() -> None:
    """What a developer's shell or a CI runner may hold must not change a test (found by probing the suite in such
    environments; wave 56), subprocesses included: the SDK's own defaults (a stale CA failed 83 tests), and proxies
    for loopback (the tests' HTTP clients honour them; the product's gRPC channels dial loopback directly:
    tests/unit/test_loopback_proxy.py); matplotlib's cache stays out of the user's home."""
    for name in ("CALISPEC_TOKEN", "CALISPEC_TLS_CA"):
        os.environ.pop(name, None)
    for name in ("no_proxy", "NO_PROXY"):
        os.environ[name] = ",".join(filter(None, [os.environ.get(name), "127.0.0.1", "localhost", "::1"]))
    os.environ["MPLCONFIGDIR"] = str(REPO / ".cache" / "matplotlib")


_hermetic_environment()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="where the end-to-end stack tests run their model services (`make test-cuda`: cuda)",
    )


@pytest.fixture(scope="session")
def stack_device(pytestconfig: pytest.Config) -> str:
    """The model services' device in the end-to-end stack tests; cuda fails (never skips) without a GPU."""
    device: str = pytestconfig.getoption("device")
    if device.startswith("cuda"):
        import torch

        assert torch.cuda.is_available(), f"--device {device}: torch sees no CUDA device here"
    return device


@dataclass(frozen=True)
class TinyPair:
    draft: Path
    target: Path


@pytest.fixture(scope="session")
def tiny_pair() -> TinyPair:
    """Built once (about 20 s) and cached under .cache/, keyed by the builder's source."""
    target, draft = tiny_models.build_tiny_pair(TINY_PAIR_DIR)
    return TinyPair(draft=draft, target=target)


@pytest.fixture(scope="session")
def target_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def draft_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu"))


@pytest.fixture(autouse=True)
def no_running_stack(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Commands default to the running `calispec up`'s memory and namespace: keep a real one on this
    machine out of the tests (each test gets its own, absent, state file)."""
    from calispec_tools import stack_state

    path = tmp_path_factory.mktemp("state") / "stack.json"
    monkeypatch.setattr(stack_state, "state_path", lambda: path)
    return path


@pytest.fixture(autouse=True)
def tests_own_tiny_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--pair tiny` in process is the suite's tiny pair (built once, when first asked for): it was built into the
    user's cache (~/.cache/calispec), and tests failed where the home is not writable (found by probing)."""
    from calispec_tools import cli

    monkeypatch.setattr(cli, "tiny_pair_dir", lambda: TINY_PAIR_DIR)
