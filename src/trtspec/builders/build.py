"""``trtspec build``: check -> convert/quantize -> engine build for both models, skipping up-to-date stages.

Layout under ``engines/<name>/``::

    target/checkpoint  target/engine  draft/checkpoint  draft/engine
    manifest.json      plan.json      finish_in_ngc.sh  logs/

Stages, in order: 1. pre-flight checks (``preflight.run_checks``); 2. one convert/quantize stage per model
(``convert.export_checkpoint``); 3. the build plan (``plan.make_build_plan``), written as data and as a shell
script to finish in the NGC image; 4. one engine stage per model (``trtllm_adapter.build_engines``, in a child
process), or, without tensorrt_llm, exit status 3 (NeedsTensorRTLLM) after step 3.

For ``triton.runtime: trtllm-pytorch`` there are no engines: TensorRT-LLM's PyTorch backend loads Hugging Face
checkpoints. The build is then 1. the checks and 2. for each quantized model, one stage writing its ModelOpt HF
export to ``<role>/hf_checkpoint`` (``hf_export.export_hf``); an unquantized model is served from its own folder.

Every stage writes into a hidden temporary sibling directory and is renamed into place on success, with a stamp
file (``.trtspec-stage.json``: fingerprint of its inputs, hash of its outputs, timing). A stage is skipped when
its stamp's fingerprint equals the current one and its outputs still hash to the stamp's value. An interrupted
build leaves no half-written stage; a killed one leaves only hidden ``.*.tmp-*`` directories, removed by the next
run. Hashes: files up to ``CONTENT_HASH_LIMIT`` are hashed by content, larger ones (weights, engines) by name,
size and modification time, so that checking a 100 GB model stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.builders import environment, support
from trtspec.builders.plan import ROLES, BuildPlan, make_build_plan, read_checkpoint_config
from trtspec.core import layout
from trtspec.core.errors import CheckFailed, CheckpointError, NeedsTensorRTLLM, RecipeError
from trtspec.outputs import atomic_dir, replace_dir, temp_sibling, write_file_atomic
from trtspec.recipe import DEMO_RECIPE, Recipe

STAMP = ".trtspec-stage.json"
MANIFEST = "manifest.json"
FINISH_SCRIPT = "finish_in_ngc.sh"
CONTENT_HASH_LIMIT = 64 * 1024 * 1024  # bytes
MANIFEST_VERSION = 1


@dataclass
class BuildResult:
    """What ``build`` did; ``manifest`` is what it wrote to ``out_dir/manifest.json``."""

    out_dir: Path
    plan: BuildPlan | None
    manifest: dict[str, Any] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- hashing and stamps (pure-ish helpers)


def digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tree_hash(root: Path) -> str:
    """Hash of a directory's files (names, and content or size+mtime for large files); the stamp is excluded."""
    h = hashlib.sha256()
    root = Path(root)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != STAMP):
        stat = path.stat()
        h.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0".encode())
        if stat.st_size <= CONTENT_HASH_LIMIT:
            with open(path, "rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            h.update(str(stat.st_mtime_ns).encode())
    return h.hexdigest()[:16]


def read_stamp(stage_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(stage_dir) / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def up_to_date(stage_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The stage's stamp if it was made from ``fingerprint`` and its outputs are unchanged, else None."""
    stamp = read_stamp(stage_dir)
    if stamp and stamp.get("fingerprint") == fingerprint and stamp.get("output_hash") == tree_hash(stage_dir):
        return stamp
    return None


def write_json_atomic(path: Path, payload: Any, mode: int | None = None) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=str) + "\n"
    write_file_atomic(path, text, mode)


def clean_stale(out_dir: Path) -> list[Path]:
    """Remove hidden temporaries left by a killed build (``.X.tmp-*`` / ``.X.old-*``)."""
    removed = []
    for pattern in (".*.tmp-*", "*/.*.tmp-*", ".*.old-*", "*/.*.old-*"):
        for path in out_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def run_stage(
    name: str, final: Path, fingerprint: str, work: Callable[[Path], dict], force: bool = False
) -> dict[str, Any]:
    """Run ``work(tmp_dir) -> info`` unless ``final`` is up to date; returns the stamp (+ ``skipped``)."""
    stamp = None if force else up_to_date(final, fingerprint)
    if stamp is not None:
        return stamp | {"skipped": True}
    with atomic_dir(final, create=False) as tmp:
        start = time.perf_counter()
        info = work(tmp)
        if not tmp.is_dir():
            raise CheckpointError(f"stage {name} produced no output directory {tmp}")
        stamp = {
            "stage": name,
            "fingerprint": fingerprint,
            "output_hash": tree_hash(tmp),
            "seconds": round(time.perf_counter() - start, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "info": info,
        }
        write_json_atomic(tmp / STAMP, stamp)
    return stamp | {"skipped": False}


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
    """
    spec = recipe.models()[role]
    part = {"model": spec.model_dump(mode="json", exclude={"gpu_ids", "model"})}
    if spec.quantization != "none":
        part["calibration"] = recipe.calibration.model_dump(mode="json")
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
    stamp = run_stage(f"{role}.{subdir}", final, fingerprint, work, force)
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
    if stamp is None or stamp.get("output_hash") != tree_hash(ckpt):
        raise CheckpointError(
            f"{ckpt}: no finished checkpoint; run `trtspec build` without --engines-only first (it needs the HF models)"
        )
    if stamp.get("info", {}).get("recipe") != convert_recipe_part(recipe, role):
        raise CheckpointError(
            f"{ckpt}: converted with other {role} settings than the recipe's; run `trtspec build` without --engines-only"
        )
    return stamp | {"skipped": True}


def plan_for(recipe: Recipe, out_dir: Path) -> BuildPlan:
    """Stage 3: the plan, from the finished checkpoints."""
    checkpoints = {}
    for role in ROLES:
        ckpt = layout.stage_dir(out_dir, role, layout.CHECKPOINT)
        checkpoints[role] = (ckpt, read_checkpoint_config(ckpt))
    return make_build_plan(
        recipe, checkpoints, {role: layout.stage_dir(out_dir, role, layout.ENGINE) for role in ROLES}
    )


def recipe_argument_for(recipe: Recipe, from_dir: Path) -> str:
    """How the finish script names the recipe: 'demo', or its path relative to the script's folder."""
    if recipe.source is None or Path(recipe.source).resolve() == DEMO_RECIPE.resolve():
        return "demo"
    return os.path.relpath(Path(recipe.source).resolve(), from_dir.resolve())


def finish_script(recipe: Recipe, plan: BuildPlan, out_dir: Path) -> str:
    """A bash script that finishes the engines inside the NGC image (paths relative to the script's folder)."""
    rel = {p.role: p.command(f"{p.role}/checkpoint", f"{p.role}/engine") for p in plan.engines()}
    trtspec_cmd = [
        "trtspec",
        "build",
        recipe_argument_for(recipe, out_dir),
        "--engines-only",
        "--engines-dir",
        "..",
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `trtspec build` for recipe {recipe.name!r}: builds the TensorRT engines from the checkpoints",
        f"# beside this script. Run it inside {support.NGC_TRITON_TRTLLM_IMAGE}",
        f"# (TensorRT-LLM {support.TRTLLM_VERSION}) with this folder mounted, e.g.",
        f'#   docker run --gpus all --rm -v "$PWD":"$PWD" -w "$PWD" {support.NGC_TRITON_TRTLLM_IMAGE} \\',
        f"#     bash {shlex.quote(str(out_dir / FINISH_SCRIPT))}",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "if command -v trtspec >/dev/null 2>&1; then",
        f"  exec {shlex.join(trtspec_cmd)}",
        "fi",
        "# trtspec is not installed in the image: the same engines with trtllm-build (no manifest, no verification).",
        *(shlex.join(rel[role]) for role in ROLES),
        "",
    ]
    return "\n".join(lines)


def write_plan_files(recipe: Recipe, plan: BuildPlan, out_dir: Path) -> None:
    write_json_atomic(out_dir / "plan.json", plan.to_dict())
    write_json_atomic(out_dir / FINISH_SCRIPT, finish_script(recipe, plan, out_dir), mode=0o755)


def engine_fingerprint(engine, checkpoint_stamp: dict, engine_env: dict[str, Any]) -> str:
    # Paths are left out on purpose: the same folder mounted elsewhere (the NGC container) is still up to date.
    # The environment is in: a new TensorRT-LLM or another GPU model makes every engine stale.
    payload = {"build_config": engine.build_config, "checkpoint": checkpoint_stamp.get("output_hash")}
    return digest(payload | {"environment": engine_env})


def engine_stages(
    plan: BuildPlan, checkpoints: dict[str, dict], out_dir: Path, console, force: bool
) -> dict[str, dict]:
    """Stage 4: build the engines that are not up to date, in one child process, then move each into place."""
    from trtspec.builders.trtllm_adapter import build_engines, require_tensorrt_llm

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
    require_tensorrt_llm()
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
            stamp = {
                "stage": f"{role}.engine",
                "fingerprint": fingerprint,
                "output_hash": tree_hash(tmp),
                "seconds": info.get("seconds", round(time.perf_counter() - start, 3)),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "info": info,
            }
            write_json_atomic(tmp / STAMP, stamp)
            stamps[role] = stamp | {"skipped": False}
    except BaseException:
        for _, _, tmp in pending.values():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, (engine, _, tmp) in pending.items():
        replace_dir(tmp, engine.engine_dir)
    return stamps


# ---------------------------------------------------------------- manifest and orchestration


def make_manifest(
    recipe: Recipe, plan: BuildPlan | None, stages: dict[str, dict], status: str
) -> dict[str, Any]:
    """manifest.json: recipe hash, versions, input/output hashes, timings and the plan."""
    trtllm = next(
        (s["info"].get("tensorrt_llm_version") for k, s in stages.items() if k.endswith(".engine")), None
    )
    return {
        "manifest_version": MANIFEST_VERSION,
        "status": status,
        "recipe": {
            "name": recipe.name,
            "source": str(recipe.source) if recipe.source else None,
            "hash": recipe.digest(),
            "content": recipe.model_dump(mode="json"),
        },
        "versions": environment.package_versions(trtllm),
        "ngc_image": support.NGC_TRITON_TRTLLM_IMAGE,
        "inputs": {
            f"{role}.model": s["info"].get("input_hash")
            for role in ROLES
            if (s := stages.get(f"{role}.checkpoint") or stages.get(f"{role}.hf_checkpoint"))
        },
        "outputs": {name: s.get("output_hash") for name, s in stages.items() if "output_hash" in s},
        "timings": {name: s.get("seconds") for name, s in stages.items()},
        "skipped": sorted(name for name, s in stages.items() if s.get("skipped")),
        "stages": stages,
        "plan": plan.to_dict() if plan else None,
        "finish_script": FINISH_SCRIPT if plan else None,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _print_finish(console, plan: BuildPlan, out_dir: Path) -> None:
    _say(
        console,
        f"Checkpoints and plan are in {out_dir}. Finish the engines in {support.NGC_TRITON_TRTLLM_IMAGE}:",
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
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_stale(out_dir)
    if recipe.triton.runtime == "trtllm-pytorch":
        return build_hf(recipe, out_dir, console, force)
    stages: dict[str, dict] = {}
    if engines_only:
        for role in ROLES:
            stages[f"{role}.checkpoint"] = existing_checkpoint(recipe, role, out_dir)
    else:
        stages["check"] = run_preflight(recipe)
        for role in ROLES:
            stages[f"{role}.checkpoint"] = convert_stage(recipe, role, out_dir, console, force)
    plan = plan_for(recipe, out_dir)
    write_plan_files(recipe, plan, out_dir)
    checkpoints = {role: stages[f"{role}.checkpoint"] for role in ROLES}
    try:
        engine_stamps = engine_stages(plan, checkpoints, out_dir, console, force)
    except NeedsTensorRTLLM as err:
        manifest = make_manifest(recipe, plan, stages, "needs_tensorrt_llm")
        write_json_atomic(out_dir / MANIFEST, manifest)
        _print_finish(console, plan, out_dir)
        stopped = NeedsTensorRTLLM(
            f"{out_dir}: checkpoints and plan written; {err.message.split('; ')[0]}: "
            f"run {out_dir / FINISH_SCRIPT} inside {support.NGC_TRITON_TRTLLM_IMAGE}",
            detail=err.message,
        )
        stopped.manifest = manifest
        raise stopped from None
    stages.update({f"{role}.engine": stamp for role, stamp in engine_stamps.items()})
    return _finish(recipe, out_dir, plan, stages)
