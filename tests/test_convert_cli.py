"""`trtspec convert` / `trtspec quantize` end to end on the tiny pair (real export, real files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny_models import CORPUS

from trtspec.cli import cli

pytestmark = pytest.mark.conversion  # every test here runs ModelOpt


@pytest.fixture
def recipe_file(tmp_path, tiny_pair) -> Path:
    target, draft = tiny_pair
    path = tmp_path / "pair.yaml"
    data = {"name": "tiny", "target": {"model": str(target)}, "draft": {"model": str(draft)}}
    path.write_text(yaml.safe_dump(data))
    return path


def test_convert_both_models_json(runner, recipe_file, tmp_path):
    result = runner.invoke(cli, ["convert", str(recipe_file), "--out", str(tmp_path / "ck"), "--json", "-q"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    roles = [c["role"] for c in payload["checkpoints"]]
    assert roles == ["target", "draft"]
    for ckpt in payload["checkpoints"]:
        assert ckpt["verification"]["passed"] and ckpt["format"] == "none"
        assert (Path(ckpt["checkpoint"]) / "rank0.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["draft", "target"]


def test_convert_replaces_only_a_checkpoint_and_files_are_readable_by_others(runner, recipe_file, tmp_path):
    """--out never replaces a folder that holds anything but a checkpoint (a Hugging Face model folder, notes), and
    the weights get a plain file's mode, not a temp file's private 0600."""
    import os

    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "thesis.txt").write_text("keep me")
    (kept / "config.json").write_text("{}")
    for cmd in (["convert", "--model", "draft"], ["quantize", "--model", "draft", "--draft-format", "fp8"]):
        result = runner.invoke(cli, [cmd[0], str(recipe_file), *cmd[1:], "--no-verify", "--out", str(kept)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert (
            f"--out {kept} exists and is not a TensorRT-LLM checkpoint (no rank0.safetensors)"
            in result.output
        )
        assert (kept / "thesis.txt").read_text() == "keep me"
    both = tmp_path / "both"
    (both / "draft").mkdir(parents=True)
    (both / "draft" / "notes.txt").write_text("keep")
    result = runner.invoke(cli, ["convert", str(recipe_file), "--no-verify", "--out", str(both)])
    assert result.exit_code == 2 and (both / "draft" / "notes.txt").is_file()
    assert not (both / "target").exists()  # refused before any work
    out = tmp_path / "new" / "ck"
    umask = os.umask(0o022)
    try:
        args = ["convert", str(recipe_file), "--model", "draft", "--no-verify", "--out", str(out)]
        assert runner.invoke(cli, args).exit_code == 0
        assert runner.invoke(cli, args).exit_code == 0  # a checkpoint is replaced
    finally:
        os.umask(umask)
    assert (out / "rank0.safetensors").stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line_before_any_folder_is_made(runner, recipe_file, tmp_path):
    for cmd in (["convert"], ["quantize", "--target-format", "fp8"]):
        out = tmp_path / "new" / "ck"
        result = runner.invoke(cli, [*cmd, str(recipe_file), "--device", "cuda", "--out", str(out)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "device 'cuda' was asked for but torch sees no GPU; use --device cpu" in result.output
        assert not (tmp_path / "new").exists()


def test_quantize_quiet_prints_nothing_but_its_result(recipe_file, tmp_path):
    """In a fresh process (ModelOpt warns once, on its first import): no ModelOpt warning that the pinned
    transformers is incompatible (it is the stack the conversion path requires), no tokenizer length warning for
    calibration text that is cut into windows anyway."""
    import subprocess
    import sys

    calib = tmp_path / "calib.txt"
    calib.write_text(" ".join(CORPUS * 40))  # one document longer than the tiny model's positions
    args = ["quantize", str(recipe_file), "--model", "draft", "--draft-format", "fp8", "--no-verify", "-q"]
    args += ["--calib-data", str(calib), "--out", str(tmp_path / "q")]
    proc = subprocess.run(
        [sys.executable, "-m", "trtspec", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "incompatible with nvidia-modelopt" not in proc.stderr and "Token indices" not in proc.stderr, (
        proc.stderr
    )


def test_convert_draft_bf16_tp2_without_verify(runner, recipe_file, tmp_path):
    out = tmp_path / "d"
    args = ["convert", str(recipe_file), "--model", "draft", "--dtype", "bfloat16", "--tp-size", "2"]
    result = runner.invoke(cli, [*args, "--no-verify", "--out", str(out), "--json", "-q"])
    assert result.exit_code == 0, result.output
    (ckpt,) = json.loads(result.stdout)["checkpoints"]
    assert ckpt["verification"] is None and ckpt["tp_size"] == 2 and ckpt["dtype"] == "bfloat16"
    assert json.loads((out / "config.json").read_text())["mapping"]["tp_size"] == 2


def test_quantize_target_fp8_with_calibration_file(runner, recipe_file, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(CORPUS))
    args = [
        "quantize",
        str(recipe_file),
        "--model",
        "target",
        "--target-format",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
    ]
    args += [
        "--calib-data",
        str(calib),
        "--calib-size",
        "1000",
        "--calib-seq-len",
        "16",
        "--out",
        str(tmp_path / "q"),
    ]
    result = runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    # ModelOpt prints its quantizer lines on stdout; --json keeps stdout to the one document (they go to stderr).
    (checkpoint,) = json.loads(result.stdout)["checkpoints"]
    assert checkpoint["format"] == "fp8"
    assert "quantizers" in result.stderr
    # the calibration it ran on: the short text gives fewer windows than calibration.size asks, and says so
    used = checkpoint["calibration"]
    assert used["tokens_per_sample"] == 16 and 1 <= used["samples"] < 1000
    said = " ".join(result.stderr.split())  # the console wraps its lines
    assert f"on {used['samples']} x 16 tokens (calibration.size 1000: the text has no more)" in said
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert (
        config["quantization"]["quant_algo"] == "FP8"
        and config["quantization"]["kv_cache_quant_algo"] == "FP8"
    )


def test_quantize_awq_on_small_dims_is_a_clear_error(runner, recipe_file, tmp_path):
    args = [
        "quantize",
        str(recipe_file),
        "--model",
        "draft",
        "--draft-format",
        "int4_awq",
        "--out",
        str(tmp_path / "q"),
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert (
        "Error:" in result.output and "divisible by 128" in result.output and "Traceback" not in result.output
    )
    assert not (tmp_path / "q").exists()


def test_calibration_data_named_on_the_command_line_is_checked_before_any_model_loads(
    runner, recipe_file, tmp_path, monkeypatch
):
    """--calib-data is a path from the current folder (the recipe's calibration.dataset is from the recipe's),
    refused in one line when missing or not UTF-8 text, before ModelOpt or the models load."""
    from trtspec.cli import _calib_data

    work = tmp_path / "work"
    work.mkdir()
    (work / "calib.txt").write_text("def f():\n    return 1\n")
    monkeypatch.chdir(work)
    assert _calib_data(None, None, "calib.txt") == str(work / "calib.txt") and _calib_data(
        None, None, "builtin"
    )
    base = ["quantize", str(recipe_file), "--model=target", "--target-format=fp8", f"--out={tmp_path / 'q'}"]
    result = runner.invoke(cli, [*base, "--calib-data", "missing.txt"])
    assert (
        result.exit_code == 2
        and "Invalid value for '--calib-data': missing.txt: no such file" in result.output
    )
    (work / "blob.jsonl").write_bytes(b"\xe8\x00\x01" * 10)
    result = runner.invoke(cli, [*base, "--calib-data", "blob.jsonl"])
    assert result.exit_code == 2, result.output
    assert (
        f"calibration file {work / 'blob.jsonl'} is not UTF-8 text (byte 0); save it as UTF-8"
        in result.output
    )
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "q").exists()


@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_the_draft_of_a_recipe_without_one_is_one_line(runner, tiny_pair, tmp_path, command):
    """A recipe where prompt lookup proposes alone has no draft: asking for it names that, not a KeyError or the
    draft.model field that --model's own overrides would have started."""
    path = tmp_path / "ngram.yaml"
    data = {"name": "ng", "target": {"model": str(tiny_pair[0])}, "speculative": {"proposer": "ngram"}}
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(cli, [command, str(path), "--model", "draft", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"Error: {path}: draft: the recipe has no draft model (prompt lookup proposes alone); use --model target"
    ]
    assert not (tmp_path / "out").exists()


def test_convert_of_a_recipe_quantized_with_an_fp8_kv_cache_writes_the_unquantized_checkpoint(
    runner, tiny_pair, tmp_path
):
    """convert writes unquantized checkpoints whatever the recipe's quantization: the recipe's fp8 KV cache, valid
    beside its fp8 weights, goes with it rather than being refused as a recipe error."""
    target, draft = tiny_pair
    path = tmp_path / "fp8.yaml"
    quantized = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    data = {"name": "q", "target": {"model": str(target), **quantized}, "draft": {"model": str(draft)}}
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(
        cli, ["convert", str(path), "--model", "target", "--out", str(tmp_path / "ck"), "--json", "-q"]
    )
    assert result.exit_code == 0, result.output
    (checkpoint,) = json.loads(result.stdout)["checkpoints"]
    assert checkpoint["format"] == "none"


def test_a_split_one_model_cannot_take_is_refused_before_the_other_is_written(runner, recipe_file, tmp_path):
    """--pp-size 2 fits the 2-layer target, not the 1-layer draft: nothing is exported, so no rerun leaves a pair
    of mixed splits."""
    out = tmp_path / "ck"
    result = runner.invoke(
        cli, ["convert", str(recipe_file), "--pp-size", "2", "--no-verify", "--out", str(out)]
    )
    assert result.exit_code == 2 and "pp_size=2 must divide num_hidden_layers=1" in result.output, (
        result.output
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--model", "draft"],
            "quantize: no model it exports has a format (draft.quantization none); pass --draft-format",
        ),
        (
            ["--kv-cache-dtype", "fp8"],
            "(target.quantization and draft.quantization none); pass --target-format or",
        ),
        (
            ["--model", "draft", "--target-format", "fp8", "--draft-format", "fp8"],
            "--target-format names the target, which --model draft does not export",
        ),
        (["--model", "target", "--target-format", "none"], "--target-format none: quantize writes quantized"),
    ],
)
def test_quantize_refuses_options_under_which_it_would_quantize_nothing(
    runner, recipe_file, tmp_path, options, message
):
    """quantize writes quantized checkpoints: nothing it exports with a format, or a format for a model it does not
    export, is named by option before any work (a pair may keep one model unquantized beside a quantized one)."""
    result = runner.invoke(cli, ["quantize", str(recipe_file), *options, "--out", str(tmp_path / "q")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "q").exists()


def test_quantize_names_a_draft_format_for_a_recipe_without_a_draft(runner, tiny_pair, tmp_path):
    path = tmp_path / "ngram.yaml"
    data = {"name": "ng", "target": {"model": str(tiny_pair[0])}, "speculative": {"proposer": "ngram"}}
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(cli, ["quantize", str(path), "--target-format", "fp8", "--draft-format", "fp8"])
    assert result.exit_code == 2 and "--draft-format: the recipe has no draft model" in result.output
