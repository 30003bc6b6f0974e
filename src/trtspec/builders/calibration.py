"""Calibration data for post-training quantization: a built-in sample or the user's text / JSONL file.

The built-in set is the demo corpus: CPython standard-library ``.py`` sources of the running interpreter, a
deterministic sample (sorted paths, seeded shuffle) so two runs calibrate identically.
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

from trtspec.core.errors import RecipeError

FIELD = "calibration.dataset"
BUILTIN_SEED = 0
BUILTIN_MAX_FILES = 400  # enough text for 512 x 2048-token samples, without reading the whole stdlib


def builtin_texts(seed: int = BUILTIN_SEED, max_files: int = BUILTIN_MAX_FILES) -> list[str]:
    """A deterministic sample of the standard library's .py sources (tests excluded)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in stdlib.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts
    )
    random.Random(seed).shuffle(files)
    texts = []
    for path in files[:max_files]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # a few stdlib files are not UTF-8; skipping them keeps the sample deterministic
    return texts


def file_texts(path: Path) -> list[str]:
    """A .jsonl file (one {"text": ...} object or JSON string per line) or any other file read as plain text."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RecipeError(path, FIELD, f"cannot read the calibration file ({err})") from None
    if Path(path).suffix != ".jsonl":
        texts = [raw]
    else:
        texts = [
            _jsonl_text(path, number, line) for number, line in enumerate(raw.splitlines(), 1) if line.strip()
        ]
    if not any(t.strip() for t in texts):
        raise RecipeError(
            path, FIELD, "the calibration file has no text; give a .txt or .jsonl file with text"
        )
    return texts


def _jsonl_text(path: Path, number: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise RecipeError(path, FIELD, f"line {number} is not JSON ({err.msg})") from None
    if isinstance(record, str):
        return record
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return record["text"]
    raise RecipeError(path, FIELD, f'line {number}: expected a JSON string or an object with a "text" field')


def calibration_batches(tokenizer, dataset: str, size: int, seq_len: int) -> list:
    """Token windows for calibration: ``size`` tensors of shape [1, seq_len] int64 (fewer if the text is short).

    Documents are tokenized, joined with the EOS token and cut into consecutive windows, so every sample is full.
    """
    import torch

    texts = builtin_texts() if dataset == "builtin" else file_texts(Path(dataset))
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    for text in texts:
        # verbose=False: the stream is cut into windows below, so the tokenizer's length warning does not apply
        stream.extend(tokenizer(text, add_special_tokens=False, verbose=False).input_ids + eos)
        if len(stream) >= size * seq_len:
            break
    windows = [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)][:size]
    if not windows:  # shorter than one window: calibrate on what there is
        windows = [stream] if stream else []
    if not windows:
        raise RecipeError(dataset, FIELD, "the calibration text produced no tokens")
    return [torch.tensor([w], dtype=torch.long) for w in windows]
