"""`--int8-scales`: an int8 draft's teacher-forced calls on one scale a call, or every row on its own (int8_gemm.py)."""

from __future__ import annotations

import argparse

import pytest

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate import job
from calispec_tools.calibrate.corpus import Document
from calispec_tools.calibrate.job import CalibrateConfig, Calibrator
from calispec_tools.cli import build_parser
from calispec_tools.cli_auth import USAGE_ERROR
from tests.conftest import TinyPair


def test_the_flag_defaults_to_the_shipped_files_scales_in_calibrate_and_its_bench() -> None:
    parser = build_parser()
    calibrate = parser.parse_args(["calibrate", "--corpus", "x"])
    assert calibrate.int8_scales == "call"  # what the shipped file was counted with (make calibration)
    assert parser.parse_args(["bench", "calibration", "--int8-scales", "row"]).int8_scales == "row"
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--corpus", "x", "--int8-scales", "token"])
    with pytest.raises(ValueError, match="int8_scales"):
        CalibrateConfig(int8_scales="token").validate()


COMMANDS = [["calibrate", "--corpus", "corpus.jsonl"], ["bench", "calibration"]]
ROW_SCALE_MISUSES = [  # (flags beside --int8-scales row, the refusal), each before anything loads
    (["--int8-outliers", "shared"], "--int8-scales row needs --int8-outliers split"),
    # a float draft has no activation scales: the flag did nothing, silently, before wave 49
    (["--draft-dtype", "bfloat16"], "--int8-scales row is for an int8 draft; this one runs in bfloat16"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("flags", "refusal"), ROW_SCALE_MISUSES)
def test_row_scales_without_what_they_need_is_a_usage_error_before_anything_loads(
    command: list[str], flags: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args([*command, "--int8-scales", "row", *flags])
    assert args.func(args) == USAGE_ERROR
    assert refusal in capsys.readouterr().err


def test_a_calibrator_with_row_scales_asks_every_batch_for_them(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    target = ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu"))
    asked: list[bool] = []
    batch_events = job.batch_events
    monkeypatch.setattr(job, "batch_events", lambda *a: asked.append(a[-1]) or batch_events(*a))
    docs = [Document("def f(x):\n    return x + 1\n" * 8, False, "t"), Document("a prompt", True, "t")]
    for scales, expected in (("row", True), ("call", False)):
        config = CalibrateConfig(generate=True, max_new_tokens=4, int8_scales=scales)
        assert Calibrator(draft, target, config).run(docs).events >= 0
        assert asked and set(asked) == {expected}
        asked.clear()


def test_row_scales_refuse_a_float_draft_and_one_whose_layers_keep_one_scale(tiny_pair: TinyPair) -> None:
    shared = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu", int8_outliers="shared"))
    target = ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu"))
    with pytest.raises(ValueError, match="--int8-outliers split"):
        Calibrator(shared, target, CalibrateConfig(int8_scales="row"))
    with pytest.raises(ValueError, match="for an int8 draft; this one runs in float32"):
        Calibrator(target, target, CalibrateConfig(int8_scales="row"))  # a float32 draft: nothing to quantise
    Calibrator(target, target, CalibrateConfig(int8_scales="call"))


def test_calibrate_says_why_when_row_scales_cannot_be_given(tiny_pair: TinyPair) -> None:
    from calispec_tools.cli_calibrate import _load

    args = argparse.Namespace(draft_dtype="int8", dtype="float32", device="cpu", int8_outliers="shared")
    with pytest.raises(SystemExit, match="cannot calibrate: int8 scales per row need"):
        _load(args, CalibrateConfig(int8_scales="row"), tiny_pair.draft, tiny_pair.target)


def test_row_scales_refuse_a_machine_without_the_exact_integer_gemm(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    monkeypatch.setattr(job.int8_gemm, "exact_here", lambda row_scales=False: not row_scales)
    with pytest.raises(ValueError, match="integer GEMM, which is missing or not exact here"):
        Calibrator(draft, draft, CalibrateConfig(int8_scales="row"))
    Calibrator(draft, draft, CalibrateConfig(int8_scales="call"))  # one scale a call needs nothing of it
