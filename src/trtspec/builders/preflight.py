"""Pre-flight checks of a draft/target pair (``trtspec check``), no GPU needed.

Each check catches, before any build, a failure users otherwise meet at run time (see
shared/reference/trtllm-engine-flow.md, "Known user pain points"). ``model_facts.gather_facts`` is the only I/O
(configs, tokenizers, safetensors headers); every ``check_*`` function here is pure over those facts and returns
CheckResults, which ``run_checks`` gathers into a ``check_report.CheckReport``. The trtllm-pytorch runtime's own
checks are preflight_llmapi's; the tokenizer rule (one shared, or opted in the draft's own) is
core/tokenizers.py's.
"""

from __future__ import annotations

from trtspec.builders import environment, support
from trtspec.builders.check_report import CheckReport, MemoryRow, format_gib, per_gpu_gib
from trtspec.builders.model_facts import ModelFacts, gather_facts
from trtspec.builders.preflight_llmapi import check_llmapi_adaptive, llmapi_runtime_problem
from trtspec.core.checks import CheckResult
from trtspec.core.lookup import uses_lookup
from trtspec.core.tokenizers import check_pair_tokenizers, tokenizer_difference
from trtspec.core.vocab import padded_vocab_size, vocab_pair_problem, vocab_rows
from trtspec.recipe import ModelSpec, Recipe, torch_runtime_dtype

MAX_DRAFT_LEN_WARN = 10
DRAFT_RATIO_WARN = 0.2  # draft/target parameters above this rarely pay for the draft's own cost


# ---------------------------------------------------------------- pure checks


def check_vocab(facts: ModelFacts, spec: ModelSpec) -> CheckResult:
    """The model's embedding rows must cover every tokenizer id; extra rows (padding) are normal."""
    tok_size = len(facts.tokenizer)
    name = f"vocab size ({facts.role})"
    if facts.vocab_size < tok_size:
        return CheckResult(
            name,
            "fail",
            f"model vocab_size {facts.vocab_size} < tokenizer size {tok_size}: ids >= {facts.vocab_size} would "
            "index past the embedding; use the tokenizer that belongs to this checkpoint",
        )
    from trtspec.core.model_dir import end_ids

    outside = [i for i in end_ids(facts.path, facts.tokenizer) if not 0 <= i < facts.vocab_size]
    if outside:
        return CheckResult(
            name,
            "fail",
            f"end id {outside[0]} (eos_token_id of generation_config.json or config.json) is not one of the model's "
            f"{facts.vocab_size} token ids, so no output would end; fix eos_token_id",
        )
    padded = padded_vocab_size(facts.vocab_size, spec.tp_size, spec.quantization)
    note = f"model {facts.vocab_size} >= tokenizer {tok_size}; engine lm_head rows {padded}"
    return CheckResult(
        name, "pass", note, {"model": facts.vocab_size, "tokenizer": tok_size, "padded": padded}
    )


def check_padded_vocab(
    target: ModelFacts, draft: ModelFacts, recipe: Recipe, own_tokenizer: bool = False
) -> CheckResult:
    """The pair's vocab rows under the recipe's runtime: equal, or rows past the shared tokenizer that differ
    (padding, as in Qwen2.5), which every runtime but the ones core.vocab.vocab_pair_problem names can serve.
    ``own_tokenizer``: the draft's tokenizer is another than the target's, so rows of the two mean different
    texts: opted in, no draft id reaches the target; else the tokenizer check fails the pair."""
    runtime, spec = recipe.triton.runtime, recipe.speculative
    t_rows = vocab_rows(target.vocab_size, runtime, recipe.target.world_size, recipe.target.quantization)
    d_rows = vocab_rows(draft.vocab_size, runtime, recipe.draft.world_size, recipe.draft.quantization)
    details = {"target": t_rows, "draft": d_rows, "tokenizer": len(target.tokenizer)}
    if own_tokenizer:
        why = (
            "so its ids never reach the target (its text does)"
            if spec.heterogeneous_vocab
            else "so the rows are not compared (see the tokenizer check)"
        )
        message = f"target {t_rows} vocab rows, draft {d_rows}: the draft has its own tokenizer, {why}"
        return CheckResult("padded vocab", "pass", message, details)
    problem = vocab_pair_problem(t_rows, d_rows, runtime, spec.use_draft_logits, recipe.triton.fast_logits)
    if problem is not None:
        return CheckResult("padded vocab", "fail", problem, details)
    if t_rows == d_rows:
        return CheckResult("padded vocab", "pass", f"target and draft both have {t_rows} vocab rows", details)
    tokens = len(target.tokenizer)
    message = (
        f"target {t_rows} vocab rows, draft {d_rows}; the tokenizer has {tokens} ids, so target rows "
        f"{tokens}-{t_rows - 1}{f' and draft rows {tokens}-{d_rows - 1}' if d_rows > tokens else ''} are padding "
        "no text produces; draft tokens pass by id"
    )
    if spec.use_draft_logits and runtime != "trtllm-pytorch":
        message += f", the draft's logits are padded with -inf to the target's {t_rows} rows"
    return CheckResult("padded vocab", "pass", message, details)


def _family_config(facts: ModelFacts) -> dict:
    """The (text) config with the model class, as the family rules (support.py) read a config.json."""
    return {**facts.config, "architectures": [facts.architecture]}


def check_architecture(facts: ModelFacts, runtime: str, max_seq_len: int = 0) -> CheckResult:
    """Whether the stages ``runtime`` goes through take this model family (support.py's table); a failure names
    the stage and why. The torch runtime serves any causal LM, so there a convert problem only warns."""
    name = f"architecture ({facts.role})"
    hf_config = _family_config(facts)
    problem = support.convert_problem(hf_config)
    if problem is None and runtime != "trtllm-pytorch":  # every runtime but that one gets engines built
        problem = support.engine_window_problem(hf_config, max_seq_len)
    if problem is None:
        return CheckResult(
            name,
            "pass",
            f"{facts.architecture} -> decoder {support.SUPPORTED_ARCHITECTURES[facts.architecture]}",
        )
    if runtime == "torch":
        return CheckResult(name, "warn", problem + "; the torch runtime serves it through the HF forward")
    if (
        runtime == "trtllm-pytorch"
        and facts.architecture
        and facts.architecture not in support.SUPPORTED_ARCHITECTURES
    ):
        # That runtime never converts; which families its PyTorch backend serves was not run here.
        supported = ", ".join(sorted(support.SUPPORTED_ARCHITECTURES))
        problem = f"trtllm-pytorch: trtspec supports {supported} there; {facts.architecture} is untested"
    return CheckResult(name, "fail", problem)


SPLIT_CHECK = "layer split ({role})"


def check_split(facts: ModelFacts, spec: ModelSpec, runtime: str) -> CheckResult:
    """Whether the model's layer sizes take its quantization's kernels and its tp/pp split (support.split_problem):
    build refuses them at that model's stage, after the stages before it ran (a target's calibration before a
    draft's refusal). The torch runtime serves the HF model unsplit, so there it only warns."""
    name = SPLIT_CHECK.format(role=facts.role)
    # a family the conversion path does not take has its sizes read by no stage: the architecture check says why
    if support.convert_problem(_family_config(facts)) is not None:
        return CheckResult(name, "pass", "the architecture check covers this family")
    problem = support.split_problem(spec, facts.config)
    if problem is None:
        split = f"tp_size={spec.tp_size}, pp_size={spec.pp_size}"
        return CheckResult(name, "pass", f"{spec.quantization}, {split}: the layer sizes fit")
    where = f"{facts.role}: {problem}"
    if runtime == "torch":
        return CheckResult(name, "warn", where + "; the torch runtime serves the HF model unsplit")
    return CheckResult(name, "fail", where)


def check_weights(facts: ModelFacts, spec: ModelSpec, runtime: str) -> CheckResult:
    """The checkpoint holds exactly the tensors its config.json builds: transformers would fill a missing one with
    random values and drop an unexpected one, so a draft would silently accept nothing and a target emit garbage.
    A quantized model for trtllm-pytorch has safetensors weights (its HF export's check reads them)."""
    name = f"{facts.role} weights"
    if facts.weights_problem:
        return CheckResult(name, "fail", facts.weights_problem)
    if runtime == "trtllm-pytorch" and spec.quantization != "none" and not facts.safetensors:
        return CheckResult(name, "fail", f"{facts.path}: {support.SAFETENSORS_NEEDED}")
    return CheckResult(
        name, "pass", "the checkpoint holds every tensor of its config.json's model, and no other"
    )


def check_precision(recipe: Recipe) -> CheckResult:
    precisions = {
        role: support.effective_precision(m.dtype, m.quantization) for role, m in recipe.models().items()
    }
    outside = {role: p for role, p in precisions.items() if p not in support.DTM_SUPPORTED_PRECISIONS}
    summary = ", ".join(f"{role} {p}" for role, p in precisions.items())
    if not outside:
        return CheckResult(
            "precision", "pass", f"{summary}: inside the draft-target support matrix (fp16/bf16/fp8)"
        )
    bad = ", ".join(f"{role} {p}" for role, p in outside.items())
    message = f"{bad} is outside TensorRT-LLM's draft-target support matrix (fp16, bf16, fp8)"
    if recipe.speculative.allow_unsupported_precision:
        return CheckResult("precision", "warn", message + "; allowed by allow_unsupported_precision")
    return CheckResult(
        "precision",
        "fail",
        # build reads the recipe field; only check has the option
        message
        + "; choose float16/bfloat16/fp8, or set speculative.allow_unsupported_precision: true (check: "
        "--allow-unsupported-precision)",
    )


def check_limits(recipe: Recipe, target: ModelFacts, draft: ModelFacts | None) -> list[CheckResult]:
    """max_draft_len, max_seq_len against the models' positions, and room for K draft tokens (``draft`` None:
    prompt lookup alone, the target's limits only)."""
    lim, k = recipe.limits, recipe.speculative.max_draft_len
    results = []
    if k > MAX_DRAFT_LEN_WARN:
        results.append(
            CheckResult(
                "max_draft_len",
                "warn",
                f"{k} > {MAX_DRAFT_LEN_WARN}: acceptance of late draft positions is usually low",
            )
        )
    else:
        results.append(CheckResult("max_draft_len", "pass", f"{k}"))
    too_long = [
        f
        for f in (target, draft)
        if f is not None and f.max_position_embeddings and lim.max_seq_len > f.max_position_embeddings
    ]
    if too_long:
        names = ", ".join(f"{f.role} {f.max_position_embeddings}" for f in too_long)
        results.append(
            CheckResult(
                "max_seq_len",
                "fail",
                f"limits.max_seq_len {lim.max_seq_len} exceeds max_position_embeddings of {names}; lower limits.max_seq_len",
            )
        )
    else:
        results.append(
            CheckResult(
                "max_seq_len",
                "pass",
                f"{lim.max_seq_len} <= max_position_embeddings of {'both models' if draft else 'the target'}",
            )
        )
    if lim.max_input_len + k + 1 > lim.max_seq_len:
        results.append(
            CheckResult(
                "draft fits",
                "fail",
                f"max_input_len {lim.max_input_len} + max_draft_len {k} + 1 bonus token > max_seq_len {lim.max_seq_len}; "
                "raise limits.max_seq_len or lower limits.max_input_len",
            )
        )
    else:
        results.append(
            CheckResult(
                "draft fits", "pass", f"input {lim.max_input_len} + {k} draft + 1 <= {lim.max_seq_len}"
            )
        )
    return results


def check_draft_size(target: ModelFacts, draft: ModelFacts) -> CheckResult:
    ratio = draft.num_parameters / max(target.num_parameters, 1)
    msg = f"draft {draft.num_parameters / 1e6:.1f}M / target {target.num_parameters / 1e6:.1f}M parameters = {ratio:.2f}"
    if ratio > DRAFT_RATIO_WARN:
        return CheckResult(
            "draft size", "warn", f"{msg}: a draft this large rarely pays for itself; pick a smaller draft"
        )
    return CheckResult("draft size", "pass", msg, {"ratio": ratio})


def estimate_memory(facts: ModelFacts, spec: ModelSpec, recipe: Recipe) -> MemoryRow:
    """Weights at the model's precision + KV cache for max_batch_size x max_seq_len, per rank (tp x pp split)."""
    precision = support.effective_precision(spec.dtype, spec.quantization)
    weights = facts.num_parameters * support.WEIGHT_BYTES[precision] / spec.world_size
    kv_dtype = (
        "fp8"
        if spec.kv_cache_dtype == "fp8"
        else ("float16" if precision not in support.KV_BYTES else precision)
    )
    kv_per_token = (
        2 * facts.num_hidden_layers * facts.num_key_value_heads * facts.head_dim * support.KV_BYTES[kv_dtype]
    )
    tokens = recipe.limits.max_batch_size * recipe.limits.max_seq_len
    kv = kv_per_token * tokens / spec.world_size
    cc = support.MIN_COMPUTE_CAPABILITY[precision]
    return MemoryRow(facts.role, precision, spec.devices, weights / 2**30, kv / 2**30, f"{cc[0]}.{cc[1]}")


def check_serving_memory(report_memory: list[MemoryRow], gpu_memory_gib: float | None) -> CheckResult:
    """The estimated serving footprint of the busiest GPU (weights + KV cache of every rank placed on it) against
    ``gpu_memory_gib`` (None: unknown, the estimate is only reported)."""
    worst_gpu, worst = max(per_gpu_gib(report_memory).items(), key=lambda kv: kv[1])
    msg = f"peak estimate {format_gib(worst)} on GPU {worst_gpu} (weights + KV cache; activations and workspace extra)"
    if gpu_memory_gib is not None and worst > gpu_memory_gib:
        return CheckResult(
            "memory", "fail", f"{msg} > {gpu_memory_gib} GiB available; lower limits or quantize"
        )
    return CheckResult("memory", "pass", msg)


def check_runtime(recipe: Recipe, trtllm_version: str | None = None) -> CheckResult:
    """Whether ``triton.runtime`` can run with TensorRT-LLM ``trtllm_version`` (None: the installed one, if any)."""
    runtime = recipe.triton.runtime
    version = trtllm_version or environment.installed_trtllm_version()
    needs = support.RUNTIME_NEEDS[runtime]
    details = {"runtime": runtime, "trtllm_version": version, "needs": needs}
    if runtime == "torch":
        return CheckResult("runtime", "pass", f"torch: {needs}", details)
    llmapi = llmapi_runtime_problem(recipe) if runtime == "trtllm-pytorch" else None
    if llmapi:
        return CheckResult("runtime", *llmapi, details)
    if version is None:
        status = "warn" if runtime == "tensorrtllm" else "pass"
        tail = (
            f" (the TensorRT engine path was removed after TensorRT-LLM {support.TRTLLM_LAST_ENGINE_RELEASE})"
            if runtime == "tensorrtllm"
            else ""
        )
        return CheckResult("runtime", status, f"{runtime} needs {needs}{tail}; none installed here", details)
    try:
        problem = support.runtime_version_problem(runtime, version)
    except ValueError as err:
        return CheckResult("runtime", "warn", f"{err}; cannot tell whether {runtime} runs", details)
    if problem:
        return CheckResult("runtime", problem[0], problem[1], details)
    return CheckResult("runtime", "pass", f"{runtime} runs on TensorRT-LLM {version}", details)


def check_nodes(recipe: Recipe) -> list[CheckResult]:
    """A Kubernetes replica that would span nodes (kubernetes.gpus_per_node), which TensorRT-LLM 1.2.x's launch
    cannot: said up front, as ``deploy --k8s`` refuses it. GPUs: the target's, and the draft's on tensorrtllm."""
    runtime = recipe.triton.runtime
    if runtime == "torch":
        return []
    gpus = len(recipe.engine_gpus(runtime))
    problem = support.multi_node_problem(runtime, gpus, recipe.kubernetes.gpus_per_node)
    if problem is None:
        return []
    field, why = problem
    return [CheckResult("nodes", "warn", f"{field}: {why}")]


def check_fast_logits(recipe: Recipe, runtime: str | None = None) -> list[CheckResult]:
    """triton.fast_logits on the tensorrtllm runtime (``runtime``: deploy's, else the recipe's): useful only with
    draft logits to pass on."""
    if not recipe.triton.fast_logits or (runtime or recipe.triton.runtime) != "tensorrtllm":
        return []
    if not recipe.speculative.use_draft_logits:
        message = (
            "triton.fast_logits without speculative.use_draft_logits: no draft logits are passed on, yet the "
            "deployment still needs the MPI orchestrator layout; set speculative.use_draft_logits: true or "
            "triton.fast_logits: false"
        )
        return [CheckResult("fast logits", "warn", message)]
    if uses_lookup(recipe.speculative.proposer):
        message = (
            f"triton.fast_logits with speculative.proposer {recipe.speculative.proposer}: looked-up proposals have "
            "no draft logits to pass from rank to rank; set speculative.proposer: draft or triton.fast_logits: false"
        )
        return [CheckResult("fast logits", "fail", message)]
    message = "draft logits go from rank to rank"
    if recipe.triton.draft_ahead and not recipe.draft_ahead_for("tensorrtllm"):
        message += "; draft-ahead is off (a fast-logits answer cannot be cut to the next round)"
    return [CheckResult("fast logits", "pass", message)]


def check_instances(recipe: Recipe) -> list[CheckResult]:
    """triton.instances.orchestrator counts the tensorrtllm runtime's orchestrator instances; the torch runtime's
    entry model is one loop that batches every request, and trtllm-pytorch's is upstream's single model."""
    count, runtime = recipe.triton.instances.orchestrator, recipe.triton.runtime
    if count == 1 or runtime == "tensorrtllm":
        return []
    message = (
        f"triton.instances.orchestrator {count}: the {runtime} runtime serves with one instance (its entry model "
        "batches every request itself); the count applies to the tensorrtllm runtime only"
    )
    return [CheckResult("instances", "warn", message)]


def check_kv_cache(recipe: Recipe) -> list[CheckResult]:
    """An fp8 KV cache in an engine keeps the paged context FMHA only beside some formats: checked wherever `build`
    builds engines (every runtime but trtllm-pytorch), else the build fails only at its verification, after it."""
    if recipe.triton.runtime == "trtllm-pytorch":
        return []
    for role, spec in recipe.models().items():
        if (
            spec.kv_cache_dtype == "fp8"
            and spec.quantization not in support.FP8_KV_CACHE_ENGINE_QUANTIZATIONS
        ):
            formats = " or ".join(support.FP8_KV_CACHE_ENGINE_QUANTIZATIONS)
            message = (
                f"{role}.kv_cache_dtype fp8 beside quantization {spec.quantization}: TensorRT-LLM's build turns the "
                f"paged context FMHA (which KV-cache reuse needs) off; use {formats}, or kv_cache_dtype: auto"
            )
            return [CheckResult("kv cache", "fail", message)]
    return []


def check_conversion(recipe: Recipe, versions: dict[str, str | None] | None = None) -> list[CheckResult]:
    """Whether ``versions`` (default: the installed packages) run the ModelOpt conversion ``build`` does for this
    recipe. A warning, like a missing TensorRT-LLM: the conversion may run elsewhere (the NGC image)."""
    if recipe.triton.runtime == "torch" or not environment.conversion_roles(recipe):
        return []  # the torch runtime and unquantized trtllm-pytorch models load the HF checkpoints themselves
    versions = environment.package_versions() if versions is None else versions
    problem = support.conversion_stack_problem(versions)
    if problem:
        return [CheckResult("conversion", "warn", problem)]
    found = ", ".join(f"{package} {versions[package]}" for package in support.CONVERSION_STACK)
    return [CheckResult("conversion", "pass", f"ModelOpt conversion on {found}")]


def check_cpu_dtype(recipe: Recipe, bf16_units: tuple[str, ...] | None) -> list[CheckResult]:
    """The dtype the torch runtime runs on CPU, beside whether this CPU multiplies bfloat16 natively (``bf16_units``:
    environment.cpu_bf16_units), so a user can tell whether triton.torch_dtype bfloat16 would pay here."""
    triton = recipe.triton
    if triton.runtime != "torch" or triton.device != "cpu":
        return []
    dtype = torch_runtime_dtype(triton, recipe.target)
    if bf16_units is None:
        units = "bf16 matrix units unknown (no /proc/cpuinfo)"
    elif bf16_units:
        units = f"this CPU has bf16 matrix units ({', '.join(bf16_units)})"
    else:
        units = f"this CPU has no bf16 matrix units (no {' or '.join(environment.BF16_MATRIX_FLAGS)})"
    message = f"the torch runtime runs {dtype} on this CPU (triton.torch_dtype {triton.torch_dtype}); {units}"
    return [CheckResult("cpu dtype", "pass", message, {"dtype": dtype, "bf16_units": bf16_units})]


# What concerns TensorRT-LLM engines only (its draft-target support matrix, GPU memory, the installed
# TensorRT-LLM, the tensorrtllm runtime's options, the checkpoints' quantization and split): the torch runtime
# loads the Hugging Face checkpoints itself, in any dtype, on CPU too.
ENGINE_ONLY_CHECKS = (
    "precision",
    "memory",
    "runtime",
    "fast logits",
    "kv cache",
    *(SPLIT_CHECK.format(role=role) for role in ("target", "draft")),
)


def check_proposer(recipe: Recipe) -> CheckResult:
    """Who proposes draft tokens (core/lookup.py): the draft model, prompt lookup, or both per row and round."""
    spec = recipe.speculative
    lookup = f"prompt lookup of {spec.prompt_lookup_max}..{spec.prompt_lookup_min}-token suffixes"
    message = {
        "draft": "the draft model",
        "ngram": f"{lookup} alone; no draft model (the target verifies looked-up tokens)",
        "draft+ngram": f"per row and round, the draft model or {lookup}, whichever is expected to pay more",
    }[spec.proposer]
    return CheckResult("proposer", "pass", f"{spec.proposer}: {message}", {"proposer": spec.proposer})


def _pair_checks(recipe: Recipe, target: ModelFacts, draft: ModelFacts) -> list[CheckResult]:
    """What only a pair has: one tokenizer (or, opted in, the draft's own), vocab rows that fit together, the
    draft's own model checks."""
    runtime, max_seq_len, spec = recipe.triton.runtime, recipe.limits.max_seq_len, recipe.speculative
    own_tokenizer = tokenizer_difference(target.tokenizer, draft.tokenizer) is not None
    tokenizer = check_pair_tokenizers(
        target.tokenizer,
        draft.tokenizer,
        heterogeneous_vocab=spec.heterogeneous_vocab,
        runtime=runtime,
        use_draft_logits=spec.use_draft_logits,
    )
    return [
        tokenizer,
        check_vocab(draft, recipe.draft),
        check_padded_vocab(target, draft, recipe, own_tokenizer),
        check_architecture(draft, runtime, max_seq_len),
        check_split(draft, recipe.draft, runtime),
        check_weights(draft, recipe.draft, runtime),
        check_draft_size(target, draft),
    ]


def run_checks(
    recipe: Recipe, gpu_memory_gib: float | None = None, trtllm_version: str | None = None
) -> CheckReport:
    """All pre-flight checks of a recipe; raises ModelError only for unreadable inputs.

    ``trtllm_version`` is the TensorRT-LLM the deployment will run (default: the installed one, if any). A recipe
    without a draft (prompt lookup alone) has the target's checks only.
    """
    target = gather_facts("target", recipe.target)
    draft = gather_facts("draft", recipe.draft) if recipe.draft is not None else None
    memory = [estimate_memory(target, recipe.target, recipe)]
    if draft is not None:
        memory.append(estimate_memory(draft, recipe.draft, recipe))
    results = [
        check_proposer(recipe),
        check_vocab(target, recipe.target),
        check_architecture(target, recipe.triton.runtime, recipe.limits.max_seq_len),
        check_split(target, recipe.target, recipe.triton.runtime),
        check_weights(target, recipe.target, recipe.triton.runtime),
        *(_pair_checks(recipe, target, draft) if draft is not None else []),
        check_precision(recipe),
        *check_limits(recipe, target, draft),
        check_serving_memory(memory, gpu_memory_gib),
        check_runtime(recipe, trtllm_version),
        *check_llmapi_adaptive(recipe, trtllm_version),
        *check_fast_logits(recipe),
        *check_instances(recipe),
        *check_nodes(recipe),
        *check_kv_cache(recipe),
        *check_conversion(recipe),
        *check_cpu_dtype(recipe, environment.cpu_bf16_units()),
    ]
    return CheckReport(recipe.name, results, memory)
