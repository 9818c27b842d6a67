"""The coordinator's Prometheus metrics, in vLLM's vocabulary under the `calispec_` prefix.

Per round (the orchestrator's `on_round` hook): drafts, draft/accepted/rescued tokens,
acceptance by position, γ. Per request (the servicer, from the chunks it already streams):
requests by mode and status, tokens, time to first token, time per output token, end-to-end
latency, and the requests running now. Per HTTP response of the OpenAI API (its outermost middleware):
responses by route template, method and status, and their duration, under vLLM's names.
"""

from __future__ import annotations

from http import HTTPMethod
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from calispec_core.generation import GenerationStats, Mode
from calispec_core.limits import MAX_SPECULATIVE_TOKENS
from calispec_core.metrics import LATENCY_BUCKETS, PREFIX
from calispec_core.timing import now_ns
from coordinator.backends import Proposal, Verdict

if TYPE_CHECKING:  # the HTTP API's packages are imported only when it is on (coordinator/__main__.py)
    from prometheus_fastapi_instrumentator.metrics import Info

SPEC = f"{PREFIX}spec_decode_"
# a method is the client's word (h11 takes any token): others share one label value, or series are unbounded
HTTP_METHODS = frozenset(HTTPMethod.__members__)
OTHER_METHOD = "other"
NO_ROUTE = "none"  # the instrumentator's label for a path no route serves
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class CoordinatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        self.requests = Counter(
            f"{PREFIX}requests", "Generate requests finished, by mode and status", ["mode", "status"], registry=r
        )
        self.running = Gauge(f"{PREFIX}requests_running", "Generate requests in progress", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(
            f"{PREFIX}generation_tokens",
            "Tokens generated, by every request (also those of a failed or cancelled one, delivered or not)",
            registry=r,
        )
        self.rounds = Counter(
            f"{PREFIX}rounds", "Propose/verify rounds (ar: one target step each)", ["mode"], registry=r
        )
        self.drafts = Counter(f"{SPEC}num_drafts", "Rounds with a draft proposal", registry=r)
        self.draft_tokens = Counter(f"{SPEC}num_draft_tokens", "Draft tokens proposed and verified", registry=r)
        self.accepted = Counter(f"{SPEC}num_accepted_tokens", "Draft tokens accepted (rescued included)", registry=r)
        self.rescued = Counter(f"{SPEC}num_rescued_tokens", "Draft tokens accepted by a CSD rescue", registry=r)
        self.withheld = Counter(
            f"{SPEC}num_withheld_rescues", "Rejected draft tokens CSD would have rescued but the meaning guard refused",
            registry=r,
        )  # fmt: skip
        self.accepted_per_pos = Counter(
            f"{SPEC}num_accepted_tokens_per_pos",
            "Accepted draft tokens by position in the draft",
            ["position"],
            registry=r,
        )
        self.target_failures = Counter(
            f"{PREFIX}target_replica_failures",
            "Calls a target replica failed, by what they were: a request's session (it moved: a failover) or a "
            "placement (a new session; the request tried another replica)",
            ["kind"],
            registry=r,
        )
        for kind in ("session", "placement"):  # both series exist from the start (a rate() needs them)
            self.target_failures.labels(kind)
        self.gamma = Histogram(
            f"{SPEC}gamma", "Draft length γ chosen per round", buckets=range(1, MAX_SPECULATIVE_TOKENS + 1), registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}time_to_first_token_seconds",
            "Time to the first generated token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            f"{PREFIX}time_per_output_token_seconds",
            "Mean time per output token after the first, one observation per request",
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{PREFIX}e2e_request_latency_seconds", "Request latency, end to end", buckets=LATENCY_BUCKETS, registry=r
        )
        self.http = HttpMetrics(r)

    def observe_round(self, mode: Mode, proposal: Proposal | None, verdict: Verdict) -> None:
        """The orchestrator's per-round hook."""
        self.rounds.labels(mode.name.lower()).inc()
        if proposal is None:
            return
        self.drafts.inc()
        self.draft_tokens.inc(len(proposal.token_ids))
        self.accepted.inc(verdict.accepted_count)
        self.rescued.inc(len(verdict.rescued_positions))
        self.withheld.inc(verdict.withheld_rescues)
        self.gamma.observe(len(proposal.token_ids))
        for position in range(verdict.accepted_count):
            self.accepted_per_pos.labels(str(position)).inc()

    def track(self) -> RequestTimer:
        return RequestTimer(self)


class HttpMetrics:
    """Every response of the OpenAI HTTP API, as vLLM exposes them (prometheus-fastapi-instrumentator's names
    and labels, unprefixed, so that vLLM's dashboards work): by route template (`none`: no route), method and
    status code. Fed by the instrumentator's middleware (`observe`), which resolves the template."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "http_requests",
            "HTTP responses, by route template, method and status",
            ["handler", "method", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "HTTP request duration, from its arrival to the last byte of the response (streams included)",
            ["handler", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

        self._registry = registry
        self._slot_gauges: tuple[Gauge, Gauge] | None = None  # made by the HTTP API's first report: a coordinator
        # without one exports none (a gauge of 0 free slots would read as a full server)

    def slots_changed(self, free: int, waiting: int) -> None:
        if self._slot_gauges is None:
            self._slot_gauges = (
                Gauge(
                    f"{PREFIX}http_generation_slots_free",
                    "HTTP generation slots free (--http-max-generations: choices generating at once over HTTP)",
                    registry=self._registry,
                ),
                Gauge(
                    f"{PREFIX}http_choices_waiting",
                    "HTTP choices waiting in line for a generation slot",
                    registry=self._registry,
                ),
            )
        free_gauge, waiting_gauge = self._slot_gauges
        free_gauge.set(free)
        waiting_gauge.set(waiting)

    def observe(self, info: Info) -> None:
        method = info.method if info.method in HTTP_METHODS else OTHER_METHOD
        handler = info.modified_handler
        if handler not in route_templates(info.request.app):
            handler = NO_ROUTE  # the instrumentator names a path its router redirects (a trailing slash) by itself
        self.requests.labels(handler, method, info.modified_status).inc()
        self.duration.labels(handler, method).observe(info.modified_duration)


def route_templates(app: Any) -> set[str]:
    return {path for route in getattr(app, "routes", ()) if isinstance(path := getattr(route, "path", None), str)}


class RequestTimer:
    """One request's clock and token count, from the chunks the servicer streams."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self.mode = "unknown"  # until the request's parameters parse
        self.start_ns = now_ns()
        self.first_token_ns: int | None = None
        self.tokens = 0
        # the orchestrator's request and its stats so far (`follow`): what a request that ends early had done
        self.request_id: str | None = None
        self.live_stats: GenerationStats | None = None
        metrics.running.inc()

    def follow(self, request_id: str, stats: GenerationStats) -> None:
        self.request_id, self.live_stats = request_id, stats

    def tokens_out(self, count: int) -> None:
        if count and self.first_token_ns is None:
            self.first_token_ns = now_ns()
            self.metrics.ttft.observe(self.seconds(self.first_token_ns))
        self.tokens += count

    def seconds(self, until_ns: int | None = None) -> float:
        return ((until_ns or now_ns()) - self.start_ns) / 1e9

    def finish(self, status: str, stats: GenerationStats | None) -> float:
        """Record the outcome; returns the end-to-end latency in seconds."""
        m = self.metrics
        e2e = self.seconds()
        m.running.dec()
        m.requests.labels(self.mode, status).inc()
        m.generation_tokens.inc(self.tokens)
        m.e2e.observe(e2e)
        if stats is not None:
            m.prompt_tokens.inc(stats.prompt_tokens)
        if self.first_token_ns is not None and self.tokens > 1:
            m.tpot.observe((e2e - self.seconds(self.first_token_ns)) / (self.tokens - 1))
        return e2e
