"""Prompts to token ids: raw text as the target tokenizer encodes it, chat messages through its own chat template.
Also the one reader of prompt files (``read_prompt_file``: JSONL lines of ``prompt`` or ``messages``, or plain text
lines), which validate, bench and align share.

The one owner of prompt encoding for ``generate``, ``validate``, ``bench`` and the Triton client. A chat prompt is
a list of ``{"role", "content"}`` messages rendered with ``tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`` and encoded with ``add_special_tokens=False``: templates write the BOS text
themselves, and the tokenizer adding its own would give the model two.

``encode_prompt`` also returns the ``text_input`` to send a Triton server, whose entry model encodes raw text
with the tokenizer's special tokens (upstream's default, unchanged here): for a chat prompt, the rendered text
without the leading special-token text that the tokenizer adds again, so the server sees the same ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.core.errors import ModelError, PromptSetError, RequestError

Messages = Sequence[dict]  # [{"role": str, "content": str}, ...]


def user_message(text: str) -> tuple[dict, ...]:
    """A plain prompt as a chat: one user message (what ``--chat`` does)."""
    return ({"role": "user", "content": text},)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: Messages) -> str:
    """The chat template's text for ``messages``, ending with the assistant's generation prompt."""
    if not has_chat_template(tokenizer):
        raise ModelError(
            f"{tokenizer.name_or_path}: the tokenizer has no chat template (chat_template in "
            "tokenizer_config.json); use an instruct model's tokenizer, or drop --chat and the prompt file's "
            '"messages" lines'
        )
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    except TemplateError as err:  # a template's raise_exception: Gemma's "System role not supported"
        raise ModelError(
            f"{tokenizer.name_or_path}: the chat template refuses these messages ({err}); change the messages "
            "to what the model's template takes"
        ) from None


def encode_prompt(tokenizer, text: str, messages: Messages | None = None) -> tuple[str, list[int]]:
    """(text_input, token ids) of one prompt: ``text`` raw (the tokenizer's special tokens added), or ``messages``
    rendered with the chat template when given."""
    if messages is None:
        return text, tokenizer(text).input_ids
    rendered = render_chat(tokenizer, messages)
    ids = tokenizer(rendered, add_special_tokens=False).input_ids
    return _without_added_prefix(tokenizer, rendered), ids


def _without_added_prefix(tokenizer, rendered: str) -> str:
    """``rendered`` less the special-token text at its start that encoding with special tokens adds anyway."""
    added = tokenizer("", add_special_tokens=True).input_ids  # e.g. [bos] for Llama-style tokenizers
    prefix = tokenizer.decode(added, skip_special_tokens=False) if added else ""
    return rendered[len(prefix) :] if prefix and rendered.startswith(prefix) else rendered


def check_text_input(tokenizer, text_input: str, token_ids: list[int], what: str) -> None:
    """RequestError unless a server encoding ``text_input`` (special tokens added) gets ``token_ids``: a chat
    template without the BOS its tokenizer adds cannot be sent as raw text_input."""
    if tokenizer(text_input).input_ids != list(token_ids):
        raise RequestError(
            f"{what}: the chat template's rendering does not survive the server's tokenisation (text_input is "
            "encoded with the tokenizer's special tokens, which adds tokens the template does not write); "
            "validate this prompt in-process instead of with --url"
        )


# ---------------------------------------------------------------- prompt files


@dataclass(frozen=True)
class Prompt:
    """``text``: the raw prompt, or for a chat the last message's content (a label; ``messages`` is what runs).
    ``set_label``: the prompt set a file line names (``"prompt_set"``, e.g. the shipped ``grounded``)."""

    id: str
    text: str
    category: str = "prompt"
    messages: tuple[dict, ...] | None = None
    set_label: str | None = None

    @property
    def prompt_set(self) -> str:
        """The set reports keep apart: the line's own label, else 'chat' (rendered with the chat template) or
        'raw'."""
        return self.set_label or ("raw" if self.messages is None else "chat")

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
    try:  # JSON's \ud800 escapes decode to half a character, which no tokenizer takes
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        half = err.object[err.start : err.end].encode("unicode_escape").decode()
        raise PromptSetError(
            f"{where}: holds half of a UTF-16 pair ({half}), as text cut inside a character does; fix the escape "
            "or save the text as UTF-8"
        ) from None
    messages = _parse_messages(data, where) if "messages" in data else None
    text = messages[-1]["content"] if messages else data.get("prompt", data.get("text"))
    if messages is None and (not isinstance(text, str) or not text):
        raise PromptSetError(f'{where}: field "prompt" must be a non-empty string (got {text!r})')
    return Prompt(
        id=str(data.get("id", f"p{index}")),
        text=text,
        category=str(data.get("category", "prompt")),
        messages=messages,
        set_label=_set_label(data, where, messages is not None),
    )


def _set_label(data: dict, where: str, chat: bool) -> str | None:
    """A line's ``prompt_set`` (a report label: letters, digits, - and _), which must not call raw text a chat."""
    label = data.get("prompt_set")
    if label is None:
        return None
    if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", label):
        raise PromptSetError(
            f'{where}: "prompt_set" must be a name of letters, digits, - and _ (got {label!r}), e.g. "grounded"'
        )
    if label in ("raw", "chat") and label != ("chat" if chat else "raw"):
        kind = '"messages"' if chat else '"prompt"'
        raise PromptSetError(f'{where}: "prompt_set" {label!r} contradicts the line\'s {kind}; drop it')
    return label


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


def read_prompt_file(path: Path, text_lines: bool = False) -> Iterator[Prompt]:
    """The prompts of a file, one line at a time (a large file is never held whole): JSONL lines (blank lines
    and ``#`` lines skipped), or with ``text_lines`` one raw prompt per non-blank line. Read errors name the file."""
    try:
        with open(path, encoding="utf-8") as lines:
            index = 0
            for number, line in enumerate(lines, start=1):
                if not line.strip() or (not text_lines and line.lstrip().startswith("#")):
                    continue
                if text_lines:
                    yield Prompt(id=f"p{index}", text=line.rstrip("\n"))
                else:
                    yield parse_prompt_line(line, f"{path}:{number}", index)
                index += 1
    except OSError as err:
        raise PromptSetError(
            f"{path}: cannot read the prompt file ({err.strerror}); pass a JSONL file"
        ) from None
    except UnicodeDecodeError as err:
        raise PromptSetError(
            f"{path}: not UTF-8 text (byte {err.start}); save the prompt file as UTF-8 JSONL"
        ) from None
