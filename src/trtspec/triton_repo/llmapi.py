"""The ``trtllm-pytorch`` runtime: upstream's Triton LLM-API model over TensorRT-LLM's PyTorch backend.

TensorRT-LLM removed the TensorRT engine path after 1.3.0rc20; what remains is the LLM API, which runs draft-target
itself (``speculative_config: {decoding_type: DraftTarget, max_draft_len: K, speculative_model_dir: DRAFT}``) from
Hugging Face checkpoints. Upstream serves it through one Triton python model, ``tensorrt_llm``
(triton_backend/all_models/llmapi/tensorrt_llm/: config.pbtxt, 1/model.py, 1/helpers.py, 1/model.yaml), whose
model.yaml keys map 1:1 to ``LLM()`` arguments (``triton_config`` aside).

What trtspec writes (deploy) and why:
- ``tensorrt_llm/config.pbtxt``: upstream's tensor names and dtypes (so upstream clients and docs apply), with
  ``max_batch_size: 0`` and ``decoupled`` written explicitly and equal to model.yaml's ``triton_config``: trtspec,
  like upstream's launch_triton_server.py, starts tritonserver with --disable-auto-complete-config, so model.py's
  auto_complete_config never copies them over.
- ``tensorrt_llm/1/model.yaml``: from the recipe, every key checked against the pinned release's field names
  (``trtspec.builders.support``); the ``model`` / ``speculative_model_dir`` are the HF checkpoints (or ModelOpt's
  quantized HF exports for quantized models). Adaptive K has no per-request form upstream: the recipe's schedule
  becomes ``max_concurrency`` / ``draft_len_schedule`` and K by acceptance the server-wide acceptance gate
  (``acceptance_window`` / ``acceptance_length_threshold``), as ``support.llmapi_speculation`` maps them; a recipe
  that pins ``num_draft_tokens`` serves that K to every request. Prompt lookup (``speculative.proposer: ngram``,
  no draft) is upstream's NGram decoding instead (``support.llmapi_ngram_fields``); upstream has no combined
  draft+ngram proposer, which ``check`` and ``deploy`` refuse.
- ``tensorrt_llm/1/model.py``: a thin launcher, not a copy: upstream's model.py belongs to the TensorRT-LLM release
  in the image and must match it, so it is loaded at server start from the image (``find_upstream_model_dir``).

The client-facing model is therefore upstream's ``tensorrt_llm`` with upstream's names (``text_input``,
``sampling_param_max_tokens``, ``streaming`` ... -> ``text_output``, ``acceptance_rate``), not trtspec's
``tensorrt_llm_bls``: trtspec.json records it as ``entry_point`` / ``interface: "llmapi"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from trtspec.builders import support
from trtspec.core import layout
from trtspec.core.errors import CheckFailed, ServerError
from trtspec.recipe import Recipe

MODEL_NAME = "tensorrt_llm"  # upstream's model name: the entry point of this runtime
INTERFACE = "llmapi"
MODEL_YAML = "model.yaml"
UPSTREAM_DIR_ENV = "TRTSPEC_LLMAPI_MODEL_DIR"
# Where upstream's llmapi/tensorrt_llm/1 may live in an NGC trtllm-python-py3 image (the image keeps the backend's
# scripts under /app); UPSTREAM_DIR_ENV overrides, e.g. a TensorRT-LLM checkout's triton_backend/all_models/....
UPSTREAM_DIR_CANDIDATES = (
    Path("/app/all_models/llmapi/tensorrt_llm/1"),
    Path("/opt/tritonserver/tensorrtllm_backend/all_models/llmapi/tensorrt_llm/1"),
    Path("/app/tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/1"),
)

# model.yaml keys trtspec may write, as named by the pinned release (support.TRTLLM_PYTORCH_VERSION).
LLM_ARGS_KEYS = frozenset(
    {
        "model",
        "tokenizer",
        "backend",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "dtype",
        "trust_remote_code",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "kv_cache_config",
        "speculative_config",
        "triton_config",
    }
)
SPECULATIVE_KEYS = frozenset({"decoding_type", *support.LLMAPI_SPECULATIVE_FIELDS})
# NGram has the base fields but no draft model, plus its own (support.LLMAPI_NGRAM_FIELDS).
NGRAM_KEYS = (SPECULATIVE_KEYS - {support.LLMAPI_SPECULATIVE_MODEL_KEY}) | set(support.LLMAPI_NGRAM_FIELDS)
DECODING_KEYS = {
    support.LLMAPI_DRAFT_TARGET_DECODING_TYPE: SPECULATIVE_KEYS,
    support.LLMAPI_NGRAM_DECODING_TYPE: NGRAM_KEYS,
}
KV_CACHE_KEYS = frozenset({"free_gpu_memory_fraction", "enable_block_reuse"})
TRITON_CONFIG_KEYS = frozenset({"max_batch_size", "decoupled"})

# Upstream's llmapi config.pbtxt interface (name -> dtype): what clients send and read.
LLMAPI_INPUTS = {
    "text_input": "TYPE_STRING",
    "streaming": "TYPE_BOOL",
    "sampling_param_temperature": "TYPE_FP32",
    "sampling_param_top_k": "TYPE_INT32",
    "sampling_param_top_p": "TYPE_FP32",
    "sampling_param_max_tokens": "TYPE_INT32",
    "sampling_param_stop": "TYPE_STRING",
    "sampling_param_seed": "TYPE_UINT64",
    "sampling_param_exclude_input_from_output": "TYPE_BOOL",
    "sampling_param_return_perf_metrics": "TYPE_BOOL",
}
LLMAPI_OUTPUTS = {
    "text_output": "TYPE_STRING",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
}

LAUNCHER_PY = '''"""Generated by trtspec {version}: loads upstream's LLM-API model.py (and its helpers.py) from the TensorRT-LLM
release in this image, so the model code always matches the installed tensorrt_llm. Set {env} to its
directory (.../all_models/llmapi/tensorrt_llm/1) if trtspec cannot find it."""

from trtspec.triton_repo.llmapi import load_upstream_model

TritonPythonModel = load_upstream_model()
'''


def hf_model_dirs(recipe: Recipe, engines_dir: Path | None = None) -> dict[str, Path]:
    """The checkpoint each role's LLM loads: the recipe's HF model, or for a quantized model the ModelOpt HF
    export at engines/<name>/<role>/hf_checkpoint (the PyTorch backend reads ModelOpt's hf_quant_config.json)."""
    root = layout.pair_dir(recipe.name, engines_dir)
    dirs = {}
    for role, spec in recipe.models().items():
        dirs[role] = (
            Path(spec.model)
            if spec.quantization == "none"
            else layout.stage_dir(root, role, layout.QUANTIZED_HF_SUBDIR)
        )
    return {role: path.resolve() for role, path in dirs.items()}


def check_model_dirs(recipe: Recipe, model_dirs: dict[str, Path]) -> None:
    """Every checkpoint the model.yaml names exists (else the LLM fails at server start): CheckFailed otherwise."""
    for role, path in model_dirs.items():
        if not (Path(path) / "config.json").is_file():
            spec = recipe.models()[role]
            how = (
                f"run `trtspec build` with this recipe first (it writes the {spec.quantization} ModelOpt HF "
                "checkpoint there)"
                if spec.quantization != "none"
                else f"point {role}.model at a Hugging Face checkpoint"
            )
            raise CheckFailed(f"{path}: no {role} checkpoint (config.json) for trtllm-pytorch; {how}")
    from trtspec.builders.convert import hf_vocab_size
    from trtspec.core.vocab import vocab_pair_problem

    rows = {role: hf_vocab_size(path) for role, path in model_dirs.items()}
    if "draft" not in rows:  # prompt lookup alone: no pair to match
        return
    problem = vocab_pair_problem(rows["target"], rows["draft"], "trtllm-pytorch", False, False)
    if problem is not None:
        raise CheckFailed(f"{model_dirs['draft']}: {problem}")


def model_yaml(recipe: Recipe, model_dirs: dict[str, Path]) -> dict:
    """model.yaml of upstream's LLM-API model: ``LLM()`` arguments + ``triton_config`` (field names: support.py).

    The draft runs inside the target's executor, so the parallel mapping is the target's.
    """
    target, triton, limits = recipe.target, recipe.triton, recipe.limits
    return {
        "model": str(model_dirs["target"]),
        "backend": "pytorch",
        "tensor_parallel_size": target.tp_size,
        "pipeline_parallel_size": target.pp_size,
        "dtype": target.dtype,
        "trust_remote_code": any(spec.trust_remote_code for spec in recipe.models().values()),
        "max_batch_size": limits.max_batch_size,
        "max_input_len": limits.max_input_len,
        "max_seq_len": limits.max_seq_len,
        "kv_cache_config": {
            # One KV pool serves both models in the PyTorch backend: the target's share is the budget.
            "free_gpu_memory_fraction": triton.kv_cache_free_gpu_mem_fraction.target,
            "enable_block_reuse": triton.enable_kv_cache_reuse,
        },
        "speculative_config": speculative_config(recipe, model_dirs.get("draft")),
        "triton_config": {"max_batch_size": 0, "decoupled": triton.decoupled},
    }


def speculative_config(recipe: Recipe, draft_dir: Path | None) -> dict:
    """DraftTarget with the recipe's K rules as the pinned release names them (support.llmapi_speculation:
    adaptive K becomes max_concurrency / draft_len_schedule and the acceptance gate), or for proposer ngram NGram
    with the same K rules (no gate) and the lookup's fields; CheckFailed for what it cannot honour."""
    from trtspec.builders.preflight_llmapi import llmapi_runtime_problem

    where = recipe.source or recipe.name
    if recipe.speculative.proposer == "draft+ngram":  # check's refusal, in its words
        raise CheckFailed(f"{where}: {llmapi_runtime_problem(recipe)[1]}")
    try:
        rules = support.llmapi_speculation(recipe.speculative, recipe.limits.max_batch_size)
    except ValueError as err:
        raise CheckFailed(f"{where}: {err}") from None
    fields = rules.fields()
    if recipe.speculative.proposer == "ngram":
        return {
            "decoding_type": support.LLMAPI_NGRAM_DECODING_TYPE,
            "max_draft_len": fields.pop("max_draft_len"),
            **support.llmapi_ngram_fields(recipe.speculative),
            **fields,
        }
    return {
        "decoding_type": support.LLMAPI_DRAFT_TARGET_DECODING_TYPE,
        "max_draft_len": fields.pop("max_draft_len"),
        support.LLMAPI_SPECULATIVE_MODEL_KEY: str(draft_dir),
        **fields,
    }


def check_model_yaml(data: dict, where: str = MODEL_YAML) -> None:
    """Refuse keys the pinned TensorRT-LLM does not have (its LlmArgs are strict: an unknown key fails at load)."""
    speculative = data.get("speculative_config") or {}
    decoding = speculative.get("decoding_type")
    if decoding not in DECODING_KEYS:
        raise CheckFailed(
            f"{where}: speculative_config.decoding_type must be {' or '.join(DECODING_KEYS)} (got {decoding!r})"
        )
    sections = (
        (data, LLM_ARGS_KEYS, ""),
        (speculative, DECODING_KEYS[decoding], "speculative_config."),
        (data.get("kv_cache_config") or {}, KV_CACHE_KEYS, "kv_cache_config."),
        (data.get("triton_config") or {}, TRITON_CONFIG_KEYS, "triton_config."),
    )
    for mapping, known, prefix in sections:
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise CheckFailed(
                f"{where}: unknown key {prefix}{unknown[0]} for TensorRT-LLM {support.TRTLLM_PYTORCH_VERSION}"
            )
    if "triton_config" not in data:
        raise CheckFailed(f"{where}: triton_config is required by upstream's model.py")


def render_model_yaml(data: dict) -> str:
    import yaml

    from trtspec import __version__

    header = (
        f"# Generated by trtspec {__version__} for TensorRT-LLM {support.TRTLLM_PYTORCH_VERSION} "
        f"({support.NGC_TRITON_TRTLLM_PYTORCH_IMAGE}).\n"
        "# Keys map 1:1 to tensorrt_llm.LLM() arguments; triton_config must match config.pbtxt.\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False)


def check_llmapi_config(config, yaml_data: dict) -> None:
    """The rendered config.pbtxt carries upstream's interface and agrees with model.yaml's triton_config."""
    from trtspec.triton_repo.checks import tensors

    if config.name != MODEL_NAME or config.backend != "python":
        raise CheckFailed(f"{MODEL_NAME}/config.pbtxt must be the python model '{MODEL_NAME}'")
    for kind, wanted in (("input", LLMAPI_INPUTS), ("output", LLMAPI_OUTPUTS)):
        have = tensors(config, kind)
        for name, dtype in wanted.items():
            if have.get(name) != dtype:
                raise CheckFailed(
                    f"{MODEL_NAME}/config.pbtxt: {kind} '{name}' must be {dtype} (got {have.get(name)})"
                )
    triton = yaml_data["triton_config"]
    if (config.max_batch_size, config.model_transaction_policy.decoupled) != (
        triton["max_batch_size"],
        triton["decoupled"],
    ):
        raise CheckFailed(
            f"{MODEL_NAME}: config.pbtxt max_batch_size/decoupled differ from model.yaml triton_config"
        )


def find_upstream_model_dir(env: dict | None = None) -> Path:
    """Upstream's llmapi/tensorrt_llm/1 (model.py + helpers.py) in this image; ServerError if absent."""
    env = os.environ if env is None else env
    given = env.get(UPSTREAM_DIR_ENV)
    candidates = [Path(given)] if given else list(UPSTREAM_DIR_CANDIDATES)
    for path in candidates:
        if (path / "model.py").is_file() and (path / "helpers.py").is_file():
            return path
    where = given or ", ".join(map(str, UPSTREAM_DIR_CANDIDATES))
    raise ServerError(
        f"upstream's LLM-API model (model.py + helpers.py) not found in {where}; set {UPSTREAM_DIR_ENV} to "
        f"triton_backend/all_models/llmapi/tensorrt_llm/1 of TensorRT-LLM {support.TRTLLM_PYTORCH_VERSION}"
    )


def load_upstream_model(env: dict | None = None) -> type:
    """Import upstream's model.py from ``find_upstream_model_dir`` and return its TritonPythonModel class.

    Its directory goes first on sys.path because model.py does ``from helpers import ...``.
    """
    directory = find_upstream_model_dir(env)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", directory / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.TritonPythonModel
