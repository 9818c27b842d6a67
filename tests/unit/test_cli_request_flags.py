"""The request flags of `calispec generate`, `chat` and `demo` take exactly what the coordinator takes: a value
it refuses is a usage error (argparse's one line, exit 2) before any connection or model load. They were
plain `int`/`float`/`str`: the value travelled to the server and came back as INVALID_ARGUMENT (`demo`'s after
the whole stack had started), or, for text that is no UTF-8, as an SDK traceback.

The comparison runs the coordinator's own path on each edge value: the SDK's request (protobuf: float32 and
int32 fields), then `params_from_pb` and `GenerationParams.validate` (and `validate_prompt`).
"""

from __future__ import annotations

import argparse

import pytest

from calispec.client import build_params
from calispec.v1 import coordinator_pb2
from calispec_core import limits
from calispec_core.generation import Defaults
from calispec_tools import arg_types as at
from calispec_tools import cli
from coordinator.server import params_from_pb

CLOSED = "127.0.0.1:1"
REQUESTS = {
    "generate": ["generate", "--prompt", "hi", "--address", CLOSED],
    "chat": ["chat", "-m", "hi", "--address", CLOSED],
    "demo": ["demo", "--pair", "tiny"],
}
LONE_SURROGATE = "\udcff"  # what a command-line byte that is no UTF-8 decodes to

# flag -> (the SDK's keyword, edge values: on and around each bound, float32 rounding, nan, inf)
EDGES: dict[str, tuple[str, list[str]]] = {
    "--temperature": (
        "temperature",
        ["0", "-0.0", "-1e-50", "1e-46", "1e-5", "100", "100.000001", "100.01", "-0.001", "nan", "inf", "1e39"],
    ),
    "--top-p": ("top_p", ["0", "1", "1.00000001", "1.001", "-1e-50", "-0.001", "1e-46", "0.5", "nan", "inf"]),
    "--top-k": ("top_k", ["0", "1", "-1", str(2**31 - 1), str(2**31)]),
    "--seed": ("seed", ["0", "-1", str(2**63 - 1), str(2**63), str(2**64)]),
    "--gamma": ("num_speculative_tokens", ["-1", "0", "1", "16", "17", str(2**31)]),
    "--tau": ("tau", ["1", "1.00000001", "1.0001", "0.01", "1e-40", "1e-46", "0", "-0.5", "nan", "inf"]),
    "--lambda": ("lambda_", ["0", "-1", "6", str(2**31 - 1), str(2**31)]),
    "--max-new-tokens": ("max_new_tokens", ["0", "1", "8192", "8193", "-1", str(2**31)]),
    "--logprobs": ("logprobs", ["-1", "0", "20", "21", str(2**32)]),
    "--prompt-logprobs": ("prompt_logprobs", ["-1", "0", "20", "21", str(2**32)]),
    # logit rules (wave 60); min_tokens' bound by max_tokens is the server's (its default is not the CLI's to know)
    "--presence-penalty": ("presence_penalty", ["0", "2", "2.0000001", "2.01", "-2", "-2.01", "nan", "inf"]),
    "--frequency-penalty": ("frequency_penalty", ["-1.5", "-2.0000001", "-2.001", "1e39", "nan"]),
    "--repetition-penalty": ("repetition_penalty", ["1", "0.01", "0.0099", "2", "2.01", "0", "-1", "1e-40", "nan"]),
    "--min-p": ("min_p", ["0", "1", "1.0001", "-0.1", "0.5", "1e-46", "nan"]),
    "--min-tokens": ("min_tokens", ["0", "1", "100", "-1", "8193", str(2**32)]),
}
FLOATS = ("temperature", "top_p", "tau", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
CASES = [(flag, value) for flag, (_, values) in EDGES.items() for value in values]


def server_accepts(**params: object) -> bool:
    """The coordinator's verdict on a request the SDK builds from `params` (a value the SDK cannot send counts
    as refused: protobuf raises ValueError)."""
    try:
        params_from_pb(build_params(**params), Defaults()).validate()  # type: ignore[arg-type]
    except ValueError:  # InvalidArgument is one
        return False
    return True


def cli_accepts(*flags: str) -> bool:
    try:
        cli.build_parser().parse_args([*REQUESTS["generate"], *flags])
    except SystemExit:
        return False
    return True


@pytest.mark.parametrize(("flag", "value"), CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_a_request_flag_takes_what_the_coordinator_takes(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keyword, _ = EDGES[flag]
    convert = float if keyword in FLOATS else int
    assert cli_accepts(f"{flag}={value}") == server_accepts(**{keyword: convert(value)})  # "=": -1e-50 is no flag


@pytest.mark.parametrize("stop", ["", "a", "a" * limits.MAX_STOP_STRING_CHARS, "a" * 257, LONE_SURROGATE])
def test_a_stop_string_is_taken_as_the_coordinator_takes_it(stop: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_accepts("--stop", stop) == server_accepts(stop=[stop])


@pytest.mark.parametrize("count", [limits.MAX_STOP_STRINGS, limits.MAX_STOP_STRINGS + 1])
def test_as_many_stop_strings_as_the_coordinator_takes(count: int, capsys: pytest.CaptureFixture[str]) -> None:
    stops = [f"s{i}" for i in range(count)]
    flags = [part for stop in stops for part in ("--stop", stop)]
    assert cli_accepts(*flags) == server_accepts(stop=stops) == (count <= limits.MAX_STOP_STRINGS)
    if count <= limits.MAX_STOP_STRINGS:
        assert cli.build_parser().parse_args([*REQUESTS["generate"], *flags]).stop == stops


@pytest.mark.parametrize("prompt", ["", "x", LONE_SURROGATE])
def test_a_prompt_is_taken_as_the_coordinator_takes_it(prompt: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        coordinator_pb2.GenerateRequest(prompt=prompt)  # the SDK's request
        limits.validate_prompt(prompt)  # the coordinator's check
        accepted = True
    except ValueError:
        accepted = False
    assert cli_accepts("--prompt", prompt) == accepted


BAD = [
    ("--temperature", "-0.5"),
    ("--temperature", "101"),
    ("--top-p", "2"),
    ("--top-k", "-1"),
    ("--seed", "-1"),
    ("--seed", str(2**70)),
    ("--gamma", "0"),
    ("--tau", "1e-46"),  # 0 as the request's float32 carries it
    ("--lambda", "-1"),
    ("--max-new-tokens", "-4"),
    ("--stop", ""),
    ("--timeout", "0"),
]


class Ran(Exception):
    """A command went on (to connect, or to start a stack) with a value the coordinator refuses."""


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def ran(*_args: object, **_kwargs: object) -> None:
        raise Ran

    for name in ("run_request", "stack_config"):
        monkeypatch.setattr(cli, name, ran)
    monkeypatch.setattr(cli.cli_chat, "run_chat", ran)


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("command", REQUESTS)
@pytest.mark.parametrize(("flag", "value"), BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_a_bad_request_flag_is_a_usage_error_before_anything_runs(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*REQUESTS[command], flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"calispec {command}: error: argument {flag}"), err  # argparse's one line


@pytest.mark.parametrize(
    "argv",
    [["generate", "--prompt", LONE_SURROGATE], ["chat", "-m", LONE_SURROGATE], ["chat", "-m", "hi", "--system",
     LONE_SURROGATE], ["demo", "--pair", "tiny", "--prompt", LONE_SURROGATE]],
    ids=["generate --prompt", "chat -m", "chat --system", "demo --prompt"],
)  # fmt: skip
@pytest.mark.usefixtures("nothing_runs")
def test_text_that_is_no_utf8_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A UnicodeEncodeError traceback from the SDK (chat), one line after the connection (generate), or one
    after the stack had started (demo)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--address", CLOSED] if argv[0] != "demo" else argv)
    assert exited.value.code == 2
    assert "is not valid Unicode" in capsys.readouterr().err


def test_the_request_flags_still_take_their_defaults_and_edges() -> None:
    args = cli.build_parser().parse_args(REQUESTS["generate"])
    assert (args.max_new_tokens, args.temperature, args.top_p, args.top_k, args.seed) == (0, 0, 0, 0, None)
    assert (args.stop, args.gamma, args.tau, args.lambda_, args.timeout) == ([], None, None, None, 120.0)
    flags = ["--tau", "1.00000001", "--temperature", "100.000001", "--seed", str(2**63 - 1), "--max-new-tokens", "0"]
    args = cli.build_parser().parse_args([*REQUESTS["generate"], *flags])
    assert (args.tau, args.temperature) == (1.00000001, 100.000001)  # as given: the SDK rounds them to float32
    assert (args.seed, args.max_new_tokens) == (2**63 - 1, 0)


@pytest.mark.parametrize(("argv", "flag"), [(["down", "--timeout", "nan"], "--timeout"),
                                            (["down", "--timeout", "-1"], "--timeout"),
                                            (["bench", "--temperature", "150"], "--temperature"),
                                            (["up", "--default-tau", "1e-46"], "--default-tau"),
                                            (["bench", "--tau", "1e-46"], "--tau"),
                                            (["eval", "--sweep-tau", "0.01,1e-46"], "--sweep-tau")])  # fmt: skip
def test_other_flags_that_failed_every_time(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`down --timeout nan` waited forever (no deadline compares true with nan), `-1` gave up at once; `bench
    --temperature 150` sent every request for the coordinator to refuse; a τ of 1e-46 (0 as the target's
    float32) made every csd request of the stack `up` started fail, and every one bench or eval sent."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


# -- int_at_least (limits), the window's type built on it -----------------------------------------------------


def test_int_at_least_is_the_shared_check() -> None:
    parse = limits.int_at_least(3)
    assert parse("3") == 3 and parse.__name__ == "int"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be >= 3, got 2$"):
        parse("2")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be >= 2 \(why\), got 1$"):
        limits.int_at_least(2, "(why)")("1")


def test_window_tokens_keeps_its_bound_and_message() -> None:
    assert at.window_tokens("2") == at.MIN_WINDOW_TOKENS == 2
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        at.window_tokens("1")
    assert str(refused.value) == "must be >= 2 (a window of one token compares nothing), got 1"
    with pytest.raises(ValueError):
        at.window_tokens("two")
    for parse, low in ((limits.positive_int, "0"), (limits.non_negative_int, "-1")):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be >= {int(low) + 1}, got {low}$"):
            parse(low)
