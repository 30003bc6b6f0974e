"""The work behind ``trtspec validate`` and ``trtspec bench``: options -> system -> run -> print / write / gate.

The Click commands in cli.py only gather options into a ``ValidateOptions`` / ``BenchOptions`` and call
``validate`` / ``bench`` here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import CheckFailed, TrtspecError
from trtspec.validate.validation import Thresholds

SYSTEMS = ("auto", "engine", "triton", "trtllm")


@dataclass
class SystemOptions:
    """Which system is under test. system 'auto': Triton when a URL is given, else the in-process engine."""

    system: str = "auto"
    url: str | None = None
    protocol: str = "auto"  # grpc | http | auto (from the URL's port / scheme)
    model: str | None = None  # Triton entry model; None = the repository's entry point
    device: str = "cpu"
    dtype: str = "auto"
    max_batch_size: int | None = None

    @property
    def kind(self) -> str:
        if self.system != "auto":
            return self.system
        return "triton" if self.url else "engine"


@dataclass
class ValidateOptions:
    recipe: str = "demo"
    prompts: Path | None = None
    limit: int | None = None
    max_tokens: int = 32
    num_draft_tokens: int | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    report: Path | None = None
    system: SystemOptions = field(default_factory=SystemOptions)


def open_system(recipe, options: SystemOptions, tokenizer=None):
    """The system under test named by ``options`` (tokenizer: the target's, for text-only endpoints)."""
    kind = options.kind
    if kind == "engine":
        from trtspec.validate.systems import EngineSystem

        return EngineSystem.from_recipe(recipe, options.device, options.dtype, options.max_batch_size)
    if kind == "triton":
        from trtspec.validate.endpoint import TritonSystem

        if not options.url:
            raise TrtspecError("--system triton needs --url HOST:PORT (the server's gRPC or HTTP address)")
        return TritonSystem(
            options.url,
            tokenizer,
            protocol=options.protocol,
            model=options.model,
            max_draft_len=recipe.speculative.max_draft_len,
            max_batch_size=options.max_batch_size or recipe.limits.max_batch_size,
        )
    if kind == "trtllm":
        from trtspec.validate.trtllm import TrtllmSystem

        return TrtllmSystem.from_recipe(recipe, max_batch_size=options.max_batch_size)
    raise TrtspecError(f"--system {kind!r} is not one of {', '.join(SYSTEMS)}")


def open_reference(recipe, options: SystemOptions):
    from trtspec.validate.reference import HFReference
    from trtspec.validate.systems import runtime_dtype

    # A CUDA system under test on a CPU-only machine still gets a CPU reference.
    device = options.device if options.kind == "engine" else "cpu"
    return HFReference.from_pretrained(
        recipe.target.model,
        device=device,
        dtype=runtime_dtype(recipe, device, options.dtype),
        trust_remote_code=recipe.target.trust_remote_code,
    )


def validate(options: ValidateOptions, out) -> dict:
    """Run the validation, print it, write the report; raise CheckFailed when a threshold failed."""
    from trtspec.recipe import load_recipe
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.validation import run_validation

    recipe = load_recipe(options.recipe)
    prompts = load_prompts(options.prompts, options.limit)
    console = out.console()
    reference = open_reference(recipe, options.system)
    system = open_system(recipe, options.system, reference.tokenizer)
    try:
        with console.status("validating") as status:
            result = run_validation(
                system,
                reference,
                prompts,
                max_new_tokens=options.max_tokens,
                num_draft_tokens=options.num_draft_tokens,
                thresholds=options.thresholds,
                progress=lambda msg: status.update(msg),
            )
    finally:
        system.close()
    return report_validation(result, options.report, out)


def report_validation(result, report: Path | None, out) -> dict:
    """Print tables (and --json), write the Markdown report, then gate: CheckFailed (exit 1) on a failure."""
    from trtspec.validate.report import (
        validation_markdown,
        validation_tables,
        validation_to_dict,
        write_atomic,
    )

    payload = validation_to_dict(result)
    if report:
        write_atomic(report, validation_markdown(result))
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


def dumps(payload: dict) -> str:
    return json.dumps(payload, indent=2, default=str) + "\n"
