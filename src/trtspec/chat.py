"""Prompts to token ids: raw text as the target tokenizer encodes it, chat messages through its own chat template.

The one owner of prompt encoding for ``generate``, ``validate``, ``bench`` and the Triton client. A chat prompt is
a list of ``{"role", "content"}`` messages rendered with ``tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=True)`` and encoded with ``add_special_tokens=False``: templates write the BOS text
themselves, and the tokenizer adding its own would give the model two.

``encode_prompt`` also returns the ``text_input`` to send a Triton server, whose preprocessing encodes raw text
with the tokenizer's special tokens (upstream's default, unchanged here): for a chat prompt, the rendered text
without the leading special-token text that the tokenizer adds again, so the server sees the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtspec.core.errors import ModelError, RequestError

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
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


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
