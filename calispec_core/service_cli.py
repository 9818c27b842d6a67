"""Command-line plumbing shared by the services' `__main__` modules."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable

import grpc

log = logging.getLogger(__name__)


def add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=default_port, help="port; 0 picks a free one")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face-format model directory")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bf16 on CUDA or CPUs with bf16 units, else float32",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--max-sessions", type=int, default=256, help="open sessions before RESOURCE_EXHAUSTED")


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
