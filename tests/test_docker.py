"""Container rollout files (docker/): parsed and checked here, since no Docker engine runs on these machines.

The Dockerfiles are read with a small instruction parser (line continuations, comments), compose.yaml with
yaml; docker/check_pins.py and docker/healthcheck.py run for real; docker/entrypoint.sh runs end to end against
the CPU runtime (torch engine models in the tritonserver bundled with nvidia-pytriton).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from trtspec.core import trtllm

pytestmark = pytest.mark.one_stack  # the image's files and entrypoint

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKER = REPO_ROOT / "docker"
NGC_DOCKERFILE = DOCKER / "Dockerfile"
CPU_DOCKERFILE = DOCKER / "Dockerfile.cpu"
COMPOSE = DOCKER / "compose.yaml"
ENTRYPOINT = DOCKER / "entrypoint.sh"
VENV_BIN = Path(sys.executable).parent
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL", re.IGNORECASE
)


def load_docker_module(name: str):
    """docker/<name>.py is a standalone script (copied into the images), not part of the package."""
    spec = importlib.util.spec_from_file_location(f"docker_{name}", DOCKER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_pins = load_docker_module("check_pins")
healthcheck = load_docker_module("healthcheck")


# ---------------------------------------------------------------- a small Dockerfile parser


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the instruction's text after the keyword, continuations joined with a space
    line: int  # 1-based line of the keyword

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (CMD ["a", "b"]), else None."""
        text = self.args
        for flag in re.findall(r"--[a-z-]+=\S+\s+", text):  # HEALTHCHECK --interval=... CMD [...]
            text = text.replace(flag, "", 1)
        text = text.removeprefix("CMD").strip()
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, list) else None


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comment lines dropped (also inside continuations), ``\\`` lines joined."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments and blank lines are removed before continuations are joined
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, rest = " ".join(parts).partition(" ")
            out.append(Instruction(keyword.upper(), rest.strip(), start))
            parts = []
    if parts:
        raise ValueError(f"line {start}: the last instruction ends with a line continuation")
    return out


def instructions(path: Path, keyword: str) -> list[Instruction]:
    return [i for i in parse_dockerfile(path.read_text()) if i.keyword == keyword]


def test_parser_joins_continuations_and_drops_comments():
    text = (
        "# syntax=docker/dockerfile:1\n"
        "FROM python:3.11.14-slim AS base\n"
        "RUN a \\\n"
        "    # a comment inside the continuation\n"
        "    && b \\\n"
        "    && c\n"
        'HEALTHCHECK --interval=5s --timeout=2s CMD ["python3", "/x.py"]\n'
        "env A=1\n"
    )
    got = parse_dockerfile(text)
    assert [(i.keyword, i.line) for i in got] == [("FROM", 2), ("RUN", 3), ("HEALTHCHECK", 7), ("ENV", 8)]
    assert got[1].args == "a && b && c"
    assert got[2].exec_form() == ["python3", "/x.py"]
    with pytest.raises(ValueError, match="line 1"):
        parse_dockerfile("RUN a \\\n")


# ---------------------------------------------------------------- Dockerfiles


def test_ngc_base_is_the_pinned_image_constant():
    (base,) = instructions(NGC_DOCKERFILE, "FROM")
    assert base.args.split()[0] == trtllm.NGC_TRITON_TRTLLM_IMAGE


@pytest.mark.parametrize("path", [NGC_DOCKERFILE, CPU_DOCKERFILE], ids=lambda p: p.name)
def test_every_base_is_pinned(path):
    bases = instructions(path, "FROM")
    assert bases
    for base in bases:
        image = base.args.split()[0]
        assert "$" not in image, f"{path.name}:{base.line}: the base must be literal, not {image}"
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag, f"{path.name}:{base.line}: {image} has no tag"
        assert tag != "latest", f"{path.name}:{base.line}: {image} is not pinned"
        # A version number in the tag (26.07-..., 3.11.14-...), not a moving alias such as "slim".
        assert re.match(r"^\d+\.\d+", tag), f"{path.name}:{base.line}: {image} has no version in its tag"


def test_cpu_base_is_a_full_python_version():
    (base,) = instructions(CPU_DOCKERFILE, "FROM")
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-bookworm", base.args.split()[0])


@pytest.mark.parametrize("path", [NGC_DOCKERFILE, CPU_DOCKERFILE], ids=lambda p: p.name)
def test_healthcheck_asks_ready_endpoint(path):
    (check,) = instructions(path, "HEALTHCHECK")
    argv = check.exec_form()
    assert argv and argv[-1] == "/opt/trtspec/healthcheck.py", check.args
    assert "--start-period=" in check.args  # the first start builds engines
    assert healthcheck.READY_PATH == "/v2/health/ready"
    assert healthcheck.ready_url({"TRTSPEC_HTTP_PORT": "8123"}) == "http://127.0.0.1:8123/v2/health/ready"
    assert healthcheck.ready_url({}) == "http://127.0.0.1:8000/v2/health/ready"


def test_healthcheck_fails_when_nothing_listens():
    from trtspec.triton_repo.server import free_ports

    (port,) = free_ports(1)
    env = {**os.environ, "TRTSPEC_HTTP_PORT": str(port)}
    result = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f"127.0.0.1:{port}/v2/health/ready" in result.stderr


@pytest.mark.parametrize(
    ("path", "user"), [(NGC_DOCKERFILE, "triton-server"), (CPU_DOCKERFILE, "trtspec")], ids=["ngc", "cpu"]
)
def test_runs_as_non_root(path, user):
    users = instructions(path, "USER")
    assert users, f"{path.name} has no USER"
    assert users[-1].args == user
    assert users[-1].args not in ("root", "0", "0:0")
    # Nothing after the final USER switches back (every later RUN would run as root).
    last = parse_dockerfile(path.read_text()).index(users[-1])
    assert not [i for i in parse_dockerfile(path.read_text())[last:] if i.keyword == "RUN"]


def env_pairs(inst: Instruction) -> list[tuple[str, str]]:
    """(name, value) of an ENV/ARG instruction: `ENV A=1 B="x y"`, `ENV A 1` or `ARG A[=default]`."""
    words = shlex.split(inst.args)
    if inst.keyword == "ENV" and len(words) >= 2 and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [(w.partition("=")[0], w.partition("=")[2]) for w in words]


@pytest.mark.parametrize("path", [NGC_DOCKERFILE, CPU_DOCKERFILE], ids=lambda p: p.name)
def test_no_secrets_baked_in(path):
    for inst in instructions(path, "ENV") + instructions(path, "ARG"):
        for name, value in env_pairs(inst):
            assert not (SECRET_NAME.search(name) and value), (
                f"{path.name}:{inst.line}: {name} carries a value"
            )
    assert "hf_" not in path.read_text()  # no Hugging Face token anywhere


def test_ngc_pip_install_is_constrained_by_the_image_freeze():
    runs = instructions(NGC_DOCKERFILE, "RUN")
    freeze = next(
        i
        for i, r in enumerate(runs)
        if "pip list --format=freeze > /opt/trtspec/image-packages.txt" in r.args
    )
    assert (
        "check_pins.py constraints /opt/trtspec/image-packages.txt /opt/trtspec/image-constraints.txt"
        in runs[freeze].args
    )
    installs = [i for i, r in enumerate(runs) if re.search(r"pip install\b", r.args)]
    assert installs, "the NGC Dockerfile installs trtspec with pip"
    for i in installs:
        assert i > freeze, "the freeze must be taken before anything is installed"
        assert "-c /opt/trtspec/image-constraints.txt" in runs[i].args, runs[i].args
        assert '"/opt/trtspec/src[convert]"' in runs[i].args, "the image converts: the convert extra"
        assert "--upgrade" not in runs[i].args and "-U " not in runs[i].args
    compare = next(i for i, r in enumerate(runs) if "check_pins.py compare" in r.args)
    assert compare > max(installs)
    for name in ("torch", "transformers", "nvidia-modelopt", "tensorrt_llm"):
        assert re.search(rf"--require[^&]*\b{re.escape(name)}\b", runs[compare].args)
    assert "version_problem" in " ".join(r.args for r in runs)  # the image's TRT-LLM matches the pin


def test_cpu_image_uses_the_cpu_torch_wheel_and_project_constraints():
    runs = " ".join(r.args for r in instructions(CPU_DOCKERFILE, "RUN"))
    assert "--index-url https://download.pytorch.org/whl/cpu" in runs
    assert "-c /opt/trtspec/src/constraints.txt" in runs and "-c /opt/trtspec/image-constraints.txt" in runs
    assert '"/opt/trtspec/src[convert]"' in runs  # the image converts: the convert extra
    assert "check_pins.py compare" in runs and "torch.version.cuda" in runs


@pytest.mark.parametrize("path", [NGC_DOCKERFILE, CPU_DOCKERFILE], ids=lambda p: p.name)
def test_entrypoint_stop_signal_and_ports(path):
    (entry,) = instructions(path, "ENTRYPOINT")
    assert entry.exec_form()[-1] == "/opt/trtspec/entrypoint.sh"
    assert [i.args for i in instructions(path, "STOPSIGNAL")] == ["SIGINT"]
    assert [i.args for i in instructions(path, "EXPOSE")] == ["8000 8001 8002"]


def ignore_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex over slash paths: ``**`` any folders, ``*`` / ``?`` within a name."""
    out = "(?:.*/)?" if pattern.startswith("**/") else ""
    body = pattern[3:] if pattern.startswith("**/") else pattern
    for token in re.split(r"(\*\*|\*|\?)", body):
        out += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return out


def dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    allowed = True
    for pattern in patterns:
        regex = ignore_regex(pattern.removeprefix("!").rstrip("/"))
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            allowed = pattern.startswith("!")
    return allowed


def test_dockerignore_sends_only_what_the_images_copy():
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = set()
    for path in (NGC_DOCKERFILE, CPU_DOCKERFILE):
        for inst in instructions(path, "COPY"):
            sources.update(w for w in inst.args.split()[:-1] if not w.startswith("--"))
    for src in sorted(sources):
        probe = "src/trtspec/cli.py" if src == "src" else src
        assert dockerignore_allows(probe, patterns), f"COPY {src} is excluded by .dockerignore"
        if src != "README.md":  # written by the package owner; pyproject.toml needs it
            assert (REPO_ROOT / src).exists(), f"COPY {src}: no such file"
    for excluded in (
        ".venv/bin/python",
        ".git/HEAD",
        "engines/demo/manifest.json",
        "triton_repo/demo/trtspec.json",
        "tests/test_docker.py",
        "src/trtspec/__pycache__/cli.cpython-311.pyc",
    ):
        assert not dockerignore_allows(excluded, patterns), f"{excluded} would be sent to the Docker daemon"


# ---------------------------------------------------------------- compose.yaml


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_gpu_service(compose):
    gpu = compose["services"]["trtspec"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile"
    assert gpu["shm_size"] and gpu["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert gpu["stop_signal"] == "SIGINT" and gpu["init"] is True


def test_compose_cpu_service_is_under_a_profile(compose):
    cpu = compose["services"]["trtspec-cpu"]
    assert cpu["profiles"] == ["cpu"]
    assert cpu["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert "deploy" not in cpu
    assert "profiles" not in compose["services"]["trtspec"]


def parse_volume(short: str) -> tuple[str, str]:
    """(container path, "ro"/"rw") of a short-syntax volume; the source may be a ${VAR:-default}."""
    match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(\w+))?", short)
    assert match, f"cannot read volume {short!r}"
    return match.group(2), "ro" if match.group(3) == "ro" else "rw"


def trtspec_services(compose) -> dict:
    """The services built from this repository (the monitoring ones run upstream images)."""
    return {name: s for name, s in compose["services"].items() if "build" in s}


def test_compose_services_are_safe_and_pinned(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image} is not pinned"
        for port in service["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{name}: port {port} is published beyond loopback"
        for key, value in (service.get("environment") or {}).items():
            assert not (SECRET_NAME.search(key) and value), f"{name}: {key} carries a value"
    for name, service in trtspec_services(compose).items():
        context = (COMPOSE.parent / service["build"]["context"]).resolve()
        assert context == REPO_ROOT and (context / service["build"]["dockerfile"]).is_file()
        assert service["healthcheck"]["test"][-1] == "/opt/trtspec/healthcheck.py"
        assert service["healthcheck"]["start_period"]
        mounts = dict(parse_volume(v) for v in service["volumes"])
        assert mounts["/workspace/models"] == "ro", f"{name}: models must be mounted read-only"
        assert mounts["/workspace/triton_repo"] == "rw"
    assert "latest" not in COMPOSE.read_text()


def bind_mounts(service) -> dict[str, Path]:
    """{container path: host path} of a service's bind mounts (sources relative to docker/)."""
    out = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = (COMPOSE.parent / source).resolve()
    return out


def test_monitoring_profile_scrapes_the_servers_and_provisions_the_dashboard(compose):
    """Parsed, not run: Prometheus scrapes every trtspec service's metrics port on the compose network, Grafana's
    provisioned datasource is that Prometheus, and the dashboard asks only for metrics the entry models export."""
    from trtspec.triton_repo.models import triton_io

    services = compose["services"]
    monitoring = {name for name, s in services.items() if s.get("profiles") == ["monitoring"]}
    assert monitoring == {"prometheus", "grafana"}
    prometheus, grafana = services["prometheus"], services["grafana"]
    prom_files = bind_mounts(prometheus)
    scrape = yaml.safe_load(prom_files["/etc/prometheus/prometheus.yml"].read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    targets = {t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    # the metrics port inside each trtspec container: the third published port, which the entrypoint serves on
    want = {f"{name}:{s['ports'][2].rsplit(':', 1)[1]}" for name, s in trtspec_services(compose).items()}
    assert targets == want and all(t.endswith(":8002") for t in targets)
    assert "TRTSPEC_METRICS_PORT:-8002" in ENTRYPOINT.read_text()

    graf_files = bind_mounts(grafana)
    provisioning = graf_files["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    prom_port = prometheus["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{prom_port}" and source["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "trtspec.yaml").read_text())["providers"]
    dashboards = graf_files[provider["options"]["path"]]
    (dashboard_file,) = dashboards.glob("*.json")
    dashboard = json.loads(dashboard_file.read_text())

    exported = {f"{triton_io.SPEC_DECODE_PREFIX}{f}_total" for f in triton_io.SPEC_DECODE_COUNTERS}
    exported |= {triton_io.DRAFT_LEN_GAUGE, triton_io.REQUESTS_FINISHED, triton_io.REQUESTS_REFUSED}
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(trtspec_\w+|nv_\w+)", e)}
    assert used <= exported, used - exported
    assert exported <= used  # every exported metric is on a panel
    uids = {p["datasource"]["uid"] for p in dashboard["panels"]} | {
        t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]
    }
    assert uids == {source["uid"]}


# ---------------------------------------------------------------- check_pins.py

NGC_LIKE_FREEZE = """\
torch==2.9.0a0+145a3a7bda.nv25.10
transformers==4.57.3
nvidia-modelopt==0.37.0
tensorrt_llm==1.2.1
numpy==1.26.4
python-apt==2.7.7ubuntu4
"""


def test_constraints_keep_pip_readable_pins_and_list_the_rest():
    text, left_out = check_pins.constraints_text(NGC_LIKE_FREEZE)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert "torch==2.9.0a0+145a3a7bda.nv25.10" in lines and "tensorrt_llm==1.2.1" in lines
    assert len(lines) == 5
    assert left_out == ["python-apt==2.7.7ubuntu4"]


def test_compare_reports_changed_removed_and_added():
    after = (
        NGC_LIKE_FREEZE.replace("torch==2.9.0a0+145a3a7bda.nv25.10", "torch==2.9.1").replace(
            "numpy==1.26.4\n", ""
        )
        + "click==8.3.0\n"
    )
    report, problems = check_pins.compare(
        NGC_LIKE_FREEZE, after, ["torch", "Nvidia_ModelOpt", "tritonclient"]
    )
    assert report[0] == "torch: 2.9.0a0+145a3a7bda.nv25.10 -> 2.9.1"
    assert report[1] == "Nvidia_ModelOpt: 0.37.0 -> 0.37.0"
    assert report[-1] == "added 1 package(s): click==8.3.0"
    assert sorted(problems) == [
        "numpy 1.26.4 was removed",
        "torch changed 2.9.0a0+145a3a7bda.nv25.10 -> 2.9.1",
        "tritonclient is not installed (required)",
    ]
    _, none = check_pins.compare(NGC_LIKE_FREEZE, NGC_LIKE_FREEZE + "click==8.3.0\n", ["torch"])
    assert none == []


def test_check_pins_cli_exit_status(tmp_path, capsys):
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text(NGC_LIKE_FREEZE)
    after.write_text(NGC_LIKE_FREEZE + "rich==14.0.0\n")
    assert check_pins.main(["compare", str(before), str(after), "--require", "torch"]) == 0
    after.write_text(NGC_LIKE_FREEZE.replace("transformers==4.57.3", "transformers==4.58.0"))
    assert check_pins.main(["compare", str(before), str(after)]) == 1
    assert "transformers changed 4.57.3 -> 4.58.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "version",
    [
        "2.9.0a0+145a3a7bda.nv25.10",
        "1.26.4",
        "10.14.1.48",
        "2!1.0.post2.dev3",
        "0.37.0rc1",
        "1.2.1+cu130",
        "2.7.7ubuntu4",
        "1.0-beta-",
        "1..2",
        "7.1+",
        "latest",
    ],
)
def test_pin_grammar_agrees_with_packaging(version):
    """check_pins' PEP 440 pattern (stdlib only, it runs before anything is installed) vs pip's own parser."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
        valid = True
    except InvalidVersion:
        valid = False
    assert bool(check_pins._PIN.match(f"pkg=={version}")) is valid


def test_constraints_of_this_venv_are_satisfied_by_it(tmp_path):
    """The venv's own freeze -> constraints: every line is a pin that pip reads and the installed version meets."""
    from importlib.metadata import version as installed_version

    from packaging.requirements import Requirement

    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "freeze.txt").write_text(freeze)
    cons = tmp_path / "constraints.txt"
    assert check_pins.main(["constraints", str(tmp_path / "freeze.txt"), str(cons)]) == 0
    pins = [Requirement(line) for line in cons.read_text().splitlines() if line and not line.startswith("#")]
    assert {"torch", "transformers"} <= {check_pins.normalize(r.name) for r in pins}
    for req in pins:
        (spec,) = req.specifier
        assert spec.operator == "=="
        assert req.specifier.contains(installed_version(req.name), prereleases=True), req


# ---------------------------------------------------------------- entrypoint.sh


def test_entrypoint_is_valid_bash_and_strict():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    text = ENTRYPOINT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert not re.search(r"\beval\b", text)
    assert re.search(r"^\s*exec trtspec serve ", text, re.MULTILINE)
    assert os.access(ENTRYPOINT, os.X_OK)


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt: shellcheck)"
)
def test_entrypoint_passes_shellcheck():
    result = subprocess.run(
        ["shellcheck", "--severity=style", str(ENTRYPOINT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def entrypoint_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of the entry point on this machine: the venv's trtspec and python3 first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTSPEC_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        TRTSPEC_ENGINES_DIR=str(tmp_path / "engines"),
        TRTSPEC_REPO_DIR=str(tmp_path / "repos"),
        TRTSPEC_HOST="127.0.0.1",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    env.update(extra)
    return env


def write_tiny_recipe(tmp_path: Path, tiny_pair, runtime: str = "torch") -> Path:
    target, draft = tiny_pair
    recipe = {
        "name": "tiny-docker",
        "target": {"model": str(target), "dtype": "float16"},
        "draft": {"model": str(draft), "dtype": "float16"},
        "speculative": {"max_draft_len": 4, "num_draft_tokens": 3},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        # decoupled: false so that the plain HTTP generate endpoint answers with one response.
        "triton": {"runtime": runtime, "device": "cpu", "decoupled": False},
    }
    path = tmp_path / "recipes" / "recipe.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_entrypoint(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_entrypoint_with_arguments_runs_them_instead(tmp_path):
    result = run_entrypoint(entrypoint_env(tmp_path), "trtspec", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("trtspec")
    assert "1/4" not in result.stderr


def test_entrypoint_stops_on_a_bad_recipe(tmp_path):
    env = entrypoint_env(tmp_path, TRTSPEC_RECIPE=str(tmp_path / "missing.yaml"))
    result = run_entrypoint(env)
    assert result.returncode == 2
    assert "missing.yaml" in result.stderr and "Traceback" not in result.stderr
    assert "2/4" not in result.stderr


def test_entrypoint_refuses_an_unknown_runtime_before_any_work(tmp_path):
    result = run_entrypoint(entrypoint_env(tmp_path, TRTSPEC_RECIPE="demo", TRTSPEC_RUNTIME="vllm"))
    assert result.returncode == 2, result.stderr
    assert "TRTSPEC_RUNTIME='vllm' is not a runtime" in result.stderr
    assert "1/4" not in result.stderr
    assert not (tmp_path / "repos").exists()


FAKE_TRTSPEC = """#!{python}
# Stand-in for trtspec: check passes, build runs until a signal (recording which), deploy records that it ran.
import os, signal, sys, time
record = os.environ["FAKE_TRTSPEC_RECORD"]
def note(text):
    with open(record, "a") as f:
        f.write(text + "\\n")
command = sys.argv[1]
if command == "build":
    def stop(signum, frame):
        note("build got " + signal.Signals(signum).name)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    note("build started")
    for _ in range(600):  # short sleeps: a signal landing just before a long one would wait it out
        time.sleep(0.1)
    note("build ran out")
elif command == "deploy":
    note("deploy ran")
"""


def _as_an_init_starts_it() -> None:
    """The entry point's signal state as tini or docker starts it: INT and TERM at their defaults, none blocked
    (a test runner started in the background passes SIGINT on ignored, which no shell can trap)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_during_a_step_reaches_it_and_ends_the_entry_point(tmp_path, sent, status):
    """tini and `docker stop` signal the entry point's shell only: the build it runs must stop too (neither run
    on nor be orphaned), and no later step may start."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtspec").write_text(FAKE_TRTSPEC.format(python=sys.executable))
    (bin_dir / "trtspec").chmod(0o755)
    record = tmp_path / "record.txt"
    env = entrypoint_env(tmp_path, TRTSPEC_RECIPE="demo", TRTSPEC_RUNTIME="tensorrtllm")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"  # python3 (and the package) stay the venv's
    env["FAKE_TRTSPEC_RECORD"] = str(record)
    proc = subprocess.Popen(
        ["bash", str(ENTRYPOINT)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_an_init_starts_it,
    )
    try:
        deadline = time.monotonic() + 60
        while not (record.exists() and "build started" in record.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(sent)
        assert proc.wait(timeout=30) == status, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert record.read_text().splitlines() == ["build started", "build got SIGTERM"]
    assert f"stopped by {sent.name} during: trtspec build" in proc.stderr.read()


@pytest.mark.slow
@pytest.mark.conversion
def test_entrypoint_tensorrtllm_without_tensorrt_llm_exits_3(tmp_path, tiny_pair):
    """Here tensorrt_llm is absent: build converts the checkpoints, then the entry point stops with exit 3."""
    recipe = write_tiny_recipe(tmp_path, tiny_pair, runtime="tensorrtllm")
    result = run_entrypoint(entrypoint_env(tmp_path, TRTSPEC_RECIPE=str(recipe)), timeout=400)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "tensorrt_llm is not importable in this image" in result.stderr
    assert (tmp_path / "engines" / "tiny-docker" / "target" / "checkpoint" / "config.json").is_file()
    assert "3/4" not in result.stderr and not (tmp_path / "repos").exists()


@pytest.mark.slow
def test_entrypoint_trtllm_pytorch_builds_deploys_and_stops_at_serve_without_the_image(tmp_path, tiny_pair):
    """trtllm-pytorch: build (no engines: the HF checkpoints are served), deploy upstream's LLM-API model, then
    serve refuses in one line because upstream's model.py ships only in the NGC image."""
    recipe = write_tiny_recipe(tmp_path, tiny_pair, runtime="trtllm-pytorch")
    env = entrypoint_env(
        tmp_path, TRTSPEC_RECIPE=str(recipe), TRTSPEC_LLMAPI_MODEL_DIR=str(tmp_path / "none")
    )
    result = run_entrypoint(env, timeout=300)
    assert "2/4 build: ModelOpt HF checkpoints of quantized models" in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "engines" / "tiny-docker" / "manifest.json").is_file()
    model_yaml = tmp_path / "repos" / "tiny-docker" / "tensorrt_llm" / "1" / "model.yaml"
    assert yaml.safe_load(model_yaml.read_text())["model"] == str(tiny_pair[0].resolve())
    assert (
        result.returncode == 2
        and "upstream's LLM-API model (model.py + helpers.py) not found" in result.stderr
    )
    assert "Traceback" not in result.stderr


def process_start(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/PID/stat), None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every live descendant of ``root`` (tritonserver runs in its own session)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        start = process_start(pid)
        if start is not None:
            found[pid] = start
        todo.extend(children.get(pid, []))
    return found


def still_alive(processes: dict[int, str]) -> list[int]:
    return [pid for pid, start in processes.items() if process_start(pid) == start]


def log_tail(tmp_path: Path, chars: int = 3000) -> str:
    """The end of the entry point's output and of the tritonserver log beside the repository."""
    texts = [p.read_text(errors="replace")[-chars:] for p in (tmp_path / "entrypoint.log",) if p.exists()]
    texts += [
        p.read_text(errors="replace")[-chars:] for p in (tmp_path / "repos").glob(".*.tritonserver.log")
    ]
    return "\n---\n".join(texts)


def wait_healthy(env: dict[str, str], proc: subprocess.Popen, timeout_s: float, tmp_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"entry point exited {proc.returncode} before ready:\n{log_tail(tmp_path)}")
        check = subprocess.run([sys.executable, str(DOCKER / "healthcheck.py")], env=env, capture_output=True)
        if check.returncode == 0:
            return
        time.sleep(1.0)
    raise AssertionError(f"not ready within {timeout_s:.0f} s:\n{log_tail(tmp_path)}")


@pytest.mark.server
@pytest.mark.slow
def test_entrypoint_serves_the_torch_runtime_end_to_end(tmp_path, tiny_pair):
    """check -> deploy -> serve on loopback ports; ready; one generate request; SIGINT stops everything."""
    from trtspec.triton_repo.server import free_ports

    recipe = write_tiny_recipe(tmp_path, tiny_pair)
    http, grpc, metrics = free_ports(3)
    env = entrypoint_env(
        tmp_path,
        TRTSPEC_RECIPE=str(recipe),
        TRTSPEC_HTTP_PORT=str(http),
        TRTSPEC_GRPC_PORT=str(grpc),
        TRTSPEC_METRICS_PORT=str(metrics),
    )
    log = open(tmp_path / "entrypoint.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        ["bash", str(ENTRYPOINT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    children: dict[int, str] = {}
    try:
        wait_healthy(env, proc, timeout_s=240, tmp_path=tmp_path)
        body = json.dumps({"text_input": "def add(a, b):", "max_tokens": 8, "num_draft_tokens": 3}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/tensorrt_llm_bls/generate", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        assert isinstance(answer["text_output"], str) and answer["text_output"]
        children = descendants(proc.pid)
        assert any("tritonserver" in Path(f"/proc/{pid}/cmdline").read_text() for pid in children)
        os.kill(proc.pid, signal.SIGINT)  # the entry point exec'd trtspec serve: this pid is the launcher
        status = proc.wait(timeout=60)
        deadline = time.monotonic() + 20
        while still_alive(children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert still_alive(children) == [], "processes of the entry point outlived it"
        # tritonserver exits 1 ("Exit timeout expired") when its models take longer to unload than
        # serve's --exit-timeout-secs: a stop the user asked for must still end cleanly.
        assert status == 0, f"exit {status} after SIGINT:\n{log_tail(tmp_path)}"
    finally:
        leftovers = still_alive(children) + ([proc.pid] if proc.poll() is None else [])
        for pid in leftovers:  # only processes this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        log.close()
    text = (tmp_path / "entrypoint.log").read_text(errors="replace")
    order = [text.index(f"{n}/4") for n in (1, 2, 3, 4)]
    assert order == sorted(order), text[-3000:]
    assert (tmp_path / "repos" / "tiny-docker" / "trtspec.json").is_file()
