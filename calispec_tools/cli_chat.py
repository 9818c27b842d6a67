"""`calispec chat`: talk to a running coordinator; the conversation is rendered server-side with the
target model's chat template. One-shot with `-m TEXT`, else an interactive loop that keeps the
conversation and prints each reply as it streams (`/exit` or Ctrl-D ends it, Ctrl-C stops a reply; its exit
status is 1 if a turn failed).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any, TextIO

from calispec.client import CalispecClient, CalispecRpcError, build_params
from calispec_core.errors import InvalidArgument
from calispec_core.limits import require_unicode
from calispec_tools.cli_auth import rpc_error_line, usage_error, uses_tls

Conversation = list[dict[str, str]]
EXIT_COMMANDS = ("/exit", "/quit")


def stream_reply(
    client: CalispecClient, conversation: Conversation, params: dict[str, Any], timeout: float, out: TextIO
) -> str:
    """Print the assistant's reply as it arrives; returns it whole."""
    parts: list[str] = []
    for chunk in client.chat_stream(conversation, timeout=timeout, **params):
        out.write(chunk.text)
        out.flush()
        parts.append(chunk.text)
    out.write("\n")
    return "".join(parts)


def one_shot(
    client: CalispecClient, conversation: Conversation, params: dict[str, Any], timeout: float, tls: bool = False
) -> int:
    try:
        stream_reply(client, conversation, params, timeout, sys.stdout)
    except CalispecRpcError as exc:
        print(rpc_error_line(exc, tls), file=sys.stderr)
        return 1
    return 0


def repl(
    client: CalispecClient,
    conversation: Conversation,
    params: dict[str, Any],
    timeout: float,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
    tls: bool = False,  # the client's: a failed turn's line hints at a TLS mismatch (cli_auth.rpc_error_line)
) -> int:
    """Read a user turn, stream the reply, keep both; a failed or interrupted turn is dropped. Exits 1 if a turn
    failed (turns piped in from a script: it exited 0 whatever happened), else 0."""
    failed = False
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return int(failed)
        if line in EXIT_COMMANDS:
            return int(failed)
        if not line:
            continue
        try:  # a byte stdin could not decode: protobuf refused it in a traceback that ended the chat
            require_unicode(line, "that line")
        except InvalidArgument:
            failed = True
            out.write("[error: that line is not valid UTF-8; the conversation goes on without it]\n")
            continue
        conversation.append({"role": "user", "content": line})
        try:
            reply = stream_reply(client, conversation, params, timeout, out)
        except (CalispecRpcError, KeyboardInterrupt) as exc:
            conversation.pop()
            failed = failed or isinstance(exc, CalispecRpcError)  # an interrupted turn is the user's choice
            out.write(f"\n[{'interrupted' if isinstance(exc, KeyboardInterrupt) else rpc_error_line(exc, tls)}]\n")
            continue
        conversation.append({"role": "assistant", "content": reply})


def run_chat(
    address: str,
    message: str | None,
    system: str | None,
    params: dict[str, Any],
    timeout: float,
    auth: dict[str, Any],  # token / tls_ca / tls_server_name (cli_auth.client_auth)
) -> int:
    conversation: Conversation = [{"role": "system", "content": system}] if system else []
    try:
        build_params(**params)  # refused here, once, rather than as every turn's traceback
        client = CalispecClient(address, **auth)
    except ValueError as exc:  # credentials or parameters the SDK cannot use
        return usage_error(exc)
    with client:
        tls = uses_tls(auth)
        if message is not None:
            return one_shot(client, [*conversation, {"role": "user", "content": message}], params, timeout, tls)
        if isinstance(sys.stdin, io.TextIOWrapper):  # under a UTF-8 locale stdin decodes strictly: input() raised
            sys.stdin.reconfigure(errors="surrogateescape")  # undecodable bytes reach repl's check (found by review)
        return repl(client, conversation, params, timeout, tls=tls)
