"""`python -m memory_service`: run the correction memory until SIGTERM or SIGINT.

Logging is configured here and only here; library modules just get their loggers.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from memory_service.config import MemoryConfig
from memory_service.server import create_server

log = logging.getLogger("memory_service")

# In-flight RecordEvents get this long to finish before they are cancelled. A cancelled one
# either committed or changed nothing: each request is one transaction.
SHUTDOWN_GRACE_S = 5.0


def parse_args(argv: Sequence[str] | None = None) -> tuple[MemoryConfig, str]:
    defaults = MemoryConfig()
    parser = argparse.ArgumentParser(prog="python -m memory_service", description=__doc__)
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port")
    parser.add_argument("--db", type=Path, default=defaults.db_path, help="SQLite file of the counts")
    parser.add_argument("--max-workers", type=int, default=defaults.max_workers)
    parser.add_argument("--max-pairs-default", type=int, default=defaults.max_pairs_default)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    args = parser.parse_args(argv)
    try:
        config = MemoryConfig(
            host=args.host,
            port=args.port,
            db_path=args.db,
            max_pairs_default=args.max_pairs_default,
            max_workers=args.max_workers,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return config, args.log_level


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so shutdown runs on the main thread, not in a handler."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def main(argv: Sequence[str] | None = None) -> int:
    config, log_level = parse_args(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = _stop_on_signals()  # before start, so an early SIGTERM still gets a clean shutdown
    server, port, store = create_server(config)
    server.start()
    print(f"memory_service listening on {config.host}:{port} db={config.db_path}", flush=True)
    stop.wait()
    # Stop serving first, then close the store: close() waits for a transaction in progress,
    # so every acknowledged write is committed before the file is closed.
    server.stop(SHUTDOWN_GRACE_S).wait()
    store.close()
    log.info("memory_service stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
