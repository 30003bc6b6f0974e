"""Prompt sets for ``validate`` and ``bench``: the shipped default (code and prose) or a user's JSONL file.

One JSON object per line: ``{"prompt": "...", "id": "optional-name", "category": "optional, e.g. code"}``
(``text`` is accepted for ``prompt``). Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import PromptSetError

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "default.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    category: str = "prompt"


def parse_prompt_line(line: str, where: str, index: int) -> Prompt:
    """One JSONL line -> Prompt; ``where`` names file:line for the error."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptSetError(f"{where}: not valid JSON ({err.msg}); write one JSON object per line") from None
    if not isinstance(data, dict):
        raise PromptSetError(
            f'{where}: expected a JSON object like {{"prompt": "..."}}, got {type(data).__name__}'
        )
    text = data.get("prompt", data.get("text"))
    if not isinstance(text, str) or not text:
        raise PromptSetError(f'{where}: field "prompt" must be a non-empty string (got {text!r})')
    return Prompt(
        id=str(data.get("id", f"p{index}")), text=text, category=str(data.get("category", "prompt"))
    )


def load_prompts(path: Path | str | None = None, limit: int | None = None) -> list[Prompt]:
    """Read a prompt JSONL file (None = the shipped default set); ``limit`` keeps the first N prompts."""
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise PromptSetError(
            f"{path}: cannot read the prompt file ({err.strerror}); pass a JSONL file"
        ) from None
    except UnicodeDecodeError as err:
        raise PromptSetError(
            f"{path}: not UTF-8 text (byte {err.start}); save the prompt file as UTF-8 JSONL"
        ) from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            prompts.append(parse_prompt_line(line, f"{path}:{number}", len(prompts)))
    if not prompts:
        raise PromptSetError(f'{path}: no prompts; add lines like {{"prompt": "def add(a, b):"}}')
    ids = [p.id for p in prompts]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise PromptSetError(f"{path}: prompt id {duplicate!r} appears more than once; ids must be unique")
    return prompts[:limit] if limit else prompts
