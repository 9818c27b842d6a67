"""Coordinator configuration and the server-side defaults of every request."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calispec.generation import Defaults


@dataclass(frozen=True)
class CoordinatorConfig:
    draft_address: str
    target_addresses: tuple[str, ...]
    tokenizer: Path  # the target's tokenizer directory (usually the target model directory)
    host: str = "127.0.0.1"
    port: int = 50050
    max_workers: int = 32
    rpc_timeout_s: float = 60.0  # per downstream call, when the client set no deadline
    connect_timeout_s: float = 60.0  # waiting for draft/target at start-up
    defaults: Defaults = field(default_factory=Defaults)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
