"""coordinator.chat.render_chat with stand-in tokenizers: validation, template errors, BOS."""

from __future__ import annotations

import pytest
from jinja2 import TemplateError

from calispec_core.errors import InvalidArgument
from coordinator.chat import ChatTurn, InvalidParam, render_chat
from tests.conftest import TinyPair


class StubTokenizer:
    """Renders "<s>[role]content..." ; adds BOS (id 1) on encode when `adds_bos`."""

    bos_token, bos_token_id = "<s>", 1

    def __init__(self, adds_bos: bool, template: str | None = "t", raises: bool = False) -> None:
        self.adds_bos, self.chat_template, self.raises = adds_bos, template, raises

    def apply_chat_template(
        self, messages, tokenize: bool, add_generation_prompt: bool, continue_final_message: bool
    ) -> str:
        assert tokenize is False and add_generation_prompt is True and continue_final_message is False
        if self.raises:
            raise TemplateError("Conversation roles must alternate user/assistant")
        return "<s>" + "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

    def encode(self, text: str) -> list[int]:
        return [1, 5] if self.adds_bos else [5]


USER = [ChatTurn("user", "hi")]


def test_bos_written_by_the_template_is_dropped_when_encode_adds_it() -> None:
    assert render_chat(StubTokenizer(adds_bos=True), USER) == "[user]hi[assistant]"  # type: ignore[arg-type]
    assert render_chat(StubTokenizer(adds_bos=False), USER) == "<s>[user]hi[assistant]"  # type: ignore[arg-type]


def test_template_errors_and_missing_templates_are_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="rejected the messages: Conversation roles"):
        render_chat(StubTokenizer(adds_bos=False, raises=True), USER)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="no chat template"):
        render_chat(StubTokenizer(adds_bos=False, template=None), USER)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("turns", "param", "fragment"),
    [
        ([ChatTurn("user", "hi"), ChatTurn("tool", "4")], "messages[1].role", "'tool' is not supported"),
        ([ChatTurn("robot", "hi")], "messages[0].role", "must be one of system, user, assistant"),
        ([ChatTurn("user", "x \udfff")], "messages[0].content", "not valid Unicode"),
        ([], "messages", "must not be empty"),
    ],
)
def test_bad_turns_name_the_field_for_the_http_errors_param(turns: list[ChatTurn], param: str, fragment: str) -> None:
    """These reached the OpenAI API's errors with param null; a tool message read as an unknown role."""
    with pytest.raises(InvalidParam, match=fragment) as info:
        render_chat(StubTokenizer(adds_bos=False), turns)  # type: ignore[arg-type]
    assert info.value.param == param and isinstance(info.value, InvalidArgument)


def test_template_variables_reach_the_models_template(tiny_pair: TinyPair) -> None:
    """vLLM's chat_template_kwargs (Qwen3's enable_thinking): they were ignored, so a request asking the template to
    leave its thinking out got it in."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_pair.target))
    tokenizer.chat_template = "{{ 'think ' if thinking else '' }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    turns = [ChatTurn("user", "hi")]
    assert render_chat(tokenizer, turns, template_kwargs={"thinking": True}) == "think hi"
    assert render_chat(tokenizer, turns, template_kwargs={"thinking": False}) == "hi"
