"""The SDK installs with its base dependencies only (grpcio, protobuf) and talks to a full stack.

A fresh venv gets `pip install <copy of the repo>` (no extras: whatever pip resolves is the
base install); a script in it generates (sync, streaming, asyncio) against the tiny pair and
the CLI's `generate` runs from it. torch must be neither installed nor imported there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.client import CalispecClient
from calispec_tools.stack import LocalStack, StackConfig
from tests.conftest import TinyPair
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # a pip install and a stack: ~30 s

PROMPT = "def fibonacci(n):"
SCRIPT = """
import asyncio, importlib.util, json, sys
from calispec.client import AsyncCalispecClient, CalispecClient

address, prompt = sys.argv[1:3]
with CalispecClient(address, timeout=60) as client:
    result = client.generate(prompt, max_new_tokens=12, mode="sd")
    streamed = [c.token_ids for c in client.generate_stream(prompt, max_new_tokens=12, mode="sd")]

async def agenerate():
    async with AsyncCalispecClient(address, timeout=60) as client:
        return (await client.generate(prompt, max_new_tokens=12, mode="sd")).token_ids

print(json.dumps({
    "token_ids": result.token_ids,
    "streamed": [t for ids in streamed for t in ids],
    "async": asyncio.run(agenerate()),
    "drafted": result.stats.drafted,
    "torch_installed": importlib.util.find_spec("torch") is not None,
    "torch_imported": "torch" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("light")
    source = root / "source"
    ignore = shutil.ignore_patterns(".venv", ".git", ".cache", "*.egg-info", "__pycache__", "build", "tests")
    shutil.copytree(REPO_ROOT, source, ignore=ignore)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", str(source)],
        check=True,
        timeout=300,
    )
    return venv


@pytest.fixture(scope="module")
def stack(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("stack")
    config = StackConfig(
        draft_model=tiny_pair.draft, target_model=tiny_pair.target, memory_db=tmp / "memory.db",
        log_dir=tmp / "logs", coordinator_port=0, target_port=0, draft_port=0, memory_port=0,
        dtype="float32", device="cpu", start_timeout_s=120,
    )  # fmt: skip
    with LocalStack(config) as s:
        yield s


def test_base_install_generates_without_torch(light_venv: Path, stack: LocalStack) -> None:
    run = subprocess.run(
        [str(light_venv / "bin" / "python"), "-c", SCRIPT, stack.coordinator_address, PROMPT],
        cwd=light_venv,  # not the repo: the installed copy must be what runs
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert not seen["torch_installed"] and not seen["torch_imported"]
    with CalispecClient(stack.coordinator_address, timeout=60) as client:
        expected = client.generate(PROMPT, max_new_tokens=12, mode="sd").token_ids
    assert seen["token_ids"] == seen["streamed"] == seen["async"] == expected
    assert seen["drafted"] > 0


def test_base_install_cli_generates(light_venv: Path, stack: LocalStack) -> None:
    run = subprocess.run(
        [str(light_venv / "bin" / "calispec"), "generate", "--address", stack.coordinator_address,
         "--prompt", PROMPT, "--max-new-tokens", "8", "--json"],
        cwd=light_venv, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["token_ids"]) == 8
