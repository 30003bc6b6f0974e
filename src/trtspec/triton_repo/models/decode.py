"""The orchestrator's round over two engine calls (tensorrtllm_backend's decode.py split: Triton I/O lives in
orchestrator.py; tests replay scripted draft/target outputs). The loop around it is engines/loop.py's, the one
every runtime runs: stops, stats, adaptive K, cancellation and first_token_alone are there.

One round (``EngineRounds.run``, one request: the orchestrator serves each request on a thread of its own):
1. draft: ``draft(tokens, k, round)`` continues ``tokens`` by up to k tokens -> (draft_tokens, draft_logits [k, V]
   or None).
2. verify: ``target(tokens, draft_tokens, draft_logits, round)`` -> the target's new tokens: the accepted prefix of
   the draft tokens followed by one recovered (first mismatch) or bonus (all accepted) token. This is what the
   TensorRT-LLM backend returns for a request with draft_input_ids and request_output_len = k + 1. K = 0 (or a
   draft that returned nothing) is a plain target step through the same call.

Draft-ahead (``draft_ahead()`` true for the round): while the target verifies ``tokens + draft`` (k > 0), the draft
continues ``tokens + draft`` by K + 1 tokens in parallel (``together``; K: the request's pinned K, else this round's).
If the target then accepts every draft token and its bonus token equals the first of those (the draft's guess), the
other K are the next round's draft (up to the K the loop asks for then), which then skips its draft call; otherwise
they are dropped. The target still decides every emitted token, so the output is the same as without it for greedy
requests, and has the same distribution for sampled ones (but a seeded request draws other random numbers: the
orchestrator does not draft ahead for those).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from trtspec.core.sequences import common_prefix_len
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.loop import GenerationLoop, RowEvent
from trtspec.engines.rounds import Outcome, Row
from trtspec.engines.sampling import SamplingParams

DraftFn = Callable[[list[int], int, int], tuple[list[int], object]]  # (tokens, k, round) -> (draft, logits)
TargetFn = Callable[[list[int], list[int], object, int], list[int]]  # (tokens, draft, logits, round) -> new
# together(first, second) -> (first(), second()), run at the same time where the caller can (the orchestrator)
Together = Callable[[Callable[[], Any], Callable[[], Any]], tuple[Any, Any]]


def one_after_the_other(first, second):
    """The default ``together``: no parallelism (what a test replaying scripted engines needs)."""
    return first(), second()


class EngineRounds:
    """One request's rounds through the draft and target engine calls (engines/rounds.py ``Rounds``, one slot);
    see the module docstring. ``max_seq_len``: the engines' limit, which a drafted-ahead guess must fit too."""

    num_slots = 1
    vocab_size = 0  # prompts come from the repository's tokenizer; the engines check ids themselves
    device = "cpu"  # no torch sampling here: the engines sample

    def __init__(
        self,
        draft: DraftFn,
        target: TargetFn,
        *,
        max_draft_len: int,
        max_seq_len: int,
        draft_ahead: Callable[[], bool] | None = None,
        together: Together = one_after_the_other,
    ):
        self.draft, self.target = draft, target
        self.max_draft_len, self.max_seq_len = max_draft_len, max_seq_len
        self.draft_ahead, self.together = draft_ahead, together
        self.release(0)

    def release(self, slot: int) -> None:
        self.round_index = 0  # the engines' seeds follow it
        self.ready: tuple[list[int], Any] | None = None  # the next round's draft, drafted ahead and confirmed

    def run(self, rows: list[Row], num_draft: list[int], params: SamplingParams, generator) -> list[Outcome]:
        ((row,), (k,)) = rows, num_draft
        tokens, round_index = row.tokens, self.round_index
        if k == 0:
            draft_tokens, draft_logits = [], None
        elif self.ready is not None:
            draft_tokens, draft_logits = self.ready
        else:
            draft_tokens, draft_logits = self.draft(tokens, k, round_index)
        draft_tokens, self.ready = list(draft_tokens)[:k], None
        if draft_logits is not None:
            draft_logits = draft_logits[: len(draft_tokens)]
        k = len(draft_tokens)
        ahead_k = (k if params.num_draft_tokens is None else params.num_draft_tokens) + 1
        verify = partial(self.target, tokens, draft_tokens, draft_logits, round_index)
        if self._ahead(row, k, ahead_k):
            draft_next = partial(self.draft, tokens + draft_tokens, ahead_k, round_index + 1)
            new, (guess, guess_logits) = self.together(verify, draft_next)
        else:
            new, guess, guess_logits = verify(), [], None
        accepted = common_prefix_len(draft_tokens, list(new))
        # Only the accepted prefix and the one recovered/bonus token after it are verified output; anything an
        # engine returns beyond that is not part of this round (every round emits accepted + 1 tokens).
        new = list(new)[: accepted + 1]
        guess = list(guess)[:ahead_k]
        if guess[1:] and new == draft_tokens + guess[:1]:
            self.ready = (guess[1:], None if guess_logits is None else guess_logits[1:ahead_k])
        row.tokens += new
        self.round_index += 1
        return [Outcome(new, k, accepted)]

    def _ahead(self, row: Row, k: int, ahead_k: int) -> bool:
        """Draft ahead only beside a verification of drafts (never beside the prefill round: it would slow the
        first token) and only if a next round can draft: room for this round's k + 1 tokens and K + 1 more."""
        budget = row.max_len - len(row.tokens)
        return (
            self.draft_ahead is not None
            and k > 0
            and budget >= k + 3
            and len(row.tokens) + k + ahead_k <= self.max_seq_len
            and self.draft_ahead()
        )


def speculate(
    prompt: list[int],
    params: SamplingParams,
    rounds: EngineRounds,
    *,
    first_token_alone: bool = False,
    k_policy: KPolicy = KPolicy(),
    cancelled: Callable[[], bool] = lambda: False,
    **options,
) -> Iterator[RowEvent]:
    """One request's generation: the one loop over its EngineRounds, one event per round (the last one finished).
    ``options``: GenerationLoop.add's (request.to_job gives them: end ids left out, as TensorRT-LLM's end_id);
    ``cancelled()`` is asked after each round. RequestError for a prompt the loop cannot take."""
    loop = GenerationLoop(
        rounds, max_seq_len=rounds.max_seq_len, first_token_alone=first_token_alone, k_policy=k_policy
    )
    loop.add(0, prompt, params, **options)
    while loop.busy:
        yield from loop.step()
        if loop.busy and cancelled():
            loop.cancel(0)
