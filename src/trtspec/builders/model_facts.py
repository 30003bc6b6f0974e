"""What the pre-flight checks need of one model, read once from its directory: config.json, the tokenizer, the
parameter count from the safetensors headers and whether those tensors are the ones the config builds. The only
I/O of ``trtspec check``; the checks are pure over it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.core.errors import ModelError
from trtspec.core.model_dir import (
    checkpoint_problem,
    count_parameters,
    error_line,
    load_tokenizer,
    read_model_config,
    safetensors_files,
)
from trtspec.recipe import ModelSpec


@dataclass(frozen=True)
class ModelFacts:
    """What the checks need of one model, read once from its directory."""

    role: str
    path: Path
    architecture: str
    vocab_size: int
    max_position_embeddings: int
    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    num_parameters: int
    tokenizer: Any = field(repr=False)
    # the (text) config.json, for family rules
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    # why the model would not load (its tensors do not match config.json), one line; None: it loads
    weights_problem: str | None = None
    safetensors: bool = True  # its weights are (also) *.safetensors files, which the ModelOpt HF export reads


def gather_facts(role: str, spec: ModelSpec) -> ModelFacts:
    """Read config.json, the tokenizer and the safetensors headers of one model directory."""
    from transformers import AutoConfig

    path = Path(spec.model)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"{path}: {role} model has no config.json; point {role}.model at a Hugging Face checkpoint"
        )
    read_model_config(path)
    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except Exception as err:
        raise ModelError(
            f"{path}/config.json: cannot be read as a model config ({error_line(err)})", detail=repr(err)
        ) from None
    # the model class is the whole config's (a multimodal text config names none); "" where config.json has none
    architecture = (getattr(cfg, "architectures", None) or [""])[0]
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    counted = count_parameters(path)
    if counted is None:
        raise ModelError(
            f"{path}: {role} model has no weights (*.safetensors or pytorch_model*.bin); point {role}.model at "
            "a whole Hugging Face checkpoint"
        )
    heads = cfg.num_attention_heads
    return ModelFacts(
        role=role,
        path=path,
        architecture=architecture,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=getattr(cfg, "max_position_embeddings", 0) or 0,
        num_hidden_layers=cfg.num_hidden_layers,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        num_parameters=counted,
        tokenizer=load_tokenizer(path, spec.trust_remote_code),
        config=cfg.to_dict(),
        weights_problem=checkpoint_problem(path, spec.trust_remote_code, f"the {role}"),
        safetensors=bool(safetensors_files(path)),
    )
