"""Find, start, wait for and stop tritonserver on a model repository.

Two installs: the NGC image's own (``tritonserver`` on PATH, backends in /opt/tritonserver/backends), or on
machines without one the server bundled in PyPI nvidia-pytriton, for which a backend directory is assembled
from the wheel (python backend + the stub for this interpreter) and LD_LIBRARY_PATH / PATH are set so the stub
loads this interpreter's libpython and finds the virtualenv's packages (see triton-on-cpu.md).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import PortInUse, ServerError
from trtspec.core.interrupts import stop_signals_held
from trtspec.recipe import repeated_port

NGC_BACKENDS = Path("/opt/tritonserver/backends")
# tritonserver's own bound on unloading models after SIGINT; python models took ~10 s on a loaded 2-core machine,
# and an expired timeout makes the server exit 1 on a stop the user asked for.
EXIT_TIMEOUT_S = 15
STOP_GRACE_S = EXIT_TIMEOUT_S + 10.0  # SIGINT, then SIGKILL of the whole session after this bound
_FAILED_LOAD = re.compile(r"failed to load '([^']+)'.*?: (.*)$")
# tritonserver's own line on a signal it traps: SIGINT and SIGTERM stop it cleanly, while SIGSEGV and SIGABRT are
# its own crash (it prints a stack trace and dumps core; server src/triton_signal.cc)
_SIGNALLED = re.compile(r"^Signal \((\d+)\) received\.", re.MULTILINE)
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT}
HEALTH_POLL_S = 1.0  # how often `trtspec serve` checks a running server (HealthWatch)
NOT_READY_POLLS = 3  # polls in a row a model may miss ready (a timeout under load) before it counts as broken
READY_TIMEOUT_S = 5.0  # one readiness poll; a busy server answers /ready in milliseconds
STUB = "triton_python_backend_stub"
SHM_PREFIX = "/dev/shm/triton_python_backend_shm_region_"


@dataclass(frozen=True)
class ServerInstall:
    """How to run tritonserver here: the binary, its backend directory and the environment it needs."""

    binary: Path
    backend_dir: Path
    env: dict = field(repr=False)
    kind: str  # "ngc" or "pytriton"


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int
    host: str = "127.0.0.1"

    @property
    def by_kind(self) -> dict[str, int]:
        """The endpoints' ports by name, in tritonserver's order: http, grpc, metrics."""
        return {"http": self.http, "grpc": self.grpc, "metrics": self.metrics}

    @property
    def reach_host(self) -> str:
        """The address a client on this machine connects to: a bind-all address is reached on loopback."""
        return "127.0.0.1" if self.host == "0.0.0.0" else self.host

    @property
    def http_url(self) -> str:
        return f"{self.reach_host}:{self.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.reach_host}:{self.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.reach_host}:{self.metrics}/metrics"


def repo_path_problem(repo: Path | str) -> str | None:
    """Why tritonserver's python backend cannot load models from ``repo`` (None: it can). Each model's stub gets
    its model.py path as a command-line argument, so a space splits it (the stub then dies parsing the next
    argument), and the stub's Python fails on a non-ASCII path."""
    path = str(Path(repo).resolve())  # what tritonserver is given (a link's target)
    if any(ch.isspace() for ch in path):
        return "its path has a space, which Triton's python backend cannot load models from"
    if not path.isascii():
        return "its path has non-ASCII characters, which Triton's python backend cannot load models from"
    return None


def check_ports(ports: Ports) -> None:
    """ServerError, before tritonserver starts, for ports it could not take: two alike, one in use (another server
    on it would answer the readiness polls), or a host this machine cannot bind."""
    if clash := repeated_port(ports.by_kind):
        kind, earlier = clash
        raise ServerError(
            f"the http, grpc and metrics ports must differ (the {kind} port {ports.by_kind[kind]} is also the "
            f"{earlier} port); pass distinct --*-port values"
        )
    for kind, port in ports.by_kind.items():
        try:
            first = socket.getaddrinfo(ports.host, port, type=socket.SOCK_STREAM)[0]
            family, socktype, proto, _, address = first
            with socket.socket(family, socktype, proto) as probe:
                # a port in TIME_WAIT is free to serve; a live listener still refuses the bind
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except (socket.gaierror, UnicodeError, ValueError) as err:
            raise ServerError(
                f"host {ports.host!r}: not an address this machine can bind ({err}); pass --host with one it has "
                "(127.0.0.1, or 0.0.0.0 for every interface)"
            ) from None
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} ({kind}) on {ports.host} is in use, perhaps by another server; stop it or pass "
                    f"another --{kind}-port"
                ) from None
            raise ServerError(f"cannot bind {ports.host}:{port} ({kind}): {err.strerror or err}") from None


def free_ports(n: int = 3, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports on ``host`` (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pytriton_backend_dir(root: Path) -> Path:
    """Assemble <cache>/backends/python from the nvidia-pytriton wheel: copied once per wheel version and Python
    version, and renamed into place whole, so that servers starting at once (`make test` runs four test sessions
    side by side, on two venvs) never see a partial copy or lose one in use."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(
            f"nvidia-pytriton has no python backend stub for Python {version}; use Python 3.10-3.13"
        )
    try:
        wheel = importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        wheel = "unknown"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trtspec"
    cache = base / f"backends-pytriton{wheel}-py{version}"
    copied = cache / "python" / "triton_python_backend_stub"
    if not copied.is_file():
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "python").mkdir(parents=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(root / "backends" / "python" / name, tmp / "python" / name)
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        try:
            os.replace(tmp, cache)
        except OSError:  # another process renamed its whole copy into place first: the same files
            shutil.rmtree(tmp, ignore_errors=True)
            if not copied.is_file():
                raise ServerError(
                    f"{cache}: an incomplete copy of the python backend; remove it and run again"
                ) from None
    return cache


def find_server() -> ServerInstall:
    """The NGC tritonserver if present, else the one bundled in nvidia-pytriton; ServerError if neither."""
    env = dict(os.environ)
    # The stub's embedded interpreter finds site-packages through `python3` on PATH: put this venv first.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    on_path = shutil.which("tritonserver")
    if on_path and NGC_BACKENDS.is_dir():
        return ServerInstall(Path(on_path), NGC_BACKENDS, env, "ngc")
    try:
        import pytriton
    except ImportError:
        raise ServerError(
            "no tritonserver found: run inside the NGC Triton image or `pip install nvidia-pytriton`"
        ) from None
    root = Path(pytriton.__file__).parent / "tritonserver"
    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    # Without the wheel's libs the stub cannot start and the server hangs; without LIBDIR the stub loads
    # the system libpython against this interpreter's stdlib.
    ld = [str(libs), sysconfig.get_config_var("LIBDIR") or "", env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in ld if p)
    return ServerInstall(root / "bin" / "tritonserver", _pytriton_backend_dir(root), env, "pytriton")


def server_command(
    install: ServerInstall, repo: Path, ports: Ports, exit_timeout_s: int = EXIT_TIMEOUT_S
) -> list[str]:
    """The tritonserver argv for one process serving ``repo`` on ``ports`` (bound to ``ports.host``)."""
    return [
        str(install.binary),
        f"--model-repository={Path(repo).resolve()}",
        f"--backend-directory={install.backend_dir}",
        *_endpoint_args(ports),
        f"--exit-timeout-secs={exit_timeout_s}",
        "--disable-auto-complete-config",
    ]


def _endpoint_args(ports: Ports) -> list[str]:
    """tritonserver's HTTP, gRPC and metrics endpoints: each bound to ``ports.host`` (its default is every
    interface) on its port."""
    kinds = ports.by_kind
    return [f"--{kind}-address={ports.host}" for kind in kinds] + [
        f"--{k}-port={p}" for k, p in kinds.items()
    ]


def _rank_args(
    repo: Path,
    ports: Ports,
    layout: dict,
    rank: int,
    binary: str,
    backend_dir: Path | None,
    exit_timeout_s: int = EXIT_TIMEOUT_S,
) -> list[str]:
    """One rank's tritonserver argv (launch_triton_server.py's get_cmd, plus explicit 127.0.0.1 binding)."""
    args = [binary, f"--model-repository={Path(repo).resolve()}", f"--exit-timeout-secs={exit_timeout_s}"]
    if backend_dir is not None:
        args.append(f"--backend-directory={backend_dir}")
    if rank == 0:
        args += _endpoint_args(ports)
    else:
        # Worker ranks host only the engine models' ranks and serve no endpoint.
        args += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in layout["rank_models"]]]
        args += ["--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
    if layout["mode"] == "orchestrator":
        # Spawned executor workers own the GPUs: Triton itself must not pin memory pools on them.
        args += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
        args += [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(max(layout["gpus"], default=0) + 1)]
    args += [
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
    return args


def launch_command(
    repo: Path,
    ports: Ports,
    layout: dict,
    binary: str = "tritonserver",
    backend_dir: Path | None = None,
    exit_timeout_s: int = EXIT_TIMEOUT_S,
) -> list[str]:
    """The mpirun argv for a repository whose trtspec.json ``launch`` layout needs MPI (values.launch_layout).

    Mirrors upstream's launch_triton_server.py: ``mpirun --allow-run-as-root -n 1 RANK0 : -n 1 RANK1 ...`` with
    ``world_size`` ranks, a distinct python shared-memory prefix per rank, only rank 0 serving clients.
    """
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank in range(layout["world_size"]):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", *_rank_args(repo, ports, layout, rank, binary, backend_dir, exit_timeout_s)]
    return cmd


def launch_env(layout: dict, base: dict | None = None) -> dict:
    """The environment of the launch: ``base`` (default os.environ) + the layout's variables
    (TRTLLM_ORCHESTRATOR / TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES for --multi-model, CUDA_VISIBLE_DEVICES for llmapi)."""
    return dict(os.environ if base is None else base) | dict(layout.get("env") or {})


def repo_models(repo: Path) -> list[str]:
    """Model names of a repository: the folders holding a config.pbtxt."""
    return sorted(p.parent.name for p in Path(repo).glob("*/config.pbtxt"))


def python_models(repo: Path) -> set[str]:
    """The models of a repository that the python backend runs, each in stub processes of its own."""
    backend = re.compile(r'^backend:\s*"python"', re.M)
    return {p.parent.name for p in Path(repo).glob("*/config.pbtxt") if backend.search(p.read_text())}


def _logged_signal(log_text: str) -> int | None:
    signalled = _SIGNALLED.search(log_text)
    return int(signalled.group(1)) if signalled else None


def _signal_name(number: int) -> str:
    with contextlib.suppress(ValueError):
        return f"signal {number} ({signal.Signals(number).name})"
    return f"signal {number}"


def stop_signal(log_text: str) -> str | None:
    """'another process sent it signal 15 (SIGTERM)' once tritonserver has logged a stop signal, else None (also
    for a crash: see crash_signal)."""
    number = _logged_signal(log_text)
    if number is None or number in _CRASH_SIGNALS:
        return None
    return f"another process sent it {_signal_name(number)}"


def crash_signal(log_text: str) -> str | None:
    """'it crashed on signal 6 (SIGABRT); its stack trace is in the log' once tritonserver has logged a crash
    signal, else None."""
    number = _logged_signal(log_text)
    if number is None or number not in _CRASH_SIGNALS:
        return None
    return f"it crashed on {_signal_name(number)}; its stack trace is in the log"


def failure_reason(log_text: str) -> str:
    """The one line that says why Triton did not load the repository or stopped (its own words). A signal comes
    first: tritonserver then unloads cleanly, and its last lines say nothing of why; after a crash they are a stack
    trace."""
    signalled = stop_signal(log_text) or crash_signal(log_text)
    if signalled:
        return signalled
    lines = log_text.splitlines()
    for line in lines:
        match = _FAILED_LOAD.search(line)
        if match:
            reason = match.group(2).split("\\n")[0].strip().rstrip('"')
            return f"model '{match.group(1)}' failed to load: {reason}"
    for line in lines:
        if line.startswith("E") or "error:" in line.lower():
            if any(word in line.lower() for word in ("cuda", "nvml", "dcgm")):
                continue  # harmless on CPU-only machines (e.g. "CudaDriverHelper has not been initialized")
            return line.split("] ", 1)[-1].strip()
    return lines[-1].strip() if lines else "tritonserver exited without output"


METRICS = "the metrics endpoint"  # wait_ready's name for it among the models


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command name of the live (non-zombie) processes of session ``sid`` (Linux /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found[int(stat.parent.name)] = name
    return found


def python_stubs(sid: int) -> dict[int, str]:
    """pid -> model name of the python backend stubs of session ``sid``: each runs REPO/MODEL/VERSION/model.py,
    its first argument (Linux /proc)."""
    found = {}
    for pid in session_processes(sid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if Path(argv[0].decode()).name == STUB:
                found[pid] = Path(argv[1].decode()).parts[-3]
    return found


def mapped_shm(pids) -> set[str]:
    """The python backend shared-memory regions these processes have mapped (so they are this server's)."""
    regions = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1]
                if path.startswith(SHM_PREFIX):
                    regions.add(path.removesuffix(" (deleted)"))
    return regions


def returncode(proc: subprocess.Popen) -> int | None:
    """``proc.poll()``, the stop signals held back while it runs (stop_signals_held)."""
    with stop_signals_held():
        return proc.poll()


def wait_exit(proc: subprocess.Popen, timeout_s: float | None = None) -> int | None:
    """``proc``'s exit status once it exits, or None after ``timeout_s`` (None: no limit). It polls (returncode)
    instead of Popen.wait, so a stop signal lands between polls, never inside one."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while (status := returncode(proc)) is None and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)
    return status


class TritonServer:
    """A tritonserver child process in its own session; use as a context manager.

    ``layout`` (a repository's trtspec.json ``launch``, values.launch_layout): one that needs MPI starts the
    ranks under mpirun (``launch_command``, ``launch_env``) instead of one tritonserver; the rest is the same.
    ``start()`` returns once every model of the repository is ready, or raises ServerError with Triton's
    reason. ``stop()`` sends SIGINT, then SIGKILLs the whole session once ``exit_timeout_s`` (tritonserver's
    bound on requests in flight after a signal) and STOP_GRACE_S - EXIT_TIMEOUT_S more have passed, so no stub
    survives.
    """

    def __init__(
        self,
        repo: Path,
        ports: Ports,
        log_path: Path,
        install: ServerInstall | None = None,
        layout: dict | None = None,
        exit_timeout_s: int = EXIT_TIMEOUT_S,
    ):
        self.repo, self.ports, self.log_path = Path(repo), ports, Path(log_path)
        self.exit_timeout_s = exit_timeout_s
        self.install = install or find_server()
        self.layout = layout if layout and layout.get("mpi") else None
        self.proc: subprocess.Popen | None = None
        self.stubs: dict[int, str] = {}  # the python stubs once every model was ready: pid -> model
        # their shared-memory regions, noted then too: a server that crashed takes its stubs along, and with them
        # the only processes that would still say which regions were its own
        self.regions: set[str] = set()

    @property
    def command(self) -> list[str]:
        if self.layout:
            return launch_command(
                self.repo,
                self.ports,
                self.layout,
                str(self.install.binary),
                self.install.backend_dir,
                self.exit_timeout_s,
            )
        return server_command(self.install, self.repo, self.ports, self.exit_timeout_s)

    @property
    def stop_grace_s(self) -> float:
        """How long ``stop`` waits after SIGINT before it kills the session: tritonserver's exit timeout and the
        margin its unloading takes beyond it."""
        return self.exit_timeout_s + STOP_GRACE_S - EXIT_TIMEOUT_S

    @property
    def env(self) -> dict:
        return launch_env(self.layout, self.install.env) if self.layout else self.install.env

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        if self.layout and not shutil.which("mpirun", path=self.env.get("PATH")):
            raise ServerError(
                f"mpirun not found: the {self.layout['mode']} launch needs the NGC TensorRT-LLM Triton image"
            )
        problem = repo_path_problem(self.repo)
        if problem is not None:
            raise ServerError(
                f"{self.repo}: {problem}; move the repository or redeploy it with `trtspec deploy --out`"
            )
        check_ports(self.ports)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.stubs = python_stubs(self.proc.pid)
        self.regions = mapped_shm(session_processes(self.proc.pid))
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def base_url(self) -> str:
        """The HTTP endpoint as this machine reaches it."""
        return f"http://{self.ports.http_url}"

    @property
    def metrics_url(self) -> str:
        return self.ports.metrics_url

    def model_ready(self, model: str, timeout_s: float = 1.0) -> bool:
        return _http_ok(f"{self.base_url}/v2/models/{model}/ready", timeout_s)

    def _answers(self, model: str) -> bool:
        return _http_ok(self.metrics_url) if model == METRICS else self.model_ready(model)

    def wait_ready(self, timeout_s: float) -> None:
        """Poll until every model of the repo answers ready and the metrics endpoint answers (tritonserver opens
        it after HTTP and gRPC, so a scrape right after the models are ready can be refused); ServerError if the
        server exits or times out."""
        pending = [*repo_models(self.repo), METRICS]
        deadline = time.monotonic() + timeout_s
        while pending:
            if returncode(self.proc) is not None:
                reason = failure_reason(self.log_text())
                # another process took a port between check_ports and the bind
                error = PortInUse if "already in use" in reason else ServerError
                raise error(
                    f"tritonserver did not load {self.repo}: {reason}", detail=self.log_text()[-4000:]
                )
            if time.monotonic() > deadline:
                raise ServerError(
                    f"tritonserver did not get {', '.join(pending)} ready within {timeout_s:.0f} s "
                    f"(log: {self.log_path})",
                    detail=self.log_text()[-4000:],
                )
            pending = [m for m in pending if not self._answers(m)]
            if pending:
                time.sleep(0.2)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGINT, wait up to ``grace_s`` (None: ``stop_grace_s``), then SIGKILL the session; returns the exit
        status. A second Ctrl-C during the wait still kills the session (and then propagates). The python backend's
        shared-memory regions that a killed server could not remove are removed here."""
        if grace_s is None:
            grace_s = self.stop_grace_s
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        regions = self.regions | mapped_shm(session_processes(proc.pid))
        try:
            if returncode(proc) is None:
                with stop_signals_held():  # send_signal polls first
                    proc.send_signal(signal.SIGINT)
                wait_exit(proc, grace_s)  # a second Ctrl-C here: the session is killed, then it propagates
        finally:
            # The stubs (and MPI ranks) live in the server's session: kill whatever is left of it, the server's
            # own process group and any other group of that session (our own child's session only).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in session_processes(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        status = wait_exit(proc)  # killed: a moment
        _remove_when_unmapped(regions, proc.pid)
        return status

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _remove_when_unmapped(regions: set[str], sid: int, wait_s: float = 2.0) -> None:
    """Unlink ``regions`` once no process of session ``sid`` is left to map them (killed stubs take a moment
    to go); a server that exited cleanly has removed them already."""
    deadline = time.monotonic() + wait_s
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    for region in regions:
        with contextlib.suppress(OSError):
            os.unlink(region)


class HealthWatch:
    """What `trtspec serve` checks while it serves, HEALTH_POLL_S apart: the server process, its python backend
    stubs and each model's readiness. tritonserver 2.51 neither restarts a python stub that died nor reports its
    model not ready: new requests fail, and those in flight never get an answer (docs/faults.md). So a stub that
    is gone, or a model that misses ready NOT_READY_POLLS polls in a row, makes the server a broken one."""

    def __init__(self, server: TritonServer):
        self.server = server
        self.python_models = python_models(server.repo)
        self.misses = dict.fromkeys(repo_models(server.repo), 0)

    def failure(self) -> str | None:
        """One line that says why the server no longer serves, naming the model; None while it serves."""
        proc = self.server.proc
        if returncode(proc) is not None:
            return f"tritonserver exited unexpectedly: {failure_reason(self.server.log_text())}"
        live = python_stubs(proc.pid)  # a stub that died is a zombie: tritonserver does not reap it
        dead = [(pid, model) for pid, model in self.server.stubs.items() if pid not in live]
        dead += [(None, model) for model in sorted(self.python_models - set(live.values()))]
        if dead and (signalled := stop_signal(self.server.log_text())):  # its stubs go as it unloads
            return f"tritonserver is stopping: {signalled}"
        if dead:
            pid, model = dead[0]
            which = f"its python backend stub (pid {pid})" if pid else "its python backend stub"
            return f"model '{model}' stopped serving: {which} died, and tritonserver does not restart it"
        return self._not_ready()

    def _not_ready(self) -> str | None:
        for model in self.misses:
            ready = self.server.model_ready(model, READY_TIMEOUT_S)
            self.misses[model] = 0 if ready else self.misses[model] + 1
            if self.misses[model] >= NOT_READY_POLLS:
                return f"model '{model}' is not ready ({NOT_READY_POLLS} polls {HEALTH_POLL_S:g} s apart)"
        return None
