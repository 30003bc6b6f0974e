"""The engine build: a build plan run by TensorRT-LLM in a child process, then every engine checked against it.

``build_engines(plans)`` runs ``python -m trtspec.builders.trtllm_build`` (an argument list, no shell) with the
plans written as JSON: the child's exit frees all GPU memory and a crash in TensorRT cannot take the caller down.
The child checks ``tensorrt_llm.__version__`` against the pinned range, then builds each engine through
``core.trtllm.build_engine``. Afterwards the parent reads each engine's config.json (``read_engine_config``) and
compares it with the plan (``plan.engine_mismatches``): speculative mode, max_draft_len, vocab size, limits,
logits gathering, paged context FMHA.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trtspec.builders.plan import EnginePlan, engine_mismatches
from trtspec.core import trtllm
from trtspec.core.engine_config import read_engine_config
from trtspec.core.errors import CheckFailed, NeedsTensorRTLLM, NoSpaceError
from trtspec.outputs import is_disk_full

EXIT_WRONG_VERSION = 10
EXIT_NO_SPACE = 11


def verify_engine(plan: EnginePlan, engine_dir: Path | None = None) -> dict[str, Any]:
    """Check a built engine against its plan; returns its facts, or raises CheckFailed naming the first problem."""
    engine_dir = Path(engine_dir or plan.engine_dir)
    facts = read_engine_config(engine_dir)
    problems = engine_mismatches(plan, facts)
    world = plan.checkpoint.world_size
    problems += [
        f"rank{r}.engine is missing" for r in range(world) if not (engine_dir / f"rank{r}.engine").is_file()
    ]
    if problems:
        raise CheckFailed(
            f"{plan.role} engine {engine_dir}: {problems[0]} (TensorRT-LLM did not build what the plan asked; "
            "the engine was discarded)",
            detail="\n".join(problems),
        )
    return facts


# ---------------------------------------------------------------- parent side: run the plan in a child


def _child_env(location: Path) -> dict[str, str]:
    # The child must import the same tensorrt_llm the parent found (a venv, a test stand-in).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(location), env.get("PYTHONPATH", "")) if p)
    return env


def build_engines(plans: list[EnginePlan], log_path: Path) -> dict[str, Any]:
    """Build ``plans`` (each into its own ``engine_dir``) in a child process, then verify every engine.

    Returns {"tensorrt_llm_version": str, "engines": {role: {"seconds": float, "config": read_engine_config}}}.
    Raises NeedsTensorRTLLM (not installed / wrong version), NoSpaceError (the disk filled up; the child removed
    what it had written) or CheckFailed (the build failed or the engine does not match its plan). The child's
    output goes to ``log_path``.
    """
    location = trtllm.require_tensorrt_llm()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job, result_path = log_path.with_suffix(".plan.json"), log_path.with_suffix(".result.json")
    job.write_text(json.dumps([p.to_dict() for p in plans], indent=2))
    result_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "trtspec.builders.trtllm_build", str(job), str(result_path)]
    with open(log_path, "w") as log:
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=_child_env(location))
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code == EXIT_WRONG_VERSION:
        raise NeedsTensorRTLLM(result.get("error", "wrong tensorrt_llm version"))
    if code == EXIT_NO_SPACE:
        raise NoSpaceError(
            f"the disk filled up while TensorRT-LLM built the engines; see {log_path}",
            detail=result.get("error"),
        )
    if code != 0:
        tail = log_path.read_text()[-2000:] if log_path.is_file() else ""
        raise CheckFailed(f"TensorRT-LLM engine build failed (exit {code}); see {log_path}", detail=tail)
    for plan in plans:
        result["engines"][plan.role]["config"] = verify_engine(plan)
    return result


# ---------------------------------------------------------------- child side


def child_main(job_path: str, result_path: str) -> int:
    """Entry of the child process: version check, then every engine of the job; writes a JSON result."""
    version = trtllm.imported_version()
    result: dict[str, Any] = {"tensorrt_llm_version": version, "engines": {}}
    problem = trtllm.version_problem(version)
    if problem:
        result["error"] = problem
        Path(result_path).write_text(json.dumps(result))
        return EXIT_WRONG_VERSION
    plans = [EnginePlan.from_dict(data) for data in json.loads(Path(job_path).read_text())]
    try:
        for plan in plans:
            start = time.perf_counter()
            print(f"[trtspec] building the {plan.role} engine into {plan.engine_dir}", flush=True)
            trtllm.build_engine(plan.build_config, plan.checkpoint_dir, plan.engine_dir)
            result["engines"][plan.role] = {"seconds": round(time.perf_counter() - start, 3)}
    except Exception as err:
        if not is_disk_full(err):
            raise
        for plan in plans:  # first, so the result below has room; the parent removes them anyway
            shutil.rmtree(plan.engine_dir, ignore_errors=True)
        result["error"] = f"{type(err).__name__}: {err}"
        Path(result_path).write_text(json.dumps(result))
        return EXIT_NO_SPACE
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
