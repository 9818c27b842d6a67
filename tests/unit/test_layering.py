"""The package layout is the architecture: contract and core at the bottom, services on top of the
core, tools above the services. These tests read every module's imports (no execution) and fail
on an import that points downwards-to-upwards, so a cycle cannot creep back in."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("coordinator", "draft_service", "target_service", "memory_service")

# package -> top-level packages it must never import (directly or in a function body)
FORBIDDEN: dict[str, set[str]] = {
    "calispec_core": {"calispec_tools", *SERVICES},
    **{service: {"calispec_tools", *(s for s in SERVICES if s != service)} for service in SERVICES},
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    tops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downwards(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package} has no modules"
    violations = [
        f"{path.relative_to(ROOT)} imports {top}"
        for path in files
        for top in sorted(imported_top_levels(path) & FORBIDDEN[package])
    ]
    assert not violations, "\n".join(violations)


# the SDK installs with grpcio and protobuf only: nothing else may reach it
SDK_ALLOWED = {"calispec", "grpc", "google", *sys.stdlib_module_names}


def test_sdk_imports_only_grpc_protobuf_and_stdlib() -> None:
    violations = [
        f"{path.relative_to(ROOT)} imports {top}"
        for path in sorted((ROOT / "calispec").rglob("*.py"))
        for top in sorted(imported_top_levels(path) - SDK_ALLOWED)
    ]
    assert not violations, "\n".join(violations)


def test_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from calispec_tools.cli import main\n")
    assert "calispec_tools" in imported_top_levels(bad)
