"""Prompt sets for ``validate`` and ``bench``: the shipped ones (raw code and prose, then chat) or a user's JSONL file.

One JSON object per line: ``{"prompt": "...", "id": "optional-name", "category": "optional, e.g. code"}``
(``text`` is accepted for ``prompt``), or a chat with ``"messages": [{"role": "user", "content": "..."}, ...]``
instead of ``prompt``, always rendered with the target tokenizer's chat template (trtspec/chat.py). Blank lines
and lines starting with ``#`` are skipped. Reports keep the two prompt sets apart: ``raw`` and ``chat``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.chat import user_message
from trtspec.core.errors import PromptSetError

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "assets" / "prompts"
DEFAULT_PROMPTS = PROMPTS_DIR / "default.jsonl"  # raw code and prose
CHAT_PROMPTS = PROMPTS_DIR / "chat.jsonl"  # chat messages, shipped beside the raw set


@dataclass(frozen=True)
class Prompt:
    """``text``: the raw prompt, or for a chat the last message's content (a label; ``messages`` is what runs)."""

    id: str
    text: str
    category: str = "prompt"
    messages: tuple[dict, ...] | None = None

    @property
    def prompt_set(self) -> str:
        """'chat' (rendered with the chat template) or 'raw': reports keep the two apart."""
        return "raw" if self.messages is None else "chat"

    def as_chat(self) -> Prompt:
        """A raw prompt as a single user message (``--chat``); a chat stays as it is."""
        return self if self.messages is not None else replace(self, messages=user_message(self.text))


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
    messages = _parse_messages(data, where) if "messages" in data else None
    text = messages[-1]["content"] if messages else data.get("prompt", data.get("text"))
    if messages is None and (not isinstance(text, str) or not text):
        raise PromptSetError(f'{where}: field "prompt" must be a non-empty string (got {text!r})')
    return Prompt(
        id=str(data.get("id", f"p{index}")),
        text=text,
        category=str(data.get("category", "prompt")),
        messages=messages,
    )


def _parse_messages(data: dict, where: str) -> tuple[dict, ...]:
    if "prompt" in data or "text" in data:
        raise PromptSetError(f'{where}: give "messages" (a chat) or "prompt" (raw text), not both')
    messages = data["messages"]
    valid = (
        isinstance(messages, list)
        and messages
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )
    if not valid:
        raise PromptSetError(
            f'{where}: "messages" must be a non-empty list of {{"role": "...", "content": "..."}} objects '
            f"(got {messages!r})"
        )
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


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
    return prompts
