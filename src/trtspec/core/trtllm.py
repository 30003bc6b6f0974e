"""TensorRT-LLM itself: the only module of trtspec that imports ``tensorrt_llm``, and the release line it is pinned to.

Every import of ``tensorrt_llm`` is inside a function, so importing this module costs nothing and needs no GPU.
Two places run those functions:

- the engine build's child process (``python -m trtspec.builders.trtllm_build``): ``imported_version`` for the
  version check, then ``build_engine`` once per engine, exactly as ``trtllm-build`` would; the child's exit frees
  all GPU memory and a crash in TensorRT cannot take the caller down;
- the caller's own process at run time (engines/trtllm_engine.py, NGC image only): ``runner_class`` returns
  TensorRT-LLM's C++ runner after the same version check.

Both refuse a missing package or one outside ``TRTLLM_VERSION_RANGE`` with ``NeedsTensorRTLLM`` (exit status 3),
one line naming the NGC image that ships the pinned release. ``tensorrt_llm_location`` finds the package without
importing it, so the parent of a build can hand the child the same package it found.

TensorRT-LLM 1.2.x build calls (read in NVIDIA/TensorRT-LLM; ``build_engine`` calls nothing else):

- ``tensorrt_llm/commands/build.py``: ``parallel_build(model_config, ckpt_dir, build_config, output_dir,
  workers=1, log_level='info', model_cls=None, **kwargs)``, which per rank runs ``build_model`` (``MODEL_MAP
  [architecture].from_checkpoint(ckpt_dir, config=rank_config)`` then ``builder.build``) and ``Engine.save``;
  the ``kwargs`` are those ``main()`` passes (logits_dtype, lora_*, strip_plan, refit). ``main()`` also shows
  how the CLI flags become objects: ``SpeculativeDecodingMode.from_arguments(args)``, ``PluginConfig`` from the
  plugin flags, ``BuildConfig(max_input_len=..., ..., plugin_config=...)`` with ``strongly_typed=True`` (a
  pydantic model since PR #8330, October 2025; before that a dataclass built with ``BuildConfig.from_dict``:
  keyword construction works with both).
- ``tensorrt_llm/models/modeling_utils.py``: ``PretrainedConfig.from_json_file(config_file)``,
  ``SpeculativeDecodingMode`` (an IntFlag: NONE=1, DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, ...).
- ``tensorrt_llm/builder.py``: ``BuildConfig`` (fields max_batch_size, max_input_len, max_seq_len,
  max_num_tokens, max_beam_width, gather_context_logits, gather_generation_logits, strongly_typed, max_draft_len,
  speculative_decoding_mode, plugin_config);
  ``build(model, build_config)`` adds max_draft_len to max_seq_len when a speculative mode is set;
  ``Engine.save(engine_dir)`` writes ``config.json`` (core/engine_config.py reads it) and ``rank{N}.engine``.
- ``tensorrt_llm/plugin/plugin.py``: ``PluginConfig`` (pydantic; fields gemm_plugin, use_paged_context_fmha).
- ``tensorrt_llm/runtime/model_runner_cpp.py``: ``ModelRunnerCpp`` (its calls: engines/trtllm_engine.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trtspec.core.errors import NeedsTensorRTLLM

# The engine path is pinned to TensorRT-LLM 1.2.x, the last release line with trtllm-build / TensorRT engines.
TRTLLM_VERSION = "1.2.1"
TRTLLM_VERSION_RANGE = (">=1.2.0", "<1.3.0")
# NGC Triton image that ships TensorRT-LLM 1.2.1. Confirmed in triton-inference-server/server
# docs/introduction/compatibility.md ("Container Name: trtllm-python-py3"): 26.04-26.07 ship TensorRT-LLM 1.2.1
# with TensorRT 10.14.1.48 (26.03 has 1.2.0, 25.12-26.02 have 1.1.0); 26.07 is the newest of them.
NGC_TRITON_TRTLLM_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
# The most tokens TensorRT-LLM's top-k sampling keeps: TOP_K_MAX in cpp/tensorrt_llm/kernels/samplingTopKKernels.h;
# TopKSamplingLayer::setup clips a larger runtime top_k to it with a warning.
TRTLLM_TOP_K_MAX = 1024


def version_problem(version: str) -> str | None:
    """None when ``version`` is inside TRTLLM_VERSION_RANGE, else a one-line explanation."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion

    wanted = SpecifierSet(",".join(TRTLLM_VERSION_RANGE), prereleases=True)
    try:
        ok = wanted.contains(version)
    except InvalidVersion:
        ok = False
    if ok:
        return None
    return (
        f"tensorrt_llm {version} is installed but trtspec's engine path needs {wanted} (the last release line "
        f"with TensorRT engines); use {NGC_TRITON_TRTLLM_IMAGE}"
    )


def tensorrt_llm_location() -> Path | None:
    """The directory that holds the importable ``tensorrt_llm`` package, or None; imports nothing."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def require_tensorrt_llm(purpose: str = "building TensorRT engines") -> Path:
    """``tensorrt_llm_location``, or NeedsTensorRTLLM naming ``purpose`` when the package is not installed."""
    location = tensorrt_llm_location()
    if location is None:
        raise NeedsTensorRTLLM(
            f"{purpose} needs tensorrt_llm {TRTLLM_VERSION}, which is not installed here; "
            f"run inside {NGC_TRITON_TRTLLM_IMAGE}"
        )
    return location


def imported_version() -> str:
    """``tensorrt_llm.__version__``; importing the package needs a GPU driver."""
    import tensorrt_llm

    return str(tensorrt_llm.__version__)


def runner_class(purpose: str) -> Any:
    """The ``ModelRunnerCpp`` class, after the availability and version checks (NeedsTensorRTLLM otherwise)."""
    require_tensorrt_llm(purpose)
    problem = version_problem(imported_version())
    if problem:
        raise NeedsTensorRTLLM(problem)
    from tensorrt_llm.runtime import ModelRunnerCpp

    return ModelRunnerCpp


def build_engine(build_config: dict[str, Any], checkpoint_dir: Path, engine_dir: Path) -> None:
    """Build one engine from a TensorRT-LLM checkpoint as ``trtllm-build`` would.

    ``build_config``: BuildConfig's fields as plain data (builders/plan.py ``EnginePlan.build_config``), with
    ``speculative_decoding_mode`` as the trtllm-build choice string or None, ``plugin_config`` as a dict of the
    ``PluginConfig`` fields to set and ``logits_dtype`` (None: the checkpoint's) as trtllm-build's flag.
    """
    import argparse

    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.commands.build import parallel_build
    from tensorrt_llm.models import PretrainedConfig
    from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode
    from tensorrt_llm.plugin import PluginConfig

    cfg = dict(build_config)
    logits_dtype = cfg.pop("logits_dtype", None)  # build_model's, not BuildConfig's
    plugin_config = PluginConfig(**cfg.pop("plugin_config"))
    mode = argparse.Namespace(speculative_decoding_mode=cfg.pop("speculative_decoding_mode"))
    cfg["speculative_decoding_mode"] = SpeculativeDecodingMode.from_arguments(mode)
    config = BuildConfig(**cfg, plugin_config=plugin_config)
    model_config = PretrainedConfig.from_json_file(str(Path(checkpoint_dir) / "config.json"))
    kwargs = {
        "logits_dtype": logits_dtype,
        "lora_dir": None,
        "lora_ckpt_source": "hf",
        "max_lora_rank": 64,
        "lora_target_modules": None,
        "strip_plan": False,
        "refit": False,
    }
    parallel_build(model_config, str(checkpoint_dir), config, str(engine_dir), 1, "info", None, **kwargs)
