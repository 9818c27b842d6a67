"""The wheel carries every data file the tools read at run time: pyproject's package-data globs, expanded as
setuptools expands them (glob.glob, recursive, from the package directory), cover calispec_tools/data; and the
project's metadata reads without setuptools' deprecations."""

from __future__ import annotations

import glob
import subprocess
import tomllib
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "calispec_tools"


def package_data_globs() -> list[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["tool"]["setuptools"]["package-data"]["calispec_tools"]


def packaged(root: Path) -> set[str]:
    """The files under `root` the globs take, relative to it."""
    found = {f for pattern in package_data_globs() for f in glob.glob(pattern, root_dir=root, recursive=True)}
    return {f for f in found if (root / f).is_file()}


def tracked_data_files() -> set[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "data"], cwd=PACKAGE, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return set(listed.splitlines())


def test_every_tracked_data_file_is_package_data() -> None:
    """Only data/prompts/*.jsonl and data/eval/*.jsonl were: a wheel had no shipped calibration, no SHA256SUMS,
    no calibration corpus and no dev tasks."""
    tracked = tracked_data_files()
    assert "data/calibration/qwen-coder.json" in tracked
    assert tracked - packaged(PACKAGE) == set()


def test_new_data_files_are_package_data_too(tmp_path: Path) -> None:
    """A calibration for another dtype, a new corpus document, a new task set: no glob to add."""
    new = [
        "data/calibration/qwen-coder.float32.json",
        "data/calibration/SHA256SUMS",
        "data/calibration/corpus/notes.rst",
        "data/eval/dev/code.jsonl",
        "data/eval/holdout/math.jsonl",
    ]
    for name in new:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    assert packaged(tmp_path) == set(new)


def test_metadata_reads_without_setuptools_deprecations() -> None:
    """`license = { text = ... }` is deprecated since setuptools 77 (builds refuse it after 2027-02-18): every fresh
    install printed the warning twice. Any deprecation setuptools finds in pyproject.toml fails here."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
