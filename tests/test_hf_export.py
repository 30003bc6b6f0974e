"""Quantized models as ModelOpt HF checkpoints for the trtllm-pytorch runtime (real modelopt 0.37 on CPU):
`trtspec build` writes them, checks them, skips them when up to date, and deploy's model.yaml points at them;
the check catches planted scale, layout and config mistakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file
from tiny_models import CORPUS, make_model

from trtspec.builders import support
from trtspec.builders.build import build
from trtspec.builders.hf_export import HF_QUANT_CONFIG, check_export, export_hf
from trtspec.builders.manifest import MANIFEST
from trtspec.cli import cli
from trtspec.core import layout
from trtspec.core.errors import CheckFailed
from trtspec.recipe import CalibrationSpec, ModelSpec, recipe_from_dict
from trtspec.triton_repo import llmapi
from trtspec.triton_repo.deploy import deploy


@pytest.fixture(scope="module")
def models(tmp_path_factory, shared_tokenizer_dir) -> tuple[Path, Path]:
    """(target, draft): dimensions divisible by 128 so every format (AWQ included) applies."""
    root = tmp_path_factory.mktemp("hfx")
    target = make_model(
        root / "target", "llama", tokenizer_dir=shared_tokenizer_dir, hidden_size=128, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, seed=1,
    )  # fmt: skip
    draft = make_model(
        root / "draft", "llama", tokenizer_dir=shared_tokenizer_dir, hidden_size=64, intermediate_size=128,
        num_attention_heads=2, num_hidden_layers=1, seed=2,
    )  # fmt: skip
    return target, draft


@pytest.fixture(scope="module")
def calib(tmp_path_factory) -> CalibrationSpec:
    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in CORPUS))
    return CalibrationSpec(dataset=str(path), size=4, seq_len=32)


@pytest.fixture(scope="module")
def fp8_export(models, calib, tmp_path_factory) -> tuple[Path, ModelSpec]:
    spec = ModelSpec(model=models[0], quantization="fp8", kv_cache_dtype="fp8")
    out = tmp_path_factory.mktemp("fp8") / "hf_checkpoint"
    export_hf(spec, out, calibration=calib)
    return out, spec


def _recipe(models, calib, **target):
    return recipe_from_dict(
        {
            "name": "pt",
            "target": {"model": str(models[0])} | target,
            "draft": {"model": str(models[1])},
            "speculative": {"max_draft_len": 4},
            "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
            "calibration": calib.model_dump(mode="json"),
            "triton": {"runtime": "trtllm-pytorch"},
        }
    )


@pytest.mark.conversion
def test_build_writes_the_quantized_target_as_a_checked_modelopt_hf_checkpoint(models, calib, tmp_path):
    recipe = _recipe(models, calib, quantization="fp8", kv_cache_dtype="fp8")
    result = build(recipe, tmp_path / "engines")
    hf = tmp_path / "engines" / "pt" / "target" / layout.QUANTIZED_HF_SUBDIR
    quant = json.loads((hf / HF_QUANT_CONFIG).read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert (hf / "tokenizer.json").is_file()  # self-contained: the LLM API reads the tokenizer from it too
    assert result.plan is None and result.ran == ["check", "target.hf_checkpoint"]
    assert not (tmp_path / "engines" / "pt" / "draft").exists()  # unquantized: served from its HF folder
    manifest = json.loads((tmp_path / "engines" / "pt" / MANIFEST).read_text())
    assert manifest["status"] == "complete" and manifest["plan"] is None
    summary = manifest["stages"]["target.hf_checkpoint"]["info"]["summary"]
    assert summary["check"]["quantized_layers"] == 14 and summary["check"]["max_dequant_error"] < 0.1
    # up to date: skipped; deploy's model.yaml loads the export and the draft's own checkpoint
    assert build(recipe, tmp_path / "engines").skipped == ["target.hf_checkpoint"]
    deploy(recipe, None, tmp_path / "repo", engines_dir=tmp_path / "engines")
    data = yaml.safe_load((tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["model"] == str(hf.resolve())
    assert data["speculative_config"][support.LLMAPI_SPECULATIVE_MODEL_KEY] == str(models[1].resolve())
    assert llmapi.hf_model_dirs(recipe, tmp_path / "engines")["target"] == hf.resolve()


@pytest.mark.parametrize("fmt", [pytest.param("int4_awq", marks=pytest.mark.slow), "w4a8_awq"])
@pytest.mark.conversion
def test_every_format_exports_with_its_quant_algo(models, calib, tmp_path, fmt):
    spec = ModelSpec(model=models[0], quantization=fmt)
    summary = export_hf(spec, tmp_path / "hf", calibration=calib)
    check = summary["check"]
    assert check["quant_algo"] == support.QUANT_FORMATS[fmt][1] and check["kv_cache_quant_algo"] is None
    assert check["quantized_layers"] == 14
    assert (check["max_dequant_error"] is None) == (fmt in ("int4_awq", "w4a8_awq"))  # packed: shapes only
    assert set(summary["timings"]) == {"load", "calibrate", "export", "check"}


@pytest.mark.conversion
def test_formats_the_pytorch_backend_cannot_run_and_models_without_safetensors_are_refused(
    models, calib, tmp_path
):
    with pytest.raises(CheckFailed, match="quantization int8_sq has no ModelOpt HF export"):
        export_hf(ModelSpec(model=models[0], quantization="int8_sq"), tmp_path / "a", calibration=calib)
    bin_model = tmp_path / "bin"
    bin_model.mkdir()
    for path in models[0].iterdir():
        if path.suffix != ".safetensors":
            (bin_model / path.name).write_bytes(path.read_bytes())
    with pytest.raises(CheckFailed, match=r"no \*\.safetensors weights"):
        export_hf(ModelSpec(model=bin_model, quantization="fp8"), tmp_path / "b", calibration=calib)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _planted(export: Path, tmp_path: Path, change) -> Path:
    """A copy of ``export`` with ``change(tensors, quant_config)`` applied."""
    copy = tmp_path / "planted"
    copy.mkdir()
    for path in export.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    tensors = load_file(copy / "model.safetensors")
    quant = json.loads((copy / HF_QUANT_CONFIG).read_text())
    change(tensors, quant)
    save_file(tensors, copy / "model.safetensors")
    (copy / HF_QUANT_CONFIG).write_text(json.dumps(quant))
    return copy


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t, q: t.update({"model.layers.1.mlp.up_proj.weight_scale": t["model.layers.1.mlp.up_proj.weight_scale"] * 4}),
            "dequantized weights differ from the original by",
        ),
        (
            lambda t, q: t.update({"model.layers.0.self_attn.q_proj.weight": t["model.layers.0.self_attn.q_proj.weight"].T.contiguous()[:, :128]}),
            "dequantized weights differ|has shape",
        ),
        (lambda t, q: t.pop("model.layers.0.mlp.down_proj.weight_scale"), "down_proj is not quantized"),
        (lambda t, q: q["quantization"].update(kv_cache_quant_algo=None), "kv_cache_quant_algo None, expected FP8 / FP8"),
        (lambda t, q: t.update({"lm_head.weight": t["lm_head.weight"].float()}), "lm_head.weight is torch.float32"),
    ],
    ids=["scale", "transposed", "missing-scale", "kv-config", "lm-head-dtype"],
)  # fmt: skip
@pytest.mark.conversion
def test_check_catches_planted_mistakes(fp8_export, tmp_path, change, message):
    export, spec = fp8_export
    assert check_export(export, spec, spec.model)["max_dequant_error"] < 0.1
    with pytest.raises(CheckFailed, match=message):
        check_export(_planted(export, tmp_path, change), spec, spec.model)


def test_engines_only_is_refused_for_trtllm_pytorch(runner, models, calib, tmp_path):
    recipe_file = tmp_path / "pt.yaml"
    recipe = _recipe(models, calib, quantization="fp8")
    recipe_file.write_text(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True)))
    result = runner.invoke(
        cli, ["build", str(recipe_file), "--engines-only", "--engines-dir", str(tmp_path / "e")]
    )
    assert result.exit_code == 2
    assert "triton.runtime: trtllm-pytorch has no engines; drop --engines-only" in result.output
    assert not (tmp_path / "e").exists()


@pytest.mark.conversion
def test_runtime_option_gives_check_and_build_the_runtime_deploy_will_use(runner, models, calib, tmp_path):
    """A recipe written for tensorrtllm, run as trtllm-pytorch (the container's TRTSPEC_RUNTIME override)."""
    recipe = _recipe(models, calib, quantization="int8_sq")
    data = recipe.model_dump(mode="json", exclude_none=True)
    data["triton"]["runtime"] = "tensorrtllm"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))

    def runtime_check(*extra):
        result = runner.invoke(cli, ["check", str(path), "--json", *extra])
        return next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "runtime")

    refused = runtime_check("--runtime", "trtllm-pytorch")
    assert refused["status"] == "fail"
    assert refused["message"].startswith("target.quantization int8_sq: TensorRT-LLM's PyTorch backend")
    assert runtime_check()["status"] != "fail"  # the recipe's own runtime (engines) runs int8_sq
    data["target"]["quantization"] = "fp8"
    path.write_text(yaml.safe_dump(data))
    engines = tmp_path / "engines"
    built = runner.invoke(
        cli, ["build", str(path), "--runtime", "trtllm-pytorch", "--engines-dir", str(engines)]
    )
    assert built.exit_code == 0, built.output
    assert (engines / "pt" / "target" / layout.QUANTIZED_HF_SUBDIR / HF_QUANT_CONFIG).is_file()
    assert not (engines / "pt" / "target" / "checkpoint").exists()
