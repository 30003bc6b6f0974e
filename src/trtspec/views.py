"""How the CLI shows what its commands return: rich text on the terminal, or one JSON document on stdout (--json).

Only cli.py imports this module. The packages below return results and print nothing of them, so a tool or a test
can call them and show the result its own way. ``out`` is cli.Output (json / quiet, console(), emit_json()).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator

STATUS_STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def show_check(report, out) -> None:
    """A builders.check_report.CheckReport: a table of checks, the memory estimate and the verdict."""
    if out.json:
        out.emit_json(report.to_json())
        return
    if out.quiet:  # a failed check is an error: its line still shows
        for r in report.results:
            if r.status == "fail":
                print(f"FAIL {r.name}: {r.message}", file=sys.stderr)
        return
    from rich.table import Table

    from trtspec.builders.check_report import format_gib

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


def checkpoint_line(summary: dict) -> str:
    """One written checkpoint (a summary of builders.convert.export_models): role, path, format, parallelism and
    the interpreter check against the HF model."""
    v = summary["verification"]
    check = (
        "not verified"
        if v is None
        else f"verified: top-1 {v['top1_agreement']:.1%}, max abs logit error {v['max_abs_logit_error']:.3g}"
    )
    what = summary["format"] if summary["format"] != "none" else summary["dtype"]
    return (
        f"{summary['role']}: {summary['checkpoint']} ({what}, tp={summary['tp_size']} pp={summary['pp_size']}; "
        f"{check})"
    )


def show_checkpoints(summaries: list[dict], out) -> None:
    if out.json:
        out.emit_json({"checkpoints": summaries})
        return
    console = out.console()
    for summary in summaries:
        console.print(checkpoint_line(summary))


def show_build(result, out) -> None:
    """A builders.build.BuildResult."""
    if out.json:
        out.emit_json(result.manifest)
        return
    what = "Checkpoints" if result.plan is None else "Engines"  # trtllm-pytorch serves HF checkpoints
    out.console().print(f"{what} ready in {result.out_dir} (ran: {', '.join(result.ran) or 'nothing'}).")


def print_line(console, text: str) -> None:
    """A line as written: a command or a path to copy is never wrapped at the console's width, and a path's
    brackets are not read as rich markup."""
    console.print(text, soft_wrap=True, highlight=False, markup=False)


def show_deploy(result, out) -> None:
    """A triton_repo.deploy.DeployResult."""
    if out.json:
        out.emit_json({"repo": str(result.repo), **result.manifest})
        return
    console = out.console()
    print_line(console, f"wrote {result.repo} ({result.runtime} runtime): {', '.join(result.models)}")
    print_line(console, f"serve it with: trtspec serve {shlex.quote(str(result.repo))}")


def show_rollout(result, out) -> None:
    """A triton_repo.k8s.RolloutResult."""
    if out.json:
        out.emit_json({"dir": str(result.dir), **result.manifest})
        return
    console = out.console()
    folder = shlex.quote(str(result.dir))
    namespace = result.manifest["namespace"]
    wait = f"kubectl wait{f' -n {namespace}' if namespace else ''} --timeout=24h"
    canary = result.manifest["workloads"]["canary"]
    lines = [
        f"wrote {result.dir} ({result.runtime} runtime, image {result.image})",
        f"apply it with: kubectl apply -k {folder}/overlays/production",
        f"a canary of it: kubectl apply -k {folder}/overlays/canary",
        # the gate's pod holds GPUs while it waits: it is applied once the canary serves
        f"its gate, trtspec validate, once it serves: {wait} --for=condition=Available {canary} && "
        f"kubectl apply -k {folder}/overlays/gate",
    ]
    if "/" not in result.image.split("@")[0]:  # Docker Hub's library/ has no trtspec image
        lines.append(
            f"note: image {result.image} names no registry, so nodes pull it only where it is already loaded "
            "(kind load docker-image); push your build of docker/Dockerfile (Dockerfile.cpu for torch on CPU) and set "
            "kubernetes.image to its tag"
        )
    build = result.manifest["jobs"]["build"]
    if build:  # a serving pod holds its GPUs while it waits for the build Job
        lines.append(
            "where no GPUs are spare for the build Job beside a new serving pod, build first: "
            f"kubectl apply -k {folder}/overlays/build && {wait} --for=condition=complete job/{build}"
        )
    for line in lines:
        print_line(console, line)


def align_table(report: dict):
    """align's report (builders.align_report.acceptance_report) as a before/after rich Table."""
    from rich.table import Table

    from trtspec.builders.align_report import report_title, table_rows

    table = Table(title=f"trtspec align: {report_title(report)}")
    for column in ("", "before", "after", "change"):
        table.add_column(column, justify="left" if not column else "right")
    for row in table_rows(report):
        table.add_row(*row)
    return table


def show_align(result, out) -> None:
    """A builders.align.AlignResult: the before/after table, which weights were written, and where."""
    from trtspec.builders.align_report import selection_line

    if out.json:
        out.emit_json({"out": str(result.out), **result.record})
        return
    console = out.console()
    console.print(align_table(result.report))
    console.print(selection_line(result.report))
    print_line(console, f"wrote {result.out} (align.json, report.md, acceptance.png, recipe.yaml)")
    print_line(console, f"use it with: trtspec validate {shlex.quote(str(result.out / 'recipe.yaml'))}")


def streams_text(out) -> bool:
    """generate streams its text to the terminal unless stdout carries JSON or nothing (-q)."""
    return not (out.json or out.quiet)


def write_text(piece: str) -> None:
    """One piece of generate's streamed text, shown as soon as it is accepted."""
    sys.stdout.write(piece)
    sys.stdout.flush()


def show_generated(generated, out) -> None:
    """An engines.generate.Generated, after its text was streamed (streams_text) or not."""
    if streams_text(out):
        sys.stdout.write("\n")
    if out.json:
        out.emit_json(generated.to_dict())
        return
    console = out.console()
    for line in generated.stats_lines():
        console.print(line, highlight=False, markup=False)


def validation_tables(result) -> list:
    """A validate.validation.ValidationResult as rich Tables: per prompt, per prompt set (where chat or grounded
    prompts ran), per proposer (where any drafted), overall."""
    from rich.table import Table

    from trtspec.validate import report
    from trtspec.validate.validation import k_label

    per_prompt = Table(
        title=f"validate: {result.system}, num_draft_tokens={k_label(result.num_draft_tokens)}, "
        f"proposer {result.proposer}"
    )
    for column in report.PROMPT_COLUMNS:
        per_prompt.add_column(column, justify="left" if column == "prompt" else "right")
    for row in report.prompt_rows(result):
        per_prompt.add_row(*row)
    overall = Table(title="overall", show_header=False)
    overall.add_column("metric")
    overall.add_column("value", justify="right")
    for name, value in report.summary_rows(result):
        overall.add_row(name, value)
    tables = [per_prompt]
    set_rows = report.prompt_set_rows(result)
    if set_rows:
        tables.append(_left_first_table("per prompt set", report.SET_COLUMNS, set_rows))
    proposer_rows = report.proposer_rows(result)
    if proposer_rows:
        tables.append(_left_first_table("acceptance per proposer", report.PROPOSER_COLUMNS, proposer_rows, 2))
    return [*tables, overall]


def _left_first_table(title: str, columns: list[str], cells: Iterable[list[str]], left: int = 1):
    """A rich Table whose first ``left`` columns (names) are left-aligned and the rest (numbers) right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < left else "right")
    for row in cells:
        table.add_row(*row)
    return table


def show_validation(result, out) -> None:
    """A validate.validation.ValidationResult: the tables and notes, and the verdict when every threshold passed
    (a failed one is the command's error, raised after this)."""
    from trtspec.validate.report import validation_to_dict

    if out.json:
        out.emit_json(validation_to_dict(result))
    console = out.console()
    for table in validation_tables(result):
        console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    if not result.failures():
        console.print("[green]validation passed[/green]")


def bench_tables(result) -> list:
    """A validate.bench.BenchResult as rich Tables: the sweep, the proposers against each other (where several
    ran), adaptive K against the best point per concurrency, then acceptance per proposer (where lookup proposed)
    and per prompt set (where chat or grounded prompts ran)."""
    from trtspec.validate import bench_report

    rows = result.rows()
    title = f"bench: {result.system}, proposers: {bench_report.proposers_text(result)}"
    tables = [_right_table(title, *bench_report.point_table(rows))]
    comparison = result.proposer_comparison()
    if comparison:
        cells = map(bench_report.comparison_cells, comparison)
        tables.append(
            _right_table("proposers vs target-only and each other", bench_report.COMPARISON_COLUMNS, cells)
        )
    sweep = result.sweep_summary()
    if sweep:
        title = "adaptive K vs target-only and the best point"
        tables.append(_right_table(title, *bench_report.sweep_table(sweep)))
    for title, (header, cells) in (
        ("acceptance per proposer", bench_report.proposer_acceptance(rows)),
        ("acceptance per prompt set", bench_report.set_acceptance(rows)),
    ):
        if cells:
            tables.append(_right_table(title, header, cells))
    return tables


def _right_table(title: str, columns: list[str], cells: Iterable[list[str]]):
    """A rich Table whose columns (numbers, mostly) are all right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in cells:
        table.add_row(*row)
    return table


def show_bench(outcome, out) -> None:
    """A validate.run_bench.BenchOutcome: the tables, the recommended K and speculative.schedule, what was written."""
    from trtspec.validate.bench_report import schedule_text
    from trtspec.validate.run_bench import REPORT_FILES

    if out.json:
        out.emit_json(outcome.payload)
    console = out.console()
    result = outcome.result
    for table in bench_tables(result):
        console.print(table)
    recommended = ", ".join(f"concurrency {c}: K={k}" for c, k in result.recommended_k().items())
    schedule = schedule_text(result.recommended_schedule())
    which = f" (proposer {result.primary})" if len(result.proposers) > 1 else ""
    console.print(f"recommended num_draft_tokens{which}: {recommended}")
    console.print(f"recommended speculative.schedule: {schedule}")
    if outcome.moved:
        console.print(outcome.moved, style="yellow", markup=False)
    shown = [name for name in REPORT_FILES if not name.startswith(".")]  # the edit record is not news
    console.print(f"wrote {outcome.out_dir}/{', '.join(shown)}")
    if outcome.recipe_written is not None:
        console.print(
            f"wrote {outcome.recipe_written}: speculative.schedule {schedule}, no pinned num_draft_tokens "
            "(adaptive K is its default)"
        )


# --- progress of long work: callbacks the commands pass down, drawn only while the block runs ---


@contextlib.contextmanager
def spinner(out) -> Iterator[Callable[[str], None]]:
    """An ``on_progress(message)`` callback: a rich status line from its first message to the end of the block,
    which leaves nothing on the terminal."""
    console = out.console()
    status = None

    def show(message: str) -> None:
        nonlocal status
        if status is None:
            status = console.status(message)
            status.start()
        else:
            status.update(message)

    try:
        yield show
    finally:
        if status is not None:
            status.stop()


@contextlib.contextmanager
def progress_bar(out) -> Iterator[Callable[[str, int, int], None]]:
    """An ``on_progress(description, completed, total)`` callback: a transient rich progress bar from its first
    call to the end of the block."""
    with _bars(out, transient=True) as show:
        yield lambda description, completed, total: show("", description, completed, total)


@contextlib.contextmanager
def stage_bars(out) -> Iterator[Callable[[str, str, float, float], None]]:
    """An ``on_progress(stage, description, completed, total)`` callback: one bar per stage (description, bar,
    elapsed time), from its first call to the end of the block, left on the terminal afterwards (nothing with
    --quiet)."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with _bars(out, transient=False, columns=columns, disable=out.quiet) as show:
        yield show


@contextlib.contextmanager
def _bars(out, *, transient: bool, columns=(), disable: bool = False):
    """One rich Progress, started at the first ``show(stage, description, completed, total)``, a bar per stage."""
    from rich.progress import Progress

    progress = Progress(*columns, console=out.console(), disable=disable, transient=transient)
    tasks: dict[str, object] = {}

    def show(stage: str, description: str, completed: float, total: float) -> None:
        if not tasks:
            progress.start()
        if stage not in tasks:
            tasks[stage] = progress.add_task(description, total=total, completed=completed)
        else:
            progress.update(tasks[stage], description=description, completed=completed, total=total)

    try:
        yield show
    finally:
        if tasks:  # rich's stop prints a newline to a non-terminal even when nothing was shown
            progress.stop()
