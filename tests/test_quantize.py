"""Post-training quantization (real modelopt on CPU) to fp8 / int8_sq / int4_awq / w4a8_awq checkpoints, verified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_oracle import verify_checkpoint
from tiny_models import CORPUS, make_model

from trtspec.builders import interpreter, support
from trtspec.builders.calibration import builtin_texts, calibration_batches
from trtspec.builders.convert import export_checkpoint
from trtspec.core import vocab
from trtspec.core.errors import ModelError, RecipeError
from trtspec.recipe import CalibrationSpec, ModelSpec

VOCAB = 330  # not a multiple of 64: exercises the AWQ vocab padding


@pytest.fixture(scope="module")
def awq_ready_dir(tmp_path_factory, shared_tokenizer_dir) -> Path:
    """Dimensions divisible by 128 so every format applies."""
    root = tmp_path_factory.mktemp("q")
    return make_model(
        root / "hf", "llama", tokenizer_dir=shared_tokenizer_dir, hidden_size=128, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, vocab_size=VOCAB,
    )  # fmt: skip


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in CORPUS))
    return path


def _quantize(model_dir: Path, out: Path, fmt: str, calib: str, kv: str = "auto") -> dict:
    spec = ModelSpec(model=model_dir, quantization=fmt, kv_cache_dtype=kv)
    return export_checkpoint(spec, out, calibration=CalibrationSpec(dataset=calib, size=4, seq_len=32))


@pytest.mark.parametrize(
    "fmt, kv",
    [
        ("fp8", "fp8"),
        ("int8_sq", "auto"),
        pytest.param("int4_awq", "auto", marks=pytest.mark.slow),
        pytest.param("w4a8_awq", "auto", marks=pytest.mark.slow),
    ],
)
@pytest.mark.conversion
def test_quantized_checkpoint_within_tolerance(awq_ready_dir, calib_file, tmp_path, fmt, kv):
    summary = _quantize(awq_ready_dir, tmp_path / "ckpt", fmt, str(calib_file), kv)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    algo = support.QUANT_FORMATS[fmt][1]
    assert config["quantization"]["quant_algo"] == algo
    assert config["quantization"]["kv_cache_quant_algo"] == ("FP8" if kv == "fp8" else None)
    v = summary["verification"]
    assert v["passed"] and v["quant_algo"] == algo, v
    assert set(summary["timings"]) == {"load", "calibrate", "export", "verify"}
    assert (summary["warning"] is None) == (fmt in support.DTM_SUPPORTED_PRECISIONS)
    rows = interpreter.read_ranks(tmp_path / "ckpt", 1)[0]["lm_head.weight"].shape[0]
    assert rows == vocab.padded_vocab_size(VOCAB, 1, fmt)
    # the layers' linears are stored quantized, each with its scale (the verifier reads a weight without one as
    # plain float, so its tolerance alone would pass an export that left them in fp16)
    import torch
    from safetensors.torch import load_file

    stored = {
        "fp8": torch.float8_e4m3fn,
        "int8_sq": torch.int8,
        "int4_awq": torch.int8,
        "w4a8_awq": torch.int8,
    }
    tensors = load_file(tmp_path / "ckpt" / "rank0.safetensors")
    linears = [
        name[: -len(".weight")]
        for name in tensors
        if name.startswith("transformer.layers.") and name.endswith(".weight")
        and name[: -len(".weight")].endswith(interpreter.LINEARS)
    ]  # fmt: skip
    assert len(linears) >= 4
    for prefix in linears:
        weight = tensors[f"{prefix}.weight"]
        assert weight.dtype == stored[fmt] and f"{prefix}.weights_scaling_factor" in tensors, prefix
        if fmt in ("int4_awq", "w4a8_awq"):  # two int4 per byte
            assert (
                weight.numel() * 2 == tensors[f"{prefix}.weights_scaling_factor"].shape[0] * weight.shape[-1]
            )


@pytest.mark.conversion
def test_verifier_catches_swapped_fc_and_gate_in_a_quantized_checkpoint(awq_ready_dir, calib_file, tmp_path):
    from safetensors.torch import load_file, save_file

    spec = ModelSpec(model=awq_ready_dir, quantization="int8_sq")
    out = tmp_path / "ckpt"
    export_checkpoint(
        spec, out, calibration=CalibrationSpec(dataset=str(calib_file), size=4, seq_len=32), verify=False
    )
    tensors = load_file(out / "rank0.safetensors")
    prefix = "transformer.layers.0.mlp."
    for leaf in ("weight", "weights_scaling_factor", "prequant_scaling_factor", "activation_scaling_factor"):
        tensors[prefix + "fc." + leaf], tensors[prefix + "gate." + leaf] = (
            tensors[prefix + "gate." + leaf], tensors[prefix + "fc." + leaf],
        )  # fmt: skip
    save_file(tensors, out / "rank0.safetensors")
    assert not verify_checkpoint(out, awq_ready_dir)["passed"]


@pytest.mark.parametrize("fmt", ["int4_awq", "w4a8_awq"])
@pytest.mark.conversion
def test_awq_on_dimensions_not_divisible_by_128(tmp_path, shared_tokenizer_dir, fmt):
    hf = make_model(tmp_path / "hf", "llama", tokenizer_dir=shared_tokenizer_dir)  # hidden 64
    with pytest.raises(ModelError, match=r"divisible by 128 per rank, but hidden_size=64"):
        _quantize(hf, tmp_path / "out", fmt, "builtin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_the_awq_shape_remedy_offers_a_smaller_tp_size_only_where_it_helps():
    """A per-rank size that fails can be fixed by merging ranks, where there are ranks to merge; at tp_size 1
    nothing is left to merge."""
    from trtspec.builders.export_pipeline import check_shapes
    from trtspec.recipe import ModelSpec

    def said(tp_size: int, **dims) -> str:
        config = {"num_attention_heads": 8, "hidden_size": 1024, "intermediate_size": 4096} | dims
        spec = ModelSpec.model_validate(
            {"model": "/m", "quantization": "int4_awq", "tp_size": tp_size}, context={"check_paths": False}
        )
        with pytest.raises(ModelError) as refused:
            check_shapes(spec, config)
        return refused.value.message

    assert said(1, hidden_size=1000).endswith(
        "hidden_size=1000, num_attention_heads*head_dim/tp_size=1000; use fp8 or int8_sq"
    )
    assert said(8, intermediate_size=2816).endswith(
        "intermediate_size/tp_size=352; use fp8 or int8_sq, or a smaller tp_size"
    )


@pytest.mark.conversion
def test_an_empty_calibration_file_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A large model's load takes minutes: the calibration file is read and tokenized first."""
    from trtspec.builders import export_pipeline

    loads = []
    monkeypatch.setattr(export_pipeline, "load_source_model", lambda *args: loads.append(args))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    spec = ModelSpec(model=make_model(tmp_path / "model", "llama"), quantization="int8_sq")
    with pytest.raises(RecipeError, match="has no text"):
        export_checkpoint(spec, tmp_path / "out", calibration=CalibrationSpec(dataset=str(empty)))
    assert loads == [] and not (tmp_path / "out").exists()


@pytest.mark.conversion
def test_awq_tensor_parallel_splits_below_the_group_size(awq_ready_dir, tmp_path):
    spec = ModelSpec(model=awq_ready_dir, quantization="int4_awq", tp_size=2)
    with pytest.raises(ModelError, match=r"num_attention_heads\*head_dim/tp_size=64"):
        export_checkpoint(spec, tmp_path / "out", calibration=CalibrationSpec())
    assert not (tmp_path / "out").exists()


def test_padded_vocab_matches_modelopt():
    assert vocab.padded_vocab_size(330, 1, "int4_awq") == 384
    assert vocab.padded_vocab_size(330, 4, "w4a8_awq") == 384
    assert vocab.padded_vocab_size(331, 2, "fp8") == 332


# ---------------------------------------------------------------- calibration data


def test_builtin_calibration_is_deterministic_stdlib_code(shared_tokenizer_dir):
    from transformers import AutoTokenizer

    texts = builtin_texts(max_files=20)
    assert texts == builtin_texts(max_files=20) and any("def " in t for t in texts)
    tokenizer = AutoTokenizer.from_pretrained(shared_tokenizer_dir)
    batches = calibration_batches(tokenizer, "builtin", 3, 16)
    assert [tuple(b.shape) for b in batches] == [(1, 16)] * 3


def test_text_and_jsonl_calibration_files(shared_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(shared_tokenizer_dir)
    txt = tmp_path / "c.txt"
    txt.write_text("\n".join(CORPUS))
    assert len(calibration_batches(tokenizer, str(txt), 2, 8)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(RecipeError, match="calibration.dataset: line 2 is not JSON"):
        calibration_batches(tokenizer, str(bad), 2, 8)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(RecipeError, match="has no text"):
        calibration_batches(tokenizer, str(empty), 2, 8)
