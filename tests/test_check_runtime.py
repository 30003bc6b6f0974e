"""`check`'s runtime check: which TensorRT-LLM each runtime needs (engine path 1.2.x, LLM API >= pinned)."""

from __future__ import annotations

import pytest

from trtspec.builders import support
from trtspec.builders.preflight import check_runtime
from trtspec.core import trtllm
from trtspec.recipe import recipe_from_dict


def recipe(runtime: str, **sections):
    data = {
        "name": "r",
        "target": {"model": "/nonexistent/target"},
        "draft": {"model": "/nonexistent/draft"},
        "triton": {"runtime": runtime},
    }
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return recipe_from_dict(data, check_paths=False)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1.2.1", (1, 2, 1, 10**6)),
        ("1.3.0rc20", (1, 3, 0, 20)),
        ("1.3.0.rc5", (1, 3, 0, 5)),
        ("1.2.0+cu13", (1, 2, 0, 10**6)),
        ("v1.1", (1, 1, 0, 10**6)),
    ],
)
def test_parse_version(text, parsed):
    assert support.parse_version(text) == parsed


def test_release_sorts_after_its_candidates():
    assert (
        support.parse_version("1.3.0rc20")
        < support.parse_version("1.3.0")
        < support.parse_version("1.3.1rc1")
    )
    with pytest.raises(ValueError, match="not a TensorRT-LLM version"):
        support.parse_version("latest")


@pytest.mark.parametrize(
    ("runtime", "version", "status", "fragment"),
    [
        ("tensorrtllm", "1.2.1", "pass", "runs on TensorRT-LLM 1.2.1"),
        ("tensorrtllm", "1.2.0", "pass", "runs on"),
        ("tensorrtllm", "1.1.0", "fail", "outside >=1.2.0, <1.3.0"),
        ("tensorrtllm", "1.3.0rc20", "fail", "outside"),  # engine path still there, but not trtspec's 1.2.x
        ("tensorrtllm", "1.3.0rc21", "fail", "no TensorRT engine path (removed after 1.3.0rc20)"),
        ("tensorrtllm", "1.4.0", "fail", "use triton.runtime: trtllm-pytorch"),
        ("trtllm-pytorch", "1.2.1", "pass", "runs on"),
        ("trtllm-pytorch", "1.1.0", "fail", f"needs >= {support.TRTLLM_PYTORCH_MIN_VERSION}"),
        ("trtllm-pytorch", "1.3.0", "warn", "may name them differently"),
        ("trtllm-pytorch", "nightly", "warn", "cannot tell"),
        ("torch", "0.9.0", "pass", "no TensorRT-LLM"),
    ],
)
def test_runtime_against_versions(runtime, version, status, fragment):
    result = check_runtime(recipe(runtime), version)
    assert result.name == "runtime"
    assert (result.status, fragment in result.message) == (status, True), result.message


def test_without_tensorrt_llm_installed_says_what_is_needed(monkeypatch):
    monkeypatch.setattr("trtspec.builders.environment.installed_trtllm_version", lambda: None)
    engine = check_runtime(recipe("tensorrtllm"))
    assert engine.status == "warn" and "removed after TensorRT-LLM 1.3.0rc20" in engine.message
    assert trtllm.NGC_TRITON_TRTLLM_IMAGE in engine.message
    llmapi = check_runtime(recipe("trtllm-pytorch"))
    assert llmapi.status == "pass" and f">= {support.TRTLLM_PYTORCH_MIN_VERSION}" in llmapi.message


def test_installed_version_is_used_when_none_given(monkeypatch):
    monkeypatch.setattr("trtspec.builders.environment.installed_trtllm_version", lambda: "1.4.0")
    assert check_runtime(recipe("tensorrtllm")).status == "fail"


def test_llmapi_draft_shares_the_target_ranks():
    split = recipe("trtllm-pytorch", target={"tp_size": 2, "gpu_ids": [0, 1]}, draft={"gpu_ids": [2]})
    result = check_runtime(split, "1.2.1")
    assert result.status == "warn" and "runs the draft on the target's ranks" in result.message
    same = recipe("trtllm-pytorch", target={"tp_size": 2}, draft={"tp_size": 2})
    assert check_runtime(same, "1.2.1").status == "pass"
    fast = recipe("trtllm-pytorch", triton={"runtime": "trtllm-pytorch", "fast_logits": True})
    assert "fast_logits applies to the tensorrtllm runtime only" in check_runtime(fast, "1.2.1").message


@pytest.mark.parametrize("fmt", ["fp8", "int4_awq", "w4a8_awq", "int8_sq"])
def test_llmapi_refuses_formats_the_pytorch_backend_cannot_run(fmt):
    result = check_runtime(recipe("trtllm-pytorch", draft={"quantization": fmt}), "1.2.1")
    if fmt == "int8_sq":
        assert result.status == "fail"
        assert result.message.startswith("draft.quantization int8_sq: TensorRT-LLM's PyTorch backend has no")
    else:
        assert result.status == "pass"
    assert check_runtime(recipe("tensorrtllm", draft={"quantization": fmt}), "1.2.1").status == "pass"


ROWS = {"target": 320, "draft": 320}  # engine_vocab_rows of a pair with one vocabulary


def test_fast_logits_is_checked_against_the_draft_logits_it_would_carry():
    from trtspec.builders.preflight import check_fast_logits
    from trtspec.triton_repo.values import orchestrator_values

    assert check_fast_logits(recipe("tensorrtllm")) == []
    assert check_fast_logits(recipe("torch", triton={"runtime": "torch", "fast_logits": True})) == []
    unused = recipe("tensorrtllm", triton={"runtime": "tensorrtllm", "fast_logits": True})
    [result] = check_fast_logits(unused)
    assert result.status == "warn" and "without speculative.use_draft_logits" in result.message
    assert orchestrator_values(unused, "tensorrtllm", ROWS)["draft_ahead"] is True
    used = recipe(
        "tensorrtllm",
        triton={"runtime": "tensorrtllm", "fast_logits": True},
        speculative={"use_draft_logits": True},
    )
    [result] = check_fast_logits(used)
    assert result.status == "pass" and "draft-ahead is off" in result.message
    # A fast-logits answer is a record of where the draft's logits are: it cannot be cut to the next round.
    assert orchestrator_values(used, "tensorrtllm", ROWS)["draft_ahead"] is False
    assert orchestrator_values(used, "torch", ROWS)["draft_ahead"] is True  # real logits there
    assert orchestrator_values(used, "tensorrtllm", ROWS)["fast_logits"] is True
    assert orchestrator_values(unused, "tensorrtllm", ROWS)["fast_logits"] is False  # no draft logits sent


@pytest.mark.parametrize("proposer", ["ngram", "draft+ngram"])
def test_fast_logits_refuses_a_proposer_that_looks_up(proposer):
    # The target reads a request's draft_logits as where to fetch the draft's logits from: a looked-up
    # proposal's point-mass logits would be read as a rank to fetch from.
    from trtspec.builders.preflight import check_fast_logits

    looked_up = recipe(
        "tensorrtllm",
        triton={"runtime": "tensorrtllm", "fast_logits": True},
        speculative={"use_draft_logits": True, "proposer": proposer},
    )
    [result] = check_fast_logits(looked_up)
    assert result.status == "fail"
    assert result.message.startswith(f"triton.fast_logits with speculative.proposer {proposer}: looked-up")


def test_an_fp8_kv_cache_is_checked_for_engines_only():
    from trtspec.builders.preflight import check_kv_cache

    def kv(runtime, quantization):
        draft = {"model": "/nonexistent/draft", "quantization": quantization, "kv_cache_dtype": "fp8"}
        return check_kv_cache(recipe(runtime, draft=draft))

    assert [r.status for r in kv("tensorrtllm", "int4_awq")] == ["fail"]
    # `build` builds engines for the torch runtime too: the same build would fail at its verification
    assert [r.status for r in kv("torch", "int4_awq")] == ["fail"]
    assert kv("tensorrtllm", "w4a8_awq") == kv("tensorrtllm", "fp8") == kv("torch", "fp8") == []
    assert kv("trtllm-pytorch", "int4_awq") == []  # the LLM API has no engine build to turn the FMHA off


def test_adaptive_k_is_checked_for_the_llmapi_runtime_only():
    from trtspec.builders.preflight_llmapi import check_llmapi_adaptive

    assert check_llmapi_adaptive(recipe("torch"), "1.2.1") == []
    assert check_llmapi_adaptive(recipe("tensorrtllm"), "1.2.1") == []
    [acceptance] = check_llmapi_adaptive(recipe("trtllm-pytorch"), "1.2.1")
    assert acceptance.status == "warn"
    assert acceptance.message.startswith(
        "adaptive K by acceptance (speculative.num_draft_tokens unset): TensorRT-LLM 1.2.1 has no per-request K"
    )
    assert (
        "stops drafting for good" in acceptance.message and "0.8 draft tokens per round" in acceptance.message
    )
    assert acceptance.details["acceptance_length_threshold"] == 0.8


def test_a_schedule_says_what_it_is_written_as():
    from trtspec.builders.preflight_llmapi import check_llmapi_adaptive

    scheduled = recipe("trtllm-pytorch", speculative={"max_draft_len": 8, "schedule": {2: 4, 8: 2, 16: 0}})
    _, schedule = check_llmapi_adaptive(scheduled, "1.2.1")
    assert schedule.status == "pass"
    assert schedule.message == (
        "speculative.schedule {2: 4, 8: 2, 16: 0}: written as draft_len_schedule {1: 4, 3: 2, 9: 0} + "
        "max_concurrency 8 (active requests), max_draft_len 4 (the schedule's K at one request); TensorRT-LLM "
        "drafts without its fused draft loop then"
    )
    on_off = recipe("trtllm-pytorch", speculative={"max_draft_len": 4, "schedule": {4: 4, 16: 0}})
    assert check_llmapi_adaptive(on_off, "1.2.1")[1].message.endswith(
        "written as max_concurrency 4 (active requests)"
    )
    one_k = recipe("trtllm-pytorch", speculative={"max_draft_len": 8, "schedule": {8: 4}})
    assert check_llmapi_adaptive(one_k, "1.2.1")[1].message.endswith("one K at every load, max_draft_len 4")


def test_a_pinned_k_and_an_unwritten_schedule():
    from trtspec.builders.preflight_llmapi import check_llmapi_adaptive

    pinned = recipe("trtllm-pytorch", speculative={"num_draft_tokens": 3, "schedule": {4: 2}})
    k, schedule = check_llmapi_adaptive(pinned, "1.2.1")
    assert (k.status, k.details) == ("pass", {"max_draft_len": 3})
    assert schedule.status == "warn" and schedule.message.startswith("speculative.schedule is not written")


def test_a_schedule_that_never_drafts_fails():
    from trtspec.builders.preflight_llmapi import check_llmapi_adaptive

    [result] = check_llmapi_adaptive(
        recipe("trtllm-pytorch", speculative={"schedule": {1: 0, 4: 0}}), "1.2.1"
    )
    assert result.status == "fail" and "drafts nothing even with one request in flight" in result.message


def test_a_later_tensorrt_llm_is_told_the_fields_are_1_2s(monkeypatch):
    from trtspec.builders.preflight_llmapi import check_llmapi_adaptive

    scheduled = recipe("trtllm-pytorch", speculative={"max_draft_len": 4, "schedule": {2: 4, 8: 2}})
    assert [r.status for r in check_llmapi_adaptive(scheduled, "1.2.0")] == ["warn", "pass"]
    *_, later = check_llmapi_adaptive(scheduled, "1.3.0rc8")
    assert later.status == "warn" and later.message.startswith(
        "TensorRT-LLM 1.3.0rc8: trtspec writes 1.2.1's"
    )
    assert "acceptance_rate_threshold" in later.message and "draft_len_schedule" in later.message
    monkeypatch.setattr("trtspec.builders.environment.installed_trtllm_version", lambda: "1.4.0")
    assert check_llmapi_adaptive(scheduled)[-1].message.startswith("TensorRT-LLM 1.4.0")
