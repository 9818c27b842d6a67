"""Who may call what: server interceptors, one per concern, that know nothing of the domain.

- `ApiKeyInterceptor`: the caller presents `authorization: Bearer <key>`, a key of the
  `ApiKeys` file, else UNAUTHENTICATED (the coordinator's public API).
- `PeerAllowlistInterceptor`: the caller's mutual-TLS certificate names an allowed role, else
  PERMISSION_DENIED (draft and target serve the coordinator only; memory writes come from targets).
- `QuotaInterceptor`: per-caller requests per minute (a token bucket) and concurrent requests,
  else RESOURCE_EXHAUSTED.

`caller_identity` is the one place a caller gets its name: the CN of its verified client
certificate when it has one, else the name of its API key. Health checks and reflection are
exempt from all three (probes and tools must reach them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from calispec_core.errors import (
    FailedPrecondition,
    InvalidField,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)

log = logging.getLogger(__name__)

AUTHORIZATION_METADATA = "authorization"
# `Bearer <token>`: the scheme in any case (RFC 9110 §11.1), then spaces or tabs; blanks around the token
_BEARER = re.compile(r"[ \t]*bearer[ \t]+([^ \t]+)[ \t]*", re.IGNORECASE)
EXEMPT_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
KEY_PREFIX = "csk_"  # recognisable in logs and by secret scanners


# -- who is calling ------------------------------------------------------------------------------


def peer_names(context: grpc.ServicerContext) -> frozenset[str]:
    """CN and SANs of the caller's verified certificate; empty without mutual TLS."""
    auth = context.auth_context()
    names = [*auth.get("x509_common_name", []), *auth.get("x509_subject_alternative_name", [])]
    return frozenset(n.decode() if isinstance(n, bytes) else n for n in names)


def peer_common_name(context: grpc.ServicerContext) -> str | None:
    names = context.auth_context().get("x509_common_name", [])
    return names[0].decode() if names else None


def parse_bearer(value: str | None) -> str | None:
    """The token of an `Authorization` value in the Bearer scheme (`bearer`, `BEARER`, ... alike, spaces or
    tabs before the token), else None: no value, another scheme, no token, or more than one word after it."""
    match = _BEARER.fullmatch(value) if value else None
    return match.group(1) if match else None


def bearer_token(context: grpc.ServicerContext) -> str | None:
    """The Bearer token of the call's first `authorization` metadata, as the HTTP API reads the first header: a
    `Basic x` then a `Bearer <key>` was the key over gRPC and refused over HTTP (found by probing)."""
    value = next((v for k, v in context.invocation_metadata() or () if k == AUTHORIZATION_METADATA), None)
    return parse_bearer(value) if isinstance(value, str) else None


def anonymous_caller(host: str) -> str:
    """The quota name of a caller without a key: its address, the same for its gRPC and HTTP requests."""
    return f"anonymous@{host}"


def peer_host(peer: str) -> str:
    """The host of a gRPC peer (`ipv4:127.0.0.1:5000` -> `127.0.0.1`, `ipv6:[::1]:5000` -> `::1`), as the HTTP
    API's client address reads: the gRPC bucket was `anonymous@ipv4:127.0.0.1`, the HTTP one `anonymous@127.0.0.1`,
    so an open coordinator's caller had its quota twice (found by probing). Other peers (`unix:...`) as they are."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = urllib.parse.unquote(address).rpartition(":")[0]  # gRPC sends IPv6's brackets as %5B...%5D
    return host.removeprefix("[").removesuffix("]")


def caller_identity(context: grpc.ServicerContext, keys: ApiKeys | None = None) -> str | None:
    """The caller's name: its certificate's CN under mutual TLS, else its API key's name, else None."""
    common_name = peer_common_name(context)
    if common_name is not None:
        return common_name
    if keys is None:
        return None
    return keys.identify(bearer_token(context))


# -- API keys -------------------------------------------------------------------------------------


KEYS_FILE_MISSING_GRACE_S = 5.0  # a keys file gone this long revokes every key (ApiKeys)


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """Keys are random 256-bit strings: one SHA-256 is enough (no password stretching needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_line(name: str, key: str) -> str:
    """A line of the keys file: `NAME SHA256HEX` (the key itself is never stored). The name must read back as
    written: one word, without `#` (the file's comments: `a#b` broke the whole file, `#a` was a comment)."""
    if not name or any(c.isspace() for c in name) or "#" in name:
        raise ValueError(f"key name must be one word without '#', got {name!r}")
    return f"{name} {hash_key(key)}\n"


def parse_key_file(text: str, source: str = "keys file") -> dict[str, str]:
    """{sha256 hex: name} from `NAME SHA256HEX` lines; `#` comments and blank lines are skipped."""
    hashes: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) != 64 or any(c not in "0123456789abcdef" for c in parts[1].lower()):
            raise FailedPrecondition(f"{source}:{number}: expected `NAME SHA256HEX`")
        hashes[parts[1].lower()] = parts[0]
    return hashes


class ApiKeys:
    """The API keys of a file, reloaded when the file changes (checked at most every `check_every_s`)
    or on `reload()` (SIGHUP). A file that fails to parse keeps the previous keys. A file that is gone keeps
    them `missing_grace_s` (an editor's delete-and-write), then every key is refused until it is back: deleting
    it revoked nothing, for good (found by probing). Thread-safe."""

    def __init__(
        self,
        path: Path,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        missing_grace_s: float = KEYS_FILE_MISSING_GRACE_S,
    ) -> None:
        self.path = Path(path)
        self._check_every_s = check_every_s
        self._missing_grace_s = missing_grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._hashes: dict[str, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._missing_since: float | None = None
        self._checked = clock()
        self.reload(strict=True)  # a bad file at startup is an error, not an empty key set

    def identify(self, token: str | None) -> str | None:
        """The key's name, or None for no token or an unknown one."""
        if not token:
            return None
        self._reload_if_changed()
        return self._hashes.get(hash_key(token))

    def reload(self, strict: bool = False) -> None:
        """Read the file again (SIGHUP, or a change the requests' check saw); never raises unless `strict`."""
        stat = None
        try:
            stat = self.path.stat()  # before the read: a version written meanwhile differs from it, and is read next
            hashes = parse_key_file(self.path.read_text(encoding="utf-8"), str(self.path))
        except (OSError, FailedPrecondition, UnicodeDecodeError) as exc:  # a Latin-1 comment: UnicodeDecodeError
            if strict:
                raise FailedPrecondition(f"cannot load API keys from {self.path}: {exc}") from exc
            if isinstance(exc, FileNotFoundError):  # a SIGHUP after a delete starts the countdown, as a check does
                self._file_missing(self._clock())
            elif stat is not None:  # this version of the file is not read again: its ERROR comes once, not each second
                self._stamp = _file_version(stat)
            log.error("keeping the previous API keys: %s: %s", self.path, exc)
            return
        with self._lock:
            self._hashes, self._stamp, self._missing_since = hashes, _file_version(stat), None
        log.info("loaded %d API keys from %s", len(hashes), self.path)

    def _reload_if_changed(self) -> None:
        now = self._clock()
        if now - self._checked < self._check_every_s:
            return
        self._checked = now
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._file_missing(now)
            return
        except OSError:
            return  # unreadable for now: keep the keys we have (a bad edit does too)
        self._missing_since = None
        if _file_version(stat) != self._stamp:
            self.reload()

    def _file_missing(self, now: float) -> None:
        """Keep the keys through a short gap (a file being replaced), then refuse every key."""
        if self._missing_since is None:
            self._missing_since = now
        if now - self._missing_since < self._missing_grace_s or self._stamp is None:
            return
        with self._lock:
            self._hashes, self._stamp = {}, None  # a file that comes back is loaded anew
        log.error("the API keys file %s is gone: every key is refused until it is back", self.path)


def _file_version(stat: os.stat_result) -> tuple[int, int, int]:
    """What tells a new version of the keys file: mtime, size and inode (a file replaced has a new one)."""
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


# -- quotas ----------------------------------------------------------------------------------------


MIN_REQUESTS_PER_MINUTE = 1e-4  # about one request a week


@dataclass(frozen=True)
class Quota:
    requests_per_minute: float = 0.0  # 0: unlimited
    burst: float | None = None  # requests a quiet caller may send at once (default: a minute's worth)
    max_concurrent: int = 0  # 0: unlimited

    def __post_init__(self) -> None:
        # Each would refuse every request: a negative rate drains the bucket for good, a request takes one
        # from a burst (so one under 1 admits none), and any count is >= a negative limit.
        if not self.requests_per_minute >= 0:  # nan too
            raise ValueError(f"requests_per_minute must be >= 0 (0: no limit), got {self.requests_per_minute}")
        if 0 < self.requests_per_minute < MIN_REQUESTS_PER_MINUTE:  # 1e-323 / 60 is 0 a second: a division by zero
            raise ValueError(
                f"requests_per_minute must be 0 (no limit) or at least {MIN_REQUESTS_PER_MINUTE:g} (one a week), "
                f"got {self.requests_per_minute:g}"
            )
        if self.burst is not None and not self.burst >= 1:
            raise ValueError(f"burst must be >= 1 (a request takes one), got {self.burst}")
        if self.max_concurrent < 0:
            raise ValueError(f"max_concurrent must be >= 0 (0: no limit), got {self.max_concurrent}")

    @property
    def limited(self) -> bool:
        return self.requests_per_minute > 0 or self.max_concurrent > 0


@dataclass
class _Usage:
    tokens: float
    updated: float
    in_flight: int = 0


class QuotaBook:
    """Per-caller token buckets and in-flight counts. Thread-safe."""

    def __init__(self, quota: Quota, clock: Callable[[], float] = time.monotonic) -> None:
        self.quota = quota
        self._rate_per_s = quota.requests_per_minute / 60.0
        self._burst = quota.burst if quota.burst is not None else max(quota.requests_per_minute, 1.0)
        self._clock = clock
        self._lock = threading.Lock()
        self._usage: dict[str, _Usage] = {}

    @contextmanager
    def admit(self, caller: str, requests: int = 1, counted_by: str = "n") -> Iterator[None]:
        """Hold `requests` of the caller's request slots for the duration (an HTTP request of n choices, or of a
        list of prompts, `counted_by` that field, is as many generations), or raise ResourceExhausted."""
        self._take(caller, requests, counted_by)
        try:
            yield
        finally:
            with self._lock:
                self._usage[caller].in_flight -= requests

    def _take(self, caller: str, requests: int, counted_by: str) -> None:
        q = self.quota
        with self._lock:
            now = self._clock()
            usage = self._usage.setdefault(caller, _Usage(self._burst, now))
            usage.tokens = min(self._burst, usage.tokens + (now - usage.updated) * self._rate_per_s)
            usage.updated = now
            # a request of more choices than the quota ever admits at once: the request's fault, not "retry later"
            # (a 429 had clients retry it for good); only an HTTP request of n choices counts as more than one
            fewer = "fewer choices" if counted_by == "n" else "fewer prompts"
            if q.max_concurrent and requests > q.max_concurrent:
                raise InvalidField(
                    counted_by,
                    f"counts as {requests} requests (one per choice); {caller!r} may have {q.max_concurrent} "
                    f"in flight: ask for {fewer}",
                )
            if q.requests_per_minute and requests > self._burst:
                raise InvalidField(
                    counted_by,
                    f"counts as {requests} requests (one per choice); {caller!r} may send {self._burst:g} at "
                    f"once: ask for {fewer}",
                )
            if q.max_concurrent and usage.in_flight + requests > q.max_concurrent:
                raise ResourceExhausted(f"{caller!r} already has {usage.in_flight} requests in flight (the limit)")
            if q.requests_per_minute and usage.tokens < requests:
                refill_s = (requests - usage.tokens) / self._rate_per_s
                raise ResourceExhausted(
                    f"{caller!r} is over its quota of {q.requests_per_minute:g} requests/minute", retry_after_s=refill_s
                )
            if q.requests_per_minute:
                usage.tokens -= requests
            usage.in_flight += requests


# -- interceptors ----------------------------------------------------------------------------------


Guard = Callable[[str, grpc.ServicerContext], AbstractContextManager[None]]


class _GuardInterceptor(grpc.ServerInterceptor):
    """Runs `guard(method, context)` around every handler (health and reflection exempt)."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(EXEMPT_METHOD_PREFIXES):
            return handler
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._stream(method, handler.unary_stream))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._unary(method, handler.stream_unary))
        # every kind is guarded: a client-streaming RPC added one day must not be served to anyone unchecked
        return handler._replace(stream_stream=self._stream(method, handler.stream_stream))

    def _unary(self, method: str, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            with self._guard(method, context):
                return fn(request, context)

        return wrapped

    def _stream(self, method: str, fn: Callable) -> Callable:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self._guard(method, context):
                yield from fn(request, context)

        return wrapped


class ApiKeyInterceptor(_GuardInterceptor):
    """Every call presents a known API key (`authorization: Bearer <key>`), else UNAUTHENTICATED."""

    def __init__(self, keys: ApiKeys) -> None:
        super().__init__(self._check)
        self._keys = keys

    def _check(self, method: str, context: grpc.ServicerContext) -> AbstractContextManager[None]:
        if self._keys.identify(bearer_token(context)) is None:
            raise Unauthenticated("this API needs a valid API key: send `authorization: Bearer <key>`")
        return nullcontext()


class PeerAllowlistInterceptor(_GuardInterceptor):
    """Calls to the methods under `method_prefix` need a client certificate naming an allowed role."""

    def __init__(self, allowed: frozenset[str] | set[str], method_prefix: str = "/") -> None:
        super().__init__(self._check)
        self._allowed = frozenset(allowed)
        self._prefix = method_prefix

    def _check(self, method: str, context: grpc.ServicerContext) -> AbstractContextManager[None]:
        if method.startswith(self._prefix):
            names = peer_names(context)
            if not names:
                raise Unauthenticated(f"{method} needs a client certificate (mutual TLS)")
            if not names & self._allowed:
                caller = peer_common_name(context) or sorted(names)[0]
                allowed = ", ".join(sorted(self._allowed))
                raise PermissionDenied(f"{caller!r} may not call {method} (allowed: {allowed})")
        return nullcontext()


class QuotaInterceptor(_GuardInterceptor):
    """Per-caller request quotas; the caller is named by `caller_identity` (anonymous: its address)."""

    def __init__(self, book: QuotaBook, keys: ApiKeys | None = None) -> None:
        super().__init__(self._admit)
        self._book = book
        self._keys = keys

    def _admit(self, method: str, context: grpc.ServicerContext) -> AbstractContextManager[None]:
        caller = caller_identity(context, self._keys) or anonymous_caller(peer_host(context.peer()))
        return self._book.admit(caller)
