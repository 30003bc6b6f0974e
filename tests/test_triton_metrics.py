"""Triton's /metrics on a real tritonserver serving the shipped demo pair (torch runtime), one for the module: the
spec-decode counters grow by exactly what the responses report."""

from __future__ import annotations

import pytest
from triton_server import PROMPTS, delta, grpc_stream, spec_metrics

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.one_stack]


def test_metrics_count_what_the_responses_report(demo_server):
    """/metrics' counters grow by exactly the return_perf_metrics of the requests sent (streamed, not streamed,
    sampled); positions add up to the accepted tokens; the K gauge follows the last request."""
    server = demo_server
    requests = [
        dict(prompt=PROMPTS[0], stream=True, num_draft_tokens=3, max_tokens=16),
        dict(prompt=PROMPTS[1], stream=False, num_draft_tokens=4, max_tokens=12),
        dict(
            prompt=PROMPTS[2],
            stream=True,
            num_draft_tokens=2,
            max_tokens=10,
            temperature=0.9,
            top_k=20,
            seed=5,
        ),
    ]
    before = spec_metrics(server)
    assert len(before["per_pos"]) == 4  # every position up to max_draft_len exists before it counts anything
    reported = []
    for r in requests:
        _, metrics = grpc_stream(server, r.pop("prompt"), return_perf_metrics=True, **r)
        reported.append(metrics)
    got = delta(spec_metrics(server), before)
    assert got["num_draft_tokens_total"] == sum(m["total_draft_tokens"] for m in reported) > 0
    assert got["num_accepted_tokens_total"] == sum(m["total_accepted_draft_tokens"] for m in reported) > 0
    per_pos = got["per_pos"]
    assert sum(per_pos) == got["num_accepted_tokens_total"] and per_pos[0] > per_pos[-1]
    # a round accepts position i only after accepting 0..i-1, and accepts at most one token per position
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert per_pos[0] <= got["num_drafts_total"] <= got["num_draft_tokens_total"]
    assert got["num_draft_tokens_total"] <= 4 * got["num_drafts_total"]
    # each request's first round is the target's prefill alone
    assert got["num_rounds_without_speculation_total"] >= len(requests)
    # the gauge: the last request's mean K (K=2, less only where max_tokens left less room)
    assert 1.0 <= spec_metrics(server)["draft_len"] <= 2.0

    before = spec_metrics(server)
    ids: list = []
    _, metrics = grpc_stream(server, PROMPTS[3], ids, stream=False, num_draft_tokens=0, max_tokens=6)
    got = delta(spec_metrics(server), before)
    assert got["num_drafts_total"] == got["num_draft_tokens_total"] == 0 and not any(got["per_pos"])
    # K=0: one target forward per token (and one more for an end_id it does not emit)
    assert got["num_rounds_without_speculation_total"] in (len(sum(ids, [])), len(sum(ids, [])) + 1)


def test_adaptive_k_says_per_batch_size_which_k_it_chose_and_why(demo_server):
    """Requests that leave K to the server: /metrics counts the rounds each K ran per batch size, and the gauges
    of each batch size hold the last choice's K, acceptance, round cost, expected speedup, whether the costs
    were measured and whether the rows were judged as a group their client waits for."""
    from triton_server import scrape

    for prompt in PROMPTS[:3]:
        grpc_stream(demo_server, prompt, stream=True, max_tokens=24)  # no num_draft_tokens: adaptive
    values = scrape(demo_server, "trtspec_adaptive_")
    rounds = {
        (dict(labels)["batch"], int(dict(labels)["k"])): value
        for (name, labels), value in values.items()
        if name == "trtspec_adaptive_rounds_total"
    }
    assert rounds and all(batch == "1" for batch, _ in rounds)  # one request at a time
    assert sum(rounds.values()) >= 3 * 5  # every adaptive round after each prefill, at least
    assert rounds.get(("1", 0), 0) >= 1  # the batch size's first timed round measured the unit
    gauges = {name: value for (name, labels), value in values.items() if dict(labels).get("batch") == "1"}
    k = gauges["trtspec_adaptive_k"]
    assert 0 <= k <= 4 and 0 < gauges["trtspec_adaptive_acceptance"] < 1
    assert gauges["trtspec_adaptive_measured"] in (0.0, 1.0) and gauges["trtspec_adaptive_round_cost"] >= 1
    assert gauges["trtspec_adaptive_expected_speedup"] > 0  # below 1 only for a 1-token probe
    assert gauges["trtspec_adaptive_waited"] == 0.0  # one row is its own group: judged by its own acceptance
