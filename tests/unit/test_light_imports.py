"""The SDK and the CLI's light paths start without the serving stack (anything of the `serve` extra).

Run in a fresh interpreter: the test session itself has torch loaded already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

# everything the `serve` extra brings (the base install has none of it: see pyproject.toml)
HEAVY = (
    "torch", "transformers", "numpy", "tokenizers", "safetensors", "sqlite_utils", "gguf", "accelerate",
    "tqdm", "cryptography", "prometheus_client", "fastapi", "uvicorn",
)  # fmt: skip


def heavy_modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sdk_import_loads_no_serving_stack() -> None:
    assert heavy_modules_after("from calispec.client import AsyncCalispecClient, CalispecClient") == []


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["memory", "--help"], ["generate", "--help"]])
def test_cli_help_loads_no_serving_stack(argv: list[str]) -> None:
    code = f"from calispec_tools.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert heavy_modules_after(code) == []


def test_probe_sees_a_heavy_import() -> None:
    assert "numpy" in heavy_modules_after("import numpy")
