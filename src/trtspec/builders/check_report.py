"""The result of ``trtspec check``: each check's verdict and the GPU memory estimate, as data and as the JSON
document --json prints (trtspec/views.py shows them as tables)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trtspec.core.checks import CheckResult


@dataclass(frozen=True)
class MemoryRow:
    """Estimated GPU memory of one model on each of its ranks (GiB)."""

    role: str
    precision: str
    gpus: tuple[int, ...]
    weights_gib: float
    kv_cache_gib: float
    min_compute_capability: str

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib


@dataclass(frozen=True)
class CheckReport:
    recipe: str
    results: list[CheckResult]
    memory: list[MemoryRow]

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    def per_gpu_gib(self) -> dict[int, float]:
        return per_gpu_gib(self.memory)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "ok": self.ok,
            "checks": [asdict(r) for r in self.results],
            "memory": [asdict(m) | {"total_gib": round(m.total_gib, 3)} for m in self.memory],
            "per_gpu_gib": {str(k): round(v, 3) for k, v in self.per_gpu_gib().items()},
        }


def per_gpu_gib(memory: list[MemoryRow]) -> dict[int, float]:
    """GiB per GPU id: every model rank placed on it (draft and target may share a GPU)."""
    totals: dict[int, float] = {}
    for row in memory:
        for gpu in row.gpus:
            totals[gpu] = totals.get(gpu, 0.0) + row.total_gib
    return totals


def format_gib(gib: float) -> str:
    return f"{gib:.2f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"
