"""The skeleton both ModelOpt exports run: load -> calibrate -> export -> check, in a temp dir renamed into place.

``convert.export_checkpoint`` (a TensorRT-LLM checkpoint, checked by the checkpoint interpreter against the HF
model's logits) and ``hf_export.export_hf`` (a ModelOpt HF checkpoint for trtllm-pytorch, checked by reading its
tensors back) differ only in what they export and how they check it: ``ExportSteps``. Everything else is here
once: the input checks both run before any work (layer shapes, memory for the conversion), post-training
quantization with the recipe's calibration data, and the progress lines of each stage.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.builders import environment, support
from trtspec.core.errors import CheckFailed, ModelError
from trtspec.core.model_dir import count_parameters, load_source_model, load_tokenizer
from trtspec.outputs import atomic_dir
from trtspec.recipe import CalibrationSpec, ModelSpec

KV_CACHE_CFG = "FP8_KV_CFG"


# ---------------------------------------------------------------- input checks (before any work)


def check_shapes(spec: ModelSpec, hf_config: dict) -> None:
    """ModelError unless the format's kernels and the tp/pp split take the model's layer sizes."""
    if problem := support.split_problem(spec, hf_config):
        raise ModelError(f"{spec.model}: {problem}")


def conversion_peak_bytes(num_parameters: int, device: str, verify: bool) -> dict[str, int]:
    """Peak memory per place, in bytes: the loaded model (fp32 on CPU, 16-bit on GPU) + its exported 16-bit copy,
    then (after the model is freed) the verifier's float32 module + the checkpoint's tensors, both on CPU."""
    load = num_parameters * (4 if device == "cpu" else 2)
    export = num_parameters * 2
    verify_bytes = num_parameters * (4 + 2) if verify else 0
    if device == "cpu":
        return {"cpu": max(load + export, verify_bytes)}
    return {"cuda": load, "cpu": max(export, verify_bytes)}


def require_conversion_memory(model_dir: Path, device: str, verify: bool) -> None:
    """CheckFailed if converting ``model_dir`` on ``device`` would not fit the host / CUDA memory free at this
    moment. Without weight files nothing is counted: the load fails later with its own one-line error."""
    need = conversion_peak_bytes(count_parameters(model_dir) or 0, device, verify)
    for place, bytes_needed in need.items():
        free = environment.available_bytes(place)
        if free is not None and bytes_needed > free:
            raise CheckFailed(
                f"{model_dir}: converting needs about {bytes_needed / 2**30:.1f} GiB of {place} memory at peak, "
                f"{free / 2**30:.1f} GiB is available; {_memory_remedy(place, device, verify)}"
            )


def _memory_remedy(place: str, device: str, verify: bool) -> str:
    """What lowers the peak that did not fit (conversion_peak_bytes): on CPU the float32 load and the verifier's
    float32 copy peak alike, so only the GPU taking the load and no verification together lower it. build runs
    both steps from the recipe; convert and quantize take the flags."""
    gpu = "load on the GPU (--device cuda, or calibration.device: cuda)"
    skip = "skip verification (convert or quantize --no-verify)"
    if place == "cuda":
        return "free the GPU or use one with more memory"
    if device == "cpu":
        return f"use a machine with more memory, or {gpu}" + (f" and {skip}" if verify else "")
    return f"{skip} or use a machine with more memory" if verify else "use a machine with more memory"


def export_bytes(spec: ModelSpec) -> int:
    """About what an export of ``spec`` writes: its parameters at the precision it is exported in (the disk space a
    full disk's error asks for)."""
    precision = support.effective_precision(spec.dtype, spec.quantization)
    return int((count_parameters(spec.model) or 0) * support.WEIGHT_BYTES[precision])


# ---------------------------------------------------------------- quantization


def modelopt_quantization():
    """modelopt.torch.quantization, imported without ModelOpt's warning that transformers 4.57.3 is incompatible
    with it: that pair is the stack TensorRT-LLM 1.2.1's image ships and the conversion path requires
    (environment.require_conversion_stack), so the warning would only tell users their install is wrong."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="transformers version .* is incompatible with nvidia-modelopt"
        )
        import modelopt.torch.quantization as mtq
    return mtq


def quant_config(quantization: str, kv_cache_dtype: str) -> dict:
    """The modelopt quantization config of a recipe format (support.QUANT_FORMATS), plus the fp8 KV cache."""
    mtq = modelopt_quantization()

    name = support.QUANT_FORMATS[quantization][0]
    cfg = copy.deepcopy(getattr(mtq, name))
    if kv_cache_dtype == "fp8":
        cfg["quant_cfg"].update(copy.deepcopy(getattr(mtq, KV_CACHE_CFG)["quant_cfg"]))
        cfg["quant_cfg"].pop("default", None)
        cfg["quant_cfg"]["default"] = {"enable": False}
    return cfg


def quantize_model(model, spec: ModelSpec, batches: list) -> Any:
    """Post-training quantization of ``model`` in place, calibrated on ``batches`` ([1, seq] token tensors)."""
    import torch

    mtq = modelopt_quantization()

    device = next(model.parameters()).device

    def forward_loop(m) -> None:
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids.to(device))

    return mtq.quantize(model, quant_config(spec.quantization, spec.kv_cache_dtype), forward_loop)


def calibration_batches_for(tokenizer, calibration: CalibrationSpec) -> list:
    from trtspec.builders.calibration import calibration_batches

    return calibration_batches(tokenizer, calibration.dataset, calibration.size, calibration.seq_len)


# ---------------------------------------------------------------- the skeleton


class Stages:
    """Prints each stage (load, calibrate, export, verify) with a spinner and records its duration in seconds."""

    def __init__(self, console, label: str):
        self.console, self.label, self.timings = console, label, {}

    @contextlib.contextmanager
    def __call__(self, name: str, what: str):
        start = time.perf_counter()
        if self.console is None:
            yield
        else:
            with self.console.status(f"[bold]{self.label}[/] {name}: {what}"):
                yield
        self.timings[name] = round(time.perf_counter() - start, 3)
        if self.console is not None:
            self.console.print(f"[green]✓[/] {self.label} {name} ({self.timings[name]:.1f} s) {what}")


def _nothing(*args) -> None:
    return None


@dataclass(frozen=True)
class ExportSteps:
    """What one export adds to the skeleton.

    ``export(model, tokenizer, tmp)`` writes the output (``export_what`` is its progress line). ``on_load(model,
    tokenizer)`` runs in the load stage, before calibration changes the model; its result goes to ``check``.
    ``check(tmp, loaded)`` runs in its own stage (``check_stage``: name, progress line) and returns what it found;
    ``accept(found)`` then reports it and raises to keep nothing. No ``check``: no check stage.
    """

    export_what: str
    export: Callable[[Any, Any, Path], None]
    check_stage: tuple[str, str] = ("check", "")
    check: Callable[[Path, Any], Any] | None = None
    on_load: Callable[[Any, Any], Any] = _nothing
    accept: Callable[[Any], None] = _nothing


@dataclass
class ExportRun:
    """What ``run_export`` wrote: the output's file names, the check's result (None without one), stage timings, and
    the calibration it ran on (None unquantized): samples x tokens, which a short text makes fewer than asked."""

    files: list[str]
    checked: Any
    timings: dict[str, float]
    calibration: dict | None = None


def run_export(
    spec: ModelSpec,
    out_dir: Path,
    steps: ExportSteps,
    *,
    calibration: CalibrationSpec,
    device: str,
    console,
    label: str,
) -> ExportRun:
    """Load ``spec``'s HF model on ``device``, calibrate and quantize it unless its quantization is none, export
    and check it, all into a temp dir renamed to ``out_dir`` only when nothing raised."""
    stages = Stages(console, label)
    with atomic_dir(out_dir, need_bytes=export_bytes(spec)) as tmp:
        with stages("load", f"{spec.model} on {device}"):
            tokenizer = load_tokenizer(spec.model, spec.trust_remote_code)
            # before the model: an unusable calibration file is refused without waiting for a large load
            quantize = spec.quantization != "none"
            batches = calibration_batches_for(tokenizer, calibration) if quantize else []
            model = load_source_model(spec.model, device, spec.dtype, spec.trust_remote_code)
            loaded = steps.on_load(model, tokenizer)
        used = None
        if quantize:
            used = {"samples": len(batches), "tokens_per_sample": batches[0].shape[1]}
            short = (
                f" (calibration.size {calibration.size}: the text has no more)"
                if len(batches) < calibration.size
                else ""
            )
            with stages(
                "calibrate",
                f"{spec.quantization} on {len(batches)} x {used['tokens_per_sample']} tokens{short}",
            ):
                model = quantize_model(model, spec, batches)
        with stages("export", steps.export_what):
            steps.export(model, tokenizer, tmp)
        del model
        gc.collect()
        checked = None
        if steps.check is not None:
            with stages(*steps.check_stage):
                checked = steps.check(tmp, loaded)
            steps.accept(checked)
        files = sorted(p.name for p in tmp.iterdir())
    return ExportRun(files, checked, stages.timings, used)
