"""Command-line plumbing shared by the services' `__main__` modules."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from calispec_core.credentials import TlsConfig
from calispec_core.errors import CalispecError
from calispec_core.sessions import DEFAULT_IDLE_TTL_S

# calispec_core.modeling.DTYPE_CHOICES (not imported: the memory service must not load torch)
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16", "int8"]

log = logging.getLogger(__name__)


def add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=default_port, help="port; 0 picks a free one")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_tls_args(parser)


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """Transport security: mutual TLS with these files, else plaintext (loopback, or --plaintext)."""
    group = parser.add_argument_group("transport security (docs/security.md)")
    group.add_argument("--tls-cert", type=Path, help="this service's certificate (PEM); also its client certificate")
    group.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    group.add_argument("--tls-ca", type=Path, help="CA bundle (PEM) that signs the certificates of its peers")
    group.add_argument(
        "--plaintext",
        action="store_true",
        help="serve plaintext on a non-loopback host (only behind a mesh that does TLS); loopback needs no flag",
    )
    group.add_argument(
        "--health-port", type=int, default=None, help="also serve grpc.health.v1 alone, plaintext, on this port"
    )


def tls_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TlsConfig:
    tls = TlsConfig(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, plaintext=args.plaintext)
    try:
        tls.check(args.host)
    except CalispecError as exc:
        parser.error(str(exc))
    return tls


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face-format model directory")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="auto: bf16 on CUDA or CPUs with bf16 units, else float32; int8: dynamic int8 Linear layers "
        "(CPU; an explicit opt-in: output is exact w.r.t. the int8 model served)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: all cores; in a pod: its CPU limit)"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--max-sessions", type=int, default=256, help="open sessions before RESOURCE_EXHAUSTED")
    parser.add_argument(
        "--session-idle-ttl-s",
        type=float,
        default=DEFAULT_IDLE_TTL_S,
        help="close a session unused for this many seconds (0: never; default: %(default)s)",
    )


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def serve_until_signalled(
    server: grpc.Server, banner: str, on_stop: Callable[[], None] | None = None, grace_s: float = 5.0
) -> None:
    """Start, print the banner (the readiness line scripts wait for), stop cleanly on SIGTERM/SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(banner, flush=True)
    stop.wait()
    log.info("shutting down")
    server.stop(grace_s).wait()
    if on_stop is not None:
        on_stop()


@contextmanager
def startup_step(service: str, what: str) -> Iterator[None]:
    """Exit 2 with one line on stderr, `service: what: cause`, if the block fails; no traceback.

    For the steps of starting a service whose failures are the operator's to fix (a bad model
    directory, an unreadable database, a port in use): `what` names the path or address. The
    traceback is still logged at DEBUG.
    """
    try:
        yield
    except Exception as exc:
        log.debug("%s: %s", service, what, exc_info=True)
        lines = str(exc).strip().splitlines()
        print(f"{service}: {what}: {lines[0] if lines else type(exc).__name__}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
