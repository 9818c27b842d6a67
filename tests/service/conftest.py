"""In-process draft and target services, and coordinators over them, for the client-side tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from calispec_core.modeling import ModelRunner, ModelSpec, load_tokenizer
from coordinator.config import CoordinatorConfig
from coordinator.engine import Orchestrator
from coordinator.server import build_orchestrator
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair

# The tiny pair is a base model without a chat template; chat tests give its tokenizer this one.
TINY_CHAT_TEMPLATE = (  # tools and tool calls rendered as JSON, as Hermes templates write them (nothing without them)
    "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{{ m.tool_calls | tojson if m.tool_calls else '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target's tokenizer (same vocabulary, same fingerprint) with a chat template."""
    tokenizer = load_tokenizer(tiny_pair.target)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("chat-tokenizer")
    tokenizer.save_pretrained(out)
    return out


@dataclass(frozen=True)
class ModelServices:
    draft_address: str
    target_address: str


@pytest.fixture(scope="module")
def model_services(
    tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner
) -> Iterator[ModelServices]:
    draft, draft_port = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0), runner=draft_runner)
    target, target_port, runtime = create_target(
        TargetConfig(ModelSpec(tiny_pair.target), port=0), runner=target_runner
    )
    draft.start()
    target.start()
    yield ModelServices(f"127.0.0.1:{draft_port}", f"127.0.0.1:{target_port}")
    for server in (target, draft):
        server.stop(None)
    runtime.stop()


@dataclass(frozen=True)
class Coordinator:
    address: str
    orchestrator: Orchestrator
    config: CoordinatorConfig


def start_coordinator(services: ModelServices, tokenizer: Path) -> tuple[grpc.Server, Coordinator]:
    config = CoordinatorConfig(
        draft_address=services.draft_address,
        target_addresses=(services.target_address,),
        tokenizer=tokenizer,
        port=0,
    )
    orchestrator = build_orchestrator(config)
    server, port = create_coordinator(config, orchestrator)
    server.start()
    return server, Coordinator(f"127.0.0.1:{port}", orchestrator, config)


@pytest.fixture(scope="module")
def chat_coordinator(model_services: ModelServices, chat_tokenizer_dir: Path) -> Iterator[Coordinator]:
    server, coordinator = start_coordinator(model_services, chat_tokenizer_dir)
    yield coordinator
    server.stop(None)
