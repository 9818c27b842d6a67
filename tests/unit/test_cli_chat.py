"""`calispec chat`'s loop and `calispec demo`'s choice of request, with a fake client (no services)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from calispec.client import CalispecRpcError, StreamChunk, chat_messages
from calispec_tools import cli
from calispec_tools.cli_chat import repl


class FakeClient:
    """Replies "reply<n>" in two chunks; fails the turns listed in `fail`; records what it was sent."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.sent: list[list[dict[str, str]]] = []
        self.fail = fail

    def chat_stream(self, messages: list[dict[str, str]], **_: object) -> Iterator[StreamChunk]:
        chat_messages(messages)  # what the SDK sends: text it cannot carry raises here, as there
        self.sent.append([dict(m) for m in messages])
        n = len(self.sent)
        if n in self.fail:
            raise CalispecRpcError("INVALID_ARGUMENT", "too long")
        yield StreamChunk("re", [1], "r")
        yield StreamChunk(f"ply{n}", [2], "r", "eos")


def feed(*lines: str):
    queue = list(lines)

    def read(_prompt: str) -> str:
        if not queue:
            raise EOFError
        return queue.pop(0)

    return read


def test_repl_keeps_the_conversation_and_streams_replies() -> None:
    client, out = FakeClient(), io.StringIO()
    conversation = [{"role": "system", "content": "be brief"}]
    assert repl(client, conversation, {}, 10, read=feed("hello", "", "again", "/exit"), out=out) == 0  # type: ignore[arg-type]
    assert client.sent[1] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "reply1"},
        {"role": "user", "content": "again"},
    ]
    assert out.getvalue() == "reply1\nreply2\n"


def test_repl_drops_a_failed_turn_and_goes_on() -> None:
    """... and exits 1 at the end (turns piped in from a script: it exited 0 whatever failed; wave 50)."""
    client, out = FakeClient(fail=(1,)), io.StringIO()
    conversation: list[dict[str, str]] = []
    assert repl(client, conversation, {}, 10, read=feed("bad", "good"), out=out) == 1  # type: ignore[arg-type]
    assert client.sent[1] == [{"role": "user", "content": "good"}]
    assert "error: INVALID_ARGUMENT: too long" in out.getvalue()
    assert conversation == [{"role": "user", "content": "good"}, {"role": "assistant", "content": "reply2"}]


def test_repl_refuses_a_line_that_is_not_utf8_and_keeps_the_conversation() -> None:
    """stdin's undecodable bytes arrive as lone surrogates: the turn ended the chat in a traceback (found by
    probing: `printf 'hello\\xff\\n' | calispec chat`, or typing Latin-1 in a terminal)."""
    client, out = FakeClient(), io.StringIO()
    conversation: list[dict[str, str]] = []
    assert repl(client, conversation, {}, 10, read=feed("caf\udce9", "good"), out=out) == 1  # type: ignore[arg-type]
    assert "not valid UTF-8" in out.getvalue()
    assert conversation == [{"role": "user", "content": "good"}, {"role": "assistant", "content": "reply1"}]


def demo_args(pair: str, prompt: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(pair=pair, prompt=prompt, draft=None, target=None)


def test_demo_sends_the_instruct_pairs_builtin_request_as_chat() -> None:
    args = demo_args("qwen-coder")
    messages = cli.demo_messages(args)  # type: ignore[arg-type]
    assert messages == [{"role": "user", "content": cli.PAIRS["qwen-coder"].demo_message}]
    assert "<|im_start|>" not in messages[0]["content"]


def test_demo_sends_raw_prompts_otherwise() -> None:
    tiny = demo_args("tiny")
    assert cli.demo_messages(tiny) is None and tiny.prompt == cli.DEMO_PROMPT  # type: ignore[arg-type]
    explicit = demo_args("qwen-coder", prompt="2 + 2 =")
    assert cli.demo_messages(explicit) is None and explicit.prompt == "2 + 2 ="  # type: ignore[arg-type]


def test_chat_refuses_an_undecodable_line_under_a_strict_utf8_locale(tmp_path: Path) -> None:
    """Under en_US.UTF-8 stdin decodes strictly: `input()` raised UnicodeDecodeError before the line's check, a
    traceback (found by the review). No coordinator is needed: the line is refused before any call."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    argv = [sys.executable, "-m", "calispec_tools.cli", "chat", "--address", "127.0.0.1:9", "--token", ""]
    done = subprocess.run(argv, input=b"caf\xe9\n", capture_output=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert b"not valid UTF-8" in done.stdout and b"Traceback" not in done.stderr
