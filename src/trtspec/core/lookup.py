"""Prompt lookup (n-gram) proposals, and the names of trtspec's proposers.

A proposer supplies a round's draft tokens; the target verifies them either way, so the output does not depend on
which one did:

- ``draft``: the draft model (the default);
- ``ngram``: prompt lookup: the tokens that followed the last n tokens where those n occurred before, in the
  prompt or the output (HF ``prompt_lookup_num_tokens``, vLLM ``method: ngram``, TensorRT-LLM NGram decoding). A
  proposal costs no forward; code edits, quoting answers and summaries repeat their input, and there it is long;
- ``draft+ngram``: per row and round, whichever the adaptive machinery expects to yield more tokens per unit of
  cost (engines/loop.py).

Under sampling a lookup proposal is a point mass, so standard rejection sampling with draft probability 1 on the
proposed token keeps the target's distribution (docs/exactness.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROPOSERS = ("draft", "ngram", "draft+ngram")


@dataclass(frozen=True)
class LookupSpec:
    """vLLM's names: the shortest and longest suffix n-gram searched for (the longest first). The longest
    proposal is the request's K (vLLM's ``num_speculative_tokens``, HF's ``prompt_lookup_num_tokens``)."""

    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4


def uses_draft(proposer: str) -> bool:
    return proposer in ("draft", "draft+ngram")


def uses_lookup(proposer: str) -> bool:
    return proposer in ("ngram", "draft+ngram")


def lookup(tokens: Sequence[int], num_tokens: int, spec: LookupSpec = LookupSpec()) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the latest earlier occurrence of the longest suffix n-gram of
    ``tokens`` (n from prompt_lookup_max down to prompt_lookup_min); [] when none occurs. The latest occurrence:
    what the text did most recently is the best guess of what it does next (vLLM's choice too)."""
    tokens = list(tokens)
    size = len(tokens)
    if num_tokens <= 0:
        return []
    for n in range(min(spec.prompt_lookup_max, size - 1), spec.prompt_lookup_min - 1, -1):
        suffix = tokens[size - n :]
        # Candidate starts leave at least one token after the n-gram (an overlap with the suffix is a run); found
        # by list.index, a scan in C: a row of a batch looks up every round.
        starts, at = [], -1
        while True:
            try:
                at = tokens.index(suffix[0], at + 1, size - n)
            except ValueError:
                break
            starts.append(at)
        for start in reversed(starts):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + num_tokens]
    return []
