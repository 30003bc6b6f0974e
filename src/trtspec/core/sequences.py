"""Token-sequence helpers shared by the engines, the Triton python models and validation."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: accepted draft tokens, reusable KV-cache positions, agreement."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def draft_room(length: int, max_seq_len: int) -> int:
    """Draft tokens a row of ``length`` tokens may still take within ``max_seq_len`` (0 or less: none). For a
    draft with another tokenizer, whose tokens the target's limits do not count."""
    return max_seq_len - length
