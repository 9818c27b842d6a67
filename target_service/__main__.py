"""`python -m target_service --model DIR [--memory-addr HOST:PORT]`: serve a target (verifier) model."""

from __future__ import annotations

from calispec_core.interrupts import interrupt_exits_quietly

# Ctrl-C while torch and the serving stack import (seconds), before main() runs: exit 130, no traceback
with interrupt_exits_quietly():
    import argparse
    from pathlib import Path

    from calispec_core.limits import grpc_address, namespace, seconds
    from calispec_core.modeling import ModelRunner
    from calispec_core.service_cli import (
        add_batching_args,
        add_model_args,
        add_server_args,
        configure_logging,
        metrics_banner,
        model_spec,
        serve_until_signalled,
        startup_step,
        tls_from_args,
    )
    from target_service.config import TargetConfig
    from target_service.server import create_server


def parse_config(argv: list[str] | None = None) -> tuple[TargetConfig, str]:
    parser = argparse.ArgumentParser(prog="python -m target_service", description=__doc__)
    add_server_args(parser, default_port=50051)
    add_model_args(parser)
    add_batching_args(parser, "verified")
    parser.add_argument(
        "--memory-addr", type=grpc_address, default=None, help="memory service HOST:PORT (omit: local counts only)"
    )
    parser.add_argument(
        "--memory-namespace", type=namespace, default="default", help="correction-memory namespace of this pair"
    )
    parser.add_argument(
        "--memory-sync-interval",
        type=seconds,
        default=1.0,
        help="seconds between shipping events and refreshing the pair table",
    )
    parser.add_argument(
        "--memory-writer-token-file",
        type=Path,
        default=None,
        help="file holding the writer token the memory service requires of verifiers",
    )
    parser.add_argument(
        "--no-meaning-guard", dest="meaning_guard", action="store_false",
        help="let CSD rescue pairs that change a numeral, an operator or a special token, as the paper does "
        "(target_service/meaning_guard.py)",
    )  # fmt: skip
    parser.add_argument(
        "--no-structured-output", dest="structured_output", action="store_false",
        help="serve no structured output (JSON schemas, regexes, choices, grammars: refused FAILED_PRECONDITION) and "
        "skip building the grammar engine's tokenizer at start-up (~2 s, ~160 MB for a 150k vocabulary)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    config = TargetConfig(
        model=model_spec(args),
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        prefix_cache_tokens=args.prefix_cache_tokens,
        session_idle_ttl_s=args.session_idle_ttl_s,
        max_batch_size=args.max_batch_size,
        batch_gather_s=args.batch_gather_ms / 1000,
        ride_prefill_tokens=args.ride_prefill_tokens,
        memory_address=args.memory_addr,
        memory_namespace=args.memory_namespace,
        memory_sync_interval_s=args.memory_sync_interval,
        memory_writer_token_file=args.memory_writer_token_file,
        meaning_guard=args.meaning_guard,
        structured_output=args.structured_output,
        tls=tls_from_args(parser, args),
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        drain_timeout_s=args.drain_timeout_s,
        stop_when_stdin_closes=args.stop_when_stdin_closes,
    )
    return config, args.log_level


def main(argv: list[str] | None = None) -> None:
    config, log_level = parse_config(argv)
    configure_logging(log_level)
    with interrupt_exits_quietly():  # Ctrl-C before the SIGINT handler is in: model load, cost measurement
        serve(config)


def serve(config: TargetConfig) -> None:
    with startup_step("target_service", f"cannot load the model in {config.model.path}"):
        runner = ModelRunner(config.model)
    with startup_step("target_service", "cannot start"):
        server, port, runtime = create_server(config, runner)
    metrics_banner("target_service", server)
    banner = (
        f"target_service listening on {config.host}:{port} model={config.model.path} dtype={runner.dtype_name} "
        f"fp32_linear={runner.fp32_linear or '-'} device={runner.device}"
    )
    serve_until_signalled(
        server,
        banner,
        runtime.stop,
        drain_timeout_s=config.drain_timeout_s,
        stop_when_stdin_closes=config.stop_when_stdin_closes,
    )


if __name__ == "__main__":
    main()
