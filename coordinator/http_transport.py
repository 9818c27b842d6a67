"""The HTTP API's connections: uvicorn's h11 protocol with what a port open to anyone needs and uvicorn lacks.

- **A deadline for request headers.** uvicorn's h11 protocol arms no timer before a connection's first request,
  and none once a request's bytes start to arrive after a response: a client that sends its headers a byte at a
  time, or nothing, held a connection (a file descriptor) forever. Here a request's headers must be complete
  within `header_timeout_s` of the connection's accept (its TLS handshake included: the loop below bounds it,
  where asyncio's default is 60 s) or of the previous response's end; the connection is closed otherwise.
- **One quiet refusal of a malformed request.** uvicorn answered h11's parse errors (a malformed chunk, a bad
  header) with its own 400, logged a warning for each, and left the app running: the app's answer, a 401
  for instance, then broke h11's state and was logged twice with a traceback. Here the refusal is a 400 (h11's
  status hint: 431 for oversized headers, 501 for an unknown transfer coding) in OpenAI's error shape, one
  debug line, the connection closed, and the app's answer, if any, dropped (it sees a disconnect).
- **A deadline for a request's body.** Nothing bounded it: a caller with a key could send a body a byte at a
  time and hold its connection for as long as it kept sending. As Apache's mod_reqtimeout (`body=20,MinRate=500`)
  does, the body must be in within `header_timeout_s` of its headers, plus a second for every `MIN_BODY_RATE`
  bytes received: a client at that rate or faster never meets it; one that stalls or trickles is answered 408.
  While uvicorn's flow control has paused reading (the app has not taken 64 KiB of body yet), the wait starts anew.
- **A bound on request headers however they arrive.** h11 bounds only a request it is still waiting for the end
  of (`max_incomplete_event_size`, 16 KiB): headers of 100 KB that arrived in one read were taken whole. Here a
  request whose head is over the bound is refused (431) once parsed, too.
- **No request with two framings.** One with both `Content-Length` and `Transfer-Encoding` (h11 frames it by
  the chunks) is refused the same way, before the app sees it, so that a proxy in front that frames it by
  `Content-Length` cannot smuggle a second request in its body (RFC 9112 §6.3: reject, then close).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from coordinator.openai_protocol import ErrorBody, ErrorResponse

log = logging.getLogger(__name__)

REASON_CHARS = 200  # h11's reasons quote the client's bytes: at most this much goes to the client and the log
# OpenAI `code` by status; others: invalid_argument
STATUS_CODES = {408: "deadline_exceeded", 431: "resource_exhausted", 501: "unimplemented"}
DEFAULT_MAX_HEADER_BYTES = 16 * 1024  # h11's default bound on an incomplete event, and ours on a request's head
LINGER_S = 2.0  # how long a refused connection reads and drops what its client still sends, after the answer
MIN_BODY_RATE = 16 * 1024  # bytes/s: each such many bytes of a request's body give it a second more (128 kbit/s)


class RequestReading(Protocol):
    """What a connection is told of the request it reads (GuardedH11Protocol's deadlines follow it)."""

    def headers_in(self) -> None: ...
    def body_bytes_in(self, count: int) -> None: ...
    def request_read(self) -> None: ...


class GuardedConnection(h11.Connection):
    """h11's server side that hands its refusals to `refuse(status, message)` instead of raising them into
    uvicorn, refuses requests with two framings, and tells `reading` how much of a request it has read: its
    headers, then each piece of its body, then its end."""

    def __init__(
        self, refuse: Callable[[int, str], None], reading: RequestReading, max_header_bytes: int | None
    ) -> None:
        self.max_header_bytes = max_header_bytes or DEFAULT_MAX_HEADER_BYTES
        super().__init__(h11.SERVER, self.max_header_bytes)
        self._refuse = refuse
        self._reading = reading
        self._refused = False
        self.request_method: bytes | None = None  # of the request being read; None before its request line

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.request_method = None

    def next_event(self) -> Any:
        if self._refused:  # the connection is closing: nothing more is read from it
            return h11.NEED_DATA
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            return self._refusal(exc.error_status_hint, str(exc))
        if isinstance(event, h11.Data):
            self._reading.body_bytes_in(len(event.data))
        elif isinstance(event, h11.EndOfMessage):
            self._reading.request_read()
        elif isinstance(event, h11.Request):
            self.request_method = event.method
            if has_two_framings(event):
                return self._refusal(400, "a request may not have both Content-Length and Transfer-Encoding")
            if (size := head_bytes(event)) > self.max_header_bytes:
                return self._refusal(431, f"request headers of {size} bytes; at most {self.max_header_bytes}")
            self._reading.headers_in()
        return event

    def _refusal(self, status: int, reason: str) -> Any:
        self._refused = True
        self._refuse(status, f"malformed HTTP request: {reason[:REASON_CHARS]}")
        return h11.NEED_DATA  # uvicorn stops reading events


def has_two_framings(request: h11.Request) -> bool:
    names = {name for name, _ in request.headers}  # h11 lower-cases them
    return b"content-length" in names and b"transfer-encoding" in names


def head_bytes(request: h11.Request) -> int:
    """The size of a request's head as sent with single spaces (h11 strips optional whitespace): its request line,
    header lines and the blank line that ends them, as h11 counts an incomplete one."""
    line = len(request.method) + len(request.target) + len(request.http_version) + 9  # "M T HTTP/v\r\n"
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2  # "n: v\r\n", "\r\n"


def refusal_bytes(conn: GuardedConnection, status: int, message: str) -> bytes:
    """A whole response refusing the request, in OpenAI's error shape (its length only, to a HEAD request),
    that closes the connection."""
    code = STATUS_CODES.get(status, "invalid_argument")
    error = ErrorBody(message=message, type="invalid_request_error", code=code)
    body = ErrorResponse(error=error).model_dump_json().encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    response = h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status])
    events = [response] if conn.request_method == b"HEAD" else [response, h11.Data(data=body)]
    return b"".join(conn.send(event) or b"" for event in [*events, h11.EndOfMessage()])


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines for a request's headers and body, and quiet refusals (the module's
    docstring). One timer at a time: the headers' from the accept or the previous response's end, then the body's
    from the headers to the request's end."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.header_deadline = self.loop.time() + header_timeout_s  # made at the accept, before any TLS handshake
        self.body_deadline = 0.0  # the request's being read: moved on by each piece of its body
        self.read_timer: asyncio.TimerHandle | None = None
        self.timing_body = False  # the timer armed is the body's (else the headers', or none)
        self.lingering = False  # refused: reading and dropping what the client still sends (close_lingering)
        self.linger_timer: asyncio.TimerHandle | None = None
        max_header_bytes = self.config.h11_max_incomplete_event_size  # None: h11's default, as uvicorn takes it
        self.conn = GuardedConnection(self.refuse, self, max_header_bytes)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.arm_read_timer(self.header_deadline, self.headers_overdue)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm_read_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():  # armed first: a pipelined request parsed by super() disarms it
            self.arm_read_timer(self.loop.time() + self.header_timeout_s, self.headers_overdue)
        super().on_response_complete()

    def headers_in(self) -> None:
        self.body_deadline = self.loop.time() + self.header_timeout_s
        self.arm_read_timer(self.body_deadline, self.body_overdue)

    def body_bytes_in(self, count: int) -> None:
        self.body_deadline += count / MIN_BODY_RATE  # the timer, when it fires, waits on to here

    def request_read(self) -> None:
        """The body's end: its timer goes, but not the next request's header timer, armed where the app answered
        before the body was read (a 401): that left the connection with no timer at all (found by review)."""
        if self.timing_body:
            self.disarm_read_timer()

    def arm_read_timer(self, deadline: float, overdue: Callable[[], None]) -> None:
        self.disarm_read_timer()
        self.read_timer = self.loop.call_at(deadline, overdue)
        self.timing_body = overdue == self.body_overdue

    def disarm_read_timer(self) -> None:
        self.timing_body = False
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def headers_overdue(self) -> None:
        self.read_timer = None
        if not self.transport.is_closing():
            log.debug("%s: no request headers within %s s; connection closed", self.peer(), self.header_timeout_s)
            self.transport.close()

    def body_overdue(self) -> None:
        self.read_timer, self.timing_body = None, False
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # uvicorn stopped reading until the app takes what it holds: the app is late, not
            self.body_deadline = self.loop.time() + self.header_timeout_s  # the client (a fresh wait from here)
        if self.loop.time() < self.body_deadline:
            self.arm_read_timer(self.body_deadline, self.body_overdue)
            return
        allowed = f"{self.header_timeout_s:g} s and a second per {MIN_BODY_RATE} bytes received"
        self.refuse(408, f"the request's body did not arrive in time ({allowed})")

    def refuse(self, status: int, message: str) -> None:
        """Answer a request that cannot be read (unless a response is already under way) and close the connection.
        The app, if it runs this request, sees a disconnect: its own answer would break the framing."""
        log.debug("%s: refused an HTTP request (%d): %s", self.peer(), status, message)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(refusal_bytes(self.conn, status, message))
        self.close_lingering()

    def close_lingering(self) -> None:
        """End the connection after a refusal: the answer and a FIN now, then what the client still sends is read and
        dropped for LINGER_S (RFC 9112 §9.6): closed with its bytes unread, the kernel reset the connection, and the
        client could lose the answer before reading it (a body refused 408 while its client still sent it)."""
        self.disarm_read_timer()
        if not self.transport.can_write_eof():  # TLS cannot half-close
            self.transport.close()
            return
        self.lingering = True
        self.flow.resume_reading()  # paused for a body the app had not taken: the client's bytes must drain
        self.transport.write_eof()
        self.linger_timer = self.loop.call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)

    def peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "unknown peer"


class HandshakeBoundLoop(asyncio.SelectorEventLoop):
    """asyncio's loop whose TLS servers give a handshake `handshake_timeout_s` (uvicorn passes no timeout)."""

    def __init__(self, handshake_timeout_s: float) -> None:
        super().__init__()
        self.handshake_timeout_s = handshake_timeout_s

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:  # type: ignore[override]
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self.handshake_timeout_s)
        return await super().create_server(*args, **kwargs)


def guarded_protocol(header_timeout_s: float) -> Callable[..., GuardedH11Protocol]:
    """uvicorn's `http` protocol factory (it takes any callable)."""
    return partial(GuardedH11Protocol, header_timeout_s=header_timeout_s)


def serve(server: uvicorn.Server, sock: socket.socket, header_timeout_s: float) -> None:
    """Run `server` on `sock` until it exits (as `Server.run`, on a loop that bounds TLS handshakes)."""
    with asyncio.Runner(loop_factory=partial(HandshakeBoundLoop, header_timeout_s)) as runner:
        runner.run(server.serve(sockets=[sock]))
