"""Coordinator configuration and the server-side defaults of every request."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calispec_core.access import Quota
from calispec_core.credentials import TlsConfig
from calispec_core.generation import Defaults
from calispec_core.limits import (
    DEFAULT_LOCKSTEP_PHASE,
    HTTP_MAX_CHOICES,
    MAX_PROMPT_CHARS,
    MAX_SPECULATIVE_TOKENS,
    TOOL_CALL_PARSERS,
    LockstepPhase,
    host_port,
    require_lockstep_phase,
)

# The largest HTTP request body the OpenAI-compatible API reads: a longest valid prompt at its longest JSON
# (12 bytes a character: an escaped surrogate pair, `\ud83d\ude00`, as json.dumps writes any character past
# U+FFFF), plus 1 MiB for the rest of a valid request (1024 chat messages' keys, 16 stop strings, the fields).
HTTP_MAX_BODY_BYTES = 12 * MAX_PROMPT_CHARS + 2**20
# The largest gRPC request the coordinator reads: a longest valid prompt (or chat) at 4 UTF-8 bytes a character,
# plus 1 MiB for the rest. gRPC refuses a larger one unread (RESOURCE_EXHAUSTED); at the services' 64 MiB a caller
# without an API key had the coordinator read and parse 64 MiB before the key was checked (16 at once: +525 MB).
GRPC_MAX_REQUEST_BYTES = 4 * MAX_PROMPT_CHARS + 2**20
# How long an HTTP connection may take to send a request's headers (its TLS handshake included), from its accept
# or its previous response's end; it is closed then. Before, one that never finished them stayed open for ever.
HTTP_HEADER_TIMEOUT_S = 10.0
# Past a request's deadline, before its call is cancelled (gRPC) or its stream let go (HTTP); a round ends it first,
# normally.
CANCEL_GRACE_S = 2.0
# HTTP choices generating at once (openai_generations.GenerationSlots); more wait in line for a slot. At least a
# request's most choices (HTTP_MAX_CHOICES), or such a request could never start.
HTTP_MAX_GENERATIONS = 64


@dataclass(frozen=True)
class CoordinatorConfig:
    draft_address: str
    target_addresses: tuple[str, ...]  # fixed replicas; empty when target_dns is set
    tokenizer: Path  # the target's tokenizer directory (usually the target model directory)
    host: str = "127.0.0.1"
    port: int = 50050
    max_workers: int = 32
    rpc_timeout_s: float = 60.0  # a request's deadline when its client set none
    connect_timeout_s: float = 60.0  # waiting for draft/target at start-up
    draft_timeout_s: float = 10.0  # a slower draft call counts as a draft outage: rounds run target-only
    draft_max_backoff_s: float = 10.0  # longest wait between probes of a draft that is down
    defaults: Defaults = field(default_factory=Defaults)
    target_dns: str | None = None  # HOST:PORT whose every address is a replica (headless Service)
    target_refresh_s: float = 10.0  # how often target_dns is re-resolved
    # Clients: TLS (server-side only; they authenticate with API keys) and mutual TLS to draft/target.
    tls: TlsConfig = field(default_factory=TlsConfig)
    api_keys_file: Path | None = None  # `NAME SHA256HEX` lines; None: no authentication (loopback only)
    allow_anonymous: bool = False  # serve without API keys on a non-loopback host (explicit opt-in)
    quota: Quota = field(default_factory=Quota)  # per API key (per address when anonymous)
    health_port: int | None = None
    http_port: int | None = None  # the OpenAI-compatible HTTP API on host:http_port (0: a free port); None: off
    served_model_name: str | None = None  # the `model` HTTP requests name; None: the tokenizer directory's name
    http_max_body_bytes: int = HTTP_MAX_BODY_BYTES  # larger HTTP request bodies are refused (413) before parsing
    http_allowed_origins: tuple[str, ...] = ()  # browser origins the HTTP API admits (CORS); empty: none
    http_header_timeout_s: float = HTTP_HEADER_TIMEOUT_S  # an HTTP request's deadline for its headers, then body
    http_max_generations: int = HTTP_MAX_GENERATIONS  # HTTP choices generating at once; more wait in line
    tool_call_parser: str | None = None  # how HTTP chat replies' tool calls are read (TOOL_CALL_PARSERS); None: none
    max_gamma: int = 10  # adaptive γ's upper bound (requests may fix γ up to MAX_SPECULATIVE_TOKENS)
    draft_min_confidence: float = 0.4  # adaptive γ: the draft's early stop (HF's assistant_confidence_threshold)
    draft_min_path_confidence: float | None = None  # adaptive γ: stop on a proposal's path probability (None: costs)
    draft_to_floor: bool = True  # adaptive γ: alone in a round, draft up to max_gamma and let the path floor stop it
    lockstep_wait_s: float = 0.5  # how long requests wait for each other to run rounds together (0: off)
    lockstep_phase: LockstepPhase = DEFAULT_LOCKSTEP_PHASE  # how a lockstep round's γ is chosen (round_plan.py)

    def __post_init__(self) -> None:
        # A request without a deadline of its own would time out at once; the DNS watcher would spin; adaptive γ
        # would never draft (0), or pick a γ the draft refuses (> MAX_SPECULATIVE_TOKENS): its request goes target-only.
        if not self.rpc_timeout_s > 0:  # nan too
            raise ValueError(f"rpc_timeout_s must be > 0, got {self.rpc_timeout_s}")
        if not self.target_refresh_s > 0:
            raise ValueError(f"target_refresh_s must be > 0, got {self.target_refresh_s}")
        if not 1 <= self.max_gamma <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"max_gamma must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.max_gamma}")
        for name in ("draft_min_confidence", "draft_min_path_confidence"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:  # nan too
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.http_max_body_bytes < 1:
            raise ValueError(f"http_max_body_bytes must be >= 1, got {self.http_max_body_bytes}")
        if not self.http_header_timeout_s > 0:
            raise ValueError(f"http_header_timeout_s must be > 0, got {self.http_header_timeout_s}")
        if self.http_max_generations < HTTP_MAX_CHOICES:
            raise ValueError(
                f"http_max_generations must be >= {HTTP_MAX_CHOICES} (a request's most choices), "
                f"got {self.http_max_generations}"
            )
        require_lockstep_phase(self.lockstep_phase)
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            choices = ", ".join(TOOL_CALL_PARSERS)
            raise ValueError(f"tool_call_parser must be one of {choices}, got {self.tool_call_parser!r}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.tokenizer.name

    metrics_port: int | None = None  # Prometheus /metrics; None: off, 0: a free port
    drain_timeout_s: float = 20.0  # on SIGTERM: how long running requests get to finish
    stop_when_stdin_closes: bool = False  # a launcher holding stdin (calispec up) takes this service with it

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)
