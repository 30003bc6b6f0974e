"""The rollout's files and their writing: a kustomize base (what both tracks share) and its overlays, written into
a temp folder and renamed into place (outputs.write_output_dir), after every check has passed.

    DIR/base/                 recipe ConfigMap, engines PVC, build Job, Service, PodMonitor, PrometheusRule,
                              Grafana dashboard ConfigMap
    DIR/overlays/production/  base + the serving Deployment, its HPA and PodDisruptionBudget
    DIR/overlays/canary/      base + the canary Deployment and its own Service
    DIR/overlays/build/       base alone in the overlays' namespace (a build Job, where one runs): applied and
                              waited for first where no GPUs are spare for the Job next to a new serving pod
    DIR/overlays/gate/        the canary's gate Job alone, applied once the canary serves
    DIR/monitoring/           prometheus-adapter's Helm values (installed with the adapter, not by kustomize)
    DIR/trtspec-rollout.json  what wrote it, from which recipe and image
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import RecipeError, TrtspecError
from trtspec.outputs import write_output_dir
from trtspec.recipe import ASSETS_DIR, Recipe
from trtspec.triton_repo.k8s import monitoring as mon
from trtspec.triton_repo.k8s import workloads as wl
from trtspec.triton_repo.k8s.plan import RolloutPlan, plan_rollout

MARKER = "trtspec-rollout.json"
KUSTOMIZATION = "kustomization.yaml"
# package data, so a rollout can be written from an installed trtspec (the image); docker/compose.yaml mounts it
DASHBOARD = ASSETS_DIR / "grafana" / "trtspec.json"


@dataclass
class RolloutResult:
    """What ``deploy --k8s`` wrote."""

    dir: Path
    runtime: str
    app: str
    image: str
    files: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def kustomization(resources: list[str], namespace: str | None = None) -> dict:
    out = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        out["namespace"] = namespace
    return out | {"resources": resources}


def _folder(
    objects: dict[str, dict], namespace: str | None = None, parents: tuple[str, ...] = ()
) -> dict[str, dict]:
    return objects | {KUSTOMIZATION: kustomization([*parents, *objects], namespace)}


def rollout_objects(plan: RolloutPlan, dashboard: dict) -> dict[str, dict]:
    """Every file of the rollout but the marker: its path in DIR -> the object (a manifest, a kustomization, or
    prometheus-adapter's values)."""
    spec = plan.recipe.kubernetes
    base = {"recipe-configmap.yaml": wl.recipe_configmap(plan)}
    if plan.create_engines_pvc:
        base["engines-pvc.yaml"] = wl.engines_pvc(plan)
    if plan.builds:
        base["build-job.yaml"] = wl.build_job(plan)
    base |= {
        "service.yaml": wl.service(plan),
        "podmonitor.yaml": mon.pod_monitor(plan),
        "prometheusrule.yaml": mon.prometheus_rule(plan),
        "grafana-dashboard.yaml": mon.dashboard_configmap(plan, dashboard),
    }
    # no replica count: the HPA keeps it between min_replicas and max_replicas
    production = {
        "deployment.yaml": wl.deployment(plan, "stable", None),
        "hpa.yaml": mon.hpa(plan),
        "pdb.yaml": wl.disruption_budget(plan),
    }
    canary = {
        "deployment.yaml": wl.deployment(plan, "canary", spec.canary_replicas),
        "service.yaml": wl.service(plan, "canary"),
    }
    files = {f"base/{k}": v for k, v in _folder(base).items()}
    # A pod that waits holds its GPUs. So the build Job can run alone before serving pods are applied (on a full
    # pool the two would wait on each other), and the gate Job is applied once the canary serves.
    overlays = [("production", production, True), ("canary", canary, True)]
    if plan.builds:
        overlays.append(("build", {}, True))
    overlays.append(("gate", {"gate-job.yaml": wl.gate_job(plan)}, False))
    for name, objects, with_base in overlays:
        folder = _folder(objects, spec.namespace, ("../../base",) if with_base else ())
        files |= {f"overlays/{name}/{k}": v for k, v in folder.items()}
    files["monitoring/prometheus-adapter-values.yaml"] = mon.adapter_values()
    return files


def rollout_manifest(plan: RolloutPlan, files: list[str]) -> dict:
    from trtspec import __version__

    return {
        "trtspec": __version__,
        "recipe": plan.recipe.name,
        "recipe_digest": plan.recipe.digest(),
        "runtime": plan.runtime,
        "app": plan.app,
        "namespace": plan.recipe.kubernetes.namespace,
        "image": plan.image,
        "base_image": plan.base_image,
        "key": plan.key,
        "gpus_per_replica": plan.gpus,
        # the Jobs to wait for: the build before serving, the gate before promoting a canary
        "jobs": {
            "build": wl.build_job_name(plan) if plan.builds else None,
            "gate": wl.gate_job_name(plan),
        },
        # kubectl's names of the serving workloads (what `kubectl wait --for=condition=Available` takes)
        "workloads": {track: wl.workload_ref(plan, track) for track in ("stable", "canary")},
        "files": files,
    }


def to_yaml(obj: dict) -> str:
    """Block style, keys in the order written, multi-line strings (scripts, the recipe) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.ignore_aliases = lambda self, data: True  # a dict used twice is written twice, never as &id001
    return yaml.dump(
        obj, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=4096
    )  # PromQL on one line


def rollout_files(plan: RolloutPlan, dashboard: dict) -> dict[str, str]:
    """Every file of the rollout as text, the marker included."""
    objects = rollout_objects(plan, dashboard)
    files = {path: to_yaml(obj) for path, obj in objects.items()}
    files[MARKER] = json.dumps(rollout_manifest(plan, sorted(files)), indent=2) + "\n"
    return files


def read_inputs(recipe: Recipe, dashboard_path: Path = DASHBOARD) -> tuple[str, dict]:
    """(the recipe file's text, the Grafana dashboard); the pods read the recipe as it was written."""
    if recipe.source is None:
        raise RecipeError(
            "<recipe>", None, "a rollout mounts the recipe file in its pods; load the recipe from a file"
        )
    try:
        text = Path(recipe.source).read_text(encoding="utf-8")
    except OSError as err:
        raise RecipeError(recipe.source, None, f"cannot read the recipe ({err.strerror})") from None
    try:
        dashboard = json.loads(Path(dashboard_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TrtspecError(
            f"{dashboard_path}: cannot read the Grafana dashboard ({err}); reinstall trtspec"
        ) from None
    return text, dashboard


def write_rollout(
    recipe: Recipe, runtime: str | None, out: Path, dashboard_path: Path = DASHBOARD, force: bool = False
) -> RolloutResult:
    """Check the recipe's rollout values, then write the rollout to ``out`` atomically (nothing on an error).
    ``force``: replace files edited or added in an earlier rollout there (an overlay a user patched)."""
    text, dashboard = read_inputs(recipe, dashboard_path)
    plan = plan_rollout(recipe, runtime, text)
    files = rollout_files(plan, dashboard)

    def fill(tmp: Path) -> None:
        for path, body in files.items():
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp / path).write_text(body, encoding="utf-8")

    target = write_output_dir(
        out,
        MARKER,
        "a trtspec Kubernetes rollout",
        "--k8s",
        fill,
        need_bytes=sum(len(t.encode()) for t in files.values()),
        force=force,
    )
    return RolloutResult(
        dir=target,
        runtime=plan.runtime,
        app=plan.app,
        image=plan.image,
        files=sorted(files),
        manifest=json.loads(files[MARKER]),
    )
