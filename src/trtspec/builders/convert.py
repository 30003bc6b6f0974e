"""Hugging Face -> TensorRT-LLM checkpoint, fp16/bf16 or quantized, through nvidia-modelopt 0.37.

``export_checkpoint`` runs four stages (load, calibrate, export, verify), each reported on a rich console:
1. inspect the HF directory (config, architecture, AWQ shapes) and refuse a model that will not fit in memory;
2. load it and, when verifying, compute reference logits of the unquantized model on a few prompts;
3. quantize with ``modelopt.torch.quantization.quantize`` (calibration forward loop) for fp8 / int8_sq / int4_awq /
   w4a8_awq, then ``export_tensorrt_llm_checkpoint`` into a temp dir next to ``out_dir``;
4. run the checkpoint interpreter (builders/interpreter.py) and compare logits; rename into place only on success.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from trtspec.builders import support
from trtspec.builders.environment import require_conversion_stack
from trtspec.core import layout
from trtspec.core.errors import CheckFailed, CheckpointError, ModelError
from trtspec.core.model_dir import count_parameters, load_source_model, load_tokenizer, read_hf_config
from trtspec.outputs import atomic_dir
from trtspec.recipe import CalibrationSpec, ModelSpec

KV_CACHE_CFG = "FP8_KV_CFG"
# modelopt 0.37's TensorRT-LLM export has no "qwen" decoder (tensorrt_llm_utils raises NotImplementedError);
# Qwen2/3 are Llama-shaped (+ qkv bias / qk-norm), so they go through its "llama" path.
MODELOPT_DECODER = {"qwen": "llama"}
AWQ_FORMATS = ("int4_awq", "w4a8_awq")


# ---------------------------------------------------------------- inspecting the HF model


def hf_vocab_size(model_dir: Path) -> int:
    """vocab_size of a Hugging Face checkpoint (its text config's, for a multimodal config such as Gemma 3's)."""
    config = read_hf_config(model_dir)
    return int(config.get("text_config", config).get("vocab_size") or config["vocab_size"])


def decoder_type(hf_config: dict, model_dir: Path) -> str:
    problem = support.convert_problem(hf_config)
    if problem:
        raise ModelError(f"{model_dir}/config.json: {problem}")
    return support.SUPPORTED_ARCHITECTURES[hf_config["architectures"][0]]


def awq_shape_problems(hf_config: dict, tp_size: int, group: int = support.AWQ_GROUP_SIZE) -> list[str]:
    """Input dimensions each rank's AWQ GEMMs see must be multiples of the group size (modelopt/TRT-LLM kernels)."""
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    dims = {
        "hidden_size": hf_config["hidden_size"],
        "num_attention_heads*head_dim/tp_size": heads * head_dim // tp_size,
        "intermediate_size/tp_size": hf_config["intermediate_size"] // tp_size,
    }
    return [f"{name}={value}" for name, value in dims.items() if value % group]


def check_shapes(spec: ModelSpec, hf_config: dict) -> None:
    if spec.quantization in AWQ_FORMATS:
        problems = awq_shape_problems(hf_config, spec.tp_size)
        if problems:
            raise ModelError(
                f"{spec.model}: {spec.quantization} needs layer input sizes divisible by {support.AWQ_GROUP_SIZE} "
                f"per rank, but {', '.join(problems)}; use fp8 or int8_sq, or a smaller tp_size"
            )
    heads = hf_config["num_attention_heads"]
    if heads % spec.tp_size or hf_config["intermediate_size"] % spec.tp_size:
        raise ModelError(
            f"{spec.model}: tp_size={spec.tp_size} must divide num_attention_heads={heads} and "
            f"intermediate_size={hf_config['intermediate_size']}"
        )
    if hf_config["num_hidden_layers"] % spec.pp_size:
        raise ModelError(
            f"{spec.model}: pp_size={spec.pp_size} must divide num_hidden_layers={hf_config['num_hidden_layers']}"
        )


# ---------------------------------------------------------------- memory


def estimate_peak_bytes(num_parameters: int, device: str, verify: bool) -> dict[str, int]:
    """Peak memory per place, in bytes: the loaded model (fp32 on CPU, 16-bit on GPU) + its exported 16-bit copy,
    then (after the model is freed) the verifier's float32 module + the checkpoint's tensors, both on CPU."""
    load = num_parameters * (4 if device == "cpu" else 2)
    export = num_parameters * 2
    verify_bytes = num_parameters * (4 + 2) if verify else 0
    if device == "cpu":
        return {"cpu": max(load + export, verify_bytes)}
    return {"cuda": load, "cpu": max(export, verify_bytes)}


def available_bytes(place: str) -> int | None:
    """MemAvailable on CPU (Linux), free memory of the current CUDA device; None when unknown."""
    if place == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(model_dir: Path, device: str, verify: bool) -> None:
    """CheckFailed if converting ``model_dir`` on ``device`` would not fit the memory available now. Without
    weight files nothing is counted: the load fails later with its own one-line error."""
    need = estimate_peak_bytes(count_parameters(model_dir) or 0, device, verify)
    for place, bytes_needed in need.items():
        free = available_bytes(place)
        if free is not None and bytes_needed > free:
            raise CheckFailed(
                f"{model_dir}: converting needs about {bytes_needed / 2**30:.1f} GiB of {place} memory at peak, "
                f"{free / 2**30:.1f} GiB is available; use --device cuda, a bigger machine, or --no-verify"
            )


# ---------------------------------------------------------------- loading


# ---------------------------------------------------------------- quantize / export


def quant_config(quantization: str, kv_cache_dtype: str) -> dict:
    """The modelopt quantization config of a recipe format (support.QUANT_FORMATS), plus the fp8 KV cache."""
    import modelopt.torch.quantization as mtq

    name = support.QUANT_FORMATS[quantization][0]
    cfg = copy.deepcopy(getattr(mtq, name))
    if kv_cache_dtype == "fp8":
        cfg["quant_cfg"].update(copy.deepcopy(getattr(mtq, KV_CACHE_CFG)["quant_cfg"]))
        cfg["quant_cfg"].pop("default", None)
        cfg["quant_cfg"]["default"] = {"enable": False}
    return cfg


def quantize_model(model, spec: ModelSpec, batches: list) -> Any:
    """Post-training quantization of ``model`` in place, calibrated on ``batches`` ([1, seq] token tensors)."""
    import modelopt.torch.quantization as mtq
    import torch

    device = next(model.parameters()).device

    def forward_loop(m) -> None:
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids.to(device))

    return mtq.quantize(model, quant_config(spec.quantization, spec.kv_cache_dtype), forward_loop)


def export_model(model, decoder: str, spec: ModelSpec, export_dir: Path, hf_config: dict) -> None:
    """modelopt's TensorRT-LLM export into ``export_dir`` (rank{N}.safetensors + config.json)."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
            warnings.simplefilter("ignore")
            export_tensorrt_llm_checkpoint(
                model,
                MODELOPT_DECODER.get(decoder, decoder),
                getattr(torch, spec.dtype),
                export_dir,
                inference_tensor_parallel=spec.tp_size,  # the default 0 divides by zero in modelopt 0.37
                inference_pipeline_parallel=spec.pp_size,
            )
    except (NotImplementedError, AssertionError, ValueError) as err:
        raise CheckpointError(
            f"{spec.model}: modelopt could not export {spec.quantization} tp={spec.tp_size} pp={spec.pp_size}: {err}",
            detail=repr(err),
        ) from None
    if decoder == "qwen":
        _mark_qwen(export_dir, hf_config)


def _mark_qwen(export_dir: Path, hf_config: dict) -> None:
    """Exported through the llama path: add the fields TensorRT-LLM's QWen model reads (qwen/config.py)."""
    path = export_dir / "config.json"
    config = json.loads(path.read_text())
    arch = config["architecture"]
    config.update(
        decoder="qwen",
        qwen_type="qwen3" if arch == "Qwen3ForCausalLM" else "qwen2",
        attn_bias=bool(hf_config.get("attention_bias", arch == "Qwen2ForCausalLM")),
        mlp_bias=False,
    )
    path.write_text(json.dumps(config, indent=4))


# ---------------------------------------------------------------- orchestration


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


def _warn_unsupported(spec: ModelSpec, console) -> str | None:
    precision = support.effective_precision(spec.dtype, spec.quantization)
    if precision in support.DTM_SUPPORTED_PRECISIONS:
        return None
    message = (
        f"{precision} is outside TensorRT-LLM's draft-target support matrix "
        f"({', '.join(sorted(support.DTM_SUPPORTED_PRECISIONS))}); the engine may fail at run time"
    )
    if console is not None:
        console.print(f"[yellow]warning:[/] {spec.model.name}: {message}")
    return message


def export_checkpoint(
    spec: ModelSpec,
    out_dir: Path,
    *,
    calibration: CalibrationSpec,
    device: str = "cpu",
    verify: bool = True,
    console=None,
    label: str | None = None,
) -> dict:
    """Write the TensorRT-LLM checkpoint of ``spec`` to ``out_dir`` atomically; verify it unless ``verify=False``.
    ``label`` names the model in progress lines (default: the folder above ``out_dir``, the role under engines/).

    Returns a JSON-able summary: model, format, dtype, tp/pp, files, verification metrics (or None), timings (s).
    Raises ModelError (bad input), CheckpointError (export failed), CheckFailed (memory, or verification failed).
    """
    from trtspec.builders import interpreter

    require_conversion_stack()
    out_dir = Path(out_dir)
    hf_config = read_hf_config(spec.model)
    decoder = decoder_type(hf_config, spec.model)
    check_shapes(spec, hf_config)
    warning = _warn_unsupported(spec, console)
    check_memory(spec.model, device, verify)
    stages = Stages(console, label or out_dir.parent.name or str(out_dir))
    with atomic_dir(out_dir) as tmp:
        with stages("load", f"{spec.model} on {device}"):
            tokenizer = load_tokenizer(spec.model, spec.trust_remote_code)
            model = load_source_model(spec.model, device, spec.dtype, spec.trust_remote_code)
            prompts = interpreter.tokenize_prompts(tokenizer, interpreter.DEFAULT_PROMPTS) if verify else []
            window = support.sliding_window(hf_config)
            # The checkpoint has no window (the runtime applies it: check's engine rule): verify inside it.
            if window:
                prompts = [p[:, :window] for p in prompts]
            reference = [
                r.cpu() for r in interpreter.reference_logits_for(model, [p.to(device) for p in prompts])
            ]
        if spec.quantization != "none":
            batches = calibration_batches_for(tokenizer, calibration)
            with stages("calibrate", f"{spec.quantization} on {len(batches)} x {batches[0].shape[1]} tokens"):
                model = quantize_model(model, spec, batches)
        with stages(
            "export",
            f"{spec.quantization if spec.quantization != 'none' else spec.dtype} "
            f"tp={spec.tp_size} pp={spec.pp_size}",
        ):
            export_model(model, decoder, spec, tmp, hf_config)
        del model
        gc.collect()
        verification = None
        if verify:
            with stages("verify", "checkpoint interpreter vs the HF model"):
                verification = interpreter.verify_against(tmp, prompts, reference)
            _report_verification(console, verification)
            if not verification["passed"]:
                raise CheckFailed(_failure_message(spec, out_dir, verification))
        files = sorted(p.name for p in tmp.iterdir())
    return {
        "model": str(spec.model),
        "checkpoint": str(out_dir),
        "format": spec.quantization,
        "dtype": spec.dtype,
        "kv_cache_dtype": spec.kv_cache_dtype,
        "tp_size": spec.tp_size,
        "pp_size": spec.pp_size,
        "files": files,
        "verification": verification,
        "warning": warning,
        "timings": stages.timings,
    }


def calibration_batches_for(tokenizer, calibration: CalibrationSpec) -> list:
    from trtspec.builders.calibration import calibration_batches

    return calibration_batches(tokenizer, calibration.dataset, calibration.size, calibration.seq_len)


def _report_verification(console, v: dict) -> None:
    if console is None:
        return
    style = "green" if v["passed"] else "red"
    console.print(
        f"[{style}]verify:[/] max abs logit error {v['max_abs_logit_error']:.4g} "
        f"({v['max_rel_logit_error']:.2%} of max |logit|, limit {v['tolerance']['max_rel_error']:.0%}), "
        f"top-1 agreement {v['top1_agreement']:.1%} (min {v['tolerance']['min_top1']:.0%}) over {v['tokens']} tokens"
    )


def _failure_message(spec: ModelSpec, out_dir: Path, v: dict) -> str:
    return (
        f"{spec.model} -> {out_dir}: the {spec.quantization if spec.quantization != 'none' else spec.dtype} "
        f"checkpoint does not reproduce the HF model: max abs logit error {v['max_abs_logit_error']:.4g} "
        f"({v['max_rel_logit_error']:.1%} of max |logit|, limit {v['tolerance']['max_rel_error']:.0%}), top-1 "
        f"agreement {v['top1_agreement']:.1%} (min {v['tolerance']['min_top1']:.0%}); nothing was written. "
        "Try another format or more calibration data, or pass --no-verify to keep it anyway"
    )


__all__ = ["export_checkpoint"]


def checkpoint_dir(recipe_name: str, role: str, out: Path | None = None, several: bool = False) -> Path:
    """engines/<name>/<role>/checkpoint by default; ``out`` itself for one model, ``out``/<role> for both."""
    if out is None:
        return layout.stage_dir(layout.pair_dir(recipe_name), role, layout.CHECKPOINT)
    return Path(out) / role if several else Path(out)


def export_models(
    recipe, roles: list[str], *, out: Path | None = None, verify: bool = True, console=None
) -> list:
    """export_checkpoint for each role of the recipe (target and/or draft), with the recipe's calibration."""
    summaries = []
    for role in roles:
        spec = recipe.models()[role]
        target_dir = checkpoint_dir(recipe.name, role, out, several=len(roles) > 1)
        summary = export_checkpoint(
            spec, target_dir, calibration=recipe.calibration, device=recipe.calibration.device,
            verify=verify, console=console, label=role,
        )  # fmt: skip
        summaries.append({"role": role, **summary})
    return summaries
