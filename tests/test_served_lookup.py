"""Prompt lookup (core/lookup.py) served by a real tritonserver on the torch runtime: the shipped demo pair with a
request's own ``proposer``, and the demo target alone under a recipe whose prompt lookup proposes alone. Greedy
output equals target-only decoding whoever proposes; return_perf_metrics and /metrics say which proposer drafted
and which tokens were accepted."""

from __future__ import annotations

import pytest
from triton_server import delta, grpc_stream, hf_greedy, running_server, spec_metrics

# A prompt that repeats itself, and that the demo target continues by repeating it: the suffix n-grams of its
# continuation occur in it, so lookup proposes, and the target accepts.
REPEATING = "import os\n" * 4
LIMITS = {"max_input_len": 64, "max_seq_len": 128}


def deploy_demo(out, with_draft: bool):
    """The demo pair's torch-runtime repository; without the draft, prompt lookup proposes alone."""
    from trtspec.recipe import DEMO_DIR, recipe_from_dict
    from trtspec.triton_repo.deploy import deploy

    pair = {"target": {"model": str(DEMO_DIR / "target")}}
    speculative = {"max_draft_len": 4}
    if with_draft:
        pair["draft"] = {"model": str(DEMO_DIR / "draft")}
    else:
        speculative["proposer"] = "ngram"
    recipe = recipe_from_dict(
        {"name": "demo-lookup", **pair, "speculative": speculative, "limits": LIMITS, "triton": {}}
    )
    deploy(recipe, "torch", out)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup-serve")
    with running_server(deploy_demo(root / "repo", with_draft=True), root / "server.log") as srv:
        yield srv


def ask(server, proposer: str | None = None, **extra) -> tuple[list[int], dict]:
    """(generated ids, return_perf_metrics) of one request for REPEATING (greedy unless ``extra`` samples)."""
    if proposer is not None:
        extra["proposer"] = proposer
    chunks: list = []
    _, metrics = grpc_stream(server, REPEATING, chunks, max_tokens=24, return_perf_metrics=True, **extra)
    return sum(chunks, []), metrics


def consistent(metrics: dict) -> bool:
    """The ngram part of a response's counts is a part of its totals."""
    return (
        0
        <= metrics["ngram_accepted_draft_tokens"]
        <= metrics["ngram_draft_tokens"]
        <= metrics["total_draft_tokens"]
        and metrics["ngram_accepted_draft_tokens"] <= metrics["total_accepted_draft_tokens"]
    )


@pytest.mark.server
@pytest.mark.slow
def test_lookup_output_equals_target_only_and_says_it_drafted(server):
    """Greedy output is the target's whoever proposes. The first request asks for lookup before any target-only
    round is timed: whether later rounds look up is adaptive's choice from measured costs, its first is not."""
    got, metrics = ask(server, "ngram", stream=False)
    assert metrics["ngram_draft_tokens"] > 0 and metrics["ngram_accepted_draft_tokens"] > 0, metrics
    assert metrics["total_draft_tokens"] == metrics["ngram_draft_tokens"]  # the draft model proposed nothing
    want, baseline = ask(server, num_draft_tokens=0, stream=False)
    assert got == want and baseline["total_draft_tokens"] == baseline["ngram_draft_tokens"] == 0
    for proposer, stream, k in (
        ("ngram", True, None),
        ("draft+ngram", True, None),
        ("draft+ngram", False, 4),
    ):
        pinned = {} if k is None else {"num_draft_tokens": k}
        got, metrics = ask(server, proposer, stream=stream, **pinned)
        assert got == want, (proposer, stream)
        assert consistent(metrics), metrics
        if proposer == "ngram":
            assert metrics["total_draft_tokens"] == metrics["ngram_draft_tokens"]
    got, metrics = ask(server, "draft", stream=True, num_draft_tokens=3)
    assert got == want and metrics["total_draft_tokens"] > 0 and metrics["ngram_draft_tokens"] == 0


@pytest.mark.server
@pytest.mark.slow
def test_metrics_count_what_the_responses_report_per_proposer(server):
    """/metrics' counters labelled with a proposer grow by exactly what each response reported as that
    proposer's; summed over the label they are the totals, as before the label existed. The lookup requests are
    seeded sampled ones, whose proposals do not depend on measured costs (so lookup surely proposes)."""
    sampled = {"temperature": 0.5, "top_p": 1.0, "seed": 3}
    requests = [
        dict(proposer="ngram", stream=True, **sampled),
        dict(proposer="draft", stream=False, num_draft_tokens=2),
        dict(proposer="draft+ngram", stream=False, **sampled),
        dict(proposer="ngram", stream=False),
        dict(stream=True),  # the deployment's proposer: the draft model
    ]
    before = spec_metrics(server)
    reported = [ask(server, **r)[1] for r in requests]
    got = delta(spec_metrics(server), before)

    def total(key: str) -> int:
        return sum(m[key] for m in reported)

    ngram = (total("ngram_draft_tokens"), total("ngram_accepted_draft_tokens"))
    drafted, accepted = total("total_draft_tokens"), total("total_accepted_draft_tokens")
    assert ngram[0] > 0 and drafted - ngram[0] > 0  # both proposers drafted
    assert got["num_draft_tokens_total", "ngram"] == ngram[0]
    assert got["num_accepted_tokens_total", "ngram"] == ngram[1]
    assert got["num_draft_tokens_total", "draft"] == drafted - ngram[0]
    assert got["num_accepted_tokens_total", "draft"] == accepted - ngram[1]
    assert (got["num_draft_tokens_total"], got["num_accepted_tokens_total"]) == (drafted, accepted)
    for proposer in ("draft", "ngram"):  # a round drafts 1..max_draft_len tokens
        rounds, tokens = got["num_drafts_total", proposer], got["num_draft_tokens_total", proposer]
        assert 0 < rounds <= tokens <= 4 * rounds
    assert sum(got["per_pos"]) == accepted


@pytest.mark.server
@pytest.mark.slow
def test_a_bad_proposer_is_a_clean_error_naming_it(server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as err:
        ask(server, "medusa", stream=True)
    message = err.value.message()
    assert "proposer" in message and "'medusa'" in message and "Traceback" not in message
    assert ask(server, "ngram", stream=True)[0]  # the server serves on


@pytest.mark.server
@pytest.mark.slow
def test_a_recipe_without_a_draft_serves_prompt_lookup_exactly(tmp_path):
    """proposer ngram and no draft section: the repository names no draft checkpoint, the entry model loads the
    target alone, greedy output equals HF greedy of the target, and a request for the draft is refused."""
    from tritonclient.utils import InferenceServerException

    from trtspec.recipe import DEMO_DIR

    repo = deploy_demo(tmp_path / "repo", with_draft=False)
    config = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert 'key: "draft_model_dir" value: { string_value: "" }' in config
    assert 'key: "proposer" value: { string_value: "ngram" }' in config
    _, want = hf_greedy(DEMO_DIR / "target")(REPEATING, 24, with_ids=True)
    with running_server(repo, tmp_path / "server.log") as srv:
        got, metrics = ask(srv, stream=False)
        assert got == want and metrics["total_draft_tokens"] == metrics["ngram_draft_tokens"] > 0
        got, metrics = ask(srv, stream=True)
        assert got == want and metrics["total_draft_tokens"] == metrics["ngram_draft_tokens"]
        with pytest.raises(InferenceServerException) as err:
            ask(srv, "draft+ngram", stream=False)
        assert "needs a draft model" in err.value.message()


# ---------------------------------------------------------------- the pure parts, no server


def test_a_requests_proposer_reaches_its_sampling_params_and_a_bad_one_names_itself():
    import numpy as np

    from trtspec.core.errors import RequestError
    from trtspec.triton_repo.models.request import Limits, parse_request

    limits = Limits(max_draft_len=4, num_draft_tokens=None, max_seq_len=128)

    def parsed(**fields):
        inputs = {"text_input": np.array([[b"x"]], dtype=object), "max_tokens": np.array([[4]])}
        inputs |= {k: np.array([[v.encode()]], dtype=object) for k, v in fields.items()}
        return parse_request(inputs, limits).params.proposer

    assert [parsed(proposer=p) for p in ("draft", "ngram", "draft+ngram")] == [
        "draft",
        "ngram",
        "draft+ngram",
    ]
    assert parsed() is None and parsed(proposer=" ") is None  # left out or blank: the deployment's
    with pytest.raises(RequestError, match=r"proposer .*'medusa'"):
        parsed(proposer="medusa")


def test_proposer_shares_add_up_to_the_counts_and_the_rest_is_the_draft_models():
    from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts
    from trtspec.triton_repo.models.triton_io import proposer_shares

    stats = AcceptanceStats(max_draft_len=4)
    for num_draft, num_accepted, proposer in (
        (4, 2, "draft"),
        (3, 3, "ngram"),
        (2, 0, "ngram"),
        (0, 0, "draft"),
    ):
        stats.record_round(num_draft, num_accepted, proposer)
    counts = SpecDecodeCounts.of(stats)
    shares = proposer_shares(counts, stats.by_proposer)
    assert shares == {
        "ngram": {"num_drafts": 2, "num_draft_tokens": 5, "num_accepted_tokens": 3},
        "draft": {"num_drafts": 1, "num_draft_tokens": 4, "num_accepted_tokens": 2},
    }
    # counts without a breakdown (a runtime that gives none) are the draft model's
    assert proposer_shares(counts, {})["draft"]["num_draft_tokens"] == counts.num_draft_tokens == 9
