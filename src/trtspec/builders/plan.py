"""The engine build plan: for each engine, the exact TensorRT-LLM 1.2.x build configuration as data.

This module is the one place that knows the draft-target build rules (shared/reference/trtllm-engine-flow.md,
"Build flags" and "Known user pain points"):

- the target gets ``speculative_decoding_mode draft_tokens_external`` and ``max_draft_len K``; the draft gets
  neither (a target without them fails at run time with "larger than maximum number of draft tokens (0)");
- a recipe without a draft (prompt lookup alone, speculative.proposer ngram) plans the target engine only, still
  for external draft tokens: the orchestrator feeds it looked-up tokens;
- both get paged context FMHA (KV-cache reuse; the default changed across versions, so it is always explicit);
- both get ``gather_generation_logits`` when the recipe accepts by draft logits (without it the runtime hangs,
  TensorRT-LLM issue 2798); ``gather_context_logits`` is never set (RuntimeError with max_draft_len > 0);
- limits (max_batch_size / max_input_len / max_seq_len, beam width 1) come from the recipe, and max_num_tokens
  covers a whole sequence (max_seq_len, plus K on the target; TensorRT-LLM lowers it to max_seq_len x
  max_batch_size before it adds K, so an engine of one slot cuts the drafts of a round whose sequence is within
  K of max_seq_len, LlmRequest::validate): with context FMHA and packed input and chunked
  context off (trtspec's runtimes), the runtime takes no prompt longer than min(max_seq_len - 1, max_num_tokens),
  and each round sends the prompt and everything generated so far, so BuildConfig's default of 8192 would fail
  requests of a longer max_seq_len part-way (LlmRequest::validate: "Prompt length (N) exceeds maximum input
  length");
- logits are float32 on both: the Triton repository declares generation_logits TYPE_FP32, and the tensorrtllm
  backend checks every response's logits against that type; modelopt writes float16 logits into a float16 or
  bfloat16 checkpoint, so without it every draft call that returns logits fails;
- the GEMM plugin dtype is the checkpoint's dtype; tensor/pipeline parallelism come from the checkpoint's
  ``mapping`` (they are fixed at convert time: one ``rank{N}.safetensors`` per rank).

An :class:`EnginePlan` holds the ``BuildConfig.from_dict`` input (field names of TensorRT-LLM 1.2.x
``tensorrt_llm/builder.py`` ``BuildConfig`` and ``tensorrt_llm/plugin/plugin.py`` ``PluginConfig``) and renders
the equivalent ``trtllm-build`` argument list (flags of ``tensorrt_llm/commands/build.py`` ``parse_arguments``).
Everything here is pure except :func:`read_checkpoint_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trtspec.core.engine_config import DRAFT_TOKENS_EXTERNAL, LOGITS_DTYPE
from trtspec.core.errors import CheckpointError, RecipeError
from trtspec.core.vocab import vocab_pair_problem, vocab_rows
from trtspec.recipe import Recipe

ROLES = ("target", "draft")
GEMM_PLUGIN_DTYPES = ("float16", "bfloat16", "float32")
DEFAULT_MAX_NUM_TOKENS = 8192  # TensorRT-LLM 1.2.x BuildConfig.max_num_tokens


@dataclass(frozen=True)
class CheckpointFacts:
    """What the plan needs of a TensorRT-LLM checkpoint's config.json."""

    architecture: str
    dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    quant_algo: str | None = None

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class EnginePlan:
    """One engine: where it reads and writes, and the exact BuildConfig that produces it.

    ``build_config`` is the dict ``tensorrt_llm.builder.BuildConfig.from_dict`` takes, with
    ``speculative_decoding_mode`` as the trtllm-build choice string ("draft_tokens_external") or None,
    ``plugin_config`` as the ``PluginConfig`` fields to set, and ``logits_dtype``, which trtllm-build hands to
    ``build_model`` (it sets the checkpoint config's), not to BuildConfig.
    """

    role: str
    checkpoint_dir: Path
    engine_dir: Path
    checkpoint: CheckpointFacts
    build_config: dict[str, Any] = field(default_factory=dict)

    @property
    def max_draft_len(self) -> int:
        return int(self.build_config.get("max_draft_len", 0))

    def with_dirs(self, checkpoint_dir: Path | None = None, engine_dir: Path | None = None) -> EnginePlan:
        return replace(
            self,
            checkpoint_dir=Path(checkpoint_dir or self.checkpoint_dir),
            engine_dir=Path(engine_dir or self.engine_dir),
        )

    def command(
        self, checkpoint_dir: str | Path | None = None, output_dir: str | Path | None = None
    ) -> list[str]:
        """The equivalent ``trtllm-build`` argument list (argv, no shell)."""
        return trtllm_build_argv(self, checkpoint_dir, output_dir)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "checkpoint_dir": str(self.checkpoint_dir),
            "engine_dir": str(self.engine_dir),
            "checkpoint": self.checkpoint.__dict__ | {"world_size": self.checkpoint.world_size},
            "build_config": self.build_config,
            "trtllm_build": self.command(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnginePlan:
        facts = {k: v for k, v in data["checkpoint"].items() if k != "world_size"}
        return cls(
            role=data["role"],
            checkpoint_dir=Path(data["checkpoint_dir"]),
            engine_dir=Path(data["engine_dir"]),
            checkpoint=CheckpointFacts(**facts),
            build_config=dict(data["build_config"]),
        )


@dataclass(frozen=True)
class BuildPlan:
    """The engines of a draft-target pair: both, or the target alone where prompt lookup proposes (no draft)."""

    recipe_name: str
    target: EnginePlan
    draft: EnginePlan | None = None

    def engines(self) -> tuple[EnginePlan, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe_name, "engines": {p.role: p.to_dict() for p in self.engines()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildPlan:
        engines = {role: EnginePlan.from_dict(d) for role, d in data["engines"].items()}
        return cls(recipe_name=data["recipe"], target=engines["target"], draft=engines.get("draft"))


def engine_roles(recipe: Recipe) -> tuple[str, ...]:
    """The engines ``recipe`` builds, in build order: target and draft, or the target alone (no draft)."""
    return tuple(role for role in ROLES if role in recipe.models())


def checkpoint_facts(config: Any, where: str | Path = "config.json") -> CheckpointFacts:
    """Pick the plan's inputs out of a TensorRT-LLM checkpoint config.json (as modelopt writes it); a field missing
    or of the wrong type is named in one line."""

    def bad(field: str, value: Any, wanted: str) -> CheckpointError:
        return CheckpointError(
            f"{where}: {field} is {value!r}, not {wanted}: not a TensorRT-LLM checkpoint config; re-run "
            "`trtspec build`"
        )

    def section(name: str) -> dict[str, Any]:
        value = config.get(name) or {}
        if not isinstance(value, dict):
            raise bad(name, value, "an object")
        return value

    def text(name: str) -> str:
        value = config.get(name)
        if not isinstance(value, str):
            raise bad(name, value, "a string")
        return value

    def count(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(name, value, "a positive integer")
        return value

    if not isinstance(config, dict):
        raise bad("the file", type(config).__name__, "a JSON object")
    mapping, quant = section("mapping"), section("quantization")
    facts = CheckpointFacts(
        architecture=text("architecture"),
        dtype=text("dtype"),
        vocab_size=count("vocab_size", config.get("vocab_size")),
        tp_size=count("mapping.tp_size", mapping.get("tp_size", 1)),
        pp_size=count("mapping.pp_size", mapping.get("pp_size", 1)),
        quant_algo=quant.get("quant_algo"),
    )
    if facts.dtype not in GEMM_PLUGIN_DTYPES:
        raise CheckpointError(f"{where}: dtype {facts.dtype!r} is not one of {GEMM_PLUGIN_DTYPES}")
    return facts


def read_checkpoint_config(checkpoint_dir: Path) -> CheckpointFacts:
    """Read ``checkpoint_dir/config.json`` and check one ``rank{N}.safetensors`` exists per rank."""
    path = Path(checkpoint_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not UTF-8
        raise CheckpointError(
            f"{path}: cannot read the checkpoint config ({err}); re-run `trtspec build`"
        ) from None
    facts = checkpoint_facts(config, path)
    missing = [
        f"rank{r}.safetensors"
        for r in range(facts.world_size)
        if not (path.parent / f"rank{r}.safetensors").is_file()
    ]
    if missing:
        raise CheckpointError(
            f"{path.parent}: missing {', '.join(missing)}; re-run `trtspec build` to re-convert"
        )
    return facts


def engine_build_config(role: str, recipe: Recipe, facts: CheckpointFacts) -> dict[str, Any]:
    """The BuildConfig of one engine (see the module docstring for each rule and why)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    spec, limits = recipe.models()[role], recipe.limits
    if (spec.tp_size, spec.pp_size) != (facts.tp_size, facts.pp_size):
        raise CheckpointError(
            f"{role} checkpoint has tp_size={facts.tp_size} pp_size={facts.pp_size} but the recipe asks "
            f"{role}.tp_size={spec.tp_size} {role}.pp_size={spec.pp_size}; parallelism is fixed at convert time: "
            "re-run `trtspec build` to re-convert"
        )
    is_target = role == "target"
    max_draft_len = recipe.speculative.max_draft_len if is_target else 0
    return {
        "max_batch_size": limits.max_batch_size,
        "max_input_len": limits.max_input_len,
        "max_seq_len": limits.max_seq_len,
        "max_num_tokens": max(DEFAULT_MAX_NUM_TOKENS, limits.max_seq_len + max_draft_len),
        "max_beam_width": 1,  # draft-target runs with beam width 1 only
        "gather_context_logits": False,
        "gather_generation_logits": recipe.speculative.use_draft_logits,
        "strongly_typed": True,  # what trtllm-build always passes
        "speculative_decoding_mode": DRAFT_TOKENS_EXTERNAL if is_target else None,
        "max_draft_len": max_draft_len,
        "plugin_config": {"gemm_plugin": facts.dtype, "use_paged_context_fmha": True},
        "logits_dtype": LOGITS_DTYPE,
    }


def make_engine_plan(
    role: str, recipe: Recipe, facts: CheckpointFacts, checkpoint_dir: Path, engine_dir: Path
) -> EnginePlan:
    return EnginePlan(
        role=role,
        checkpoint_dir=Path(checkpoint_dir),
        engine_dir=Path(engine_dir),
        checkpoint=facts,
        build_config=engine_build_config(role, recipe, facts),
    )


def make_build_plan(
    recipe: Recipe, checkpoints: dict[str, tuple[Path, CheckpointFacts]], engine_dirs: dict[str, Path]
) -> BuildPlan:
    """Plans of the recipe's engines (engine_roles). ``checkpoints`` maps role -> (checkpoint dir, its facts).

    The engines' vocab rows may differ only as core.vocab.vocab_pair_problem allows (padding past the tokenizer),
    except where the recipe opts in to a draft with another tokenizer: its ids never reach the target, and whether
    the two tokenizers differ (else the rule holds) is check's to say, which reads them (the plan reads
    checkpoints only, and ``--engines-only`` may run without the Hugging Face folders).
    """
    plans = {
        role: make_engine_plan(role, recipe, checkpoints[role][1], checkpoints[role][0], engine_dirs[role])
        for role in engine_roles(recipe)
    }
    if "draft" not in plans or recipe.speculative.heterogeneous_vocab:
        return BuildPlan(recipe_name=recipe.name, target=plans["target"], draft=plans.get("draft"))
    rows = {
        role: vocab_rows(plan.checkpoint.vocab_size, "tensorrtllm", plan.checkpoint.world_size, "none")
        for role, plan in plans.items()
    }
    problem = vocab_pair_problem(
        rows["target"],
        rows["draft"],
        "tensorrtllm",
        recipe.speculative.use_draft_logits,
        recipe.triton.fast_logits,
    )
    if problem is not None:
        raise RecipeError(recipe.source or "<recipe>", "draft.model", f"checkpoints: {problem}")
    return BuildPlan(recipe_name=recipe.name, target=plans["target"], draft=plans["draft"])


def _flag(name: str, value: Any) -> list[str]:
    return [f"--{name}", str(value)]


def trtllm_build_argv(
    plan: EnginePlan, checkpoint_dir: str | Path | None = None, output_dir: str | Path | None = None
) -> list[str]:
    """``trtllm-build`` argv equivalent to ``plan.build_config`` (flags of TensorRT-LLM 1.2.x build.py)."""
    cfg, plugins = plan.build_config, plan.build_config["plugin_config"]
    argv = ["trtllm-build"]
    argv += _flag("checkpoint_dir", checkpoint_dir or plan.checkpoint_dir)
    argv += _flag("output_dir", output_dir or plan.engine_dir)
    argv += _flag("gemm_plugin", plugins["gemm_plugin"])
    argv += _flag("use_paged_context_fmha", "enable" if plugins["use_paged_context_fmha"] else "disable")
    for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width"):
        if name in cfg:  # an older plan file without max_num_tokens builds with TensorRT-LLM's default
            argv += _flag(name, cfg[name])
    if cfg.get("logits_dtype"):
        argv += _flag("logits_dtype", cfg["logits_dtype"])
    if cfg["gather_generation_logits"]:
        argv.append("--gather_generation_logits")
    if cfg["gather_context_logits"]:  # never set by engine_build_config; rendered only if a caller forces it
        argv.append("--gather_context_logits")
    if cfg["speculative_decoding_mode"]:
        argv += _flag("speculative_decoding_mode", cfg["speculative_decoding_mode"])
        argv += _flag("max_draft_len", cfg["max_draft_len"])
    return argv


def expected_engine(plan: EnginePlan) -> dict[str, Any]:
    """What the built engine's config.json must say (normalised as ``read_engine_config`` returns it).

    TensorRT-LLM's ``build`` adds max_draft_len to max_seq_len when a speculative mode is set, so the target
    engine's max_seq_len may read S + K instead of S; and it lowers max_num_tokens to S x max_batch_size where
    the plan's is larger (check_max_num_tokens, before it adds K), which still holds a whole sequence.
    """
    cfg = plan.build_config
    seq = cfg["max_seq_len"]
    seqs = (seq, seq + cfg["max_draft_len"]) if cfg["speculative_decoding_mode"] else (seq,)
    planned = {}
    if "max_num_tokens" in cfg:
        tokens = cfg["max_num_tokens"]
        planned["max_num_tokens"] = tuple(dict.fromkeys(min(tokens, s * cfg["max_batch_size"]) for s in seqs))
    if cfg.get("logits_dtype"):
        planned["logits_dtype"] = cfg["logits_dtype"]
    return {
        "speculative_decoding_mode": cfg["speculative_decoding_mode"] or "none",
        "max_draft_len": cfg["max_draft_len"],
        "vocab_size": plan.checkpoint.vocab_size,
        "max_batch_size": cfg["max_batch_size"],
        "max_input_len": cfg["max_input_len"],
        "max_seq_len": seqs,
        "gather_generation_logits": cfg["gather_generation_logits"],
        "gather_context_logits": False,
        "use_paged_context_fmha": True,
        "gemm_plugin": cfg["plugin_config"]["gemm_plugin"],
        "tp_size": plan.checkpoint.tp_size,
        "pp_size": plan.checkpoint.pp_size,
        **planned,
    }


def engine_mismatches(plan: EnginePlan, engine: dict[str, Any]) -> list[str]:
    """Differences between a built engine (``read_engine_config`` output) and its plan; empty when it matches."""
    problems = []
    for key, want in expected_engine(plan).items():
        got = engine.get(key)
        ok = got in want if isinstance(want, tuple) else got == want
        if not ok:
            shown = " or ".join(map(str, want)) if isinstance(want, tuple) else want
            problems.append(f"{key} is {got!r}, expected {shown}")
    return problems
