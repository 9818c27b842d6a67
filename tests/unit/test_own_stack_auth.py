"""The stacks the CLI starts itself (bench/eval --local, eval's calibration study, bench compare and
calibration, demo) run open on loopback: their clients take no credentials from the environment, whose
CALISPEC_TOKEN / CALISPEC_TLS_CA are meant for the stack `calispec up --tls` runs (the clients spoke TLS to
a plaintext stack, or failed on a CA bundle that was never theirs).

No stack starts: each client is recorded as it is built, and the test stops there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import calispec.client
from calispec._channel import ClientAuth
from calispec_tools import cli, cli_bench
from calispec_tools.bench import calibration as bench_calibration
from calispec_tools.bench import compare
from calispec_tools.eval import calibration as eval_calibration
from calispec_tools.eval import runner as eval_runner
from calispec_tools.eval.runner import EvalConfig, Variant
from calispec_tools.eval.tasks import Task

ADDRESS = "127.0.0.1:1"


class Built(Exception):
    """A client was built: the test has what it needs."""


@pytest.fixture
def stale_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `calispec up --tls` told the user to export, for another stack (the CA is gone by now)."""
    monkeypatch.setenv("CALISPEC_TOKEN", "csk_for_another_stack")
    monkeypatch.setenv("CALISPEC_TLS_CA", str(tmp_path / "gone" / "ca.pem"))


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[ClientAuth]:
    """The credentials of every CalispecClient built (as the SDK resolves them); building one stops the test."""
    seen: list[ClientAuth] = []

    def record(address: str, timeout: float | None = None, **auth: Any) -> None:
        seen.append(ClientAuth.resolve(**auth))
        raise Built

    monkeypatch.setattr(calispec.client, "CalispecClient", record)
    monkeypatch.setattr(eval_runner, "CalispecClient", record)
    return seen


def test_bench_and_eval_local_take_no_credentials_from_the_environment(stale_env: None) -> None:
    """They passed `{}`: the SDK then read CALISPEC_TOKEN and CALISPEC_TLS_CA."""
    for argv in (["bench", "--local"], ["eval", "--local"]):
        args = cli.build_parser().parse_args(argv)
        assert ClientAuth.resolve(**cli_bench.coordinator_auth(args)) == ClientAuth()


def test_against_an_address_the_environment_still_applies(stale_env: None) -> None:
    args = cli.build_parser().parse_args(["bench", "--address", ADDRESS])
    with pytest.raises(ValueError, match=r"gone/ca\.pem \(tls_ca / CALISPEC_TLS_CA\)"):
        cli_bench.coordinator_auth(args)


class FakeStack:
    """A LocalStack that starts nothing."""

    coordinator_address = ADDRESS

    def __init__(self, config: object) -> None:
        pass

    def __enter__(self) -> FakeStack:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def own_stack_bench_args(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`calispec bench COMMAND`'s arguments for a pair in tmp_path, with a LocalStack that starts nothing."""
    monkeypatch.setattr("calispec_tools.stack.LocalStack", FakeStack)
    draft, target = tmp_path / "d", tmp_path / "t"
    args = cli.build_parser().parse_args(["bench", command, "--draft", str(draft), "--target", str(target)])
    args.model_dirs = (draft, target)
    return args


def test_bench_compare_takes_no_credentials_from_the_environment(
    stale_env: None, built: list[ClientAuth], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = own_stack_bench_args("compare", tmp_path, monkeypatch)
    args.skip_hf, args.device, args.prompt_texts = True, "cpu", ["x"]
    with pytest.raises(Built):
        compare.run_compare(args)
    config = compare.CompareConfig(["x"], 4, None, [1], 1)
    with pytest.raises(Built):
        compare.load_level(ADDRESS, "ar", 1, config)
    assert built == [ClientAuth(), ClientAuth()]


def test_bench_calibration_takes_no_credentials_from_the_environment(
    stale_env: None, built: list[ClientAuth], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Built):
        bench_calibration.run_calibration_bench(own_stack_bench_args("calibration", tmp_path, monkeypatch))
    assert built == [ClientAuth()]


def test_the_calibration_study_takes_no_credentials_from_the_environment(
    stale_env: None, built: list[ClientAuth], monkeypatch: pytest.MonkeyPatch
) -> None:
    @contextmanager
    def fresh_stack(_label: str) -> Iterator[eval_calibration.StudyEndpoints]:
        yield eval_calibration.StudyEndpoints(ADDRESS, ADDRESS, "pair/x", "writer")

    def calibrate(_label: str, _ep: eval_calibration.StudyEndpoints) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(eval_calibration, "concentration", lambda ep: {"recorded_events": 0})
    task = Task("t0", "code", "def f():")
    with pytest.raises(Built):
        eval_calibration.run_study(
            fresh_stack, calibrate, [task], [Variant("csd")], EvalConfig(), calibrations=["none"]
        )
    assert built == [ClientAuth()]
