"""`python -m draft_service --model DIR [--port N]`: serve a draft model."""

from __future__ import annotations

from calispec_core.interrupts import interrupt_exits_quietly

# Ctrl-C while torch and the serving stack import (seconds), before main() runs: exit 130, no traceback
with interrupt_exits_quietly():
    import argparse

    from calispec_core.limits import non_negative_int
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
    from draft_service.config import DEFAULT_PROPOSAL_TOP_K, DraftConfig
    from draft_service.server import create_server


def parse_config(argv: list[str] | None = None) -> tuple[DraftConfig, str]:
    parser = argparse.ArgumentParser(prog="python -m draft_service", description=__doc__)
    add_server_args(parser, default_port=50052)
    add_model_args(parser)
    add_batching_args(parser, "drafting")
    parser.add_argument(
        "--proposal-top-k",
        type=non_negative_int,
        default=DEFAULT_PROPOSAL_TOP_K,
        help="sampling proposals draw from and send q's K most likely tokens, renormalised (exact); "
        "0: the full distribution, sent dense",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="keep only the output rows of token ids [0, K) plus the special tokens (a cheaper draft step; "
        "q is zero elsewhere, so sd stays exact); 0: the full output layer (default); docs/performance.md",
    )
    parser.add_argument(
        "--no-structured-output", dest="structured_output", action="store_false",
        help="draft freely for structured-output requests (the target still masks what it emits) and skip building "
        "the grammar engine's tokenizer at start-up (~2 s, ~160 MB for a 150k vocabulary)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.draft_vocab < 0:
        parser.error(f"--draft-vocab must be >= 0 (0: the full output layer), got {args.draft_vocab}")
    spec = model_spec(args)
    config = DraftConfig(
        model=spec,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        prefix_cache_tokens=args.prefix_cache_tokens,
        max_batch_size=args.max_batch_size,
        batch_gather_s=args.batch_gather_ms / 1000,
        ride_prefill_tokens=args.ride_prefill_tokens,
        proposal_top_k=args.proposal_top_k,
        draft_vocab=args.draft_vocab,
        structured_output=args.structured_output,
        tls=tls_from_args(parser, args),
        health_port=args.health_port,
        session_idle_ttl_s=args.session_idle_ttl_s,
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


def serve(config: DraftConfig) -> None:
    with startup_step("draft_service", f"cannot load the model in {config.model.path}"):
        runner = ModelRunner(config.model, output_vocab=config.draft_vocab)
    with startup_step("draft_service", "cannot start"):
        server, port = create_server(config, runner)
    metrics_banner("draft_service", server)
    banner = (
        f"draft_service listening on {config.host}:{port} model={config.model.path} dtype={runner.dtype_name} "
        f"fp32_linear={runner.fp32_linear or '-'} device={runner.device}"
    )
    if runner.logit_columns.kept is not None:
        banner += f" draft_vocab={runner.logit_columns.width}"
    serve_until_signalled(
        server,
        banner,
        drain_timeout_s=config.drain_timeout_s,
        stop_when_stdin_closes=config.stop_when_stdin_closes,
    )


if __name__ == "__main__":
    main()
