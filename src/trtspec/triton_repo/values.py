"""Template values of every model of a repository, from a recipe: the draft-target settings live here.

Draft-target values follow TensorRT-LLM's draft_target_model README: both engine models run inflight fused
batching with KV-cache reuse, beam width 1, not decoupled (the orchestrator makes one request per round),
logits in FP32, and memory fractions that fit both models on one GPU (0.5 + 0.5 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.recipe import Recipe, SpeculativeSpec, torch_runtime_dtype
from trtspec.triton_repo import interface as names
from trtspec.triton_repo import llmapi

# The 52 template keys of upstream's tensorrt_llm/config.pbtxt (TensorRT-LLM 1.2.x triton_backend).
UPSTREAM_TRTLLM_KEYS = frozenset(
    [
        "batch_scheduler_policy",
        "batching_strategy",
        "cancellation_check_period_ms",
        "cross_kv_cache_fraction",
        "cuda_graph_cache_size",
        "cuda_graph_mode",
        "decoding_mode",
        "decoupled_mode",
        "eagle_choices",
        "enable_chunked_context",
        "enable_context_fmha_fp32_acc",
        "enable_kv_cache_reuse",
        "enable_trt_overlap",
        "encoder_engine_dir",
        "encoder_input_features_data_type",
        "engine_dir",
        "exclude_input_in_output",
        "gpu_device_ids",
        "gpu_weights_percent",
        "guided_decoding_backend",
        "iter_stats_max_iterations",
        "kv_cache_free_gpu_mem_fraction",
        "kv_cache_host_memory_bytes",
        "kv_cache_onboard_blocks",
        "logits_datatype",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "lookahead_window_size",
        "lora_cache_gpu_memory_fraction",
        "lora_cache_host_memory_bytes",
        "lora_cache_max_adapter_size",
        "lora_cache_optimal_adapter_size",
        "lora_prefetch_dir",
        "max_attention_window_size",
        "max_beam_width",
        "max_queue_delay_microseconds",
        "max_queue_size",
        "max_tokens_in_paged_kv_cache",
        "medusa_choices",
        "multi_block_mode",
        "normalize_log_probs",
        "num_nodes",
        "participant_ids",
        "prompt_embedding_table_data_type",
        "request_stats_max_iterations",
        "sink_token_length",
        "speculative_decoding_fast_logits",
        "stats_check_period_ms",
        "tokenizer_dir",
        "triton_backend",
        "triton_max_batch_size",
        "xgrammar_tokenizer_info_path",
    ]
)
# Parameters draft-target does not use: left unset (empty string), which the C++ backend reads as "default".
UNSET = ""


@dataclass(frozen=True)
class ModelPlan:
    """One model directory to write: its template, values, and the thin model.py (None for C++ backends and
    ensembles).

    ``version_files`` are written verbatim into ``<name>/1/`` (file name -> text), e.g. the LLM-API model.yaml.
    ``forward_to`` (no template): an ensemble that passes every input and output of that model through
    (render.forwarding_ensemble).
    """

    name: str
    template: str | None
    values: dict
    model_module: str | None
    version_files: tuple[tuple[str, str], ...] = ()
    forward_to: str | None = None


def _tokenizer_dir(recipe: Recipe) -> str:
    return str(recipe.target.model)


def participant_ids(recipe: Recipe) -> dict[str, str]:
    """MPI ranks of each engine model for fast logits: rank 0 orchestrator, then draft ranks, then target ranks
    (upstream's draft_target_model README: draft ``1``, target ``2,3`` for a tp=2 target); no draft: the target's
    from rank 1."""
    draft = list(range(1, 1 + (recipe.draft.world_size if recipe.draft is not None else 0)))
    first = draft[-1] + 1 if draft else 1
    target = ",".join(map(str, range(first, first + recipe.target.world_size)))
    return {"draft": ",".join(map(str, draft)), "target": target} if draft else {"target": target}


def tensorrtllm_values(recipe: Recipe, role: str, engine_dir: Path) -> dict:
    """The 52 upstream keys (+ model_name) of the C++ backend model over ``role``'s engine ("target"/"draft")."""
    spec = recipe.models()[role]
    triton = recipe.triton
    fast = triton.fast_logits
    values = dict.fromkeys(UPSTREAM_TRTLLM_KEYS, UNSET)
    values.update(
        model_name=names.TARGET_MODEL if role == "target" else names.DRAFT_MODEL,
        triton_backend="tensorrtllm",
        triton_max_batch_size=recipe.limits.max_batch_size,
        decoupled_mode=False,
        max_beam_width=1,
        engine_dir=str(engine_dir),
        batching_strategy="inflight_fused_batching",
        batch_scheduler_policy="guaranteed_no_evict",
        enable_kv_cache_reuse=triton.enable_kv_cache_reuse,
        kv_cache_free_gpu_mem_fraction=getattr(triton.kv_cache_free_gpu_mem_fraction, role),
        kv_cache_onboard_blocks=True,
        exclude_input_in_output=False,
        enable_chunked_context=False,
        enable_trt_overlap=False,
        normalize_log_probs=True,
        multi_block_mode=True,
        enable_context_fmha_fp32_acc=False,
        cuda_graph_mode=False,
        cuda_graph_cache_size=0,
        gpu_weights_percent=1.0,
        logits_datatype="TYPE_FP32",
        encoder_input_features_data_type="TYPE_FP16",
        prompt_embedding_table_data_type="TYPE_FP16",
        gpu_device_ids=",".join(map(str, spec.devices)),
        max_queue_delay_microseconds=0,
        max_queue_size=0,
        cancellation_check_period_ms=100,
        stats_check_period_ms=100,
        iter_stats_max_iterations=1000,
        request_stats_max_iterations=0,
        tokenizer_dir=_tokenizer_dir(recipe),
        speculative_decoding_fast_logits=1 if fast else 0,
        participant_ids=participant_ids(recipe)[role] if fast else UNSET,
    )
    return values


def engine_vocab_rows(engine_dirs: dict[str, Path]) -> dict:
    """Logit rows of the target and draft engines (role -> rows). With a padded-vocabulary pair the
    orchestrator pads the draft's logits to the target's rows and maps ids the draft lacks
    (core.vocab.vocab_pair_problem, core.vocab.draft_input_ids)."""
    from trtspec.core.engine_config import engine_vocab_rows as rows_of
    from trtspec.core.engine_config import read_engine_config

    return {role: rows_of(read_engine_config(path)) for role, path in engine_dirs.items()}


def k_values(spec: SpeculativeSpec) -> dict:
    """The K parameters of either runtime's entry model: adaptive K (engines/adaptive.py, with the recipe's
    schedule and draft cost) for requests without a num_draft_tokens, unless the recipe pins a default K."""
    return {
        "num_draft_tokens": spec.num_draft_tokens or names.ADAPTIVE,
        "k_schedule": names.format_schedule(spec.schedule),
        "draft_cost_ratio": spec.draft_cost_ratio,
    }


def proposer_values(spec: SpeculativeSpec) -> dict:
    """Who proposes for requests without a ``proposer`` of their own, and prompt lookup's n-gram sizes
    (core/lookup.py), as an entry model's parameters (request.lookup_from_parameters reads them back)."""
    return {
        "proposer": spec.proposer,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
    }


def orchestrator_values(
    recipe: Recipe, runtime: str, vocab_rows: dict, draft_tokenizer_dir: Path | None = None
) -> dict:
    """Values of the orchestrator (``runtime``: "torch" or "tensorrtllm"); ``vocab_rows``: engine_vocab_rows. A
    recipe without a draft names no draft model (empty: the orchestrator proposes by prompt lookup alone).
    ``draft_tokenizer_dir``: the draft's own tokenizer where its tokens reach the target as text
    (core/translate.py; Recipe.draft_tokenizer_dir), else None (empty: one tokenizer, tokens go by id); such a
    draft does not draft ahead (a guess in its tokens cannot be matched to the target's)."""
    spec, batch = recipe.speculative, recipe.limits.max_batch_size
    return {
        "triton_max_batch_size": batch,
        "decoupled_mode": recipe.triton.decoupled,
        "bls_instance_count": recipe.triton.instances.orchestrator,
        "tensorrt_llm_model_name": names.TARGET_MODEL,
        "tensorrt_llm_draft_model_name": names.DRAFT_MODEL if recipe.draft is not None else UNSET,
        "accumulate_tokens": False,
        "logits_datatype": "TYPE_FP32",
        "multimodal_encoders_name": UNSET,
        "max_draft_len": spec.max_draft_len,
        **k_values(spec),
        **proposer_values(spec),
        "use_draft_logits": spec.use_draft_logits,
        "target_vocab_rows": vocab_rows["target"],
        "draft_vocab_rows": vocab_rows.get("draft", 0),
        "draft_ahead": recipe.draft_ahead_for(runtime) and draft_tokenizer_dir is None,
        # Draft logits go from rank to rank (speculative_decoding_fast_logits): looked-up proposals have none
        "fast_logits": runtime == "tensorrtllm" and recipe.triton.fast_logits and spec.use_draft_logits,
        "max_seq_len": recipe.limits.max_seq_len,
        # Requests in flight at once (decoupled, or one execute's batch): one per engine batch slot.
        "max_concurrency": batch,
        # The entry model tokenises and detokenises in-process (models/text.py TextCodec).
        "tokenizer_dir": _tokenizer_dir(recipe),
        "draft_tokenizer_dir": str(draft_tokenizer_dir) if draft_tokenizer_dir is not None else UNSET,
        "add_special_tokens": True,
        "skip_special_tokens": True,
        "max_input_len": recipe.limits.max_input_len,
        # Every tokenizer the entry model loads (the target's, a draft's own) runs its code only where asked.
        "trust_remote_code": any(spec.trust_remote_code for spec in recipe.models().values()),
    }


def in_process_values(recipe: Recipe, draft_tokenizer_dir: Path | None = None) -> dict:
    """Values of the torch runtime's entry model: the checkpoints in one process (draft_model_dir and draft_dtype
    "" where the recipe has no draft: prompt lookup proposes alone), the orchestrator's client limits and tokenizer
    settings (orchestrator_values, draft_tokenizer_dir included), no engine model names."""
    triton, draft = recipe.triton, recipe.draft
    orchestrator = orchestrator_values(recipe, "torch", {"target": 0, "draft": 0}, draft_tokenizer_dir)
    shared = ["triton_max_batch_size", "decoupled_mode", "max_draft_len", *k_values(recipe.speculative)]
    shared += ["max_seq_len", "max_input_len"]
    shared += ["tokenizer_dir", "draft_tokenizer_dir", "skip_special_tokens", "add_special_tokens"]
    shared += ["trust_remote_code"]
    own = {
        "target_model_dir": str(recipe.target.model),
        "draft_model_dir": str(draft.model) if draft else UNSET,
        "device": triton.device,
        "target_dtype": torch_runtime_dtype(triton, recipe.target),
        "draft_dtype": torch_runtime_dtype(triton, draft) if draft else UNSET,
        "cpu_threads": triton.cpu_threads,
        # The PyTorch engine holds the draft's probabilities and accepts sampled drafts by them whatever the recipe
        # says, so a request may ask for it; a draft with its own tokenizer has probabilities over another
        # vocabulary, and its translated tokens are accepted as point masses.
        "use_draft_logits": draft_tokenizer_dir is None,
    }
    return {k: orchestrator[k] for k in shared} | proposer_values(recipe.speculative) | own


def plan_models(
    recipe: Recipe,
    runtime: str,
    engine_dirs: dict[str, Path] | None = None,
    draft_tokenizer_dir: Path | None = None,
) -> list[ModelPlan]:
    """Every model of the repository for ``runtime`` ("torch" or "tensorrtllm"): the entry model, upstream's
    ``ensemble`` name over it, and (tensorrtllm) the two engine models the orchestrator calls.
    ``draft_tokenizer_dir``: orchestrator_values'.

    ``torch``: the in-process entry model (models/inflight.py) runs both checkpoints. ``tensorrtllm``: the
    orchestrator (models/orchestrator.py) over TensorRT-LLM's C++ backend, one model per engine in ``engine_dirs``.
    """
    ensemble = ModelPlan(names.ENSEMBLE, None, {}, None, forward_to=names.ENTRY_POINT)
    if runtime == "torch":
        template = "tensorrt_llm_bls_torch/config.pbtxt"
        values = in_process_values(recipe, draft_tokenizer_dir)
        return [ModelPlan(names.ORCHESTRATOR, template, values, "inflight"), ensemble]
    values = orchestrator_values(recipe, runtime, engine_vocab_rows(engine_dirs), draft_tokenizer_dir)
    plans = [ModelPlan(names.ORCHESTRATOR, "tensorrt_llm_bls/config.pbtxt", values, "orchestrator"), ensemble]
    for role, name in (("target", names.TARGET_MODEL), ("draft", names.DRAFT_MODEL)):
        if role not in recipe.models():  # prompt lookup alone: the target engine only
            continue
        values = tensorrtllm_values(recipe, role, engine_dirs[role])
        plans.append(ModelPlan(name, "tensorrt_llm/config.pbtxt", values, None))
    return plans


# Environment of upstream's launch_triton_server.py --multi-model (TensorRT-LLM triton_backend/scripts).
ORCHESTRATOR_ENV = "TRTLLM_ORCHESTRATOR"
SPAWN_ENV = "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"


def launch_layout(recipe: Recipe, runtime: str) -> dict:
    """How ``serve`` starts tritonserver for this repository (recorded in trtspec.json as ``launch``).

    Modes, following upstream's launch_triton_server.py:
    - single: one tritonserver, no MPI (torch runtime).
    - orchestrator: ``--multi-model``: one MPI rank (world_size 1) whose C++ backend spawns each engine model's
      workers on its ``gpu_device_ids``. Always so for tensorrtllm, one GPU or many: the repository holds two
      TensorRT-LLM models ("--multi-model: Enable support for multiple TRT-LLM models in the Triton model
      repository"), and upstream's draft-target README launches them this way.
    - orchestrator-prespawn: ``--multi-model --disable-spawn-processes`` for fast logits: world_size =
      1 (orchestrator) + draft ranks + target ranks, every rank started by mpirun, models placed by participant_ids;
      ranks > 0 load only the engine models.
    - llmapi: trtllm-pytorch: one MPI rank; the LLM API spawns the tp*pp workers itself on CUDA_VISIBLE_DEVICES.
    """
    layout = {"mode": "single", "mpi": False, "world_size": 1, "env": {}, "rank_models": [], "gpus": []}
    if runtime == "torch":
        return layout
    target, draft = recipe.target, recipe.draft
    layout["gpus"] = recipe.engine_gpus(runtime)
    if runtime == "trtllm-pytorch":
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, target.devices))}
        return layout | {"mode": "llmapi", "mpi": True, "env": env}
    if recipe.triton.fast_logits:
        return layout | {
            "mode": "orchestrator-prespawn",
            "mpi": True,
            "world_size": 1 + (draft.world_size if draft is not None else 0) + target.world_size,
            "env": {ORCHESTRATOR_ENV: "1", SPAWN_ENV: "0"},
            "rank_models": [names.TARGET_MODEL] + ([names.DRAFT_MODEL] if draft is not None else []),
            "participant_ids": participant_ids(recipe),
        }
    return layout | {"mode": "orchestrator", "mpi": True, "env": {ORCHESTRATOR_ENV: "1", SPAWN_ENV: "1"}}


def llmapi_plan(recipe: Recipe, model_dirs: dict[str, Path]) -> tuple[ModelPlan, dict]:
    """The trtllm-pytorch repository's one model (upstream's LLM-API ``tensorrt_llm``) and its model.yaml data."""
    from trtspec import __version__

    data = llmapi.model_yaml(recipe, model_dirs)
    llmapi.check_model_yaml(data)
    triton = data["triton_config"]
    values = {
        "model_name": llmapi.MODEL_NAME,
        "triton_max_batch_size": triton["max_batch_size"],
        "decoupled_mode": triton["decoupled"],
    }
    launcher = llmapi.LAUNCHER_PY.format(version=__version__, env=llmapi.UPSTREAM_DIR_ENV)
    files = ((llmapi.MODEL_YAML, llmapi.render_model_yaml(data)), ("model.py", launcher))
    return ModelPlan(llmapi.MODEL_NAME, "llmapi/config.pbtxt", values, None, files), data
