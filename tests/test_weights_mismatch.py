"""Weights that do not match the model's config are refused with one line naming the file and the tensor.

transformers would fill a missing tensor with random values and drop an unexpected one, with a warning only: a
draft would then accept nothing, a target emit garbage. Each case is a tiny model saved with save_pretrained, then
its model.safetensors rewritten with one tensor removed or one added, run through the CLI commands as a user
would. Tied embeddings, non-persistent buffers and the keys a model class marks as ignorable still load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_check import run_check, status_of, write_recipe
from test_generate_cli import generate_args, run_trtspec
from tiny_models import make_model
from triton_server import deploy_tiny_repo

from trtspec.cli import cli
from trtspec.core.errors import ModelError
from trtspec.core.model_dir import checkpoint_problem, load_hf_model
from trtspec.triton_repo.server import free_ports

MISSING = "model.layers.0.mlp.up_proj.weight"
EXTRA = "model.layers.0.mlp.extra_proj.weight"


def rewrite_weights(
    model_dir: Path, drop: str | None = None, add: dict | None = None, file: str | None = None
):
    """Rewrite one safetensors file of ``model_dir`` (default model.safetensors) without ``drop`` and with
    ``add`` (name -> tensor); returns the file."""
    from safetensors.torch import load_file, save_file

    path = model_dir / (file or "model.safetensors")
    tensors = load_file(path)
    if drop is not None:
        del tensors[drop]
    tensors.update(add or {})
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def broken_copy(model_dir: Path, out: Path, change: str) -> tuple[Path, Path, str]:
    """A copy of ``model_dir`` with one tensor missing ("missing") or one extra ("unexpected"); returns the copy,
    its weight file and the tensor's name."""
    import torch

    copy = Path(shutil.copytree(model_dir, out))
    if change == "missing":
        return copy, rewrite_weights(copy, drop=MISSING), MISSING
    return copy, rewrite_weights(copy, add={EXTRA: torch.zeros(4, 4)}), EXTRA


def expected_line(weights: Path, change: str, tensor: str) -> str:
    return (
        f"{weights}: has no tensor {tensor}" if change == "missing" else f"{weights}: holds tensor {tensor}"
    )


def assert_one_line_error(result, exit_code: int, needle: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and needle in errors[0], result.output


@pytest.fixture
def broken_pair(tmp_path, tiny_pair):
    """(target, draft, weight file, tensor): the tiny pair with one model's weights changed."""

    def make(role: str, change: str):
        target, draft = tiny_pair
        source = target if role == "target" else draft
        copy, weights, tensor = broken_copy(source, tmp_path / f"{role}-{change}", change)
        pair = (copy, draft) if role == "target" else (target, copy)
        return (*pair, weights, tensor)

    return make


CASES = [(role, change) for role in ("draft", "target") for change in ("missing", "unexpected")]


@pytest.mark.parametrize(("role", "change"), CASES)
def test_generate_refuses_mismatched_weights(runner, broken_pair, role, change):
    target, draft, weights, tensor = broken_pair(role, change)
    args = generate_args(target, draft)
    assert_one_line_error(runner.invoke(cli, args), 2, expected_line(weights, change, tensor))


@pytest.mark.parametrize(("role", "change"), CASES)
def test_validate_refuses_mismatched_weights(runner, tmp_path, broken_pair, role, change):
    target, draft, weights, tensor = broken_pair(role, change)
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    args = ["validate", str(recipe), "--prompts", str(prompts), "--max-tokens", "2"]
    assert_one_line_error(runner.invoke(cli, args), 2, expected_line(weights, change, tensor))


@pytest.mark.parametrize(("role", "change"), CASES)
def test_check_reports_mismatched_weights_as_a_failed_check(runner, tmp_path, broken_pair, role, change):
    target, draft, weights, tensor = broken_pair(role, change)
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", target, draft))
    assert result.exit_code == 1, result.output
    status, message = status_of(payload, f"{role} weights")
    assert status == "fail" and message.startswith(expected_line(weights, change, tensor))
    other = "target" if role == "draft" else "draft"
    assert status_of(payload, f"{other} weights")[0] == "pass"
    table = runner.invoke(cli, ["check", str(tmp_path / "r.yaml")])
    assert table.exit_code == 1 and "Traceback" not in table.output and tensor in table.output


def test_bench_and_align_refuse_a_draft_with_a_missing_tensor(runner, tmp_path, broken_pair):
    target, draft, weights, tensor = broken_pair("draft", "missing")
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "def f{i}(a, b):"}}\n' for i in range(12)))
    out = tmp_path / "out"
    bench = ["bench", str(recipe), "--prompts", str(prompts), "--max-tokens", "2", "--out", str(out)]
    assert_one_line_error(runner.invoke(cli, bench), 2, expected_line(weights, "missing", tensor))
    align = [
        "align",
        str(recipe),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--work-dir",
        str(tmp_path / "w"),
    ]
    needle = f"check refuses the pair (draft weights: {expected_line(weights, 'missing', tensor)}"
    assert_one_line_error(runner.invoke(cli, align), 1, needle)
    assert not out.exists()


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_bench_refuses_a_target_with_a_missing_tensor(runner, tmp_path, broken_pair, proposer):
    """The target is loaded whatever proposes (ngram loads no draft): refused before the first point is
    measured, so neither the results nor the recipe copy is written."""
    target, draft, weights, tensor = broken_pair("target", "missing")
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "def f{i}(a, b):"}}\n' for i in range(4)))
    out, copy = tmp_path / "out", tmp_path / "scheduled.yaml"
    args = ["bench", str(recipe), "--prompts", str(prompts), "--max-tokens", "2", "--num-draft-tokens", "1"]
    args += ["--concurrency", "1", "--proposer", proposer, "--out", str(out), "--write-recipe", str(copy)]
    result = runner.invoke(cli, args)
    assert_one_line_error(result, 2, expected_line(weights, "missing", tensor))
    assert len(result.output.strip().splitlines()) == 1, result.output  # no table, no point measured
    assert not out.exists() and not copy.exists()


def test_deploy_refuses_a_pair_the_served_models_could_not_load(runner, tmp_path, broken_pair):
    """The torch runtime's entry model loads both checkpoints at server start (engines.models.load_causal_lm, the
    same refusal); deploy runs the checks first, so the repository is never written."""
    target, draft, weights, tensor = broken_pair("target", "unexpected")
    out = tmp_path / "repo"
    result = runner.invoke(
        cli, ["deploy", str(write_recipe(tmp_path / "r.yaml", target, draft)), "--out", str(out)]
    )
    needle = "pre-flight check target weights failed: " + expected_line(weights, "unexpected", tensor)
    assert_one_line_error(result, 1, needle)
    assert not out.exists()


@pytest.mark.server
def test_serve_names_the_tensor_when_weights_break_after_deploy(tmp_path, tiny_pair):
    """Weights changed after deploy reach no pre-flight check: the entry model's load refuses them, and that line,
    in tritonserver's words, is what `trtspec serve` says (and the server's log holds)."""
    target = Path(shutil.copytree(tiny_pair[0], tmp_path / "target"))
    repo = deploy_tiny_repo((target, tiny_pair[1]), tmp_path / "repo")
    weights = rewrite_weights(target, drop=MISSING)
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    proc = subprocess.run(
        [sys.executable, "-m", "trtspec", "serve", str(repo), *ports, "--timeout", "120"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"Error: tritonserver did not load {repo}: model 'tensorrt_llm_bls' failed")
    assert expected_line(weights, "missing", MISSING) in lines[0]
    assert expected_line(weights, "missing", MISSING) in (tmp_path / ".repo.tritonserver.log").read_text()


def test_the_error_is_the_only_line_on_stderr(tmp_path, tiny_pair):
    """In a real process: transformers' own report of the load (a table in version 5, a paragraph in 4) and its
    progress bars stay off stderr, so the one line is all a user sees."""
    target, draft = tiny_pair
    copy, weights, tensor = broken_copy(draft, tmp_path / "draft", "missing")
    proc = run_trtspec(*generate_args(target, copy))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"Error: {expected_line(weights, 'missing', tensor)}")


@pytest.mark.conversion
def test_convert_refuses_a_draft_with_a_missing_tensor(runner, tmp_path, broken_pair):
    target, draft, weights, tensor = broken_pair("draft", "missing")
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    out = tmp_path / "ckpt"
    result = runner.invoke(cli, ["convert", str(recipe), "--model", "draft", "--out", str(out)])
    assert_one_line_error(result, 2, expected_line(weights, "missing", tensor))
    assert not out.exists()


@pytest.mark.conversion
@pytest.mark.parametrize(("role", "change"), [("target", "missing"), ("draft", "unexpected")])
def test_quantize_refuses_mismatched_weights(runner, tmp_path, broken_pair, role, change):
    target, draft, weights, tensor = broken_pair(role, change)
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    out = tmp_path / "q"
    args = ["quantize", str(recipe), "--model", role, f"--{role}-format", "fp8", "--calib-size", "1"]
    result = runner.invoke(cli, [*args, "--calib-seq-len", "8", "--out", str(out)])
    assert_one_line_error(result, 2, expected_line(weights, change, tensor))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.yaml", f"{role}-{change}"])


@pytest.mark.conversion
@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_a_pair_is_refused_before_either_model_is_exported(runner, tmp_path, broken_pair, command):
    """Both models: the draft's weights are refused before the target's checkpoint is exported (and calibrated),
    so a failed run leaves no half of the pair behind."""
    target, draft, weights, tensor = broken_pair("draft", "missing")
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    out = tmp_path / "ckpt"
    args = [command, str(recipe), "--out", str(out)]
    if command == "quantize":
        args += ["--target-format", "fp8", "--draft-format", "fp8"]
        args += ["--calib-size", "1", "--calib-seq-len", "8"]
    assert_one_line_error(runner.invoke(cli, args), 2, expected_line(weights, "missing", tensor))
    assert not out.exists()


@pytest.mark.conversion
def test_build_stops_at_preflight_on_a_target_with_an_extra_tensor(runner, tmp_path, broken_pair):
    target, draft, weights, tensor = broken_pair("target", "unexpected")
    recipe = write_recipe(tmp_path / "r.yaml", target, draft)
    out = tmp_path / "engines"
    result = runner.invoke(cli, ["build", str(recipe), "--engines-dir", str(out)])
    assert_one_line_error(
        result, 1, "pre-flight check target weights failed: " + expected_line(weights, "unexpected", tensor)
    )
    assert not (out / "tiny" / "target").exists()


# ---------------------------------------------------------------- what is not an error


def test_tied_embeddings_load_without_lm_head(runner, tmp_path, tiny_pair, shared_tokenizer_dir):
    """A tied draft saves no lm_head.weight: the model ties it to embed_tokens, so nothing is missing."""
    from safetensors import safe_open

    draft = make_model(tmp_path / "tied", tokenizer_dir=shared_tokenizer_dir, hidden_size=32,
                       num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=True)  # fmt: skip
    with safe_open(draft / "model.safetensors", "pt") as handle:
        assert "lm_head.weight" not in set(handle.keys())  # noqa: SIM118
    assert checkpoint_problem(draft) is None
    load_hf_model(draft, "float32")
    args = ["generate", "--target", str(tiny_pair[0]), "--draft", str(draft), "--prompt", "x",
            "--max-new-tokens", "2", "--json"]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["drafted"] > 0


def test_buffers_and_ignorable_keys_are_not_errors(tmp_path, tiny_pair, monkeypatch):
    """An old checkpoint's rotary inv_freq (a non-persistent buffer today) and a key the model class marks as
    ignorable on load (``_keys_to_ignore_on_load_unexpected``) load as transformers loads them."""
    import torch
    from transformers import LlamaForCausalLM

    copy = Path(shutil.copytree(tiny_pair[1], tmp_path / "draft"))
    extra = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4),
        "model.ignored_stat": torch.ones(1),
    }
    rewrite_weights(copy, add=extra)
    assert "model.ignored_stat" in checkpoint_problem(copy)
    monkeypatch.setattr(LlamaForCausalLM, "_keys_to_ignore_on_load_unexpected", [r"ignored_stat"])
    assert checkpoint_problem(copy) is None
    load_hf_model(copy, "float32")


# ---------------------------------------------------------------- the file named


def test_a_sharded_checkpoint_names_the_shard(tmp_path, tiny_pair):
    """transformers 4 takes a sharded checkpoint's index at its word and leaves a tensor its shard lacks on the
    meta device; both versions name the shard the index assigns it."""
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_pair[1]).save_pretrained(sharded, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_pair[1] / name).is_file():
            shutil.copy(tiny_pair[1] / name, sharded / name)
    weight_map = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1
    assert checkpoint_problem(sharded) is None
    shard = weight_map[MISSING]
    rewrite_weights(sharded, drop=MISSING, file=shard)
    for check in (checkpoint_problem, lambda d: _load_error(d)):
        assert check(sharded).startswith(f"{sharded / shard}: has no tensor {MISSING}")


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path, tiny_pair):
    import torch

    copy = Path(shutil.copytree(tiny_pair[1], tmp_path / "draft"))
    weights = rewrite_weights(copy, add={MISSING: torch.zeros(3, 3)})
    message = _load_error(copy)
    assert message.startswith(
        f"{weights}: holds tensor {MISSING} in a shape LlamaForCausalLM does not expect"
    )
    assert message == checkpoint_problem(copy)


def _load_error(model_dir: Path) -> str:
    with pytest.raises(ModelError) as err:
        load_hf_model(model_dir, "float32")
    assert "\n" not in err.value.message
    return err.value.message
