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


def scrape(server, prefix: str = "") -> dict[tuple[str, frozenset], float]:
    """Triton's /metrics as {(name, frozenset of (label, value)): value}, only the names starting with ``prefix``."""
    import re
    import urllib.request

    with urllib.request.urlopen(
        f"http://{server.ports.host}:{server.ports.metrics}/metrics", timeout=30
    ) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if line.startswith("#") or not match or not match.group(1).startswith(prefix):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        out[(match.group(1), labels)] = float(match.group(3))
    return out
