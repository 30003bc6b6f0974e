"""The work behind ``trtspec bench``: the sweep grid -> requests -> system under test -> sweep -> write.

cli.py gathers the options into a ``BenchOptions``, calls ``bench`` and shows what it returns (trtspec/views.py);
the sweep itself is bench.py, its Markdown, table cells and plots bench_report.py.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.core.errors import EditedOutput, OutputError, TrtspecError
from trtspec.outputs import (
    EDIT_RECORD,
    check_output_dir,
    check_output_file,
    write_file_atomic,
    write_output_dir,
)
from trtspec.validate.bench import BenchResult
from trtspec.validate.bench_report import PLOTS
from trtspec.validate.inputs import (
    RunOptions,
    SystemOptions,
    check_num_draft_tokens,
    check_proposers,
    load_run_requests,
    open_system,
    served_system,
)
from trtspec.validate.systems import too_few_timed

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
BENCH_MARKER = "bench.json"  # the file that makes a folder an earlier bench report (which --out may replace)
# check_output_dir / write_output_dir arguments for bench's --out
BENCH_OUTPUT = (BENCH_MARKER, "a trtspec bench report", "--out")
BENCH_MARKDOWN = "bench.md"
REPORT_FILES = (BENCH_MARKER, BENCH_MARKDOWN, *PLOTS, EDIT_RECORD)  # a report folder's files (write_bench)


@dataclass(kw_only=True)
class BenchOptions(RunOptions):
    max_tokens: int = 64
    ks: tuple[int, ...] | None = None  # static K values to sweep; None: 1..max_draft_len
    concurrency: tuple[int, ...] | None = None  # None: DEFAULT_CONCURRENCY up to what the system takes
    draft_cost_ratio: float | None = None  # None: measured in-process
    out_dir: Path | None = None  # None: bench/<name>
    write_recipe: Path | None = None  # a copy of the recipe with the recommended speculative.schedule
    repeats: int = 1  # passes over each concurrency's points, pooled
    min_groups: int = 1  # more passes where a pass has fewer groups of `concurrency` requests
    proposers: tuple[str, ...] | None = None  # core/lookup.py PROPOSERS to sweep; None: the system's own
    load: str = "groups"  # bench.LOADS: groups issued together, or a steady load (streams)
    force: bool = False  # replace files edited or added in an earlier report at out_dir


# (description, points started, points in all) before each point of the sweep is measured
SweepProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class BenchOutcome:
    """What ``bench`` measured and where it wrote it; ``payload`` is bench.json's document plus out_dir (and
    recipe_written), the one --json prints."""

    result: BenchResult
    out_dir: Path
    recipe_written: Path | None
    payload: dict
    moved: str | None = None  # why the report is not at --out (files edited there during the sweep)


def bench(options: BenchOptions, on_progress: SweepProgress | None = None) -> BenchOutcome:
    """Run the sweep (``on_progress`` before each point), write bench.json, bench.md and the plots atomically."""
    from trtspec.recipe import load_recipe

    recipe = load_recipe(options.recipe)
    # bench loads no HF reference: --device and --dtype, which place what runs in-process, are refused with --url
    options.system.check(reference=False)
    with served_system(recipe, options.system) as (served, tokenizer):
        if served is not None:
            _refuse_fixed_k(served)
        return _bench(options, recipe, served, tokenizer, on_progress)


def _bench(options: BenchOptions, recipe, served, tokenizer, on_progress) -> BenchOutcome:
    """``bench`` once the server under test is open (``served``; None: in-process): its published max_draft_len
    and proposer set the K range and the default proposer."""
    from trtspec.core.lookup import uses_draft, uses_lookup

    notes: list[str] = []
    options = _sweep_grid(options, recipe, notes, served)
    _check_sweep(options, recipe, served)
    proposers = options.proposers or (served.proposer if served else recipe.speculative.proposer,)
    check_proposers(recipe, options.system, proposers)
    out_dir = options.out_dir or Path("bench") / recipe.name
    check_output_dir(out_dir, *BENCH_OUTPUT, force=options.force)  # before the sweep, not after
    if options.write_recipe:
        # the recipe itself may be updated in place; the prompts and the report may not be replaced by a recipe
        check_output_file(options.write_recipe, "--write-recipe", {"--prompts": options.prompts})
        _refuse_report_file(options.write_recipe, out_dir)
    _refuse_inputs_inside(out_dir, recipe.source, options.prompts, options.write_recipe)
    lookup = any(map(uses_lookup, proposers))
    prompts, tokenizer, requests, more_notes = load_run_requests(recipe, options, lookup, tokenizer)
    notes += more_notes
    system = served or _open_sweepable(recipe, options, tokenizer, proposers)
    try:
        notes += _sweep_notes(system, len(requests), options)
        points = _sweep(system, recipe, requests, options, on_progress)
    finally:
        if system is not served:  # bench closes the server it opened
            system.close()
    notes += system.notes
    ratios = _cost_ratios(points, options, notes, any(map(uses_draft, proposers)))
    result = BenchResult(
        system.name, options.max_tokens, len(prompts), points, ratios, notes, system.proposer, options.load
    )
    return _write(result, options, out_dir)


def _write(result: BenchResult, options: BenchOptions, out_dir: Path) -> BenchOutcome:
    """The report of a finished sweep (and --write-recipe's copy), with a note where its rates are noise."""
    why = too_few_timed(min((p.tokens for p in result.points), default=0))
    if why:  # validate withholds such a rate; bench's table is its rates, so it says so
        result.notes.append(
            f"a point's speedups, and the K recommended from them, are noise: {why}; time more prompts, a larger "
            "--max-tokens or more --repeats"
        )
    recipe_copy = None
    if options.write_recipe:  # built (and validated) before anything is written
        recipe_copy = options.write_recipe, recipe_with_schedule(options.recipe, result, options.write_recipe)
    payload = write_bench(result, out_dir, recipe_copy, force=options.force)
    written = payload.get("recipe_written")
    return BenchOutcome(
        result, Path(payload["out_dir"]), written and Path(written), payload, payload.get("moved")
    )


def _refuse_report_file(path: Path, out_dir: Path) -> None:
    """--write-recipe may lie inside --out, but not on a file of the report itself, nor on --out or a folder
    above it (compared where links and ``..`` lead)."""
    copy, folder = Path(path).resolve(), Path(out_dir).resolve()
    if copy == folder or copy in folder.parents:
        raise OutputError(
            f"--write-recipe {path} is --out {out_dir} or holds it; give a file, e.g. {folder / 'recipe.yaml'}"
        )
    if copy.parent == folder and copy.name in REPORT_FILES:
        raise OutputError(
            f"--write-recipe {path} is the report's own {copy.name}; choose another name, e.g. {folder / 'recipe.yaml'}"
        )


def _refuse_inputs_inside(out_dir: Path, recipe_file, prompts, write_recipe) -> None:
    """The report replaces --out whole: a recipe or prompt file this run reads there would be gone (a recipe
    --write-recipe saved there, benchmarked again). The recipe may lie there where --write-recipe rewrites it."""
    folder = Path(out_dir).resolve()
    rewritten = Path(write_recipe).resolve() if write_recipe else None
    for what, path in (("the recipe", recipe_file), ("--prompts", prompts)):
        if path is None or (what == "the recipe" and Path(path).resolve() == rewritten):
            continue
        if folder in Path(path).resolve().parents:
            raise OutputError(
                f"{what} {path} lies inside --out {out_dir}, which this run replaces; copy it out of the folder or "
                "choose another --out"
            )


def _sweep_grid(options: BenchOptions, recipe, notes: list[str], served=None) -> BenchOptions:
    """``options`` with the K values and concurrencies to sweep: the given ones, else 1..max_draft_len (the
    server's, ``served``, where it publishes one, else the recipe's) and DEFAULT_CONCURRENCY up to
    limits.max_batch_size for the in-process systems (noted)."""
    max_draft_len = served.max_draft_len if served else recipe.speculative.max_draft_len
    ks = options.ks or tuple(range(1, max_draft_len + 1))
    concurrency = options.concurrency
    if concurrency is None:
        limit = recipe.limits.max_batch_size if options.system.kind != "triton" else max(DEFAULT_CONCURRENCY)
        concurrency = tuple(c for c in DEFAULT_CONCURRENCY if c <= limit) or (limit,)
        if concurrency != DEFAULT_CONCURRENCY:
            notes.append(
                f"Concurrency swept up to the recipe's limits.max_batch_size {limit} (the in-process system runs "
                "concurrent requests as one batch)."
            )
    return replace(options, ks=ks, concurrency=concurrency)


def _check_sweep(options: BenchOptions, recipe, served=None) -> None:
    """K and concurrency the system can take: K <= max_draft_len (``served``'s: see check_num_draft_tokens);
    in-process, one KV-cache slot per request."""
    from trtspec.core.lookup import uses_draft

    check_num_draft_tokens(options.ks, recipe, served)
    if options.write_recipe and served is not None:
        # The copy keeps the recipe's limits and draft: a server's larger max_draft_len or a proposer needing a
        # draft the recipe lacks would fail it after the sweep.
        check_num_draft_tokens(options.ks, recipe)
        if uses_draft(served.proposer) and recipe.draft is None:
            raise TrtspecError(
                f"--write-recipe: the server proposes with {served.proposer}, which needs a draft, and the recipe "
                "has none; write the copy from the recipe the server was deployed from"
            )
    limit, biggest = recipe.limits.max_batch_size, max(options.concurrency)
    if options.system.kind != "triton" and biggest > limit:
        raise TrtspecError(
            f"--concurrency {biggest} > the recipe's limits.max_batch_size {limit}: the in-process "
            f"{options.system.kind} runs concurrent requests as one batch; sweep concurrency <= {limit} or raise "
            "limits.max_batch_size"
        )


def _open_sweepable(recipe, options: BenchOptions, tokenizer, proposers):
    """The in-process system under test (loading what ``proposers`` use), sized for the biggest concurrency."""
    biggest = max(options.concurrency)
    system_options = replace(options.system, max_batch_size=max(options.system.max_batch_size or 0, biggest))
    return open_system(recipe, system_options, tokenizer, proposers)


def _refuse_fixed_k(system) -> None:
    """A server that sets K itself (upstream's LLM-API model) has no K to sweep and no target-only baseline."""
    if system.fixed_k is not None:
        raise TrtspecError(
            f"{system.name} drafts a fixed K={system.fixed_k} (its model.yaml) with no per-request K and no "
            "target-only mode, so bench cannot sweep K or measure a speedup; use `trtspec validate --url` for "
            "its outputs, acceptance and tokens/s"
        )


def _sweep_notes(system, num_requests: int, options: BenchOptions) -> list[str]:
    """What the report says about how the points were measured."""
    from trtspec.validate.bench import STREAM_REQUESTS, sweep_passes

    notes = []
    if system.adaptive is None:  # the system's notes say why it is unknown
        notes.append(f"{system.name}: adaptive K was not measured.")
    if system.adaptive is False:
        notes.append(
            f"{system.name}: a request without K gets the deployment's default, which is not adaptive K (the "
            "entry model's num_draft_tokens parameter), so adaptive K was not measured."
        )
    passes = ", ".join(
        f"{sweep_passes(num_requests, c, options.repeats, options.min_groups, options.load)} at concurrency {c}"
        for c in options.concurrency
    )
    sample = (
        f"{STREAM_REQUESTS} x `concurrency` requests as a steady load"
        if options.load == "streams"
        else "group of `concurrency` requests"
    )
    notes.append(
        f"Points are interleaved: each {sample} runs under every point back to back (in orders where "
        f"each point follows every other equally often), in passes ({passes}); each point pools its groups and "
        "passes."
    )
    if system.adaptive:
        notes.append(
            "Adaptive K is measured in steady state: one untimed adaptive pass (per proposer) runs first at each "
            "concurrency, so it has measured that batch size's round costs, as a server does in its first seconds."
        )
    return notes


def _sweep(system, recipe, requests, options: BenchOptions, on_progress: SweepProgress | None) -> list:
    """run_sweep, telling ``on_progress`` how far it is; in-process, the draft alone too (for the draft/target
    cost ratio)."""
    from trtspec.core.lookup import uses_draft
    from trtspec.validate.bench import run_sweep, sweep_steps

    proposers = options.proposers or (None,)  # None: the system's own
    # the draft/target cost ratio bounds the draft model's points only: measured where one of them runs
    drafts = any(uses_draft(p or system.proposer) for p in proposers)
    measure_draft = (
        options.system.kind == "engine"
        and options.draft_cost_ratio is None
        and recipe.draft is not None
        and drafts
        # the draft alone runs the requests' target token ids: not where the draft has a tokenizer of its own
        and recipe.draft_tokenizer_dir() is None
    )
    draft = _draft_alone(recipe, options.system, max(options.concurrency)) if measure_draft else None
    adaptive = bool(system.adaptive)  # unknown (None): not measured, as the system's notes say
    total = sweep_steps(
        len(requests),
        options.concurrency,
        options.repeats,
        adaptive,
        options.min_groups,
        len(proposers),
        options.load,
    )
    started = itertools.count()

    def advance(label: str) -> None:
        on_progress(label, next(started), total)

    return run_sweep(
        system,
        requests,
        ks=options.ks,
        concurrency=options.concurrency,
        max_new_tokens=options.max_tokens,
        adaptive=adaptive,
        repeats=options.repeats,
        min_groups=options.min_groups,
        draft_system=draft,
        advance=advance if on_progress else None,
        proposers=proposers,
        load=options.load,
    )


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


def _cost_ratios(points, options: BenchOptions, notes: list[str], drafts: bool) -> dict[int, float]:
    """Draft/target cost ratio per concurrency: --draft-cost-ratio, else measured in-process (noted either way,
    where the draft model proposed: ``drafts``)."""
    from trtspec.validate.bench import cost_ratios

    if options.draft_cost_ratio is not None:
        notes.append(f"Draft/target cost ratio {options.draft_cost_ratio} was given with --draft-cost-ratio.")
        return {c: options.draft_cost_ratio for c in options.concurrency}
    ratios = cost_ratios(points)
    if not ratios and drafts:
        notes.append(
            "No draft/target cost ratio (only measured in-process): pass --draft-cost-ratio for the bound."
        )
    return ratios


def recipe_with_schedule(recipe_path: str, result, dest: Path) -> str:
    """The recipe copy ``--write-recipe`` saves: the recommended speculative.schedule, no pinned
    num_draft_tokens (a pinned K would override adaptive K and so the schedule), the proposer the schedule was
    measured for where the recipe names another, and the draft/target cost ratio measured at the lowest concurrency
    as speculative.draft_cost_ratio."""
    from trtspec.recipe import load_recipe, recipe_copy
    from trtspec.validate.bench_report import schedule_text

    schedule = result.recommended_schedule()
    changes = {"speculative.schedule": schedule, "speculative.num_draft_tokens": None}
    if result.primary != load_recipe(recipe_path).speculative.proposer:
        changes["speculative.proposer"] = result.primary
    if result.draft_cost_ratio:
        lowest = min(result.draft_cost_ratio)
        changes["speculative.draft_cost_ratio"] = round(result.draft_cost_ratio[lowest], 3)
    header = (
        f"# Written by trtspec bench from {recipe_path}: speculative.schedule {schedule_text(schedule)} from its "
        f"measured table ({result.system}, concurrency {', '.join(str(c) for c in sorted(schedule))}).\n"
    )
    return recipe_copy(recipe_path, changes, dest, header)


def write_bench(
    result: BenchResult, out_dir: Path, recipe_copy: tuple[Path, str] | None = None, force: bool = False
) -> dict:
    """Write bench.json, bench.md and the PNG plots into ``out_dir`` (a temp dir renamed into place), and
    ``recipe_copy`` (path, text) atomically (inside the folder's own write where it lies in ``out_dir``); returns
    bench.json's document plus where each was written.

    ``out_dir`` was checked before the sweep. Should a file there have been edited or added while it ran (an
    editor's swap file beside the earlier bench.md), the measured sweep is not thrown away: it goes to a new
    folder beside ``out_dir``, and ``moved`` says why."""
    from trtspec.validate.bench_report import bench_markdown, bench_to_dict, write_plots

    payload = bench_to_dict(result)
    inside = None  # the recipe copy's path inside out_dir, where it lies there
    if recipe_copy is not None:
        copy, folder = Path(recipe_copy[0]).resolve(), Path(out_dir).resolve()
        inside = copy.relative_to(folder) if copy.is_relative_to(folder) else None

    def fill(tmp: Path) -> None:
        plots = write_plots(result, tmp)
        (tmp / BENCH_MARKER).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        (tmp / BENCH_MARKDOWN).write_text(bench_markdown(result, [p.name for p in plots]))
        if inside is not None:
            (tmp / inside).parent.mkdir(parents=True, exist_ok=True)
            (tmp / inside).write_text(recipe_copy[1])

    try:
        written = write_output_dir(out_dir, *BENCH_OUTPUT, fill, force=force)
    except EditedOutput as err:
        written = write_output_dir(_beside(Path(out_dir)), *BENCH_OUTPUT, fill)
        payload["moved"] = f"{err}; this run's report went to {written} instead"
    payload["out_dir"] = str(written)
    if inside is not None:
        payload["recipe_written"] = str(written / inside)
    elif recipe_copy is not None:
        write_file_atomic(*recipe_copy)
        payload["recipe_written"] = str(recipe_copy[0])
    return payload


def _beside(out_dir: Path) -> Path:
    """A new folder next to ``out_dir``: its name and the time (-2, -3, ... within one second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidates = (
        out_dir.with_name(f"{out_dir.name}-{stamp}{f'-{n}' if n > 1 else ''}") for n in itertools.count(1)
    )
    return next(path for path in candidates if not path.exists())
