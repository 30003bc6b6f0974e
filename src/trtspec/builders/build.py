"""``trtspec build``: check -> convert/quantize -> engine build for both models, skipping up-to-date stages.

Layout under ``engines/<name>/``::

    target/checkpoint  target/engine  draft/checkpoint  draft/engine
    manifest.json      plan.json      finish_in_ngc.sh  logs/

(no draft/ where the recipe has no draft: prompt lookup alone needs the target engine only)

Stages, in order: 1. pre-flight checks (``preflight.run_checks``); 2. one convert/quantize stage per model
(``convert.export_checkpoint``); 3. the build plan (``plan.make_build_plan``), written as data and as a shell
script to finish in the NGC image; 4. one engine stage per model (``trtllm_build.build_engines``, in a child
process), or, without tensorrt_llm, exit status 3 (NeedsTensorRTLLM) after step 3.

For ``triton.runtime: trtllm-pytorch`` there are no engines: TensorRT-LLM's PyTorch backend loads Hugging Face
checkpoints. The build is then 1. the checks and 2. for each quantized model, one stage writing its ModelOpt HF
export to ``<role>/hf_checkpoint`` (``hf_export.export_hf``); an unquantized model is served from its own folder.

Every stage is skipped when up to date and never left half-written (``stage_cache``); the manifest, plan.json
and finish_in_ngc.sh are ``manifest``'s. This module is the orchestration: which stages run, in which order.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.builders import environment
from trtspec.builders.export_pipeline import export_bytes
from trtspec.builders.manifest import FINISH_SCRIPT, MANIFEST, PLAN_FILE, make_manifest, write_plan_files
from trtspec.builders.plan import BuildPlan, engine_roles, make_build_plan, read_checkpoint_config
from trtspec.builders.stage_cache import (
    clean_stale,
    digest,
    read_stamp,
    run_stage,
    tree_hash,
    up_to_date,
    write_json_atomic,
    write_stamp,
)
from trtspec.core import layout, trtllm
from trtspec.core.errors import CheckFailed, CheckpointError, NeedsTensorRTLLM, RecipeError
from trtspec.outputs import folder_bytes, hash_file, is_disk_full, no_space_error, replace_dir, temp_sibling
from trtspec.recipe import Recipe


@dataclass
class BuildResult:
    """What ``build`` did; ``manifest`` is what it wrote to ``out_dir/manifest.json``."""

    out_dir: Path
    plan: BuildPlan | None
    manifest: dict[str, Any] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- stages


def _say(console, message: str) -> None:
    if console is not None:
        console.print(message, highlight=False, soft_wrap=True)


def run_preflight(recipe: Recipe, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Stage 1; raises CheckFailed naming the first failed check (checks named in ``skip`` do not count)."""
    from trtspec.builders.preflight import run_checks

    start = time.perf_counter()
    report = run_checks(recipe)
    failed = [r for r in report.results if r.status == "fail" and r.name not in skip]
    if failed:
        detail = "\n".join(f"{r.name}: {r.message}" for r in failed)
        raise CheckFailed(
            f"pre-flight check {failed[0].name} failed: {failed[0].message} (see `trtspec check`)", detail
        )
    results = {r.name: r.status for r in report.results}
    return {"seconds": round(time.perf_counter() - start, 3), "results": results}


def convert_recipe_part(recipe: Recipe, role: str) -> dict[str, Any]:
    """The recipe fields a checkpoint depends on (changing anything else does not re-convert).

    The model's path is left out: its content is hashed instead, so a moved or re-mounted model stays up to date.
    A calibration file counts by its content too: an edited file re-quantizes, a moved one does not.
    """
    spec = recipe.models()[role]
    part = {"model": spec.model_dump(mode="json", exclude={"gpu_ids", "model"})}
    if spec.quantization != "none":
        calibration = recipe.calibration.model_dump(mode="json")
        if calibration["dataset"] != "builtin":
            try:
                calibration["dataset"] = hash_file(hashlib.sha256(), Path(calibration["dataset"])).hexdigest()
            except OSError as err:
                raise RecipeError(
                    recipe.source or recipe.name,
                    "calibration.dataset",
                    f"{calibration['dataset']}: cannot be read ({err.strerror}); a quantized checkpoint is matched "
                    "to the file's content (in the NGC image too: mount it at that path)",
                ) from None
        part["calibration"] = calibration
    return part


def _export(spec, out_dir: Path, recipe: Recipe, console) -> dict:
    from trtspec.builders.convert import export_checkpoint

    return export_checkpoint(
        spec, out_dir, calibration=recipe.calibration, device=recipe.calibration.device, console=console
    )


def model_stage_fingerprint(recipe: Recipe, role: str, kind: str) -> str:
    """What a model's convert/quantize/export output depends on: the recipe fields, the model's files, and the
    trtspec and nvidia-modelopt versions (a new modelopt may export differently)."""
    from trtspec import __version__

    spec = recipe.models()[role]
    return digest(
        {
            "trtspec": __version__,
            "modelopt": environment.package_versions()["nvidia-modelopt"],
            "recipe": convert_recipe_part(recipe, role),
            "input": tree_hash(spec.model),
            "as": kind,
        }
    )


def _model_stage(
    recipe: Recipe, role: str, out_dir: Path, subdir: str, what: str, export, console, force: bool
) -> dict[str, Any]:
    """One model's stage ``<role>.<subdir>`` in ``<role>/<subdir>``: ``export(spec, tmp)`` writes it and returns its
    summary; skipped when its inputs and outputs are unchanged."""
    spec = recipe.models()[role]
    part = convert_recipe_part(recipe, role)
    final = layout.stage_dir(out_dir, role, subdir)

    def work(tmp: Path) -> dict:
        _say(console, f"[bold]{role}[/]: {what}")
        summary = export(spec, tmp) | {subdir: str(final)}
        return {"recipe": part, "input_hash": tree_hash(spec.model), "summary": summary}

    fingerprint = model_stage_fingerprint(recipe, role, subdir)
    stamp = run_stage(f"{role}.{subdir}", final, fingerprint, work, force, export_bytes(spec))
    if stamp["skipped"]:
        _say(console, f"[bold]{role}[/]: {subdir} up to date, skipped")
    return stamp


def convert_stage(recipe: Recipe, role: str, out_dir: Path, console, force: bool) -> dict[str, Any]:
    """Stage 2 for one model: HF -> TensorRT-LLM checkpoint (convert or quantize)."""
    spec = recipe.models()[role]
    what = f"converting {spec.model} ({spec.quantization}, {spec.dtype})"

    def export(spec, tmp: Path) -> dict:
        return _export(spec, tmp, recipe, console)

    return _model_stage(recipe, role, out_dir, layout.CHECKPOINT, what, export, console, force)


def hf_export_stage(recipe: Recipe, role: str, out_dir: Path, console, force: bool) -> dict[str, Any]:
    """trtllm-pytorch, a quantized model: its ModelOpt HF export in <role>/hf_checkpoint (skipped when up to date)."""
    from trtspec.builders.hf_export import export_hf

    spec = recipe.models()[role]
    what = f"quantizing {spec.model} ({spec.quantization}) as a ModelOpt HF checkpoint"

    def export(spec, tmp: Path) -> dict:
        calibration = recipe.calibration
        return export_hf(spec, tmp, calibration=calibration, device=calibration.device, console=console)

    return _model_stage(recipe, role, out_dir, layout.QUANTIZED_HF_SUBDIR, what, export, console, force)


def _finish(recipe: Recipe, out_dir: Path, plan: BuildPlan | None, stages: dict[str, dict]) -> BuildResult:
    """A complete build: its manifest written, and what ran and what was skipped."""
    manifest = make_manifest(recipe, plan, stages, "complete")
    write_json_atomic(out_dir / MANIFEST, manifest)
    ran = [name for name, s in stages.items() if not s.get("skipped")]
    return BuildResult(out_dir, plan, manifest, ran=ran, skipped=manifest["skipped"])


def build_hf(recipe: Recipe, out_dir: Path, console, force: bool) -> BuildResult:
    """The trtllm-pytorch build: checks, then a ModelOpt HF export of each quantized model; no engines."""
    stages: dict[str, dict] = {"check": run_preflight(recipe)}
    for role, spec in recipe.models().items():
        if spec.quantization == "none":
            _say(console, f"[bold]{role}[/]: served from its Hugging Face checkpoint {spec.model}")
        else:
            stages[f"{role}.hf_checkpoint"] = hf_export_stage(recipe, role, out_dir, console, force)
    return _finish(recipe, out_dir, None, stages)


def existing_checkpoint(recipe: Recipe, role: str, out_dir: Path) -> dict[str, Any]:
    """For --engines-only: the stamp of a finished checkpoint made from this recipe's model settings."""
    ckpt = layout.stage_dir(out_dir, role, layout.CHECKPOINT)
    stamp = read_stamp(ckpt)
    if stamp is None:
        raise CheckpointError(
            f"{ckpt}: no finished checkpoint; run `trtspec build` without --engines-only first (it needs the HF models)"
        )
    if stamp.get("output_hash") != tree_hash(ckpt):  # large files are stamped by size and modification time
        raise CheckpointError(
            f"{ckpt}: its files changed since the build wrote them; copy a build with `cp -a` or `rsync -a` (which "
            "keep file times), or run `trtspec build` without --engines-only"
        )
    if stamp.get("info", {}).get("recipe") != convert_recipe_part(recipe, role):
        raise CheckpointError(
            f"{ckpt}: converted with other {role} settings than the recipe's; run `trtspec build` without --engines-only"
        )
    return stamp | {"skipped": True}


def plan_for(recipe: Recipe, out_dir: Path) -> BuildPlan:
    """Stage 3: the plan, from the finished checkpoints."""
    checkpoints = {}
    roles = engine_roles(recipe)
    for role in roles:
        ckpt = layout.stage_dir(out_dir, role, layout.CHECKPOINT)
        checkpoints[role] = (ckpt, read_checkpoint_config(ckpt))
    return make_build_plan(
        recipe, checkpoints, {role: layout.stage_dir(out_dir, role, layout.ENGINE) for role in roles}
    )


def engine_fingerprint(engine, checkpoint_stamp: dict, engine_env: dict[str, Any]) -> str:
    # Paths are left out on purpose: the same folder mounted elsewhere (the NGC container) is still up to date.
    # The environment is in: a new TensorRT-LLM or another GPU model makes every engine stale.
    payload = {"build_config": engine.build_config, "checkpoint": checkpoint_stamp.get("output_hash")}
    return digest(payload | {"environment": engine_env})


def engine_stages(
    plan: BuildPlan, checkpoints: dict[str, dict], out_dir: Path, console, force: bool
) -> dict[str, dict]:
    """Stage 4: build the engines that are not up to date, in one child process, then move each into place."""
    from trtspec.builders.trtllm_build import build_engines

    stamps, pending = {}, {}
    engine_env = environment.engine_environment()
    for engine in plan.engines():
        fingerprint = engine_fingerprint(engine, checkpoints[engine.role], engine_env)
        stamp = None if force else up_to_date(engine.engine_dir, fingerprint)
        if stamp is not None:
            stamps[engine.role] = stamp | {"skipped": True}
            _say(console, f"[bold]{engine.role}[/]: engine up to date, skipped")
        else:
            pending[engine.role] = (engine, fingerprint, temp_sibling(engine.engine_dir))
    if not pending:
        return stamps
    trtllm.require_tensorrt_llm()
    try:
        for role, (engine, _, _) in pending.items():
            _say(console, f"[bold]{role}[/]: building the engine: {shlex.join(engine.command())}")
        start = time.perf_counter()
        result = build_engines(
            [e.with_dirs(engine_dir=tmp) for e, _, tmp in pending.values()],
            out_dir / "logs" / "trtllm-build.log",
        )
        for role, (_, fingerprint, tmp) in pending.items():
            info = result["engines"][role] | {"tensorrt_llm_version": result["tensorrt_llm_version"]}
            seconds = info.get("seconds", round(time.perf_counter() - start, 3))
            stamps[role] = write_stamp(tmp, f"{role}.engine", fingerprint, seconds, info) | {"skipped": False}
        for _, (engine, _, tmp) in pending.items():
            replace_dir(tmp, engine.engine_dir)
    except BaseException as err:  # an interrupt included: no engine's temp folder is left behind
        for _, _, tmp in pending.values():
            shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(err):  # an engine is about as large as its checkpoint
            need = sum(folder_bytes(engine.checkpoint_dir) for engine, _, _ in pending.values())
            raise no_space_error(out_dir, need, cause=err) from None
        raise
    return stamps


# ---------------------------------------------------------------- orchestration


def _print_finish(console, plan: BuildPlan, out_dir: Path) -> None:
    _say(
        console,
        f"Checkpoints and plan are in {out_dir}. Finish the engines in {trtllm.NGC_TRITON_TRTLLM_IMAGE}:",
    )
    _say(console, f"  bash {shlex.quote(str(out_dir / FINISH_SCRIPT))}")
    _say(console, "or by hand:")
    for engine in plan.engines():
        _say(console, f"  {shlex.join(engine.command())}")


def build(
    recipe: Recipe,
    engines_dir: Path = layout.ENGINES_DIR,
    *,
    engines_only: bool = False,
    force: bool = False,
    console=None,
) -> BuildResult:
    """check -> convert/quantize -> plan -> engines into ``engines_dir/<name>``; see the module docstring.

    Raises CheckFailed (a check or an engine verification failed), NeedsTensorRTLLM (exit 3: everything up to
    the engines is done and finish_in_ngc.sh is written) or another TrtspecError for bad input.
    """
    out_dir = layout.pair_dir(recipe.name, engines_dir)
    if recipe.triton.runtime == "trtllm-pytorch" and engines_only:
        raise RecipeError(
            recipe.source or recipe.name,
            "triton.runtime",
            "trtllm-pytorch has no engines; drop --engines-only",
        )
    if not engines_only and environment.conversion_roles(recipe):
        environment.require_conversion_stack()
    # the folders this build creates: bad input found before any stage is written leaves none of them behind
    created = [folder for folder in (out_dir, *out_dir.parents) if not folder.exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _build_into(recipe, out_dir, engines_only, force, console)
    except BaseException:
        for folder in created:  # deepest first; a folder holding anything stays
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _build_into(recipe: Recipe, out_dir: Path, engines_only: bool, force: bool, console) -> BuildResult:
    clean_stale(out_dir)
    # An earlier build's manifest, plan and script describe its checkpoints: gone until this build writes its own,
    # so a build that fails on the way leaves none that lies about what is on disk.
    for name in (MANIFEST, PLAN_FILE, FINISH_SCRIPT):
        (out_dir / name).unlink(missing_ok=True)
    if recipe.triton.runtime == "trtllm-pytorch":
        return build_hf(recipe, out_dir, console, force)
    stages: dict[str, dict] = {}
    roles = engine_roles(recipe)
    if engines_only:
        for role in roles:
            stages[f"{role}.checkpoint"] = existing_checkpoint(recipe, role, out_dir)
    else:
        stages["check"] = run_preflight(recipe)
        for role in roles:
            stages[f"{role}.checkpoint"] = convert_stage(recipe, role, out_dir, console, force)
    plan = plan_for(recipe, out_dir)
    write_plan_files(recipe, plan, out_dir)
    checkpoints = {role: stages[f"{role}.checkpoint"] for role in roles}
    try:
        engine_stamps = engine_stages(plan, checkpoints, out_dir, console, force)
    except NeedsTensorRTLLM as err:
        manifest = make_manifest(recipe, plan, stages, "needs_tensorrt_llm")
        write_json_atomic(out_dir / MANIFEST, manifest)
        _print_finish(console, plan, out_dir)
        stopped = NeedsTensorRTLLM(
            f"{out_dir}: checkpoints and plan written; {err.message.split('; ')[0]}: "
            f"run {shlex.quote(str(out_dir / FINISH_SCRIPT))} inside {trtllm.NGC_TRITON_TRTLLM_IMAGE}",
            detail=err.message,
        )
        stopped.manifest = manifest
        raise stopped from None
    stages.update({f"{role}.engine": stamp for role, stamp in engine_stamps.items()})
    return _finish(recipe, out_dir, plan, stages)
