"""Pure core of validate: comparisons, prompt sets, thresholds and reports (no models)."""

from __future__ import annotations

import json

import pytest

from trtspec.core.metrics import AcceptanceStats
from trtspec.core.token_rules import comparable_pair
from trtspec.outputs import write_file_atomic
from trtspec.validate.compare import compare, first_divergence, token_agreement
from trtspec.validate.prompts import DEFAULT_PROMPTS, Prompt, PromptSetError, load_prompts
from trtspec.validate.report import validation_markdown, validation_to_dict
from trtspec.validate.systems import Generation, Request
from trtspec.validate.validation import Thresholds, ValidationResult, compare_outputs


@pytest.mark.parametrize(
    ("reference", "candidate", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [7, 2, 3], 0),
        ([1, 2, 3], [1, 2], 2),  # candidate stops early
        ([1, 2], [1, 2, 3, 4], 2),  # candidate runs on
        ([], [], None),
        ([], [5], 0),
    ],
)
def test_first_divergence(reference, candidate, expected):
    assert first_divergence(reference, candidate) == expected


@pytest.mark.parametrize(
    ("reference", "candidate", "expected"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
        ([1, 2, 3, 4], [1, 9, 3, 4], 0.75),
        ([1, 2, 3, 4], [1, 2], 0.5),
        ([1, 2], [1, 2, 3, 4], 0.5),
        ([], [], 1.0),
        ([1], [], 0.0),
    ],
)
def test_token_agreement(reference, candidate, expected):
    assert token_agreement(reference, candidate) == expected


def test_compare_and_comparable_pair():
    assert comparable_pair([5, 6, 2], [5, 6, 2], {2}) == ([5, 6], [5, 6])
    assert comparable_pair([5, 6], [5, 6], {2}) == ([5, 6], [5, 6])
    c = compare([1, 2, 3], [1, 2, 4])
    assert (c.exact_match, c.first_divergence, c.reference_len, c.candidate_len) == (False, 2, 3, 3)
    assert compare([1], [1]).exact_match


def _gen(ids, accepted=0, drafted=0, rounds=0, from_text=False):
    stats = AcceptanceStats(
        max_draft_len=4, drafted=drafted, accepted=accepted, rounds=rounds, generated_tokens=len(ids)
    )
    return Generation(
        token_ids=ids,
        text="t",
        stats=stats,
        elapsed_s=0.5,
        time_to_first_token_s=0.1,
        chunks=[(0.5, len(ids))],
        ids_from_text=from_text,
    )


def _result(spec_ids, base_ids, ref_ids, thresholds=None, stats=(6, 8, 2)):
    prompts = [Prompt(f"p{i}", f"text {i}") for i in range(len(ref_ids))]
    accepted, drafted, rounds = stats
    spec = [_gen(ids, accepted, drafted, rounds) for ids in spec_ids]
    base = [_gen(ids) for ids in base_ids]
    outcomes = compare_outputs(prompts, ref_ids, spec, base, stop_token_ids={2})
    return ValidationResult("planted", 4, 8, outcomes, 1.0, 2.0, thresholds or Thresholds())


def test_planted_mismatch_is_caught_with_its_position():
    # Prompt 1's speculative output alters token 3; its EOS (2) is kept (in-process) or left out (Triton).
    ref = [[10, 11, 12, 13, 2], [20, 21, 22, 23, 24]]
    spec = [[10, 11, 12, 13, 2], [20, 21, 22, 77, 24]]
    base = [[10, 11, 12, 13], [20, 21, 22, 23, 24]]
    result = _result(spec, base, ref, Thresholds(min_exact_match=1.0))
    first, second = result.outcomes
    assert first.vs_reference.exact_match and first.control.exact_match
    assert second.vs_reference.first_divergence == 3 and second.control.first_divergence == 3
    assert second.vs_reference.token_agreement == 0.8
    assert result.exact_match_rate == 0.5 and result.control_match_rate == 0.5
    failures = result.failures()
    assert any("--min-exact-match" in f for f in failures)
    assert any("--min-control-match" in f for f in failures)


def test_a_system_that_runs_past_its_stop_id_does_not_match():
    ref = [[10, 11, 2]]
    result = _result([[10, 11, 2, 99]], [[10, 11]], ref, Thresholds(min_exact_match=1.0))
    (outcome,) = result.outcomes
    assert not outcome.vs_reference.exact_match and outcome.vs_reference.first_divergence == 2
    assert not outcome.control.exact_match


def test_nothing_drafted_has_no_acceptance_rate_and_fails_a_minimum_saying_so():
    """Prompt lookup that never matched drafts nothing: acceptance (accepted / drafted) is undefined there, so the
    report shows "-" and a --min-acceptance floor above 0 fails saying why; a floor of 0 asks for nothing."""
    ids = [[10, 11, 12]]
    result = _result(ids, ids, ids, Thresholds(min_acceptance=0.5), stats=(0, 0, 0))
    assert result.failures() == [
        "no draft tokens were reported, so acceptance is undefined and --min-acceptance 0.500 cannot be met"
    ]
    assert _result(ids, ids, ids, Thresholds(min_acceptance=0.0), stats=(0, 0, 0)).failures() == []
    data = validation_to_dict(result)
    assert data["overall"]["acceptance_rate"] is None and data["prompts"][0]["acceptance_rate"] is None
    assert data["stats"]["acceptance_rate"] is None  # the same figure wherever the document carries it
    assert "| acceptance rate | - |" in validation_markdown(result)
    drafted = _result(ids, ids, ids, Thresholds(min_acceptance=0.5), stats=(3, 8, 2))
    assert drafted.failures() == ["acceptance rate 0.375 < --min-acceptance 0.500"]
    assert validation_to_dict(drafted)["overall"]["acceptance_rate"] == 0.375


def test_a_system_that_disagrees_from_the_first_token_on_every_prompt_is_named_as_another_model():
    """The control gate passes on a server of another model (its own speculative and target-only runs agree);
    the exact match against the reference is report-only, so a note says what it most likely means."""
    from trtspec.validate.validation import other_model_note

    ref = [[10, 11, 12], [20, 21, 22]]
    other = _result([[5, 6, 7], [8, 9, 1]], [[5, 6, 7], [8, 9, 1]], ref)
    assert other.failures() == []
    assert "probably serving another model than this recipe's target" in other_model_note(other.outcomes, "t")
    late = _result([[10, 6, 7], [8, 9, 1]], [[10, 6, 7], [8, 9, 1]], ref)  # one agrees at first: a precision
    assert other_model_note(late.outcomes, "t") is None
    assert other_model_note(other.outcomes[:1], "t") is None  # one prompt says too little


def test_thresholds_pass_and_acceptance_gate():
    ref = [[1, 3, 4]]
    ok = _result([[1, 3, 4]], [[1, 3, 4]], ref, Thresholds(min_exact_match=1.0, min_acceptance=0.7))
    assert ok.stats.acceptance_rate == 0.75 and ok.failures() == []
    low = _result([[1, 3, 4]], [[1, 3, 4]], ref, Thresholds(min_acceptance=0.8))
    assert low.failures() == ["acceptance rate 0.750 < --min-acceptance 0.800"]
    report_only = _result([[9]], [[9]], ref, Thresholds(min_control_match=None))
    assert report_only.failures() == []


def test_text_only_system_maps_reference_through_text():
    prompts = [Prompt("p0", "x")]
    spec = [_gen([7, 8], from_text=True)]
    outcomes = compare_outputs(
        prompts, [[1, 2]], spec, spec, {99}, to_text_domain=lambda ids: [i + 6 for i in ids]
    )
    assert outcomes[0].reference == [7, 8] and outcomes[0].vs_reference.exact_match


def test_reports_are_well_formed(tmp_path, monkeypatch):
    monkeypatch.setattr("trtspec.validate.systems.MIN_TIMED_TOKENS", 1)  # a rate from these few tokens
    result = _result(
        [[1, 2], [5, 6, 7]], [[1, 2], [5, 6, 7]], [[1, 2], [5, 6, 8]], Thresholds(min_exact_match=0.9)
    )
    data = json.loads(json.dumps(validation_to_dict(result)))
    assert data["overall"]["exact_match_rate"] == 0.5 and data["passed"] is False
    assert data["prompts"][1]["vs_reference"]["first_divergence"] == 2
    assert data["overall"]["speedup"] == pytest.approx(2.0 * 5 / 5)
    markdown = validation_markdown(result)
    tables = [line for line in markdown.splitlines() if line.startswith("|")]
    widths = {line.count("|") - line.count("\\|") for line in tables}
    assert len(widths) == 2  # two tables (overall: 3 bars, per prompt: 9 bars), every row complete
    assert "| p1 | NO | 2 |" in markdown and "FAIL" in markdown
    path = write_file_atomic(tmp_path / "sub" / "report.md", markdown)
    assert path.read_text() == markdown and [p.name for p in path.parent.iterdir()] == ["report.md"]


def test_default_prompt_set_has_code_and_prose_then_chat():
    prompts = load_prompts()
    raw = [p for p in prompts if p.prompt_set == "raw"]
    assert {p.category for p in raw} == {"code", "prose"} and len(raw) >= 8
    assert prompts[: len(raw)] == raw and {p.category for p in prompts[len(raw) :]} == {"chat"}
    assert load_prompts(chat_set=False) == raw
    assert DEFAULT_PROMPTS.suffix == ".jsonl"
    assert len(load_prompts(limit=3)) == 3


def test_user_prompt_file_and_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(
        '{"prompt": "def f():"}\n\n# comment\n{"text": "Hello", "id": "h", "category": "prose"}\n'
    )
    assert load_prompts(good) == [Prompt("p0", "def f():"), Prompt("h", "Hello", "prose")]
    cases = {
        "{not json\n": "p.jsonl:1: not valid JSON",
        '{"prompt": ""}\n': 'field "prompt" must be a non-empty string',
        "[1, 2]\n": "expected a JSON object",
        '{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n': "prompt id 'x' appears more than once",
        "\n": "no prompts",
    }
    for text, message in cases.items():
        good.write_text(text)
        with pytest.raises(PromptSetError, match=message):
            load_prompts(good)
    with pytest.raises(
        PromptSetError, match=r"missing.jsonl: no such prompt file, nor a shipped set \(raw\|"
    ):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(PromptSetError, match="cannot read"):
        load_prompts(tmp_path)  # a folder


def test_common_prefix_len():
    from trtspec.core.sequences import common_prefix_len

    assert common_prefix_len([5, 6, 7], [5, 6, 9, 1]) == 2
    assert common_prefix_len([5, 6, 7], [5, 6, 7, 8]) == 3
    assert common_prefix_len([5], [4]) == 0
    assert common_prefix_len([], [1]) == 0


def test_endpoint_response_collects_output_ids_per_piece():
    import numpy as np

    from trtspec.validate.triton_client import EndpointResponse

    text_only = EndpointResponse(pieces=[(0.1, "ab")])
    assert text_only.token_ids is None and text_only.id_pieces is None
    response = EndpointResponse()
    response.add_ids(0.1, np.array([[5, 6]], dtype=np.int32))
    response.add_ids(0.2, np.zeros((1, 0), dtype=np.int32))  # an empty final response
    response.add_ids(0.3, [7])
    response.add_ids(0.35, 8)  # HTTP's JSON gives a one-element tensor as a bare number
    response.add_ids(0.4, None)
    assert response.token_ids == [5, 6, 7, 8]
    assert response.id_pieces == [(0.1, [5, 6]), (0.3, [7]), (0.35, [8])]


def test_a_triton_system_is_adaptive_where_the_entry_model_says_so(monkeypatch):
    """bench measures adaptive K over Triton when a request without K gets it: the entry model's num_draft_tokens
    parameter is "adaptive" (deploy writes that unless the recipe pins a K). A config the server will not give
    leaves it unknown (None), not "not adaptive"."""
    from trtspec.validate.triton_client import TritonClient
    from trtspec.validate.triton_system import TritonSystem

    monkeypatch.setattr(TritonClient, "check_ready", lambda self: None)
    monkeypatch.setattr(TritonClient, "resolve", lambda self: None)
    for value, adaptive in (("adaptive", True), ("4", False), (None, None)):
        config = {
            "parameters": {"num_draft_tokens": {"string_value": value}, "k_schedule": {"string_value": ""}}
        }
        monkeypatch.setattr(TritonClient, "_model_config", lambda self, model, c=config, v=value: v and c)
        system = TritonSystem("127.0.0.1:1", tokenizer=None, model="tensorrt_llm_bls")
        assert system.adaptive is adaptive and system.fixed_k is None, value


def test_the_near_tie_bound_is_the_larger_of_the_reference_and_the_system_dtype():
    from trtspec.validate.compare import Divergence

    # a float32 reference against a bfloat16 server: bfloat16's rounding can explain a margin of 0.25
    served = Divergence(5, 10, 11, 0.25, "float32", "bfloat16")
    assert served.near_tie_bound == 0.5 and served.near_tie
    assert "0.5 of float32 (reference) and bfloat16 (system)" in served.describe()
    assert not Divergence(5, 10, 11, 0.25, "float32", "float32").near_tie
    assert not Divergence(5, 10, 11, 0.25, "float32").near_tie  # the system's dtype unknown: the reference's
    quantized = Divergence(5, 10, 11, 3.0, "float32", "int4_awq")
    assert quantized.near_tie and quantized.to_dict()["near_tie_bound"] is None
    assert "int4_awq has no near-tie bound" in quantized.describe()


def test_a_server_is_taken_to_compute_in_what_the_recipe_deploys():
    from trtspec.recipe import recipe_from_dict
    from trtspec.validate.systems import served_dtype

    def recipe(quantization="none", **triton):
        data = {
            "name": "r",
            "target": {"model": "/t", "dtype": "bfloat16", "quantization": quantization},
            "draft": {"model": "/d"},
            "triton": triton,
        }
        return recipe_from_dict(data, check_paths=False)

    assert served_dtype(recipe(runtime="torch", device="cpu")) == "float32"  # the torch runtime's rule on CPU
    assert served_dtype(recipe(runtime="torch", device="cuda")) == "bfloat16"
    assert served_dtype(recipe(runtime="tensorrtllm")) == "bfloat16"
    assert served_dtype(recipe("int4_awq", runtime="tensorrtllm")) == "int4_awq"
    assert served_dtype(recipe("int4_awq", runtime="torch", device="cpu"), "tensorrtllm") == "int4_awq"


def test_a_divergence_rounding_cannot_explain_fails_whatever_the_thresholds():
    from dataclasses import replace

    from trtspec.validate.compare import Divergence

    ref = [[10, 11, 12]]
    result = _result([[10, 11, 99]], [[10, 11, 99]], ref, Thresholds(min_control_match=None))
    (outcome,) = result.outcomes

    def with_margin(margin):
        divergence = Divergence(2, 12, 99, margin, "float32")
        return replace(result, outcomes=[replace(outcome, divergence=divergence)])

    assert (
        with_margin(0.0005).failures() == []
    )  # float32 rounding can explain it: the exact-match gate decides
    (failure,) = with_margin(2.0).failures()
    assert failure.startswith("p0: first divergence at token 2") and "rounding cannot explain it" in failure


def test_a_system_that_goes_on_past_its_stop_is_no_near_tie_and_fails():
    """The divergence of a candidate that ran past its stop id lies where the reference stopped: both chose the
    stop token there, so the reference's margin would weigh a choice they share. No margin excuses it."""
    import math

    from trtspec.validate.validation import divergence_of

    result = _result([[10, 11, 2, 99]], [[10, 11, 2, 99]], [[10, 11, 2]])
    (outcome,) = result.outcomes

    class Reference:
        dtype = "bfloat16"

        def stop_token_ids(self):
            return {2}

        def margin(self, prompt_ids, index):
            raise AssertionError("no margin is looked up for a stop both sides chose")

    divergence = divergence_of(outcome, Request("x", [1]), Reference(), "int4_awq")
    assert divergence.index == 2 and math.isinf(divergence.margin) and not divergence.near_tie
    assert "went on past its stop token 2 at token 2" in divergence.describe()
    assert divergence.to_dict()["margin"] is None


def test_the_reported_rate_is_the_runs_tokens_over_its_wall_time_not_over_its_longest_request(monkeypatch):
    """Batches run one after another, so a run's rate is its tokens over its whole wall time (1 s here), not over
    its longest request's time (0.5 s each): the report's overall and stats rates both say so."""
    from trtspec.validate import systems

    monkeypatch.setattr(systems, "MIN_TIMED_TOKENS", 1)
    result = _result([[10, 11, 12], [20, 21]], [[10, 11, 12], [20, 21]], [[10, 11, 12], [20, 21]])
    payload = validation_to_dict(result)
    assert payload["overall"]["tokens_per_s"] == pytest.approx(5 / 1.0)
    assert payload["stats"]["tokens_per_s"] == pytest.approx(5 / 1.0)
    assert payload["overall"]["target_only_tokens_per_s"] == pytest.approx(5 / 2.0)
