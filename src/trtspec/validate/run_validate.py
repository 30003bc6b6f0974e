"""The work behind ``trtspec validate``: requests -> system under test and HF reference -> run -> write -> gate.

cli.py gathers the options into a ``ValidateOptions``, calls ``validate``, shows the result (trtspec/views.py),
then calls ``require_passed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import CheckFailed, OutputError
from trtspec.outputs import check_output_file, write_file_atomic
from trtspec.validate.inputs import (
    RunOptions,
    check_num_draft_tokens,
    check_proposers,
    load_run_requests,
    open_reference,
    open_system,
    served_system,
)
from trtspec.validate.report import REPORT_TITLE, validation_markdown
from trtspec.validate.validation import Thresholds, ValidationResult


@dataclass(kw_only=True)
class ValidateOptions(RunOptions):
    num_draft_tokens: int | None = None  # None: the recipe's pinned K, else adaptive K
    proposer: str | None = None  # None: the recipe's speculative.proposer (a server's: its repository's)
    thresholds: Thresholds = field(default_factory=Thresholds)
    report: Path | None = None  # the Markdown report
    force: bool = False  # replace a --report file that is not an earlier validate report


def validate(options: ValidateOptions, on_progress: Callable[[str], None] | None = None) -> ValidationResult:
    """Run the validation and write its Markdown report; returns the ``ValidationResult``. ``on_progress`` gets a
    line for each step of the run (reference, speculative, target-only)."""
    from trtspec.recipe import load_recipe

    recipe = load_recipe(options.recipe)
    options.system.check()
    if options.report:
        check_output_file(options.report, "--report", options.inputs())  # before the run, not after it
        refuse_other_file(options.report, options.force)
    with served_system(recipe, options.system) as (served, tokenizer):
        return _validate(options, recipe, served, tokenizer, on_progress)


def validated_k(asked: int | None, recipe, served=None) -> int | None:
    """The K validate measures (None: adaptive K): the one asked for; else, against a server, its default (the K
    upstream's LLM-API model fixes, the K its entry model pins, None where that is adaptive K), the recipe's
    pinned K where the server does not say; in-process, the recipe's pinned K, as deploy would write it."""
    if asked is not None:
        return asked
    if served is not None and served.adaptive:
        return None
    if served is not None and served.default_k is not None:
        return served.default_k
    return recipe.speculative.num_draft_tokens


def _validate(options: ValidateOptions, recipe, served, tokenizer, on_progress) -> ValidationResult:
    """``validate`` after its checks; ``served``: the server under test, opened already (None: in-process)."""
    from trtspec.core.lookup import uses_lookup
    from trtspec.validate.validation import other_model_note, run_validation

    check_num_draft_tokens([options.num_draft_tokens], recipe, served)
    proposer = options.proposer or (served.proposer if served else recipe.speculative.proposer)
    check_proposers(recipe, options.system, [proposer])
    prompts, tokenizer, _, notes = load_run_requests(recipe, options, uses_lookup(proposer), tokenizer)
    # The system before the reference model, as a server is (served_system): what fails to load fails first.
    system = served or open_system(recipe, options.system, tokenizer, [proposer])
    try:
        reference = open_reference(recipe, options.system)
        result = run_validation(
            system,
            reference,
            prompts,
            max_new_tokens=options.max_tokens,
            num_draft_tokens=validated_k(options.num_draft_tokens, recipe, served),
            thresholds=options.thresholds,
            progress=on_progress,
            proposer=options.proposer,
        )
    finally:
        if system is not served:  # validate closes the server it opened
            system.close()
    result.notes += notes + system.notes
    unrelated = other_model_note(result.outcomes, str(recipe.target.model))
    if unrelated is not None:
        result.notes.append(unrelated)
    if options.report:
        write_file_atomic(options.report, validation_markdown(result))
    return result


def refuse_other_file(path: Path, force: bool) -> None:
    """An existing --report file is replaced only where it is an earlier validate report (its first line), or
    with ``force``: notes a user keeps under that name are not lost to a run."""
    if force or not Path(path).is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    if not first.startswith(REPORT_TITLE):
        raise OutputError(
            f"--report {path} exists and is not a trtspec validate report; choose another path, or pass --force "
            "to replace it"
        )


def require_passed(result: ValidationResult) -> None:
    """The gate after the result is shown: CheckFailed (exit 1) naming every threshold the run failed."""
    failures = result.failures()
    if failures:
        raise CheckFailed("validation failed: " + "; ".join(failures))
