"""The orchestrator's speculative loop as pure logic over two engine calls (tensorrtllm_backend's decode.py
split: Triton I/O lives in orchestrator.py, this module replays scripted draft/target outputs in tests).

One round:
1. draft: ``draft(tokens, k)`` continues ``tokens`` by up to k tokens -> (draft_tokens, draft_logits [k, V] or None).
2. verify: ``target(tokens, draft_tokens, draft_logits)`` -> the target's new tokens: the accepted prefix of
   the draft tokens followed by one recovered (first mismatch) or bonus (all accepted) token. This is what the
   TensorRT-LLM backend returns for a request with draft_input_ids and request_output_len = k + 1.
3. emit the new tokens, cut at end_id / a stop sequence / max_tokens / max_seq_len.

K = 0 (or one token left) is a plain target continuation through the same call. With ``first_token_alone``
(the orchestrator's choice), round 0 is such a K = 0 round: the first token comes from the target's prefill alone, so it reaches
the client after one target forward instead of after a whole draft + verify round.

Draft-ahead (``draft_ahead()`` true for the round): while the target verifies ``tokens + draft`` (k > 0), the
draft continues ``tokens + draft`` by K + 1 tokens in parallel (``together``). If the target then accepts every draft
token and its bonus token equals the first of those (the draft's guess), the other K are the next round's draft,
which then skips its draft call; otherwise they are dropped. The target still decides every emitted token, so the
output is the same as without it for greedy requests, and has the same distribution for sampled ones (but a
seeded request draws other random numbers: the orchestrator does not draft ahead for those).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from trtspec.core.metrics import AcceptanceStats
from trtspec.core.sequences import common_prefix_len

DraftFn = Callable[[list[int], int, int], tuple[list[int], object]]  # (tokens, k, round) -> (draft, logits)
TargetFn = Callable[[list[int], list[int], object, int], list[int]]  # (tokens, draft, logits, round) -> new
# together(first, second) -> (first(), second()), run at the same time where the caller can (the orchestrator)
Together = Callable[[Callable[[], Any], Callable[[], Any]], tuple[Any, Any]]


def one_after_the_other(first, second):
    """The default ``together``: no parallelism (what a test replaying scripted engines needs)."""
    return first(), second()


@dataclass(frozen=True)
class Round:
    """What one verified round emits. ``tokens``: new output token ids (after cuts); ``finished``: last round."""

    tokens: list[int]
    num_draft: int
    num_accepted: int
    finished: bool
    reason: str | None = (
        None  # "length", "end_id", "stop_words", "max_seq_len" or "no_progress" when finished
    )


def _cut(generated: list[int], new: list[int], end_ids: Collection[int], stop_ids: Sequence[Sequence[int]]):
    """``new`` cut at the first end id (excluded) or after the first stop sequence (included)."""
    for i, token in enumerate(new):
        if token in end_ids:
            return new[:i], "end_id"
        tail = generated + new[: i + 1]
        for stop in stop_ids:
            if stop and tail[-len(stop) :] == list(stop):
                return new[: i + 1], "stop_words"
    return new, None


def speculate(
    prompt: list[int],
    *,
    max_tokens: int,
    num_draft_tokens: int,
    max_seq_len: int,
    draft: DraftFn,
    target: TargetFn,
    end_ids: Collection[int] = (),
    stop_ids: Sequence[Sequence[int]] = (),
    stats: AcceptanceStats | None = None,
    first_token_alone: bool = False,
    draft_ahead: Callable[[], bool] | None = None,
    together: Together = one_after_the_other,
) -> Iterator[Round]:
    """Yield one Round per target verification until max_tokens, an end id (any of ``end_ids``), a stop sequence
    or max_seq_len."""
    tokens, generated = list(prompt), []
    round_index = 0
    ready = None  # the next round's draft (tokens, logits or None), drafted ahead and confirmed
    while True:
        budget = min(max_tokens - len(generated), max_seq_len - len(tokens))
        if budget <= 0:
            reason = "length" if len(generated) >= max_tokens else "max_seq_len"
            yield Round([], 0, 0, True, reason)
            return
        k = min(num_draft_tokens, budget - 1)  # the target always adds one token: keep room for it
        if first_token_alone and round_index == 0:
            k = 0
        if k == 0:
            draft_tokens, draft_logits = [], None
        elif ready is not None:  # K tokens, at least k
            draft_tokens, draft_logits = ready
        else:
            draft_tokens, draft_logits = draft(tokens, k, round_index)
        draft_tokens, ready = list(draft_tokens)[:k], None
        if draft_logits is not None:
            draft_logits = draft_logits[:k]
        # Draft ahead only beside a verification of drafts (never beside the prefill round: it would slow the first
        # token) and only if a next round can draft: room for this round's k + 1 tokens and K + 1 more.
        ahead_k = num_draft_tokens + 1
        ahead = (
            draft_ahead is not None
            and k > 0
            and budget >= k + 3
            and len(tokens) + k + ahead_k <= max_seq_len
            and draft_ahead()
        )
        verify = partial(target, tokens, draft_tokens, draft_logits, round_index)
        if ahead:
            new, (guess, guess_logits) = together(
                verify, partial(draft, tokens + draft_tokens, ahead_k, round_index + 1)
            )
        else:
            new = verify()
        new = list(new)
        accepted = common_prefix_len(draft_tokens, new)
        # Only the accepted prefix and the one recovered/bonus token after it are verified output; anything an
        # engine returns beyond that is not part of this round (every round emits accepted + 1 tokens).
        new = new[: accepted + 1]
        if stats is not None:
            stats.record_round(len(draft_tokens), accepted)
        if not new:
            yield Round([], len(draft_tokens), accepted, True, "no_progress")
            return
        new, reason = _cut(generated, new[:budget], end_ids, stop_ids)
        generated += new
        tokens += new
        if stats is not None:
            stats.generated_tokens += len(new)
        round_index += 1
        if reason is None and len(generated) >= max_tokens:
            reason = "length"
        guess = list(guess)[:ahead_k] if ahead else []
        if reason is None and guess[1:] and new == draft_tokens + guess[:1]:
            ready = (guess[1:], None if guess_logits is None else guess_logits[1:ahead_k])
        yield Round(new, len(draft_tokens), accepted, reason is not None, reason)
        if reason is not None:
            return
