"""Target service configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calispec_core.batch_scheduler import DEFAULT_GATHER_S
from calispec_core.credentials import COORDINATOR, TlsConfig
from calispec_core.limits import DEFAULT_PREFIX_CACHE_TOKENS, DEFAULT_RIDE_PREFILL_TOKENS, host_port
from calispec_core.modeling import ModelSpec
from calispec_core.sessions import DEFAULT_IDLE_TTL_S


@dataclass(frozen=True)
class TargetConfig:
    model: ModelSpec
    host: str = "127.0.0.1"
    port: int = 50051
    max_sessions: int = 256
    session_idle_ttl_s: float = DEFAULT_IDLE_TTL_S  # an unused session is closed after this (0: never)
    max_workers: int = 16
    max_batch_size: int = 8  # sessions verified in one forward pass (1 = no batching)
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS  # prompt KV kept for reuse by later prompts (0: off)
    batch_gather_s: float = DEFAULT_GATHER_S  # an idle batcher waits this long for the last batch to come back
    ride_prefill_tokens: int = DEFAULT_RIDE_PREFILL_TOKENS  # prompts up to this long prefill in their first batch
    meaning_guard: bool = True  # CSD never rescues a changed numeral, operator or special token
    # Structured output (calispec_core/constraints.py): its tokenizer view is built at start-up (~2 s and ~160 MB for a
    # 150k vocabulary; built at the first such request it would hold the GIL ~1 s, stalling every session's rounds).
    # False: such requests are refused FAILED_PRECONDITION.
    structured_output: bool = True
    measure_forward_costs: bool = True  # at start-up, for the coordinator's cost model
    memory_address: str | None = None  # None: no shared memory, local online counts only
    memory_namespace: str = "default"
    memory_sync_interval_s: float = 1.0  # how often events are shipped and the table refreshed
    memory_writer_token_file: Path | None = None  # the verifiers' credential for RecordEvents
    tls: TlsConfig = field(default_factory=TlsConfig)  # served, and used to call the memory service
    allowed_clients: tuple[str, ...] = (COORDINATOR,)  # certificate roles that may call it (under TLS)
    health_port: int | None = None
    metrics_port: int | None = None  # Prometheus /metrics; None: off, 0: a free port
    drain_timeout_s: float = 20.0  # on SIGTERM: how long open sessions get to finish
    stop_when_stdin_closes: bool = False  # a launcher holding stdin (calispec up) takes this service with it

    def __post_init__(self) -> None:
        # The memory link's flusher waits this long between flushes: 0 or less would spin a core.
        if not self.memory_sync_interval_s > 0:  # also refuses nan
            raise ValueError(f"memory_sync_interval_s must be > 0, got {self.memory_sync_interval_s}")

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)
