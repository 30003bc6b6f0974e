"""A deterministic toy draft/target pair behind engine calls: what the engine-call round and the orchestrator's
tests replay instead of engines (tensorrtllm_backend's all_models/tests/test_decode.py style)."""

from __future__ import annotations


def toy_next(tokens: list[int]) -> int:
    """The toy target's greedy next token of a sequence (never 1)."""
    return (sum(tokens) * 7 + len(tokens)) % 50 + 3


def toy_greedy(prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        out.append(toy_next(out))
    return out[len(prompt) :]


def toy_target(tokens, draft_tokens, draft_logits, round_index):
    """TensorRT-LLM's answer to a request with draft_input_ids: accepted prefix + one recovered / bonus token."""
    new, seq = [], list(tokens)
    for d in draft_tokens:
        if d != toy_next(seq):
            break
        new.append(d)
        seq.append(d)
    return new + [toy_next(seq)]


def toy_draft(kind: str):
    """A draft that agrees with the toy target always, never, or except where the length is a multiple of 3."""

    def draft(tokens, k, round_index):
        if kind == "same_as_target":
            return toy_greedy(tokens, k), None
        if kind == "every_third_wrong":
            out = list(tokens)
            for _ in range(k):
                out.append(toy_next(out) if len(out) % 3 else 1)
            return out[len(tokens) :], None
        return [1] * k, None

    return draft
