"""The result of ``trtspec check``: each check's verdict, the GPU memory estimate, and how both are shown (a rich
table, or one JSON document with --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trtspec.core.checks import CheckResult

STATUS_STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


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


def print_check_report(report: CheckReport, out) -> None:
    """A rich table of checks and the memory estimate, or the JSON document with --json."""
    if out.json:
        out.emit_json(report.to_json())
        return
    from rich.table import Table

    console = out.console()
    table = Table(title=f"trtspec check: {report.recipe}", show_lines=False)
    for col in ("check", "status", "details"):
        table.add_column(col, overflow="fold")
    for r in report.results:
        table.add_row(r.name, STATUS_STYLE[r.status], r.message)
    console.print(table)
    mem = Table(title="Estimated GPU memory per rank")
    for col in ("model", "precision", "GPUs", "weights", "KV cache", "total", "min compute capability"):
        mem.add_column(col, justify="right" if col in ("weights", "KV cache", "total") else "left")
    for m in report.memory:
        gpus = ",".join(map(str, m.gpus))
        sizes = (format_gib(m.weights_gib), format_gib(m.kv_cache_gib), format_gib(m.total_gib))
        mem.add_row(m.role, m.precision, gpus, *sizes, m.min_compute_capability)
    console.print(mem)
    failed = sum(r.status == "fail" for r in report.results)
    warned = sum(r.status == "warn" for r in report.results)
    verdict = "[bold red]failed[/]" if failed else "[green]passed[/]"
    console.print(f"{verdict}: {len(report.results) - failed - warned} pass, {warned} warn, {failed} fail")
