"""A padded-vocabulary pair (Qwen2.5's shape: one tokenizer, the target with more vocab rows than the draft)
through the commands a user runs: build, deploy, serve with draft logits, validate against the server, bench."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from tiny_models import make_model
from triton_server import running_server

from trtspec.cli import cli

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def padded_recipe(tmp_path_factory, shared_tokenizer_dir):
    """A 320-id tokenizer, target vocab_size 352, draft 336; draft logits on, so the orchestrator must pad them."""
    root = tmp_path_factory.mktemp("padded")
    target = make_model(root / "target", "qwen2", tokenizer_dir=shared_tokenizer_dir, vocab_size=352, seed=3)
    draft = make_model(
        root / "draft",
        "qwen2",
        tokenizer_dir=shared_tokenizer_dir,
        vocab_size=336,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        tie_word_embeddings=True,
        seed=4,
    )
    recipe = {
        "name": "padded",
        "target": {"model": str(target)},
        "draft": {"model": str(draft)},
        "speculative": {"max_draft_len": 4, "num_draft_tokens": 3, "use_draft_logits": True},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "calibration": {"size": 2, "seq_len": 16},
    }
    path = root / "padded.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.server
def test_padded_pair_serves_and_validates_exactly(runner, padded_recipe, tmp_path):
    repo = tmp_path / "repo"
    result = runner.invoke(cli, ["deploy", str(padded_recipe), "--out", str(repo)])
    assert result.exit_code == 0, result.output
    params = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    # Both checkpoints load in the entry model, which reads each one's rows itself (sampling.to_vocab).
    assert "target_model_dir" in params and "draft_model_dir" in params
    with running_server(repo, tmp_path / "server.log") as server:
        url = server.ports.grpc_url
        args = ["validate", str(padded_recipe), "--url", url, "--limit", "3", "--max-tokens", "12"]
        result = runner.invoke(cli, [*args, "--min-exact-match", "1.0", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["overall"]["exact_match_rate"] == 1.0
        # Sampled with the draft's probabilities: rejection sampling over the target's 352 rows.
        body = {
            "text_input": "def add(a, b):",
            "max_tokens": 16,
            "temperature": 0.9,
            "top_p": 1.0,  # a temperature samples only beside top_k or top_p (upstream's rule)
            "seed": 5,
            "use_draft_logits": True,
            "return_perf_metrics": True,
        }
        request = urllib.request.Request(
            f"http://{server.ports.http_url}/v2/models/tensorrt_llm_bls/generate",
            data=json.dumps(body).encode(),
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        assert answer["total_draft_tokens"] > 0 and isinstance(answer["text_output"], str)


def test_padded_pair_benches_in_process(runner, padded_recipe, tmp_path):
    args = ["bench", str(padded_recipe), "--num-draft-tokens", "2", "--limit", "2", "--max-tokens", "8"]
    result = runner.invoke(cli, [*args, "--out", str(tmp_path / "bench"), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["points"]
    assert any(row["num_draft_tokens"] == 2 and row["acceptance_rate"] is not None for row in rows)


@pytest.mark.conversion
def test_padded_pair_builds_to_the_engine_plan(runner, padded_recipe, tmp_path):
    """Both checkpoints convert and verify with their own vocab rows; the plan takes them (exit 3: no TensorRT-LLM
    here, the engines are finished in the NGC image)."""
    out = tmp_path / "engines"
    result = runner.invoke(cli, ["build", str(padded_recipe), "--engines-dir", str(out)])
    assert result.exit_code == 3, result.output
    configs = {
        role: json.loads((out / "padded" / role / "checkpoint" / "config.json").read_text())
        for role in ("target", "draft")
    }
    assert (configs["target"]["vocab_size"], configs["draft"]["vocab_size"]) == (352, 336)
