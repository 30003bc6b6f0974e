"""Hugging Face -> TensorRT-LLM checkpoint, fp16/bf16 or quantized, through nvidia-modelopt 0.37.

``export_checkpoint`` runs the four stages of ``export_pipeline.run_export`` (load, calibrate, export, verify),
each reported on the console the CLI passes in:
1. inspect the HF directory (config, architecture, AWQ shapes) and refuse a model that will not fit in memory;
2. load it and, when verifying, compute reference logits of the unquantized model on a few prompts;
3. quantize with ``modelopt.torch.quantization.quantize`` (calibration forward loop) for fp8 / int8_sq / int4_awq /
   w4a8_awq, then ``export_tensorrt_llm_checkpoint`` into a temp dir next to ``out_dir``;
4. run the checkpoint interpreter (builders/interpreter.py) and compare logits; rename into place only on success.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtspec.builders import support
from trtspec.builders.environment import require_conversion_stack
from trtspec.builders.export_pipeline import (
    ExportSteps,
    check_shapes,
    require_conversion_memory,
    run_export,
)
from trtspec.core import layout
from trtspec.core.errors import CheckFailed, CheckpointError, ModelError, RecipeError, TrtspecError
from trtspec.core.model_dir import read_hf_config, require_device, require_matching_weights
from trtspec.outputs import check_output_dir
from trtspec.recipe import CalibrationSpec, ModelSpec, load_recipe

# Every TensorRT-LLM checkpoint has rank 0's weights; a Hugging Face folder never has this file.
CHECKPOINT_MARKER = "rank0.safetensors"

# modelopt 0.37's TensorRT-LLM export has no "qwen" decoder (tensorrt_llm_utils raises NotImplementedError);
# Qwen2/3 are Llama-shaped (+ qkv bias / qk-norm), so they go through its "llama" path.
MODELOPT_DECODER = {"qwen": "llama"}

__all__ = ["ExportSpec", "export_checkpoint", "export_checkpoints", "export_models"]


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
    require_conversion_stack()
    out_dir = Path(out_dir)
    hf_config = read_hf_config(spec.model)
    decoder = decoder_type(hf_config, spec.model)
    check_shapes(spec, hf_config)
    warning = _warn_unsupported(spec, console)
    require_conversion_memory(spec.model, device, verify)

    def export(model, tokenizer, tmp: Path) -> None:
        export_model(model, decoder, spec, tmp, hf_config)

    what = spec.quantization if spec.quantization != "none" else spec.dtype
    steps = ExportSteps(f"{what} tp={spec.tp_size} pp={spec.pp_size}", export)
    if verify:
        steps = _with_verification(steps, spec, out_dir, hf_config, device, console)
    label = label or out_dir.parent.name or str(out_dir)
    run = run_export(
        spec, out_dir, steps, calibration=calibration, device=device, console=console, label=label
    )
    return {
        "model": str(spec.model),
        "checkpoint": str(out_dir),
        "format": spec.quantization,
        "dtype": spec.dtype,
        "kv_cache_dtype": spec.kv_cache_dtype,
        "tp_size": spec.tp_size,
        "pp_size": spec.pp_size,
        "files": run.files,
        "verification": run.checked,
        "calibration": run.calibration,
        "warning": warning,
        "timings": run.timings,
    }


def _with_verification(
    steps: ExportSteps, spec: ModelSpec, out_dir: Path, hf_config: dict, device: str, console
) -> ExportSteps:
    """``steps`` plus the verify stage: the checkpoint interpreter's logits against the HF model's, taken on a few
    prompts right after loading (before calibration changes the model)."""
    from trtspec.builders import interpreter

    def reference(model, tokenizer) -> tuple[list, list]:
        prompts = interpreter.tokenize_prompts(tokenizer, interpreter.DEFAULT_PROMPTS)
        window = support.sliding_window(hf_config)
        # The checkpoint has no window (the runtime applies it: check's engine rule): verify inside it.
        if window:
            prompts = [p[:, :window] for p in prompts]
        logits = interpreter.reference_logits_for(model, [p.to(device) for p in prompts])
        return prompts, [r.cpu() for r in logits]

    def verify(tmp: Path, loaded: tuple[list, list]) -> dict:
        prompts, reference_logits = loaded
        return interpreter.verify_against(tmp, prompts, reference_logits)

    def accept(verification: dict) -> None:
        _report_verification(console, verification)
        if not verification["passed"]:
            raise CheckFailed(_failure_message(spec, out_dir, verification))

    return replace(
        steps,
        check_stage=("verify", "checkpoint interpreter vs the HF model"),
        check=verify,
        on_load=reference,
        accept=accept,
    )


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


def _check_every_model(recipe, roles: list[str]) -> None:
    """Every model's weights against its config, its family and its layer split before the first export: a draft
    refused only after the target's calibration would cost that time and leave one checkpoint of the pair written,
    or a rerun's pair mixed (headers and configs only, no weights read)."""
    for role in roles:
        spec = recipe.models()[role]
        require_matching_weights(spec.model, spec.trust_remote_code, f"the {role}")
        hf_config = read_hf_config(spec.model)
        decoder_type(hf_config, spec.model)
        check_shapes(spec, hf_config)


def checkpoint_dir(recipe_name: str, role: str, out: Path | None = None, several: bool = False) -> Path:
    """engines/<name>/<role>/checkpoint by default; ``out`` itself for one model, ``out``/<role> for both."""
    if out is None:
        return layout.stage_dir(layout.pair_dir(recipe_name), role, layout.CHECKPOINT)
    return Path(out) / role if several else Path(out)


def export_models(
    recipe, roles: list[str], *, out: Path | None = None, verify: bool = True, console=None
) -> list:
    """export_checkpoint for each role of the recipe (target and/or draft), with the recipe's calibration. An
    ``out`` folder is replaced only where it holds nothing or a checkpoint: refused before any work otherwise."""
    if len(roles) > 1:
        _check_every_model(recipe, roles)
    require_device(recipe.calibration.device)
    dirs = {role: checkpoint_dir(recipe.name, role, out, several=len(roles) > 1) for role in roles}
    if out is not None:
        for path in dirs.values():
            check_output_dir(path, CHECKPOINT_MARKER, "a TensorRT-LLM checkpoint", "--out")
    summaries = []
    for role in roles:
        spec = recipe.models()[role]
        target_dir = dirs[role]
        summary = export_checkpoint(
            spec, target_dir, calibration=recipe.calibration, device=recipe.calibration.device,
            verify=verify, console=console, label=role,
        )  # fmt: skip
        summaries.append({"role": role, **summary})
    return summaries


@dataclass(frozen=True)
class ExportSpec:
    """What ``trtspec convert`` and ``quantize`` ask for: a recipe (name or path), which of its models ("target",
    "draft" or "both"), and the options as recipe overrides (a None value keeps the recipe's): ``shared`` by
    dotted key, ``per_role`` by key under each exported model's section."""

    recipe: str
    model: str = "both"
    shared: dict = field(default_factory=dict)
    per_role: dict = field(default_factory=dict)
    out: Path | None = None
    verify: bool = True
    quantize: bool = False  # `trtspec quantize`: every model it exports gets a format (check_formats)


def check_formats(spec: ExportSpec, models: dict, roles: list[str]) -> None:
    """quantize's options against the recipe's models, before its overrides are applied (whose errors would name
    the recipe's fields): a --<role>-format for a model not exported or not there, and nothing exported with a
    format (quantize would write only unquantized checkpoints). ``roles``: the models it exports."""
    for role in ("target", "draft"):
        if spec.shared.get(f"{role}.quantization") is None:
            continue
        if role not in models:
            raise TrtspecError(
                f"--{role}-format: the recipe has no {role} model (prompt lookup proposes alone)"
            )
        if role not in roles:
            raise TrtspecError(
                f"--{role}-format names the {role}, which --model {spec.model} does not export"
            )
    formats = {role: spec.shared.get(f"{role}.quantization") or models[role].quantization for role in roles}
    if any(f != "none" for f in formats.values()):
        return  # a model of the pair may stay unquantized beside a quantized one, as the recipe or option says
    if len(roles) == 1 and spec.shared.get(f"{roles[0]}.quantization") == "none":
        raise TrtspecError(
            f"--{roles[0]}-format none: quantize writes quantized checkpoints; give a format, or write the "
            f"{roles[0]} unquantized with `trtspec convert`"
        )
    fields = " and ".join(f"{role}.quantization" for role in roles)
    options = " or ".join(f"--{role}-format" for role in roles)
    raise TrtspecError(
        f"quantize: no model it exports has a format ({fields} none); pass {options}, or write "
        "unquantized checkpoints with `trtspec convert`"
    )


def export_checkpoints(spec: ExportSpec, console=None) -> list:
    """The recipe with ``spec``'s overrides, each of its models' checkpoint written and verified (export_models);
    "both" is the recipe's models (the target alone where prompt lookup proposes without a draft)."""
    models = load_recipe(spec.recipe).models()
    if spec.model not in (*models, "both"):
        # before the overrides, which would start a draft section and then ask for its model
        raise RecipeError(
            spec.recipe,
            "draft",
            "the recipe has no draft model (prompt lookup proposes alone); use --model target",
        )
    roles = list(models) if spec.model == "both" else [spec.model]
    if spec.quantize:
        check_formats(spec, models, roles)
    overrides = spec.shared | {
        f"{role}.{key}": value for role in roles for key, value in spec.per_role.items()
    }
    recipe = load_recipe(spec.recipe, overrides)
    return export_models(recipe, roles, out=spec.out, verify=spec.verify, console=console)
