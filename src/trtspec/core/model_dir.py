"""What trtspec reads from a Hugging Face model folder: its config, tokenizer, end ids, parameter count and the
model itself. Every layer (pre-flight checks, conversion, the engines, the Triton python models, validation)
reads a model folder through these, so a broken folder fails with the same one-line ModelError everywhere.

transformers, safetensors and torch are imported inside the functions: the Triton python models and the CLI
import this module without paying for them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import warnings
from pathlib import Path

from trtspec.core.errors import ModelError, OutOfMemory
from trtspec.core.token_rules import model_end_ids

# The dtypes trtspec loads Hugging Face weights in (torch's attribute names).
TORCH_DTYPES = ("float32", "float16", "bfloat16")

# What a Hugging Face checkpoint's tokenizer is saved as (any one of them means the folder has a tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def has_tokenizer(model_dir: Path | str) -> bool:
    return any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES)


def _any_tokenizer_file(model_dir: Path | str) -> bool:
    """Any file a tokenizer may load from, beyond TOKENIZER_FILES (sentencepiece's spiece.model, a tiktoken file,
    BPE merges): where one exists, a failed load is not a missing tokenizer."""
    patterns = ("tokenizer*", "*.model", "*.tiktoken", "vocab.*", "merges.txt")
    return has_tokenizer(model_dir) or any(any(Path(model_dir).glob(p)) for p in patterns)


def read_hf_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelError(
            f"{model_dir}: no config.json; point the recipe's model at a Hugging Face checkpoint"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: not valid JSON ({err}); fix or re-export config.json") from None
    if not isinstance(config, dict):
        raise ModelError(
            f"{path}: must be a JSON object, got a {type(config).__name__}; re-export config.json"
        )
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            _check_sizes(section, path)
    return config


# Sizes every check reads as numbers; published configs leave the optional ones null (Mistral's head_dim).
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers")
_OPTIONAL_SIZES = (
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
)


def _check_sizes(section: dict, path: Path) -> None:
    """ModelError naming the field for a size that is not a positive integer (a quoted "1024" included); Gemma 3n
    gives intermediate_size per layer, a list of them."""
    for key in (*_SIZES, *_OPTIONAL_SIZES):
        value = section.get(key)
        if key not in section or (value is None and key in _OPTIONAL_SIZES):
            continue
        per_layer = key == "intermediate_size" and isinstance(value, list)
        sizes = value if per_layer else [value]
        if not sizes or not all(_positive_int(v) for v in sizes):
            raise ModelError(f"{path}: {key}: must be a positive integer (got {value!r}); fix config.json")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def read_model_config(model_dir: Path) -> dict:
    """config.json as transformers will parse it: ``read_hf_config``'s object with a ``model_type`` (or a remote
    code config class under ``auto_map``). Without one, transformers' own error lists every model type it knows."""
    config = read_hf_config(model_dir)
    remote = isinstance(config.get("auto_map"), dict) and "AutoConfig" in config["auto_map"]
    if not isinstance(config.get("model_type"), str) and not remote:
        raise ModelError(
            f'{Path(model_dir) / "config.json"}: no "model_type" string (e.g. "llama"), which transformers needs '
            "to read it; re-export config.json"
        )
    if not remote:
        from transformers import CONFIG_MAPPING, __version__

        if config["model_type"] not in CONFIG_MAPPING:
            raise ModelError(
                f'{Path(model_dir) / "config.json"}: model_type "{config["model_type"]}" is not a family '
                f"transformers {__version__} knows; docs/pairs.md lists the families trtspec serves, and a "
                "newer transformers may know more"
            )
    _check_field_types(config, Path(model_dir) / "config.json")
    return config


def _check_field_types(config: dict, path: Path) -> None:
    """ModelError naming the field for a value of another kind than its config class's default (a quoted number,
    a number where a flag goes). transformers 4 keeps such a value and fails deep inside the forward; 5 refuses
    it while another step loads (a tokenizer, the weights), which would then be reported as that step's
    problem. Sizes are _check_sizes's; token ids may be lists; a null is left to the model's own rules. A
    multimodal config's text_config is checked against its own model_type."""
    model_type = config.get("model_type")
    defaults = _config_defaults(model_type) if isinstance(model_type, str) else {}
    for key, value in config.items():
        default = defaults.get(key)
        if default is None or value is None or key in (*_SIZES, *_OPTIONAL_SIZES) or key.endswith("token_id"):
            continue
        kind = _scalar_kind(default)
        if _scalar_kind(value) != kind:
            raise ModelError(f"{path}: {key}: must be {kind} (got {value!r}); fix config.json")
    if isinstance(config.get("text_config"), dict):
        _check_field_types(config["text_config"], path)


def _scalar_kind(value) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "a list or an object"


@functools.lru_cache(maxsize=32)
def _config_defaults(model_type: str) -> dict:
    """The scalar fields of ``model_type``'s built-in config class as it is built with no arguments, less the
    generation parameters transformers 4 still gives every config (generation_config.json's, which 5 drops
    from it); {} for a type this transformers does not know (remote code of a type of its own: its loading
    reports that). Remote code that names a built-in type is checked against the built-in class."""
    from transformers import CONFIG_MAPPING, GenerationConfig

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - an unknown type (KeyError) or a class that needs arguments
        return {}
    fields = vars(config)
    generation = set(GenerationConfig().to_dict())
    scalars = {
        k: v for k, v in fields.items() if isinstance(v, bool | int | float | str) and k not in generation
    }
    for nested in fields.values():  # transformers 5 reads a top-level rope_theta into its rope_parameters
        if isinstance(nested, dict):
            for k, v in nested.items():
                if isinstance(v, bool | int | float | str):
                    scalars.setdefault(k, v)
    return scalars


def error_line(err: BaseException, limit: int = 200) -> str:
    """The first line of a library's error, cut to ``limit`` characters (marked "..."), at a word where one ends
    near the cut: the part a one-line message can carry."""
    line = (str(err).strip().splitlines() or [""])[0]
    if len(line) <= limit:
        return line
    head = line[:limit]
    word = head.rsplit(" ", 1)[0]
    return (word if len(word) >= limit - 40 else head).rstrip(",;: ") + " ..."


def out_of_memory(err: BaseException, where: str = "") -> OutOfMemory | None:
    """``err`` as a one-line OutOfMemory when it is an allocator's refusal, else None. Known by name and text, as
    core imports no torch: torch raises ``torch.OutOfMemoryError`` on a GPU and a plain RuntimeError from its CPU
    allocator; Python's own is MemoryError. ``where`` names what was being loaded ("<folder>: the draft")."""
    if type(err).__name__ == "OutOfMemoryError":
        memory, room = "GPU", "the GPU"
    elif isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError) and "DefaultCPUAllocator" in str(err)
    ):
        memory, room = "host", "memory"
    else:
        return None
    # torch's CPU allocator opens with its source line ("[enforce fail at alloc_cpu.cpp:127] err == 0. ")
    said = error_line(err).split("DefaultCPUAllocator: ")[-1] or type(err).__name__
    if where:
        message = f"{where} does not fit in {memory} memory ({said}); free {room} or use a machine with more"
    else:  # a model, its caches or a batch's: the command cannot tell which
        message = (
            f"out of {memory} memory ({said}); free {room}, use a machine with more, or lower the dtype or the "
            "concurrency"
        )
    return OutOfMemory(message, detail=repr(err))


# A tokenizer folder's JSON files: one that does not parse is named, rather than the tokenizer as a whole.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def load_tokenizer(model_dir: Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    if (Path(model_dir) / "config.json").is_file():
        # transformers 5 reads it for the tokenizer too: a broken one named as such
        config = read_hf_config(model_dir)
        _check_field_types(config, Path(model_dir) / "config.json")
    try:
        with _quiet_loading():  # its notices (the legacy behaviour of a Llama tokenizer) would split the line
            tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as err:  # transformers raises many types for a broken/missing tokenizer
        if not _any_tokenizer_file(model_dir):
            raise ModelError(
                f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); copy the Hugging Face "
                "checkpoint's tokenizer files into it",
                detail=str(err),
            ) from None
        for name in TOKENIZER_JSON:
            path = Path(model_dir) / name
            try:
                json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
            except (OSError, ValueError) as bad:
                raise ModelError(
                    f"{path}: not valid JSON ({error_line(bad)}); copy the checkpoint's tokenizer files again",
                    detail=str(err),
                ) from None
        raise ModelError(
            f"{model_dir}: the tokenizer does not load ({type(err).__name__}: {error_line(err)}); the directory "
            "needs tokenizer.json or the tokenizer files of the Hugging Face checkpoint",
            detail=str(err),
        ) from None
    # Every prompt is checked against the recipe's limits, which may exceed the tokenizer's model_max_length;
    # transformers' own once-per-tokenizer warning about it would split the one-line error that check gives.
    warned = getattr(tokenizer, "deprecation_warnings", None)  # a remote-code tokenizer may not have it
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def load_tokenizer_if_any(model_dir: Path | str, trust_remote_code: bool = False):
    """The folder's tokenizer, or None when it has none (ids-only use still works); a tokenizer that is there but
    does not load is a ModelError."""
    return load_tokenizer(Path(model_dir), trust_remote_code) if has_tokenizer(model_dir) else None


def end_ids(model_dir: Path | str, tokenizer) -> tuple[int, ...]:
    """The model folder's end ids (core/token_rules.py rule 1): the generation config's eos_token_id as
    transformers loads it (generation_config.json where the folder has one that reads as a JSON object, even
    without the field; else config.json, from which transformers builds it, as it does when the generation config
    does not load), else the tokenizer's eos. An eos_token_id that is not ids is a ModelError naming the file."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        try:
            config = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            return _end_ids(config.get("eos_token_id"), tokenizer, path)
    return _end_ids(None, tokenizer, model_dir)


def loaded_end_ids(model, tokenizer) -> tuple[int, ...]:
    """A loaded model's end ids (core/token_rules.py rule 1): its generation_config's eos_token_id (transformers
    read it from the files ``end_ids`` reads), else the tokenizer's eos; a model without a generation_config
    (a stand-in) or without a tokenizer (None) contributes nothing."""
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return _end_ids(generation_eos, tokenizer, getattr(model, "name_or_path", None) or "the model")


def _end_ids(generation_eos, tokenizer, source) -> tuple[int, ...]:
    try:
        return model_end_ids(generation_eos, tokenizer.eos_token_id if tokenizer is not None else None)
    except ValueError as err:
        raise ModelError(f"{source}: {err}; fix the model's generation_config.json or config.json") from None


# ---------------------------------------------------------------- parameter counts


def safetensors_files(model_dir: Path | str) -> list[Path]:
    """The model folder's safetensors weight files as transformers loads them: the shards its index names, else
    model.safetensors, else every *.safetensors in name order. (Mistral's folders also hold the same weights as
    consolidated.safetensors, which transformers never reads.)"""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return indexed_files(index)
    single = model_dir / "model.safetensors"
    return [single] if single.is_file() else sorted(model_dir.glob("*.safetensors"))


def read_weight_map(index: Path) -> dict[str, str]:
    """A weight index's tensor -> shard file map; a ModelError naming the file where it is not one."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"{index}: not a readable weight index ({err}); re-download the model") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelError(
            f"{index}: weight_map must map tensor names to shard files (got {type(weight_map).__name__}); "
            "re-download the model"
        )
    return weight_map


def indexed_files(index: Path) -> list[Path]:
    """The shard files a weight index names, in name order."""
    return [index.parent / name for name in sorted(set(read_weight_map(index).values()))]


def count_safetensors_parameters(model_dir: Path) -> int | None:
    """Sum of tensor elements over the model's *.safetensors files, from their headers only (no weights read).

    safetensors validates each file's layout on open, so a truncated or corrupt file is a ModelError here.
    """
    from safetensors import safe_open

    files = safetensors_files(model_dir)
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
        return indexed_files(index)
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
        raise out_of_memory(err, str(path)) or ModelError(
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
def _quiet_loading():
    """transformers' own reports of a load stay off stderr: version 5 draws a progress bar for every local load and
    prints a table of missing and unexpected tensors, version 4 a paragraph; they would split trtspec's one-line
    output and errors, and trtspec turns the mismatch into its own one-line error."""
    from transformers.utils import logging as hf_logging

    shown, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if shown:
            hf_logging.enable_progress_bar()


def _from_pretrained(model_dir: Path | str, what: str, trust_remote_code: bool, **kwargs):
    """``AutoModelForCausalLM.from_pretrained`` with its loading info (model, info), or a one-line ModelError for
    what a broken or incomplete checkpoint raises (truncated weights, a config transformers cannot read)."""
    from transformers import AutoModelForCausalLM

    if (Path(model_dir) / "config.json").is_file():
        read_model_config(model_dir)  # a broken config.json named as such, not as incomplete weights
    try:
        with _quiet_loading():
            # ignore_mismatched_sizes: a tensor of the wrong shape is reported in the info like a missing one,
            # so the error can name it (transformers' own error names only the module class)
            return AutoModelForCausalLM.from_pretrained(
                model_dir,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
                **kwargs,
            )
    except Exception as err:  # noqa: BLE001 - transformers/safetensors raise many types for a broken checkpoint
        raise out_of_memory(err, f"{model_dir}: {what}") or ModelError(
            f"{model_dir}: cannot load {what} ({type(err).__name__}: {error_line(err)}); check that its weight "
            "files are complete",
            detail=repr(err),
        ) from None


def load_hf_model(
    model_dir: Path | str,
    dtype: str,
    trust_remote_code: bool = False,
    what: str = "the model",
    device_map: str | None = None,
):
    """The HF causal LM in ``dtype``, on CPU unless ``device_map`` (from_pretrained's) places it; a ModelError for
    a broken checkpoint or one whose tensors do not match its config (transformers would fill a missing tensor
    with random values and drop an unexpected one)."""
    import torch

    if dtype not in TORCH_DTYPES:
        raise ModelError(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    placement = {"device_map": device_map} if device_map else {}
    return _load_checked(Path(model_dir), what, trust_remote_code, dtype=getattr(torch, dtype), **placement)


def checkpoint_problem(model_dir: Path | str, trust_remote_code: bool = False, what: str = "the model"):
    """What ``load_hf_model`` would refuse in this checkpoint, as one line, or None (``require_matching_weights``
    as a check's result)."""
    try:
        require_matching_weights(model_dir, trust_remote_code, what)
    except ModelError as err:
        return err.message
    return None


def require_matching_weights(model_dir: Path | str, trust_remote_code: bool = False, what: str = "the model"):
    """Raise the ModelError ``load_hf_model`` would (its detail lists every mismatched key): the model is built on
    the meta device, so only the weight files' headers are read (no tensor data, no memory for the weights)."""
    _load_checked(Path(model_dir), what, trust_remote_code, device_map="meta")


def _load_checked(model_dir: Path, what: str, trust_remote_code: bool, **kwargs):
    problem = index_mismatch(model_dir)
    if problem:
        raise ModelError(problem)
    model, info = _from_pretrained(model_dir, what, trust_remote_code, **kwargs)
    problem = weights_mismatch(model_dir, info, type(model).__name__)
    if problem:
        raise ModelError(problem, detail=_info_detail(info))
    return model


def weights_mismatch(model_dir: Path, info: dict, architecture: str) -> str | None:
    """The first tensor a checkpoint and its config disagree on, as one line naming the weight file that holds it
    or should hold it; None when they agree.

    ``info`` is from_pretrained's loading info (both transformers 4 and 5): its lists already leave out what is not
    an error, the tied weights (lm_head under tie_word_embeddings), the non-persistent buffers (rotary inv_freq)
    and the keys the model class marks as ignorable on load (``_keys_to_ignore_on_load_missing`` /
    ``_keys_to_ignore_on_load_unexpected``).
    """
    # transformers 4 lists mismatched keys, 5 (key, checkpoint shape, model shape) triples
    mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or ()]
    kinds = {
        "missing": (
            sorted(info.get("missing_keys") or ()),
            f"has no tensor {{}}, which {architecture} needs",
        ),
        "unexpected": (
            sorted(info.get("unexpected_keys") or ()),
            f"holds tensor {{}}, which {architecture} does not have",
        ),
        "of the wrong shape": (
            sorted(mismatched),
            f"holds tensor {{}} in a shape {architecture} does not expect",
        ),
    }
    for keys, phrase in kinds.values():
        if keys:
            counts = {kind: len(names) for kind, (names, _) in kinds.items()}
            return _mismatch_line(
                _weight_file(model_dir, keys[0]), phrase.format(keys[0]), counts, "config.json"
            )
    return None


def index_mismatch(model_dir: Path) -> str | None:
    """The first tensor a sharded safetensors checkpoint's index and its shards disagree on, as one line naming
    the shard; None when they agree or the model is not sharded. transformers 4 takes the index's word for which
    tensors exist, so a tensor the index lists and its shard lacks is left on the meta device without a warning."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        weight_map = read_weight_map(index)
    except ModelError as err:
        return str(err)
    for shard in sorted(set(weight_map.values())):
        path = model_dir / shard
        listed = {name for name, file in weight_map.items() if file == shard}
        try:
            with safe_open(path, framework="pt") as handle:
                held = set(handle.keys())
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: one message for a broken file
            return f"{path}: not a readable safetensors file ({err}); re-download or re-save the model"
        missing, unexpected = sorted(listed - held), sorted(held - listed)
        if missing or unexpected:
            first = (
                f"has no tensor {missing[0]}, which {index.name} lists"
                if missing
                else f"holds tensor {unexpected[0]}, which {index.name} does not list"
            )
            counts = {"missing": len(missing), "unexpected": len(unexpected)}
            return _mismatch_line(path, first, counts, "their index")
    return None


def _mismatch_line(path: Path, first: str, counts: dict[str, int], against: str) -> str:
    listed = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    return (
        f"{path}: {first} ({listed}); the weights do not match {against}: re-download the model, or re-save it "
        "with save_pretrained"
    )


def _info_detail(info: dict) -> str:
    return "\n".join(
        f"{name}: {sorted(map(str, info.get(name) or ()))}"
        for name in ("missing_keys", "unexpected_keys", "mismatched_keys")
    )


# The weight index and the single weight file of each format transformers loads, in the order it prefers them.
_WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
)


def _weight_file(model_dir: Path, tensor: str) -> Path:
    """The file that holds ``tensor``, or should: the shard the index names, else the index itself when it names
    none; the single weight file of an unsharded model; the folder when it has neither."""
    for index_name, single in _WEIGHT_FILES:
        index = model_dir / index_name
        if index.is_file():
            try:
                weight_map = read_weight_map(index)
            except ModelError:
                return index
            return model_dir / weight_map[tensor] if tensor in weight_map else index
        if (model_dir / single).is_file():
            return model_dir / single
    return model_dir


def require_device(device: str) -> None:
    """ModelError, before any model loads, for a CUDA device on a machine whose torch sees no GPU."""
    import torch

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} was asked for but torch sees no GPU; use --device cpu")


def load_source_model(
    model_dir: Path, device: str = "cpu", dtype: str | None = None, trust_remote_code: bool = False
):
    """The HF causal LM in eval mode: float32 on CPU (calibration and reference logits), ``dtype`` on CUDA."""
    require_device(device)
    read_hf_config(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_hf_model(
            model_dir, "float32" if device == "cpu" or dtype is None else dtype, trust_remote_code
        )
    return model.to(device).eval()
