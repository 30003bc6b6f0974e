"""Validation reports as pure functions of a ``ValidationResult``: a JSON-ready dict, Markdown, and the rows of
its tables (``trtspec.outputs.write_file_atomic`` writes them; trtspec/views.py shows them)."""

from __future__ import annotations

from dataclasses import replace

from trtspec.validate.systems import proposer_summary
from trtspec.validate.validation import PromptOutcome, ValidationResult, k_label


def _mean_accepted_length(stats) -> float | None:
    # Servers that report only accepted/drafted totals give no round count: the length is unknown, not 0.
    return stats.mean_accepted_length if stats.rounds else None


def outcome_to_dict(o: PromptOutcome, timed: bool = True) -> dict:
    """One prompt's entry; ``timed`` False where the run withholds its rates (ValidationResult.speed_withheld: a
    prompt's rate is noisier still)."""
    stats = o.speculative.stats
    return {
        "id": o.prompt.id,
        "category": o.prompt.category,
        "prompt_set": o.prompt.prompt_set,
        "vs_reference": o.vs_reference.to_dict(),
        "control": None if o.control is None else o.control.to_dict(),
        "divergence": None if o.divergence is None else o.divergence.to_dict(),
        "acceptance_rate": stats.measured_acceptance if stats else None,
        "mean_accepted_length": _mean_accepted_length(stats) if stats else None,
        "by_proposer": proposer_summary(stats) if stats else {},
        "generated_tokens": len(o.speculative.token_ids),
        "tokens_per_s": len(o.speculative.token_ids) / o.speculative.elapsed_s
        if o.speculative.elapsed_s and timed
        else None,
        "reference_ids": o.reference,
        "speculative_ids": o.speculative.token_ids,
        "text": o.speculative.text,
    }


def set_summaries(result: ValidationResult) -> dict[str, dict]:
    """Per prompt set ('raw', 'chat', 'grounded'; Prompt.prompt_set), in order of appearance: exact match, control
    and acceptance (also per proposer) over that set's prompts alone (chat traffic accepts differently from raw
    text, and prompt lookup matches far more where the answer repeats the input)."""
    sets: dict[str, list[PromptOutcome]] = {}
    for o in result.outcomes:
        sets.setdefault(o.prompt.prompt_set, []).append(o)
    out = {}
    for name, outcomes in sets.items():
        part = replace(result, outcomes=outcomes)  # the rate properties read only the outcomes
        out[name] = {
            "prompts": len(outcomes),
            "exact_match_rate": part.exact_match_rate,
            "mean_token_agreement": part.mean_token_agreement,
            "control_match_rate": part.control_match_rate,
            "acceptance_rate": part.stats.measured_acceptance,
            "mean_accepted_length": _mean_accepted_length(part.stats),
            "by_proposer": proposer_summary(part.stats),
        }
    return out


def validation_to_dict(result: ValidationResult) -> dict:
    stats = result.stats
    t = result.thresholds
    return {
        "system": result.system,
        "num_draft_tokens": k_label(None) if result.num_draft_tokens is None else result.num_draft_tokens,
        "proposer": result.proposer,
        "max_new_tokens": result.max_new_tokens,
        "overall": {
            "prompts": len(result.outcomes),
            "exact_match_rate": result.exact_match_rate,
            "mean_token_agreement": result.mean_token_agreement,
            "control_match_rate": result.control_match_rate,
            "acceptance_rate": stats.measured_acceptance,
            "mean_accepted_length": _mean_accepted_length(stats),
            "tokens_per_s": result.tokens_per_s,
            "target_only_tokens_per_s": result.target_only_tokens_per_s,
            "speedup": result.tokens_per_s / result.target_only_tokens_per_s
            if result.tokens_per_s and result.target_only_tokens_per_s
            else None,
            "by_proposer": proposer_summary(stats),
        },
        "sets": set_summaries(result),
        # merged stats keep the longest request's time, not the run's (batches run one after another): the rate
        # is the run's own
        "stats": stats.to_dict() | {"tokens_per_s": None if result.speed_withheld else result.tokens_per_s},
        "thresholds": {
            "min_exact_match": t.min_exact_match,
            "min_acceptance": t.min_acceptance,
            "min_control_match": t.min_control_match,
        },
        "passed": not result.failures(),
        "failures": result.failures(),
        "notes": result.notes,
        "prompts": [outcome_to_dict(o, not result.speed_withheld) for o in result.outcomes],
    }


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def prompt_rows(result: ValidationResult) -> list[list[str]]:
    """The per-prompt table's rows (no rate where the run withholds its own)."""
    return [_prompt_row(o, not result.speed_withheld) for o in result.outcomes]


def _prompt_row(o: PromptOutcome, timed: bool) -> list[str]:
    d = outcome_to_dict(o, timed)
    div = o.vs_reference.first_divergence
    return [
        o.prompt.id,
        "yes" if o.vs_reference.exact_match else "NO",
        "-" if div is None else str(div),
        _fmt(o.divergence.margin if o.divergence else None, ".3g"),
        _fmt(o.vs_reference.token_agreement),
        "-" if o.control is None else "yes" if o.control.exact_match else "NO",
        _fmt(d["acceptance_rate"]),
        _fmt(d["mean_accepted_length"], ".2f"),
        _fmt(d["tokens_per_s"], ".1f"),
    ]


# Short headers so the terminal table (trtspec/views.py) fits 80 columns; the Markdown report explains them under
# its table.
PROMPT_COLUMNS = ["prompt", "match", "1st div", "margin", "agree", "control", "accept", "acc len", "tok/s"]
COLUMN_LEGEND = (
    "match: exact match vs the HF reference; 1st div: first divergent token index; margin: the reference's "
    "top-1 minus top-2 logit at that token (a near-tie when small, docs/exactness.md); agree: token agreement; "
    "control: speculative == target-only on the same system; accept: acceptance rate; acc len: mean accepted "
    "length (draft tokens per round); tok/s: generated tokens per second (speculative)."
)


def summary_rows(result: ValidationResult) -> list[tuple[str, str]]:
    d = validation_to_dict(result)["overall"]
    return [
        ("exact-match rate vs HF reference", _fmt(d["exact_match_rate"])),
        ("mean token agreement", _fmt(d["mean_token_agreement"])),
        ("control match rate (speculative vs target-only)", _fmt(d["control_match_rate"])),
        ("acceptance rate", _fmt(d["acceptance_rate"])),
        ("mean accepted length", _fmt(d["mean_accepted_length"], ".2f")),
        ("tokens/s speculative", _fmt(d["tokens_per_s"], ".1f")),
        ("tokens/s target-only", _fmt(d["target_only_tokens_per_s"], ".1f")),
        ("speedup", _fmt(d["speedup"], ".2f") + ("x" if d["speedup"] else "")),
    ]


SET_COLUMNS = ["prompt set", "prompts", "match", "agree", "control", "accept", "acc len"]


def prompt_set_rows(result: ValidationResult) -> list[list[str]]:
    """Rows of the per-set table; none when every prompt is raw text (the overall table says it all)."""
    sets = set_summaries(result)
    if list(sets) == ["raw"]:
        return []
    return [
        [
            name,
            str(d["prompts"]),
            _fmt(d["exact_match_rate"]),
            _fmt(d["mean_token_agreement"]),
            _fmt(d["control_match_rate"]),
            _fmt(d["acceptance_rate"]),
            _fmt(d["mean_accepted_length"], ".2f"),
        ]
        for name, d in sets.items()
    ]


PROPOSER_COLUMNS = ["prompt set", "proposer", "rounds", "drafted", "accepted", "accept", "acc len", "share"]


def proposer_rows(result: ValidationResult) -> list[list[str]]:
    """Rows of the per-proposer table: every prompt ('all'), then each prompt set where there are several; none
    where nothing was drafted."""
    sets = set_summaries(result)
    parts = {"all": proposer_summary(result.stats)}
    if len(sets) > 1:
        parts |= {name: d["by_proposer"] for name, d in sets.items()}
    return [
        [
            part,
            name,
            str(d["rounds"]) if d["rounds"] else "-",
            str(d["drafted"]),
            str(d["accepted"]),
            _fmt(d["acceptance_rate"]),
            _fmt(d["mean_accepted_length"], ".2f"),
            _fmt(d["share_of_drafted"], ".2f"),
        ]
        for part, by_proposer in parts.items()
        for name, d in by_proposer.items()
    ]


PROPOSER_LEGEND = (
    "proposer: who gave a round's draft tokens (draft: the draft model; ngram: prompt lookup); accept: its accepted "
    "/ drafted; acc len: its accepted tokens per round; share: its part of all drafted tokens; rounds '-': the "
    "system reports totals only."
)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


# The report's first line: what `validate --report` may replace without --force
REPORT_TITLE = "# trtspec validate:"


def validation_markdown(result: ValidationResult) -> str:
    failures = result.failures()
    verdict = "PASS" if not failures else "FAIL: " + "; ".join(failures)
    parts = [
        f"{REPORT_TITLE} {result.system}",
        "",
        f"{len(result.outcomes)} prompts, greedy, max_new_tokens={result.max_new_tokens}, "
        f"num_draft_tokens={k_label(result.num_draft_tokens)}, proposer {result.proposer}. Result: **{verdict}**",
        "",
        "## Overall",
        "",
        markdown_table(["metric", "value"], [list(r) for r in summary_rows(result)]),
        "",
    ]
    set_rows = prompt_set_rows(result)
    if set_rows:
        parts += [
            "## Per prompt set",
            "",
            markdown_table(SET_COLUMNS, set_rows),
            "",
            "raw: prompt text as given; chat: messages rendered with the target tokenizer's chat template; "
            "grounded: answers that repeat the prompt (validate/prompts.py). match: exact-match rate; agree: mean "
            "token agreement; control: speculative == target-only rate.",
            "",
        ]
    by_proposer = proposer_rows(result)
    if by_proposer:
        parts += [
            "## Acceptance per proposer",
            "",
            markdown_table(PROPOSER_COLUMNS, by_proposer),
            "",
            PROPOSER_LEGEND,
            "",
        ]
    parts += [
        "## Per prompt",
        "",
        markdown_table(PROMPT_COLUMNS, prompt_rows(result)),
        "",
        COLUMN_LEGEND,
    ]
    if result.notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(parts) + "\n"
