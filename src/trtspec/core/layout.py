"""Where ``trtspec build`` writes a pair's model outputs, and where deploy and the runners find them:

    <engines_dir>/<name>/<role>/checkpoint      the TensorRT-LLM checkpoint (convert / quantize)
    <engines_dir>/<name>/<role>/engine          the TensorRT-LLM engine
    <engines_dir>/<name>/<role>/hf_checkpoint   a quantized model's ModelOpt HF export (trtllm-pytorch)

``<name>`` is the recipe's name, ``<role>`` target or draft; engines_dir defaults to ./engines.
"""

from __future__ import annotations

from pathlib import Path

ENGINES_DIR = Path("engines")
CHECKPOINT = "checkpoint"
ENGINE = "engine"
# model.yaml of trtllm-pytorch points the LLM at this folder.
QUANTIZED_HF_SUBDIR = "hf_checkpoint"


def pair_dir(name: str, engines_dir: Path | str | None = None) -> Path:
    """<engines_dir>/<name>: everything build writes for one recipe (its manifest too)."""
    return Path(engines_dir or ENGINES_DIR) / name


def stage_dir(pair: Path | str, role: str, stage: str) -> Path:
    """<pair>/<role>/<stage>, ``stage`` one of CHECKPOINT, ENGINE, QUANTIZED_HF_SUBDIR."""
    return Path(pair) / role / stage
