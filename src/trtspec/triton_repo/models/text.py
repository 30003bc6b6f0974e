"""Tokenizer work of preprocessing/postprocessing and the orchestrator's streaming, without Triton (pure).

``TextCodec`` is the one owner of the repository's tokenizer settings (tokenizer_dir, add_special_tokens,
skip_special_tokens, max_input_len, default end/pad ids): the preprocessing and postprocessing models expose it
through upstream's tensors, and the orchestrator uses it in-process so that a request costs no BLS hop for text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtspec.core.errors import RequestError, ServerError


def _flag(params: dict[str, str], name: str, default: bool) -> bool:
    return params.get(name, str(default)).strip().lower() == "true"


class TextCodec:
    """A tokenizer with the repository's settings: prompt -> ids, stop words -> ids, ids -> text."""

    def __init__(
        self,
        tokenizer,
        *,
        add_special_tokens: bool = True,
        skip_special_tokens: bool = True,
        max_input_len: int | None = None,
        end_ids: tuple[int, ...] = (),
    ):
        self.tokenizer = tokenizer
        self.add_special_tokens, self.skip_special_tokens = add_special_tokens, skip_special_tokens
        self.max_input_len = max_input_len
        # Every id that ends a request (model_dir.end_ids: an eos list such as Llama 3's); the engines get one,
        # the tokenizer's when it is among them, as TensorRT-LLM takes a single end_id.
        self.end_ids = end_ids or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
        eos = tokenizer.eos_token_id
        self.end_id = eos if eos in self.end_ids or not self.end_ids else self.end_ids[0]
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.end_id
        # The first encode may set the fast tokenizer's truncation/padding state; do it here, before request
        # threads share the tokenizer.
        self.decode(self.tokenizer.encode("warm-up", add_special_tokens=self.add_special_tokens))

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> TextCodec:
        """From a model's config.pbtxt parameters (tokenizer_dir and the optional settings)."""
        from trtspec.core.model_dir import end_ids, load_tokenizer

        if not params.get("tokenizer_dir"):
            raise ServerError(
                "the model's config.pbtxt has no tokenizer_dir parameter (a repository from an older trtspec); "
                "redeploy it with `trtspec deploy`"
            )
        max_input_len = params.get("max_input_len")
        tokenizer = load_tokenizer(params["tokenizer_dir"])
        return cls(
            tokenizer,
            add_special_tokens=_flag(params, "add_special_tokens", True),
            skip_special_tokens=_flag(params, "skip_special_tokens", True),
            max_input_len=int(max_input_len) if max_input_len else None,
            end_ids=end_ids(params["tokenizer_dir"], tokenizer),
        )

    def encode(self, text: str) -> list[int]:
        """A prompt's ids; RequestError when empty or longer than max_input_len."""
        return encode_prompt(
            self.tokenizer,
            text,
            add_special_tokens=self.add_special_tokens,
            max_input_len=self.max_input_len,
        )

    def stop_ids(self, words: Sequence[str]) -> list[list[int]]:
        return stop_words_ids(self.tokenizer, words)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)


def encode_prompt(tokenizer, text: str, *, add_special_tokens: bool, max_input_len: int | None) -> list[int]:
    """Prompt text -> ids; RequestError when empty or longer than the engines' max_input_len."""
    if not text.strip():
        raise RequestError("text_input is empty; send a non-empty prompt")
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if max_input_len is not None and len(ids) > max_input_len:
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
