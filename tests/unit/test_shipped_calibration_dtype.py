"""The shipped calibration is chosen for the target dtype served: each dtype breaks near-ties its own way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calispec_tools import shipped_calibration
from calispec_tools.shipped_calibration import shipped_file, shipped_for_namespace

NAMESPACE = "pair/draft-1+target-2/abc"


@pytest.fixture
def calibration_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(shipped_calibration, "CALIBRATION_DIR", tmp_path)
    return tmp_path


def write(directory: Path, name: str, namespace: str = NAMESPACE) -> Path:
    path = directory / name
    path.write_text(json.dumps({"namespace": namespace}), encoding="utf-8")
    return path


def test_the_served_dtype_has_its_own_file_first(calibration_dir: Path) -> None:
    default = write(calibration_dir, "pair.json")
    float32 = write(calibration_dir, "pair.float32.json")
    assert shipped_file("pair", "float32") == float32
    assert shipped_for_namespace(NAMESPACE, "float32") == float32
    assert shipped_file("pair", "bfloat16") == default  # no bf16 file of its own: the default
    assert shipped_for_namespace(NAMESPACE, "bfloat16") == default
    assert shipped_file("pair") == default


def test_another_dtypes_file_is_never_chosen(calibration_dir: Path) -> None:
    write(calibration_dir, "pair.float32.json")
    assert shipped_file("pair", "bfloat16") is None
    assert shipped_for_namespace(NAMESPACE, "bfloat16") is None
    assert shipped_for_namespace("pair/other/ns", "float32") is None
