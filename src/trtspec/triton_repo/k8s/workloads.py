"""The rollout's workloads as manifest dicts: the recipe ConfigMap, the engines volume, the build Job, the serving
Deployment, its Services and disruption budget, and the canary's Deployment, Service and gate Job.

Containers keep the image's entry point (NVIDIA's banner and driver check, then docker/entrypoint.sh, which runs
the arguments it is given), so they set ``args``, never ``command``. Values reach the shell scripts through
shlex.quote only.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex

from trtspec.triton_repo.k8s.plan import (
    CONTAINER_UID,
    ENGINES_MOUNT,
    MODELS_MOUNT,
    RECIPE_FILE,
    RECIPES_MOUNT,
    REPO_MOUNT,
    RolloutPlan,
)
from trtspec.triton_repo.server import EXIT_TIMEOUT_S, STOP_GRACE_S

GPU = "nvidia.com/gpu"
# A serving pod's stop: preStop sleeps while the Service drops its endpoint, then `trtspec serve` gets SIGTERM and
# stops tritonserver, whose requests in flight may run SERVE_EXIT_TIMEOUT_S more before it exits; serve kills
# what is left (STOP_GRACE_S - EXIT_TIMEOUT_S later), all before the kubelet's SIGKILL at the grace period.
TERMINATION_GRACE_S, PRE_STOP_S = 90, 10
SERVE_EXIT_TIMEOUT_S = TERMINATION_GRACE_S - PRE_STOP_S - int(STOP_GRACE_S - EXIT_TIMEOUT_S) - 5
READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"
PROBE_PERIOD_S = 10


def labels(plan: RolloutPlan, component: str, track: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": plan.app,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "trtspec",
    }
    return out | ({"trtspec.dev/track": track} if track else {})


def server_selector(plan: RolloutPlan, track: str | None = None) -> dict[str, str]:
    """The serving pods (both tracks unless ``track``)."""
    return {k: v for k, v in labels(plan, "server", track).items() if k != "app.kubernetes.io/part-of"}


def meta(plan: RolloutPlan, name: str, component: str, track: str | None = None, **extra) -> dict:
    return {"name": name, "labels": labels(plan, component, track), **extra}


def job_name(plan: RolloutPlan, role: str, spec: dict) -> str:
    """A Job's name carries a hash of the Job as written (its spec and the rollout key): a Job's pod template
    cannot change in place, so a changed Job (a new threshold, a node selector) is a new Job."""
    written = json.dumps(spec, sort_keys=True)
    return f"{plan.app}-{role}-{hashlib.sha256(f'{plan.key}|{written}'.encode()).hexdigest()[:10]}"


def build_job_name(plan: RolloutPlan) -> str:
    return build_job(plan)["metadata"]["name"]


def gate_job_name(plan: RolloutPlan) -> str:
    return gate_job(plan)["metadata"]["name"]


def recipe_configmap_name(plan: RolloutPlan) -> str:
    return f"{plan.app}-recipe-{plan.key}"


def recipe_configmap(plan: RolloutPlan) -> dict:
    """The recipe file as written; a new recipe is a new ConfigMap, so the pods that mount it roll."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(plan, recipe_configmap_name(plan), "recipe"),
        "data": {RECIPE_FILE: plan.recipe_text},
    }


def engines_pvc(plan: RolloutPlan) -> dict:
    spec = plan.recipe.kubernetes
    claim = {
        "accessModes": [spec.access_mode],
        "resources": {"requests": {"storage": spec.engines_size}},
    }
    if spec.storage_class:
        claim["storageClassName"] = spec.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(plan, plan.engines_pvc, "engines"),
        "spec": claim,
    }


# ---------------------------------------------------------------- pods


def volumes(
    plan: RolloutPlan, *, engines: bool = True, repo: bool = True, shm: bool = True
) -> tuple[list, list]:
    """(volumes, volumeMounts) of a trtspec container: the recipe, the models and engines volumes where the plan
    has them, (``repo``) a scratch folder for the repository, and (``shm``) a memory-backed /dev/shm in place of
    the container runtime's 64 MiB one."""
    vols = [{"name": "recipe", "configMap": {"name": recipe_configmap_name(plan)}}]
    # The file itself (subPath): a ConfigMap folder's recipe.yaml is a symlink into a timestamped folder, so the
    # recipe's relative paths would resolve from there (load_recipe resolves the file's real path). A subPath
    # mount takes no update, and needs none: a new recipe is a new ConfigMap, and the pods roll.
    mounts = [
        {
            "name": "recipe",
            "mountPath": f"{RECIPES_MOUNT}/{RECIPE_FILE}",
            "subPath": RECIPE_FILE,
            "readOnly": True,
        }
    ]
    if plan.models_pvc:
        vols.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": plan.models_pvc, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    if engines and plan.engines_pvc:
        vols.append({"name": "engines", "persistentVolumeClaim": {"claimName": plan.engines_pvc}})
        mounts.append({"name": "engines", "mountPath": ENGINES_MOUNT})
    if repo:
        vols.append({"name": "triton-repo", "emptyDir": {}})
        mounts.append({"name": "triton-repo", "mountPath": REPO_MOUNT})
    if shm:
        # Triton's python backend passes tensors through /dev/shm, and a build's workers (torch multiprocessing,
        # MPI and NCCL for tp > 1) exchange data there: compose's GPU service, which builds too, has shm_size 2gb.
        vols.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return vols, mounts


def env(plan: RolloutPlan) -> list[dict]:
    return [
        {"name": "TRTSPEC_RECIPE", "value": plan.recipe_path},
        {"name": "TRTSPEC_RUNTIME", "value": plan.runtime},
    ]


def resources(plan: RolloutPlan, gpus: int) -> dict:
    spec = plan.recipe.kubernetes
    # Jobs too: conversion and quantization hold the whole checkpoint in host memory, and a pod without requests is
    # the first evicted or OOM-killed
    requests = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v}
    out: dict = {}
    if gpus:
        out["limits"] = {GPU: gpus}
        requests[GPU] = gpus
    if requests:
        out["requests"] = requests
    return out


def container_security() -> dict:
    """What Pod Security's "restricted" level asks of every container; the image's user runs them all."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_spec(plan: RolloutPlan, containers: list, vols: list, gpus: int, **extra) -> dict:
    for container in [*containers, *extra.get("initContainers", [])]:
        container["securityContext"] = container_security()
    spec = {
        # numeric, so the kubelet can verify runAsNonRoot against the image's named user (uid 1000)
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": CONTAINER_UID,
            "fsGroup": CONTAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": containers,
        "volumes": vols,
        **extra,
    }
    if plan.recipe.kubernetes.node_selector:
        spec["nodeSelector"] = dict(plan.recipe.kubernetes.node_selector)
    if gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    return spec


def wait_for_engines(plan: RolloutPlan, mounts: list) -> dict:
    """An init container that holds a serving pod until the build Job has left its marker."""
    marker = shlex.quote(plan.engines_marker)
    script = (
        f"until [ -f {marker} ]; do echo 'waiting for the build Job: {build_job_name(plan)}'; sleep 10; done"
    )
    engines = [m for m in mounts if m["name"] == "engines"]
    return {
        "name": "wait-for-engines",
        "image": plan.image,
        "args": ["bash", "-c", script],
        "volumeMounts": engines,
    }


def serve_script(plan: RolloutPlan) -> str:
    """deploy the repository into the pod's scratch folder, then become tritonserver's supervisor (``exec``: the
    pod's stop signal reaches ``trtspec serve``, which stops tritonserver and its stubs cleanly)."""
    p, q = plan.ports, shlex.quote
    engines = f" --engines-dir {q(plan.engines_dir)}" if plan.builds else ""
    timeout = plan.recipe.kubernetes.startup_timeout_s  # the startup probe's bound, so serve waits as long
    return (
        "set -euo pipefail\n"
        f'trtspec deploy "$TRTSPEC_RECIPE" --runtime {q(plan.runtime)}{engines} --out {q(plan.repo_path)}\n'
        f"exec trtspec serve {q(plan.repo_path)} --host 0.0.0.0 --http-port {p['http']} --grpc-port {p['grpc']} "
        f"--metrics-port {p['metrics']} --timeout {timeout} --exit-timeout {SERVE_EXIT_TIMEOUT_S}\n"
    )


def probes(plan: RolloutPlan) -> dict:
    """Ready: every model loaded; live: the server answers. The startup probe gives deploy and a first load
    (large engines: many minutes) ``kubernetes.startup_timeout_s`` before liveness counts."""

    def get(path: str, period: int, failures: int) -> dict:
        return {
            "httpGet": {"path": path, "port": "http"},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    startup = -(-plan.recipe.kubernetes.startup_timeout_s // PROBE_PERIOD_S)
    return {
        "startupProbe": get(LIVE_PATH, PROBE_PERIOD_S, startup),
        "readinessProbe": get(READY_PATH, PROBE_PERIOD_S, 3),
        "livenessProbe": get(LIVE_PATH, 15, 4),
    }


def triton_container(plan: RolloutPlan, mounts: list) -> dict:
    container = {
        "name": "triton",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["bash", "-c", serve_script(plan)],
        "env": env(plan),
        "ports": [
            {"name": kind, "containerPort": port, "protocol": "TCP"} for kind, port in plan.ports.items()
        ],
        **probes(plan),
        # the Service drops the pod's endpoint while this runs, so no new request reaches a server that stops
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
        "resources": resources(plan, plan.gpus),
        "volumeMounts": mounts,
    }
    if not container["resources"]:
        del container["resources"]
    return container


def server_pod_template(plan: RolloutPlan, track: str) -> dict:
    vols, mounts = volumes(plan)
    init = [wait_for_engines(plan, mounts)] if plan.builds else []
    pod = pod_spec(
        plan,
        [triton_container(plan, mounts)],
        vols,
        plan.gpus,
        initContainers=init,
        terminationGracePeriodSeconds=TERMINATION_GRACE_S,
    )
    if not init:
        del pod["initContainers"]
    pod_annotations = annotations(plan) | {"kubectl.kubernetes.io/default-container": "triton"}
    return {
        "metadata": {"labels": labels(plan, "server", track), "annotations": pod_annotations},
        "spec": pod,
    }


def annotations(plan: RolloutPlan) -> dict[str, str]:
    out = {
        "trtspec.dev/recipe": plan.recipe.name,
        "trtspec.dev/recipe-digest": plan.recipe.digest(),
        "trtspec.dev/runtime": plan.runtime,
    }
    return out | ({"trtspec.dev/base-image": plan.base_image} if plan.base_image else {})


def replicas_field(replicas: int | None) -> dict:
    """None: the HPA owns the count, and an apply that named one would scale the workload back to it."""
    return {} if replicas is None else {"replicas": replicas}


def workload_name(plan: RolloutPlan, track: str) -> str:
    return plan.app if track == "stable" else f"{plan.app}-{track}"


def workload_ref(plan: RolloutPlan, track: str) -> str:
    """kind/name of a track's serving workload, as kubectl names it."""
    return f"deployment/{workload_name(plan, track)}"


def deployment(plan: RolloutPlan, track: str, replicas: int | None) -> dict:
    """The serving pods of one track ("stable" or "canary"); rollback is `kubectl rollout undo` to a revision."""
    name = workload_name(plan, track)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(plan, name, "server", track, annotations=annotations(plan)),
        "spec": {
            **replicas_field(replicas),
            "revisionHistoryLimit": 10,
            "selector": {"matchLabels": server_selector(plan, track)},
            # A new pod is ready before an old one goes: with GPUs that needs one replica's GPUs spare.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": server_pod_template(plan, track),
        },
    }


def disruption_budget(plan: RolloutPlan) -> dict:
    """Voluntary evictions (a node drain, a cluster upgrade) take one production pod at a time. maxUnavailable,
    not minAvailable, so a lone replica's node can still be drained, and a pod that is not ready (crash-looping)
    can always go."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(plan, plan.app, "server", "stable"),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": server_selector(plan, "stable")},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def service(plan: RolloutPlan, track: str | None = None) -> dict:
    """HTTP, gRPC and metrics. The main Service (no ``track``) selects both tracks, so a canary takes the share
    of connections its ready pods are of all ready pods."""
    name = plan.app if track is None else f"{plan.app}-{track}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(plan, name, "server", track),
        "spec": {
            "type": "ClusterIP",
            "selector": server_selector(plan, track),
            "ports": [
                {"name": kind, "port": port, "targetPort": kind, "protocol": "TCP"}
                for kind, port in plan.ports.items()
            ],
        },
    }


# ---------------------------------------------------------------- jobs


def seed_script(plan: RolloutPlan) -> str:
    """A key's first build starts from hard links to the newest earlier build of the recipe (a folder of another
    key, or the name's own folder an older rollout built into), so `trtspec build` skips the stages a new key
    left unchanged (a new draft does not rebuild the target). trtspec replaces stages, manifests and stamps by a
    rename, never in place, so the earlier build's files stay as they are; its logs, written in place, are left
    out."""
    q = shlex.quote
    root = posixpath.dirname(plan.engines_dir)  # the volume's mount, where every key has its folder
    name, seeding = plan.recipe.name, f"{root}/.seeding-{plan.key}"
    return (
        f"dir={q(plan.engines_dir)}\n"
        'if [ ! -d "$dir" ]; then\n'
        f"  rm -rf {q(seeding)}\n"
        f"  prev=$(ls -1td {q(root)}/*/{q(name)} {q(root + '/' + name)} 2>/dev/null | head -n 1 || true)\n"
        '  if [ -n "$prev" ]; then\n'
        f'    if mkdir -p {q(seeding)} && cp -al "$prev" {q(seeding + "/" + name)}; then\n'
        f'      rm -rf {q(seeding + "/" + name + "/logs")} && mv {q(seeding)} "$dir"\n'
        '      echo "starting from the engines in $prev (hard links): trtspec build rebuilds what changed"\n'
        "    else\n"  # storage without hard links (SMB, FUSE): a whole build
        f"      rm -rf {q(seeding)}\n"
        '      echo "no hard links on this volume: building every stage anew"\n'
        "    fi\n"
        "  fi\n"
        "fi\n"
    )


def build_script(plan: RolloutPlan) -> str:
    """check, then build into this key's folder of the engines volume (seeded from the recipe's previous build),
    then the marker; nothing when the marker says the engines of this recipe and image are there."""
    q = shlex.quote
    record = json.dumps(
        {
            "recipe": plan.recipe.name,
            "recipe_digest": plan.recipe.digest(),
            "runtime": plan.runtime,
            "image": plan.image,
        },
        sort_keys=True,
    )
    return (
        "set -euo pipefail\n"
        f"marker={q(plan.engines_marker)}\n"
        'if [ -f "$marker" ]; then\n'
        f'  echo "engines of recipe {plan.recipe.digest()} for image {plan.image} are current ($marker): nothing to build"\n'
        "  exit 0\n"
        "fi\n"
        f'trtspec check "$TRTSPEC_RECIPE" --runtime {q(plan.runtime)}\n'
        f"{seed_script(plan)}"
        f'trtspec build "$TRTSPEC_RECIPE" --runtime {q(plan.runtime)} --engines-dir {q(plan.engines_dir)}\n'
        'mkdir -p "$(dirname "$marker")"\n'
        f'printf \'%s\\n\' {q(record)} > "$marker.tmp" && mv "$marker.tmp" "$marker"\n'
    )


def build_job(plan: RolloutPlan) -> dict:
    vols, mounts = volumes(plan, repo=False)
    container = {
        "name": "build",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["bash", "-c", build_script(plan)],
        "env": env(plan),
        "resources": resources(plan, plan.gpus),
        "volumeMounts": mounts,
    }
    spec = {
        "backoffLimit": 1,
        "template": {
            "metadata": {"labels": labels(plan, "build")},
            "spec": pod_spec(plan, [container], vols, plan.gpus, restartPolicy="Never"),
        },
    }
    name = job_name(plan, "build", spec)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(plan, name, "build", annotations=annotations(plan)),
        "spec": spec,
    }


def gate_args(plan: RolloutPlan) -> list[str]:
    """The canary gate: `trtspec validate` against the canary's Service with the recipe's thresholds; its exit
    status (1 below a threshold) is the Job's."""
    spec = plan.recipe.kubernetes
    return [
        "trtspec",
        "validate",
        plan.recipe_path,
        "--system",
        "triton",
        "--url",
        f"{plan.app}-canary:{plan.ports['grpc']}",
        "--min-exact-match",
        str(spec.min_exact_match),
        "--min-acceptance",
        str(spec.min_acceptance),
        "--limit",
        str(spec.gate_prompts),
        "--max-tokens",
        str(spec.gate_max_tokens),
        "--device",
        plan.device,
    ]


WAIT_READY_PY = """import sys, time, urllib.request
url = sys.argv[1]
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    print("waiting for", url, flush=True)
    time.sleep(10)
"""


def gate_job(plan: RolloutPlan) -> dict:
    vols, mounts = volumes(plan, engines=False, repo=False, shm=False)
    ready = f"http://{plan.app}-canary:{plan.ports['http']}{READY_PATH}"
    # the Hugging Face reference's GPUs: a serving pod's (validate spreads the reference over those it sees)
    gpus = plan.gpus if plan.device == "cuda" else 0
    gate = {
        "name": "gate",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "args": gate_args(plan),
        "env": env(plan),
        "resources": resources(plan, gpus),
        "volumeMounts": mounts,
    }
    wait = {"name": "wait-for-canary", "image": plan.image, "args": ["python3", "-c", WAIT_READY_PY, ready]}
    pod = pod_spec(plan, [gate], vols, gpus, initContainers=[wait], restartPolicy="Never")
    spec = {
        "backoffLimit": 0,  # a failed gate is an answer, not a flake to retry
        "activeDeadlineSeconds": plan.recipe.kubernetes.startup_timeout_s + 3600,
        "template": {"metadata": {"labels": labels(plan, "gate", "canary")}, "spec": pod},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(
            plan, job_name(plan, "canary-gate", spec), "gate", "canary", annotations=annotations(plan)
        ),
        "spec": spec,
    }
