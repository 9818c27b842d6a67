"""The load loop's client over the OpenAI-compatible HTTP API (`calispec bench --openai-url`).

It streams `/v1/completions` with the official `openai` client and hands the load loop the same
`StreamChunk`s as the gRPC SDK. Calispec's parameters travel as extra body fields; the server
returns each chunk's token ids when asked (`return_token_ids`, as vLLM does), so per-token
figures stay comparable with the gRPC path. Per-request speculation stats are gRPC-only.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import openai

from calispec._channel import is_loopback_host
from calispec.client import CalispecRpcError, StreamChunk


def extra_body(params: dict[str, Any]) -> dict[str, Any]:
    named = {
        "mode": params.get("mode"),
        "gamma": params.get("num_speculative_tokens"),
        "tau": params.get("tau"),
        "lambda": params.get("lambda_"),
    }
    if params.get("ignore_eos"):
        named["ignore_eos"] = True
    return {"return_token_ids": True, **{k: v for k, v in named.items() if v is not None}}


def rpc_error(exc: openai.APIError) -> CalispecRpcError:
    """The server's error (code = the gRPC status name) as the SDK's exception; a server that did not answer (no
    connection, a timeout) as UNAVAILABLE / DEADLINE_EXCEEDED, as the SDK reports them."""
    if isinstance(exc, openai.APITimeoutError):
        return CalispecRpcError("DEADLINE_EXCEEDED", str(exc.message))
    if not isinstance(exc, openai.APIStatusError):  # APIConnectionError, or a response the client could not read
        return CalispecRpcError("UNAVAILABLE", f"{exc.message} ({exc.request.url})")
    body = exc.body.get("error", {}) if isinstance(exc.body, dict) and "error" in exc.body else exc.body
    code = body.get("code") if isinstance(body, dict) else None
    return CalispecRpcError((code or f"HTTP_{exc.status_code}").upper(), str(exc.message))


def _direct_if_loopback(base_url: str) -> dict[str, None] | None:
    """A loopback server is reached directly, never through the environment's proxy (as gRPC channels:
    calispec/_channel.py); the rest of the environment (SSL_CERT_FILE, SSL_CERT_DIR) still counts. In httpx a mount of
    None is the direct transport, how it applies NO_PROXY."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    if not is_loopback_host(host):
        return None
    return {f"all://{f'[{host}]' if ':' in host else host}": None}


class OpenAIStreamClient:
    """What bench/runner.py needs from AsyncCalispecClient: `generate_stream` and `async with`."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        model: str | None = None,
        api_key: str = "unused",
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        """`tls_context`: what verifies an https server (the CA `calispec up --tls` prints as CALISPEC_TLS_CA);
        None: the system's CAs."""
        verify = tls_context if tls_context is not None else True
        http = openai.DefaultAsyncHttpxClient(verify=verify, mounts=_direct_if_loopback(base_url))
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout, http_client=http
        )
        self.model = model

    async def __aenter__(self) -> OpenAIStreamClient:
        if self.model is None:  # the one model the server lists
            try:
                self.model = (await self._client.models.list()).data[0].id
            except openai.APIError as exc:  # no server there, a refused key: the SDK's error, not a traceback
                await self._client.close()
                raise rpc_error(exc) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    async def generate_stream(
        self, prompt: str, *, timeout: float | None = None, **params: Any
    ) -> AsyncIterator[StreamChunk]:
        assert self.model is not None, "use `async with`"
        try:
            stream = await self._client.completions.create(
                model=self.model, prompt=prompt, max_tokens=params["max_new_tokens"],
                temperature=params.get("temperature", 0.0), seed=params.get("seed"), stream=True,
                extra_body=extra_body(params), timeout=timeout,
            )  # fmt: skip
            async for event in stream:
                for choice in event.choices:
                    token_ids = list(getattr(choice, "token_ids", None) or [])
                    yield StreamChunk(choice.text, token_ids, event.id, choice.finish_reason)
        except openai.APIError as exc:
            raise rpc_error(exc) from None
