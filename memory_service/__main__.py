"""`python -m memory_service`: run the correction memory until SIGTERM or SIGINT.

Logging is configured here and only here; library modules just get their loggers.
"""

from __future__ import annotations

from calispec_core.interrupts import interrupt_exits_quietly

# Ctrl-C while the serving stack imports (seconds: torch too, through the shared metrics), before main() runs:
# exit 130, no traceback
with interrupt_exits_quietly():
    import argparse
    from collections.abc import Sequence
    from dataclasses import replace
    from pathlib import Path

    from calispec_core.credentials import read_writer_file
    from calispec_core.errors import CalispecError
    from calispec_core.limits import burst, int_at_least, non_negative_float, positive_int, seconds
    from calispec_core.limits import port as tcp_port
    from calispec_core.request_context import configure_logging
    from calispec_core.service_cli import (
        add_operations_args,
        add_tls_args,
        metrics_banner,
        serve_until_signalled,
        startup_step,
        stop_on_signals,
        tls_from_args,
    )
    from memory_service.config import MemoryConfig
    from memory_service.server import create_server
    from memory_service.store import TableLimits

# In-flight RecordEvents get this long to finish before they are cancelled. A cancelled one
# either was accepted (and is committed by the final flush) or changed nothing.
SHUTDOWN_GRACE_S = 5.0


def parse_args(argv: Sequence[str] | None = None) -> tuple[MemoryConfig, str]:
    defaults = MemoryConfig()
    parser = argparse.ArgumentParser(prog="python -m memory_service", description=__doc__)
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=tcp_port, default=defaults.port, help="0 picks a free port")
    parser.add_argument("--db", type=Path, default=defaults.db_path, help="SQLite file of the counts")
    parser.add_argument(
        "--max-workers",
        type=int_at_least(2, "(a Watch stream holds a worker: calls need another)"),
        default=defaults.max_workers,
    )
    parser.add_argument(
        "--max-watch-streams",
        type=positive_int,
        default=None,
        help="Watch streams open at once (default: max workers - 8, or half of them below 16 workers)",
    )
    parser.add_argument(
        "--watch-max-age",
        type=seconds,
        default=defaults.watch_max_age_s,
        help="seconds a Watch stream lasts at least (each ends by twice this; the verifier resumes at once); a "
        "client that stopped reading holds one at most 2.25 times this",
    )
    parser.add_argument("--max-pairs-default", type=positive_int, default=defaults.max_pairs_default)
    parser.add_argument(
        "--flush-interval",
        type=seconds,
        default=defaults.flush_interval_s,
        help="seconds between group commits; a kill -9 loses at most the events of the last interval",
    )
    parser.add_argument("--max-pairs", type=positive_int, default=defaults.limits.max_pairs, help="cap per namespace")
    parser.add_argument("--max-pairs-per-draft", type=positive_int, default=defaults.limits.max_pairs_per_draft)
    parser.add_argument(
        "--half-life", type=non_negative_float, default=0.0, help="count half-life in seconds (0: no decay)"
    )
    parser.add_argument(
        "--writer-token-file",
        type=Path,
        help="the verifiers' writer token, or lines of IDENTITY TOKEN [NAMESPACE ...] (a rate limit per identity; "
        "namespaces: the only ones that token may write, fnmatch patterns)",
    )
    parser.add_argument(
        "--allow-unauthenticated-writes",
        action="store_true",
        help="accept writes without a token (a test bench only: any client could then poison the table)",
    )
    parser.add_argument(
        "--writer-rate-limit",
        type=non_negative_float,
        default=defaults.writer_events_per_s,
        help="events/s per writer identity (0: no limit)",
    )
    parser.add_argument("--writer-burst", type=burst, default=None, help="events (default: 10 s of the rate)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    add_tls_args(parser)
    add_operations_args(parser)
    args = parser.parse_args(argv)
    if args.writer_token_file is None and not args.allow_unauthenticated_writes:
        parser.error("give --writer-token-file (or, for a test bench, --allow-unauthenticated-writes)")
    try:
        writers = read_writer_file(args.writer_token_file) if args.writer_token_file else ((), ())
        config = MemoryConfig(
            host=args.host,
            port=args.port,
            db_path=args.db,
            max_pairs_default=args.max_pairs_default,
            max_workers=args.max_workers,
            max_watch_streams=args.max_watch_streams,
            watch_max_age_s=args.watch_max_age,
            flush_interval_s=args.flush_interval,
            limits=TableLimits(args.max_pairs, args.max_pairs_per_draft, args.half_life),
            writer_tokens=writers[0],
            writer_scopes=writers[1],
            writer_events_per_s=args.writer_rate_limit,
            writer_burst_events=args.writer_burst,
            tls=tls_from_args(parser, args),
            health_port=args.health_port,
            metrics_port=args.metrics_port,
            drain_timeout_s=args.drain_timeout_s,
            stop_when_stdin_closes=args.stop_when_stdin_closes,
        )
    except (ValueError, CalispecError) as exc:
        parser.error(str(exc))
    return config, args.log_level


def main(argv: Sequence[str] | None = None) -> int:
    config, log_level = parse_args(argv)
    configure_logging(log_level)
    # before start, so an early SIGTERM still gets a clean shutdown
    stop = stop_on_signals(config.stop_when_stdin_closes)
    with startup_step("memory_service", "cannot start"):
        server, port, store = create_server(config)
    store.announce(replace(config, port=port).address)  # named to a second service refused this database
    metrics_banner("memory_service", server)
    # Stop serving first, then close the store: close() waits for a transaction in progress and commits
    # what the last flush interval accepted, so every acknowledged write is in the file. Watch streams
    # end before the stop (they would otherwise hold the whole grace period).
    serve_until_signalled(
        server,
        f"memory_service listening on {config.host}:{port} db={config.db_path}",
        on_stop=store.close,
        grace_s=SHUTDOWN_GRACE_S,
        drain_timeout_s=config.drain_timeout_s,  # NOT_SERVING at once; memory has no sessions to wait for
        stop=stop,
        before_stop=store.hub.close,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
