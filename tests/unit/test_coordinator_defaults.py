"""The coordinator's server-side CSD defaults (--default-tau, --default-lambda) reach requests that set none."""

from __future__ import annotations

import pytest

from calispec.v1 import coordinator_pb2
from calispec_core.errors import InvalidArgument
from calispec_core.generation import Defaults
from calispec_core.limits import as_float32
from coordinator.__main__ import parse_config
from coordinator.server import params_from_pb

BASE = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x"]


def test_defaults_apply_to_requests_that_leave_tau_and_lambda_unset() -> None:
    config, _ = parse_config([*BASE, "--default-tau", "0.1", "--default-lambda", "20"])
    assert (config.defaults.tau, config.defaults.lambda_) == (0.1, 20)
    unset = params_from_pb(coordinator_pb2.GenerationParams(), config.defaults)
    assert (unset.tau, unset.lambda_) == (0.1, 20)
    own = params_from_pb(coordinator_pb2.GenerationParams(tau=0.5, lambda_=3), config.defaults)
    assert (own.tau, own.lambda_) == (0.5, 3)  # a request's own values win


def test_without_flags_the_paper_defaults_hold() -> None:
    config, _ = parse_config(BASE)
    assert (config.defaults.tau, config.defaults.lambda_) == (Defaults.tau, Defaults.lambda_) == (0.01, 6)


@pytest.mark.parametrize(
    "bad",
    [["--default-tau", "0"], ["--default-tau", "1.5"], ["--default-lambda", "-1"], ["--default-lambda", str(2**31)]],
)
def test_out_of_range_defaults_are_usage_errors(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config([*BASE, *bad])


def test_a_default_tau_the_target_gets_as_zero_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """1e-46 is in (0, 1] but reaches the target as float32 0.0, which it refuses: every csd request failed."""
    with pytest.raises(SystemExit) as exited:
        parse_config([*BASE, "--default-tau", "1e-46"])
    assert exited.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith("argument --default-tau: must be in (0, 1], got 1e-46 (0.0 as the target's float32)")
    with pytest.raises(InvalidArgument, match="as the target's float32"):
        Defaults(tau=1e-46)  # whoever builds the defaults


def test_the_smallest_default_tau_the_target_gets_is_taken() -> None:
    config, _ = parse_config([*BASE, "--default-tau", "1e-45"])  # float32's smallest subnormal, 1.4e-45
    assert config.defaults.tau == 1e-45 and as_float32(config.defaults.tau) > 0


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--default-lambda", "-1"], "argument --default-lambda: must be in [0, 2147483647], got -1"),
        (["--default-tau", "2"], "argument --default-tau: must be in (0, 1], got 2.0"),
    ],
)
def test_a_refused_flag_is_named_once(capsys: pytest.CaptureFixture[str], flags: list[str], line: str) -> None:
    """argparse names the flag; the field's name after it read `--default-tau: tau must be ...`."""
    with pytest.raises(SystemExit):
        parse_config([*BASE, *flags])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(line)
