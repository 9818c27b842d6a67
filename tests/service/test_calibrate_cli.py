"""`calispec calibrate --corpus` against a real memory service, with the tiny pair loaded in process."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from calispec_tools.calibrate.job import Summary
from calispec_tools.cli_calibrate import _print_progress
from calispec_tools.memory_file import load_export
from tests.conftest import TinyPair
from tests.service.test_memory_cli import TOKEN, memory, run  # noqa: F401 - the fixture

DOCS = [
    {"text": "def add(a, b):\n    return a + b\n\nThe robot counted the stars again."},
    {"prompt": "def fibonacci(n):"},
    {"prompt": "Question: what is 7 times 6?"},
]


def test_corpus_events_reach_the_memory_and_match_an_export(memory, tiny_pair: TinyPair, tmp_path: Path, capsys):  # noqa: F811
    address, store = memory
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    token = tmp_path / "token"
    token.write_text(TOKEN)
    pair = ("--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target), "--dtype", "float32")
    common = ("--corpus", str(corpus), "--generate", "--max-new-tokens", "24", "--batch-size", "1", *pair, "--json")
    args = ("--memory-addr", address, "--namespace", "tiny", "--writer-token-file", str(token))
    assert run("calibrate", *common, *args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["documents"] == 3 and summary["events"] > 0 and summary["events_per_s"] > 0
    progress = [line for line in captured.err.splitlines() if line.startswith("calibrate: ")]
    rows = summary["rows"]
    assert len(progress) == 3 and rows == summary["rows_planned"] == 3  # a line a batch: the text's window, 2 prompts
    last = progress[-1]
    assert last.startswith(f"calibrate: {rows} of {rows} rows, ") and f" {summary['events']:,} events" in last
    assert store.stats("tiny")[0] == summary["events"]  # durable on return: every event is in the table
    out = tmp_path / "tiny.json"
    assert run("calibrate", *common, "--namespace", "tiny", "--export", str(out)) == 0
    assert sorted(load_export(out, "tiny").pairs) == sorted(store.snapshot("tiny")[0])  # the same run, the same counts


def calibrate_into(address: str, tiny_pair: TinyPair, tmp_path: Path, token: str, namespace: str) -> list[str]:
    corpus, token_file = tmp_path / "corpus.jsonl", tmp_path / "token"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    token_file.write_text(token)
    pair = ("--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target), "--dtype", "float32")
    memory_args = ("--memory-addr", address, "--namespace", namespace, "--writer-token-file", str(token_file))
    return ["calibrate", "--corpus", str(corpus), *pair, *memory_args]


def test_ctrl_c_says_which_events_stay_in_the_memory(
    memory,  # noqa: F811
    tiny_pair: TinyPair,
    tmp_path: Path,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C after the first batch said only "interrupted": the events already sent stay, and the user is told."""
    from calispec_tools import cli_calibrate

    def interrupted(summary: Summary) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_calibrate, "_print_progress", interrupted)
    address, store = memory
    with pytest.raises(KeyboardInterrupt):
        run(*calibrate_into(address, tiny_pair, tmp_path, TOKEN, "tiny"), "--batch-size", "1")
    recorded = store.stats("tiny")[0]
    assert recorded > 0  # the first batch's, durable: the writer closed
    line = f"calibrate: interrupted; {recorded:,} events sent before it stay in namespace tiny"
    assert line in capsys.readouterr().err


def test_calibrate_by_sd_goes_to_the_running_stacks_coordinator(
    memory,  # noqa: F811
    tmp_path: Path,
    capsys,
) -> None:
    """`calibrate --prompts` dialled 127.0.0.1:50050 whatever port `calispec up --port` had taken (found by probing)."""
    import os

    from calispec_tools.stack_state import StackState

    address, store = memory
    store.record("ns", [(1, 2, 3)], durable=True)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def fibonacci(n):\n")
    StackState(os.getpid(), "127.0.0.2:1", address, "ns", "d", "t", "token").write()  # no coordinator there
    assert run("calibrate", "--prompts", str(prompts), "--timeout", "5") == 1
    assert "127.0.0.2:1" in capsys.readouterr().err


def test_a_token_the_memory_refuses_is_one_line_before_the_models_load(
    memory,  # noqa: F811
    tiny_pair: TinyPair,
    tmp_path: Path,
    capsys,
) -> None:
    """A traceback, after the whole run (hours on a real pair; found by probing)."""
    address, _ = memory
    with pytest.raises(SystemExit) as exited:
        run(*calibrate_into(address, tiny_pair, tmp_path, "not-the-token-0123456789", "tiny"))
    assert str(exited.value.code).startswith(f"error: cannot calibrate: memory service {address}: UNAUTHENTICATED")
    assert "loading the pair" not in capsys.readouterr().err


def test_a_namespace_of_another_vocabulary_is_one_line_before_the_corpus_runs(
    memory,  # noqa: F811
    tiny_pair: TinyPair,
    tmp_path: Path,
    capsys,
) -> None:
    address, store = memory
    store.record("vx", [(5, 6, 1)], vocab_size=10, durable=True)
    with pytest.raises(SystemExit) as exited:
        run(*calibrate_into(address, tiny_pair, tmp_path, TOKEN, "vx"))
    assert "FAILED_PRECONDITION: namespace 'vx' holds token ids of a vocabulary of 10" in str(exited.value.code)
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("calibrate: ")]
    assert store.stats("vx")[0] == 1  # nothing written


class _GoneStream(io.TextIOBase):
    """A stderr whose reader has gone (`calispec calibrate ... 2>&1 | head`)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_stderr_that_is_gone_costs_the_progress_lines_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress line raised BrokenPipeError out of Calibrator.run, ending an hour's calibration at that batch."""
    monkeypatch.setattr(sys, "stderr", _GoneStream())
    _print_progress(Summary(rows=1, rows_planned=2, positions=10, events=3, total_s=61.0))  # no exception
