"""Reusable test helper: a real tritonserver on a repository, on free loopback ports, stopped cleanly.

with running_server(repo, tmp_path / "server.log") as server:
    server.ports.grpc_url, server.ports.http_url
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from trtspec.triton_repo.server import Ports, TritonServer, free_ports


@contextlib.contextmanager
def running_server(repo: Path, log_path: Path, timeout_s: float = 180.0):
    """Start tritonserver on ``repo`` (127.0.0.1, free ports), yield the TritonServer, always stop it."""
    http, grpc, metrics = free_ports(3)
    server = TritonServer(repo, Ports(http, grpc, metrics), log_path)
    server.start(timeout_s)
    try:
        yield server
    finally:
        server.stop()
