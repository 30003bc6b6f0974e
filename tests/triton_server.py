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


def deploy_tiny_repo(tiny_pair: tuple[Path, Path], out: Path, harness: bool = False, **triton) -> Path:
    """The tiny pair (conftest) as a torch-runtime repository at ``out``, K <= 4, prompts <= 64 tokens;
    ``harness``: the orchestrator over torch engine models instead (values.plan_models); ``triton``: its
    triton section."""
    from trtspec.recipe import recipe_from_dict
    from trtspec.triton_repo.deploy import deploy

    target, draft = tiny_pair
    recipe = recipe_from_dict(
        {
            "name": "tiny",
            "target": {"model": str(target)},
            "draft": {"model": str(draft)},
            "speculative": {"max_draft_len": 4},
            "limits": {"max_input_len": 64, "max_seq_len": 128},
            "triton": triton,
        }
    )
    deploy(recipe, "torch", out, harness=harness)
    return out
