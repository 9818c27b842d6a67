"""`calispec memory export|import|stats` against a real memory service; bad imports change nothing."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from calispec_tools import cli_memory, memory_file
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


def test_an_export_leaves_out_ids_outside_its_vocabulary(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys
) -> None:
    """A namespace written before its vocabulary was declared kept id 500 beside a vocabulary of 10: the export
    carried both, and no import could read it back (found by probing). Verifiers skip such ids too."""
    address, store = memory
    store.record("vx", [(500, 5, 1)], durable=True)  # no vocabulary yet
    store.record("vx", [(5, 6, 3)], vocab_size=10, durable=True)
    said = exported_and_imported_again(address, tmp_path, capsys, "vx")
    assert "left out 1 pairs with token ids outside the vocabulary of 10" in said
    assert sorted(store.snapshot("vx")[0]) == [(5, 6, 6), (500, 5, 1)]


def exported_and_imported_again(address: str, tmp_path: Path, capsys, namespace: str) -> str:
    """`namespace` exported, and the file imported back into it (both exit 0); what the export said on stderr."""
    token, out = tmp_path / "token", tmp_path / "export.json"
    token.write_text(TOKEN)
    assert run("memory", "export", "--namespace", namespace, "--out", str(out), "--memory-addr", address) == 0
    said = capsys.readouterr().err
    args = ("--namespace", namespace, "--memory-addr", address, "--writer-token-file", str(token), "--file", str(out))
    assert run("memory", "import", *args) == 0
    return said


def test_an_export_leaves_out_pairs_of_a_token_with_itself(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys
) -> None:
    """Imports before wave 55 counted (7, 7); imports refuse such a pair now, so an export carrying it from an older
    table could never be read back."""
    import sqlite3

    address, store = memory
    store.record("vs", [(5, 6, 3)], vocab_size=10, durable=True)
    with sqlite3.connect(tmp_path / "memory.db") as db:  # as an older release's import left it
        db.execute("INSERT INTO pair_counts VALUES ('vs', 7, 7, 2, 1)")
    assert (7, 7, 2) in store.snapshot("vs")[0]
    assert "left out 1 pairs of a token with itself" in exported_and_imported_again(address, tmp_path, capsys, "vs")
    assert sorted(store.snapshot("vs")[0]) == [(5, 6, 6), (7, 7, 2)]


def test_the_same_file_imported_again_counts_once(memory: tuple[str, CorrectionStore], tmp_path: Path, capsys) -> None:
    """The obvious reaction to an import that ended without its reply (UNAVAILABLE: "accepted but not committed
    in time") is to run it again: that counted the file twice, where it had said "nothing was imported"."""
    address, store = memory
    store.record("pair-a", [(1, 2, 30), (3, 4, 5)], durable=True)
    token, out = tmp_path / "token", tmp_path / "a.json"
    token.write_text(TOKEN)
    args = ("--namespace", "pair-a", "--memory-addr", address, "--writer-token-file", str(token))
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    for _ in range(2):
        assert run("memory", "import", *args, "--file", str(out)) == 0
    assert store.snapshot("pair-a")[0] == [(1, 2, 60), (3, 4, 10)]  # the export's counts, added once
    first, second = capsys.readouterr().out.splitlines()[-2:]  # after the export's line
    assert first.startswith("imported 2 pairs (35 events) into pair-a, now version 2")
    assert second.startswith("already imported into pair-a")  # it printed the first import's line again
    assert run("memory", "import", *args[:2], "--memory-addr", "127.0.0.1:1", "--file", str(out), *args[4:]) == 1
    err = capsys.readouterr().err
    assert "(nothing was imported)" in err  # it never connected
    assert "error: memory service 127.0.0.1:1: UNAVAILABLE: " in err  # which service (it said the code alone)
    for command in (("stats",), ("export", "--out", str(tmp_path / "b.json"))):
        assert run("memory", *command, "--namespace", "pair-a", "--memory-addr", "127.0.0.1:1") == 1
        assert "error: memory service 127.0.0.1:1: UNAVAILABLE: " in capsys.readouterr().err
    accepted = "the write was accepted but not committed in time; it may still be committed"
    assert cli_memory.import_outcome(grpc.StatusCode.UNAVAILABLE, accepted).startswith("it may have been imported")
    assert cli_memory.import_outcome(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded").startswith("it may")
    refused = "the correction memory cannot commit (the correction memory's database: database or disk is full)"
    assert cli_memory.import_outcome(grpc.StatusCode.UNAVAILABLE, refused) == "nothing was imported"  # said "may have"


def test_stats_decodes_the_top_pairs_with_a_tokenizer(memory: tuple[str, CorrectionStore], tiny_pair, capsys) -> None:
    from calispec_core.modeling import load_tokenizer

    address, store = memory
    store.record("pair-a", [(5, 6, 4)], durable=True)
    assert (
        run("memory", "stats", "--namespace", "pair-a", "--memory-addr", address, "--tokenizer", str(tiny_pair.target))
        == 0
    )
    tokenizer = load_tokenizer(tiny_pair.target)
    row = f"{tokenizer.decode([5])!r:>20} -> {tokenizer.decode([6])!r:<20} 4"
    assert row in capsys.readouterr().out.splitlines()[-1]


def _with_pairs(doc: dict, pairs: list[list[int]]) -> dict:
    digest = hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()
    return {**doc, "pairs": pairs, "sha256": digest}


def _count_past_2_40(doc: dict) -> dict:
    return _with_pairs(doc, [[1, 2, 2**40 + 1]])


def _corrupt(doc: dict) -> dict:
    doc["pairs"][0][2] += 1
    return doc


BAD_FILES = [
    pytest.param(lambda doc: "{not json", "not JSON", id="not-json"),
    pytest.param(_corrupt, "corrupted", id="checksum"),
    pytest.param(lambda doc: {**doc, "format_version": 2}, "format version 2", id="wrong-version"),
    pytest.param(lambda doc: {**doc, "namespace": "pair-b"}, "holds namespace 'pair-b'", id="wrong-namespace"),
    pytest.param(lambda doc: {**doc, "format": "other"}, "not a Calispec memory export", id="wrong-format"),
    # these crashed with a traceback (found by probing)
    pytest.param(lambda doc: "[" * 100_000, "nested too deeply", id="deep-nesting"),
    pytest.param(lambda doc: '{"pairs": [[1, 2, ' + "9" * 5000 + "]]}", "not JSON we can read", id="huge-integer"),
    # a vocabulary the uint32 field cannot carry: a ValueError traceback building the request (wave 50)
    pytest.param(lambda doc: {**doc, "vocab_size": 2**32}, "vocab_size must be an integer in", id="vocab-2**32"),
    # a table's count past 2**40 (writes add up), exported: "must be [draft id, target id, count >= 1]" (wave 51)
    pytest.param(_count_past_2_40, "a count of 1099511627777 is more than an import writes a pair", id="count"),
    # no rejection makes a pair of a token with itself; imports counted them (wave 54's left-alone list)
    pytest.param(lambda doc: _with_pairs(doc, [[1, 2, 3], [4, 4, 1]]), "pairs[1] pairs token 4 with itself", id="self"),
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


def test_an_import_reads_no_more_than_an_export_can_be(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It read the whole file: `--file /dev/zero` grew to 20 GB until the kernel killed it (found by probing).
    Here the bound is made small, and the file a little over it (a device would not end at all)."""
    address, _ = memory
    monkeypatch.setattr(memory_file, "MAX_EXPORT_BYTES", 1000)
    big, token = tmp_path / "big.json", tmp_path / "token"
    big.write_text(" " * 1001)
    token.write_text(TOKEN)
    args = ("--namespace", "pair-a", "--memory-addr", address, "--writer-token-file", str(token))
    assert run("memory", "import", *args, "--file", str(big)) == 1
    assert f"{big} is larger than an export can be (1,000 bytes) (nothing was imported)" in capsys.readouterr().err


def test_an_export_to_a_path_it_cannot_write_fails_cleanly(
    memory: tuple[str, CorrectionStore], tmp_path, capsys
) -> None:
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out = tmp_path / "no-such-dir" / "a.json"  # a FileNotFoundError traceback before
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 1
    assert f"cannot write {out}" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "directory", "dot", "under-a-file"])
def test_an_export_never_replaces_what_is_not_a_regular_file(
    memory: tuple[str, CorrectionStore], tmp_path: Path, kind: str, capsys
) -> None:
    """An export renames a temporary file over its path: as root `--out /dev/null` replaced the system's /dev/null
    with a file (a FIFO here), and `--out .` or a path under a file were tracebacks (found by probing)."""
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out = {"fifo": tmp_path / "pipe", "directory": tmp_path, "dot": Path("."), "under-a-file": tmp_path / "f" / "a"}[
        kind
    ]
    if kind == "fifo":
        os.mkfifo(out)
    if kind == "under-a-file":
        (tmp_path / "f").write_text("x")
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {out}"), err
    assert kind != "fifo" or stat.S_ISFIFO(out.stat().st_mode)


def test_an_export_refuses_a_symlink(memory: tuple[str, CorrectionStore], tmp_path: Path, capsys) -> None:
    """Renamed over, the link was lost; written through, another user's link in /tmp points root's export anywhere."""
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    target, link = tmp_path / "target.json", tmp_path / "latest.json"
    target.write_text("keep")
    link.symlink_to(target)
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(link), "--memory-addr", address) == 1
    assert "it is a symlink" in capsys.readouterr().err
    assert link.is_symlink() and target.read_text() == "keep"
    out = tmp_path / "out.json"
    out.with_name("out.json.tmp").symlink_to(target)  # a link planted where the temporary file goes
    assert run("memory", "export", "--namespace", "pair-a", "--out", str(out), "--memory-addr", address) == 0
    assert target.read_text() == "keep" and json.loads(out.read_text())["pairs"] == [[1, 2, 3]]


def test_an_export_of_a_namespace_never_written_is_an_error(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys
) -> None:
    """A typo wrote an empty export and exited 0 (found by probing)."""
    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    out = tmp_path / "a.json"
    assert run("memory", "export", "--namespace", "pair-typo", "--out", str(out), "--memory-addr", address) == 1
    assert "namespace pair-typo was never written" in capsys.readouterr().err and not out.exists()


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


def test_namespaces_lists_sizes_and_the_only_one_is_the_default(memory: tuple[str, CorrectionStore], capsys) -> None:
    address, store = memory
    store.record("pair-a", [(1, 2, 30), (3, 4, 5)], durable=True)
    assert run("memory", "namespaces", "--memory-addr", address) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "pair-a" in x)
    assert line.split()[1:] == ["2", "35", "35", "1"]  # pairs, events in the table, ever recorded, version
    assert run("memory", "stats", "--memory-addr", address) == 0  # no --namespace: the only one
    assert "namespace pair-a" in capsys.readouterr().out
    store.record("pair-b", [(5, 6, 1)], durable=True)
    with pytest.raises(SystemExit) as exited:
        run("memory", "stats", "--memory-addr", address)
    assert exited.value.code == 2  # a usage error (it exited 1)
    assert re.search(r"error: give --namespace.*\n  pair-a\n  pair-b", capsys.readouterr().err)


@pytest.mark.parametrize("named", ["not", "localhost"])
def test_the_running_stacks_memory_namespace_and_token_are_the_defaults(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys, named: str
) -> None:
    """localhost: `--memory-addr localhost:P` for the stack's 127.0.0.1:P is still the stack's memory: its namespace,
    marker and writer token (each compared address strings, so the namespace had to be given and the import refused
    the token; found by probing, wave 55)."""
    import os

    from calispec_tools.stack_state import StackState

    address, store = memory
    store.record("pair-a", [(1, 2, 3)], durable=True)
    store.record("pair-b", [(7, 8, 2)], durable=True)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    StackState(os.getpid(), "127.0.0.1:1", address, "pair-b", "d", "t", str(token)).write()
    given = ["--memory-addr", address.replace("127.0.0.1", "localhost")] if named == "localhost" else []
    assert run("memory", "namespaces", *given) == 0
    assert next(x for x in capsys.readouterr().out.splitlines() if "pair-b" in x).startswith("* ")
    out = tmp_path / "b.json"
    assert run("memory", "export", *given, "--out", str(out)) == 0  # no namespace
    assert json.loads(out.read_text())["namespace"] == "pair-b"
    assert run("memory", "import", *given, "--file", str(out)) == 0  # the stack's writer token
    store.flush()
    assert store.snapshot("pair-b")[0] == [(7, 8, 4)]


def test_shipped_calibration_seeds_a_fresh_namespace_once(memory: tuple[str, CorrectionStore], tmp_path: Path) -> None:
    from calispec_tools.memory_file import dump_export
    from calispec_tools.shipped_calibration import seed_namespace

    address, store = memory
    path = tmp_path / "pair.json"
    dump_export(path, "pair-a", 0, [(1, 2, 9), (3, 4, 7)], exported_at="")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{'0' * 64}  pair.json\n")
    assert not seed_namespace(address, "pair-a", path, TOKEN).loaded  # the hash does not match
    sums.write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  pair.json\n")
    assert not seed_namespace(address, "pair-z", path, TOKEN).loaded  # another pair's namespace
    assert seed_namespace(address, "pair-a", path, TOKEN).loaded
    assert store.snapshot("pair-a")[0] == [(1, 2, 9), (3, 4, 7)]
    again = seed_namespace(address, "pair-a", path, TOKEN)
    assert not again.loaded and "already holds counts" in again.message
    assert store.stats("pair-a")[0] == 16 and store.stats("pair-z")[0] == 0


def test_a_seeder_that_loses_the_race_loads_nothing(
    memory: tuple[str, CorrectionStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two seeders (a Job run twice, two deployments) both find the namespace empty; the one whose write lands
    second must not add the file's counts again."""
    from calispec_tools import shipped_calibration
    from calispec_tools.memory_file import dump_export

    address, store = memory
    path = tmp_path / "pair.json"
    dump_export(path, "pair-a", 0, [(1, 2, 9), (3, 4, 7)], exported_at="")
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  pair.json\n")
    real_check = shipped_calibration.check_file

    def other_seeder_wins(checked: Path) -> None:  # runs after this seeder found the namespace empty
        store.record("pair-a", [(1, 2, 9), (3, 4, 7)], durable=True)
        real_check(checked)

    monkeypatch.setattr(shipped_calibration, "check_file", other_seeder_wins)
    result = shipped_calibration.seed_namespace(address, "pair-a", path, TOKEN)
    assert (result.loaded, result.present) == (False, True) and "already holds counts" in result.message
    assert store.snapshot("pair-a")[0] == [(1, 2, 9), (3, 4, 7)]  # once, not twice


def test_memory_seed_loads_the_shipped_calibration_once_into_its_namespace(
    memory: tuple[str, CorrectionStore], tmp_path: Path, capsys
) -> None:
    """What a Kubernetes deployment runs (deploy/k8s/calibration-seed/job.yaml): exit 0 when the namespace holds
    counts afterwards, 1 when the file is refused."""
    from calispec_tools.shipped_calibration import file_namespace, shipped_file

    address, store = memory
    shipped = shipped_file("qwen-coder")
    assert shipped is not None
    namespace = file_namespace(shipped)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = ("memory", "seed", "--memory-addr", address, "--writer-token-file", str(token))
    assert run(*args, "--namespace", "pair/other+pair/0") == 1  # the file was made for another namespace
    assert run(*args) == 0
    printed = capsys.readouterr().out
    assert f"namespace {namespace}" in printed and "calibration: loaded" in printed
    assert "λ chosen for it: 4 where the target serves float32" in printed
    store.flush()
    events = store.stats(namespace)[0]
    assert events > 1000 and store.stats("pair/other+pair/0")[0] == 0
    assert run(*args) == 0
    assert "already holds counts" in capsys.readouterr().out
    assert store.stats(namespace)[0] == events


def test_memory_seed_that_never_connects_says_why(tmp_path: Path, capsys) -> None:
    """It waits for the service (a Job may start before memory); past the wait it reports the connection's own
    error (refused, a TLS handshake), not the bare "Deadline Exceeded" a waiting call ends with."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    args = ("memory", "seed", "--memory-addr", "127.0.0.1:1", "--writer-token-file", str(token), "--wait-s", "1")
    assert run(*args) == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err and "nothing was loaded" in err


def test_eval_reads_the_memory_services_only_namespace_by_default(memory: tuple[str, CorrectionStore], capsys) -> None:
    """It read "default", which no stack writes to, and reported no rejections at all (found by probing, wave 50)."""
    from calispec_tools import cli
    from calispec_tools.cli_bench import endpoints

    address, store = memory
    store.record("pair/x+y/abc", [(1, 2, 3)], durable=True)
    args = cli.build_parser().parse_args(["eval", "--address", "127.0.0.1:1", "--memory-address", address])
    with endpoints(args, reads_memory=True) as ep:
        assert ep.namespace == "pair/x+y/abc"
    store.record("pair/other", [(1, 2, 3)], durable=True)
    with pytest.raises(SystemExit) as exited, endpoints(args, reads_memory=True):
        pass
    assert exited.value.code == 2
    assert "error: give --memory-namespace; the memory service at" in capsys.readouterr().err  # eval's flag
    bench = cli.build_parser().parse_args(["bench", "--address", "a:1", "--memory-address", "127.0.0.1:1"])
    with endpoints(bench) as ep:  # bench reads no memory: it asks nothing of the (closed) address
        assert ep.namespace is None
    given = cli.build_parser().parse_args(
        [*["eval", "--address", "a:1", "--memory-address", address], "--memory-namespace", "n"]
    )
    with endpoints(given, reads_memory=True) as ep:
        assert ep.namespace == "n"
