"""The rollout's monitoring and scaling: PodMonitor, PrometheusRule (recording rules and alerts), the HPA on the
queue-to-compute ratio, prometheus-adapter's rule that serves it to the HPA, and the Grafana dashboard.

The scaling signal is Triton's own: time requests waited in the queue over time spent computing, per pod. It
reads the same whatever a token costs, which under speculative decoding moves with acceptance (text-dependent)
and K, and a busy GPU says nothing here: draft and target keep it busy at any load.
"""

from __future__ import annotations

import copy

from trtspec.triton_repo.k8s.plan import RolloutPlan
from trtspec.triton_repo.k8s.workloads import meta, server_selector

QUEUE_COMPUTE_RATIO = "triton:queue_compute:ratio"
ACCEPTANCE_RATIO = "trtspec:acceptance:ratio"
TOKENS_PER_ROUND = "trtspec:tokens_per_round:ratio"
QUEUE_US, COMPUTE_US = "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us"
BY = "sum by (namespace, job, pod)"  # job: the app (PodMonitor jobLabel), so two apps never mix


def spec_decode_names() -> dict[str, str]:
    """The entry models' counter names (one owner: the Triton models' metrics module)."""
    from trtspec.triton_repo.models.triton_io import REQUESTS_FINISHED, SPEC_DECODE_PREFIX

    names = {
        f: f"{SPEC_DECODE_PREFIX}{f}_total" for f in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    names["num_rounds_without_speculation"] = f"{SPEC_DECODE_PREFIX}num_rounds_without_speculation_total"
    return names | {"finished": REQUESTS_FINISHED}


def rate(plan: RolloutPlan, metric: str, window: str, matchers: str = "") -> str:
    return f'{BY} (rate({metric}{{job="{plan.app}"{matchers}}}[{window}]))'


def recording_rules(plan: RolloutPlan) -> list[dict]:
    """Per pod: queue over compute time (NVIDIA's autoscaling rule; clamp_min keeps an idle pod at 0, not NaN);
    acceptance = accepted / drafted, and tokens per round = (accepted + target forwards) / target forwards
    (core.metrics' definitions; empty while a pod drafts nothing, so an idle pod raises no alert)."""
    queue = {
        "record": QUEUE_COMPUTE_RATIO,
        "expr": f"{rate(plan, QUEUE_US, '1m')} / clamp_min({rate(plan, COMPUTE_US, '1m')}, 1)",
    }
    if not plan.exports_spec_metrics:
        return [queue]
    n = spec_decode_names()
    forwards = (
        f"({rate(plan, n['num_drafts'], '5m')} + {rate(plan, n['num_rounds_without_speculation'], '5m')})"
    )
    return [
        queue,
        {
            "record": ACCEPTANCE_RATIO,
            "expr": f"{rate(plan, n['num_accepted_tokens'], '5m')} / ({rate(plan, n['num_draft_tokens'], '5m')} > 0)",
        },
        {
            "record": TOKENS_PER_ROUND,
            "expr": f"({rate(plan, n['num_accepted_tokens'], '5m')} + {forwards}) / ({forwards} > 0)",
        },
    ]


def alerts(plan: RolloutPlan) -> list[dict]:
    """Acceptance under the recipe's floor, a replica whose metrics stopped answering, and one that answers only
    with errors (a dead python stub that tritonserver keeps reporting ready: docs/faults.md). Without trtspec's
    counters (trtllm-pytorch) only the second."""
    floor = plan.recipe.kubernetes.min_acceptance
    finished = spec_decode_names()["finished"]
    app = plan.app
    failed = rate(plan, finished, "5m", ',finish_reason="error"')
    answered = rate(plan, finished, "5m", ',finish_reason=~"stop|length"')
    not_serving = {
        "alert": "TrtspecReplicaNotServing",
        # a replica that answered within the day and stopped: a pod still waiting for its engines or loading its
        # models has no port open yet, and is not a replica that stopped serving
        "expr": f'up{{job="{app}"}} == 0 and max_over_time(up{{job="{app}"}}[1d]) == 1',
        "for": "2m",
        "labels": {"severity": "critical"},
        "annotations": {"summary": f"{app}: {{{{ $labels.pod }}}} stopped answering on its metrics port"},
    }
    if not plan.exports_spec_metrics:
        return [not_serving]
    return [
        {
            "alert": "TrtspecAcceptanceLow",
            "expr": f'{ACCEPTANCE_RATIO}{{job="{app}"}} < {floor}',
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f'{app}: acceptance {{{{ printf "%.2f" $value }}}} on {{{{ $labels.pod }}}} is under {floor}',
                "description": "The draft no longer predicts the traffic; each token costs more target rounds. "
                "Compare with the canary's gate, or align the draft on recent prompts (trtspec align).",
            },
        },
        not_serving,
        {
            "alert": "TrtspecReplicaFailingRequests",
            "expr": f"{failed} > 0 unless {answered} > 0",
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {"summary": f"{app}: every request {{{{ $labels.pod }}}} finished in 5m failed"},
        },
    ]


def pod_monitor(plan: RolloutPlan) -> dict:
    """Scrapes the serving pods' metrics port; the job label is the app name, which the rules select."""
    metadata = meta(plan, plan.app, "monitoring")
    metadata["labels"] |= plan.recipe.kubernetes.monitoring_labels
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata,
        "spec": {
            "jobLabel": "app.kubernetes.io/name",
            "selector": {"matchLabels": server_selector(plan)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def prometheus_rule(plan: RolloutPlan) -> dict:
    metadata = meta(plan, plan.app, "monitoring")
    metadata["labels"] |= plan.recipe.kubernetes.monitoring_labels
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {
            "groups": [
                {"name": f"{plan.app}.recording", "interval": "15s", "rules": recording_rules(plan)},
                {"name": f"{plan.app}.alerts", "rules": alerts(plan)},
            ]
        },
    }


def milli(value: float) -> str:
    """A quantity in thousandths: 1.0 -> '1000m' (the form the HPA's averageValue is usually written in)."""
    return f"{round(value * 1000)}m"


def hpa(plan: RolloutPlan) -> dict:
    """Replicas between kubernetes.min_replicas and max_replicas, keeping the pods' mean queue/compute ratio at the
    target. Scale-down waits 10 minutes: a new GPU replica takes minutes to load its engines."""
    spec = plan.recipe.kubernetes
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.app}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(plan, plan.app, "autoscaler"),
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_COMPUTE_RATIO},
                        "target": {"type": "AverageValue", "averageValue": milli(spec.queue_compute_ratio)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    }


def adapter_values() -> dict:
    """prometheus-adapter's Helm values (rules.custom): the recorded ratio as a pods metric of the custom metrics
    API, under the same name the HPA asks for."""
    return {
        "rules": {
            "default": False,
            "custom": [
                {
                    "seriesQuery": f'{QUEUE_COMPUTE_RATIO}{{namespace!="",pod!=""}}',
                    "resources": {
                        "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
                    },
                    "name": {"matches": f"^{QUEUE_COMPUTE_RATIO}$", "as": QUEUE_COMPUTE_RATIO},
                    "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
                }
            ],
        }
    }


def _with_datasource(node, uid: str):
    """The dashboard with every Prometheus datasource reference pointed at the cluster Grafana's ``uid``."""
    if isinstance(node, dict):
        if node.get("type") == "prometheus" and "uid" in node and len(node) == 2:
            return {"type": "prometheus", "uid": uid}
        return {k: _with_datasource(v, uid) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_datasource(v, uid) for v in node]
    return node


def dashboard_configmap(plan: RolloutPlan, dashboard: dict) -> dict:
    """trtspec's dashboard (package data, which docker/compose.yaml's Grafana mounts) for Grafana's sidecar,
    which loads ConfigMaps labelled grafana_dashboard."""
    import json

    data = _with_datasource(copy.deepcopy(dashboard), plan.recipe.kubernetes.grafana_datasource)
    metadata = meta(plan, f"{plan.app}-grafana-dashboard", "monitoring")
    metadata["labels"] |= {"grafana_dashboard": "1"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {"trtspec.json": json.dumps(data, indent=2) + "\n"},
    }
