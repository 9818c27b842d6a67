"""Settings of the memory service; the CLI in `__main__` maps its flags onto these fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from calispec_core.credentials import DEFAULT_WRITER_IDENTITY, TARGET, TlsConfig
from calispec_core.limits import host_port
from memory_service.store import MAX_PAIRS_LIMIT, TableLimits


def default_db_path() -> Path:
    """Per-user data dir, so a bare `python -m memory_service` keeps its counts across restarts."""
    return Path(platformdirs.user_data_dir("calispec")) / "memory.db"


WORKERS_FOR_CALLS = 8  # workers Watch streams leave to the unary calls (RecordEvents, GetPairs, GetStats)


@dataclass(frozen=True)
class MemoryConfig:
    host: str = "127.0.0.1"
    port: int = 50053  # 0 lets the OS pick; create_server returns the bound port
    # A factory, not a constant: the data dir is resolved when a config is made, not at import.
    db_path: Path = field(default_factory=default_db_path)
    # GetPairs with max_pairs = 0 returns at most this many pairs.
    max_pairs_default: int = 65536
    # Each Watch stream holds a worker thread for its lifetime: size this above the verifier count.
    max_workers: int = 64
    # Watch streams open at once (None: all workers but WORKERS_FOR_CALLS, or half of them when fewer than
    # 2 * WORKERS_FOR_CALLS); more are refused, so that
    # readers can never take the workers the verifiers' writes need.
    max_watch_streams: int | None = None
    # Crash bound: a kill -9 loses at most the events acknowledged in the last flush interval.
    flush_interval_s: float = 0.5
    limits: TableLimits = field(default_factory=TableLimits)
    # No token at all: writes need none. Only with an explicit opt-in (--allow-unauthenticated-writes).
    writer_token: str | None = None  # one token shared by every verifier (identity "writer")
    writer_tokens: tuple[tuple[str, str], ...] = ()  # (identity, token): a rate limit per identity
    # (identity, namespace patterns): what that writer may write (fnmatch); a writer not listed: every namespace
    writer_scopes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    writer_events_per_s: float = 100_000.0  # per writer; 0 disables the limit
    writer_burst_events: float | None = None  # None: 10 s worth of the rate
    watch_heartbeat_s: float = 1.0
    # A Watch stream ends (OK) after this long, each one after a time drawn in [1, 2) x this so that verifiers'
    # reconnects spread out (as Kubernetes ends its watches); the verifier resumes from its version at once. A
    # client that stopped reading without closing its connection (SIGSTOP, a node gone) frees its slot by then.
    watch_max_age_s: float = 600.0
    tls: TlsConfig = field(default_factory=TlsConfig)
    allowed_writers: tuple[str, ...] = (TARGET,)  # certificate roles that may RecordEvents (under TLS)
    health_port: int | None = None
    metrics_port: int | None = None  # Prometheus /metrics; None: off, 0: a free port
    drain_timeout_s: float = 20.0  # on SIGTERM: NOT_SERVING first; in-flight writes still get SHUTDOWN_GRACE_S
    stop_when_stdin_closes: bool = False  # a launcher holding stdin (calispec up) takes this service with it

    def __post_init__(self) -> None:
        # Fail at startup, not on the first GetPairs that falls back to a bad default.
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not 1 <= self.max_pairs_default <= MAX_PAIRS_LIMIT:
            raise ValueError(f"max_pairs_default must be in [1, {MAX_PAIRS_LIMIT}], got {self.max_pairs_default}")
        if self.max_workers < 2:  # one: the first Watch stream took every worker (found by probing)
            raise ValueError(f"max_workers must be >= 2 (a Watch stream holds a worker), got {self.max_workers}")
        if self.max_watch_streams is not None and not 1 <= self.max_watch_streams < self.max_workers:
            raise ValueError(f"max_watch_streams must be in [1, max_workers), got {self.max_watch_streams}")
        if not 0 < self.flush_interval_s <= 60:
            raise ValueError(f"flush_interval_s must be in (0, 60], got {self.flush_interval_s}")
        if not self.writer_events_per_s >= 0:  # nan too: it slipped past `< 0`
            raise ValueError(f"writer_events_per_s must be >= 0, got {self.writer_events_per_s}")
        # A write costs at least one event: a smaller burst (also 10 s of a rate under 0.1/s) refuses every write.
        burst = self.writer_burst_events if self.writer_burst_events is not None else 10 * self.writer_events_per_s
        if self.writer_events_per_s > 0 and not burst >= 1:
            raise ValueError(f"the writer burst must be >= 1 event, got {burst:g}")
        if self.watch_heartbeat_s <= 0:
            raise ValueError(f"watch_heartbeat_s must be > 0, got {self.watch_heartbeat_s}")
        if not self.watch_max_age_s > 0:
            raise ValueError(f"watch_max_age_s must be > 0, got {self.watch_max_age_s}")

    def watch_stream_limit(self) -> int:
        if self.max_watch_streams is not None:
            return self.max_watch_streams
        return max(self.max_workers - WORKERS_FOR_CALLS, max(self.max_workers // 2, 1))

    def writer_identities(self) -> dict[str, str]:
        """identity -> token, from both fields."""
        shared = {DEFAULT_WRITER_IDENTITY: self.writer_token} if self.writer_token else {}
        return {**shared, **dict(self.writer_tokens)}

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)
