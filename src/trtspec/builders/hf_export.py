"""A quantized model as a ModelOpt Hugging Face checkpoint, for the ``trtllm-pytorch`` runtime.

TensorRT-LLM's PyTorch backend loads quantized models from ModelOpt's unified HF export (``hf_quant_config.json``
+ a ``quantization_config`` in config.json + quantized safetensors), not from TensorRT-LLM checkpoints. ``export_hf``
runs the four stages of ``export_pipeline.run_export``, as ``convert.export_checkpoint`` does: load, calibrate
(modelopt ``mtq.quantize`` with the recipe's calibration data), export (``modelopt.torch.export.export_hf_checkpoint``
+ the tokenizer, so the directory is self-contained), and check (``check_export``), all in a temp dir renamed into
place on success.

``check_export`` reads the files back without TensorRT-LLM, one tensor at a time: the quant_algo /
kv_cache_quant_algo TensorRT-LLM keys on, every decoder linear layer quantized with the storage dtype and shapes of
the format, lm_head kept in the model dtype, and for fp8 the dequantized weights against the original ones (scale
or layout mistakes show up as errors near or above 100 %; int4 packing is checked by shape only). The formats are
those the PyTorch backend runs (``support.LLMAPI_QUANT_FORMATS``).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.builders import support
from trtspec.builders.environment import require_conversion_stack
from trtspec.builders.export_pipeline import (
    ExportSteps,
    check_shapes,
    require_conversion_memory,
    run_export,
)
from trtspec.core.errors import CheckFailed, CheckpointError
from trtspec.core.model_dir import read_hf_config, safetensors_files
from trtspec.recipe import CalibrationSpec, ModelSpec

HF_QUANT_CONFIG = "hf_quant_config.json"
# Storage dtype of a quantized linear weight per recipe format (AWQ packs two int4 values per byte along dim 0).
WEIGHT_DTYPES = {"fp8": "float8_e4m3fn", "int4_awq": "uint8", "w4a8_awq": "uint8"}
PACKED_FORMATS = ("int4_awq", "w4a8_awq")
# Largest dequantization error, relative to the layer's largest original weight, that is still quantization noise
# (measured on random tiny models: fp8 ~4 %); a wrong scale or layout gives >= 100 %.
MAX_DEQUANT_ERROR = 0.10


def export_hf(
    spec: ModelSpec,
    out_dir: Path,
    *,
    calibration: CalibrationSpec,
    device: str = "cpu",
    console=None,
) -> dict:
    """Quantize ``spec`` with modelopt and write its ModelOpt HF checkpoint to ``out_dir`` atomically, checked.

    Returns a JSON-able summary (model, format, files, check results, timings). Raises ModelError (bad input),
    CheckpointError (modelopt could not export) or CheckFailed (memory, or the export failed its check).
    """
    require_conversion_stack()
    formats = [f for f in support.LLMAPI_QUANT_FORMATS if f != "none"]
    if spec.quantization not in formats:
        raise CheckFailed(
            f"{spec.model}: quantization {spec.quantization} has no ModelOpt HF export for TensorRT-LLM's PyTorch "
            f"backend; use one of {', '.join(formats)} (or none: the HF checkpoint is served as is)"
        )
    out_dir = Path(out_dir)
    if not safetensors_files(spec.model):
        raise CheckFailed(f"{spec.model}: {support.SAFETENSORS_NEEDED}")
    hf_config = read_hf_config(spec.model)
    check_shapes(spec, hf_config)
    require_conversion_memory(spec.model, device, verify=False)

    def export(model, tokenizer, tmp: Path) -> None:
        _export(model, spec, tmp)
        tokenizer.save_pretrained(tmp)

    def check(tmp: Path, loaded) -> dict:
        return check_export(tmp, spec, Path(spec.model))

    steps = ExportSteps(
        f"{spec.quantization} ModelOpt HF checkpoint",
        export,
        check_stage=("check", "quantization config, layers and scales"),
        check=check,
    )
    run = run_export(
        spec, out_dir, steps, calibration=calibration, device=device, console=console,
        label=out_dir.parent.name or str(out_dir),
    )  # fmt: skip
    checked = run.checked
    if console is not None:
        console.print(
            f"[green]check:[/] {checked['quant_algo']} on {checked['quantized_layers']} layers"
            + (
                f", max dequantization error {checked['max_dequant_error']:.2%}"
                if checked["max_dequant_error"] is not None
                else ""
            )
        )
    return {
        "model": str(spec.model),
        "hf_checkpoint": str(out_dir),
        "format": spec.quantization,
        "dtype": spec.dtype,
        "kv_cache_dtype": spec.kv_cache_dtype,
        "files": run.files,
        "check": checked,
        "calibration": run.calibration,
        "timings": run.timings,
    }


def _export(model, spec: ModelSpec, export_dir: Path) -> None:
    import contextlib
    import os
    import warnings

    import torch
    from modelopt.torch.export import export_hf_checkpoint

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
            warnings.simplefilter("ignore")
            # Calibrated in float32 on CPU; unquantized layers (lm_head, norms, embeddings) ship in the model dtype.
            dtype = getattr(torch, spec.dtype)
            export_hf_checkpoint(model.to(dtype), dtype=dtype, export_dir=export_dir)
    except (NotImplementedError, AssertionError, ValueError, KeyError) as err:
        raise CheckpointError(
            f"{spec.model}: modelopt could not export a {spec.quantization} HF checkpoint: {err}",
            detail=repr(err),
        ) from None


class _Tensors:
    """The tensors of a folder's safetensors files, read one at a time (a 70B model never sits in memory)."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self.files = {}
        for path in safetensors_files(directory):
            handle = safe_open(str(path), "pt")
            self.files.update(dict.fromkeys(handle.keys(), handle))

    def names(self) -> list[str]:
        return sorted(self.files)

    def get(self, name: str):
        handle = self.files.get(name)
        return None if handle is None else handle.get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.files[name].get_slice(name).get_shape())


def check_export(export_dir: Path, spec: ModelSpec, original_dir: Path) -> dict:
    """The export is what TensorRT-LLM's PyTorch backend expects for ``spec`` (see the module docstring).

    Raises CheckFailed naming the file and the first problem; returns what was checked.
    """
    export_dir = Path(export_dir)
    where = export_dir / HF_QUANT_CONFIG
    try:
        quant = json.loads(where.read_text())["quantization"]
        config = json.loads((export_dir / "config.json").read_text())
    except (OSError, ValueError, KeyError) as err:
        raise CheckFailed(f"{where}: not a ModelOpt HF export ({err})") from None
    algo = support.QUANT_FORMATS[spec.quantization][1]
    kv_algo = "FP8" if spec.kv_cache_dtype == "fp8" else None
    if quant.get("quant_algo") != algo or quant.get("kv_cache_quant_algo") != kv_algo:
        raise CheckFailed(
            f"{where}: quant_algo {quant.get('quant_algo')} / kv_cache_quant_algo {quant.get('kv_cache_quant_algo')}, "
            f"expected {algo} / {kv_algo} for {spec.quantization} with kv_cache_dtype {spec.kv_cache_dtype}"
        )
    if config.get("quantization_config", {}).get("quant_method") != "modelopt":
        raise CheckFailed(f"{export_dir / 'config.json'}: no ModelOpt quantization_config")
    exported, original = _Tensors(export_dir), _Tensors(original_dir)
    linears = [
        name[: -len(".weight")]
        for name in original.names()
        if name.endswith(".weight") and ".layers." in name and len(original.shape(name)) == 2
    ]
    if not linears:
        raise CheckFailed(f"{original_dir}: no decoder linear layers found in its safetensors")
    worst = None
    for name in linears:
        error = _check_linear(name, exported, original.get(f"{name}.weight"), spec.quantization, export_dir)
        if error is not None:
            worst = error if worst is None else max(worst, error)
    head = exported.get("lm_head.weight")
    if head is not None and str(head.dtype).removeprefix("torch.") != spec.dtype:
        raise CheckFailed(
            f"{export_dir}: lm_head.weight is {head.dtype}; it must stay {spec.dtype} (unquantized)"
        )
    if worst is not None and worst > MAX_DEQUANT_ERROR:
        raise CheckFailed(
            f"{export_dir}: dequantized weights differ from the original by {worst:.0%} of the largest weight "
            f"(limit {MAX_DEQUANT_ERROR:.0%}): wrong scales or layout; nothing was written"
        )
    return {
        "quant_algo": algo,
        "kv_cache_quant_algo": kv_algo,
        "quantized_layers": len(linears),
        "max_dequant_error": worst,
    }


def _check_linear(
    name: str, exported: _Tensors, original, quantization: str, export_dir: Path
) -> float | None:
    """One linear layer's storage; for fp8 its dequantization error relative to max |original|."""
    weight, scale = exported.get(f"{name}.weight"), exported.get(f"{name}.weight_scale")
    if weight is None or scale is None:
        raise CheckFailed(f"{export_dir}: {name} is not quantized (no weight / weight_scale)")
    want = WEIGHT_DTYPES[quantization]
    if str(weight.dtype).removeprefix("torch.") != want:
        raise CheckFailed(
            f"{export_dir}: {name}.weight is {weight.dtype}, expected {want} for {quantization}"
        )
    out_features, in_features = original.shape
    packed = quantization in PACKED_FORMATS
    expected_shape = (out_features // 2, in_features) if packed else (out_features, in_features)
    if tuple(weight.shape) != expected_shape:
        raise CheckFailed(
            f"{export_dir}: {name}.weight has shape {tuple(weight.shape)}, expected {expected_shape} "
            f"(original {tuple(original.shape)})"
        )
    if packed:
        return None
    dequant = weight.float() * (scale.float()[:, None] if scale.dim() == 1 else scale.float())
    reference = original.float()
    return float((dequant - reference).abs().max() / reference.abs().max().clamp_min(1e-12))
