"""Tokenizer work of the entry models (prompts, stop words, streamed text), without Triton (pure).

``TextCodec`` is the one owner of the repository's tokenizer settings (tokenizer_dir, add_special_tokens,
skip_special_tokens, max_input_len, the end ids); both entry models use it in-process, so a request costs
no BLS hop for text. ``translator_from_parameters`` reads the other one, draft_tokenizer_dir: a draft with its own
tokenizer (core/translate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from trtspec.core.errors import RequestError, ServerError
from trtspec.triton_repo.interface import parameter_flag


class TextCodec:
    """A tokenizer with the repository's settings: prompt -> ids, stop words -> ids, ids -> text."""

    def __init__(
        self,
        tokenizer,
        *,
        add_special_tokens: bool = True,
        skip_special_tokens: bool = True,
        max_input_len: int | None = None,
        end_ids: tuple[int, ...],
    ):
        self.tokenizer = tokenizer
        self.add_special_tokens, self.skip_special_tokens = add_special_tokens, skip_special_tokens
        self.max_input_len = max_input_len
        # The model's end ids (core/token_rules.py rule 1, which needs the model folder: the caller reads them,
        # from_parameters with model_dir.end_ids); the tokenizer's eos and pad, from which each engine call's
        # end_id and pad_id are chosen (rule 3, engine_calls.py).
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.end_ids = tuple(end_ids)
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
        tokenizer = load_tokenizer(params["tokenizer_dir"], parameter_flag(params, "trust_remote_code"))
        return cls(
            tokenizer,
            add_special_tokens=parameter_flag(params, "add_special_tokens", True),
            skip_special_tokens=parameter_flag(params, "skip_special_tokens", True),
            max_input_len=int(max_input_len) if max_input_len else None,
            end_ids=end_ids(params["tokenizer_dir"], tokenizer),
        )

    @property
    def vocab_size(self) -> int:
        """How many token ids the tokenizer has, added tokens included: the ids a request may name."""
        return len(self.tokenizer)

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

    def stream_decoder(self) -> StreamDecoder | IncrementalDecoder:
        """A streamed request's text deltas: tokenizers' own DecodeStream where the tokenizer's decode is its
        backend's (a fast tokenizer without clean_up_tokenization_spaces), IncrementalDecoder otherwise."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(self.tokenizer, "clean_up_tokenization_spaces", False):
            return IncrementalDecoder(self.decode)
        return StreamDecoder(backend, self.decode, self.skip_special_tokens)


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


def stop_words_ids(tokenizer, words: Sequence[str]) -> list[list[int]]:
    return [tokenizer.encode(w, add_special_tokens=False) for w in words if w]


class IncrementalDecoder:
    """Text deltas of a growing token list, decoding only a small window per call (not all tokens each round).

    Each ``push`` decodes ``ids[prefix:]`` and ``ids[prefix:read]`` (``read``: where the emitted text ends in
    tokens; ``prefix``: ``context`` tokens before it) and emits the difference: a tokenizer that decodes a suffix
    differently from the same tokens in context (a dropped leading space, merged bytes) gives the same difference
    both times. An unfinished multi-byte character (U+FFFD at the end) is held back until its last byte arrives.
    The final push emits whatever the whole decode adds to what was sent, so the pieces add up to it.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], context: int = 4):
        self.decode, self.context = decode, context
        self.ids: list[int] = []
        self.prefix = self.read = 0
        self.sent: list[str] = []

    def push(self, new_ids: Sequence[int], final: bool = False) -> str:
        self.ids += new_ids
        if final:
            return self._flush()
        before = self.decode(self.ids[self.prefix : self.read])
        text = self.decode(self.ids[self.prefix :])
        if text.endswith("\ufffd"):
            return ""  # wait for the character's last byte
        if text.startswith(before):
            piece = text[len(before) :]
        else:  # the new tokens changed the window's earlier text: compare the whole text once
            full, sent = self.decode(self.ids), "".join(self.sent)
            if not full.startswith(sent):
                return ""
            piece, self.sent = full[len(sent) :], [sent]
        self.read = len(self.ids)
        self.prefix = max(self.read - self.context, 0)
        self.sent.append(piece)
        return piece

    def _flush(self) -> str:
        piece, self.sent = final_piece(self.decode(self.ids), self.sent)
        self.read = self.prefix = len(self.ids)
        return piece


def final_piece(full: str, sent: list[str]) -> tuple[str, list[str]]:
    """(what the whole decode ``full`` adds to the pieces ``sent``, the pieces sent after it). Nothing where ``full``
    does not start with them: sent text cannot be taken back."""
    text = "".join(sent)
    piece = full[len(text) :] if full.startswith(text) else ""
    return piece, [text + piece]


class StreamDecoder:
    """IncrementalDecoder's contract over tokenizers' ``DecodeStream`` (the fast tokenizer's incremental decode, in
    Rust: one call per round instead of two decodes of a window through the Python tokenizer). An unfinished
    multi-byte character is held back by DecodeStream itself; the final push emits whatever the whole decode adds
    to what was sent, so the pieces add up to it, except where new ids changed text already sent (below)."""

    def __init__(self, backend, decode: Callable[[Sequence[int]], str], skip_special_tokens: bool):
        self.backend, self.decode, self.skip_special_tokens = backend, decode, skip_special_tokens
        self.stream, self.restarted = self._new_stream(), False
        self.ids: list[int] = []
        self.sent: list[str] = []

    def _new_stream(self):
        from tokenizers.decoders import DecodeStream

        return DecodeStream(skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: Sequence[int], final: bool = False) -> str:
        self.ids += new_ids
        if final and not self.restarted:
            piece, self.sent = final_piece(self.decode(self.ids), self.sent)
            return piece
        if not new_ids:
            return ""
        try:
            piece = self.stream.step(self.backend, list(new_ids))
        except Exception as err:
            if not str(err).startswith("Invalid prefix"):
                raise
            # A byte-fallback tokenizer's stray byte after a complete character turns that character, already sent,
            # into U+FFFD: the stream refuses to go on. Sent text stays; a new stream goes on from these ids, after
            # the id before them (its text is sent; it gives the new text its context, such as a leading space),
            # and the whole decode no longer matches what was sent.
            self.stream, self.restarted = self._new_stream(), True
            before = self.ids[: -len(new_ids)][-1:]
            if before:
                self.stream.step(self.backend, before)
            piece = self.stream.step(self.backend, list(new_ids))
        if piece:
            self.sent.append(piece)
        return piece or ""


def translator_from_parameters(params: dict[str, str], target_tokenizer):
    """core.translate.Translator for a repository whose draft has its own tokenizer (the draft_tokenizer_dir
    parameter, values.orchestrator_values), else None: one tokenizer, draft tokens go by id (a repository rendered
    without the parameter too). A folder named there must hold the draft's tokenizer: ServerError otherwise."""
    from trtspec.core.model_dir import has_tokenizer
    from trtspec.engines.engine import draft_translator

    draft_dir = params.get("draft_tokenizer_dir", "")
    if not draft_dir:
        return None
    if not has_tokenizer(draft_dir):
        raise ServerError(
            f"draft_tokenizer_dir {draft_dir}: no tokenizer there, and this repository drafts with the draft's own "
            "tokenizer; put the draft checkpoint's tokenizer files back, or redeploy with `trtspec deploy`"
        )
    tokenizer_dir = params.get("tokenizer_dir", "")
    trust_remote_code = parameter_flag(params, "trust_remote_code")
    return draft_translator(
        target_tokenizer, tokenizer_dir, draft_dir, trust_remote_code, heterogeneous_vocab=True
    )
