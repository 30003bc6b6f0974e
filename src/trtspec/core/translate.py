"""Drafts with another tokenizer: the draft's tokens reach the target as text (string-level exact match).

The draft runs in its own token space, with its own KV cache. Each round:

1. ``to_draft``: the row's target tokens as the draft tokenizes their text (the whole text re-encoded: a tokenizer
   is not prefix-stable, so the draft's cache keeps only the prefix the new encoding shares with what it holds);
2. the draft continues that by K of its own tokens (greedy or sampled, from its own distribution);
3. ``to_target``: the continuation's text as target tokens, aligned at a token boundary: the last few target
   tokens and the continuation are decoded together and re-encoded with the target tokenizer; what follows the
   unchanged window is the proposal (where the re-encoding would rewrite an emitted token, the continuation is
   encoded on its own, and proposed only where those tokens write its text after the row's). A draft token that
   splits a word differently from the target still counts, because only the text matters (HF's Universal
   Assisted Generation does the same for greedy decoding);
4. the target verifies the proposal as a point mass per token (engines/sampling.py's glossary): under greedy
   decoding the output is the target's greedy output, under sampling it keeps the target's distribution, for
   any proposal, so the draft's distribution over its own vocabulary never has to be mapped (Timor et al.,
   ICML 2025, string-level exact match: lossless).

Special tokens map by their text, never by id: a chat template's ``<|im_start|>`` reaches the draft as the
draft's own special token when it has one with that text, else as plain text.

``vocab_overlap`` is what ``check`` reports: the share of the target's tokens the draft can express as one token of
the same text, and how the special tokens map.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 4  # target tokens re-encoded with a continuation: a merge across the boundary reaches back at most this far
# more target tokens tried where the window starts inside a word (SentencePiece re-encodes it as a word start)
EXTRA_WINDOW = 4
WORD_MARK = "\u2581"  # SentencePiece's word start


@dataclass(frozen=True)
class VocabOverlap:
    """How much of the target's vocabulary the draft can write as single tokens of the same text."""

    target_size: int
    draft_size: int
    shared: int  # target tokens whose text is one draft token's text
    specials: dict[str, str | None] = field(default_factory=dict)  # target special text -> draft's, or None

    @property
    def share(self) -> float:
        return self.shared / self.target_size if self.target_size else 0.0

    def describe(self) -> str:
        unmapped = sorted(t for t, d in self.specials.items() if d is None)
        specials = (
            "every special token maps by text"
            if not unmapped
            else f"special tokens without a draft twin (sent as text): {', '.join(unmapped[:4])}"
        )
        return (
            f"{self.shared} of the target's {self.target_size} tokens ({self.share:.0%}) are one draft token of "
            f"the same text (draft vocabulary {self.draft_size}); {specials}"
        )


def _texts(tokenizer) -> dict[str, int]:
    """Each token's text -> its lowest id; byte fragments that decode to no text of their own are left out."""
    out: dict[str, int] = {}
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        text = tokenizer.convert_tokens_to_string([token])
        if text and "\ufffd" not in text:
            out.setdefault(text, idx)
    return out


def vocab_overlap(target_tok, draft_tok) -> VocabOverlap:
    target_texts, draft_texts = _texts(target_tok), _texts(draft_tok)
    draft_specials = set(draft_tok.all_special_tokens)
    return VocabOverlap(
        target_size=len(target_tok.get_vocab()),
        draft_size=len(draft_tok.get_vocab()),
        shared=len(set(target_texts) & set(draft_texts)),
        specials={t: (t if t in draft_specials else None) for t in target_tok.all_special_tokens},
    )


class _Codec:
    """One tokenizer's text <-> ids without special-token handling, through its Rust backend where it has one (an
    HF fast tokenizer's ``backend_tokenizer``: a round translates several times, and the Python wrapper costs more
    than the work)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        # A SentencePiece tokenizer as Llama 2's or Mistral's: a text encoded on its own starts with a word mark
        # (its normalizer prepends ``▁``), and a word's token decoded on its own loses its space (its decoder
        # strips the one a text starts with). Byte-level BPE does neither.
        word, words = self.encode("b"), self.encode("a b")
        self.marks_words = bool(word) and self.piece(word[0]).startswith(WORD_MARK)
        self.drops_space = len(words) > 1 and not self.decode(words[-1:]).startswith(" ")

    def encode(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        if self.backend is not None:
            return self.backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def piece(self, idx: int) -> str:
        """The token's vocabulary string (SentencePiece marks a word start with ``▁``, which decode drops)."""
        if self.backend is not None:
            return self.backend.id_to_token(idx) or ""
        return self.tokenizer.convert_ids_to_tokens(idx) or ""

    def decode_after(self, before: list[int], ids: list[int]) -> str:
        """The text ``ids`` write after ``before``: a SentencePiece decoder drops the space that starts a text
        (Llama 2, Mistral: ``▁brown`` alone is "brown", after ``▁quick`` it is " brown")."""
        if not (self.drops_space and before):
            return self.decode(ids)
        head = self.decode(before)
        text = self.decode(before + ids)
        return text[len(head) :] if text.startswith(head) else self.decode(ids)


@dataclass
class DraftView:
    """A row's text as the draft's tokens, kept between rounds so that ``Translator.to_draft`` re-encodes only
    its tail: the target tokens it covers, their text, and the draft's tokens for it (start tokens excluded)."""

    target_len: int = 0
    text: str = ""
    ids: list[int] = field(default_factory=list)


class Translator:
    """Target tokens <-> the draft's, through text (see the module docstring). Tokenizers are HF tokenizers."""

    def __init__(self, target_tok, draft_tok):
        self.target_tok, self.draft_tok = target_tok, draft_tok
        self.target, self.draft = _Codec(target_tok), _Codec(draft_tok)
        # What the draft's tokenizer puts before any text (its BOS, as a Llama tokenizer adds it), and what the
        # target's puts there, which is not text to carry over.
        self.draft_start = list(draft_tok("", add_special_tokens=True)["input_ids"])
        self.target_start = list(target_tok("", add_special_tokens=True)["input_ids"])

    def _body(self, target_ids: list[int]) -> list[int]:
        """``target_ids`` without the target tokenizer's start tokens (they are no text to carry over)."""
        n = len(self.target_start)
        return target_ids[n:] if n and target_ids[:n] == self.target_start else target_ids

    def to_draft(self, target_ids: list[int], view: DraftView | None = None) -> list[int]:
        """The draft's tokens for the text of ``target_ids`` (its start tokens first). With the row's ``view``
        from the last round, only the text from the last draft token that starts a word (a space or a line
        break: byte-level BPE never merges across one) is re-encoded; the view is updated."""
        body = self._body(target_ids)
        text = self.target.decode(body)
        if view is None or view.target_len > len(body) or not text.startswith(view.text) or not view.ids:
            ids = self.draft.encode(text)
        else:
            keep = _word_start(view.ids, self.draft)
            piece = self.draft.decode(view.ids[keep:])
            # re-encoded on its own, a tail cut inside a word would start one where the text does not (a
            # SentencePiece tokenizer: "zzqx" read "zz qx"); where the pieces do not decode to the text apart (a
            # split character), the whole text
            inside_word = self.draft.marks_words and not self.draft.piece(view.ids[keep]).startswith(
                WORD_MARK
            )
            if view.text.endswith(piece) and not inside_word:
                ids = view.ids[:keep] + self.draft.encode(text[len(view.text) - len(piece) :])
            else:
                ids = self.draft.encode(text)
        if view is not None:
            view.target_len, view.text, view.ids = len(body), text, ids
        return self.draft_start + ids

    def to_target(self, target_ids: list[int], draft_continuation: list[int]) -> list[int]:
        """The target tokens that write ``draft_continuation``'s text after ``target_ids``, from the first token
        boundary the two tokenizations share: the last WINDOW target tokens (up to EXTRA_WINDOW more where those
        start inside a word) are re-encoded with the continuation, and the proposal starts after them. The
        continuation's text is read after the text it continues (a SentencePiece decoder drops a leading space).
        Where every such encoding would rewrite an emitted token (a merge across the boundary: code's blank lines,
        a word the target stopped inside; or a tokenizer whose pieces do not decode apart as they do together),
        the continuation is encoded on its own instead: the same text, split where the emitted tokens end, which
        the target may still accept (it judges every token either way); nothing is proposed where those tokens do
        not write that text after the row's (a SentencePiece tokenizer starts every text it encodes with a word)."""
        if not draft_continuation:
            return []
        body = self._body(target_ids)
        head = self.target.decode(body[-WINDOW:])
        # read after the draft's tokens for the row's last words where its decoder drops a leading space
        anchor = self.draft.encode(head) if self.draft.drops_space else []
        tail = self.draft.decode_after(anchor, draft_continuation)
        proposal = None
        for n in range(WINDOW, WINDOW + EXTRA_WINDOW + 1):
            window = body[-n:]
            ids = self.target.encode((head if n == WINDOW else self.target.decode(window)) + tail)
            if ids[: len(window)] == window:
                proposal = ids[len(window) :]
                break
            # only a window that starts inside a word (re-encoded, it starts one) gains from a longer one; a
            # merge across the boundary stays
            if len(window) < n or ids[:1] == window[:1]:
                break
        if proposal is None:
            proposal = self.target.encode(tail)
            # encoded on its own, a SentencePiece tokenizer starts it with a word (Llama 2: after "br", "own"
            # became "▁o w n", " own"): nothing is proposed where the tokens do not write the text after the row
            if self.target.marks_words and self.target.decode_after(body[-WINDOW:], proposal) != tail:
                return []
        # A continuation ending inside a character (byte-level tokens) decodes to U+FFFD: drop what it wrote. The
        # whole proposal is decoded, not its last token alone: each byte token of a whole character decodes to
        # U+FFFD on its own.
        while proposal and self.target.decode(proposal).endswith("\ufffd"):
            proposal.pop()
        return proposal


def _word_start(ids: list[int], codec: _Codec, back: int = 8) -> int:
    """The index of the last of ``ids``' final ``back`` tokens that starts a run of whitespace after a token that
    does not end in one (byte-level BPE's pre-tokenizer always splits there, however the text goes on; a run's own
    split moves as the next word arrives) or that starts a word in SentencePiece's way (``▁``: its text re-encoded
    alone gets that mark back, and decode drops the space), else len(ids) - back: where re-encoding may start
    without changing what comes before."""
    if codec.marks_words:
        for j in range(len(ids) - 1, max(len(ids) - back, 0), -1):
            if codec.piece(ids[j]).startswith(WORD_MARK):
                return j
        return max(len(ids) - back, 0)
    texts = [codec.decode([i]) for i in ids[-back - 1 :]]
    offset = len(ids) - len(texts)
    for j in range(len(texts) - 1, 0, -1):
        if texts[j][:1].isspace() and not texts[j - 1][-1:].isspace():
            return offset + j
    return max(len(ids) - back, 0)
