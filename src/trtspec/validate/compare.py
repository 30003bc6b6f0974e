"""Pure comparisons of two generated token sequences (a reference and a candidate).

All functions take the *generated* tokens only (prompt excluded), already cut before the first stop id
(core/token_rules.py's ``comparable``), so an end token that one system returns and another drops does not count
as a difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from trtspec.core.sequences import common_prefix_len


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first position where the two differ (a length difference diverges at the shorter's end);
    None when they are identical."""
    n = common_prefix_len(reference, candidate)
    return None if n == len(reference) == len(candidate) else n


def token_agreement(reference: Sequence[int], candidate: Sequence[int]) -> float:
    """Fraction of positions, over the longer sequence, holding the same token in both (1.0 for two empties)."""
    longest = max(len(reference), len(candidate))
    if longest == 0:
        return 1.0
    return sum(ref == cand for ref, cand in zip(reference, candidate, strict=False)) / longest


@dataclass(frozen=True)
class Comparison:
    """How a candidate sequence compares with a reference sequence."""

    exact_match: bool
    first_divergence: int | None
    token_agreement: float
    reference_len: int
    candidate_len: int

    def to_dict(self) -> dict:
        return asdict(self)


def compare(reference: Sequence[int], candidate: Sequence[int]) -> Comparison:
    divergence = first_divergence(reference, candidate)
    return Comparison(
        exact_match=divergence is None,
        first_divergence=divergence,
        token_agreement=token_agreement(reference, candidate),
        reference_len=len(reference),
        candidate_len=len(candidate),
    )


def exact_match_rate(comparisons: Sequence[Comparison]) -> float:
    return sum(c.exact_match for c in comparisons) / len(comparisons) if comparisons else 0.0


def mean_agreement(comparisons: Sequence[Comparison]) -> float:
    return sum(c.token_agreement for c in comparisons) / len(comparisons) if comparisons else 0.0
