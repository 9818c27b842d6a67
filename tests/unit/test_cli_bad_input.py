"""Bad input to the tools is one clear line before anything runs: numeric flags out of range are argparse
errors, paths that cannot be written and a memory service that does not answer are named, never a traceback."""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec_tools import cli, cli_bench, cli_calibrate
from calispec_tools.stack import ServiceStartError, default_draft_dtype
from calispec_tools.stack_state import StackState
from tests.conftest import TinyPair


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


def one_error_line(capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# -- numeric flags -----------------------------------------------------------------------------------

EVAL = ["eval", "--address", "127.0.0.1:1"]
CALIBRATE = ["calibrate", "--corpus", "corpus.jsonl"]
OUT_OF_RANGE = [
    (["bench", "--rate", "-1"], "--rate"),  # was a ValueError traceback from the arrival process
    (["bench", "--rate", "0.5,0"], "--rate"),
    (["bench", "--rate", "nan"], "--rate"),
    (["bench", "--concurrency", "0"], "--concurrency"),  # was an empty report
    (["bench", "--concurrency", "2,-1"], "--concurrency"),
    (["bench", "--num-requests", "-5"], "--num-requests"),  # was an empty report
    (["bench", "--num-requests", "0"], "--num-requests"),
    (["bench", "--burstiness", "0"], "--burstiness"),
    (["bench", "--duration", "-1"], "--duration"),
    (["bench", "--warmup", "-1"], "--warmup"),
    (["bench", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["bench", "--gamma", "0"], "--gamma"),
    (["bench", "--gamma", "17"], "--gamma"),
    (["bench", "--tau", "2"], "--tau"),
    (["bench", "--lambda", "-1"], "--lambda"),
    (["bench", "--temperature", "-0.5"], "--temperature"),
    (["bench", "--seed", "-1"], "--seed"),
    (["bench", "--timeout", "0"], "--timeout"),
    (["bench", "compare", "--prompts", "0"], "--prompts"),
    (["bench", "compare", "--concurrency", "0"], "--concurrency"),
    (["bench", "compare", "--load-requests", "-1"], "--load-requests"),
    (["bench", "compare", "--batch-gather-ms", "-1"], "--batch-gather-ms"),
    (["bench", "compare", "--target-threads", "0"], "--target-threads"),
    (["bench", "calibration", "--prompts", "0"], "--prompts"),
    (["bench", "calibration", "--batch-size", "0"], "--batch-size"),
    (["bench", "calibration", "--max-tokens", "1"], "--max-tokens"),  # CalibrateConfig's minimum is 2
    ([*EVAL, "--limit", "0"], "--limit"),
    ([*EVAL, "--sweep-tau", "0.01,2"], "--sweep-tau"),
    ([*EVAL, "--sweep-lambda", "6,-1"], "--sweep-lambda"),
    ([*EVAL, "--timeout", "-1"], "--timeout"),
    ([*EVAL, "--sandbox-timeout", "0"], "--sandbox-timeout"),
    ([*EVAL, "--ratio-top", "0"], "--ratio-top"),
    ([*EVAL, "--calibration-batch-size", "0"], "--calibration-batch-size"),
    ([*CALIBRATE, "--batch-size", "0"], "--batch-size"),
    ([*CALIBRATE, "--max-tokens", "1"], "--max-tokens"),  # passed, then failed CalibrateConfig's check (exit 1)
    ([*CALIBRATE, "--min-count", "0"], "--min-count"),
    ([*CALIBRATE, "--workers", "0"], "--workers"),
    ([*CALIBRATE, "--worker-cpus", "0"], "--worker-cpus"),
    ([*CALIBRATE, "--gamma", "0"], "--gamma"),
    (["up", "--draft-vocab", "-1"], "--draft-vocab"),
    (["memory", "stats", "--namespace", "a b"], "--namespace"),  # the service's refusal after a connection (wave 55)
    (["up", "--draft-threads", "1025"], "--draft-threads"),  # --threads 100000 ended in SIGSEGV (wave 55)
    (["up", "--target-threads", "100000"], "--target-threads"),
    (["up", "--memory-port", "70000"], "--memory-port"),
    (["bench", "--openai-url", "notaurl"], "--openai-url"),  # exit 1 after the start, "(notaurl/notaurl/models)"
    (["bench", "--openai-url", "ftp://h/v1"], "--openai-url"),
]


@pytest.mark.parametrize(
    ("argv", "flag"), OUT_OF_RANGE, ids=[f"{argv[0]} {' '.join(argv[-2:])}" for argv, _ in OUT_OF_RANGE]
)
def test_a_numeric_flag_out_of_range_is_an_argparse_error(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


ADDRESSED = [["generate", "--prompt", "x"], ["chat"], ["bench"], ["eval"], ["calibrate", "--prompts", "p.txt"]]


@pytest.mark.parametrize("command", ADDRESSED, ids=[c[0] for c in ADDRESSED])
@pytest.mark.parametrize("address", ["", " ", "127.0.0.1 :50050"])
def test_an_address_no_channel_can_be_made_for_is_an_argparse_error(
    command: list[str], address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`generate --address ""` let gRPC log its channel-stack failure and ended as UNKNOWN (wave 50)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*command, "--address", address])
    assert exited.value.code == 2
    assert f"argument --address: must be HOST:PORT, got {address!r}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:50050", "localhost:1", "[::1]:50050", "unix:/tmp/calispec.sock", "passthrough:///h:1", "xds:///svc"],
)
def test_an_address_a_channel_takes_is_taken(address: str) -> None:
    assert cli.build_parser().parse_args(["generate", "--prompt", "x", "--address", address]).address == address


@pytest.mark.parametrize(
    "address",
    [
        "localhost",
        "[::1]",
        "::1",
        "calispec-coordinator",
        "::1:50050",
        ":50050",
        "dns:///localhost",
        "[]:5",
        "[[::1]:5",
    ],
)
def test_an_address_without_a_port_is_an_argparse_error(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    """gRPC dialled port 443 for it, and the call failed "connection refused" far from the flag (wave 55's probe)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["generate", "--prompt", "x", "--address", address])
    assert exited.value.code == 2
    assert f"must be HOST:PORT ([V6]:PORT; without a port gRPC dials 443), got {address!r}" in capsys.readouterr().err


PORTED = [
    ["generate", "--prompt", "x", "--address"],
    ["memory", "stats", "--memory-addr"],
    ["memory", "namespaces", "--memory-addr"],
    ["calibrate", "--corpus", "c.txt", "--memory-addr"],
    ["eval", "--address", "127.0.0.1:1", "--memory-address"],
]


@pytest.mark.parametrize("argv", PORTED, ids=[" ".join(a[:2]) for a in PORTED])
@pytest.mark.parametrize("port", ["99999", "0", "x", ""])
def test_a_port_out_of_range_is_an_argparse_error(
    argv: list[str], port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`:99999` reached port 34463 (gRPC wrapped it; found by probing), on every flag naming a service."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*argv, f"127.0.0.1:{port}"])
    assert exited.value.code == 2
    assert "must be HOST:PORT with a port in 1-65535" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["memory", "stats"], ["memory", "export", "--out", "o.json"], ["calibrate", "--corpus", "c.txt"]],
    ids=["stats", "export", "calibrate"],
)
def test_an_empty_namespace_is_an_argparse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """It fell back to the running stack's namespace without a word."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*argv, "--namespace", ""])
    assert exited.value.code == 2
    assert "argument --namespace: must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--tls-dir", ""],
        ["up", "--memory-db", " "],
        ["up", "--log-dir", ""],
        ["demo", "--memory-db", ""],
        ["models", "tiny", "--out", ""],
        ["models", "list", "--cache-dir", ""],
        ["bench", "--out", ""],
    ],
)
def test_an_empty_path_is_an_argparse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--tls-dir ''` (an unset shell variable) ran the stack plaintext without a word; `--memory-db ''` and
    `--log-dir ''` fell back to the defaults (found by probing)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "must not be empty (leave the flag out for its default)" in capsys.readouterr().err


def test_two_services_of_up_on_one_port_is_a_usage_error_before_anything_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`up --port X --target-port X` was refused only after three services had loaded (found by probing)."""
    args = cli.build_parser().parse_args(["up", "--port", "21000", "--target-port", "21000"])
    with pytest.raises(SystemExit) as exited:
        cli.check_distinct_ports(args)
    assert exited.value.code == 2
    assert "--port and --target-port are both 21000" in capsys.readouterr().err
    free = cli.build_parser().parse_args(["up", "--port", "0", "--target-port", "0", "--http-port", "50050"])
    cli.check_distinct_ports(free)  # 0 is a free port each; the HTTP port collides only when served:
    with pytest.raises(SystemExit):
        cli.check_distinct_ports(cli.build_parser().parse_args(["up", "--http-port", "50050"]))
    cli.check_distinct_ports(cli.build_parser().parse_args(["up", "--http-port", "50050", "--no-http"]))


def test_calibrate_max_tokens_takes_what_the_calibration_takes() -> None:
    """The flag's minimum is the config's: what argparse lets through, the calibration runs."""
    from calispec_tools.calibrate.job import CalibrateConfig

    assert cli.build_parser().parse_args([*CALIBRATE, "--max-tokens", "2"]).max_tokens == 2
    CalibrateConfig(max_tokens=2).validate()
    with pytest.raises(ValueError, match="max_tokens must be >= 2"):
        CalibrateConfig(max_tokens=1).validate()


def test_the_numeric_flags_still_take_what_they_document() -> None:
    args = cli.build_parser().parse_args(["bench", "--rate", "inf,0.5", "--warmup", "0", "--gamma", "16"])
    assert args.rate == [float("inf"), 0.5] and args.warmup == 0 and args.gamma == 16  # inf: all at once
    args = cli.build_parser().parse_args(["bench", "--concurrency", "1,4", "--num-requests", "1"])
    assert args.concurrency == [1, 4] and args.num_requests == 1
    args = cli.build_parser().parse_args(["bench", "compare", "--concurrency", "", "--load-requests", "0"])
    assert args.concurrency == [] and args.load_requests == 0  # empty: skip the load test; 0: twice the level
    args = cli.build_parser().parse_args([*EVAL, "--sweep-tau", "0.001,1", "--sweep-lambda", "0,6"])
    assert args.sweep_tau == [0.001, 1.0] and args.sweep_lambda == [0, 6]


@pytest.mark.parametrize(
    ("before", "command", "where"),
    [
        (["--no-meaning-guard"], "compare", "give it after `compare`"),
        (["--prefix-cache-tokens", "5"], "compare", "give it after `compare`"),
        (["--max-new-tokens=32"], "compare", "give it after `compare`"),
        (["--prompts", "code,math,prose"], "compare", "give it after `compare`"),  # its default, given
        (["--dtype", "float32"], "calibration", "give it after `calibration`"),
        (["--modes", "sd"], "compare", "`compare` does not take it"),
        (["--local"], "calibration", "`calibration` does not take it"),
    ],
)
def test_a_bench_flag_before_a_subcommand_is_refused(
    before: list[str], command: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse let the subcommand's default overwrite it (`bench --no-meaning-guard compare` ran the guard),
    or dropped it (`bench --modes sd compare` ran every mode)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["bench", *before, command])
    assert exited.value.code == 2
    flag = before[0].split("=")[0]
    assert f"{flag} before `{command}` would be ignored: {where}" in capsys.readouterr().err


def test_bench_flags_after_the_subcommand_or_without_one_still_parse() -> None:
    args = cli.build_parser().parse_args(["bench", "compare", "--no-meaning-guard", "--prefix-cache-tokens", "5"])
    assert args.meaning_guard is False and args.prefix_cache_tokens == 5 and args.bench_command == "compare"
    args = cli.build_parser().parse_args(["bench", "--local", "--modes", "sd", "--dtype", "float32"])
    assert args.local and args.modes == ["sd"] and args.dtype == "float32" and args.bench_command is None


@pytest.mark.parametrize("ask", ["-h", "--help", "--hel"])
def test_help_of_a_bench_subcommand_is_shown_whatever_came_before(ask: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench --dtype float32 compare -h` printed the refusal, not compare's help (help runs nothing)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["bench", "--dtype", "float32", "compare", ask])
    assert exited.value.code == 0
    assert "usage: calispec bench compare" in capsys.readouterr().out


# -- paths that cannot be written ----------------------------------------------------------------------


def test_keys_add_to_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "add", "ci-bot", "--file", str(tmp_path)]) == 2
    one_error_line(capsys, f"cannot write {tmp_path}", "Is a directory")


def test_keys_add_under_a_file_is_one_line(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "add", "ci-bot", "--file", str(a_file / "keys")]) == 2
    one_error_line(capsys, f"cannot write {a_file}")


def test_keys_add_with_a_name_of_two_words_is_a_usage_error_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1, where the same command's unwritable --file is 2 (and the keys file is not touched)."""
    assert cli.main(["keys", "add", "ci bot", "--file", str(tmp_path / "keys")]) == 2
    one_error_line(capsys, "key name must be one word without")
    assert not (tmp_path / "keys").exists()


def test_certs_dev_into_an_unusable_directory_is_one_line(a_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["certs", "dev", str(a_file / "certs")]) == 2
    one_error_line(capsys, f"cannot write {a_file / 'certs'}", "Not a directory")


@pytest.mark.parametrize(
    ("make_path", "cause"),
    [
        (lambda tmp, file: tmp, "it is a directory"),
        (lambda tmp, file: tmp / "missing" / "out.json", "No such file or directory"),
        (lambda tmp, file: file / "out.json", "Not a directory"),
    ],
    ids=["directory", "missing-parent", "parent-is-a-file"],
)
def test_calibrate_export_is_checked_before_the_calibration_runs(
    tmp_path: Path, a_file: Path, make_path, cause: str, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was checked when the result was written: a traceback after the whole calibration (hours)."""

    def calibration_ran(*args: object) -> None:
        raise AssertionError("the calibration ran before --export was checked")

    monkeypatch.setattr(cli_calibrate, "_load", calibration_ran)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n')
    export = make_path(tmp_path, a_file)
    pair = ["--draft", str(tmp_path / "d"), "--target", str(tmp_path / "t")]
    assert cli.main(["calibrate", "--corpus", str(corpus), *pair, "--export", str(export)]) == 2
    one_error_line(capsys, f"cannot write --export {export}", cause)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "corpus.jsonl"]  # the probe left nothing


def test_calibrate_refuses_ray_with_export_instead_of_ignoring_ray(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--export ran the calibration in this process and --ray was dropped without a word (wave 49)."""
    monkeypatch.setattr(cli_calibrate, "_load", lambda *args: pytest.fail("the calibration ran"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n')
    args = ["calibrate", "--corpus", str(corpus), "--ray", "127.0.0.1:6379", "--export", str(tmp_path / "out.json")]
    assert cli.main(args) == 2
    one_error_line(capsys, "--export writes the counts from this process, --ray's workers through the memory service")


IGNORED = [  # (flags, the flags named as ignored): each was dropped without a word before wave 50
    (["--prompts", "p.txt", "--batch-size", "32", "--int8-scales", "row"], ["--batch-size", "--int8-scales"]),
    (["--prompts", "p.txt", "--draft", "d", "--target", "t", "--json"], ["--draft", "--target", "--json"]),
    (["--corpus", "c.jsonl", "--timeout", "5", "--token", "k"], ["--timeout", "--token"]),
    (["--corpus", "c.jsonl", "--gamma", "4"], ["--gamma (read with --events sd or --prompts only)"]),
    (["--corpus", "c.jsonl", "--max-new-tokens", "9"], ["--max-new-tokens (read with --generate or --prompts"]),
    (["--corpus", "c.jsonl", "--min-count", "2"], ["--min-count (read with --export only)"]),
    (["--corpus", "c.jsonl", "--workers", "4", "--worker-cpus", "2"], ["--workers", "--worker-cpus"]),
    (["--corpus", "c.jsonl", "--worker-gpus", "0.5"], ["--worker-gpus (read with --ray only)"]),
    (["--corpus", "c.jsonl", "--export", "x.json", "--writer-token-file", "t"], ["--writer-token-file"]),
]


@pytest.mark.parametrize(("flags", "named"), IGNORED, ids=[" ".join(f[2:]) for f, _ in IGNORED])
def test_calibrate_refuses_flags_its_run_would_ignore(
    flags: list[str], named: list[str], monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--prompts --batch-size 32` ran SD through the stack as if the flag were not there (wave 50)."""
    monkeypatch.setattr(cli_calibrate, "calibrate_corpus", lambda args: pytest.fail("the calibration ran"))
    monkeypatch.setattr(cli_calibrate, "calibrate_by_sd", lambda args: pytest.fail("the calibration ran"))
    assert cli.main(["calibrate", *flags]) == 2
    one_error_line(capsys, "this run would ignore", *named)


def make_calibration_flags() -> list[str]:
    """The Makefile's `calibration` command's flags."""
    makefile = (Path(__file__).parents[2] / "Makefile").read_text().replace("\\\n", " ")
    [line] = [line for line in makefile.splitlines() if "calispec calibrate " in line]
    return shlex.split(line.split("calispec calibrate ", 1)[1])


@pytest.mark.parametrize(
    "flags",
    [
        ["--prompts", "p.txt", "--gamma", "4", "--max-new-tokens", "30", "--timeout", "9", "--memory-addr", "h:1"],
        make_calibration_flags(),
        ["--corpus", "c", "--generate", "--events", "sd", "--gamma", "4", "--ray", "h:1", "--workers", "3"],
    ],
    ids=["prompts", "export", "ray"],
)
def test_calibrate_flags_its_run_reads_pass(flags: list[str]) -> None:
    args = cli.build_parser().parse_args(["calibrate", *flags])
    assert cli_calibrate.unread_flags_problem(args) is None


def test_every_flag_the_check_names_is_one_of_calibrates() -> None:
    """A flag renamed or removed would make the check raise (getattr) instead of refusing."""
    args = cli.build_parser().parse_args(["calibrate", "--corpus", "c"])
    assert set(cli_calibrate.READ_WITH) <= set(vars(args))
    assert set(cli_calibrate.READ_WITH.values()) <= set(cli_calibrate._read_here(args))


def test_the_export_probe_keeps_a_file_it_did_not_make(tmp_path: Path) -> None:
    """The probe removed `<export>.tmp` even when it was there before (its comment said it is kept)."""
    existing = tmp_path / "out.json.tmp"
    existing.write_text("someone's file\n")
    assert cli_calibrate.export_path_problem(tmp_path / "out.json") is None
    assert existing.read_text() == "someone's file\n"
    assert cli_calibrate.export_path_problem(tmp_path / "new.json") is None
    assert not (tmp_path / "new.json.tmp").exists()  # what it made, it removes


# -- a memory service that does not answer ---------------------------------------------------------------


@pytest.fixture
def refusing_address() -> Iterator[str]:
    """Bound, never listening: connections are refused, and no other process can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("namespace", [[], ["--namespace", "pair/x"]], ids=["listing", "counting"])
def test_calibrate_by_sd_names_an_unreachable_memory_service(
    namespace: list[str], refusing_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It raised a raw _InactiveRpcError (listing the namespaces, or counting the events before any request)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\n")
    argv = ["calibrate", "--prompts", str(prompts), "--memory-addr", refusing_address, *namespace]
    assert cli.main(argv) == 1
    one_error_line(capsys, f"memory service {refusing_address}: UNAVAILABLE")


def test_calibrate_corpus_names_an_unreachable_memory_service(
    refusing_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n')
    pair = [tmp_path / "d", tmp_path / "t"]
    for model in pair:  # present: the memory service is what fails
        model.mkdir()
    argv = ["calibrate", "--corpus", str(corpus), "--draft", str(pair[0]), "--target", str(pair[1])]
    token = tmp_path / "writer-token"  # usable: the connection is what fails (no token is a usage error first)
    token.write_text("t" * 32 + "\n")
    argv += ["--memory-addr", refusing_address, "--writer-token-file", str(token)]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    message = str(exited.value.code)  # SystemExit(str): one line on stderr, exit 1
    assert message.startswith(f"error: memory service {refusing_address}: UNAVAILABLE") and "\n" not in message


# -- flags that cannot run together ------------------------------------------------------------------------


def test_eval_refuses_the_ratio_analysis_in_the_calibration_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The study returned before the ratio analysis ran: eval.json had no ratios, and nothing said so."""

    def stack_started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a stack started before the flags were checked")

    monkeypatch.setattr(cli_bench, "local_stack", stack_started)
    out = tmp_path / "out"
    argv = ["eval", "--local", "--ratio-analysis", "--calibration-study", "--no-plots", "--out", str(out)]
    assert cli.main(argv) == 2
    one_error_line(capsys, "--ratio-analysis", "--calibration-study")
    assert not out.exists()


# -- model directories that are not there ------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n')
    return path


def test_calibrate_names_a_missing_model_dir(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was the model loader's InvalidArgument, a traceback."""
    pair = ["--draft", "/nonexistent/d", "--target", "/nonexistent/t"]
    assert cli.main(["calibrate", "--corpus", str(corpus), *pair, "--export", str(tmp_path / "y.json")]) == 2
    one_error_line(capsys, "model directory not found: /nonexistent/d")


def test_calibrate_names_a_missing_dir_of_the_running_stacks_pair(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pair comes from the running `calispec up` when no --draft/--target is given."""
    (tmp_path / "d").mkdir()
    StackState(os.getpid(), "c", "m", "ns", str(tmp_path / "d"), "/nonexistent/t", "w", 0).write()
    assert cli.main(["calibrate", "--corpus", str(corpus), "--export", str(tmp_path / "y.json")]) == 2
    one_error_line(capsys, "model directory not found: /nonexistent/t")


@pytest.mark.parametrize("command", ["import", "seed", "calibrate"])
def test_the_running_stacks_writer_token_goes_to_its_memory_service_only(
    command: str, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --writer-token-file, a write to any --memory-addr sent the running stack's token there (a capture
    server logged it; found by probing): it is a usage error now, before any connection."""
    token = tmp_path / "writer.token"
    token.write_text("stack-secret-token-0123\n")
    StackState(os.getpid(), "c", "127.0.0.1:1", "ns", "d", "t", str(token), 0).write()
    elsewhere = ["--memory-addr", "127.0.0.1:2", "--namespace", "ns"]
    pair = [flag for name in ("draft", "target") for flag in (f"--{name}", str(tmp_path / name))]
    for name in ("draft", "target"):
        (tmp_path / name).mkdir()
    argv = {
        "import": ["memory", "import", "--file", str(corpus), *elsewhere],
        "seed": ["memory", "seed", "--pair", "qwen-coder", *elsewhere],
        "calibrate": ["calibrate", "--corpus", str(corpus), *pair, *elsewhere],
    }[command]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # the memory commands' usage errors exit from where they are found
        code = exc.code
    assert code == 2
    one_error_line(capsys, "give --writer-token-file", "127.0.0.1:1", "not 127.0.0.1:2")


def test_calibrate_refuses_another_pairs_events_for_the_running_stacks_namespace(
    corpus: Path, tmp_path: Path, tiny_pair: TinyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    """The namespace defaults to the running stack's, whatever pair is calibrated: a pair of the same vocabulary
    (here the stack's own, swapped) had its events counted as the stack's, exit 0 (found by probing)."""
    token = tmp_path / "writer.token"
    token.write_text("stack-secret-token-0123\n")
    served = (str(tiny_pair.target), str(tiny_pair.draft))  # the stack serves the pair the other way round
    StackState(os.getpid(), "c", "127.0.0.1:1", "pair/theirs", *served, str(token), 0).write()
    pair = ["--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target)]
    assert cli.main(["calibrate", "--corpus", str(corpus), *pair]) == 2
    one_error_line(capsys, "the running stack serves another pair", "give --namespace")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[" * 100_000 + "\n", "corpus.jsonl:1: not JSON"),  # past the parser's depth: a RecursionError traceback
        ('{"text": "\\ud800 lone"}\n', "corpus.jsonl:1 is not valid Unicode"),  # the tokenizer's TypeError
        ('{"text": ' + "1" * 5000 + "}\n", "corpus.jsonl:1: not JSON"),  # past int's digits: no file or line
        ('{"prompt": "\\n\\n"}\n', "corpus.jsonl:1: the text is empty"),
        (b"caf\xe9\n", "corpus.jsonl: not UTF-8 text"),  # did not name the file
    ],
    ids=["deep", "surrogate", "huge-int", "blank", "latin-1"],
)
def test_calibrate_names_the_corpus_line_it_cannot_use(
    tmp_path: Path, content: str | bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert cli.main(["calibrate", "--corpus", str(tmp_path), "--export", str(tmp_path / "out.json")]) == 1
    one_error_line(capsys, expected)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], ("float32", "float32", "cpu")),
        (["--dtype", "bfloat16", "--device", "cuda"], ("bfloat16", "float32", "cuda")),
        (["--pair", "tiny"], ("auto", default_draft_dtype("auto") or "auto", "auto")),  # named: calibrate's own
    ],
)
def test_calibrating_the_running_stacks_pair_takes_its_dtypes_and_device(
    given: list[str], expected: tuple[str, str, str], corpus: Path, tmp_path: Path, tiny_pair: TinyPair, monkeypatch
) -> None:
    """A `calispec up --dtype float32 --draft-dtype float32` was calibrated with an int8 draft (calibrate's own
    defaults): its events were not the served pair's SD events (found by probing); a `--device cpu` stack on a GPU
    host was calibrated on the GPU (wave 58). Flags given still win."""
    loaded: list[tuple[str, str, str]] = []

    def load(args: object, *rest: object) -> None:
        from calispec_tools.cli import served_draft_dtype

        loaded.append((args.dtype, served_draft_dtype(args), args.device))  # type: ignore[attr-defined]
        raise SystemExit(0)

    monkeypatch.setattr(cli_calibrate, "_load", load)
    served = (str(tiny_pair.draft), str(tiny_pair.target))
    StackState(os.getpid(), "c", "127.0.0.1:1", "ns", *served, "w", 0, "float32", "float32", "", "cpu").write()
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--corpus", str(corpus), *given, "--export", str(tmp_path / "out.json")])
    assert loaded == [expected]


# -- bench and eval: their input files, output directory and servers (wave 50: each was a traceback) -------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "neither a built-in prompt set"),
        ("", "no prompts"),
        ("not json\n", "not JSON"),
        ('{"p": 1}\n', "expected"),
        # what the coordinator refuses: every request of the run failed alone (found by probing)
        ('{"prompt": "\\ud800abc"}\n', "not valid Unicode"),
        ('{"prompt": "x", "max_new_tokens": 100000000}\n', "max_new_tokens must be an integer in [1, 8192]"),
        ('{"prompt": "x", "max_new_tokens": true}\n', "max_new_tokens must be an integer"),
    ],
    ids=["missing", "empty", "not-json", "no-prompt", "surrogate", "huge-limit", "bool-limit"],
)
def test_bench_names_a_prompts_file_it_cannot_use(
    tmp_path: Path, content: str | None, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    if content is not None:
        prompts.write_text(content)
    argv = ["bench", "--address", "127.0.0.1:1", "--prompts", str(prompts), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    one_error_line(capsys, "--prompts: ", expected)
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize("command", [["bench", "--address", "127.0.0.1:1"], ["eval", "--address", "127.0.0.1:1"]])
def test_an_output_directory_that_cannot_be_made_is_a_usage_error(
    command: list[str], a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--out", str(a_file / "sub")])
    assert exited.value.code == 2
    one_error_line(capsys, f"cannot make the output directory {a_file / 'sub'}: Not a directory")


@pytest.mark.parametrize("where", ["missing-dir", "a-directory", "proc"])
def test_result_paths_that_cannot_be_written_are_refused_before_the_run(
    where: str, a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench compare --json` into a missing directory ran the whole comparison, then a traceback lost its results;
    `bench --out /proc/x` passed os.access as root and failed after the run (found by probing)."""
    if where == "proc":
        argv = ["bench", "--address", "127.0.0.1:1", "--out", "/proc/calispec-results"]
        expected = "cannot make the output directory /proc/calispec-results"
    else:
        path = tmp_path / "none" / "x.json" if where == "missing-dir" else tmp_path
        argv, expected = ["bench", "compare", "--pair", "tiny", "--json", str(path)], f"--json: cannot write {path}"
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    one_error_line(capsys, expected)


@pytest.mark.parametrize("tasks", ["bogus", "", ",", "../prompts/code"])
def test_eval_names_an_unknown_task_kind(tasks: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--tasks ,` ran nothing and exited 1; `../prompts/code` was read as a path (a KeyError traceback)."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*EVAL, "--tasks", tasks])
    assert exited.value.code == 2
    assert "argument --tasks: task kinds must be among code, math" in capsys.readouterr().err


LOCAL_EVAL = ["eval", "--local"]
EVAL_CONFLICTS = [
    ([*EVAL, "--calibrations", "none"], "--calibrations applies to --calibration-study"),  # was ignored
    ([*LOCAL_EVAL, "--calibration-study", "--calibrations", "foo"], "--calibrations must be among none, shipped, task"),
    ([*LOCAL_EVAL, "--calibration-study", "--calibrations", ""], "--calibrations must be among"),  # no row, exit 1
    ([*EVAL, "--draft", "d", "--target", "t"], "name the pair of a --local stack or of --ratio-analysis"),  # ignored
    ([*LOCAL_EVAL, "--draft", "d"], "give both --draft and --target"),
]


@pytest.mark.parametrize(("argv", "message"), EVAL_CONFLICTS)
def test_eval_flags_that_would_do_nothing_or_fail_late_are_refused_first(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--calibrations foo` started a stack, then a ValueError traceback; others were silently ignored."""
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 2
    one_error_line(capsys, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [["bench"], ["bench", "compare", "--kinds", ","], ["bench", "compare", "--kinds", "poetry"]],
    ids=["no-target", "kinds-empty", "kinds-unknown"],
)
def test_more_bench_usage_errors_exit_2(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    one_error_line(capsys)


def test_bench_names_an_openai_server_it_cannot_reach(
    refusing_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://{refusing_address}/v1"
    argv = ["bench", "--openai-url", url, "--num-requests", "1", "--out", str(tmp_path / "out"), "--no-plots"]
    assert cli.main(argv) == 1
    one_error_line(capsys, f"error: {url}: UNAVAILABLE")


def test_eval_names_a_memory_service_it_cannot_reach(
    refusing_address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "--address", "127.0.0.1:1", "--memory-address", refusing_address, "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    message = exited.value.code  # SystemExit with a message: printed on stderr, exit status 1
    assert isinstance(message, str) and message.startswith(f"error: memory service {refusing_address}: UNAVAILABLE")


HALF_PAIRS = [["up", "--draft", "d"], ["demo", "--target", "t"], ["bench", "--local", "--draft", "d"]]
HALF_PAIRS_TOO = [
    ["calibrate", "--draft", "d"],
    ["bench", "compare", "--draft", "d"],
    ["bench", "calibration", "--target", "t"],
]


@pytest.mark.parametrize(
    "argv", [*HALF_PAIRS, *HALF_PAIRS_TOO], ids=["up", "demo", "bench", "calibrate", "compare", "calibration-bench"]
)
def test_half_a_pair_is_a_usage_error(
    argv: list[str], a_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It exited 1 with no `error:` (up, demo, bench) or 1 with one (calibrate); a usage error is 2 (wave 50)."""
    monkeypatch.chdir(tmp_path)  # bench's default output directory is relative: none may appear, here or anywhere
    corpus = ["--corpus", str(a_file)] if argv[0] == "calibrate" else []  # a text document: the pair is what fails
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, *corpus])
    assert exited.value.code == 2
    one_error_line(capsys, "give both --draft and --target, or neither")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no empty output directory left behind


INTERRUPTIBLE = [
    (["bench", "--local"], "run_bench", "calispec bench"),
    (["bench", "compare", "--pair", "tiny"], "bench_pair_dirs", "calispec bench compare"),
    (["bench", "calibration", "--pair", "tiny"], "bench_pair_dirs", "calispec bench calibration"),
    (["eval", "--local"], "local_stack", "calispec eval"),
]


@pytest.mark.parametrize(("argv", "step", "name"), INTERRUPTIBLE, ids=[" ".join(a[:2]) for a, _, _ in INTERRUPTIBLE])
@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [
        (KeyboardInterrupt, 130, "interrupted (any service it started is stopped)"),
        (
            ServiceStartError("the draft could not start", "draft_service exited (exit 1; log: x.log)"),
            2,
            "x.log",
        ),
    ],
    ids=["ctrl-c", "start-failed"],
)
def test_bench_and_eval_end_in_one_line_when_interrupted_or_their_stack_cannot_start(
    argv: list[str],
    step: str,
    name: str,
    raised: BaseException | type[BaseException],
    code: int,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both were tracebacks (Ctrl-C: exit 1 after 40 lines; a service that could not start: exit 1), found by
    probing; `up` and `demo` said one line."""

    def fails(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(cli_bench, step, fails)
    monkeypatch.chdir(tmp_path)
    assert cli.main([*argv, "--out", str(tmp_path / "out")] if argv[1] in ("--local",) else argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    if code == 130:
        assert err[0].startswith(f"{name}: ")


def test_models_tiny_refuses_a_path_it_cannot_write_before_building(
    a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file, a read-only mount or /proc as --out was a traceback after 10-17 s of building (found by probing)."""
    assert cli.main(["models", "tiny", "--out", str(a_file / "tiny")]) == 2
    one_error_line(capsys, f"cannot write the tiny pair to {a_file / 'tiny'}")


def test_a_tiny_pair_missing_a_file_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its marker alone made it 'built': `models tiny` printed the paths of a pair without its weights."""
    from calispec_tools.models import tiny

    built: list[str] = []

    class Saved:
        def __init__(self, name: str) -> None:
            self.name = name

        def save_pretrained(self, path: Path) -> None:
            built.append(self.name)
            Path(path).mkdir(parents=True, exist_ok=True)
            for name in ("config.json", "model.safetensors"):
                (Path(path) / name).write_text("{}")

    monkeypatch.setattr(tiny, "build_tokenizer", lambda: Saved("tokenizer"))
    monkeypatch.setattr(tiny, "build_model", lambda spec, tokenizer: Saved(f"model {spec.seed}"))
    tiny.build_tiny_pair(tmp_path)
    assert len(built) == 4
    tiny.build_tiny_pair(tmp_path)
    assert len(built) == 4  # complete: reused
    (tmp_path / "draft" / "model.safetensors").unlink()
    tiny.build_tiny_pair(tmp_path)
    assert len(built) == 8


def test_certs_dev_keeps_a_ca_it_would_replace_and_refuses_bad_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run again on its directory it replaced the CA every service trusts, without a word; `""` wrote into the current
    directory and `--namespace 'Bad_NS!'` made SANs such as draft..svc (found by probing)."""
    certs = tmp_path / "certs"
    assert cli.main(["certs", "dev", str(certs)]) == 0
    ca = (certs / "ca.pem").read_bytes()
    capsys.readouterr()
    assert cli.main(["certs", "dev", str(certs)]) == 2
    one_error_line(capsys, "holds a CA already (ca.pem): --force replaces it")
    assert (certs / "ca.pem").read_bytes() == ca
    assert cli.main(["certs", "dev", str(certs), "--force"]) == 0 and (certs / "ca.pem").read_bytes() != ca
    for argv in (["certs", "dev", ""], ["certs", "dev", str(tmp_path / "b"), "--namespace", "Bad_NS!"]):
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(argv)
        assert exited.value.code == 2
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("flag", ["--logprobs", "--prompt-logprobs"])
def test_chat_takes_no_logprobs_it_cannot_show(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`chat` prints text only: it took --logprobs K ("printed with --json", which it has not) and dropped them."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["chat", flag, "2"])
    assert exited.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_generates_help_gives_its_required_prompt_no_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--prompt PROMPT the prompt" in help_text and "demo request" not in help_text


@pytest.mark.parametrize(
    ("flags", "gpus"),
    [([], 0.0), (["--device", "cuda"], 1.0), (["--device", "cuda:0"], 1.0), (["--device", "cuda", "--worker-gpus",
     "0.25"], 0.25), (["--device", "auto", "--worker-gpus", "1"], 1.0)],
)  # fmt: skip
def test_ray_workers_ask_for_the_gpus_their_device_needs(flags: list[str], gpus: float) -> None:
    """Ray hides every GPU from an actor that asks for none: `--device cuda` failed in each worker (a CUDA audit)."""
    from calispec_tools.cli_calibrate import worker_gpus

    args = cli.build_parser().parse_args(["calibrate", "--corpus", "c.jsonl", "--ray", "127.0.0.1:1", *flags])
    assert worker_gpus(args) == gpus


def test_ray_workers_are_not_given_a_gpu_index_they_cannot_see(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["calibrate", "--corpus", "c.jsonl", "--ray", "127.0.0.1:1", "--device", "cuda:1"]
    assert cli.main(argv) == 2
    assert "each worker sees only its own GPUs, from 0; give --device cuda" in capsys.readouterr().err
