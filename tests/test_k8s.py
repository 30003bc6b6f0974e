"""`trtspec deploy --k8s`: the rollout's manifests against the Kubernetes schemas (kubernetes-validate) and the
CRDs' own schemas (tests/k8s_crds), rendered by kustomize, rules checked by promtool, the recording rules
evaluated on a real server's /metrics, the canary gate run against it, and bad values refused before writing."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trtspec import __version__
from trtspec.cli import cli
from trtspec.recipe import ASSETS_DIR, DEMO_RECIPE, load_recipe
from trtspec.triton_repo.k8s import write_rollout
from trtspec.triton_repo.k8s.monitoring import ACCEPTANCE_RATIO, QUEUE_COMPUTE_RATIO, TOKENS_PER_ROUND
from trtspec.triton_repo.k8s.plan import plan_rollout
from trtspec.triton_repo.k8s.workloads import gate_args

pytestmark = pytest.mark.one_stack  # manifests and the canary gate over HTTP

CRDS = Path(__file__).parent / "k8s_crds"
K8S_VERSION = "1.33"  # a current release; kubernetes-validate bundles its schemas
CORE_KINDS = {
    "ConfigMap",
    "PersistentVolumeClaim",
    "Job",
    "Deployment",
    "Service",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
}

PAIR_8B_1B = """\
name: llama-8b-1b
target: {model: /workspace/models/Llama-3.1-8B-Instruct, dtype: bfloat16, tp_size: 2}
draft: {model: /workspace/models/Llama-3.2-1B-Instruct, dtype: bfloat16}
speculative: {max_draft_len: 4}
limits: {max_batch_size: 16, max_input_len: 2048, max_seq_len: 4096}
triton: {runtime: tensorrtllm}
kubernetes:
  models_pvc: hf-models
  image: registry.example.com/trtspec:0.1.0-trtllm1.2.1
  gpus: 2
  min_acceptance: 0.55
  min_exact_match: 0.98
  namespace: llm
  monitoring_labels: {release: prometheus}
"""


def write_recipe(tmp_path: Path, text: str, name: str = "pair.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def demo_with(tmp_path: Path, kubernetes: dict | None = None, **sections) -> Path:
    """The shipped demo recipe's text plus ``kubernetes`` (and other sections replaced), in tmp_path."""
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    data.update(sections)
    if kubernetes is not None:
        data["kubernetes"] = kubernetes
    return write_recipe(tmp_path, yaml.safe_dump(data), "demo.yaml")


def rollout(tmp_path: Path, recipe: Path | str, runtime: str | None = None) -> tuple[Path, dict[str, object]]:
    """Write the rollout; (its folder, every YAML file parsed: path -> object)."""
    out = tmp_path / "kubernetes"
    write_rollout(load_recipe(recipe, check_paths=False), runtime, out)
    files = {str(p.relative_to(out)): yaml.safe_load(p.read_text()) for p in sorted(out.rglob("*.yaml"))}
    return out, files


def manifests(files: dict) -> dict[str, dict]:
    return {path: obj for path, obj in files.items() if "kind" in obj and obj["kind"] != "Kustomization"}


def by_kind(files: dict, kind: str) -> list[dict]:
    return [obj for obj in manifests(files).values() if obj["kind"] == kind]


# ---------------------------------------------------------------- schemas


def strict(schema):
    """A CRD's structural schema as Kubernetes' strict field validation applies it: objects with properties take
    no other keys (unless the schema keeps unknown fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    keeps_unknown = out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def crd_errors(obj: dict) -> list[str]:
    """The object checked against its CRD's v1 schema."""
    import jsonschema

    name = obj["kind"].lower()
    doc = json.loads((CRDS / f"{name}.json").read_text())
    assert obj["apiVersion"] == f"{doc['group']}/{doc['version']}"
    validator = jsonschema.Draft7Validator(strict(doc["schema"]))
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def check_schemas(files: dict) -> None:
    import kubernetes_validate

    for path, obj in manifests(files).items():
        if obj["kind"] in CORE_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)  # raises, naming the field
        else:
            assert not crd_errors(obj), (path, crd_errors(obj))


def test_crd_check_can_fail():
    """The CRD schemas are strict enough to catch a misspelt or misplaced field."""
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "metrics", "intervall": "15s"}]},
    }
    assert any("intervall" in e for e in crd_errors(monitor))
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "r"},
        "spec": {"groups": [{"name": "g", "rules": [{"record": "x", "expr": "1", "for": 5}]}]},
    }
    assert crd_errors(rule)


# ---------------------------------------------------------------- the two recipes of the issue


def test_demo_rollout_torch_on_cpu_is_schema_valid(tmp_path):
    out, files = rollout(tmp_path, "demo")
    check_schemas(files)
    (deployment,) = [o for p, o in files.items() if p == "overlays/production/deployment.yaml"]
    pod = deployment["spec"]["template"]["spec"]
    (triton,) = pod["containers"]
    assert "resources" not in triton and "tolerations" not in pod  # no GPU on a CPU cluster
    assert triton["image"].endswith("-cpu") and ":" in triton["image"]
    assert not by_kind(files, "Job")[1:]  # the canary gate only: torch builds nothing
    assert "base/build-job.yaml" not in files and "base/engines-pvc.yaml" not in files
    # the demo's models ship in the image: no models volume
    assert all(v["name"] != "models" for v in pod["volumes"])
    recipe_map = files["base/recipe-configmap.yaml"]
    assert recipe_map["data"]["recipe.yaml"] == DEMO_RECIPE.read_text()
    marker = json.loads((out / "trtspec-rollout.json").read_text())
    assert marker["runtime"] == "torch" and marker["gpus_per_replica"] == 0


def test_8b_1b_tensorrtllm_tp2_rollout(tmp_path):
    """GPUs = TP x PP on every pod that runs the engines, the pinned image, probes and ports, the build Job that
    runs once per recipe and image, and the serving pods held until its marker exists."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    check_schemas(files)
    image = "registry.example.com/trtspec:0.1.0-trtllm1.2.1"
    deployment = files["overlays/production/deployment.yaml"]
    pod = deployment["spec"]["template"]["spec"]
    (triton,) = pod["containers"]
    assert triton["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert triton["image"] == image
    assert {p["name"]: p["containerPort"] for p in triton["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    script = triton["args"][2]
    assert "trtspec deploy" in script and "--runtime tensorrtllm" in script and "exec trtspec serve" in script
    assert "--grpc-port 8001" in script
    build = files["base/build-job.yaml"]
    (builder,) = build["spec"]["template"]["spec"]["containers"]
    build_script = builder["args"][2]
    assert builder["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert build_script.index("trtspec check") < build_script.index("trtspec build")
    (marker,) = re.findall(r"^marker=(\S+)$", build_script, re.M)
    # each key builds into, and serves from, a folder of its own: a canary's build never overwrites production's
    key = json.loads((tmp_path / "kubernetes" / "trtspec-rollout.json").read_text())["key"]
    engines = f"/workspace/engines/{key}"
    assert marker.startswith(engines + "/") and 'if [ -f "$marker" ]' in build_script
    assert f"--engines-dir {engines}\n" in build_script and f"--engines-dir {engines} " in script
    assert "--timeout 3600" in script  # serve waits as long as the startup probe allows
    (wait,) = pod["initContainers"]
    assert marker in wait["args"][2] and build["metadata"]["name"] in wait["args"][2]
    # the HPA owns the production replica count: an apply must not scale it back
    assert (
        "replicas" not in deployment["spec"]
        and files["overlays/canary/deployment.yaml"]["spec"]["replicas"] == 1
    )
    for manifest in (deployment, build):
        template = manifest["spec"]["template"]["spec"]
        assert (
            template["securityContext"]["runAsNonRoot"] and template["securityContext"]["runAsUser"] == 1000
        )
        for container in containers(template):
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"hf-models", files["base/engines-pvc.yaml"]["metadata"]["name"]}
    assert deployment["metadata"]["annotations"]["trtspec.dev/recipe-digest"] in build_script
    # the same recipe for another image is another build
    other = tmp_path / "other"
    other.mkdir()
    text = PAIR_8B_1B.replace("trtspec:0.1.0-trtllm1.2.1", "trtspec:0.1.1-trtllm1.2.1")
    _, files2 = rollout(other, write_recipe(other, text))
    assert files2["base/build-job.yaml"]["metadata"]["name"] != build["metadata"]["name"]
    assert (
        f"/workspace/engines/{key}/"
        not in files2["base/build-job.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"][2]
    )


def test_a_changed_job_is_a_new_job_and_the_same_engines(tmp_path):
    """A Job's pod template cannot change in place (kubectl apply fails on it): a kubernetes value that reaches a
    Job (a threshold, a node selector) names a new Job, which finds the engines of the same key already built."""
    _, before = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    other = tmp_path / "other"
    other.mkdir()
    text = PAIR_8B_1B.replace("min_acceptance: 0.55", "min_acceptance: 0.5\n  node_selector: {pool: h100}")
    _, after = rollout(other, write_recipe(other, text))
    for path in ("base/build-job.yaml", "overlays/gate/gate-job.yaml"):
        assert after[path]["metadata"]["name"] != before[path]["metadata"]["name"], path
    builds = [
        f["base/build-job.yaml"]["spec"]["template"]["spec"]["containers"][0]["args"][2]
        for f in (before, after)
    ]
    assert [re.findall(r"^marker=(\S+)$", b, re.M) for b in builds][0] == re.findall(
        r"^marker=(\S+)$", builds[1], re.M
    )
    # and rendering the same recipe again names the same Jobs
    again = tmp_path / "again"
    again.mkdir()
    _, same = rollout(again, write_recipe(again, PAIR_8B_1B))
    assert (
        same["base/build-job.yaml"]["metadata"]["name"] == before["base/build-job.yaml"]["metadata"]["name"]
    )
    # the longest app (40 characters) still names every object within Kubernetes' 63
    longest = PAIR_8B_1B.replace("  gpus: 2\n", "  gpus: 2\n  app: " + "a" * 40 + "\n")
    far = tmp_path / "far"
    far.mkdir()
    _, named = rollout(far, write_recipe(far, longest))
    names = [o["metadata"]["name"] for o in manifests(named).values()]
    assert max(len(n) for n in names) <= 63 and any(len(n) == 63 for n in names), names


def test_a_keys_first_build_starts_from_hard_links_to_the_recipes_last(tmp_path, monkeypatch):
    """The build Job's script, run for real with a stand-in trtspec: a new key's folder is seeded from the newest
    earlier build of the recipe (so trtspec build skips what did not change), the earlier build's files are
    shared, not copied or changed, its logs stay behind, and the marker is written last."""
    import trtspec.triton_repo.k8s.plan as plan_module
    from trtspec.triton_repo.k8s.workloads import build_script

    root = tmp_path / "engines"
    monkeypatch.setattr(plan_module, "ENGINES_MOUNT", str(root))
    recipe = write_recipe(tmp_path, PAIR_8B_1B)
    plan = plan_rollout(load_recipe(recipe, check_paths=False), None, PAIR_8B_1B)
    older, newer = root / "0000000000" / "llama-8b-1b", root / "1111111111" / "llama-8b-1b"
    for folder, stamp in ((older, 100), (newer, 200)):
        (folder / "target" / "engine").mkdir(parents=True)
        (folder / "target" / "engine" / "rank0.engine").write_text(folder.parent.name)
        (folder / "logs").mkdir()
        (folder / "logs" / "trtllm-build.log").write_text("log")
        os.utime(folder, (stamp, stamp))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtspec").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n')
    (bin_dir / "trtspec").chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TRTSPEC_RECIPE": str(recipe), "CALLS": str(calls)}
    run = subprocess.run(
        ["bash", "-c", build_script(plan)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    seeded = Path(plan.engines_dir) / "llama-8b-1b" / "target" / "engine" / "rank0.engine"
    shared = newer / "target" / "engine" / "rank0.engine"
    assert seeded.read_text() == "1111111111" and seeded.stat().st_ino == shared.stat().st_ino
    assert not (Path(plan.engines_dir) / "llama-8b-1b" / "logs").exists() and (newer / "logs").is_dir()
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["check", "build"]
    assert f"--engines-dir {plan.engines_dir}" in calls.read_text() and Path(plan.engines_marker).is_file()
    assert not list(root.glob(".seeding-*"))
    # run again: the marker says the engines are there, so nothing runs
    calls.unlink()
    again = subprocess.run(
        ["bash", "-c", build_script(plan)], env=env, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0 and "nothing to build" in again.stdout and not calls.exists()


def test_written_manifests_carry_no_yaml_anchors(tmp_path):
    out, _ = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    assert not [p for p in out.rglob("*.yaml") if re.search(r"[&*]id\d{3}", p.read_text())]


def test_an_app_name_starts_with_a_letter(tmp_path, runner):
    """Services are RFC 1035 labels: a recipe named 8b-1b gets app trtspec-8b-1b, and kubernetes.app: 8b is
    refused by name."""
    text = PAIR_8B_1B.replace("name: llama-8b-1b", "name: 8b-1b")
    _, files = rollout(tmp_path, write_recipe(tmp_path, text))
    check_schemas(files)
    assert files["base/service.yaml"]["metadata"]["name"] == "trtspec-8b-1b"
    bad = write_recipe(tmp_path, PAIR_8B_1B.replace("  gpus: 2\n", "  gpus: 2\n  app: 8b\n"), "bad.yaml")
    result = runner.invoke(cli, ["deploy", str(bad), "--k8s", str(tmp_path / "out")])
    assert (
        result.exit_code == 2
        and "kubernetes.app" in result.output
        and len(result.output.strip().splitlines()) == 1
    )
    assert not (tmp_path / "out").exists()


def test_trtllm_pytorch_rollout_has_no_rules_on_counters_it_does_not_export(tmp_path):
    text = PAIR_8B_1B.replace("runtime: tensorrtllm", "runtime: trtllm-pytorch")
    _, files = rollout(tmp_path, write_recipe(tmp_path, text))
    check_schemas(files)
    rules = [r for g in files["base/prometheusrule.yaml"]["spec"]["groups"] for r in g["rules"]]
    assert [r.get("record") or r.get("alert") for r in rules] == [
        QUEUE_COMPUTE_RATIO,
        "TrtspecReplicaNotServing",
    ]


def test_docker_files_pin_the_same_ngc_image(tmp_path):
    """The default image is docker/Dockerfile's build, whose FROM is the NGC image recorded on the pods."""
    repo = Path(__file__).resolve().parents[1]
    (base,) = re.findall(r"^FROM (\S+)", (repo / "docker" / "Dockerfile").read_text(), re.M)
    compose = yaml.safe_load((repo / "docker" / "compose.yaml").read_text())
    text = PAIR_8B_1B.replace("  image: registry.example.com/trtspec:0.1.0-trtllm1.2.1\n", "")
    plan = plan_rollout(load_recipe(write_recipe(tmp_path, text), check_paths=False), None, text)
    assert plan.base_image == base
    assert plan.image == compose["services"]["trtspec"]["image"]


def test_monitoring_objects(tmp_path):
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    monitor = files["base/podmonitor.yaml"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    rules = files["base/prometheusrule.yaml"]["spec"]["groups"]
    recorded = {r["record"]: r["expr"] for g in rules for r in g["rules"] if "record" in r}
    assert set(recorded) == {QUEUE_COMPUTE_RATIO, ACCEPTANCE_RATIO, TOKENS_PER_ROUND}
    queue = recorded[QUEUE_COMPUTE_RATIO]
    assert "rate(nv_inference_queue_duration_us{" in queue
    assert "/ clamp_min(" in queue and "rate(nv_inference_compute_infer_duration_us{" in queue
    alerts = {r["alert"]: r for g in rules for r in g["rules"] if "alert" in r}
    assert alerts["TrtspecAcceptanceLow"]["expr"].endswith("< 0.55")
    assert "up{" in alerts["TrtspecReplicaNotServing"]["expr"]
    hpa = files["overlays/production/hpa.yaml"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama-8b-1b"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 4)
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == QUEUE_COMPUTE_RATIO
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "1000m"}
    (rule,) = files["monitoring/prometheus-adapter-values.yaml"]["rules"]["custom"]
    assert (
        rule["seriesQuery"].startswith(QUEUE_COMPUTE_RATIO + "{")
        and rule["name"]["as"] == QUEUE_COMPUTE_RATIO
    )
    # the dashboard is the one docker/compose.yaml's Grafana loads, pointed at the cluster's datasource
    repo_dashboard = json.loads((ASSETS_DIR / "grafana" / "trtspec.json").read_text())
    dashboard = json.loads(files["base/grafana-dashboard.yaml"]["data"]["trtspec.json"])
    assert [p["title"] for p in dashboard["panels"]] == [p["title"] for p in repo_dashboard["panels"]]
    uids = set(re.findall(r'"uid": "([^"]+)"', json.dumps(dashboard["panels"])))
    assert uids == {"prometheus"}


def test_canary_overlay_and_gate(tmp_path):
    """The canary: its own Deployment and Service, the main Service over both tracks, and a gate Job whose command
    line is a `trtspec validate` the CLI parses, against the canary's Service with the recipe's thresholds."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    canary = files["overlays/canary/deployment.yaml"]
    stable = files["overlays/production/deployment.yaml"]
    main, canary_service = files["base/service.yaml"], files["overlays/canary/service.yaml"]
    pod_labels = {
        t: d["spec"]["template"]["metadata"]["labels"] for t, d in (("stable", stable), ("canary", canary))
    }
    selects = lambda service, labels: service["spec"]["selector"].items() <= labels.items()  # noqa: E731
    assert selects(main, pod_labels["stable"]) and selects(main, pod_labels["canary"])
    assert selects(canary_service, pod_labels["canary"]) and not selects(canary_service, pod_labels["stable"])
    assert {p["name"] for p in main["spec"]["ports"]} == {"http", "grpc", "metrics"}
    gate = files["overlays/gate/gate-job.yaml"]
    assert gate["spec"]["backoffLimit"] == 0
    (container,) = gate["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["trtspec", "validate"]
    ctx = cli.commands["validate"].make_context("validate", args[2:])
    params = ctx.params
    assert params["system"] == "triton" and params["url"] == f"{canary_service['metadata']['name']}:8001"
    assert (params["min_acceptance"], params["min_exact_match"]) == (0.55, 0.98)
    assert params["recipe"] == "/workspace/recipes/recipe.yaml" and params["device"] == "cuda"
    # the reference runs on the target's GPUs (tp_size 2), where validate's --device cuda puts it
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}
    # a node drain takes one production pod at a time, and never waits on the canary's
    budget = files["overlays/production/pdb.yaml"]
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels["stable"].items()
    assert not budget["spec"]["selector"]["matchLabels"].items() <= pod_labels["canary"].items()
    assert not [
        p for p in files if p.startswith("overlays/canary/") and "PodDisruptionBudget" in str(files[p])
    ]


MULTI_NODE = PAIR_8B_1B.replace("tp_size: 2}", "tp_size: 16}").replace("gpus: 2", "gpus: 16")


def containers(obj, found=None) -> list[dict]:
    """Every container (init containers too) anywhere in a manifest."""
    found = [] if found is None else found
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers"):
                found += value
            else:
                containers(value, found)
    elif isinstance(obj, list):
        for value in obj:
            containers(value, found)
    return found


@pytest.mark.parametrize("which", ["demo", "8b-1b"])
def test_every_script_in_the_pods_parses(tmp_path, which):
    """bash -n on each container's script, and Python's compiler on the readiness wait."""
    source = {"demo": "demo", "8b-1b": PAIR_8B_1B}[which]
    _, files = rollout(tmp_path, source if source == "demo" else write_recipe(tmp_path, source))
    scripts = 0
    for container in containers(list(manifests(files).values())):
        args = container["args"]
        if args[:2] == ["bash", "-c"]:
            run = subprocess.run(["bash", "-n", "-c", args[2]], capture_output=True, text=True, check=False)
            assert run.returncode == 0, (container["name"], run.stderr)
            scripts += 1
        elif args[:2] == ["python3", "-c"]:
            compile(args[2], container["name"], "exec")
    assert scripts >= 2


SPANS_NODES = {
    # orchestrator mode, with or without fast logits (every rank started by mpirun), is single-node upstream
    "tensorrtllm": MULTI_NODE,
    "tensorrtllm fast logits": MULTI_NODE.replace(
        "runtime: tensorrtllm}", "runtime: tensorrtllm, fast_logits: true}"
    ),
    "trtllm-pytorch": MULTI_NODE.replace("runtime: tensorrtllm", "runtime: trtllm-pytorch"),
}


@pytest.mark.parametrize("case", SPANS_NODES)
def test_a_replica_that_would_span_nodes_is_refused_in_one_line(tmp_path, runner, case):
    """deploy --k8s refuses it before writing anything, and check says so up front, naming the field."""
    from trtspec.builders.preflight import check_nodes

    recipe = write_recipe(tmp_path, SPANS_NODES[case])
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(tmp_path / "out")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "kubernetes.gpus_per_node" in lines[0] and "16 GPUs span 2 nodes of 8" in lines[0]
    assert "on one node" in lines[0] and "use nodes with 16 GPUs" in lines[0]
    assert not (tmp_path / "out").exists()
    ((warning),) = check_nodes(load_recipe(recipe, check_paths=False))
    assert warning.status == "warn" and "kubernetes.gpus_per_node" in warning.message
    fits = SPANS_NODES[case].replace("kubernetes:\n", "kubernetes:\n  gpus_per_node: 16\n")
    assert check_nodes(load_recipe(write_recipe(tmp_path, fits, "fits.yaml"), check_paths=False)) == []


# ---------------------------------------------------------------- bad values: one line, nothing written


BAD = {
    "gpus": ("  gpus: 2\n", "  gpus: 1\n", "kubernetes.gpus: 1 does not match the 2 GPU(s)"),
    "port clash": (
        "triton: {runtime: tensorrtllm}",
        "triton: {runtime: tensorrtllm, grpc_port: 8000}",
        "triton: grpc_port 8000 is also http_port; the server needs three distinct ports",
    ),
    "port 0": (
        "triton: {runtime: tensorrtllm}",
        "triton: {runtime: tensorrtllm, metrics_port: 0}",
        "triton.metrics_port",
    ),
    "missing pvc": (
        "  models_pvc: hf-models\n",
        "",
        "kubernetes.models_pvc: the models are read from /workspace/models",
    ),
    "model outside the volume": (
        "/workspace/models/Llama-3.2-1B-Instruct",
        "/home/me/Llama-3.2-1B-Instruct",
        "draft.model: /home/me/Llama-3.2-1B-Instruct is /home/me/Llama-3.2-1B-Instruct inside the pods",
    ),
    "calibration file outside the volume": (
        "speculative: {max_draft_len: 4}\n",
        "speculative: {max_draft_len: 4}\ncalibration: {dataset: calib.jsonl}\n",
        "calibration.dataset: calib.jsonl is /workspace/recipes/calib.jsonl inside the pods, outside /workspace/models",
    ),
    "threshold": (
        "min_acceptance: 0.55",
        "min_acceptance: 1.5",
        "kubernetes.min_acceptance: Input should be less than",
    ),
    "unpinned image": (":0.1.0-trtllm1.2.1", ":latest", "kubernetes.image: pin a tag other than latest"),
    "replicas": (
        "  gpus: 2\n",
        "  gpus: 2\n  min_replicas: 5\n",
        "kubernetes: min_replicas 5 > max_replicas 4",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_values_are_one_line_errors_and_nothing_is_written(tmp_path, runner, case):
    old, new, says = BAD[case]
    assert old in PAIR_8B_1B
    recipe = write_recipe(tmp_path, PAIR_8B_1B.replace(old, new))
    out = tmp_path / "out"
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {recipe}: "), result.output
    assert says in lines[0]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["pair.yaml"]


def test_deploy_prints_each_apply_command_on_one_line(tmp_path, runner):
    """The commands to copy are whole lines; where a build Job runs, the build-first sequence names the Job and
    the namespace it is waited for in (a serving pod holds its GPUs while it waits for the Job)."""
    out = tmp_path / "a folder with a fairly long name to wrap at eighty columns" / "rollout"
    result = runner.invoke(cli, ["deploy", str(write_recipe(tmp_path, PAIR_8B_1B)), "--k8s", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    job = json.loads((out / "trtspec-rollout.json").read_text())["jobs"]["build"]
    folder = shlex.quote(str(out))
    assert f"apply it with: kubectl apply -k {folder}/overlays/production" in lines
    assert (
        f"where no GPUs are spare for the build Job beside a new serving pod, build first: kubectl apply -k "
        f"{folder}/overlays/build && kubectl wait -n llm --timeout=24h --for=condition=complete job/{job}"
    ) in lines
    # the gate Job's pod holds its GPUs while it waits: it is applied once the canary serves
    assert (
        "its gate, trtspec validate, once it serves: kubectl wait -n llm --timeout=24h --for=condition=Available "
        f"deployment/llama-8b-1b-canary && kubectl apply -k {folder}/overlays/gate"
    ) in lines
    # a path is printed as written, brackets and all (rich would read "[prod]" as markup)
    out = tmp_path / "x[prod]" / "rollout"
    result = runner.invoke(cli, ["deploy", str(write_recipe(tmp_path, PAIR_8B_1B)), "--k8s", str(out)])
    assert (
        result.exit_code == 0 and f"kubectl apply -k {shlex.quote(str(out))}/overlays/canary" in result.output
    )
    assert "names no registry" not in result.output
    result = runner.invoke(cli, ["deploy", "demo", "--k8s", str(tmp_path / "demo")])
    assert result.exit_code == 0 and "overlays/canary" in result.output and "build first" not in result.output
    # the default image is a local build's tag: a cluster cannot pull it from anywhere
    assert f"note: image trtspec:{__version__}-cpu names no registry" in result.output


def test_an_existing_folder_is_replaced_only_when_it_is_a_rollout(tmp_path, runner):
    recipe = write_recipe(tmp_path, PAIR_8B_1B)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out)])
    assert result.exit_code == 2 and "is not a trtspec Kubernetes rollout" in result.output
    assert (out / "mine.txt").read_text() == "keep"
    shutil.rmtree(out)
    assert runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out)]).exit_code == 0
    assert (
        runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out)]).exit_code == 0
    )  # as written: replaced
    # An overlay the user patched is not lost to a regenerated rollout unless they say so.
    patch = out / "overlays" / "production" / "kustomization.yaml"
    patch.write_text(patch.read_text() + "# tuned\n")
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out)])
    assert (
        result.exit_code == 2 and "overlays/production/kustomization.yaml was changed since" in result.output
    )
    assert patch.read_text().endswith("# tuned\n")
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out), "--json", "--force"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["app"] == "llama-8b-1b" and not patch.read_text().endswith("# tuned\n")
    assert runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(out), "--out", "x"]).exit_code == 2


# ---------------------------------------------------------------- the standard tools, where they are


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize built in) is not installed"
)
@pytest.mark.parametrize("recipe", ["demo", "8b-1b"])
def test_overlays_render_with_kustomize(tmp_path, recipe):
    """Each overlay is the base plus its own objects, in the recipe's namespace; the build overlay (where a build
    Job runs) is the base alone, so the Job can be applied and waited for before anything takes GPUs to serve."""
    source = "demo" if recipe == "demo" else write_recipe(tmp_path, PAIR_8B_1B)
    out, files = rollout(tmp_path, source)
    overlays = sorted({p.split("/")[1] for p in files if p.startswith("overlays/")})
    expected = ["canary", "gate", "production"]
    assert overlays == (expected if recipe == "demo" else ["build", *expected])
    for overlay in overlays:
        run = subprocess.run(
            ["kubectl", "kustomize", str(out / "overlays" / overlay)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        rendered = [d for d in yaml.safe_load_all(run.stdout) if d]
        base = {
            (o["kind"], o["metadata"]["name"]) for p, o in manifests(files).items() if p.startswith("base/")
        }
        own = {
            (o["kind"], o["metadata"]["name"])
            for p, o in manifests(files).items()
            if p.startswith(f"overlays/{overlay}/")
        }
        # the gate overlay is its Job alone: applied after the canary, it re-applies nothing
        assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == (
            own if overlay == "gate" else base | own
        )
        namespaces = {d["metadata"].get("namespace") for d in rendered}
        assert namespaces == ({"llm"} if recipe == "8b-1b" else {None})


def rule_groups(files: dict) -> dict:
    return {"groups": files["base/prometheusrule.yaml"]["spec"]["groups"]}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) is not installed")
def test_promtool_checks_and_unit_tests_the_rules(tmp_path):
    """promtool checks the rules, then evaluates them on series: queue 3 s/s over compute 2 s/s is 1.5, an idle
    pod 0; acceptance 0.2 under 0.55 fires the alert after 10 minutes."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(files)))
    check = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    pod = 'job="llama-8b-1b",namespace="llm",pod="p0"'
    idle = 'job="llama-8b-1b",namespace="llm",pod="p1"'
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {
                        "series": f'nv_inference_queue_duration_us{{{pod},model="m"}}',
                        "values": "0+45000000x40",
                    },
                    {
                        "series": f'nv_inference_compute_infer_duration_us{{{pod},model="m"}}',
                        "values": "0+30000000x40",
                    },
                    {"series": f'nv_inference_queue_duration_us{{{idle},model="m"}}', "values": "0+0x40"},
                    {
                        "series": f'nv_inference_compute_infer_duration_us{{{idle},model="m"}}',
                        "values": "0+0x40",
                    },
                    {
                        "series": f'trtspec_spec_decode_num_draft_tokens_total{{{pod},model="m"}}',
                        "values": "0+100x80",
                    },
                    {
                        "series": f'trtspec_spec_decode_num_accepted_tokens_total{{{pod},model="m"}}',
                        "values": "0+20x80",
                    },
                    {
                        "series": f'trtspec_spec_decode_num_drafts_total{{{pod},model="m"}}',
                        "values": "0+25x80",
                    },
                    {
                        "series": f'trtspec_spec_decode_num_rounds_without_speculation_total{{{pod},model="m"}}',
                        "values": "0+5x80",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": QUEUE_COMPUTE_RATIO,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f"{QUEUE_COMPUTE_RATIO}{{{pod}}}", "value": 1.5},
                            {"labels": f"{QUEUE_COMPUTE_RATIO}{{{idle}}}", "value": 0},
                        ],
                    },
                    {
                        "expr": ACCEPTANCE_RATIO,
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"{ACCEPTANCE_RATIO}{{{pod}}}", "value": 0.2}],
                    },
                    {  # (20 accepted + 30 forwards) / 30 forwards per 15 s
                        "expr": TOKENS_PER_ROUND,
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"{TOKENS_PER_ROUND}{{{pod}}}", "value": 50 / 30}],
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "TrtspecAcceptanceLow",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "job": "llama-8b-1b",
                                    "namespace": "llm",
                                    "pod": "p0",
                                },
                                "exp_annotations": {
                                    "summary": "llama-8b-1b: acceptance 0.20 on p0 is under 0.55",
                                    "description": files["base/prometheusrule.yaml"]["spec"]["groups"][1][
                                        "rules"
                                    ][0]["annotations"]["description"],
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    run = subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


# ---------------------------------------------------------------- a live server


class Promql:
    """Just the PromQL the recording rules use, over two scrapes of one pod: ``sum by (...) (rate(m{..}[w]))``,
    ``clamp_min(e, n)``, ``+``, ``/``, ``e > n`` (a filter) and parentheses. A value is a number or None (an empty
    vector). Target labels (job, namespace, pod) are the scraped pod's, so their matchers hold."""

    TOKEN = re.compile(r"\s*(sum by \([^)]*\)|[A-Za-z_:][\w:]*\{[^}]*\}\[\w+\]|[A-Za-z_]+|[0-9.]+|[()+/>,])")

    def __init__(self, before: dict, after: dict, seconds: float):
        self.before, self.after, self.seconds = before, after, seconds

    def rate(self, selector: str) -> float | None:
        match = re.fullmatch(r"([A-Za-z_:][\w:]*)\{(.*)\}\[\w+\]", selector)
        name, matchers = match.group(1), re.findall(r'(\w+)(=~|=)"([^"]*)"', match.group(2))
        own = [(k, op, v) for k, op, v in matchers if k not in ("job", "namespace", "pod")]
        series = [
            key
            for key in self.after
            if key[0] == name
            and all(
                (re.fullmatch(v, dict(key[1]).get(k, "")) if op == "=~" else dict(key[1]).get(k) == v)
                for k, op, v in own
            )
        ]
        if not series:
            return None
        return sum(self.after[k] - self.before.get(k, 0.0) for k in series) / self.seconds

    def eval(self, expr: str) -> float | None:
        self.tokens, position = [], 0
        while position < len(expr.rstrip()):
            match = self.TOKEN.match(expr, position)
            assert match, f"not in the subset: {expr[position:]}"
            self.tokens.append(match.group(1))
            position = match.end()
        value = self.compare()
        assert not self.tokens, self.tokens
        return value

    def take(self, token: str | None = None) -> str:
        got = self.tokens.pop(0)
        assert token is None or got == token, (got, token)
        return got

    def compare(self):
        value = self.add()
        if self.tokens and self.tokens[0] == ">":
            self.take()
            bound = float(self.take())
            value = value if value is not None and value > bound else None
        return value

    def add(self):
        value = self.div()
        while self.tokens and self.tokens[0] == "+":
            self.take()
            right = self.div()
            value = None if value is None or right is None else value + right
        return value

    def div(self):
        value = self.atom()
        while self.tokens and self.tokens[0] == "/":
            self.take()
            right = self.atom()
            value = None if value is None or right is None else value / right
        return value

    def atom(self):
        token = self.take()
        if token == "(":
            value = self.compare()
            self.take(")")
            return value
        if token.startswith("sum by"):
            self.take("(")
            self.take("rate")
            self.take("(")
            value = self.rate(self.take())
            self.take(")")
            self.take(")")
            return value
        if token == "clamp_min":
            self.take("(")
            value = self.compare()
            self.take(",")
            floor = float(self.take())
            self.take(")")
            return None if value is None else max(value, floor)
        return float(token)


@pytest.mark.server
@pytest.mark.slow
def test_recording_rules_evaluate_on_a_served_demo_pair(demo_server, tmp_path):
    """The HPA's ratio and the acceptance / tokens-per-round rules, evaluated on two scrapes of a real server
    around four streamed requests: every series they name exists, and acceptance equals what the responses
    reported."""
    import time

    from triton_server import PROMPTS, grpc_stream, scrape

    _, files = rollout(tmp_path, "demo")
    recorded = {
        r["record"]: r["expr"]
        for g in files["base/prometheusrule.yaml"]["spec"]["groups"]
        for r in g["rules"]
        if "record" in r
    }
    before, start = scrape(demo_server), time.monotonic()
    reported, generated = [], 0
    for prompt in PROMPTS:
        ids: list = []
        _, metrics = grpc_stream(
            demo_server, prompt, ids, stream=True, num_draft_tokens=4, max_tokens=24, return_perf_metrics=True
        )
        reported.append(metrics)
        generated += len(sum(ids, []))
    after, seconds = scrape(demo_server), time.monotonic() - start
    promql = Promql(before, after, seconds)
    ratio = promql.eval(recorded[QUEUE_COMPUTE_RATIO])
    assert promql.eval(re.search(r"clamp_min\((.*), 1\)$", recorded[QUEUE_COMPUTE_RATIO]).group(1)) > 0
    assert ratio is not None and math.isfinite(ratio) and ratio >= 0
    acceptance = promql.eval(recorded[ACCEPTANCE_RATIO])
    drafted = sum(m["total_draft_tokens"] for m in reported)
    accepted = sum(m["total_accepted_draft_tokens"] for m in reported)
    assert drafted > 0 and acceptance == pytest.approx(accepted / drafted)
    tokens_per_round = promql.eval(recorded[TOKENS_PER_ROUND])
    assert 1.0 < tokens_per_round <= 5.0
    # every round emits its accepted tokens + 1; a request's last round may emit fewer (max_tokens, end id)
    forwards = (accepted + 0.0) / (tokens_per_round - 1.0)
    assert generated <= tokens_per_round * forwards <= generated + len(PROMPTS)
    # an idle window: no drafting, so no acceptance series, and the ratio stays defined
    idle = Promql(after, after, 15.0)
    assert idle.eval(recorded[ACCEPTANCE_RATIO]) is None and idle.eval(recorded[QUEUE_COMPUTE_RATIO]) == 0.0


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize(("floor", "exit_code"), [(0.1, 0), (0.99, 1)])
def test_canary_gate_job_passes_or_blocks_on_the_recipes_threshold(
    demo_server, tmp_path, runner, floor, exit_code
):
    """The gate Job's own command line, pointed at a served demo pair (acceptance about 0.7): it passes under a
    low floor and exits 1 under a floor the draft cannot reach."""
    recipe = demo_with(tmp_path, {"min_acceptance": floor, "gate_prompts": 2, "gate_max_tokens": 12})
    text = recipe.read_text()
    args = gate_args(plan_rollout(load_recipe(recipe, check_paths=False), None, text))
    args[args.index("--url") + 1] = demo_server.ports.grpc_url
    args[2] = str(recipe)
    result = runner.invoke(cli, args[1:])
    assert result.exit_code == exit_code, result.output
    if exit_code:
        assert "acceptance" in result.output


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """Random-weight models in the demo's shape of vocabulary and tokenizer: a draft that has learned nothing of
    the target's text, and a target that is not the recipe's."""
    from tiny_models import make_model

    from trtspec.recipe import DEMO_DIR

    root = tmp_path_factory.mktemp("untrained")
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return {
        role: make_model(root / role, "llama", tokenizer_dir=DEMO_DIR / "draft", seed=seed, **small)
        for role, seed in (("draft", 41), ("target", 42))
    }


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("canary", ["draft trained on nothing", "another target"])
def test_canary_gate_blocks_a_canary_with_a_bad_draft_or_other_outputs(untrained, tmp_path, runner, canary):
    """The gate Job's command line with the demo recipe's own thresholds (exact match 1.0, acceptance floor 0.3),
    pointed at a canary that serves the demo target with an untrained draft (outputs exact, acceptance near 0), or
    another target (outputs differ from the recipe's reference): both exit 1 and say why."""
    from triton_server import deploy_tiny_repo, running_server

    from trtspec.recipe import DEMO_DIR

    pair = (
        (DEMO_DIR / "target", untrained["draft"])
        if canary == "draft trained on nothing"
        else (untrained["target"], DEMO_DIR / "draft")
    )
    deploy_tiny_repo(pair, tmp_path / "repo")
    recipe = demo_with(tmp_path, {"gate_prompts": 2, "gate_max_tokens": 12})
    args = gate_args(plan_rollout(load_recipe(recipe, check_paths=False), None, recipe.read_text()))
    args[2] = str(recipe)
    with running_server(tmp_path / "repo", tmp_path / "server.log") as server:
        args[args.index("--url") + 1] = server.ports.grpc_url
        result = runner.invoke(cli, args[1:])
    assert result.exit_code == 1, result.output
    says = "acceptance" if canary == "draft trained on nothing" else "exact"
    assert says in result.output.lower()


def test_the_recipe_is_mounted_as_a_file_so_its_relative_paths_resolve_beside_it(tmp_path):
    """A ConfigMap folder's recipe.yaml is a symlink into a timestamped folder, and load_recipe resolves the file's
    real path: mounted as a folder, `../models/X` would resolve from inside that folder. A subPath mount is the
    file itself."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    pods = [
        files["overlays/production/deployment.yaml"]["spec"]["template"]["spec"],
        files["base/build-job.yaml"]["spec"]["template"]["spec"],
    ]
    for pod in pods:
        for container in pod["containers"] + pod.get("initContainers", []):
            mounts = [m for m in container.get("volumeMounts", []) if m["name"] == "recipe"]
            assert all(
                m["mountPath"] == "/workspace/recipes/recipe.yaml" and m["subPath"] == "recipe.yaml"
                for m in mounts
            ), mounts


def test_the_build_job_and_the_server_get_a_memory_backed_dev_shm(tmp_path):
    """A container runtime gives a pod 64 MiB of /dev/shm: Triton's python backend passes tensors there, and a
    build's workers (torch multiprocessing, MPI and NCCL for tp > 1) exchange data there, as compose's shm_size
    provides."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    for path in ("base/build-job.yaml", "overlays/production/deployment.yaml"):
        pod = files[path]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}, path


def test_build_and_gate_jobs_request_the_cpu_and_memory_the_recipe_names(tmp_path):
    """Conversion holds the whole checkpoint in host memory: a Job without requests is the first evicted."""
    text = PAIR_8B_1B.replace("  gpus: 2\n", "  gpus: 2\n  cpu: '8'\n  memory: 64Gi\n")
    _, files = rollout(tmp_path, write_recipe(tmp_path, text))
    for path in ("base/build-job.yaml", "overlays/production/deployment.yaml"):
        (container,) = files[path]["spec"]["template"]["spec"]["containers"]
        assert container["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 2}, path


def test_a_volume_without_hard_links_builds_every_stage_anew(tmp_path, monkeypatch):
    """Azure Files (SMB) or a FUSE bucket refuses `cp -al`: the seed is dropped and the build runs whole, not the
    Job failing for every later key."""
    import trtspec.triton_repo.k8s.plan as plan_module
    from trtspec.triton_repo.k8s.workloads import build_script

    root = tmp_path / "engines"
    monkeypatch.setattr(plan_module, "ENGINES_MOUNT", str(root))
    recipe = write_recipe(tmp_path, PAIR_8B_1B)
    plan = plan_rollout(load_recipe(recipe, check_paths=False), None, PAIR_8B_1B)
    (root / "0000000000" / "llama-8b-1b" / "target").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtspec").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n')
    (bin_dir / "cp").write_text(
        '#!/bin/sh\necho "cp: cannot create hard link: Operation not permitted" >&2\nexit 1\n'
    )
    for tool in ("trtspec", "cp"):
        (bin_dir / tool).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TRTSPEC_RECIPE": str(recipe), "CALLS": str(calls)}
    run = subprocess.run(
        ["bash", "-c", build_script(plan)], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "no hard links on this volume" in run.stdout and not list(root.glob(".seeding-*"))
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["check", "build"]
    assert Path(plan.engines_marker).is_file()


def test_a_replica_that_is_not_serving_is_one_that_answered_and_stopped(tmp_path):
    """A pod waiting for its engines or loading its models has no metrics port yet: not an alert."""
    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    rules = [r for g in by_kind(files, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]]
    (rule,) = [r for r in rules if r.get("alert") == "TrtspecReplicaNotServing"]
    assert rule["expr"] == 'up{job="llama-8b-1b"} == 0 and max_over_time(up{job="llama-8b-1b"}[1d]) == 1'


def test_gpu_ids_a_pod_cannot_see_are_refused_in_one_line(tmp_path, runner):
    """The device plugin numbers a pod's GPUs from 0: a recipe written for GPUs 2 and 3 of a box is refused."""
    text = PAIR_8B_1B.replace("tp_size: 2}", "tp_size: 2, gpu_ids: [2, 3]}").replace(
        "dtype: bfloat16}\nspeculative", "dtype: bfloat16, gpu_ids: [2]}\nspeculative"
    )
    recipe = write_recipe(tmp_path, text)
    result = runner.invoke(cli, ["deploy", str(recipe), "--k8s", str(tmp_path / "k8s")])
    assert result.exit_code != 0 and not (tmp_path / "k8s").exists()
    assert "target.gpu_ids" in result.output and "a pod sees its 2 GPU(s) as 0..1" in result.output
    assert "Traceback" not in result.output


def test_a_serving_pod_stops_within_its_grace_period_without_cutting_requests_short(tmp_path):
    """preStop first (the Service drops the endpoint), then serve's own stop: tritonserver lets requests in flight
    run --exit-timeout seconds, and serve kills what is left after its margin, all before the kubelet's SIGKILL."""
    from trtspec.triton_repo.server import EXIT_TIMEOUT_S, STOP_GRACE_S

    _, files = rollout(tmp_path, write_recipe(tmp_path, PAIR_8B_1B))
    pod = files["overlays/production/deployment.yaml"]["spec"]["template"]["spec"]
    (triton,) = pod["containers"]
    (pre_stop,) = [int(a) for a in triton["lifecycle"]["preStop"]["exec"]["command"][1:]]
    (exit_timeout,) = [int(t) for t in re.findall(r"--exit-timeout (\d+)", triton["args"][2])]
    assert exit_timeout > EXIT_TIMEOUT_S
    assert pre_stop + exit_timeout + (STOP_GRACE_S - EXIT_TIMEOUT_S) < pod["terminationGracePeriodSeconds"]
