"""What the TensorRT-LLM draft-target path supports: the one place these facts live (the pinned TensorRT-LLM
release is core/trtllm.py's, the vocab rows of a pair core/vocab.py's).

Sources: NVIDIA/TensorRT-LLM 1.2.x examples/draft_target_model/README.md (precisions), modelopt 0.37
``modelopt/torch/export/model_config_utils`` / ``layer_utils.get_model_type`` (decoder types), TensorRT-LLM
``tensorrt_llm/quantization/mode.py`` (QuantAlgo names) and its per-format hardware requirements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trtspec.core.trtllm import NGC_TRITON_TRTLLM_IMAGE, TRTLLM_VERSION, TRTLLM_VERSION_RANGE

# The conversion path (nvidia-modelopt quantization and export: convert, quantize, build's checkpoint stages, the
# HF export for trtllm-pytorch) runs on the libraries TensorRT-LLM 1.2.1 pins (nvidia-modelopt 0.37,
# transformers 4.57.3): ModelOpt 0.37 supports transformers 4 only, and its export on transformers 5 gave checkpoints
# with a 21.7 % logit error. pyproject.toml's `convert` extra installs this; the rest of trtspec runs on
# transformers 4.56 to 5.x.
CONVERSION_STACK = {"nvidia-modelopt": ">=0.37,<0.38", "transformers": ">=4.56,<5"}
CONVERSION_INSTALL = "pip install 'trtspec[convert]'"

# HF architecture -> modelopt/TensorRT-LLM decoder type of the conversion path.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "Qwen3ForCausalLM": "qwen",
}

# HF model_type -> why `convert` cannot write its TensorRT-LLM checkpoint. Found by running modelopt 0.37's
# export_tensorrt_llm_checkpoint on tiny models of each family (tests/test_families.py keeps that evidence): it
# extracts the weights, then writes config.json through tensorrt_llm's own config classes when tensorrt_llm imports
# and otherwise through tensorrt_llm_utils.convert_to_tensorrt_llm_config, whose manual path knows only
# gpt/gemma/llama/mpt/recurrentgemma/dbrx/mllama and encoder-decoders and raises NotImplementedError for these.
# Exporting them as "llama" or "gemma" instead fails in build_decoder_config (KeyError 'parallel_attn_mlp_res')
# for Gemma 2/3 and would drop Phi-3's own config fields; trtspec's checkpoint interpreter verifies Llama-family
# decoders only. The torch runtime serves them through the Hugging Face forward.
_NO_TRTLLM_CONFIG = (
    "its config writer (tensorrt_llm_utils.convert_to_tensorrt_llm_config) raises NotImplementedError without "
    "tensorrt_llm installed, and trtspec's checkpoint interpreter cannot verify {what}"
)
_GEMMA3 = _NO_TRTLLM_CONFIG.format(what="local/global rope bases and the pre/post-feedforward norms")
CONVERT_UNSUPPORTED_FAMILIES: dict[str, str] = {
    "gemma2": _NO_TRTLLM_CONFIG.format(what="logit soft-capping and the pre/post-feedforward norms"),
    "gemma3_text": _GEMMA3,
    "gemma3": _GEMMA3,
    "phi3": _NO_TRTLLM_CONFIG.format(what="Phi-3's fused qkv/gate_up layout and partial or long rope"),
}


def sliding_window(hf_config: dict) -> int | None:
    """The attention window a Hugging Face config applies (None: full attention), as transformers 4.57 reads it:
    Mistral always, Qwen2/Qwen3 only with use_sliding_window."""
    window = hf_config.get("sliding_window")
    applies = hf_config.get("model_type") == "mistral" or hf_config.get("use_sliding_window", False)
    return window if applies and window else None


def convert_problem(hf_config: dict) -> str | None:
    """Why `convert` cannot export this model to a TensorRT-LLM checkpoint (None: it can), as one line naming the
    stage; check and convert both say this."""
    model_type = hf_config.get("model_type", "<none>")
    arch = (hf_config.get("architectures") or [""])[0]
    if not arch:
        return (
            'convert: config.json has no "architectures" entry naming the model class; add one, such as '
            '["LlamaForCausalLM"] (the class transformers loads it with)'
        )
    if model_type in CONVERT_UNSUPPORTED_FAMILIES:
        return (
            f"convert: nvidia-modelopt 0.37 cannot export model_type {model_type} to a TensorRT-LLM checkpoint: "
            f"{CONVERT_UNSUPPORTED_FAMILIES[model_type]}"
        )
    if arch not in SUPPORTED_ARCHITECTURES:
        return (
            f"convert: architecture {arch} is not supported by the TensorRT-LLM conversion path (supported: "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    return None


def engine_window_problem(hf_config: dict, max_seq_len: int) -> str | None:
    """A sliding window the TensorRT engine would not apply: modelopt's checkpoint config has no window field, and
    TensorRT-LLM applies one only at run time (max_attention_window_size), which trtspec's repositories leave
    unset; so past the window the engine would attend where the Hugging Face model does not."""
    window = sliding_window(hf_config)
    if window is None or window >= max_seq_len:
        return None
    return (
        f"engine: sliding_window {window} < limits.max_seq_len {max_seq_len}: the TensorRT-LLM checkpoint carries "
        "no window and trtspec leaves max_attention_window_size unset, so the engine would attend past the "
        f"window; set limits.max_seq_len <= {window} or use triton.runtime: torch"
    )


# Quantization formats: recipe name -> (modelopt config name, checkpoint QuantAlgo, needs calibration).
QUANT_FORMATS: dict[str, tuple[str | None, str | None, bool]] = {
    "none": (None, None, False),
    "fp8": ("FP8_DEFAULT_CFG", "FP8", True),
    "int8_sq": ("INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL", True),
    "int4_awq": ("INT4_AWQ_CFG", "W4A16_AWQ", True),
    "w4a8_awq": ("W4A8_AWQ_BETA_CFG", "W4A8_AWQ", True),
}

# Draft-target model (DTM) support matrix of TensorRT-LLM: the precisions a pair may run in.
DTM_SUPPORTED_PRECISIONS = frozenset({"float16", "bfloat16", "fp8"})

# Bytes per weight element as stored in the engine (int4 packs two per byte; scales are ignored here).
WEIGHT_BYTES = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "fp8": 1.0,
    "int8_sq": 1.0,
    "int4_awq": 0.5,
    "w4a8_awq": 0.5,
}
KV_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp8": 1.0}

# Minimum CUDA compute capability each precision needs in TensorRT-LLM.
MIN_COMPUTE_CAPABILITY = {
    "float16": (7, 0),
    "bfloat16": (8, 0),
    "float32": (7, 0),
    "fp8": (8, 9),
    "int8_sq": (7, 0),
    "int4_awq": (7, 5),
    "w4a8_awq": (8, 9),
}

# AWQ kernels need weight input dimensions (per rank) divisible by this group size.
AWQ_GROUP_SIZE = 128


AWQ_FORMATS = ("int4_awq", "w4a8_awq")
# Why a quantized model for trtllm-pytorch needs safetensors weights (the ModelOpt HF export's check reads them)
SAFETENSORS_NEEDED = (
    "no *.safetensors weights; the ModelOpt HF export's check reads them (re-save the model with save_pretrained, "
    "which writes them)"
)


def awq_shape_problems(hf_config: dict, tp_size: int, group: int = AWQ_GROUP_SIZE) -> list[str]:
    """Input dimensions each rank's AWQ GEMMs see must be multiples of the group size (modelopt/TRT-LLM kernels)."""
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    dims = {
        "hidden_size": hf_config["hidden_size"],
        "num_attention_heads*head_dim/tp_size": heads * head_dim // tp_size,
        "intermediate_size/tp_size": hf_config["intermediate_size"] // tp_size,
    }
    return [f"{name}={value}" for name, value in dims.items() if value % group]


def split_problem(spec, hf_config: dict) -> str | None:
    """Why the format's kernels or the tp/pp split of ``spec`` (a recipe's ModelSpec) do not take the model's
    layer sizes (None: they do): what convert and the HF export refuse before any work, and check reports."""
    if spec.quantization in AWQ_FORMATS:
        problems = awq_shape_problems(hf_config, spec.tp_size)
        if problems:
            # a smaller tp_size helps only where a per-rank size fails and there are ranks to merge
            per_rank = spec.tp_size > 1 and any("/tp_size" in problem for problem in problems)
            return (
                f"{spec.quantization} needs layer input sizes divisible by {AWQ_GROUP_SIZE} per rank, but "
                f"{', '.join(problems)}; use fp8 or int8_sq" + (", or a smaller tp_size" if per_rank else "")
            )
    heads = hf_config["num_attention_heads"]
    if heads % spec.tp_size or hf_config["intermediate_size"] % spec.tp_size:
        return (
            f"tp_size={spec.tp_size} must divide num_attention_heads={heads} and "
            f"intermediate_size={hf_config['intermediate_size']}"
        )
    if hf_config["num_hidden_layers"] % spec.pp_size:
        return f"pp_size={spec.pp_size} must divide num_hidden_layers={hf_config['num_hidden_layers']}"
    return None


def effective_precision(dtype: str, quantization: str) -> str:
    """The precision a model runs in: its quantization format if any, else its dtype."""
    return dtype if quantization == "none" else quantization


# ---------------------------------------------------------------- runtimes and the TensorRT-LLM versions they need
# trtspec serves a pair three ways (recipe triton.runtime):
#   torch           trtspec's PyTorch engine in Triton python models (no TensorRT-LLM; CPU or GPU)
#   tensorrtllm     TensorRT engines under the C++ tensorrtllm backend + trtspec's orchestrator (engine path)
#   trtllm-pytorch  TensorRT-LLM's PyTorch backend behind upstream's Triton LLM-API model (HF checkpoints)
# TensorRT-LLM removed the TensorRT engine path (trtllm-build, the C++ backend's engines) after this release:
TRTLLM_LAST_ENGINE_RELEASE = "1.3.0rc20"
# The LLM-API runtime is pinned to the newest stable release that ships in an NGC Triton image
# (triton-inference-server/server docs/introduction/compatibility.md: 26.04-26.07 trtllm-python-py3 -> 1.2.1).
# Field names below are those of 1.2.1's tensorrt_llm/llmapi/llm_args.py (read in the 1.2.1 documentation's
# rendered source, 1.2.1/_modules/tensorrt_llm/llmapi/llm_args.html): BaseLlmArgs (extra="forbid"): model, backend
# (deprecated but still a field; upstream's model.yaml sets it), tensor_parallel_size, pipeline_parallel_size,
# dtype, trust_remote_code, max_batch_size, max_input_len, max_seq_len, kv_cache_config, speculative_config;
# DecodingBaseConfig (strict): max_draft_len, speculative_model_dir. Main renamed it speculative_model and kept
# speculative_model_dir as a validation alias (NVIDIA/TensorRT-LLM PR #10099, December 2025); whether the rename
# reached 1.2.x could not be confirmed from here, and speculative_model_dir is accepted either way.
# DecodingBaseConfig.from_dict maps decoding_type "DraftTarget" ->
# DraftTargetDecodingConfig (the class's own string "Draft_Target" is refused there); KvCacheConfig (strict):
# free_gpu_memory_fraction, enable_block_reuse. Upstream's llmapi model.py pops only triton_config (max_batch_size,
# decoupled: both required) from model.yaml and passes every other key to LLM().
TRTLLM_PYTORCH_VERSION = "1.2.1"
TRTLLM_PYTORCH_MIN_VERSION = "1.2.0"
NGC_TRITON_TRTLLM_PYTORCH_IMAGE = NGC_TRITON_TRTLLM_IMAGE
LLMAPI_DRAFT_TARGET_DECODING_TYPE = "DraftTarget"
LLMAPI_SPECULATIVE_MODEL_KEY = "speculative_model_dir"

# Adaptive K in TensorRT-LLM 1.2.x's LLM API (DecodingBaseConfig in tensorrt_llm/llmapi/llm_args.py, "PyTorch
# only"; the drafter in _torch/speculative/drafter.py, the gate in _torch/speculative/speculation_gate.py, both
# driven by _torch/pyexecutor/py_executor.py; release notes 1.2: "Enabled dynamic draft length support"):
# - no per-request draft length: every request drafts speculative_config's K (the Triton model has no K input);
# - max_concurrency: speculation is off in an iteration with more active requests than this
#   (min(active, max_batch_size, max_num_tokens // (1 + K)) > max_concurrency); the target's CUDA graph without
#   draft tokens is captured only when it is set, so a deployment that can switch speculation off sets it;
# - draft_len_schedule {batch size: K}: the K of the largest key <= the active requests (bisect_right; a K of 0
#   turns speculation off); validated: keys >= 1, K >= 0, key 1 present with K == max_draft_len, every K <=
#   max_draft_len (NVIDIA/TensorRT-LLM PR #8194); with a schedule the draft runs without the fused draft loop
#   (ChainDrafter, "enabled only ... when no schedule is provided"). 1.3 reads the keys the other way ("up to", 0
#   past the last key, PR #10860);
# - acceptance_window N (>= 0; 0 or unset: off) and acceptance_length_threshold T (>= 0; both needed): once N
#   requests have finished, speculation turns off for good, for every request, when the mean over the last N of
#   (a request's decoded tokens per iteration - 1), i.e. its accepted draft tokens per round, is below T (PR #7283).
#   1.3 renamed them acceptance_rate_window_size / acceptance_rate_threshold, a rate over iterations (PR #12905).
LLMAPI_SPECULATIVE_FIELDS = (
    "max_draft_len",
    LLMAPI_SPECULATIVE_MODEL_KEY,
    "max_concurrency",
    "draft_len_schedule",
    "acceptance_window",
    "acceptance_length_threshold",
)
# NGram decoding (prompt lookup) in the same file: NGramDecodingConfig(DecodingBaseConfig), decoding_type "NGram"
# (DecodingBaseConfig.from_dict's key, and the class's own), PyTorch backend only; besides the base fields
# (max_draft_len, max_concurrency, draft_len_schedule, ...): max_matching_ngram_size (the longest suffix searched; the
# search goes down to one token: no shortest size), is_keep_all (default True), is_use_oldest (default True: the
# oldest match of a pattern, False: the newest), is_public_pool (default True: one pattern pool shared by every
# request, False: each request's own). The names are the same in the release before 1.2 and the pre-releases after
# it (_torch/speculative/ngram.py's NGramPoolManager reads them); the default of max_matching_ngram_size changed
# (0, later 2), so trtspec always writes it.
LLMAPI_NGRAM_DECODING_TYPE = "NGram"
LLMAPI_NGRAM_FIELDS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
# Finished requests the acceptance gate averages over: each one is a whole request's mean, and the switch is final,
# so a window of a few requests would stop drafting for good after a handful of unlucky prompts.
LLMAPI_ACCEPTANCE_WINDOW = 16


@dataclass(frozen=True)
class LlmapiSpeculation:
    """speculative_config fields (besides decoding_type and the draft) that render a recipe's K rules for
    TensorRT-LLM 1.2.x's LLM API; None = not written."""

    max_draft_len: int
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    acceptance_window: int | None = None
    acceptance_length_threshold: float | None = None

    def fields(self) -> dict:
        return {name: value for name, value in asdict(self).items() if value is not None}


def upstream_draft_len_schedule(schedule: dict[int, int], max_k: int) -> dict[int, int]:
    """trtspec's schedule (in flight up to N -> largest K; past the last key its K holds) as 1.2.x's
    draft_len_schedule (K of the largest key <= the active requests), each K capped at ``max_k``."""
    upstream: dict[int, int] = {}
    start = 1
    for in_flight, k in sorted(schedule.items()):
        k = min(k, max_k)
        if not upstream or list(upstream.values())[-1] != k:
            upstream[start] = k
        start = in_flight + 1
    return upstream


def llmapi_speculation_problem(speculative) -> str | None:
    """Why a recipe's ``speculative`` section cannot be served by trtllm-pytorch at all (None: it can)."""
    if speculative.num_draft_tokens is None and speculative.schedule:
        first = speculative.schedule[min(speculative.schedule)]
        if first == 0:
            return (
                f"speculative.schedule {speculative.schedule} drafts nothing even with one request in flight, "
                f"and TensorRT-LLM {TRTLLM_PYTORCH_VERSION}'s DraftTarget needs max_draft_len > 0 (its "
                "draft_len_schedule[1] must equal it); give the schedule's first key a K > 0, or serve it with "
                "runtime torch"
            )
    return None


def llmapi_speculation(speculative, max_batch_size: int) -> LlmapiSpeculation:
    """The speculative_config fields of a recipe's K rules (``speculative``: recipe.SpeculativeSpec):
    - ``num_draft_tokens`` set: every request drafts it (no per-request K upstream), nothing adaptive;
    - unset (adaptive): ``schedule`` -> max_concurrency where it only turns drafting on and off, else
      draft_len_schedule (+ max_concurrency where it reaches 0); K by acceptance -> the acceptance gate, whose
      threshold is the break-even of core.metrics' cost model: K * draft_cost_ratio + 1 target steps per round
      need K * draft_cost_ratio accepted draft tokens to pay (not for proposer ngram: a lookup costs no forward).
    Raises ValueError for what ``llmapi_speculation_problem`` refuses."""
    from trtspec.core.metrics import round_cost

    problem = llmapi_speculation_problem(speculative)
    if problem:
        raise ValueError(problem)
    if speculative.num_draft_tokens is not None:
        return LlmapiSpeculation(max_draft_len=speculative.num_draft_tokens)
    gated = speculative.proposer != "ngram"  # a looked-up proposal costs no forward: nothing to break even
    k, max_concurrency, schedule = speculative.max_draft_len, None, None
    if speculative.schedule:
        upstream = upstream_draft_len_schedule(speculative.schedule, k)
        k = upstream[1]  # the most the schedule ever allows, which 1.2.x requires of draft_len_schedule[1]
        off = [start for start, n in upstream.items() if n == 0]
        max_concurrency = off[0] - 1 if off else None
        if len({n for n in upstream.values() if n > 0}) > 1:
            schedule = upstream
    threshold = round(round_cost(k, speculative.draft_cost_ratio) - 1.0, 4)
    return LlmapiSpeculation(
        max_draft_len=k,
        # max_batch_size never binds (active requests <= it), but the gate may switch speculation off, and only
        # with max_concurrency set does TensorRT-LLM capture the target's CUDA graph for rounds without drafts.
        max_concurrency=max_concurrency if max_concurrency is not None else max_batch_size,
        draft_len_schedule=schedule,
        acceptance_window=LLMAPI_ACCEPTANCE_WINDOW if gated else None,
        acceptance_length_threshold=threshold if gated else None,
    )


def llmapi_ngram_fields(speculative) -> dict:
    """NGramDecodingConfig's own fields for prompt lookup (``speculative``: recipe.SpeculativeSpec): trtspec looks
    up the longest suffix of up to prompt_lookup_max tokens in the request's own prompt and output and takes its
    latest occurrence (core/lookup.py), i.e. a private pool and the newest match."""
    return {
        "max_matching_ngram_size": speculative.prompt_lookup_max,
        "is_use_oldest": False,
        "is_public_pool": False,
    }


# Formats beside which TensorRT-LLM's engine build keeps the paged context FMHA (which KV-cache reuse needs) with an
# fp8 KV cache; for the others builder.py's build() turns it off ("FP8 Paged Context FMHA is disabled because FP8
# context FMHA is disabled"). NVFP4 is the third there; trtspec has no nvfp4 format.
FP8_KV_CACHE_ENGINE_QUANTIZATIONS = ("fp8", "w4a8_awq")
# Quantized checkpoints the PyTorch backend runs (_torch/modules/linear.py get_quant_method: FP8, W4A16_AWQ,
# W4A8_AWQ, NVFP4, ...; no SmoothQuant path, so int8_sq is refused for trtllm-pytorch).
LLMAPI_QUANT_FORMATS = ("none", "fp8", "int4_awq", "w4a8_awq")
# The runtime of each engine model per runtime: who needs which TensorRT-LLM.
RUNTIME_NEEDS = {
    "torch": "no TensorRT-LLM",
    "tensorrtllm": f"TensorRT-LLM 1.2.x engines ({NGC_TRITON_TRTLLM_IMAGE})",
    "trtllm-pytorch": f"TensorRT-LLM >= {TRTLLM_PYTORCH_MIN_VERSION} PyTorch backend ({NGC_TRITON_TRTLLM_PYTORCH_IMAGE})",
}


def replica_nodes(gpus: int, gpus_per_node: int) -> int:
    """Nodes one replica of ``gpus`` GPUs spans on nodes of ``gpus_per_node``."""
    return max(1, -(-gpus // gpus_per_node))


def multi_node_problem(runtime: str, gpus: int, gpus_per_node: int) -> tuple[str, str] | None:
    """(field, why) where a replica of ``gpus`` GPUs would span nodes of ``gpus_per_node``, which no runtime trtspec
    deploys can: None where it fits one node. ``check`` states it up front; ``deploy --k8s`` refuses it.

    The tensorrtllm repository serves two engine models, so Triton's TensorRT-LLM backend runs in orchestrator
    mode, which "currently only works for single node deployments" (tensorrtllm_backend's README); TensorRT-LLM
    1.2.x's Triton LLM-API model (trtllm-pytorch) runs on one node too."""
    nodes = replica_nodes(gpus, gpus_per_node)
    if nodes == 1:
        return None
    spans = f"{gpus} GPUs span {nodes} nodes of {gpus_per_node}"
    served_by = {
        "trtllm-pytorch": "TensorRT-LLM 1.2.x's Triton LLM-API model runs on one node",
        "tensorrtllm": "Triton's TensorRT-LLM backend serves a target and a draft engine in orchestrator mode, "
        "which runs on one node",
    }.get(runtime, f"the {runtime} runtime runs on one node")
    return (
        "kubernetes.gpus_per_node",
        f"{spans}: {served_by}; use nodes with {gpus} GPUs or a smaller tp_size",
    )


def parse_version(text: str) -> tuple[int, int, int, int]:
    """``"1.3.0rc20"`` -> (1, 3, 0, 20); a final release sorts after its release candidates (rc = 10**6).

    Local/dev suffixes (``+cu12``, ``.post1``, ``.dev``) are ignored: only release ordering matters here.
    """
    import re

    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?rc(\d+))?", text)
    if not match:
        raise ValueError(f"not a TensorRT-LLM version: {text!r}")
    major, minor, patch, rc = match.groups()
    return int(major), int(minor), int(patch or 0), int(rc) if rc is not None else 10**6


def runtime_version_problem(runtime: str, version: str) -> tuple[str, str] | None:
    """(status, message) when TensorRT-LLM ``version`` cannot (fail) or may not (warn) run ``runtime``; None if fine."""
    v = parse_version(version)
    if runtime == "tensorrtllm":
        if v > parse_version(TRTLLM_LAST_ENGINE_RELEASE):
            return (
                "fail",
                f"TensorRT-LLM {version} has no TensorRT engine path (removed after {TRTLLM_LAST_ENGINE_RELEASE}); "
                f"use triton.runtime: trtllm-pytorch, or the {NGC_TRITON_TRTLLM_IMAGE} image",
            )
        # "<1.3.0" excludes 1.3.0's release candidates too (PEP 440), hence the rc -1 bound.
        upper = parse_version(TRTLLM_VERSION_RANGE[1][1:])[:3] + (-1,)
        if not parse_version(TRTLLM_VERSION_RANGE[0][2:]) <= v < upper:
            return (
                "fail",
                f"trtspec builds engines with TensorRT-LLM 1.2.x; {version} is outside {', '.join(TRTLLM_VERSION_RANGE)}",
            )
        return None
    if runtime == "trtllm-pytorch":
        if v < parse_version(TRTLLM_PYTORCH_MIN_VERSION):
            return (
                "fail",
                f"TensorRT-LLM {version} predates the LLM-API draft-target fields trtspec writes "
                f"(needs >= {TRTLLM_PYTORCH_MIN_VERSION}); use {NGC_TRITON_TRTLLM_PYTORCH_IMAGE}",
            )
        if v[:2] != parse_version(TRTLLM_PYTORCH_VERSION)[:2]:
            return (
                "warn",
                f"model.yaml field names were confirmed for TensorRT-LLM {TRTLLM_PYTORCH_VERSION}; {version} may "
                "name them differently (1.3 made speculative_config.decoding_type Draft_Target)",
            )
    return None


def conversion_stack_problem(versions: dict[str, str | None]) -> str | None:
    """Why the installed ``versions`` (package -> version, None = not installed) cannot run the conversion path,
    in one line that says what to install; None when they match CONVERSION_STACK."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    found = []
    for package, specifier in CONVERSION_STACK.items():
        version = versions.get(package)
        try:
            fits = version is not None and Version(version) in SpecifierSet(specifier, prereleases=True)
        except InvalidVersion:
            fits = False
        if not fits:
            found.append(f"{package} {version}" if version else f"no {package}")
    if not found:
        return None
    needs = ", ".join(f"{package}{specifier}" for package, specifier in CONVERSION_STACK.items())
    return (
        f"converting with ModelOpt needs the TensorRT-LLM {TRTLLM_VERSION} stack ({needs}), found "
        f"{', '.join(found)}; install it with {CONVERSION_INSTALL}, or run this in {NGC_TRITON_TRTLLM_IMAGE}"
    )
