"""What trtspec reads from a Hugging Face model folder: its config, tokenizer, end ids, parameter count and the
model itself. Every layer (pre-flight checks, conversion, the engines, the Triton python models, validation)
reads a model folder through these, so a broken folder fails with the same one-line ModelError everywhere.

transformers, safetensors and torch are imported inside the functions: the Triton python models and the CLI
import this module without paying for them.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path

from trtspec.core.errors import ModelError
from trtspec.core.token_rules import model_end_ids

# The dtypes trtspec loads Hugging Face weights in (torch's attribute names).
TORCH_DTYPES = ("float32", "float16", "bfloat16")

# What a Hugging Face checkpoint's tokenizer is saved as (any one of them means the folder has a tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def has_tokenizer(model_dir: Path | str) -> bool:
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def read_hf_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelError(
            f"{model_dir}: no config.json; point the recipe's model at a Hugging Face checkpoint"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: not valid JSON ({err})") from None


def load_tokenizer(model_dir: Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as err:  # transformers raises many types for a broken/missing tokenizer
        raise ModelError(
            f"{model_dir}: no loadable tokenizer ({type(err).__name__}); the directory needs tokenizer.json "
            "or the tokenizer files of the Hugging Face checkpoint",
            detail=str(err),
        ) from None


def end_ids(model_dir: Path | str, tokenizer) -> tuple[int, ...]:
    """The model folder's end ids (core/token_rules.py rule 1): generation_config.json's eos_token_id, else
    config.json's (transformers builds the generation config from it), else the tokenizer's eos."""
    eos = None
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        try:
            eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        except (OSError, ValueError, AttributeError):
            eos = None
        if eos is not None:
            break
    return model_end_ids(eos, tokenizer.eos_token_id if tokenizer is not None else None)


# ---------------------------------------------------------------- parameter counts


def count_safetensors_parameters(model_dir: Path) -> int | None:
    """Sum of tensor elements over the model's *.safetensors files, from their headers only (no weights read).

    safetensors validates each file's layout on open, so a truncated or corrupt file is a ModelError here.
    """
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with safe_open(path, framework="pt") as handle:
                shapes = [handle.get_slice(name).get_shape() for name in handle.keys()]  # noqa: SIM118
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: one message for a broken file
            raise ModelError(
                f"{path}: not a readable safetensors file ({err}); re-download or re-save the model"
            ) from None
        total += sum(math.prod(shape) for shape in shapes)
    return total


def _bin_weight_files(model_dir: Path) -> list[Path]:
    """The PyTorch weight files transformers would load: the shards named by pytorch_model.bin.index.json, else
    pytorch_model*.bin (not training_args.bin and other pickles beside them)."""
    index = model_dir / "pytorch_model.bin.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise ModelError(f"{index}: not a readable weight index ({err}); re-download the model") from None
        return [model_dir / name for name in shards]
    return sorted(model_dir.glob("pytorch_model*.bin"))


def _load_state_dict(path: Path) -> dict:
    """A .bin state dict, memory-mapped where its format allows (zip, torch >= 1.6), else read."""
    import torch

    try:
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except Exception as err:  # noqa: BLE001 - pickle, zip or OSError: one message for a broken file
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(
            f"{path}: not a readable PyTorch checkpoint ({reason}); re-download or re-save the model"
        ) from None
    if not isinstance(state, dict):
        raise ModelError(f"{path}: holds a {type(state).__name__}, not a state dict; re-save the model")
    return state


def _count_bin_parameters(files: list[Path]) -> int:
    """Sum of tensor elements over PyTorch ``*.bin`` checkpoints; a tensor stored under two names (tied
    embeddings) counts once."""
    import torch

    total, seen = 0, set()
    for path in files:
        for tensor in _load_state_dict(path).values():
            if not torch.is_tensor(tensor):
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            if key not in seen:
                seen.add(key)
                total += tensor.numel()
    return total


def count_parameters(model_dir: Path) -> int | None:
    """The model's parameter count from its weight files (*.safetensors headers, else the pytorch_model*.bin
    state dicts); None without weight files. A broken file is a ModelError."""
    counted = count_safetensors_parameters(model_dir)
    if counted is not None:
        return counted
    bins = _bin_weight_files(Path(model_dir))
    return _count_bin_parameters(bins) if bins else None


# ---------------------------------------------------------------- loading the model


@contextlib.contextmanager
def _no_progress_bars():
    """transformers 5 draws a progress bar on stderr for every local weight load, which would split trtspec's
    one-line output and errors; trtspec reports its own stages."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def load_hf_model(
    model_dir: Path | str, dtype: str, trust_remote_code: bool = False, what: str = "the model"
):
    """``AutoModelForCausalLM.from_pretrained`` (on CPU) with a one-line ModelError for what a broken or
    incomplete checkpoint raises (missing or truncated weights, a config transformers cannot read)."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in TORCH_DTYPES:
        raise ModelError(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    try:
        with _no_progress_bars():
            return AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
            )
    except Exception as err:  # noqa: BLE001 - transformers/safetensors raise many types for a broken checkpoint
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ModelError(
            f"{model_dir}: cannot load {what} ({type(err).__name__}: {first}); check that its weight files "
            "are complete",
            detail=repr(err),
        ) from None


def load_source_model(
    model_dir: Path, device: str = "cpu", dtype: str | None = None, trust_remote_code: bool = False
):
    """The HF causal LM in eval mode: float32 on CPU (calibration and reference logits), ``dtype`` on CUDA."""
    read_hf_config(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_hf_model(
            model_dir, "float32" if device == "cpu" or dtype is None else dtype, trust_remote_code
        )
    return model.to(device).eval()
