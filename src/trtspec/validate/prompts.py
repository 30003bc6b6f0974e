"""Prompt sets for ``validate`` and ``bench``: the shipped ones (raw code and prose, then chat) or a user's JSONL file.

One JSON object per line: ``{"prompt": "...", "id": "optional-name", "category": "optional, e.g. code"}``
(``text`` is accepted for ``prompt``), or a chat with ``"messages": [{"role": "user", "content": "..."}, ...]``
instead of ``prompt``, always rendered with the target tokenizer's chat template (trtspec/chat.py). Blank lines
and lines starting with ``#`` are skipped. Reports keep the two prompt sets apart: ``raw`` and ``chat``.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.chat import Prompt, parse_prompt_line, read_prompt_file
from trtspec.core.errors import PromptSetError

__all__ = ["CHAT_PROMPTS", "DEFAULT_PROMPTS", "Prompt", "PromptSetError", "load_prompts", "parse_prompt_line"]

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "prompts"
DEFAULT_PROMPTS = PROMPTS_DIR / "default.jsonl"  # raw code and prose
CHAT_PROMPTS = PROMPTS_DIR / "chat.jsonl"  # chat messages, shipped beside the raw set


def load_prompts(
    path: Path | str | None = None, limit: int | None = None, *, chat: bool = False, chat_set: bool = True
) -> list[Prompt]:
    """Read a prompt JSONL file (None = the shipped raw set, then the shipped chat set unless ``chat_set`` is
    False); ``limit`` keeps the first N prompts; ``chat`` makes every raw prompt a single user message."""
    if path is None:
        paths = [DEFAULT_PROMPTS, CHAT_PROMPTS] if chat_set else [DEFAULT_PROMPTS]
        prompts = [p for shipped in paths for p in _read_prompt_file(shipped)]
    else:
        prompts = _read_prompt_file(Path(path))
    prompts = prompts[:limit] if limit else prompts
    return [p.as_chat() for p in prompts] if chat else prompts


def _read_prompt_file(path: Path) -> list[Prompt]:
    prompts = list(read_prompt_file(path))
    if not prompts:
        raise PromptSetError(f'{path}: no prompts; add lines like {{"prompt": "def add(a, b):"}}')
    ids = [p.id for p in prompts]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise PromptSetError(f"{path}: prompt id {duplicate!r} appears more than once; ids must be unique")
    return prompts
