"""Binding a service's ports: a port already served is an error, never shared (gRPC's default SO_REUSEPORT)."""

from __future__ import annotations

import pytest

from calispec_core.grpc_server import create_grpc_server


def test_a_port_already_served_is_refused_not_shared() -> None:
    """With SO_REUSEPORT a second server bound the same port silently and took a share of its connections."""
    first, port, _ = create_grpc_server("127.0.0.1:0", [], [])
    first.start()
    try:
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):
            create_grpc_server(f"127.0.0.1:{port}", [], [])
    finally:
        first.stop(None)


def test_a_health_port_already_served_is_refused() -> None:
    first, port, _ = create_grpc_server("127.0.0.1:0", [], [])
    first.start()
    try:
        with pytest.raises(OSError, match=f"could not bind 127.0.0.1:{port}"):
            create_grpc_server("127.0.0.1:0", [], [], health_port=port)
    finally:
        first.stop(None)
