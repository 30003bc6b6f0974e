"""The acceptance report of ``trtspec align``: held-out prompts, the draft before and after, side by side.

Greedy acceptance is measured exactly without running speculative decoding: along the target's greedy continuation
of each held-out prompt, one draft forward gives the draft's greedy guess at every position (``draft_matches``);
``core.metrics.greedy_rounds`` replays the rounds greedy decoding with K would run over that match vector, which
gives the counters the engine records (tests/test_align.py checks it against SpeculativeEngine). For each K up to
max_draft_len the report keeps acceptance per position, mean accepted length and core.metrics' analytic speedup
bound at the recipe's draft_cost_ratio; the recommended K is the aligned draft's best bound.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtspec.core.metrics import analytic_speedup_bound, greedy_rounds, merge_stats, per_position_acceptance


@torch.no_grad()
def draft_matches(draft, examples: list[dict]) -> list[list[bool]]:
    """Per example: does the draft's greedy token equal the continuation's token at each continuation position."""
    device = next(draft.parameters()).device
    rows = draft.get_input_embeddings().weight.shape[0]
    result = []
    for ex in examples:
        ids, start = ex["ids"].to(device), ex["start"]
        # an id past the draft's rows (a padded-vocabulary target's continuation) is read as its last row, as the
        # engine does (core.vocab.draft_input_ids); the draft never matches it
        seen = ids[None, :-1].clamp(max=rows - 1)
        logits = draft(input_ids=seen).logits[0, start - 1 :]  # [n, V]
        result.append((logits.argmax(-1) == ids[start:]).tolist())
    return result


def side(matches: list[list[bool]], k: int, draft_cost_ratio: float) -> dict:
    """Acceptance of one draft at K over every held-out continuation, as the engine's stats would sum them."""
    stats = merge_stats([greedy_rounds(m, k) for m in matches])
    return {
        "acceptance_rate": stats.acceptance_rate,
        "acceptance_per_position": per_position_acceptance(stats),
        "mean_accepted_length": stats.mean_accepted_length,
        "tokens_per_round": stats.tokens_per_round,
        "speedup_bound": analytic_speedup_bound(stats.tokens_per_round, k, draft_cost_ratio),
    }


def acceptance_report(
    before: list[list[bool]], after: list[list[bool]], max_k: int, draft_cost_ratio: float
) -> dict:
    """Both drafts at every K in 1..max_k, and the recommended K (the aligned draft's best speedup bound)."""
    per_k = {
        k: {"before": side(before, k, draft_cost_ratio), "after": side(after, k, draft_cost_ratio)}
        for k in range(1, max_k + 1)
    }
    recommended = max(per_k, key=lambda k: (round(per_k[k]["after"]["speedup_bound"], 9), -k))
    return {
        "held_out_prompts": len(after),
        "held_out_tokens": sum(len(m) for m in after),
        "draft_cost_ratio": draft_cost_ratio,
        "recommended_k": recommended,
        "per_k": per_k,
    }


def table_rows(report: dict, k: int | None = None) -> list[tuple[str, str, str, str]]:
    """(measure, before, after, change) rows at K (default: the recommended K)."""
    k = k or report["recommended_k"]
    before, after = report["per_k"][k]["before"], report["per_k"][k]["after"]
    rows = [("acceptance rate", before["acceptance_rate"], after["acceptance_rate"], ".3f")]
    for i, (b, a) in enumerate(
        zip(before["acceptance_per_position"], after["acceptance_per_position"], strict=True), start=1
    ):
        rows.append((f"acceptance at position {i}", b, a, ".3f"))
    rows += [
        ("mean accepted length", before["mean_accepted_length"], after["mean_accepted_length"], ".2f"),
        ("tokens per round", before["tokens_per_round"], after["tokens_per_round"], ".2f"),
        ("analytic speedup bound", before["speedup_bound"], after["speedup_bound"], ".2f"),
    ]
    return [(name, f"{b:{fmt}}", f"{a:{fmt}}", f"{a - b:+{fmt}}") for name, b, a, fmt in rows]


def report_title(report: dict) -> str:
    return (
        f"held-out prompts: {report['held_out_prompts']} ({report['held_out_tokens']} target tokens), greedy, "
        f"K={report['recommended_k']} (recommended), draft_cost_ratio {report['draft_cost_ratio']:g}"
    )


def selection_line(report: dict) -> str | None:
    """Which weights were written and why (``report["selection"]``, set by align), or None."""
    sel = report.get("selection")
    if sel is None:
        return None
    k, steps, step = sel["num_draft_tokens"], sel["steps"], sel["selected_step"]
    if not sel["validation_prompts"]:
        return f"Weights of the last training step ({steps}); no validation prompts chose among steps."
    acc = sel["validation_acceptance"]
    where = f"greedy acceptance at K={k} on {sel['validation_prompts']} validation prompts"
    if step == 0:
        return (
            f"Training did not raise the {where} by more than its noise ({sel['margin']:.3f}; source "
            f"{acc['source']:.3f}, last step {acc['last']:.3f}): the source draft's weights are written unchanged."
        )
    return (
        f"Weights of training step {step} of {steps}, the best {where} (source {acc['source']:.3f}, selected "
        f"{acc['selected']:.3f}, last step {acc['last']:.3f})."
    )


def report_markdown(report: dict, plot: str | None = None) -> str:
    lines = [
        f"# trtspec align: {report_title(report)}",
        "",
        "| | before | after | change |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {b} | {a} | {c} |" for name, b, a, c in table_rows(report)]
    if (line := selection_line(report)) is not None:
        lines += ["", line]
    lines += [
        "",
        "Acceptance rate and speedup bound at every K:",
        "",
        "| K | before | after | bound before | bound after |",
    ]
    lines.append("|---|---|---|---|---|")
    for k, both in report["per_k"].items():
        b, a = both["before"], both["after"]
        lines.append(
            f"| {k} | {b['acceptance_rate']:.3f} | {a['acceptance_rate']:.3f} | {b['speedup_bound']:.2f} | "
            f"{a['speedup_bound']:.2f} |"
        )
    if plot:
        lines += ["", f"![acceptance per position]({plot})"]
    return "\n".join(lines) + "\n"


def write_plot(report: dict, path: Path) -> Path:
    """Acceptance per position at the recommended K, before and after (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = report["recommended_k"]
    both = report["per_k"][k]
    positions = list(range(1, k + 1))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, marker in (("before", "o"), ("after", "s")):
        ax.plot(positions, both[name]["acceptance_per_position"], marker=marker, label=f"{name} draft")
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of rounds accepted")
    ax.set_ylim(0, 1)
    ax.set_xticks(positions)
    ax.set_title(f"greedy acceptance per position, K={k}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
