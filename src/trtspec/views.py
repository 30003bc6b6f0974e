"""How the CLI shows what its commands return: rich text on the terminal, or one JSON document on stdout (--json).

Only cli.py imports this module. The packages below return results and print nothing of them, so a tool or a test
can call them and show the result its own way. ``out`` is cli.Output (json / quiet, console(), emit_json()).
"""

from __future__ import annotations

import sys


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


def show_deploy(result, out) -> None:
    """A triton_repo.deploy.DeployResult."""
    if out.json:
        out.emit_json({"repo": str(result.repo), **result.manifest})
        return
    console = out.console()
    console.print(f"wrote {result.repo} ({result.runtime} runtime): {', '.join(result.models)}")
    console.print(f"serve it with: trtspec serve {result.repo}")


def show_align(result, out) -> None:
    """A builders.align.AlignResult: the before/after table, which weights were written, and where."""
    from trtspec.builders.align_report import report_table, selection_line

    if out.json:
        out.emit_json({"out": str(result.out), **result.record})
        return
    console = out.console()
    console.print(report_table(result.report))
    console.print(selection_line(result.report))
    console.print(f"wrote {result.out} (align.json, report.md, acceptance.png, recipe.yaml)")
    console.print(f"use it with: trtspec validate {result.out / 'recipe.yaml'}")


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
