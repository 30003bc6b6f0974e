"""A draft with another tokenizer, served by a real tritonserver: a Llama-3-style target and a Qwen2.5-style draft
(tests/conftest.py cross_family_pair) on the torch runtime and on the tensorrtllm runtime (the harness's stand-in
engine models); each streamed and whole answer is HF greedy's, and the responses say the draft proposed."""

from __future__ import annotations

import pytest

from trtspec.recipe import recipe_from_dict

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROMPT = "def add(a, b):\n    return"


def cross_recipe(pair, runtime: str):
    target, draft = pair
    return recipe_from_dict(
        {
            "name": "cross",
            "target": {"model": str(target)},
            "draft": {"model": str(draft)},
            "speculative": {"max_draft_len": 4, "heterogeneous_vocab": True},
            "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
            "triton": {"runtime": runtime},
        }
    )


@pytest.mark.parametrize(
    "runtime",
    # The translation between the two tokenizers is the torch case's on both stacks; the tensorrtllm runtime adds
    # the server's path (orchestrator, stand-in engine models), which no transformers release changes.
    ["torch", pytest.param("tensorrtllm", marks=pytest.mark.one_stack)],
)
def test_a_draft_with_another_tokenizer_serves_the_targets_greedy_text(cross_family_pair, runtime, tmp_path):
    from harness.repo import deploy_harness
    from triton_server import grpc_stream, hf_greedy, running_server

    from trtspec.triton_repo.deploy import deploy

    recipe = cross_recipe(cross_family_pair, runtime)
    repo = tmp_path / "repo"
    if runtime == "torch":
        deploy(recipe, "torch", repo)
    else:
        deploy_harness(recipe, repo)
    reference = hf_greedy(cross_family_pair[0])(PROMPT, 24)
    with running_server(repo, tmp_path / "server.log") as server:
        for stream in (True, False):
            pieces, metrics = grpc_stream(
                server, PROMPT, stream=stream, max_tokens=24, num_draft_tokens=3, return_perf_metrics=True
            )
            assert "".join(pieces) == reference
            assert metrics["total_draft_tokens"] > 0
