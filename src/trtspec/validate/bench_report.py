"""Bench reports as functions of a ``BenchResult``: JSON-ready dict, Markdown, table cells, PNG plots.

matplotlib is imported only inside ``write_plots`` (Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from trtspec.validate.bench import SCHEDULE_TOLERANCE, BenchResult
from trtspec.validate.report import markdown_table

COLUMNS = [
    "K",
    "mean K",
    "conc",
    "tok/s",
    "speedup",
    "bound",
    "achieved",
    "accept",
    "acc len",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "ITL p50 ms",
    "ITL p95 ms",
]


def bench_to_dict(result: BenchResult) -> dict:
    return {
        "system": result.system,
        "max_new_tokens": result.max_new_tokens,
        "prompts": result.prompts,
        "draft_cost_ratio": {str(c): r for c, r in result.draft_cost_ratio.items()},
        "recommended_num_draft_tokens": {str(c): k for c, k in result.recommended_k().items()},
        "recommended_schedule": {str(c): k for c, k in result.recommended_schedule().items()},
        "adaptive_sweep": result.sweep_summary(),
        "points": result.rows(),
        "notes": result.notes,
    }


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def row_cells(row: dict) -> list[str]:
    return [
        row["k"],
        _f(row["mean_num_draft_tokens"], ".2f"),
        str(row["concurrency"]),
        _f(row["tokens_per_s"], ".1f"),
        _f(row["speedup"], ".2f"),
        _f(row["analytic_bound"], ".2f"),
        _f(row["achieved_fraction"], ".2f"),
        _f(row["acceptance_rate"], ".3f"),
        _f(row["mean_accepted_length"], ".2f"),
        _ms(row["ttft_p50_s"]),
        _ms(row["ttft_p95_s"]),
        _ms(row["itl_p50_s"]),
        _ms(row["itl_p95_s"]),
    ]


def _recommendation(result: BenchResult) -> str:
    parts = [
        f"concurrency {c}: K={k}" + (" (target-only is fastest)" if k == 0 else "")
        for c, k in result.recommended_k().items()
    ]
    return "Recommended num_draft_tokens (highest measured tokens/s): " + "; ".join(parts) + "."


SWEEP_COLUMNS = [
    "conc",
    "target-only tok/s",
    "best",
    "best tok/s",
    "adaptive tok/s",
    "adaptive mean K",
    "adaptive / best",
    "adaptive / target-only",
]


def sweep_cells(row: dict) -> list[str]:
    best = row["best_num_draft_tokens"]
    return [
        str(row["concurrency"]),
        _f(row["target_only_tokens_per_s"], ".1f"),
        "target-only" if best == 0 else f"K={best}",
        _f(row["best_tokens_per_s"], ".1f"),
        _f(row["adaptive_tokens_per_s"], ".1f"),
        _f(row["adaptive_mean_num_draft_tokens"], ".2f"),
        _f(row["adaptive_vs_best"], ".2f"),
        _f(row["adaptive_vs_target_only"], ".2f"),
    ]


def schedule_text(schedule: dict[int, int]) -> str:
    """The schedule as it reads in a recipe: ``{1: 8, 4: 4, 16: 0}``."""
    return "{" + ", ".join(f"{c}: {k}" for c, k in sorted(schedule.items())) + "}"


def _schedule_line(result: BenchResult) -> str:
    return (
        f"Recommended speculative.schedule: {schedule_text(result.recommended_schedule())} (per concurrency the "
        f"largest K not slower than target-only and within {SCHEDULE_TOLERANCE:.0%} of the best point; "
        "`--write-recipe` writes it)."
    )


def _per_position_rows(rows: list[dict]) -> list[list[str]]:
    return [
        [
            r["k"],
            str(r["concurrency"]),
            " ".join(f"{a:.2f}" for a in r["per_position_acceptance"]),
        ]
        for r in rows
        if r["per_position_acceptance"]
    ]


def set_acceptance(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of acceptance per prompt set and speculative point; empty when every prompt is raw text."""
    names = list(dict.fromkeys(name for r in rows for name in r["acceptance_by_set"]))
    if names in ([], ["raw"]):
        return [], []
    header = ["K", "conc"] + [f"{name} {what}" for name in names for what in ("accept", "acc len")]
    cells = []
    for r in (r for r in rows if r["acceptance_by_set"]):
        by_set = r["acceptance_by_set"]
        cells.append(
            [r["k"], str(r["concurrency"])]
            + [
                _f(by_set.get(name, {}).get(key), spec)
                for name in names
                for key, spec in (("acceptance_rate", ".3f"), ("mean_accepted_length", ".2f"))
            ]
        )
    return header, cells


def bench_markdown(result: BenchResult, plots: list[str] | None = None) -> str:
    rows = result.rows()
    ratios = (
        ", ".join(f"{r:.3f} (concurrency {c})" for c, r in result.draft_cost_ratio.items()) or "not measured"
    )
    parts = [
        f"# trtspec bench: {result.system}",
        "",
        f"{result.prompts} prompts, greedy, max_new_tokens={result.max_new_tokens}; K=0 is target-only decoding on "
        f"the same system in the same run. Draft/target cost ratio: {ratios}.",
        "",
        markdown_table(COLUMNS, [row_cells(r) for r in rows]),
        "",
        "speedup: tokens/s over target-only at the same concurrency; bound: analytic speedup bound, tokens per round "
        "(measured; from the acceptance rate where rounds are not reported) over the round's cost in target steps "
        "(Leviathan et al. 2023); achieved: speedup / bound; ITL: per-token "
        "inter-token latency (a piece of n tokens counts n times at gap/n).",
        "",
        _recommendation(result),
    ]
    sweep = result.sweep_summary()
    if sweep:
        parts += [
            "",
            "## Adaptive K against target-only and every static K",
            "",
            "best: the fastest point measured at that concurrency (target-only or a static K); adaptive mean K: "
            "draft tokens per target forward of the adaptive requests.",
            "",
            markdown_table(SWEEP_COLUMNS, [sweep_cells(r) for r in sweep]),
            "",
            _schedule_line(result),
        ]
    set_header, set_rows = set_acceptance(rows)
    if set_rows:
        parts += [
            "",
            "## Acceptance per prompt set",
            "",
            "raw: prompt text as given; chat: messages rendered with the target tokenizer's chat template.",
            "",
            markdown_table(set_header, set_rows),
        ]
    per_position = _per_position_rows(rows)
    if per_position:
        parts += [
            "",
            "## Per-position acceptance",
            "",
            "Fraction of rounds whose i-th draft token was accepted, i = 1..K.",
            "",
            markdown_table(["K", "conc", "positions 1..K"], per_position),
        ]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    if result.notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(parts) + "\n"


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    """speedup_acceptance.png (speedup, bound and acceptance vs K) and latency_concurrency.png (TTFT/ITL p50 vs
    concurrency per K) into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = result.rows()
    rows = [r for r in every if r["num_draft_tokens"] is not None]  # adaptive has no K for the x axis
    conc = sorted({r["concurrency"] for r in rows})
    ks = sorted({r["num_draft_tokens"] for r in rows}) + [None] * any(
        r["num_draft_tokens"] is None for r in every
    )
    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for c in conc:
        sel = [r for r in rows if r["concurrency"] == c]
        line = ax_speed.plot(
            [r["num_draft_tokens"] for r in sel],
            [r["speedup"] or 0 for r in sel],
            "o-",
            label=f"measured, concurrency {c}",
        )[0]
        bound = [(r["num_draft_tokens"], r["analytic_bound"]) for r in sel if r["analytic_bound"] is not None]
        if bound:
            ax_speed.plot(
                *zip(*bound, strict=True), "--", color=line.get_color(), label=f"bound, concurrency {c}"
            )
        acc = [(r["num_draft_tokens"], r["acceptance_rate"]) for r in sel if r["acceptance_rate"] is not None]
        if acc:
            ax_acc.plot(*zip(*acc, strict=True), "o-", label=f"concurrency {c}")
    ax_speed.axhline(1.0, color="gray", linewidth=0.8)
    ax_speed.set(xlabel="num_draft_tokens K", ylabel="speedup over target-only", title="Speedup vs K")
    ax_acc.set(xlabel="num_draft_tokens K", ylabel="acceptance rate", title="Acceptance vs K", ylim=(0, 1.05))
    for ax in (ax_speed, ax_acc):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths = [_save(fig, out_dir / "speedup_acceptance.png")]
    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(10, 4))
    for k in ks:
        sel = sorted((r for r in every if r["num_draft_tokens"] == k), key=lambda r: r["concurrency"])
        label = "target-only" if k == 0 else "adaptive K" if k is None else f"K={k}"
        ax_ttft.plot(
            [r["concurrency"] for r in sel], [(r["ttft_p50_s"] or 0) * 1000 for r in sel], "o-", label=label
        )
        ax_itl.plot(
            [r["concurrency"] for r in sel], [(r["itl_p50_s"] or 0) * 1000 for r in sel], "o-", label=label
        )
    ax_ttft.set(xlabel="concurrency", ylabel="ms", title="Time to first token (p50)")
    ax_itl.set(xlabel="concurrency", ylabel="ms", title="Inter-token latency (p50)")
    for ax in (ax_ttft, ax_itl):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / "latency_concurrency.png"))
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
