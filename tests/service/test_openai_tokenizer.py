"""vLLM's tokenizer endpoints on the HTTP API: what a client that tokenizes remotely (lm-eval's local-completions)
reads, equal to what the server itself does with the same prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from calispec_core.access import ApiKeys, key_line, new_api_key
from tests.service.conftest import Coordinator
from tests.service.test_openai_api import MESSAGES, MODEL, PROMPT, serve


@pytest.fixture(scope="module")
def root(chat_coordinator: Coordinator) -> Iterator[str]:
    """The server's root: vLLM serves these endpoints there, not under /v1."""
    server, url = serve(chat_coordinator)
    yield url.removesuffix("/v1")
    server.stop()  # type: ignore[attr-defined]


def _post(root: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{root}{path}", json=body, timeout=60)


def _usage(root: str, path: str, body: dict) -> int:
    answer = _post(root, path, {"model": MODEL, "max_tokens": 1, "temperature": 0, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens"]


def test_tokenize_counts_what_a_request_of_the_same_prompt_counts(root: str, chat_coordinator: Coordinator) -> None:
    tokenizer = chat_coordinator.orchestrator.tokenizer
    text = _post(root, "/tokenize", {"model": MODEL, "prompt": PROMPT, "return_token_strs": True}).json()
    assert text["tokens"] == tokenizer.encode(PROMPT) and text["count"] == len(text["tokens"])
    assert text["token_strs"] == tokenizer.convert_ids_to_tokens(text["tokens"])
    assert text["max_model_len"] == chat_coordinator.orchestrator.context_length
    assert text["count"] == _usage(root, "/v1/completions", {"prompt": PROMPT})
    chat = _post(root, "/tokenize", {"messages": MESSAGES}).json()
    assert chat["count"] == _usage(root, "/v1/chat/completions", {"messages": MESSAGES})
    assert chat["token_strs"] is None  # not asked
    bare = _post(root, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert chat["tokens"][: bare["count"]] == bare["tokens"] and bare["count"] < chat["count"]


def test_a_text_prompt_ignores_the_chat_rendering_fields(root: str) -> None:
    """vLLM's /tokenize request for a prompt has no rendering fields and ignores them; `continue_final_message: true`
    with a prompt got the 400 meant for messages (add_generation_prompt defaults to true), found by probing."""
    plain = _post(root, "/tokenize", {"prompt": PROMPT}).json()
    rendering = {"continue_final_message": True, "add_generation_prompt": True, "chat_template_kwargs": {"x": 1}}
    assert _post(root, "/tokenize", {"prompt": PROMPT, **rendering}).json() == plain
    assert _post(root, "/tokenize", {"prompt": PROMPT, "messages": None, **rendering}).json() == plain
    error = _post(root, "/tokenize", {"messages": MESSAGES, "continue_final_message": True}).json()["error"]
    assert error["param"] == "continue_final_message"  # messages are rendered: the rule holds for them


def test_detokenize_reverses_tokenize_and_refuses_ids_it_cannot_decode(
    root: str, chat_coordinator: Coordinator
) -> None:
    ids = _post(root, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    assert _post(root, "/detokenize", {"model": MODEL, "tokens": ids}).json() == {"prompt": PROMPT}
    size = len(chat_coordinator.orchestrator.tokenizer)
    for tokens, fragment in (([1, size], f"{size} is not a token id"), ([1, -1], "token ids (integers >= 0)")):
        error = _post(root, "/detokenize", {"tokens": tokens}).json()["error"]
        assert error["param"] == "tokens" and fragment in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"prompt": PROMPT, "messages": MESSAGES}, 400, "exactly one of prompt and messages"),
        ({}, 400, "exactly one of prompt and messages"),
        ({"prompt": "\udcff"}, 400, "prompt"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
        ({"model": "gpt-9", "prompt": PROMPT}, 404, "gpt-9"),
    ],
)
def test_bad_tokenize_requests_get_openai_shaped_errors(root: str, body: dict, status: int, fragment: str) -> None:
    answer = httpx.post(f"{root}/tokenize", content=_json(body), headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert fragment in answer.text


def _json(body: dict) -> bytes:
    return json.dumps(body).encode("utf-8", "surrogatepass")


def test_tokenizer_info_is_what_lm_eval_probes_for(root: str, chat_coordinator: Coordinator) -> None:
    """lm-eval tokenizes remotely when /tokenizer_info has an `eos_token` and /tokenize answers a prompt with a
    list of tokens; it then renders chats with the `chat_template` it reads here."""
    tokenizer = chat_coordinator.orchestrator.tokenizer
    info = httpx.get(f"{root}/tokenizer_info", timeout=60).json()
    assert info["eos_token"] == tokenizer.eos_token and info["chat_template"] == tokenizer.chat_template
    assert info["tokenizer_class"] == type(tokenizer).__name__
    probe = _post(root, "/tokenize", {"prompt": "test", "add_special_tokens": False}).json()
    assert isinstance(probe["tokens"], list) and probe["tokens"]


def test_the_tokenizer_endpoints_need_an_api_key(chat_coordinator: Coordinator, tmp_path: Path) -> None:
    key = new_api_key()
    (tmp_path / "keys").write_text(key_line("alice", key) + "\n")
    server, url = serve(chat_coordinator, ApiKeys(tmp_path / "keys"))
    root = url.removesuffix("/v1")
    try:
        calls = [
            lambda headers: httpx.post(f"{root}/tokenize", json={"prompt": PROMPT}, headers=headers),
            lambda headers: httpx.post(f"{root}/detokenize", json={"tokens": [1]}, headers=headers),
            lambda headers: httpx.get(f"{root}/tokenizer_info", headers=headers),
        ]
        for call in calls:
            assert call({}).status_code == 401
            assert call({"authorization": f"Bearer {key}"}).status_code == 200
    finally:
        server.stop()  # type: ignore[attr-defined]
