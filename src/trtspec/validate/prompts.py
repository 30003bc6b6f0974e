"""Prompt sets for ``validate`` and ``bench``: the shipped ones (raw code and prose, chat, input-grounded) or a
user's JSONL file.

One JSON object per line: ``{"prompt": "...", "id": "optional-name", "category": "optional, e.g. code"}``
(``text`` is accepted for ``prompt``), or a chat with ``"messages": [{"role": "user", "content": "..."}, ...]``
instead of ``prompt``, always rendered with the target tokenizer's chat template (trtspec/chat.py); an optional
``"prompt_set": "name"`` labels the line's set. Blank lines and lines starting with ``#`` are skipped. Reports keep
the prompt sets apart: ``raw``, ``chat`` and any labelled set, such as the shipped ``grounded``.

The shipped sets, also named by ``--prompts raw|chat|grounded|grounded-chat``:

- ``raw`` (default.jsonl): the start of code or prose to continue;
- ``chat`` (chat.jsonl): requests through the chat template (left out for a target without one);
- ``grounded`` (grounded.jsonl): code followed by the first lines of a copy or light edit of one of its functions,
  and passages followed by the start of a sentence quoting them. The answer repeats the input, as in code edits and
  retrieval-grounded answers: where prompt lookup (core/lookup.py) finds long matches. The default selection
  includes it only for a run whose proposers look up, so the default draft-model run is as short as before;
- ``grounded-chat`` (grounded-chat.jsonl): chat requests whose answer repeats the message: edits that return the
  whole code or file they change, answers that quote a passage. Included by default where both the chat and the
  grounded sets are.
"""

from __future__ import annotations

from pathlib import Path

from trtspec.chat import Prompt, parse_prompt_line, read_prompt_file
from trtspec.core.errors import PromptSetError

__all__ = [
    "CHAT_PROMPTS",
    "DEFAULT_PROMPTS",
    "GROUNDED_CHAT_PROMPTS",
    "GROUNDED_PROMPTS",
    "SHIPPED_SETS",
    "Prompt",
    "PromptSetError",
    "load_prompts",
    "parse_prompt_line",
]

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "prompts"
DEFAULT_PROMPTS = PROMPTS_DIR / "default.jsonl"  # raw code and prose
CHAT_PROMPTS = PROMPTS_DIR / "chat.jsonl"  # chat messages, shipped beside the raw set
GROUNDED_PROMPTS = PROMPTS_DIR / "grounded.jsonl"  # the answer repeats the input (prompt lookup's case)
GROUNDED_CHAT_PROMPTS = PROMPTS_DIR / "grounded-chat.jsonl"  # the same, as chat requests
SHIPPED_SETS = {
    "raw": DEFAULT_PROMPTS,
    "chat": CHAT_PROMPTS,
    "grounded": GROUNDED_PROMPTS,
    "grounded-chat": GROUNDED_CHAT_PROMPTS,
}


def load_prompts(
    path: Path | str | None = None,
    limit: int | None = None,
    *,
    chat: bool = False,
    chat_set: bool = True,
    grounded_set: bool = False,
) -> list[Prompt]:
    """Read a prompt JSONL file, or a shipped set by name (``SHIPPED_SETS``, where no file has that name).
    None = the shipped raw set, then the chat set unless ``chat_set`` is False, then the grounded sets where
    ``grounded_set`` (the chat one where both); ``limit`` keeps the first N prompts; ``chat`` makes every raw prompt
    a single user message."""
    if path is None:
        paths = [DEFAULT_PROMPTS] + [CHAT_PROMPTS] * chat_set + [GROUNDED_PROMPTS] * grounded_set
        paths += [GROUNDED_CHAT_PROMPTS] * (chat_set and grounded_set)
        prompts = [p for shipped in paths for p in _read_prompt_file(shipped)]
    else:
        shipped = SHIPPED_SETS.get(str(path)) if not Path(path).exists() else None
        if shipped is None and not Path(path).exists():
            raise PromptSetError(
                f"{path}: no such prompt file, nor a shipped set ({'|'.join(SHIPPED_SETS)}); pass a JSONL file or "
                "a set's name"
            )
        prompts = _read_prompt_file(shipped or Path(path))
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
