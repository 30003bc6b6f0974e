"""Tokenizer work of preprocessing/postprocessing and the orchestrator's streaming, without Triton (pure)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtspec.errors import RequestError


def encode_prompt(tokenizer, text: str, *, add_special_tokens: bool, max_input_len: int) -> list[int]:
    """Prompt text -> ids; RequestError when empty or longer than the engines' max_input_len."""
    if not text.strip():
        raise RequestError("text_input is empty; send a non-empty prompt")
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if len(ids) > max_input_len:
        raise RequestError(
            f"the prompt has {len(ids)} tokens, more than max_input_len {max_input_len}; shorten it"
        )
    return ids


def to_word_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """TensorRT-LLM's stop/bad words layout: [2, N] int32, row 0 the concatenated ids, row 1 the end offsets
    (padded with -1)."""
    flat = [t for w in words for t in w]
    offsets = np.cumsum([len(w) for w in words]).tolist()
    width = max(len(flat), 1)
    out = np.full((2, width), -1, dtype=np.int32)
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    if not flat:
        out[0, 0] = 0
    return out


def from_word_list(array: np.ndarray) -> list[list[int]]:
    """Inverse of to_word_list: the token sequences of a [2, N] array."""
    ids, offsets = array[0].tolist(), [o for o in array[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        words.append(ids[start:end])
        start = end
    return [w for w in words if w]


def stop_words_ids(tokenizer, words: Sequence[str]) -> list[list[int]]:
    return [tokenizer.encode(w, add_special_tokens=False) for w in words if w]


class IncrementalText:
    """Text deltas of a growing token list: decode everything, emit what is new, hold back an unfinished
    multi-byte character (the decoder shows it as U+FFFD until its last byte arrives)."""

    def __init__(self) -> None:
        self.sent = ""

    def delta(self, full_text: str, final: bool) -> str:
        if not final and full_text.endswith("\ufffd"):
            return ""
        if not full_text.startswith(self.sent):  # a re-segmented tail: resend from the common prefix
            common = 0
            while common < min(len(full_text), len(self.sent)) and full_text[common] == self.sent[common]:
                common += 1
            self.sent = self.sent[:common]
        new = full_text[len(self.sent) :]
        self.sent = full_text
        return new
