"""The work behind ``trtspec validate`` and ``trtspec bench``: options -> system -> run -> print / write / gate.

The Click commands in cli.py only gather options into a ``ValidateOptions`` / ``BenchOptions`` and call
``validate`` / ``bench`` here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtspec.core.errors import CheckFailed, TrtspecError
from trtspec.outputs import check_output_dir, check_output_file, write_file_atomic, write_output_dir
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
    chat: bool = False  # raw prompts as single user messages through the chat template


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
            llmapi_max_draft_len=llmapi_max_draft_len(recipe),
        )
    if kind == "trtllm":
        # Same API as SpeculativeEngine; raises NeedsTensorRTLLM (exit 3) outside the NGC image.
        from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner
        from trtspec.validate.systems import EngineSystem

        runner = TrtllmSpeculativeRunner.from_recipe(recipe, max_batch_size=options.max_batch_size)
        return EngineSystem(runner, name=f"TensorRT-LLM engines (engines/{recipe.name})")
    raise TrtspecError(f"--system {kind!r} is not one of {', '.join(SYSTEMS)}")


def llmapi_max_draft_len(recipe) -> int | None:
    """The K a trtllm-pytorch deployment of ``recipe`` drafts every round (its model.yaml's max_draft_len); None
    when the recipe cannot be deployed there."""
    from trtspec.builders import support

    if support.llmapi_speculation_problem(recipe.speculative):
        return None
    return support.llmapi_speculation(recipe.speculative, recipe.limits.max_batch_size).max_draft_len


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
    from trtspec.validate.validation import run_validation

    recipe = load_recipe(options.recipe)
    if options.report:
        check_output_file(options.report, "--report")  # before the run, not after it
    prompts, tokenizer, _, notes = load_requests(
        recipe, options.prompts, options.limit, options.chat, options.max_tokens
    )
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


def dumps(payload: dict) -> str:
    return json.dumps(payload, indent=2, default=str) + "\n"


@dataclass
class BenchOptions:
    recipe: str = "demo"
    prompts: Path | None = None
    limit: int | None = None
    max_tokens: int = 64
    num_draft_tokens: tuple[int, ...] | None = None  # None: 1..max_draft_len
    concurrency: tuple[int, ...] | None = None  # None: DEFAULT_CONCURRENCY up to what the system takes
    draft_cost_ratio: float | None = None
    out_dir: Path | None = None
    system: SystemOptions = field(default_factory=SystemOptions)
    chat: bool = False  # raw prompts as single user messages through the chat template
    write_recipe: Path | None = None  # a copy of the recipe with the recommended speculative.schedule
    repeats: int = 1  # passes over each concurrency's points, pooled
    min_groups: int = 1  # more passes where a pass has fewer groups of `concurrency` requests


DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)


def _draft_alone(recipe, options: SystemOptions, max_batch_size: int):
    """The draft model as a target-only engine (to measure the draft/target cost ratio in-process)."""
    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.validate.systems import EngineSystem, runtime_dtype

    engine = SpeculativeEngine.from_pretrained(
        recipe.draft.model,
        None,
        device=options.device,
        dtype=runtime_dtype(recipe, options.device, options.dtype),
        max_batch_size=max_batch_size,
        max_seq_len=recipe.limits.max_seq_len,
        trust_remote_code=recipe.draft.trust_remote_code,
    )
    return EngineSystem(engine, name="draft alone")


def _sweep_grid(options: BenchOptions, recipe, notes: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(K values, concurrencies) to sweep: the options', else 1..max_draft_len and DEFAULT_CONCURRENCY up to
    limits.max_batch_size for the in-process systems (noted); the given ones are checked by _check_sweep."""
    ks = options.num_draft_tokens or tuple(range(1, recipe.speculative.max_draft_len + 1))
    concurrency = options.concurrency
    if concurrency is None:
        limit = recipe.limits.max_batch_size if options.system.kind != "triton" else max(DEFAULT_CONCURRENCY)
        concurrency = tuple(c for c in DEFAULT_CONCURRENCY if c <= limit) or (limit,)
        if concurrency != DEFAULT_CONCURRENCY:
            notes.append(
                f"Concurrency swept up to the recipe's limits.max_batch_size {limit} (the in-process system runs "
                "concurrent requests as one batch)."
            )
    return ks, concurrency


def _check_sweep(options: BenchOptions, recipe) -> None:
    """K and concurrency the system can take: K <= max_draft_len; in-process, one KV-cache slot per request."""
    max_draft_len = recipe.speculative.max_draft_len
    too_big = [k for k in options.num_draft_tokens if k > max_draft_len]
    if too_big:
        raise TrtspecError(
            f"--num-draft-tokens {too_big[0]} > the recipe's speculative.max_draft_len "
            f"{max_draft_len}; sweep K <= {max_draft_len}"
        )
    limit, biggest = recipe.limits.max_batch_size, max(options.concurrency)
    if options.system.kind != "triton" and biggest > limit:
        raise TrtspecError(
            f"--concurrency {biggest} > the recipe's limits.max_batch_size {limit}: the in-process "
            f"{options.system.kind} runs concurrent requests as one batch; sweep concurrency <= {limit} or raise "
            "limits.max_batch_size"
        )


def check_requests_fit(prompts, requests, max_tokens: int, limits) -> None:
    """Every prompt fits the recipe's limits with ``max_tokens`` new tokens, checked before any model runs."""
    for prompt, request in zip(prompts, requests, strict=True):
        n = len(request.token_ids)
        if n > limits.max_input_len:
            raise TrtspecError(
                f"prompt {prompt.id}: {n} tokens > the recipe's limits.max_input_len {limits.max_input_len}; "
                "shorten it or raise limits.max_input_len"
            )
        if n + max_tokens > limits.max_seq_len:
            raise TrtspecError(
                f"prompt {prompt.id}: {n} tokens + --max-tokens {max_tokens} > the recipe's limits.max_seq_len "
                f"{limits.max_seq_len}; lower --max-tokens or raise limits.max_seq_len"
            )


def load_requests(recipe, path: Path | None, limit: int | None, chat: bool, max_tokens: int):
    """(prompts, target tokenizer, requests, notes): the prompt set encoded (chats through the target's chat
    template) and checked against the recipe's limits, before any model loads."""
    from trtspec.chat import has_chat_template
    from trtspec.core.model_dir import load_tokenizer
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.systems import encode_prompts

    tokenizer = load_tokenizer(recipe.target.model, recipe.target.trust_remote_code)
    # Base models have no chat template: the shipped chat set is left out for them; asked-for chats fail.
    chat_set = chat or has_chat_template(tokenizer)
    notes = []
    if path is None and not chat_set:
        notes.append(f"{recipe.target.model}: no chat template, so the shipped chat prompts were left out.")
    prompts = load_prompts(path, limit, chat=chat, chat_set=chat_set)
    requests = encode_prompts(tokenizer, prompts)
    check_requests_fit(prompts, requests, max_tokens, recipe.limits)
    return prompts, tokenizer, requests, notes


def bench(options: BenchOptions, out) -> dict:
    """Run the sweep with progress, print the table, write bench.json, bench.md and the plots atomically."""
    from rich.progress import Progress

    from trtspec.recipe import load_recipe
    from trtspec.validate.bench import (
        BenchResult,
        cost_ratios,
        run_sweep,
        sweep_passes,
        sweep_steps,
    )

    recipe = load_recipe(options.recipe)
    notes: list[str] = []
    ks, concurrency = _sweep_grid(options, recipe, notes)
    options = replace(options, num_draft_tokens=ks, concurrency=concurrency)
    _check_sweep(options, recipe)
    out_dir = options.out_dir or Path("bench") / recipe.name
    check_output_dir(out_dir, *BENCH_OUTPUT)  # before the sweep, not after
    if options.write_recipe:
        check_output_file(options.write_recipe, "--write-recipe")
    prompts, tokenizer, requests, more_notes = load_requests(
        recipe, options.prompts, options.limit, options.chat, options.max_tokens
    )
    notes += more_notes
    biggest = max(options.concurrency)
    options.system.max_batch_size = max(options.system.max_batch_size or 0, biggest)
    system = open_system(recipe, options.system, tokenizer)
    if system.fixed_k is not None:
        system.close()
        raise TrtspecError(
            f"{system.name} drafts a fixed K={system.fixed_k} (its model.yaml) with no per-request K and no "
            "target-only mode, so bench cannot sweep K or measure a speedup; use `trtspec validate --url` for "
            "its outputs, acceptance and tokens/s"
        )
    adaptive = system.adaptive
    if not adaptive:
        notes.append(
            f"{system.name}: a request without K gets the deployment's default, which is not adaptive K (the "
            "entry model's num_draft_tokens parameter), so adaptive K was not measured."
        )
    measure_draft = options.system.kind == "engine" and options.draft_cost_ratio is None
    draft = _draft_alone(recipe, options.system, biggest) if measure_draft else None
    passes = ", ".join(
        f"{sweep_passes(len(requests), c, options.repeats, options.min_groups)} at concurrency {c}"
        for c in options.concurrency
    )
    notes.append(
        "Points are interleaved: each group of `concurrency` requests runs under every point back to back (the "
        f"first point rotating), in passes ({passes}); each point pools its groups and passes."
    )
    if adaptive:
        notes.append(
            "Adaptive K is measured in steady state: one untimed adaptive pass runs first at each concurrency, "
            "so it has measured that batch size's round costs, as a server does in its first seconds."
        )
    total = sweep_steps(len(requests), options.concurrency, options.repeats, adaptive, options.min_groups)
    console = out.console()
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("bench", total=total)

            started = [0]

            def advance(label: str) -> None:
                progress.update(task, description=label, completed=started[0])
                started[0] += 1

            points = run_sweep(
                system,
                requests,
                ks=options.num_draft_tokens,
                concurrency=options.concurrency,
                max_new_tokens=options.max_tokens,
                adaptive=adaptive,
                repeats=options.repeats,
                min_groups=options.min_groups,
                draft_system=draft,
                advance=advance,
            )
    finally:
        system.close()
    ratios = cost_ratios(points)
    if options.draft_cost_ratio is not None:
        ratios = {c: options.draft_cost_ratio for c in options.concurrency}
        notes.append(f"Draft/target cost ratio {options.draft_cost_ratio} was given with --draft-cost-ratio.")
    elif not ratios:
        notes.append(
            "No draft/target cost ratio (only measured in-process): pass --draft-cost-ratio for the bound."
        )
    result = BenchResult(system.name, options.max_tokens, len(prompts), points, ratios, notes)
    recipe_copy = None
    if options.write_recipe:  # built (and validated) before anything is written
        recipe_copy = options.write_recipe, recipe_with_schedule(options.recipe, result, options.write_recipe)
    return report_bench(result, out_dir, out, recipe_copy)


def recipe_with_schedule(recipe_path: str, result, dest: Path) -> str:
    """The recipe copy ``--write-recipe`` saves: the recommended speculative.schedule, no pinned
    num_draft_tokens (a pinned K would override adaptive K and so the schedule), and the draft/target cost ratio
    measured at the lowest concurrency as speculative.draft_cost_ratio."""
    from trtspec.recipe import recipe_copy
    from trtspec.validate.bench_report import schedule_text

    schedule = result.recommended_schedule()
    changes = {"speculative.schedule": schedule, "speculative.num_draft_tokens": None}
    if result.draft_cost_ratio:
        lowest = min(result.draft_cost_ratio)
        changes["speculative.draft_cost_ratio"] = round(result.draft_cost_ratio[lowest], 3)
    header = (
        f"# Written by trtspec bench from {recipe_path}: speculative.schedule {schedule_text(schedule)} from its "
        f"measured table ({result.system}, concurrency {', '.join(str(c) for c in sorted(schedule))}).\n"
    )
    return recipe_copy(recipe_path, changes, dest, header)


BENCH_MARKER = "bench.json"  # the file that makes a folder an earlier bench report (which --out may replace)
# check_output_dir / write_output_dir arguments for bench's --out
BENCH_OUTPUT = (BENCH_MARKER, "a trtspec bench report", "--out")


def report_bench(result, out_dir: Path, out, recipe_copy: tuple[Path, str] | None = None) -> dict:
    """Write bench.json, bench.md and the PNG plots into ``out_dir`` (a temp dir renamed into place), and
    ``recipe_copy`` (path, text) atomically."""
    from trtspec.validate.bench_report import (
        bench_markdown,
        bench_tables,
        bench_to_dict,
        schedule_text,
        write_plots,
    )

    payload = bench_to_dict(result)

    def fill(tmp: Path) -> None:
        plots = write_plots(result, tmp)
        (tmp / BENCH_MARKER).write_text(dumps(payload))
        (tmp / "bench.md").write_text(bench_markdown(result, [p.name for p in plots]))

    write_output_dir(out_dir, *BENCH_OUTPUT, fill)
    payload["out_dir"] = str(out_dir)
    if recipe_copy is not None:
        write_file_atomic(*recipe_copy)
        payload["recipe_written"] = str(recipe_copy[0])
    if out.json:
        out.emit_json(payload)
    console = out.console()
    for table in bench_tables(result):
        console.print(table)
    recommended = ", ".join(f"concurrency {c}: K={k}" for c, k in result.recommended_k().items())
    console.print(f"recommended num_draft_tokens: {recommended}")
    console.print(f"recommended speculative.schedule: {schedule_text(result.recommended_schedule())}")
    console.print(f"wrote {out_dir}/bench.json, bench.md, speedup_acceptance.png, latency_concurrency.png")
    if recipe_copy is not None:
        console.print(
            f"wrote {recipe_copy[0]}: speculative.schedule {schedule_text(result.recommended_schedule())}, "
            "no pinned num_draft_tokens (adaptive K is its default)"
        )
    return payload
