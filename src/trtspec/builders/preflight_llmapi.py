"""Pre-flight checks of the trtllm-pytorch runtime: TensorRT-LLM's PyTorch backend behind upstream's LLM-API model.

That runtime loads the Hugging Face checkpoints itself, runs the draft inside the target's executor, has kernels
for some quantization formats only, and takes a recipe's K rules only as speculative_config's fields
(``support.llmapi_speculation``). Each function is pure over the recipe (and a TensorRT-LLM version) and returns
what ``preflight.run_checks`` reports.
"""

from __future__ import annotations

from trtspec.builders import environment, support
from trtspec.core.checks import CheckResult, Status
from trtspec.recipe import Recipe


def llmapi_runtime_problem(recipe: Recipe) -> tuple[Status, str] | None:
    """The first part of ``recipe`` trtllm-pytorch cannot run ("fail") or ignores ("warn"); None: none."""
    if recipe.speculative.proposer == "draft+ngram":
        return (
            "fail",
            f"speculative.proposer draft+ngram: TensorRT-LLM {support.TRTLLM_PYTORCH_VERSION}'s LLM API has no "
            "combined proposer (one speculative_config: DraftTarget or NGram); choose draft or ngram with "
            "trtllm-pytorch, or serve draft+ngram with runtime torch or tensorrtllm",
        )
    for role, spec in recipe.models().items():
        if spec.quantization not in support.LLMAPI_QUANT_FORMATS:
            return (
                "fail",
                f"{role}.quantization {spec.quantization}: TensorRT-LLM's PyTorch backend has no kernels for "
                f"it; use one of {', '.join(support.LLMAPI_QUANT_FORMATS)} with trtllm-pytorch",
            )
    layout = _layout_problem(recipe)
    if layout:
        return "warn", layout + "; the draft's tp/pp/gpu_ids are ignored"
    if recipe.triton.fast_logits:
        return "warn", "triton.fast_logits applies to the tensorrtllm runtime only; ignored"
    return None


def _layout_problem(recipe: Recipe) -> str | None:
    """The LLM API runs the draft inside the target's executor: same parallel mapping, same GPUs."""
    target, draft = recipe.target, recipe.draft
    if draft is None:
        return None
    if (draft.tp_size, draft.pp_size, draft.devices) != (target.tp_size, target.pp_size, target.devices):
        return (
            f"trtllm-pytorch runs the draft on the target's ranks (tp={target.tp_size} pp={target.pp_size} "
            f"GPUs {list(target.devices)}), not draft tp={draft.tp_size} pp={draft.pp_size} GPUs {list(draft.devices)}"
        )
    return None


def check_llmapi_adaptive(recipe: Recipe, trtllm_version: str | None = None) -> list[CheckResult]:
    """trtllm-pytorch: what of the recipe's K rules TensorRT-LLM's LLM API honours, one line per setting (what
    model.yaml gets: support.llmapi_speculation); a warning names a setting the pinned release lacks."""
    if recipe.triton.runtime != "trtllm-pytorch":
        return []
    spec, pinned = recipe.speculative, f"TensorRT-LLM {support.TRTLLM_PYTORCH_VERSION}"
    problem = support.llmapi_speculation_problem(spec)
    if problem:
        return [CheckResult("adaptive K", "fail", problem)]
    rendered = support.llmapi_speculation(spec, recipe.limits.max_batch_size)
    version = trtllm_version or environment.installed_trtllm_version()
    if spec.proposer == "ngram":
        return _ngram_results(spec, rendered, pinned) + _field_version_results(rendered, version)
    details = rendered.fields()
    if spec.num_draft_tokens is not None:
        message = (
            f"speculative.num_draft_tokens {spec.num_draft_tokens}: every request drafts it ({pinned}'s LLM API "
            "takes no per-request K)"
        )
        results = [CheckResult("adaptive K", "pass", message, details)]
        if spec.schedule:
            message = (
                f"speculative.schedule is not written: it caps adaptive requests, and num_draft_tokens "
                f"{spec.num_draft_tokens} pins every request's K"
            )
            results.append(CheckResult("adaptive K", "warn", message, details))
        return results
    message = (
        f"adaptive K by acceptance (speculative.num_draft_tokens unset): {pinned} has no per-request K; written "
        f"as its acceptance gate, which stops drafting for good, for every request, once the last "
        f"{rendered.acceptance_window} finished requests accepted fewer than {rendered.acceptance_length_threshold} "
        f"draft tokens per round on average (K {rendered.max_draft_len} x speculative.draft_cost_ratio "
        f"{spec.draft_cost_ratio}, the break-even); no probing afterwards"
    )
    results = [CheckResult("adaptive K", "warn", message, details)]
    if spec.schedule:
        results.append(CheckResult("adaptive K", "pass", _schedule_message(spec, rendered), details))
    return results + _field_version_results(rendered, version)


def _ngram_results(spec, rendered, pinned: str) -> list[CheckResult]:
    """proposer ngram: what upstream's NGram decoding takes of the recipe (support.llmapi_ngram_fields)."""
    fields = rendered.fields() | support.llmapi_ngram_fields(spec)
    k = (
        f"every request drafts up to {rendered.max_draft_len} looked-up tokens (no per-request K in {pinned}'s "
        "LLM API)"
    )
    message = (
        f"prompt lookup as NGram: max_matching_ngram_size {spec.prompt_lookup_max} (speculative."
        f"prompt_lookup_max), the latest match of the request's own tokens; {k}; no acceptance gate (a lookup "
        "costs no forward)"
    )
    results = [CheckResult("adaptive K", "pass", message, fields)]
    if spec.schedule and spec.num_draft_tokens is None:
        results.append(CheckResult("adaptive K", "pass", _schedule_message(spec, rendered), fields))
    if "prompt_lookup_min" in spec.model_fields_set and spec.prompt_lookup_min > 1:
        message = (
            f"speculative.prompt_lookup_min {spec.prompt_lookup_min}: {pinned}'s NGram matches suffixes down to "
            "one token and has no such setting; ignored under trtllm-pytorch"
        )
        results.append(CheckResult("adaptive K", "warn", message, fields))
    return results


def _schedule_message(spec, rendered) -> str:
    """What speculative.schedule became in speculative_config."""
    upstream = support.upstream_draft_len_schedule(spec.schedule, spec.max_draft_len)
    written = [f"draft_len_schedule {rendered.draft_len_schedule}"] if rendered.draft_len_schedule else []
    if 0 in upstream.values():
        written.append(f"max_concurrency {rendered.max_concurrency}")
    if not written:
        return f"speculative.schedule {spec.schedule}: one K at every load, max_draft_len {rendered.max_draft_len}"
    message = f"speculative.schedule {spec.schedule}: written as {' + '.join(written)} (active requests)"
    if rendered.max_draft_len < spec.max_draft_len:
        message += f", max_draft_len {rendered.max_draft_len} (the schedule's K at one request)"
    if rendered.draft_len_schedule:
        message += "; TensorRT-LLM drafts without its fused draft loop then"
    return message


def _field_version_results(rendered, version: str | None) -> list[CheckResult]:
    """The adaptive-K fields are 1.2.x's; a later release renamed or reread them."""
    try:
        newer = version is not None and support.parse_version(version)[:2] > (1, 2)
    except ValueError:
        newer = False
    if not newer:
        return []
    changed = []
    if rendered.acceptance_window is not None:
        changed.append(
            "acceptance_window/acceptance_length_threshold (renamed in 1.3, a breaking change: "
            "acceptance_rate_window_size/acceptance_rate_threshold, a rate)"
        )
    if rendered.draft_len_schedule is not None:
        changed.append("draft_len_schedule (1.3 reads its keys as 'up to', exclusive of max_concurrency)")
    if not changed:
        return []
    message = (
        f"TensorRT-LLM {version}: trtspec writes {support.TRTLLM_PYTORCH_VERSION}'s {' and '.join(changed)}; "
        f"use {support.NGC_TRITON_TRTLLM_PYTORCH_IMAGE}"
    )
    return [CheckResult("adaptive K", "warn", message)]
