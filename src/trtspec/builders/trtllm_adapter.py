"""The TensorRT-LLM adapter: the only module of trtspec that imports ``tensorrt_llm`` (lazily, in a child process).

``build_engines(plans)`` runs a build plan in a child process (``python -m trtspec.builders.trtllm_adapter``, an
argument list, no shell): the child's exit frees all GPU memory and a crash in TensorRT cannot take the caller
down. The child checks ``tensorrt_llm.__version__`` against ``support.TRTLLM_VERSION_RANGE``, then builds each
engine exactly as ``trtllm-build`` would. Afterwards the parent reads each engine's config.json
(``read_engine_config``) and compares it with the plan (``plan.engine_mismatches``): speculative mode,
max_draft_len, vocab size, limits, logits gathering, paged context FMHA.

TensorRT-LLM 1.2.x calls (read in NVIDIA/TensorRT-LLM; trtspec calls nothing else):

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
  max_beam_width, gather_context_logits, gather_generation_logits, strongly_typed, max_draft_len,
  speculative_decoding_mode, plugin_config);
  ``build(model, build_config)`` adds max_draft_len to max_seq_len when a speculative mode is set;
  ``Engine.save(engine_dir)`` writes ``config.json`` (``EngineConfig.to_dict``: version, pretrained_config,
  build_config; IntFlag values are written as integers) and ``rank{N}.engine``.
- ``tensorrt_llm/plugin/plugin.py``: ``PluginConfig`` (pydantic; fields gemm_plugin, use_paged_context_fmha).

At run time (in-process, NGC image only) ``load_engine_runner(engine_dir)`` loads one engine into TensorRT-LLM's
C++ runner, ``tensorrt_llm.runtime.ModelRunnerCpp.from_dir``, and returns an ``EngineRunner`` whose ``generate``
takes and returns plain token lists (see the section "in-process runtime" for the exact upstream calls);
engines/trtllm_runner.py builds the draft-target loop on it.

Older engines (TensorRT-LLM < 0.9) have ``builder_config`` + ``plugin_config`` at the top level instead of
``pretrained_config`` + ``build_config``; ``read_engine_config`` reads both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.builders import support
from trtspec.builders.plan import EnginePlan, engine_mismatches
from trtspec.core.errors import CheckFailed, CheckpointError, NeedsTensorRTLLM

# SpeculativeDecodingMode is an IntFlag (auto() from 1): config.json holds these integers.
SPECULATIVE_MODES = (
    "none",
    "draft_tokens_external",
    "medusa",
    "lookahead_decoding",
    "explicit_draft_tokens",
    "eagle",
    "ngram",
    "user_provided",
    "save_hidden_states",
    "auto",
)
EXIT_WRONG_VERSION = 10


# ---------------------------------------------------------------- engine config.json (no tensorrt_llm needed)


def speculative_mode_name(value: Any, max_draft_len: int = 0) -> str:
    """Normalise config.json's speculative_decoding_mode (int flag, enum repr or name) to the CLI choice name."""
    if value is None:  # engines from before the field existed: draft support shows as max_draft_len only
        return "draft_tokens_external" if max_draft_len > 0 else "none"
    if isinstance(value, int) and not isinstance(value, bool):
        index = value.bit_length() - 1
        return (
            SPECULATIVE_MODES[index]
            if value > 0 and value == 1 << index and index < len(SPECULATIVE_MODES)
            else str(value)
        )
    return str(value).split(".")[-1].lower()


def normalise_engine_config(config: dict[str, Any]) -> dict[str, Any]:
    """The facts trtspec checks, from a parsed engine config.json (new or old layout)."""
    if "build_config" in config:
        pretrained, build = config.get("pretrained_config") or {}, config["build_config"]
        plugins, mapping = build.get("plugin_config") or {}, pretrained.get("mapping") or {}
    elif "builder_config" in config:  # TensorRT-LLM < 0.9
        pretrained = build = config["builder_config"]
        plugins = config.get("plugin_config") or {}
        mapping = {"tp_size": build.get("tensor_parallel", 1), "pp_size": build.get("pipeline_parallel", 1)}
    else:
        raise KeyError("build_config")
    max_draft_len = int(build.get("max_draft_len") or 0)
    return {
        "version": config.get("version"),
        "architecture": pretrained.get("architecture") or pretrained.get("name"),
        "dtype": pretrained.get("dtype") or build.get("precision"),
        "vocab_size": pretrained.get("vocab_size"),
        "tp_size": int(mapping.get("tp_size", 1)),
        "pp_size": int(mapping.get("pp_size", 1)),
        "speculative_decoding_mode": speculative_mode_name(
            build.get("speculative_decoding_mode"), max_draft_len
        ),
        "max_draft_len": max_draft_len,
        "max_batch_size": build.get("max_batch_size"),
        "max_input_len": build.get("max_input_len"),
        "max_seq_len": build.get("max_seq_len") or build.get("max_sequence_length"),
        "max_beam_width": build.get("max_beam_width"),
        "gather_context_logits": bool(
            build.get("gather_context_logits") or build.get("gather_all_token_logits")
        ),
        "gather_generation_logits": bool(
            build.get("gather_generation_logits") or build.get("gather_all_token_logits")
        ),
        "use_paged_context_fmha": bool(plugins.get("use_paged_context_fmha")),
        "gemm_plugin": plugins.get("gemm_plugin"),
    }


def read_engine_config(engine_dir: str | Path) -> dict[str, Any]:
    """Read an engine directory's config.json into the facts trtspec checks.

    Returns a dict with: version, architecture, dtype, vocab_size, tp_size, pp_size, speculative_decoding_mode
    ("draft_tokens_external", "none", ...), max_draft_len, max_batch_size, max_input_len, max_seq_len,
    max_beam_width, gather_context_logits, gather_generation_logits, use_paged_context_fmha, gemm_plugin.
    Raises CheckpointError (one line) when the file is missing or not an engine config.
    """
    path = Path(engine_dir) / "config.json"
    try:
        return normalise_engine_config(json.loads(path.read_text()))
    except OSError as err:
        raise CheckpointError(
            f"{path}: cannot read the engine config ({err.strerror}); build engines with `trtspec build`"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{path}: not a TensorRT-LLM engine config ({type(err).__name__}: {err})"
        ) from None


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


# ---------------------------------------------------------------- availability and version


def version_problem(version: str) -> str | None:
    """None when ``version`` is inside support.TRTLLM_VERSION_RANGE, else a one-line explanation."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion

    wanted = SpecifierSet(",".join(support.TRTLLM_VERSION_RANGE), prereleases=True)
    try:
        ok = wanted.contains(version)
    except InvalidVersion:
        ok = False
    if ok:
        return None
    return (
        f"tensorrt_llm {version} is installed but trtspec's engine path needs {wanted} (the last release line "
        f"with TensorRT engines); use {support.NGC_TRITON_TRTLLM_IMAGE}"
    )


def tensorrt_llm_location() -> Path | None:
    """The directory that holds the importable ``tensorrt_llm`` package, or None; imports nothing."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def require_tensorrt_llm(purpose: str = "building TensorRT engines") -> Path:
    location = tensorrt_llm_location()
    if location is None:
        raise NeedsTensorRTLLM(
            f"{purpose} needs tensorrt_llm {support.TRTLLM_VERSION}, which is not installed here; "
            f"run inside {support.NGC_TRITON_TRTLLM_IMAGE}"
        )
    return location


# ---------------------------------------------------------------- parent side: run the plan in a child


def _child_env(location: Path) -> dict[str, str]:
    # The child must import the same tensorrt_llm the parent found (a venv, a test stand-in).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(location), env.get("PYTHONPATH", "")) if p)
    return env


def build_engines(plans: list[EnginePlan], log_path: Path) -> dict[str, Any]:
    """Build ``plans`` (each into its own ``engine_dir``) in a child process, then verify every engine.

    Returns {"tensorrt_llm_version": str, "engines": {role: {"seconds": float, "config": read_engine_config}}}.
    Raises NeedsTensorRTLLM (not installed / wrong version) or CheckFailed (the build failed or the engine does
    not match its plan). The child's output goes to ``log_path``.
    """
    location = require_tensorrt_llm()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job, result_path = log_path.with_suffix(".plan.json"), log_path.with_suffix(".result.json")
    job.write_text(json.dumps([p.to_dict() for p in plans], indent=2))
    result_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "trtspec.builders.trtllm_adapter", str(job), str(result_path)]
    with open(log_path, "w") as log:
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, env=_child_env(location))
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code == EXIT_WRONG_VERSION:
        raise NeedsTensorRTLLM(result.get("error", "wrong tensorrt_llm version"))
    if code != 0:
        tail = log_path.read_text()[-2000:] if log_path.is_file() else ""
        raise CheckFailed(f"TensorRT-LLM engine build failed (exit {code}); see {log_path}", detail=tail)
    for plan in plans:
        result["engines"][plan.role]["config"] = verify_engine(plan)
    return result


# ---------------------------------------------------------------- child side: the only tensorrt_llm imports


def _build_one(plan: EnginePlan) -> None:
    import argparse

    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.commands.build import parallel_build
    from tensorrt_llm.models import PretrainedConfig
    from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode
    from tensorrt_llm.plugin import PluginConfig

    cfg = dict(plan.build_config)
    plugin_config = PluginConfig(**cfg.pop("plugin_config"))
    mode = argparse.Namespace(speculative_decoding_mode=cfg.pop("speculative_decoding_mode"))
    cfg["speculative_decoding_mode"] = SpeculativeDecodingMode.from_arguments(mode)
    build_config = BuildConfig(**cfg, plugin_config=plugin_config)
    model_config = PretrainedConfig.from_json_file(str(plan.checkpoint_dir / "config.json"))
    kwargs = {
        "logits_dtype": None,
        "lora_dir": None,
        "lora_ckpt_source": "hf",
        "max_lora_rank": 64,
        "lora_target_modules": None,
        "strip_plan": False,
        "refit": False,
    }
    parallel_build(
        model_config, str(plan.checkpoint_dir), build_config, str(plan.engine_dir), 1, "info", None, **kwargs
    )


def child_main(job_path: str, result_path: str) -> int:
    """Entry of the child process: version check, then every engine of the job; writes a JSON result."""
    import tensorrt_llm

    version = str(tensorrt_llm.__version__)
    result: dict[str, Any] = {"tensorrt_llm_version": version, "engines": {}}
    problem = version_problem(version)
    if problem:
        result["error"] = problem
        Path(result_path).write_text(json.dumps(result))
        return EXIT_WRONG_VERSION
    for data in json.loads(Path(job_path).read_text()):
        plan = EnginePlan.from_dict(data)
        start = time.perf_counter()
        print(f"[trtspec] building the {plan.role} engine into {plan.engine_dir}", flush=True)
        _build_one(plan)
        result["engines"][plan.role] = {"seconds": round(time.perf_counter() - start, 3)}
    Path(result_path).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------- in-process runtime: the C++ runner
#
# TensorRT-LLM 1.x ``tensorrt_llm/runtime/model_runner_cpp.py`` (a 1.x version of NVIDIA/TensorRT-LLM: its executor
# is ``self.session``, and ``from_dir`` also takes ``fail_fast_on_attention_window_too_large``):
# ``ModelRunnerCpp.from_dir(engine_dir, *, rank=0, max_batch_size=None, max_input_len=None, max_output_len=None,
# max_beam_width=None, kv_cache_free_gpu_memory_fraction=None, kv_cache_enable_block_reuse=False, device_ids=None,
# is_orchestrator_mode=False, gather_generation_logits=False, ...)`` and ``generate(batch_input_ids: list[Tensor],
# *, sampling_config=None, streaming=False, max_new_tokens=1, end_id=None, pad_id=None, stop_words_list=None,
# return_dict=False, output_sequence_lengths=False, output_generation_logits=False, **kwargs)``; ``kwargs`` carry
# the sampling knobs (temperature, top_k, top_p, num_beams, random_seed, ...) and the draft-target inputs
# ``draft_tokens_list`` (+ ``draft_logits_list``), which become one ``ExternalDraftTokensConfig`` per request.
# With return_dict=True it returns ``output_ids`` [B, beams, max_seq_len] int32 (prompt included, padded with
# end_id), ``sequence_lengths`` [B, beams] (prompt included) and, when the engine gathers them,
# ``generation_logits``: a tensor [B, beams, max_out_len, V] for plain requests, but a list in *response order*
# for draft-target requests (so trtspec reads logits only from plain requests: the draft's).


@dataclass
class RunnerOutput:
    """One request's result of one ``EngineRunner.generate`` call.

    token_ids: the new tokens (prompt excluded, a stop token included); logits: their generation logits
    [len(token_ids), vocab] (a torch tensor on the runner's device) when asked for, else None.
    """

    token_ids: list[int]
    logits: Any = None


def sampling_kwargs(
    temperature: float, top_k: int, top_p: float, seed: int | None, num_beams: int = 1
) -> dict[str, Any]:
    """trtspec's sampling settings (temperature 0 = greedy; top_k 0 / top_p 1 = off) as generate() kwargs.

    TensorRT-LLM's greedy is top_k=1 (examples/run.py defaults: top_k 1, top_p 0, temperature 1).
    """
    if temperature == 0:
        out: dict[str, Any] = {"temperature": 1.0, "top_k": 1, "top_p": 0.0}
    else:
        out = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
    out["num_beams"] = num_beams
    if seed is not None:
        out["random_seed"] = int(seed)
    return out


class EngineRunner:
    """One engine loaded in a ``ModelRunnerCpp``, behind plain-list calls (no tensorrt_llm types leak out)."""

    def __init__(self, runner: Any, engine_dir: Path, facts: dict[str, Any]):
        self.runner, self.engine_dir, self.facts = runner, Path(engine_dir), facts
        self.max_batch_size = int(runner.max_batch_size)
        self.max_seq_len = int(runner.max_seq_len)
        self.max_draft_len = int(facts["max_draft_len"])
        self.vocab_size = facts["vocab_size"]
        self.gather_generation_logits = bool(runner.gather_generation_logits)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        end_id: int,
        pad_id: int,
        stop_words: list[list[int]] | None = None,
        draft_tokens: list[list[int]] | None = None,
        draft_logits: list[Any] | None = None,
        return_logits: bool = False,
    ) -> list[RunnerOutput]:
        """One non-streaming ``generate`` over ``prompts``; returns one RunnerOutput per prompt, in order.

        draft_tokens (one list per prompt, each 1..max_draft_len tokens) makes it a verification call; draft_logits
        ([n_b, V] per prompt) asks the engine to accept by probabilities. Logits are returned only for calls without
        draft tokens (see the section comment).
        """
        import torch

        if return_logits and draft_tokens is not None:
            raise ValueError("generation logits are read only from calls without draft tokens")
        kwargs: dict[str, Any] = dict(sampling)
        if draft_tokens is not None:
            kwargs["draft_tokens_list"] = draft_tokens
            kwargs["draft_logits_list"] = draft_logits
        out = self.runner.generate(
            [torch.tensor(p, dtype=torch.int32) for p in prompts],
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=pad_id,
            stop_words_list=[stop_words] * len(prompts) if stop_words else None,
            streaming=False,
            return_dict=True,
            output_sequence_lengths=True,
            output_generation_logits=return_logits,
            **kwargs,
        )
        lengths = out["sequence_lengths"][:, 0].tolist()  # [B], prompt included
        results = []
        for b, prompt in enumerate(prompts):
            tokens = out["output_ids"][b, 0, len(prompt) : lengths[b]].tolist()
            logits = out["generation_logits"][b, 0, : len(tokens)] if return_logits else None  # [n, V]
            results.append(RunnerOutput(tokens, logits))
        return results

    def close(self) -> None:
        """Shut the executor down (its worker processes and GPU memory) now rather than at garbage collection."""
        executor = getattr(self.runner, "session", None)  # ModelRunnerCpp keeps its trtllm.Executor there
        if executor is not None:
            executor.shutdown()
        self.runner = None


def _import_runtime(purpose: str):
    """The ``ModelRunnerCpp`` class, after the availability and version checks (NeedsTensorRTLLM otherwise)."""
    require_tensorrt_llm(purpose)
    import tensorrt_llm

    problem = version_problem(str(tensorrt_llm.__version__))
    if problem:
        raise NeedsTensorRTLLM(problem)
    from tensorrt_llm.runtime import ModelRunnerCpp

    return ModelRunnerCpp


def load_engine_runner(
    engine_dir: str | Path,
    *,
    device_ids: list[int] | None = None,
    max_batch_size: int | None = None,
    kv_cache_free_gpu_memory_fraction: float | None = None,
    kv_cache_enable_block_reuse: bool = True,
    gather_generation_logits: bool = False,
) -> EngineRunner:
    """Load one engine directory into TensorRT-LLM's C++ runner, as examples/run.py's draft-target path does.

    Orchestrator mode with explicit ``device_ids`` (upstream ``run_dtm_pld``): draft and target executors run as
    separate workers, each on its own GPUs. The runtime max_input_len is the engine's max_seq_len because every
    round resubmits the growing prefix as a new context; KV-cache block reuse is what keeps that cheap.
    Raises CheckpointError (no engine config), NeedsTensorRTLLM (not installed / wrong version).
    """
    facts = read_engine_config(engine_dir)
    runner_cls = _import_runtime("running TensorRT engines")
    world = facts["tp_size"] * facts["pp_size"]
    runner = runner_cls.from_dir(
        str(engine_dir),
        rank=0,
        max_batch_size=max_batch_size,
        max_input_len=facts["max_seq_len"],
        max_beam_width=1,
        kv_cache_free_gpu_memory_fraction=kv_cache_free_gpu_memory_fraction,
        kv_cache_enable_block_reuse=kv_cache_enable_block_reuse,
        device_ids=list(device_ids) if device_ids is not None else list(range(world)),
        is_orchestrator_mode=True,
        gather_generation_logits=gather_generation_logits,
    )
    return EngineRunner(runner, Path(engine_dir), facts)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
