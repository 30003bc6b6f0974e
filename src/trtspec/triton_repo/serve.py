"""``trtspec serve REPO``: run tritonserver on a trtspec repository until Ctrl-C.

Ports come from the repository's trtspec.json (the recipe's triton section), overridden by options; the server
binds 127.0.0.1 unless told otherwise. How the server starts comes from trtspec.json's ``launch`` layout
(values.launch_layout): one process (torch runtime), or under the NGC image's mpirun with upstream
launch_triton_server.py's ranks and environment (the tensorrtllm runtime's --multi-model, fast logits, the LLM-API
runtime). Either way serve waits until every model is ready, prints the endpoints and sample requests, and stops
the whole session on Ctrl-C. While it serves it watches the server (server.HealthWatch): when tritonserver exits,
a model's python stub dies or a model stops answering ready, serve stops the server, so that the requests in
flight get an error instead of waiting forever, and exits non-zero with one line naming the model, so that a
supervisor (compose's restart policy, Kubernetes) starts it again (docs/faults.md).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from trtspec.core.errors import ServerError
from trtspec.core.interrupts import stop_or_hold
from trtspec.recipe import TritonSpec, host_problem, port_problem
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.deploy import MANIFEST
from trtspec.triton_repo.server import (
    EXIT_TIMEOUT_S,
    HEALTH_POLL_S,
    HealthWatch,
    Ports,
    TritonServer,
    find_server,
    repo_models,
    returncode,
)

LOAD_TIMEOUT_S = 300.0
# TensorRT-LLM engines (and the LLM API's weight loading, autotuning and CUDA-graph capture) can take far longer
# than the python models; the docker healthcheck's start period is an hour too.
MPI_LOAD_TIMEOUT_S = 3600.0
# A broken server cannot finish the requests of its broken model, and tritonserver waits out its exit timeout for
# them: a short grace, so that their clients get an error within seconds.
BROKEN_STOP_GRACE_S = 2.0
SINGLE = {"mode": "single", "mpi": False, "world_size": 1, "env": {}, "rank_models": [], "gpus": []}


@dataclass(frozen=True)
class ServeSpec:
    repo: Path
    host: str | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    timeout_s: float | None = None  # None: LOAD_TIMEOUT_S, or MPI_LOAD_TIMEOUT_S for an MPI launch
    # tritonserver's bound on requests in flight once asked to stop (--exit-timeout-secs)
    exit_timeout_s: int = EXIT_TIMEOUT_S


def read_manifest(repo: Path) -> dict:
    path = Path(repo) / MANIFEST
    if not Path(repo).exists():
        raise ServerError(f"{repo}: does not exist; create a model repository there with `trtspec deploy`")
    if not Path(repo).is_dir() or not repo_models(repo):
        raise ServerError(
            f"{repo}: not a model repository (no */config.pbtxt); create one with `trtspec deploy`"
        )
    if not path.exists():
        return {}  # a repository not written by trtspec: serve it with default ports
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ServerError(
            f"{path}: cannot be read as JSON ({err}); write the repository again with trtspec deploy"
        ) from None
    if not isinstance(info, dict):
        raise ServerError(f"{path}: must be a JSON object; write the repository again with trtspec deploy")
    return info


def resolve_ports(spec: ServeSpec, info: dict) -> Ports:
    """The command line's ports and host, else the ones the recipe deployed (the manifest's, checked as the
    recipe's are: ServerError naming the manifest's field), else the recipe's defaults (a repository trtspec did
    not write)."""
    saved, default = info.get("ports") or {}, TritonSpec()
    where = Path(spec.repo) / MANIFEST
    if not isinstance(saved, dict):
        raise ServerError(
            f"{where}: ports: must be an object; write the repository again with trtspec deploy"
        )

    def pick(given, key: str, fallback):
        if given is not None or key not in saved:
            return given if given is not None else fallback
        value = saved[key]
        if problem := host_problem(value) if key == "host" else port_problem(value):
            raise ServerError(
                f"{where}: ports.{key}: {problem}; write the repository again with trtspec deploy"
            )
        return value

    return Ports(
        http=pick(spec.http_port, "http", default.http_port),
        grpc=pick(spec.grpc_port, "grpc", default.grpc_port),
        metrics=pick(spec.metrics_port, "metrics", default.metrics_port),
        host=pick(spec.host, "host", default.host),
    )


# The sample request's fields per client interface (the manifest's "interface"): trtspec's tensorrt_llm_bls names,
# or upstream's LLM-API model's (sampling_param_*, streaming; K is model.yaml's, and it echoes the prompt unless
# told not to).
SAMPLE_BODIES = {
    "trtspec": (
        '{"text_input": "def add(a, b):", "max_tokens": 32, "num_draft_tokens": 4, "return_perf_metrics": true}',
        "stream",
    ),
    "llmapi": (
        '{"text_input": "def add(a, b):", "sampling_param_max_tokens": 32, "sampling_param_return_perf_metrics": '
        'true, "sampling_param_exclude_input_from_output": true}',
        "streaming",
    ),
}


def sample_requests(
    ports: Ports, model: str = names.ENTRY_POINT, decoupled: bool = True, interface: str = "trtspec"
) -> list[str]:
    """Copy-paste requests that exercise the running repository in its client interface (streamed ones only
    where it is decoupled)."""
    body, stream = SAMPLE_BODIES.get(interface, SAMPLE_BODIES["trtspec"])
    whole = f"curl -s -X POST http://{ports.http_url}/v2/models/{model}/generate -d '{body}'"
    if not decoupled:
        return [whole, f"python tools/client.py --url {ports.grpc_url} 'def add(a, b):'"]
    return [
        whole,
        f"curl -s -N -X POST http://{ports.http_url}/v2/models/{model}/generate_stream "
        f"-d '{body[:-1]}, \"{stream}\": true}}'",
        f"python tools/client.py --url {ports.grpc_url} --stream 'def add(a, b):'",
    ]


def server_log_path(repo: Path | str) -> Path:
    """Where tritonserver's log goes: beside the repository's folder, named after it (`serve .` and a link name
    the folder they lead to)."""
    folder = Path(repo).resolve()
    return folder.parent / f".{folder.name}.tritonserver.log"


def launch_layout_of(info: dict, repo: Path | str = "the repository") -> dict:
    """The manifest's launch layout. A torch repository written before the field existed, or one not written by
    trtspec, runs single; an engine repository cannot be started without knowing how (mpirun, --multi-model)."""
    launch, runtime = info.get("launch"), info.get("runtime", "torch")
    redeploy = "write the repository again with `trtspec deploy`"
    if launch is None:
        if runtime == "torch":
            return SINGLE
        raise ServerError(f"{repo}/{MANIFEST}: no launch layout for the {runtime} runtime; {redeploy}")
    if not isinstance(launch, dict) or not {"mode", "mpi", "world_size"} <= set(launch):
        raise ServerError(f"{repo}/{MANIFEST}: launch is not a launch layout (got {launch!r}); {redeploy}")
    return SINGLE | launch


def _interrupt_on_stop_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal or ssh session closing) all stop the server cleanly: tritonserver
    runs in a session of its own, so no terminal signal reaches it, and without this a hang-up would leave it on
    the ports. SIGHUP stays ignored where it was (``nohup``). A background job of a non-interactive shell (and
    some init systems) starts us with SIGINT ignored; Python then never raises KeyboardInterrupt, so restore it."""

    signal.signal(signal.SIGINT, stop_or_hold)
    signal.signal(signal.SIGTERM, stop_or_hold)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, stop_or_hold)


def serve(spec: ServeSpec, echo=print, on_ready=None) -> int:
    """Start, report endpoints, block until Ctrl-C / SIGTERM or the server exits; returns the exit status.
    ``on_ready`` gets the endpoints as one JSON-ready dict once every model is ready (``serve --json``: a
    supervisor or script reads where to send requests without parsing the printed lines).

    A stop the user asked for returns 0 once the server's whole session is gone (``TritonServer.stop`` kills
    what outlives tritonserver's own exit timeout), whatever status tritonserver chose for a slow unload.
    """
    _interrupt_on_stop_signals()
    info = read_manifest(spec.repo)
    ports = resolve_ports(spec, info)
    layout = launch_layout_of(info, spec.repo)
    if info.get("runtime") == "trtllm-pytorch":
        from trtspec.triton_repo.llmapi import find_upstream_model_dir

        find_upstream_model_dir()  # fail now, not inside the stub, if the image lacks upstream's model.py
    log = server_log_path(spec.repo)
    server = TritonServer(spec.repo, ports, log, find_server(), layout, spec.exit_timeout_s)
    env = ""
    if server.layout:
        echo(f"{layout['mode']}: {layout['world_size']} MPI rank(s)")
        env = "".join(f"{k}={v} " for k, v in (layout.get("env") or {}).items())
    echo(f"starting: {env}" + " ".join(server.command))
    try:
        default = MPI_LOAD_TIMEOUT_S if server.layout else LOAD_TIMEOUT_S
        server.start(spec.timeout_s if spec.timeout_s is not None else default)
    except KeyboardInterrupt:  # Ctrl-C while the models load: start() has already stopped the whole session
        echo("stopped while loading the models")
        return 0
    try:
        models = repo_models(spec.repo)
        echo(f"ready: {', '.join(models)}")
        echo(
            f"listening on {ports.host}\nHTTP     http://{ports.http_url}\ngRPC     {ports.grpc_url}\n"
            f"metrics  {ports.metrics_url}"
        )
        model = info.get("entry_point") or names.ENTRY_POINT
        requests = sample_requests(
            ports, model, decoupled=info.get("decoupled", True), interface=info.get("interface", "trtspec")
        )
        echo("try:\n  " + "\n  ".join(requests))
        echo(f"server log: {log}   (Ctrl-C stops the server)")
        if on_ready is not None:
            on_ready(
                {
                    "status": "ready",
                    "repository": str(Path(spec.repo).resolve()),
                    "models": models,
                    "entry_point": model,
                    "host": ports.host,
                    "http": f"http://{ports.http_url}",
                    "grpc": ports.grpc_url,
                    "metrics": ports.metrics_url,
                    "server_log": str(log),
                    "requests": requests,
                }
            )
        watch = HealthWatch(server)
        try:
            while (reason := watch.failure()) is None:
                time.sleep(HEALTH_POLL_S)
        except KeyboardInterrupt:
            echo("stopping tritonserver ...")
            status = server.stop()
            if status:
                echo(f"tritonserver exited with status {status} while unloading; its session was stopped")
            return 0
        stopped = "; tritonserver was stopped" if returncode(server.proc) is None else ""
        server.stop(BROKEN_STOP_GRACE_S)
        raise ServerError(f"{reason}{stopped} (log: {log})")
    finally:
        server.stop()
