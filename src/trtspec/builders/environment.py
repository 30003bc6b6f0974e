"""What a build runs on: the installed package versions, the visible GPUs, and whether the ModelOpt conversion
stack is there for the models a recipe converts.

The one place that reads installed versions, so ``check``, ``build``'s fingerprints and manifest, and the
conversion commands' refusal all see the same answer (and tests patch one function to stand in another stack).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

from trtspec.builders import support
from trtspec.core.errors import NeedsConversionStack
from trtspec.recipe import Recipe


def installed_version(*names: str) -> str | None:
    """The version of the first of ``names`` (distribution names) that is installed, or None."""
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        with contextlib.suppress(PackageNotFoundError):
            return version(name)
    return None


def installed_trtllm_version() -> str | None:
    """The tensorrt_llm version installed here (the NGC image), or None (development machines)."""
    return installed_version("tensorrt_llm", "tensorrt-llm")


def package_versions(tensorrt_llm_version: str | None = None) -> dict[str, str | None]:
    """trtspec and the libraries its outputs depend on; ``tensorrt_llm_version`` overrides the installed one (the
    version an engine was built with in the child process)."""
    from trtspec import __version__

    return {
        "trtspec": __version__,
        "nvidia-modelopt": installed_version("nvidia-modelopt"),
        "torch": installed_version("torch"),
        "transformers": installed_version("transformers"),
        "tensorrt_llm": tensorrt_llm_version or installed_trtllm_version(),
    }


def gpu_identity() -> list[str] | None:
    """Name and compute capability of each visible GPU (nvidia-smi), or None where there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = [exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def engine_environment() -> dict[str, Any]:
    """What an engine is tied to besides its inputs: the TensorRT-LLM version and the GPU architecture."""
    return {"tensorrt_llm": package_versions()["tensorrt_llm"], "gpus": gpu_identity()}


# ---------------------------------------------------------------- the conversion stack


def conversion_roles(recipe: Recipe) -> list[str]:
    """The models ``build`` runs through ModelOpt: both for engines, only the quantized ones for trtllm-pytorch
    (an unquantized model is served from its own folder)."""
    models = recipe.models()
    if recipe.triton.runtime == "trtllm-pytorch":
        return [role for role, spec in models.items() if spec.quantization != "none"]
    return list(models)


def require_conversion_stack() -> None:
    """NeedsConversionStack, one line naming what to install, unless the installed nvidia-modelopt and transformers
    are the conversion path's (support.CONVERSION_STACK). Called before any work, so nothing is half done."""
    problem = support.conversion_stack_problem(package_versions())
    if problem:
        raise NeedsConversionStack(problem)


def available_bytes(place: str) -> int | None:
    """MemAvailable on CPU (Linux), free memory of the current CUDA device; None when unknown."""
    if place == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# /proc/cpuinfo flags of the units that multiply bfloat16 matrices natively (AVX-512 BF16 dot products, AMX tiles);
# without them torch emulates bfloat16 matmuls on CPU, slower than float32.
BF16_MATRIX_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_units() -> tuple[str, ...] | None:
    """The BF16_MATRIX_FLAGS this CPU has (Linux /proc/cpuinfo), or None where that file cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return tuple(flag for flag in BF16_MATRIX_FLAGS if flag in flags)
