"""`calispec memory export|import|stats` against a real memory service; bad imports change nothing."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec_tools import cli_memory
from memory_service.config import MemoryConfig
from memory_service.server import create_server
from memory_service.store import CorrectionStore

TOKEN = "cli-test-writer-token-0123456789"


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[tuple[str, CorrectionStore]]:
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", flush_interval_s=0.05, writer_token=TOKEN)
    server, port, store = create_server(config)
    server.start()
    yield f"127.0.0.1:{port}", store
    store.hub.close()
    server.stop(None).wait()
    store.close()


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli_memory.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_export_import_round_trip_and_stats(memory: tuple[str, CorrectionStore], tmp_path: Path, capsys) -> None:
    address, store = memory
    store.record("pair-a", [(1, 2, 30), (3, 4, 5), (5, 6, 1)], durable=True)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    out = tmp_path / "a.json"
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    assert json.loads(out.read_text())["format_version"] == 1
    store.record("pair-a", [(1, 2, 1)], durable=True)
    args = ("--namespace", "pair-a", "--memory-addr", address)
    assert run("memory", "import", *args, "--file", str(out), "--writer-token-file", str(token)) == 0
    assert store.snapshot("pair-a")[0] == [(1, 2, 61), (3, 4, 10), (5, 6, 2)]  # import adds counts
    capsys.readouterr()
    assert run("memory", "stats", *args, "--top", "2") == 0
    printed = capsys.readouterr().out
    assert "top 20% of pairs cover" in printed and "#1" in printed and "3 pairs" in printed


def _corrupt(doc: dict) -> dict:
    doc["pairs"][0][2] += 1
    return doc


BAD_FILES = [
    pytest.param(lambda doc: "{not json", "not JSON", id="not-json"),
    pytest.param(_corrupt, "corrupted", id="checksum"),
    pytest.param(lambda doc: {**doc, "format_version": 2}, "format version 2", id="wrong-version"),
    pytest.param(lambda doc: {**doc, "namespace": "pair-b"}, "holds namespace 'pair-b'", id="wrong-namespace"),
    pytest.param(lambda doc: {**doc, "format": "other"}, "not a Calispec memory export", id="wrong-format"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_FILES)
def test_bad_import_fails_cleanly_and_changes_nothing(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys, mutate, message: str
) -> None:
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out, token = tmp_path / "a.json", tmp_path / "token"
    token.write_text(TOKEN)
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    mutated = mutate(json.loads(out.read_text()))
    out.write_text(mutated if isinstance(mutated, str) else json.dumps(mutated))
    before = store.snapshot("pair-a")
    capsys.readouterr()
    code = run(
        "memory", "import", "--namespace", "pair-a", "--memory-addr", address,
        "--file", str(out), "--writer-token-file", str(token),
    )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert message in err and "nothing was imported" in err
    store.flush()
    assert store.snapshot("pair-a") == before


def test_import_without_the_writer_token_is_refused(memory: tuple[str, CorrectionStore], tmp_path: Path) -> None:
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out, token = tmp_path / "a.json", tmp_path / "token"
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    token.write_text("a-wrong-token-that-is-long-enough")
    args = ("--namespace", "pair-a", "--memory-addr", address, "--file", str(out), "--writer-token-file", str(token))
    assert run("memory", "import", *args) == 1
    assert store.stats("pair-a")[0] == 3


def test_an_export_carries_the_vocabulary_and_an_import_declares_it(
    memory: tuple[str, CorrectionStore], tmp_path: Path
) -> None:
    address, store = memory
    store.declare_vocab("pair-a", 100)
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out, token = tmp_path / "a.json", tmp_path / "token"
    token.write_text(TOKEN)
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    assert json.loads(out.read_text())["vocab_size"] == 100
    config = MemoryConfig(port=0, db_path=tmp_path / "fresh.db", flush_interval_s=0.05, writer_token=TOKEN)
    server, port, fresh = create_server(config)  # a new memory: the namespace has no vocabulary yet
    server.start()
    try:
        args = ("--namespace", "pair-a", "--memory-addr", f"127.0.0.1:{port}", "--writer-token-file", str(token))
        assert run("memory", "import", *args, "--file", str(out)) == 0
        assert fresh.table_stats("pair-a").vocab_size == 100
        doc = json.loads(out.read_text())  # an id outside the vocabulary, with a recomputed checksum
        doc["pairs"] = [[1, 100, 1]]
        doc["sha256"] = hashlib.sha256(json.dumps(doc["pairs"], separators=(",", ":")).encode()).hexdigest()
        out.write_text(json.dumps(doc))
        assert run("memory", "import", *args, "--file", str(out)) == 1
        fresh.flush()
        assert fresh.stats("pair-a")[0] == 3
    finally:
        server.stop(None).wait()
        fresh.close()
