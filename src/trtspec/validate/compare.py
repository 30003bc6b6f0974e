"""Pure comparisons of two generated token sequences (a reference and a candidate).

All functions take the *generated* tokens only (prompt excluded), already cut before the first stop id
(core/token_rules.py's ``comparable_pair``), so an end token that one system returns and another drops does not count
as a difference.
"""

from __future__ import annotations

import math
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


# The largest change of the reference's top-1 minus top-2 logit gap between a one-token decode and a five-token
# verification of the same positions, measured on SmolLM2-135M-Instruct chat outputs on CPU (bfloat16 0.375, float16
# 0.047, float32 below 1e-4) and rounded up: a divergence where the reference's margin is at most this can be the
# dtype's rounding; above it, the speculative path computed something else (docs/exactness.md).
NEAR_TIE_LOGITS = {"float32": 1e-3, "float16": 0.0625, "bfloat16": 0.5}


@dataclass(frozen=True)
class Divergence:
    """Where a candidate first leaves the reference, and how close the reference's own choice was there.

    ``margin`` is the reference model's top-1 minus top-2 logit at ``index`` (given the prompt and the reference's
    tokens before it), in ``dtype``; a token id is None where that sequence had already ended. ``system_dtype``:
    what the system under test computes in (None: unknown), which rounds too: the bound is the larger of the two,
    and a system dtype without one (quantized weights) can explain any divergence."""

    index: int
    reference_token: int | None
    candidate_token: int | None
    margin: float
    dtype: str
    system_dtype: str | None = None

    @property
    def near_tie_bound(self) -> float:
        bounds = [NEAR_TIE_LOGITS.get(self.dtype, 0.0)]
        if self.system_dtype is not None:
            bounds.append(NEAR_TIE_LOGITS.get(self.system_dtype, math.inf))
        return max(bounds)

    @property
    def near_tie(self) -> bool:
        """True: the dtypes' rounding can explain the divergence; False: it cannot, so something differs (an
        infinite margin: the system went on past a stop token where the reference stopped)."""
        return not math.isinf(self.margin) and self.margin <= self.near_tie_bound

    def describe(self) -> str:
        if math.isinf(self.margin):
            return (
                f"the system went on past its stop token {self.candidate_token} at token {self.index}, where the "
                "reference stopped: rounding cannot explain it (docs/exactness.md)"
            )
        dtypes = self.dtype
        if self.system_dtype not in (None, self.dtype):
            dtypes = f"{self.dtype} (reference) and {self.system_dtype} (system)"
        if math.isinf(self.near_tie_bound):
            verdict = f"{self.system_dtype} has no near-tie bound: its rounding can explain any divergence"
        elif self.near_tie:
            verdict = (
                f"within the near-tie bound {self.near_tie_bound:g} of {dtypes}: rounding can explain it"
            )
        else:
            verdict = (
                f"above the near-tie bound {self.near_tie_bound:g} of {dtypes}: rounding cannot explain it"
            )
        return (
            f"first divergence at token {self.index} (reference {self.reference_token}, got "
            f"{self.candidate_token}); the reference's top-1 minus top-2 logit there is {self.margin:.4g}, "
            f"{verdict} (docs/exactness.md)"
        )

    def to_dict(self) -> dict:
        bound = None if math.isinf(self.near_tie_bound) else self.near_tie_bound  # JSON has no infinity
        margin = None if math.isinf(self.margin) else self.margin
        return asdict(self) | {"margin": margin, "near_tie_bound": bound, "near_tie": self.near_tie}


def token_at(tokens: Sequence[int], index: int) -> int | None:
    return tokens[index] if index < len(tokens) else None
