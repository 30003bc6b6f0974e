"""What ``trtspec build`` writes beside its stages: ``manifest.json`` (recipe, versions, input and output hashes,
timings, the plan) and, for engine builds, ``plan.json`` and ``finish_in_ngc.sh`` (the script that finishes the
engines inside the NGC image)."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

from trtspec.builders import environment
from trtspec.builders.plan import ROLES, BuildPlan
from trtspec.builders.stage_cache import write_json_atomic
from trtspec.core import trtllm
from trtspec.recipe import DEMO_RECIPE, Recipe

MANIFEST = "manifest.json"
FINISH_SCRIPT = "finish_in_ngc.sh"
PLAN_FILE = "plan.json"
MANIFEST_VERSION = 1


def make_manifest(
    recipe: Recipe, plan: BuildPlan | None, stages: dict[str, dict], status: str
) -> dict[str, Any]:
    """manifest.json: recipe hash, versions, input/output hashes, timings and the plan."""
    built_with = next(
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
        "versions": environment.package_versions(built_with),
        "ngc_image": trtllm.NGC_TRITON_TRTLLM_IMAGE,
        "inputs": {
            f"{role}.model": s["info"].get("input_hash")
            for role in ROLES  # the draft's is absent where the recipe has none
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


def recipe_argument_for(recipe: Recipe, from_dir: Path) -> str:
    """How the finish script names the recipe: 'demo', or its path relative to the script's folder."""
    if recipe.source is None or Path(recipe.source).resolve() == DEMO_RECIPE.resolve():
        return "demo"
    return os.path.relpath(Path(recipe.source).resolve(), from_dir.resolve())


def script_mounts(recipe: Recipe, out_dir: Path) -> list[Path]:
    """The folders the finish script reads, to mount at the same paths: the engines folder (``--engines-dir ..``),
    the recipe's folder (the script names it relative to its own) and a calibration file's (a quantized
    checkpoint is matched to its content), one where another holds it."""
    folders = [out_dir.resolve().parent]
    if recipe_argument_for(recipe, out_dir) != "demo":
        folders.append(Path(recipe.source).resolve().parent)
    quantized = any(spec.quantization != "none" for spec in recipe.models().values())
    if quantized and recipe.calibration.dataset != "builtin":
        folders.append(Path(recipe.calibration.dataset).resolve().parent)
    folders.sort(key=lambda folder: len(folder.parts))
    return [f for i, f in enumerate(folders) if not any(f.is_relative_to(g) for g in folders[:i])]


def finish_script(recipe: Recipe, plan: BuildPlan, out_dir: Path) -> str:
    """A bash script that finishes the engines inside the NGC image (paths relative to the script's folder)."""
    rel = {p.role: p.command(f"{p.role}/checkpoint", f"{p.role}/engine") for p in plan.engines()}
    volumes = [
        f"-v {shlex.quote(str(folder))}:{shlex.quote(str(folder))}"
        for folder in script_mounts(recipe, out_dir)
    ]
    trtspec_cmd = [
        "trtspec",
        "build",
        recipe_argument_for(recipe, out_dir),
        # the runtime this build ran for, which `build --runtime` may have set over the recipe's
        "--runtime",
        recipe.triton.runtime,
        "--engines-only",
        "--engines-dir",
        "..",
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `trtspec build` for recipe {recipe.name!r}: builds the TensorRT engines from the checkpoints",
        f"# beside this script. Run it inside {trtllm.NGC_TRITON_TRTLLM_IMAGE}",
        f"# (TensorRT-LLM {trtllm.TRTLLM_VERSION}) with the folders it reads mounted at the same paths, e.g.",
        f"#   docker run --gpus all --rm {' '.join(volumes)} {trtllm.NGC_TRITON_TRTLLM_IMAGE} \\",
        f"#     bash {shlex.quote(str(out_dir.resolve() / FINISH_SCRIPT))}",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "if command -v trtspec >/dev/null 2>&1; then",
        f"  exec {shlex.join(trtspec_cmd)}",
        "fi",
        "# trtspec is not installed in the image: the same engines with trtllm-build (no manifest, no verification).",
        *(shlex.join(command) for command in rel.values()),
        "",
    ]
    return "\n".join(lines)


def write_plan_files(recipe: Recipe, plan: BuildPlan, out_dir: Path) -> None:
    write_json_atomic(out_dir / PLAN_FILE, plan.to_dict())
    write_json_atomic(out_dir / FINISH_SCRIPT, finish_script(recipe, plan, out_dir), mode=0o755)
