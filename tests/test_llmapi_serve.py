"""A trtllm-pytorch repository served by a real tritonserver (CPU) and checked with trtspec's own client and
`trtspec validate`, which speak upstream's LLM-API interface.

tensorrt_llm cannot run here, so upstream's LLM-API model.py is a stand-in (tests/fake_llmapi: upstream's layout,
model.yaml reading and tensor names; trtspec's PyTorch engine generates). What is real: the repository trtspec
deploys (config.pbtxt parsed by tritonserver, model.yaml, the launcher that loads model.py from
TRTSPEC_LLMAPI_MODEL_DIR), the server, and the client's interface detection and field names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from triton_server import running_server

from trtspec.cli import cli
from trtspec.recipe import load_recipe
from trtspec.triton_repo import llmapi
from trtspec.triton_repo.deploy import deploy
from trtspec.validate.triton_client import TritonClient, request_fields

pytestmark = [pytest.mark.server, pytest.mark.slow]

FAKE_LLMAPI_DIR = Path(__file__).parent / "fake_llmapi"


def test_llmapi_request_fields_use_upstream_names():
    fields = request_fields("hi", 8, 3, True, "llmapi", temperature=0.5, seed=7)
    assert fields == {
        "text_input": "hi",
        "sampling_param_max_tokens": 8,
        "streaming": True,
        "sampling_param_return_perf_metrics": True,
        "sampling_param_temperature": 0.5,
        "sampling_param_seed": 7,
        "sampling_param_exclude_input_from_output": True,
    }  # num_draft_tokens is not an LLM-API input: K comes from model.yaml
    assert set(fields) <= set(llmapi.LLMAPI_INPUTS)
    assert request_fields("hi", 8, 3, False)["num_draft_tokens"] == 3


def write_recipe(path: Path, pair: tuple[Path, Path], **triton) -> Path:
    target, draft = pair
    path.write_text(
        yaml.safe_dump(
            {
                "name": "pt",
                "target": {"model": str(target), "dtype": "float32"},
                "draft": {"model": str(draft), "dtype": "float32"},
                # adaptive K as 1.2.x has it: draft_len_schedule {1: 4, 3: 2} (K 4 at one request, below the
                # engine limit 6), the acceptance gate and max_concurrency, all validated by the stand-in
                "speculative": {"max_draft_len": 6, "schedule": {2: 4, 8: 2}},
                "limits": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
                "triton": {"runtime": "trtllm-pytorch", **triton},
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi")
    recipe_path = write_recipe(root / "pt.yaml", tiny_pair)
    deploy(load_recipe(recipe_path), None, root / "repo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(llmapi.UPSTREAM_DIR_ENV, str(FAKE_LLMAPI_DIR))
        with running_server(root / "repo", root / "server.log") as server:
            yield recipe_path, server


def test_client_finds_the_llmapi_entry_model_and_streams_its_text(served):
    _, server = served
    texts = []
    for url in (server.ports.grpc_url, f"http://{server.ports.http_url}"):
        client = TritonClient(url)
        client.check_ready()
        assert (client.model, client.interface) == ("tensorrt_llm", "llmapi")
        response = client.generate("def add(a, b):", 12, stream=True)
        assert response.token_ids is None  # upstream returns text only
        # every response carries the text so far: the pieces are what each adds, the prompt excluded
        assert len(response.pieces) >= 2 and not response.text.startswith("def add")
        assert response.text == client.generate("def add(a, b):", 12, stream=False).text
        assert response.metrics["total_draft_tokens"] == 0  # 1.2.x's PyTorch flow leaves the counters zeroed
        texts.append(response.text)
    assert texts[0] == texts[1] and texts[0]


def test_validate_against_the_llmapi_deployment(runner, served, tmp_path):
    recipe, server = served
    result = runner.invoke(
        cli,
        [
            "validate", str(recipe), "--url", server.ports.grpc_url, "--limit", "2", "--max-tokens", "8",
            "--json", "--min-exact-match", "1",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["overall"]["exact_match_rate"] == 1.0 and payload["overall"]["acceptance_rate"] is None
    # zeroed counters are reported as unknown acceptance, with no round counts claimed
    assert any("acceptance is unknown here, not zero" in note for note in payload["notes"])
    assert payload["stats"]["spec_decode"]["num_drafts"] is None
    assert "tensorrt_llm at" in payload["system"]
    # no target-only mode: the control is not run (not reported as a match) and a note says why
    assert payload["overall"]["control_match_rate"] is None and payload["prompts"][0]["control"] is None
    assert any("fixed K=4" in note for note in payload["notes"])


def test_bench_refuses_the_llmapi_model_whose_k_is_fixed(runner, served, tmp_path):
    recipe, server = served
    args = ["bench", str(recipe), "--url", server.ports.grpc_url, "--limit", "1", "--max-tokens", "4"]
    result = runner.invoke(cli, [*args, "--num-draft-tokens", "2", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    assert (
        "drafts a fixed K=4 (its model.yaml) with no per-request K and no target-only mode" in result.output
    )
    assert not (tmp_path / "b").exists()


def test_validate_refuses_a_k_the_llmapi_model_cannot_run(runner, served):
    recipe, server = served
    args = ["validate", str(recipe), "--url", server.ports.grpc_url, "--limit", "1", "--max-tokens", "4"]
    result = runner.invoke(cli, [*args, "--num-draft-tokens", "2"])
    assert result.exit_code == 2, result.output
    assert "takes no per-request K, so K=2 cannot be measured; use K=4" in result.output


@pytest.mark.one_stack  # how a non-decoupled repository is served and asked: the same on either transformers
def test_validate_against_an_llmapi_deployment_that_is_not_decoupled(
    runner, tiny_pair, tmp_path, monkeypatch
):
    """Upstream's model fails a streamed request unless it is decoupled; validate reads the model's setting and
    asks for whole answers (with time to first token unknown)."""
    from trtspec.core.errors import ServerError

    recipe = write_recipe(tmp_path / "pt.yaml", tiny_pair, decoupled=False)
    deploy(load_recipe(recipe), None, tmp_path / "repo")
    monkeypatch.setenv(llmapi.UPSTREAM_DIR_ENV, str(FAKE_LLMAPI_DIR))
    args = ["validate", str(recipe), "--limit", "1", "--max-tokens", "8", "--json", "--min-exact-match", "1"]
    with running_server(tmp_path / "repo", tmp_path / "server.log") as server:
        with pytest.raises(ServerError, match="Streaming is only supported in decoupled mode"):
            TritonClient(server.ports.grpc_url).generate("def add(a, b):", 4, stream=True)
        result = runner.invoke(cli, [*args, "--url", server.ports.grpc_url])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["overall"]["exact_match_rate"] == 1.0
    assert any("is not decoupled" in note for note in payload["notes"])
