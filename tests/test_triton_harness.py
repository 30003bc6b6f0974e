"""The tensorrtllm runtime's repository on a real tritonserver, its two engine models replaced by the test
harness's stand-ins (tests/harness: the PyTorch engine behind the TensorRT-LLM backend's tensors)."""

from __future__ import annotations

import pytest
from harness.repo import deploy_harness
from triton_server import PROMPTS, grpc_stream, hf_greedy, running_server, spec_metrics, tiny_recipe

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.one_stack]


@pytest.fixture(scope="module")
def reference(tiny_pair):
    return hf_greedy(tiny_pair[0])


def test_draft_ahead_with_a_draft_that_is_always_right_keeps_the_target_greedy_output(
    tiny_pair, reference, tmp_path
):
    """The orchestrator over the stand-in engine models; the target as its own draft: every round accepts the
    whole draft and the bonus guess, so each round after the prefill verifies a draft made ahead (K + 1 =
    max_draft_len + 1 tokens asked of the draft engine model). A request without K gets the repository's default,
    adaptive K (deploy writes it for the recipe's unpinned K)."""
    target = tiny_pair[0]
    deploy_harness(tiny_recipe((target, target)), tmp_path / "repo")
    with running_server(tmp_path / "repo", tmp_path / "server.log") as srv:
        drafted = 0
        for stream, k in ((True, 4), (False, 4), (True, None)):
            pinned = {} if k is None else {"num_draft_tokens": k}
            pieces, metrics = grpc_stream(
                srv, PROMPTS[1], stream=stream, max_tokens=16, return_perf_metrics=True, **pinned
            )
            assert "".join(pieces) == reference(PROMPTS[1], 16)
            assert metrics["acceptance_rate"] == 1.0 and metrics["total_draft_tokens"] > 0
            drafted += metrics["total_draft_tokens"]
        # the tensorrtllm runtime's entry model exports the same metrics: here every draft token is accepted
        got = spec_metrics(srv)
        assert got["num_draft_tokens_total"] == got["num_accepted_tokens_total"] == drafted
        assert got["per_pos"][0] == got["num_drafts_total"] and sum(got["per_pos"]) == drafted
        assert got["draft_len"] > 0


def test_a_non_decoupled_orchestrator_answers_concurrent_requests_in_one_execute(
    tiny_pair, reference, tmp_path
):
    """triton.decoupled false for the tensorrtllm runtime: the entry model's dynamic batcher hands one execute the
    requests that queued meanwhile, and they generate at once (the in-flight batcher sees them together), each
    answered as it is alone: the target's greedy text."""
    import json

    from triton_server import batched_bursts, http_generate

    deploy_harness(tiny_recipe(tiny_pair, decoupled=False), tmp_path / "repo")
    with running_server(tmp_path / "repo", tmp_path / "server.log") as srv:
        status, raw = http_generate(srv, {"text_input": PROMPTS[0], "max_tokens": 16})
        assert status == 200 and json.loads(raw)["text_output"] == reference(PROMPTS[0], 16), raw
        bodies = [{"text_input": p, "max_tokens": 16} for p in PROMPTS]
        assert batched_bursts(srv, bodies), "no burst of concurrent requests shared an execution"


def test_requests_that_finish_together_leave_the_server_serving(tiny_pair, reference, tmp_path):
    """Concurrent requests finish on threads of their own, each adding its counts to the entry model's metrics,
    and the python backend aborts tritonserver when two threads update one metric at once (triton_io.METRICS_LOCK;
    unlocked, a server falls within a dozen bursts). Forty bursts of four requests at one instant: each
    answered as it is alone, and every one counted."""
    import json

    from triton_server import at_once, scrape

    deploy_harness(tiny_recipe(tiny_pair), tmp_path / "repo")
    bodies = [{"text_input": p, "max_tokens": 16} for p in PROMPTS]
    alone = [reference(p, 16) for p in PROMPTS]
    with running_server(tmp_path / "repo", tmp_path / "server.log") as srv:
        for _ in range(40):
            answers = at_once(srv, bodies)
            assert [status for status, _ in answers] == [200] * len(bodies), answers
            assert [json.loads(raw)["text_output"] for _, raw in answers] == alone
        # a whole answer is sent after its request was counted
        assert sum(scrape(srv, "trtspec_requests_finished_total").values()) == 40 * len(bodies)
