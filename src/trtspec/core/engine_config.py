"""A built TensorRT-LLM engine's config.json, read without ``tensorrt_llm``: what the build verifies against its
plan, the repository checks before deploying and the in-process runner before loading.

``Engine.save`` writes ``config.json`` as ``EngineConfig.to_dict``: version, pretrained_config and build_config,
IntFlag values (``SpeculativeDecodingMode``) as integers. Older engines (TensorRT-LLM < 0.9) have
``builder_config`` + ``plugin_config`` at the top level instead; ``read_engine_config`` reads both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.core.errors import CheckpointError
from trtspec.core.vocab import vocab_pair_problem, vocab_rows

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
DRAFT_TOKENS_EXTERNAL = SPECULATIVE_MODES[1]  # the mode whose target takes draft tokens from outside
# Engines' logits as trtspec builds them (builders/plan.py) and its repositories declare them (generation_logits
# TYPE_FP32, the tensorrt_llm model's logits_datatype): the tensorrtllm backend takes the type from config.pbtxt
# and refuses every response whose logits differ (model_state.cc, fillTritonResponse's TLLM_CHECK).
LOGITS_DTYPE = "float32"


def speculative_mode_name(value: Any, max_draft_len: int = 0) -> str:
    """Normalise config.json's speculative_decoding_mode (int flag, enum repr or name) to the CLI choice name."""
    if value is None:  # engines from before the field existed: draft support shows as max_draft_len only
        return DRAFT_TOKENS_EXTERNAL if max_draft_len > 0 else "none"
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
    vocab_size = pretrained.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size: must be a positive integer (got {vocab_size!r})")
    return {
        "version": config.get("version"),
        "architecture": pretrained.get("architecture") or pretrained.get("name"),
        "dtype": pretrained.get("dtype") or build.get("precision"),
        "logits_dtype": pretrained.get("logits_dtype"),
        "vocab_size": vocab_size,
        "tp_size": int(mapping.get("tp_size", 1)),
        "pp_size": int(mapping.get("pp_size", 1)),
        "speculative_decoding_mode": speculative_mode_name(
            build.get("speculative_decoding_mode"), max_draft_len
        ),
        "max_draft_len": max_draft_len,
        "max_batch_size": build.get("max_batch_size"),
        "max_input_len": build.get("max_input_len"),
        "max_seq_len": build.get("max_seq_len") or build.get("max_sequence_length"),
        "max_num_tokens": build.get("max_num_tokens"),
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

    Returns a dict with: version, architecture, dtype, logits_dtype, vocab_size, tp_size, pp_size,
    speculative_decoding_mode ("draft_tokens_external", "none", ...), max_draft_len, max_batch_size, max_input_len,
    max_seq_len, max_num_tokens, max_beam_width, gather_context_logits, gather_generation_logits,
    use_paged_context_fmha, gemm_plugin (None where an older layout has no such field).
    Raises CheckpointError (one line) when the file is missing or not an engine config.
    """
    path = Path(engine_dir) / "config.json"
    try:
        return normalise_engine_config(json.loads(path.read_text()))
    except OSError as err:
        raise CheckpointError(
            f"{path}: cannot read the engine config ({err.strerror}); build engines with `trtspec build`"
        ) from None
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{path}: not a TensorRT-LLM engine config ({type(err).__name__}: {err})"
        ) from None


def engine_vocab_rows(facts: dict[str, Any]) -> int:
    """Logit rows of an engine (read_engine_config facts): vocab_size padded to its world size (tp x pp)."""
    return vocab_rows(
        facts["vocab_size"], "tensorrtllm", (facts["tp_size"] or 1) * (facts["pp_size"] or 1), "none"
    )


def pair_problems(
    target: dict[str, Any],
    draft: dict[str, Any] | None,
    *,
    max_draft_len: int = 1,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    use_draft_logits: bool = False,
    fast_logits: bool = False,
    own_tokenizer: bool = False,
    logits_dtype: str | None = None,
) -> list[str]:
    """What makes built engines (read_engine_config facts) unusable for draft-target speculation, empty if nothing:
    the one statement of these rules, for a repository's engines (deploy) and the in-process runner. No draft: the
    target alone, drafting by prompt lookup. ``max_draft_len``: the K the caller needs; ``max_batch_size`` and
    ``max_seq_len``: the batch and sequence length it serves, None to not check (each round sends a row's whole
    sequence, and without chunked context the runtime takes none longer than max_num_tokens); ``own_tokenizer``:
    the draft tokenizes differently, so its vocabulary rows never meet the target's; ``logits_dtype``: the type the
    caller declares gathered logits as, None to not check."""
    problems = []
    mode, built_k = target["speculative_decoding_mode"], target["max_draft_len"]
    if mode != DRAFT_TOKENS_EXTERNAL:
        problems.append(
            f"the target engine was built without draft support (speculative_decoding_mode {mode!r}, "
            f"max_draft_len {built_k}); rebuild it with `trtspec build` (--speculative_decoding_mode "
            f"{DRAFT_TOKENS_EXTERNAL} --max_draft_len K)"
        )
    elif built_k < max_draft_len:
        problems.append(
            f"target engine max_draft_len {built_k} < max_draft_len {max_draft_len} asked for; rebuild it with "
            "`trtspec build`"
        )
    if draft is not None and not own_tokenizer:
        rows = (engine_vocab_rows(target), engine_vocab_rows(draft))
        vocab = vocab_pair_problem(*rows, "tensorrtllm", use_draft_logits, fast_logits)
        if vocab is not None:
            problems.append(vocab)
    for role, facts in (("target", target), ("draft", draft)):
        if facts is None:
            continue
        if max_batch_size is not None and (facts["max_batch_size"] or 0) < max_batch_size:
            problems.append(
                f"{role} engine max_batch_size {facts['max_batch_size']} < limits.max_batch_size "
                f"{max_batch_size}; rebuild it with `trtspec build`"
            )
        tokens = facts.get("max_num_tokens")
        if max_seq_len is not None and tokens is not None and tokens < max_seq_len - 1:
            problems.append(
                f"{role} engine max_num_tokens {tokens} < limits.max_seq_len {max_seq_len} - 1: without chunked "
                f"context, sequences past {tokens} tokens fail part-way; rebuild it with `trtspec build`"
            )
        built_logits = facts.get("logits_dtype")
        if use_draft_logits and logits_dtype and built_logits not in (None, logits_dtype):
            problems.append(
                f"{role} engine returns {built_logits} logits where the repository declares {logits_dtype} (the "
                "tensorrtllm backend refuses every response with other logits); rebuild it with `trtspec build`"
            )
        if use_draft_logits and not facts["gather_generation_logits"]:
            # Without gathered logits the runtime hangs (TensorRT-LLM issue 2798): refused up front.
            problems.append(
                f"{role} engine lacks --gather_generation_logits, which use_draft_logits needs; rebuild with "
                "`trtspec build` or set speculative.use_draft_logits: false"
            )
    return problems
