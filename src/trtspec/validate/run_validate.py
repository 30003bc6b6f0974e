"""The work behind ``trtspec validate``: requests -> system under test and HF reference -> run -> print, write, gate.

cli.py gathers the options into a ``ValidateOptions`` and calls ``validate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import CheckFailed
from trtspec.outputs import check_output_file, write_file_atomic
from trtspec.validate.inputs import RunOptions, load_run_requests, open_reference, open_system
from trtspec.validate.validation import Thresholds


@dataclass(kw_only=True)
class ValidateOptions(RunOptions):
    num_draft_tokens: int | None = None  # None: the recipe's pinned K, else adaptive K
    thresholds: Thresholds = field(default_factory=Thresholds)
    report: Path | None = None  # the Markdown report


def validate(options: ValidateOptions, out) -> dict:
    """Run the validation, print it, write the report; raise CheckFailed when a threshold failed."""
    from trtspec.recipe import load_recipe
    from trtspec.validate.validation import run_validation

    recipe = load_recipe(options.recipe)
    if options.report:
        check_output_file(options.report, "--report")  # before the run, not after it
    prompts, tokenizer, _, notes = load_run_requests(recipe, options)
    console = out.console()
    # The system first: an unreachable endpoint fails before the reference model is loaded.
    system = open_system(recipe, options.system, tokenizer)
    try:
        reference = open_reference(recipe, options.system)
        with console.status("validating") as status:
            result = run_validation(
                system,
                reference,
                prompts,
                max_new_tokens=options.max_tokens,
                # a system that sets K itself (upstream's LLM-API model) is measured at its K; else, as deploy writes
                # it, the recipe's pinned K or None: adaptive K
                num_draft_tokens=options.num_draft_tokens
                or system.fixed_k
                or recipe.speculative.num_draft_tokens,
                thresholds=options.thresholds,
                progress=lambda msg: status.update(msg),
            )
    finally:
        system.close()
    result.notes += notes
    return report_validation(result, options.report, out)


def report_validation(result, report: Path | None, out) -> dict:
    """Print tables (and --json), write the Markdown report, then gate: CheckFailed (exit 1) on a failure."""
    from trtspec.validate.report import (
        validation_markdown,
        validation_tables,
        validation_to_dict,
    )

    payload = validation_to_dict(result)
    if report:
        write_file_atomic(report, validation_markdown(result))
    if out.json:
        out.emit_json(payload)
    console = out.console()
    for table in validation_tables(result):
        console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    failures = result.failures()
    if failures:
        raise CheckFailed("validation failed: " + "; ".join(failures))
    console.print("[green]validation passed[/green]")
    return payload
