"""Log-probabilities in the OpenAI API's two forms (no gRPC, no HTTP here): the chat API's `content` list and the
completions API's parallel lists. Token texts are each token decoded alone, as vLLM's (a token that holds part of
a character decodes to U+FFFD), special tokens skipped as in the choice's text (EOS is ""), so that the completions
form's offsets follow the text; a log-probability of -inf is sent as -9999.0, as vLLM's (JSON has no -inf)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from calispec_core.generation import TokenLogprob
from coordinator.openai_protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

FLOOR = -9999.0  # what -inf becomes


class TokenTexts:
    """Each token id's text, decoded once per id (a position's 20 most likely tokens repeat across positions)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.text = lru_cache(maxsize=65536)(lambda token: decode([token]))


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def chat_logprobs(texts: TokenTexts, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> ChatLogprobs:
    def entry(token: int, logprob: float) -> dict[str, Any]:  # the fields of a TopLogprob
        text = texts.text(token)
        return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode())}

    content = []
    for token, lp in zip(token_ids, logprobs, strict=True):
        top = [TopLogprob(**entry(t, v)) for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)]
        content.append(ChatTokenLogprob(**entry(token, lp.logprob), top_logprobs=top))
    return ChatLogprobs(content=content)


def completion_logprobs(
    texts: TokenTexts, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob], offset: int = 0
) -> CompletionLogprobs:
    """`offset`: where this part's text starts in the choice's (a stream's earlier chunks: `end_offset` of the last)."""
    tokens = [texts.text(t) for t in token_ids]
    top = []
    for text, lp in zip(tokens, logprobs, strict=True):
        likely = {texts.text(t): finite(v) for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)}
        likely.setdefault(text, finite(lp.logprob))  # the token itself among them, as vLLM's
        top.append(likely)
    starts = []
    for text in tokens:
        starts.append(offset)
        offset += len(text)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=[finite(lp.logprob) for lp in logprobs], top_logprobs=top, text_offset=starts
    )


def end_offset(logprobs: CompletionLogprobs, offset: int) -> int:
    """Where the text after these tokens starts: the next chunk's `offset`."""
    return logprobs.text_offset[-1] + len(logprobs.tokens[-1]) if logprobs.tokens else offset


def prompt_logprobs(
    texts: TokenTexts, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]
) -> CompletionLogprobs:
    """An echoed prompt's part of a choice's log-probabilities: `logprobs` are its tokens' from the second; the
    first has none (null, as OpenAI's and vLLM's: nothing before it to condition on)."""
    first = texts.text(token_ids[0])
    rest = completion_logprobs(texts, token_ids[1:], logprobs, len(first))
    return CompletionLogprobs(
        tokens=[first, *rest.tokens],
        token_logprobs=[None, *rest.token_logprobs],
        top_logprobs=[None, *rest.top_logprobs],
        text_offset=[0, *rest.text_offset],
    )


def joined(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=head.tokens + tail.tokens,
        token_logprobs=head.token_logprobs + tail.token_logprobs,
        top_logprobs=head.top_logprobs + tail.top_logprobs,
        text_offset=head.text_offset + tail.text_offset,
    )


class Echoed(NamedTuple):
    """A completion choice's text and log-probabilities, its prompt's first when echoed."""

    text: str
    logprobs: CompletionLogprobs | None
