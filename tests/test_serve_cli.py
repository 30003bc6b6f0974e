"""`trtspec serve` as a user runs it: a subprocess on a torch-runtime repository of the tiny pair, asked by
tools/client.py over gRPC and HTTP, then stopped with SIGINT (Ctrl-C). It must exit 0 and leave no
tritonserver / python backend stub process and no python backend shared-memory region behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from triton_server import deploy_tiny_repo

from trtspec.triton_repo.serve import server_log_path
from trtspec.triton_repo.server import free_ports, mapped_shm, session_processes

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.one_stack]
ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "tools" / "client.py"


def _ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def repo(tiny_pair, tmp_path_factory) -> Path:
    return deploy_tiny_repo(tiny_pair, tmp_path_factory.mktemp("serve_cli") / "repo")


def _client(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(CLIENT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _kill_serve(proc: subprocess.Popen) -> None:
    """After a failed test: kill serve and the server sessions it started (tritonserver runs in its own)."""
    if proc.poll() is None:
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_ready(proc: subprocess.Popen, http_port: int, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not _ready(http_port):
        assert proc.poll() is None, (
            f"trtspec serve exited {proc.returncode}:\n{log.read_text()}{_server_log(proc)}"
        )
        assert time.monotonic() < deadline, (
            f"not ready in {timeout_s} s:\n{log.read_text()}{_server_log(proc)}"
        )
        time.sleep(0.3)


def _server_log(proc: subprocess.Popen) -> str:
    """The tail of the log of the tritonserver that serve ran on the repository after `serve` in its command:
    serve's own error names only its last line."""
    server_log = server_log_path(proc.args[proc.args.index("serve") + 1])
    if not server_log.exists():
        return ""
    return "\n--- tritonserver log ---\n" + "\n".join(
        server_log.read_text(errors="replace").splitlines()[-60:]
    )


def test_serve_answers_the_client_and_stops_cleanly_on_ctrl_c(repo, tmp_path):
    """With --json: the endpoints as one JSON document on stdout once ready, the printed lines on stderr."""
    import json

    http, grpc, metrics = free_ports(3)
    log, stdout = tmp_path / "serve.log", tmp_path / "serve.json"
    cmd = [sys.executable, "-m", "trtspec", "serve", str(repo), "--json"]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with open(log, "w") as err, open(stdout, "w") as out:
        # Started with SIGINT ignored, as a `cmd &` background job of a non-interactive shell is (tools/demo.sh):
        # serve must still stop on SIGINT.
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        _wait_ready(proc, http, log)
        deadline = time.monotonic() + 30
        while not stdout.read_text().rstrip().endswith("}") and time.monotonic() < deadline:
            time.sleep(0.2)
        ready = json.loads(stdout.read_text())
        assert ready["status"] == "ready" and ready["entry_point"] == "tensorrt_llm_bls"
        assert set(ready["models"]) >= {"ensemble", "tensorrt_llm_bls"} and ready["host"] == "127.0.0.1"
        assert (ready["http"], ready["grpc"]) == (f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}")
        assert ready["metrics"] == f"http://127.0.0.1:{metrics}/metrics"
        assert ready["server_log"] == str(repo.resolve().parent / f".{repo.name}.tritonserver.log")
        assert "ready: " in log.read_text() and "/v2/models/tensorrt_llm_bls/generate" in ready["requests"][0]
        servers = _children(proc.pid)
        assert len(servers) == 1, f"expected one tritonserver child, got {servers}"
        server_tree = session_processes(servers[0])  # tritonserver runs in its own session with its stubs
        assert "tritonserver" in server_tree.values()
        assert "triton_python_b" in "".join(server_tree.values())  # the stubs (comm is cut at 15 chars)
        regions = mapped_shm(server_tree)
        assert regions, "the server maps no python backend shared memory: the check below would be vacuous"

        # tools/client.py, the way tools/demo.sh calls it, and over HTTP with several prompts
        got = _client(
            "--url",
            f"127.0.0.1:{grpc}",
            "--protocol",
            "grpc",
            "--stream",
            "--max-tokens",
            "12",
            "--num-draft-tokens",
            "4",
            "def add(a, b):",
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.startswith("def add(a, b):") and "acceptance " in got.stdout
        got = _client(
            "--url",
            f"127.0.0.1:{http}",
            "--protocol",
            "http",
            "--max-tokens",
            "6",
            "--no-metrics",
            "class A:",
            "import os",
        )
        assert got.returncode == 0, got.stderr
        assert "--- [2/2]" in got.stdout and "import os" in got.stdout and "acceptance" not in got.stdout
        got = _client("--url", f"127.0.0.1:{http}", "--protocol", "http", "--num-draft-tokens", "9", "def")
        assert got.returncode == 2 and "Traceback" not in got.stderr
        assert (
            got.stderr.startswith("Error: Triton at") and "num_draft_tokens 9 is out of range" in got.stderr
        )
        # streamed, the refusal arrives as a server-sent event: the message alone, not its "data:" framing
        got = _client("--url", f"http://127.0.0.1:{http}", "--stream", "--num-draft-tokens", "9", "def")
        assert got.returncode == 2 and got.stderr.startswith(
            f"Error: Triton at http://127.0.0.1:{http} refused the request: num_draft_tokens 9 is out of range"
        ), got.stderr
        # an http:// URL speaks HTTP without --protocol; a model the server lacks is named as such
        got = _client("--url", f"http://127.0.0.1:{http}", "--max-tokens", "4", "--no-metrics", "def")
        assert got.returncode == 0 and got.stdout.startswith("def"), got.stderr
        got = _client("--url", f"http://127.0.0.1:{http}", "--model", "nope", "def")
        assert got.returncode == 2 and "has no ready model 'nope'" in got.stderr, got.stderr

        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=60)
        server_log = server_log_path(repo).read_text()
        assert "stopping tritonserver" in log.read_text()
        assert json.loads(stdout.read_text()) == ready  # one document, nothing after it
        # A stop the user asked for exits 0 once the server's session is gone, even when unloading the models
        # outlasted tritonserver's own --exit-timeout-secs (seen on an overloaded 2-core machine).
        assert status == 0, f"exit {status}\n{log.read_text()}\n{server_log[-3000:]}"
        time.sleep(0.5)  # orphaned stubs are reaped by init
        assert not session_processes(servers[0]), "tritonserver or a stub is still running"
        assert not [r for r in regions if os.path.exists(r)], "shared-memory regions leaked"
    finally:
        _kill_serve(proc)


def test_client_refuses_a_negative_seed_and_names_prompt_lookups_share():
    """Triton's seed is UINT64 (-1 wrapped to 2**64 - 1 in silence, 2**64 failed in numpy's cast); the metrics line says how many of the draft
    tokens prompt lookup gave."""
    got = _client("--seed", "-1", "def")
    assert got.returncode == 2 and "--seed: -1 is negative; a seed is 0 or more" in got.stderr
    got = _client("--seed", str(2**64), "def")
    assert got.returncode == 2 and f"--seed: {2**64} does not fit Triton's UINT64 seed" in got.stderr
    sys.path.insert(0, str(CLIENT.parent))
    try:
        import client
    finally:
        sys.path.pop(0)
    from trtspec.validate.triton_client import EndpointResponse

    response = EndpointResponse(elapsed_s=0.5)
    response.metrics = {"acceptance_rate": 0.5, "total_draft_tokens": 8, "total_accepted_draft_tokens": 4,
                        "ngram_draft_tokens": 6, "ngram_accepted_draft_tokens": 3}  # fmt: skip
    assert "acceptance 0.50 (4/8 draft tokens accepted)  prompt lookup 3/6 of them" in client.metrics_line(
        response
    )
    response.metrics["ngram_draft_tokens"] = 0
    assert "prompt lookup" not in client.metrics_line(response)
    args = client.parse_args(["--proposer", "ngram", "def"])
    assert client.sampling(args) == {"proposer": "ngram"}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_client_reports_an_unreachable_server_in_one_line(protocol):
    (port,) = free_ports(1)
    got = _client("--url", f"127.0.0.1:{port}", "--protocol", protocol, "def")
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.startswith(f"Error: cannot reach Triton at 127.0.0.1:{port}")
    assert len(got.stderr.strip().splitlines()) == 1


FAKE_MPIRUN = """#!{python}
# Stand-in for Open MPI's mpirun (none here): the argv form trtspec uses, `mpirun --allow-run-as-root -n 1 RANK0
# [: -n 1 RANK1 ...]`; it runs a one-rank launch in place (exec), records what it got, and refuses more ranks.
import json, os, sys
args = sys.argv[1:]
assert args[0] == "--allow-run-as-root", args
ranks = " ".join(args[1:]).split(" : ")
if len(ranks) != 1:
    sys.exit("fake mpirun: one rank only")
rank = ranks[0].split(" ")
assert rank[:2] == ["-n", "1"], rank
with open(os.environ["FAKE_MPIRUN_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv, "orchestrator": os.environ.get("TRTLLM_ORCHESTRATOR")}}, f)
os.execv(rank[2], rank[2:])
"""


def test_an_mpi_launch_is_served_like_a_single_one(repo, tmp_path):
    """The tensorrtllm runtime always launches under mpirun (--multi-model): serve must still wait for every model,
    print the endpoints, answer, and stop the whole session on Ctrl-C. A stand-in mpirun runs the one rank."""
    import json
    import shutil

    mpi_repo = tmp_path / "repo"
    shutil.copytree(repo, mpi_repo)
    manifest = json.loads((mpi_repo / "trtspec.json").read_text())
    manifest["launch"] = {
        "mode": "orchestrator",
        "mpi": True,
        "world_size": 1,
        "env": {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"},
        "rank_models": [],
        "gpus": [],
    }
    (mpi_repo / "trtspec.json").write_text(json.dumps(manifest))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text(FAKE_MPIRUN.format(python=sys.executable))
    (bin_dir / "mpirun").chmod(0o755)
    record = tmp_path / "mpirun.json"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_MPIRUN_RECORD=str(record))

    http, grpc, metrics = free_ports(3)
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "trtspec", "serve", str(mpi_repo)]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(proc, http, log)
        deadline = time.monotonic() + 30
        while "try:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = log.read_text().splitlines()
        (starting,) = [line for line in lines if line.startswith("starting: ")]
        # the command is one line to copy, however long
        assert "mpirun --allow-run-as-root -n 1" in starting and f"--http-port={http}" in starting
        assert "orchestrator: 1 MPI rank(s)" in lines and "ready: ensemble, tensorrt_llm_bls" in lines
        assert any(line.split() == ["HTTP", f"http://127.0.0.1:{http}"] for line in lines)
        got = json.loads(record.read_text())
        assert got["orchestrator"] == "1" and f"--http-port={http}" in got["argv"]
        assert "--http-address=127.0.0.1" in got["argv"]
        answer = _client("--url", f"127.0.0.1:{grpc}", "--stream", "--max-tokens", "6", "def add(a, b):")
        assert answer.returncode == 0 and answer.stdout.startswith("def add(a, b):"), answer.stderr
        (server,) = _children(proc.pid)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, log.read_text()
        time.sleep(0.5)
        assert not session_processes(server), "a rank or a stub is still running"
    finally:
        _kill_serve(proc)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_while_the_models_load_stops_cleanly(repo, tmp_path, signum):
    """A stop the user asks for before the server is ready is still a clean stop: exit 0, nothing left running,
    not click's 'Aborted!' with exit 1 (a stop while loading can also meet a health check that sees the models
    ready before serve does). A hang-up (the terminal closing) too: tritonserver's own session gets none."""
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "trtspec", "serve", str(repo)]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    server_log = server_log_path(repo)
    server_log.unlink(missing_ok=True)
    # as from a terminal: serve keeps a hang-up ignored where it was (nohup), and a test run may be under nohup
    hangup_default = lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL)  # noqa: E731
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=hangup_default
        )
    try:
        deadline = time.monotonic() + 60
        # tritonserver has started and written its first lines (so serve's Popen has returned); its python
        # models take seconds more to load
        while not (_children(proc.pid) and server_log.exists() and server_log.stat().st_size):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        (server,) = _children(proc.pid)
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "stopped while loading the models" in log.read_text() and "ready:" not in log.read_text()
        time.sleep(0.5)
        assert not session_processes(server), "tritonserver or a stub is still running"
    finally:
        _kill_serve(proc)


STOPPED = (
    r"Error: tritonserver (exited unexpectedly|is stopping): another process sent it signal 15 \(SIGTERM\)"
)
CRASHED = r"Error: tritonserver exited unexpectedly: it crashed on signal 11 \(SIGSEGV\); its stack trace is in the log"


@pytest.mark.parametrize(("signum", "line"), [(signal.SIGTERM, STOPPED), (signal.SIGSEGV, CRASHED)])
def test_a_server_stopped_by_another_process_or_crashed_is_named_so_in_one_line(repo, tmp_path, signum, line):
    """Someone else's SIGTERM (an operator's pkill, an orchestrator) makes tritonserver unload cleanly, and its
    last log lines then say nothing of why; a crash (SIGSEGV here, a real one in tritonserver's own handler) ends
    the log in a stack trace. Either way serve's one line names what happened, exits 2, and leaves nothing: no
    process, and no shared-memory region, which a crashed server cannot remove itself."""
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "trtspec", "serve", str(repo)]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(proc, http, log)
        deadline = time.monotonic() + 30
        while "try:" not in log.read_text() and time.monotonic() < deadline:  # serve is watching now
            time.sleep(0.2)
        (server,) = _children(proc.pid)
        regions = mapped_shm(session_processes(server))
        os.kill(server, signum)
        assert proc.wait(timeout=60) == 2, log.read_text()
        last = log.read_text().strip().splitlines()[-1]
        # whether serve's watch saw it unloading (its stubs gone) or gone
        assert re.match(line + r"(; tritonserver was stopped)? \(log: ", last), log.read_text()
        time.sleep(0.5)
        assert not session_processes(server), "tritonserver or a stub is still running"
        assert regions and not [r for r in regions if os.path.exists(r)]
    finally:
        _kill_serve(proc)
