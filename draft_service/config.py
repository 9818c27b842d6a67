"""Draft service configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from calispec_core.batch_scheduler import DEFAULT_GATHER_S
from calispec_core.credentials import COORDINATOR, TlsConfig
from calispec_core.limits import DEFAULT_PREFIX_CACHE_TOKENS, DEFAULT_RIDE_PREFILL_TOKENS, host_port
from calispec_core.modeling import ModelSpec
from calispec_core.sessions import DEFAULT_IDLE_TTL_S

DEFAULT_PROPOSAL_TOP_K = 256


@dataclass(frozen=True)
class DraftConfig:
    model: ModelSpec
    host: str = "127.0.0.1"
    port: int = 50052
    max_sessions: int = 256
    max_batch_size: int = 8  # sessions drafting in one forward pass (1 = no batching)
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS  # prompt KV kept for reuse by later prompts (0: off)
    batch_gather_s: float = DEFAULT_GATHER_S  # an idle batcher waits this long for the last batch to come back
    ride_prefill_tokens: int = DEFAULT_RIDE_PREFILL_TOKENS  # prompts up to this long prefill in their first batch
    # Structured output: proposals follow the request's grammar (calispec_core/constraints.py), its tokenizer view
    # built at start-up (~2 s, ~160 MB for a 150k vocabulary). False: such sessions draft freely.
    structured_output: bool = True
    # Sampling proposals draw from (and send) q truncated to its K most likely tokens, renormalised
    # (exact: the target verifies against the q that was sampled from); 0: the full q, sent dense.
    proposal_top_k: int = DEFAULT_PROPOSAL_TOP_K
    # Output layer pruned to ids [0, draft_vocab) plus the special tokens (calispec_core/vocab_pruning.py);
    # 0: the full layer. Moves acceptance only, never what `sd` emits.
    draft_vocab: int = 0
    session_idle_ttl_s: float = DEFAULT_IDLE_TTL_S  # an unused session is closed after this (0: never)
    max_workers: int = 16
    tls: TlsConfig = field(default_factory=TlsConfig)
    allowed_clients: tuple[str, ...] = (COORDINATOR,)  # certificate roles that may call it (under TLS)
    health_port: int | None = None
    measure_forward_costs: bool = True  # at start-up, for the coordinator's cost model
    metrics_port: int | None = None  # Prometheus /metrics; None: off, 0: a free port
    drain_timeout_s: float = 20.0  # on SIGTERM: how long open sessions get to finish
    stop_when_stdin_closes: bool = False  # a launcher holding stdin (calispec up) takes this service with it

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)
