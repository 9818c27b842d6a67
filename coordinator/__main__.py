"""`python -m coordinator --draft-addr H:P --target-addr H:P --tokenizer DIR`: serve the public API.

Target replicas are either fixed (`--target-addr`, repeatable) or discovered by DNS
(`--target-dns`, every address of the name is a replica, re-resolved while serving).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from calispec_core.interrupts import interrupt_exits_quietly

if TYPE_CHECKING:
    from coordinator.engine import Orchestrator
    from coordinator.openai_api import HttpServer

# Ctrl-C while torch and the serving stack import (seconds), before main() runs: exit 130, no traceback
with interrupt_exits_quietly():
    import argparse
    import logging
    import signal
    from pathlib import Path

    from calispec_core.access import ApiKeys, Quota, QuotaBook
    from calispec_core.errors import CalispecError
    from calispec_core.generation import Defaults, Mode
    from calispec_core.limits import (
        DEFAULT_LOCKSTEP_PHASE,
        HTTP_MAX_CHOICES,
        LOCKSTEP_PHASES,
        TOOL_CALL_PARSERS,
        burst,
        dns_host_port,
        gamma,
        grpc_address,
        int_at_least,
        lambda_,
        max_new_tokens,
        non_negative_float,
        non_negative_int,
        port,
        positive_int,
        probability,
        probability_or_auto,
        seconds,
        seconds_or_zero,
        tau,
    )
    from calispec_core.metrics import new_registry
    from calispec_core.observability import ManagedServer
    from calispec_core.service_cli import (
        add_server_args,
        configure_logging,
        metrics_banner,
        serve_until_signalled,
        startup_step,
        tls_from_args,
    )
    from coordinator.config import HTTP_HEADER_TIMEOUT_S, HTTP_MAX_BODY_BYTES, HTTP_MAX_GENERATIONS, CoordinatorConfig
    from coordinator.metrics import CoordinatorMetrics
    from coordinator.server import build_orchestrator, check_access, create_server

log = logging.getLogger("coordinator")


def parse_config(argv: list[str] | None = None) -> tuple[CoordinatorConfig, str]:
    parser = argparse.ArgumentParser(prog="python -m coordinator", description=__doc__)
    add_server_args(parser, default_port=50050)
    parser.add_argument("--draft-addr", type=grpc_address, required=True, help="draft service HOST:PORT")
    targets = parser.add_mutually_exclusive_group(required=True)
    targets.add_argument(
        "--target-addr", type=grpc_address, action="append", help="target service HOST:PORT; repeat for replicas"
    )
    targets.add_argument(
        "--target-dns",
        type=dns_host_port,
        help="HOST:PORT whose every DNS address is a target replica, re-resolved while serving "
        "(e.g. a Kubernetes headless Service)",
    )
    parser.add_argument("--target-refresh", type=seconds, default=10.0, help="seconds between --target-dns lookups")
    parser.add_argument("--tokenizer", required=True, help="the target's tokenizer directory")
    parser.add_argument("--default-mode", default="csd", choices=[m.name.lower() for m in Mode])
    parser.add_argument("--default-max-new-tokens", type=max_new_tokens, default=Defaults.max_new_tokens)
    parser.add_argument(
        "--default-gamma",
        type=gamma,
        default=None,
        help="fixed γ for requests that set none (default: adaptive); a fixed γ makes csd requests wait for the next "
        "round start instead of riding the current one (their text then follows no other request's rounds)",
    )
    parser.add_argument("--max-gamma", type=gamma, default=10, help="adaptive γ's upper bound")
    parser.add_argument(
        "--default-tau",
        type=tau,  # checked as the target's float32 gets it too: 1e-46 arrives as 0 and fails every request
        default=Defaults.tau,
        help="CSD gate threshold τ for requests that set none",
    )
    parser.add_argument(
        "--default-lambda",
        type=lambda_,
        default=Defaults.lambda_,
        help="CSD count threshold λ for requests that set none",
    )
    parser.add_argument(
        "--draft-min-confidence",
        type=probability,
        default=0.4,
        help="adaptive γ: the draft stops a proposal after a token it gives less probability (0: off)",
    )
    parser.add_argument(
        "--draft-min-path-confidence",
        type=probability_or_auto,
        default=None,
        help="adaptive γ: the draft stops a proposal once the product of its tokens' probabilities is below this "
        "(auto, the default: from the measured costs and the request's acceptance each round; 0: off)",
    )
    parser.add_argument(
        "--draft-to-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="adaptive γ: a request alone in its lockstep round that drafts at all drafts up to --max-gamma and "
        "lets the path floor stop its proposal (default; with --lockstep-wait 0 or no path floor it drafts its "
        "policy's γ); --no-draft-to-floor: it drafts its policy's γ (docs/performance.md, 'A lone proposal drafts "
        "to its floor')",
    )
    parser.add_argument(
        "--lockstep-wait",
        type=seconds_or_zero,
        default=0.5,
        help="seconds a request waits for the others so that their rounds draft and verify together "
        "(docs/performance.md, lockstep rounds; 0: off)",
    )
    parser.add_argument(
        "--lockstep-phase",
        choices=LOCKSTEP_PHASES,
        default=DEFAULT_LOCKSTEP_PHASE,
        help=f"how a lockstep round's members get their γ (default: {DEFAULT_LOCKSTEP_PHASE}): group, one draft "
        "phase length for the members that draft, chosen with them for the whole round by the cost model (the most "
        "expected tokens per ms over all members; the others sit it out; no early stops while several draft); median, "
        "each member's own choice capped at the drafting members' lower median wish (wave 6's rule); shared, every "
        "adaptive member drafts that cap's length (docs/performance.md, 'Concurrency 8: the group phase by default')",
    )
    parser.add_argument(
        "--connect-timeout", type=seconds, default=60.0, help="seconds to wait for draft and target at start-up"
    )
    parser.add_argument(
        "--rpc-timeout",
        type=seconds,
        default=60.0,
        help="seconds a request may take when its client set no deadline",
    )
    parser.add_argument(
        "--draft-timeout",
        type=seconds,
        default=10.0,
        help="seconds after which a draft call counts as an outage",
    )
    parser.add_argument(
        "--draft-max-backoff",
        type=seconds_or_zero,
        default=10.0,
        help="longest wait between probes of a draft that is down",
    )
    add_access_args(parser)
    http = parser.add_argument_group("OpenAI-compatible HTTP API (docs/api.md; off unless --http-port is given)")
    http.add_argument("--http-port", type=port, default=None, help="serve /v1/* on --host:PORT; 0 picks a free one")
    http.add_argument("--served-model-name", help="the `model` HTTP requests name (default: the tokenizer dir's name)")
    http.add_argument(
        "--http-max-body-bytes",
        type=positive_int,
        default=HTTP_MAX_BODY_BYTES,
        help="larger request bodies are refused (413) unread; the default fits the longest valid prompt",
    )
    http.add_argument(
        "--http-allowed-origins",
        type=lambda text: tuple(o.strip() for o in text.split(",") if o.strip()),
        default=(),
        help="comma-separated browser origins allowed by CORS (e.g. http://localhost:3000; * for any); default: none",
    )
    http.add_argument(
        "--http-header-timeout",
        type=seconds,
        default=HTTP_HEADER_TIMEOUT_S,
        help="seconds a connection gets to send a request's headers (TLS handshake included; then it is closed), and"
        " then its body (plus a second per 16 KiB received; then 408)",
    )
    http.add_argument(
        "--http-max-generations",
        type=int_at_least(HTTP_MAX_CHOICES),
        default=HTTP_MAX_GENERATIONS,
        help="choices generating at once over HTTP; more wait in line for a slot (at least a request's most choices)",
    )
    http.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default=None,
        help="let the model call a chat request's tools over HTTP, its replies parsed for calls (vLLM's "
        "--enable-auto-tool-choice --tool-call-parser in one flag): hermes reads the <tool_call> blocks Qwen2.5's "
        "templates ask for (default: off; tools then only with tool_choice none)",
    )
    args = parser.parse_args(argv)
    defaults = Defaults(
        max_new_tokens=args.default_max_new_tokens,
        num_speculative_tokens=args.default_gamma,
        mode=Mode.parse(args.default_mode),
        tau=args.default_tau,
        lambda_=args.default_lambda,
    )
    config = CoordinatorConfig(
        draft_address=args.draft_addr,
        target_addresses=tuple(args.target_addr or ()),
        target_dns=args.target_dns,
        target_refresh_s=args.target_refresh,
        tokenizer=Path(args.tokenizer),
        host=args.host,
        port=args.port,
        connect_timeout_s=args.connect_timeout,
        rpc_timeout_s=args.rpc_timeout,
        draft_timeout_s=args.draft_timeout,
        draft_max_backoff_s=args.draft_max_backoff,
        defaults=defaults,
        tls=tls_from_args(parser, args),
        api_keys_file=args.api_keys_file,
        allow_anonymous=args.allow_anonymous,
        quota=Quota(args.quota_rpm, args.quota_burst, args.quota_concurrent),
        health_port=args.health_port,
        http_port=args.http_port,
        served_model_name=args.served_model_name,
        http_max_body_bytes=args.http_max_body_bytes,
        http_allowed_origins=args.http_allowed_origins,
        http_header_timeout_s=args.http_header_timeout,
        http_max_generations=args.http_max_generations,
        tool_call_parser=args.tool_call_parser,
        max_gamma=args.max_gamma,
        draft_min_confidence=args.draft_min_confidence,
        draft_min_path_confidence=args.draft_min_path_confidence,
        draft_to_floor=args.draft_to_floor,
        lockstep_wait_s=args.lockstep_wait,
        lockstep_phase=args.lockstep_phase,
        metrics_port=args.metrics_port,
        drain_timeout_s=args.drain_timeout_s,
        stop_when_stdin_closes=args.stop_when_stdin_closes,
    )
    try:
        check_access(config)
    except CalispecError as exc:
        parser.error(str(exc))
    return config, args.log_level


def add_access_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("client access (docs/security.md)")
    group.add_argument(
        "--api-keys-file",
        type=Path,
        help="`NAME SHA256HEX` lines (calispec keys add); reloaded when it changes and on SIGHUP",
    )
    group.add_argument(
        "--allow-anonymous", action="store_true", help="serve a non-loopback host without API keys (explicit)"
    )
    group.add_argument(
        "--quota-rpm", type=non_negative_float, default=0.0, help="requests per minute per API key (0: no limit)"
    )
    group.add_argument("--quota-burst", type=burst, default=None, help="requests at once (default: a minute's worth)")
    group.add_argument(
        "--quota-concurrent", type=non_negative_int, default=0, help="requests in flight per API key (0: no limit)"
    )


def main(argv: list[str] | None = None) -> None:
    from calispec_core.malloc_thresholds import fix_malloc_thresholds

    fix_malloc_thresholds()  # before the tokenizer and the servers allocate: the threads' arenas give memory back
    config, log_level = parse_config(argv)
    configure_logging(log_level)
    with interrupt_exits_quietly():  # start-up waits up to --connect-timeout for the model services
        server, banner, http, orchestrator = start(config)

        def on_stop() -> None:
            if http is not None:
                http.stop()
            orchestrator.close_running_sessions()  # the requests the drain timed out on: nobody else closes them

        serve_until_signalled(
            server,
            banner,
            on_stop=on_stop,
            drain_timeout_s=config.drain_timeout_s,
            stop_when_stdin_closes=config.stop_when_stdin_closes,
            before_stop=http.begin_stop if http else None,  # its grace beside the gRPC server's, not after it
        )


def on_hangup(keys: ApiKeys | None) -> None:
    """SIGHUP reloads the API keys. Always handled: a coordinator without a keys file died of it (a fleet-wide
    "HUP to reload" cut its requests), and an exception here would end the main thread (found by probing)."""
    if keys is None:
        log.info("SIGHUP: no --api-keys-file to reload")
        return
    try:
        keys.reload()
    except Exception:
        log.exception("SIGHUP: reloading the API keys failed; the previous keys stay in force")


def start(config: CoordinatorConfig) -> tuple[ManagedServer, str, HttpServer | None, Orchestrator]:
    """Connect, bind, start the HTTP API if asked: (server, banner, the HTTP API's server, the orchestrator); exit 2
    on failure."""
    with startup_step("coordinator", "cannot start"):
        keys = ApiKeys(config.api_keys_file) if config.api_keys_file else None
        signal.signal(signal.SIGHUP, lambda *_: on_hangup(keys))
        quotas = QuotaBook(config.quota) if config.quota.limited else None  # one book for both APIs
        orchestrator = build_orchestrator(config)
        metrics = CoordinatorMetrics(new_registry())  # one set for both APIs, served on --metrics-port
        server, bound = create_server(config, orchestrator, keys=keys, quotas=quotas, metrics=metrics)
    banner = f"coordinator listening on {config.host}:{bound}"
    http = None
    if config.http_port is not None:
        from coordinator.openai_api import serve_http  # FastAPI and uvicorn only when the HTTP API is on

        with startup_step("coordinator", f"cannot serve HTTP on {config.host}:{config.http_port}"):
            http = serve_http(orchestrator, config, keys, quotas, metrics, server.gate)  # counted in the drain
        scheme = "https" if config.tls.enabled else "http"
        banner += f" (OpenAI-compatible API at {scheme}://{config.host}:{http.port}/v1)"
    metrics_banner("coordinator", server)
    return server, banner, http, orchestrator


if __name__ == "__main__":
    main()
