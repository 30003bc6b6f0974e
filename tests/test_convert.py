"""HF -> TensorRT-LLM checkpoint conversion (real modelopt export on CPU), verified by the checkpoint interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_oracle import verify_checkpoint
from tiny_models import make_model

from trtspec.builders import interpreter
from trtspec.builders.convert import export_checkpoint
from trtspec.core.errors import CheckFailed, CheckpointError, ModelError
from trtspec.recipe import CalibrationSpec, ModelSpec

CALIB = CalibrationSpec(size=2, seq_len=16)

pytestmark = pytest.mark.conversion  # every test here runs ModelOpt


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, shared_tokenizer_dir) -> Path:
    """GQA (4 query / 2 kv heads) Llama with linear rope scaling and a non-default rope theta."""
    root = tmp_path_factory.mktemp("llama")
    return make_model(
        root / "hf", "llama", tokenizer_dir=shared_tokenizer_dir, num_key_value_heads=2,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=50000.0, rms_norm_eps=1e-5,
    )  # fmt: skip


@pytest.fixture(scope="module")
def llama_ckpt(llama_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "checkpoint"
    export_checkpoint(ModelSpec(model=llama_dir), out, calibration=CALIB, verify=False)
    return out


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("llama", {"num_key_value_heads": 2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
        ("mistral", {"num_key_value_heads": 1}),
        ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    ],
)  # fmt: skip
def test_convert_verifies_against_hf(tmp_path, shared_tokenizer_dir, arch, overrides):
    hf = make_model(tmp_path / "hf", arch, tokenizer_dir=shared_tokenizer_dir, **overrides)
    summary = export_checkpoint(ModelSpec(model=hf), tmp_path / "ckpt", calibration=CALIB)
    v = summary["verification"]
    assert v["passed"] and v["top1_agreement"] >= 0.99 and v["max_rel_logit_error"] < 0.01, v
    assert summary["files"] == ["config.json", "quant_cfg.json", "rank0.safetensors"]
    assert _files(tmp_path) == ["ckpt", "hf"]  # no temp dir left beside the output
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["num_key_value_heads"] == overrides["num_key_value_heads"]
    assert config["dtype"] == "float16" and config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}


def test_qwen2_config_marked_for_trtllm_qwen(tmp_path, shared_tokenizer_dir):
    hf = make_model(tmp_path / "hf", "qwen2", tokenizer_dir=shared_tokenizer_dir)
    export_checkpoint(ModelSpec(model=hf), tmp_path / "ckpt", calibration=CALIB, verify=False)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architecture"] == "Qwen2ForCausalLM" and config["qwen_type"] == "qwen2"
    assert config["decoder"] == "qwen" and config["attn_bias"] is True


def test_config_carries_rope_and_norm_settings(llama_ckpt):
    config = json.loads((llama_ckpt / "config.json").read_text())
    assert config["rotary_base"] == 50000.0 and config["norm_epsilon"] == 1e-5
    assert config["rotary_scaling"]["factor"] == 2.0 and config["head_size"] == 16


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2), (2, 2)])
def test_sharded_checkpoint_reassembles_to_the_same_logits(llama_dir, llama_ckpt, tmp_path, tp, pp):
    import torch

    out = tmp_path / "sharded"
    summary = export_checkpoint(ModelSpec(model=llama_dir, tp_size=tp, pp_size=pp), out, calibration=CALIB)
    assert summary["files"][-tp * pp :] == [f"rank{r}.safetensors" for r in range(tp * pp)]
    ids = torch.tensor([[1, 5, 9, 42, 7, 100, 3]])
    _, single = interpreter.load_checkpoint_module(llama_ckpt)
    _, sharded = interpreter.load_checkpoint_module(out)
    torch.testing.assert_close(
        interpreter.module_logits(sharded, ids), interpreter.module_logits(single, ids)
    )


def test_bf16_export(llama_dir, tmp_path):
    summary = export_checkpoint(
        ModelSpec(model=llama_dir, dtype="bfloat16"), tmp_path / "c", calibration=CALIB
    )
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "bfloat16"
    assert summary["verification"]["passed"]


# ---------------------------------------------------------------- the verifier can fail


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_verifier_catches_swapped_fc_and_gate(llama_dir, llama_ckpt, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = _copy(llama_ckpt, tmp_path / "bad")
    tensors = load_file(bad / "rank0.safetensors")
    for i in range(2):
        fc, gate = f"transformer.layers.{i}.mlp.fc.weight", f"transformer.layers.{i}.mlp.gate.weight"
        tensors[fc], tensors[gate] = tensors[gate], tensors[fc]
    save_file(tensors, bad / "rank0.safetensors")
    good = verify_checkpoint(llama_ckpt, llama_dir)
    swapped = verify_checkpoint(bad, llama_dir)
    assert good["passed"] and not swapped["passed"]
    assert swapped["max_rel_logit_error"] > 10 * good["max_rel_logit_error"]


@pytest.mark.parametrize(
    "key, value", [("rotary_base", 10000.0), ("norm_epsilon", 0.5), ("rotary_scaling", None)]
)
def test_verifier_reads_the_checkpoint_config(llama_dir, llama_ckpt, tmp_path, key, value):
    bad = _copy(llama_ckpt, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config[key] = value
    (bad / "config.json").write_text(json.dumps(config))
    assert not verify_checkpoint(bad, llama_dir)["passed"]


def test_planted_export_bug_fails_and_writes_nothing(llama_dir, tmp_path, monkeypatch):
    from trtspec.builders import convert

    real_export = convert.export_model

    def export_with_wrong_theta(model, decoder, spec, export_dir, hf_config):
        real_export(model, decoder, spec, export_dir, hf_config)
        config = json.loads((export_dir / "config.json").read_text())
        config["rotary_base"] = 10000.0  # the bug: the HF rope_theta (50000) is lost
        (export_dir / "config.json").write_text(json.dumps(config))

    monkeypatch.setattr(convert, "export_model", export_with_wrong_theta)
    with pytest.raises(CheckFailed, match="does not reproduce the HF model.*top-1 agreement"):
        export_checkpoint(ModelSpec(model=llama_dir), tmp_path / "out", calibration=CALIB)
    assert _files(tmp_path) == []


# ---------------------------------------------------------------- bad inputs: clear errors, no output


def test_missing_config_json(llama_dir, tmp_path):
    hf = _copy(llama_dir, tmp_path / "hf")
    (hf / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json"):
        export_checkpoint(ModelSpec(model=hf), tmp_path / "out", calibration=CALIB)
    assert not (tmp_path / "out").exists()


def test_corrupt_safetensors(llama_dir, tmp_path):
    hf = _copy(llama_dir, tmp_path / "hf")
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelError, match="model.safetensors|cannot load"):
        export_checkpoint(ModelSpec(model=hf), tmp_path / "out", calibration=CALIB)
    assert _files(tmp_path) == ["hf"]


def test_unsupported_architecture(llama_dir, tmp_path):
    hf = _copy(llama_dir, tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="architecture GPT2LMHeadModel is not supported"):
        export_checkpoint(ModelSpec(model=hf), tmp_path / "out", calibration=CALIB)
    assert _files(tmp_path) == ["hf"]


def test_checkpoint_errors(llama_dir, llama_ckpt, tmp_path):
    missing = _copy(llama_ckpt, tmp_path / "missing")
    (missing / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        verify_checkpoint(missing, llama_dir)
    corrupt = _copy(llama_ckpt, tmp_path / "corrupt")
    (corrupt / "rank0.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="rank0.safetensors: corrupt"):
        verify_checkpoint(corrupt, llama_dir)


def test_interrupted_stage_leaves_nothing(llama_dir, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(interpreter, "verify_against", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(ModelSpec(model=llama_dir), tmp_path / "out", calibration=CALIB)
    assert _files(tmp_path) == []


def test_rerun_replaces_existing_checkpoint(llama_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    export_checkpoint(ModelSpec(model=llama_dir), out, calibration=CALIB, verify=False)
    assert "stale.txt" not in _files(out) and _files(tmp_path) == ["out"]


def test_memory_check_refuses_before_loading(llama_dir, tmp_path, monkeypatch):
    from trtspec.builders import environment

    monkeypatch.setattr(environment, "available_bytes", lambda place: 1024)
    with pytest.raises(CheckFailed, match=r"needs about .* GiB of cpu memory at peak") as refused:
        export_checkpoint(ModelSpec(model=llama_dir), tmp_path / "out", calibration=CALIB)
    assert refused.value.message.endswith(
        f"GiB is available; use a machine with more memory, or {GPU} and {SKIP}"
    )


GPU = "load on the GPU (--device cuda, or calibration.device: cuda)"
SKIP = "skip verification (convert or quantize --no-verify)"


@pytest.mark.parametrize(
    ("place", "device", "verify", "remedy"),
    [
        ("cpu", "cpu", True, f"use a machine with more memory, or {GPU} and {SKIP}"),
        ("cpu", "cpu", False, f"use a machine with more memory, or {GPU}"),
        ("cpu", "cuda", True, f"{SKIP} or use a machine with more memory"),
        ("cpu", "cuda", False, "use a machine with more memory"),
        ("cuda", "cuda", True, "free the GPU or use one with more memory"),
    ],
)
def test_the_memory_remedy_lowers_the_peak_that_did_not_fit(place, device, verify, remedy):
    """What each remedy changes lowers that place's peak in conversion_peak_bytes (a bigger machine aside); on CPU
    neither the GPU alone nor skipping verification alone would."""
    from trtspec.builders.export_pipeline import _memory_remedy, conversion_peak_bytes

    def peak(on: str, check: bool) -> int:
        return conversion_peak_bytes(100, on, check)[place]

    assert _memory_remedy(place, device, verify) == remedy
    if GPU in remedy:
        assert peak("cuda", verify and SKIP not in remedy) < peak(device, verify)
    if remedy.startswith(SKIP):
        assert peak(device, False) < peak(device, verify)
    if (place, device, verify) == ("cpu", "cpu", True):
        assert peak("cuda", True) == peak("cpu", False) == peak("cpu", True)
