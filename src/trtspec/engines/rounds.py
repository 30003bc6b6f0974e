"""What a runtime supplies to the one generation loop (engines/loop.py): its round, behind ``Rounds``.

    class MyRounds:                       # one per kind of runtime: the torch pair's KV slots (speculative.
        num_slots = 4                     # TorchRounds), and engines behind calls (engine_calls.EngineCallRounds:
        vocab_size = 32000                # TensorRT-LLM's runner in-process, the Triton engine models by BLS)
        max_draft_len = 8
        has_draft = True
        max_top_k = 0                     # the most tokens top-k sampling keeps (0: any)
        device = "cpu"
        def run(self, rows, num_draft, params, generator, proposals=None) -> list[Outcome]: ...
        def release(self, slot): ...
        def move(self, row, slot): ...          # carry row's state into the free slot (the loop compacts)
        def draft_behind(self, row) -> int: ...   # tokens the draft takes in before it can propose for row

A round is propose + verify for a group of rows that one batched sampling step can serve (the loop groups them):
row b drafts up to ``num_draft[b]`` tokens, the target verifies them, and the round appends what it emitted to
``rows[b].tokens``. A row may come with its draft tokens given (``proposals[b]``, prompt lookup: the loop's, once
for every runtime); the runtime verifies those without its draft model. Everything around the round (admission
into slots, stops and the EOS convention, stats, streaming events, cancellation, adaptive K) is the loop's and
exists once.

The loop keeps its rows on the lowest slots, in slot order: a joining row takes the lowest free slot, and when a
row leaves from below others and no newcomer takes its slot, the row on the highest slot moves into it (``move``).
A batch over consecutive slots in order reads the torch pair's caches as views; a batch with a hole, or out of
order, makes every layer of every forward gather the batch's whole cache (the demo target at 14 of 16 rows: a K=1
round 15.7 ms against 11.9 ms for all 16). A move carries one row's caches once (the torch pair copies them; the
HF fallback and engines behind calls hand over or re-key what they keep). Rows move only while they are all in
one sampling group: each group runs as a batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Row:
    """One sequence's state in one runtime. ``tokens``: prompt + emitted tokens (a round appends its own);
    ``slot``: where its state lives (a KV slot of the torch pair); ``target_len``/``draft_len``: tokens whose KV
    each cache holds (runtimes with caches of their own ignore them); ``max_len``: the length the loop lets it
    reach (prompt + max_new_tokens), so a round can tell how many tokens are left; ``stop_ids``: the ids that end
    it (core/token_rules.py), which engines that stop by themselves are told."""

    tokens: list[int]
    slot: int
    target_len: int = 0
    draft_len: int = 0
    max_len: int = 0
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """One row's round: the tokens it emitted (accepted draft tokens + one target token; a target-only round may
    emit several, one target step each), the draft tokens the target judged, and how many it accepted."""

    tokens: list[int]
    num_draft: int
    num_accepted: int


class Rounds(Protocol):
    """A runtime's round; see the module docstring."""

    num_slots: int  # rows in flight at most
    vocab_size: int  # ids every model of the runtime can embed (0: the runtime checks them itself)
    max_draft_len: int  # the most draft tokens a row may ask for (0: target-only)
    has_draft: bool  # a draft model proposes (False: target-only, or given proposals only)
    max_top_k: int  # the largest top_k the engines sample with (0: any); the loop refuses a larger one
    device: Any  # where a sampled request's torch.Generator lives

    def run(
        self,
        rows: list[Row],
        num_draft: list[int],
        params,
        generator,
        proposals: list[list[int] | None] | None = None,
    ) -> list[Outcome]:
        """One round for ``rows`` (same sampling settings and generator); one Outcome per row, in order. A row with
        ``proposals[b]`` (its num_draft is that proposal's length) is verified against those tokens: under sampling
        as a point mass."""
        ...

    def release(self, slot: int) -> None:
        """The row in ``slot`` left the loop (finished, cancelled or failed): drop what the runtime keeps for it."""
        ...

    def move(self, row: Row, slot: int) -> None:
        """Carry what the runtime keeps for ``row`` (its caches up to their lengths, anything keyed by its slot)
        from ``row.slot`` into ``slot``, which is free; the loop then sets ``row.slot``."""
        ...

    def draft_behind(self, row: Row) -> int:
        """How many of ``row``'s tokens its draft would take in before proposing (1-2 after a round it drafted
        in; its whole prompt before its first): what the loop prices before a row that sat out drafts again."""
        ...
