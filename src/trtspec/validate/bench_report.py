"""Bench reports as functions of a ``BenchResult``: JSON-ready dict, Markdown, table cells, PNG plots.

matplotlib is imported only inside ``write_plots`` (Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trtspec.validate.bench import INTERVAL_LEVEL, INTERVAL_MIN_PAIRS, SCHEDULE_TOLERANCE, BenchResult
from trtspec.validate.report import markdown_table
from trtspec.validate.systems import PROPOSER_ORDER

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


def budget_text(result: BenchResult) -> str:
    """How the requests were sized and issued."""
    if result.load == "streams":
        return (
            f"a steady load (`concurrency` requests in flight, the next issued as one finishes; max_new_tokens "
            f"0.5x-1.5x {result.max_new_tokens}, the same for every point)"
        )
    return f"max_new_tokens={result.max_new_tokens}"


def bench_to_dict(result: BenchResult) -> dict:
    return {
        "system": result.system,
        "max_new_tokens": result.max_new_tokens,
        "load": result.load,
        "prompts": result.prompts,
        "proposers": result.proposers,
        "draft_cost_ratio": {str(c): r for c, r in result.draft_cost_ratio.items()},
        "recommended_for_proposer": result.primary,
        "recommended_num_draft_tokens": {str(c): k for c, k in result.recommended_k().items()},
        "recommended_schedule": {str(c): k for c, k in result.recommended_schedule().items()},
        "adaptive_sweep": result.sweep_summary(),
        "proposer_comparison": result.proposer_comparison(),
        "points": result.rows(),
        "notes": result.notes,
    }


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _plot_ms(value) -> float:
    return float("nan") if value is None else value * 1000


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


def several_proposers(rows: list[dict]) -> bool:
    """Tables name each row's proposer only where the sweep had several (one is named in the title)."""
    return len({r["proposer"] for r in rows if r["proposer"]}) > 1


def _named(rows: list[dict], header: list[str], cells: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) with a leading proposer column where the rows have several proposers."""
    if not several_proposers(rows):
        return header, cells
    return ["proposer", *header], [[r["proposer"] or "-", *c] for r, c in zip(rows, cells, strict=True)]


def point_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of the main table: one row per point."""
    return _named(rows, COLUMNS, [row_cells(r) for r in rows])


def proposers_text(result: BenchResult) -> str:
    """The proposers swept, as the title and heading name them (target-only, K=0, proposes nothing)."""
    return ", ".join(result.proposers) or "none (target-only)"


def _recommendation(result: BenchResult) -> str:
    parts = [
        f"concurrency {c}: K={k}" + (" (target-only is fastest)" if k == 0 else "")
        for c, k in result.recommended_k().items()
    ]
    which = f" for proposer {result.primary}" if len(result.proposers) > 1 else ""
    return f"Recommended num_draft_tokens{which} (highest measured tokens/s): " + "; ".join(parts) + "."


SWEEP_COLUMNS = [
    "conc",
    "target-only tok/s",
    "best",
    "best tok/s",
    "adaptive tok/s",
    "adaptive mean K",
    "adaptive / best",
    "adaptive / target-only",
    "paired / best",
    "paired / target-only",
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
        _paired(row["adaptive_vs_best_paired"], row["adaptive_vs_best_paired_interval"]),
        _paired(row["adaptive_vs_target_only_paired"], row["adaptive_vs_target_only_paired_interval"]),
    ]


def _paired(ratio: float | None, interval: Sequence[float] | None) -> str:
    """A paired ratio and its bootstrap interval where it has one: ``0.94 (0.88-1.01)``."""
    if ratio is None or not interval:
        return _f(ratio, ".2f")
    low, high = interval
    return f"{ratio:.2f} ({low:.2f}-{high:.2f})"


def sweep_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of adaptive K against target-only and the best point, per concurrency (and proposer)."""
    return _named(rows, SWEEP_COLUMNS, [sweep_cells(r) for r in rows])


COMPARISON_COLUMNS = ["conc", "proposer", "best", "best tok/s", "vs target-only", "vs best other"]


def comparison_cells(row: dict) -> list[str]:
    return [
        str(row["concurrency"]),
        row["proposer"],
        "adaptive" if row["best_num_draft_tokens"] is None else f"K={row['best_num_draft_tokens']}",
        _f(row["best_tokens_per_s"], ".1f"),
        _f(row["vs_target_only"], ".2f"),
        _f(row["vs_best_other"], ".2f"),
    ]


def proposer_acceptance(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of acceptance per proposer that gave the draft tokens (draft model, prompt lookup) for every
    speculative point; empty where only the draft model proposed (the main table's accept is then its)."""
    sources = sorted(
        {name for r in rows for name in r["acceptance_by_proposer"]},
        key=lambda n: (PROPOSER_ORDER.get(n, 2), n),
    )
    if sources in ([], ["draft"]) and not several_proposers(rows):
        return [], []
    header = ["proposer", "K", "conc"] + [
        f"{name} {what}" for name in sources for what in ("accept", "acc len", "share")
    ]
    cells = []
    for r in (r for r in rows if r["acceptance_by_proposer"]):
        by_source = r["acceptance_by_proposer"]
        cells.append(
            [r["proposer"], r["k"], str(r["concurrency"])]
            + [
                _f(by_source.get(name, {}).get(key), spec)
                for name in sources
                for key, spec in (
                    ("acceptance_rate", ".3f"),
                    ("mean_accepted_length", ".2f"),
                    ("share_of_drafted", ".2f"),
                )
            ]
        )
    return header, cells


def schedule_text(schedule: dict[int, int]) -> str:
    """The schedule as it reads in a recipe: ``{1: 8, 4: 4, 16: 0}``."""
    return "{" + ", ".join(f"{c}: {k}" for c, k in sorted(schedule.items())) + "}"


def _schedule_line(result: BenchResult) -> str:
    return (
        f"Recommended speculative.schedule: {schedule_text(result.recommended_schedule())} (per concurrency the "
        f"largest K not slower than target-only and within {SCHEDULE_TOLERANCE:.0%} of the best point; "
        "`--write-recipe` writes it)."
    )


def _per_position_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    rows = [r for r in rows if r["per_position_acceptance"]]
    cells = [
        [r["k"], str(r["concurrency"]), " ".join(f"{a:.2f}" for a in r["per_position_acceptance"])]
        for r in rows
    ]
    return _named(rows, ["K", "conc", "positions 1..K"], cells)


def set_acceptance(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of acceptance per prompt set and speculative point; empty when every prompt is raw text."""
    names = list(dict.fromkeys(name for r in rows for name in r["acceptance_by_set"]))
    if names in ([], ["raw"]):
        return [], []
    header = ["K", "conc"] + [f"{name} {what}" for name in names for what in ("accept", "acc len")]
    rows = [r for r in rows if r["acceptance_by_set"]]
    cells = [
        [r["k"], str(r["concurrency"])]
        + [
            _f(r["acceptance_by_set"].get(name, {}).get(key), spec)
            for name in names
            for key, spec in (("acceptance_rate", ".3f"), ("mean_accepted_length", ".2f"))
        ]
        for r in rows
    ]
    return _named(rows, header, cells)


def bench_markdown(result: BenchResult, plots: list[str] | None = None) -> str:
    rows = result.rows()
    ratios = (
        ", ".join(f"{r:.3f} (concurrency {c})" for c, r in result.draft_cost_ratio.items()) or "not measured"
    )
    parts = [
        f"# trtspec bench: {result.system}",
        "",
        f"{result.prompts} prompts, greedy, {budget_text(result)}, proposers: "
        f"{proposers_text(result)}; K=0 is target-only decoding on the same system in the same run. Draft/target "
        f"cost ratio: {ratios}.",
        "",
        markdown_table(*point_table(rows)),
        "",
        "speedup: tokens/s over target-only at the same concurrency; bound: analytic speedup bound, tokens per round "
        "(measured; from the acceptance rate where rounds are not reported) over the round's cost in target steps "
        "(Leviathan et al. 2023; a lookup costs none); achieved: speedup / bound; ITL: per-token "
        "inter-token latency (a piece of n tokens counts n times at gap/n).",
        "",
        _recommendation(result),
    ]
    comparison = result.proposer_comparison()
    if comparison:
        parts += [
            "",
            "## Proposers against target-only and each other",
            "",
            "best: the proposer's fastest point at that concurrency (a static K or adaptive); vs best other: its "
            "tokens/s over the fastest point of any other proposer.",
            "",
            markdown_table(COMPARISON_COLUMNS, [comparison_cells(r) for r in comparison]),
        ]
    sweep = result.sweep_summary()
    if sweep:
        parts += [
            "",
            "## Adaptive K against target-only and every static K",
            "",
            "best: the fastest point measured at that concurrency (target-only or a static K); adaptive mean K: "
            "draft tokens per target forward of the adaptive requests; adaptive / best and / target-only: pooled "
            "tokens/s over pooled tokens/s; paired: the median, over the timing samples, of adaptive's tokens/s "
            "over that point's in the same sample (the same requests, run back to back), which a slow spell of "
            "the machine falling on one point's sample moves less; in brackets its "
            f"{INTERVAL_LEVEL:.0%} bootstrap interval over the samples (with {INTERVAL_MIN_PAIRS} or more), the "
            "noise between this run's samples: an interval that holds 1 is no measured difference.",
            "",
            markdown_table(*sweep_table(sweep)),
            "",
            _schedule_line(result),
        ]
    by_proposer = proposer_acceptance(rows)
    if by_proposer[1]:
        parts += [
            "",
            "## Acceptance per proposer",
            "",
            "Who gave each round's draft tokens (draft: the draft model; ngram: prompt lookup; draft+ngram picks one "
            "per row and round): accepted / drafted, accepted tokens per round, and share of the drafted tokens.",
            "",
            markdown_table(*by_proposer),
        ]
    set_header, set_rows = set_acceptance(rows)
    if set_rows:
        parts += [
            "",
            "## Acceptance per prompt set",
            "",
            "raw: prompt text as given; chat: messages rendered with the target tokenizer's chat template; "
            "grounded: answers that repeat the prompt (validate/prompts.py).",
            "",
            markdown_table(set_header, set_rows),
        ]
    per_position = _per_position_rows(rows)
    if per_position[1]:
        parts += [
            "",
            "## Per-position acceptance",
            "",
            "Fraction of rounds whose i-th draft token was accepted, i = 1..K.",
            "",
            markdown_table(*per_position),
        ]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    if result.notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(parts) + "\n"


PLOTS = ("speedup_acceptance.png", "latency_concurrency.png")


def write_plots(result: BenchResult, out_dir: Path) -> list[Path]:
    """speedup_acceptance.png (speedup, bound and acceptance vs K) and latency_concurrency.png (TTFT/ITL p50 vs
    concurrency per K) into ``out_dir``; returns their paths. Lines are per proposer where several were swept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = result.rows()
    named = several_proposers(every)
    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for (proposer, c), sel in _k_lines(every).items():
        label = f"{proposer}, concurrency {c}" if named else f"concurrency {c}"
        line = ax_speed.plot(
            [r["num_draft_tokens"] for r in sel],
            [r["speedup"] or 0 for r in sel],
            "o-",
            label=f"measured, {label}",
        )[0]
        bound = [(r["num_draft_tokens"], r["analytic_bound"]) for r in sel if r["analytic_bound"] is not None]
        if bound:
            ax_speed.plot(*zip(*bound, strict=True), "--", color=line.get_color(), label=f"bound, {label}")
        acc = [(r["num_draft_tokens"], r["acceptance_rate"]) for r in sel if r["acceptance_rate"] is not None]
        if acc:
            ax_acc.plot(*zip(*acc, strict=True), "o-", label=label)
    ax_speed.axhline(1.0, color="gray", linewidth=0.8)
    ax_speed.set(xlabel="num_draft_tokens K", ylabel="speedup over target-only", title="Speedup vs K")
    ax_acc.set(xlabel="num_draft_tokens K", ylabel="acceptance rate", title="Acceptance vs K", ylim=(0, 1.05))
    for ax in (ax_speed, ax_acc):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths = [_save(fig, out_dir / PLOTS[0])]
    fig, (ax_ttft, ax_itl) = plt.subplots(1, 2, figsize=(10, 4))
    for (proposer, k), sel in _concurrency_lines(every).items():
        label = "target-only" if k == 0 else "adaptive K" if k is None else f"K={k}"
        label = f"{proposer} {label}" if named and k != 0 else label
        # an unknown latency (a server that answers whole, not streamed) is a gap, not 0 ms
        ax_ttft.plot(
            [r["concurrency"] for r in sel], [_plot_ms(r["ttft_p50_s"]) for r in sel], "o-", label=label
        )
        ax_itl.plot(
            [r["concurrency"] for r in sel], [_plot_ms(r["itl_p50_s"]) for r in sel], "o-", label=label
        )
    ax_ttft.set(xlabel="concurrency", ylabel="ms", title="Time to first token (p50)")
    ax_itl.set(xlabel="concurrency", ylabel="ms", title="Inter-token latency (p50)")
    for ax in (ax_ttft, ax_itl):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / PLOTS[1]))
    return paths


def _k_lines(rows: list[dict]) -> dict[tuple[str | None, int], list[dict]]:
    """Per (proposer, concurrency): target-only and the proposer's static K points, in K order (adaptive has no K
    for the x axis)."""
    lines: dict[tuple[str | None, int], list[dict]] = {}
    proposers = list(dict.fromkeys(r["proposer"] for r in rows if r["proposer"])) or [None]
    for c in sorted({r["concurrency"] for r in rows}):
        for proposer in proposers:
            sel = [
                r
                for r in rows
                if r["concurrency"] == c
                and r["num_draft_tokens"] is not None
                and r["proposer"] in (None, proposer)
            ]
            lines[proposer, c] = sorted(sel, key=lambda r: r["num_draft_tokens"])
    return lines


def _concurrency_lines(rows: list[dict]) -> dict[tuple[str | None, int | None], list[dict]]:
    """Per (proposer, K), target-only once: its points in concurrency order, adaptive K last."""
    keys = sorted(
        {(r["proposer"], r["num_draft_tokens"]) for r in rows},
        key=lambda key: (key[0] is not None, key[0] or "", key[1] is None, key[1] or 0),
    )
    return {
        key: sorted(
            (r for r in rows if (r["proposer"], r["num_draft_tokens"]) == key), key=lambda r: r["concurrency"]
        )
        for key in keys
    }


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
