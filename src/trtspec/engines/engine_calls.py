"""ONE round for every runtime whose draft and target are engines behind calls, over two adapters:

    class EngineCalls(Protocol):          # TensorRT-LLM's C++ runner in-process (engines/trtllm_runner.py), the
        draft_vocab = 151936              # Triton engine models through BLS (triton_repo/models/orchestrator.py)
        def propose(self, prefixes, num_tokens, call, want_logits) -> list[Draft]
        def verify(self, prefixes, drafts, draft_logits, max_new_tokens, call) -> list[list[int]]

    rounds = EngineCallRounds(calls, max_draft_len=4, num_slots=8, use_draft_logits=False, ...)
    GenerationLoop(rounds, ...)           # engines/loop.py: the one loop runs it like any other Rounds

One round (``EngineCallRounds.run``) for rows that share sampling settings (the loop groups them):
1. call settings: sampling, a seed per call and the engines' stops (core/token_rules.py rules 3 and 5);
2. propose: the draft engine continues each drafting row by its K tokens (the draft's logits too when draft
   logits decide acceptance); a row given a draft ahead last round (below) uses that instead;
3. verify: the target engine takes each row with its draft tokens (draft_input_ids, request_output_len = K + 1)
   and returns the accepted draft tokens followed by one target token (recovered at the first mismatch, or the
   bonus token when all were accepted); a row with no draft gets a plain target step;
4. accept: the accepted count is the leading run of draft tokens equal to the target's tokens (exact under both
   acceptance rules: a recovered token never equals the draft token it replaces), and only those plus the one
   target token after them are this round's output, whatever else an engine returned. TensorRT-LLM leaves the end
   token out of its output (its sampling and acceptance kernels count it in no sequence length: "Seq len should
   always contain only tokens to be outputted"), so a call that returned fewer tokens than it had to (no target
   token after the accepted ones) ended at the call's end_id, which is put back: the loop's stop rules then end
   the request there, as for a runtime that returns it. (Without it, a sampled request would draw that position
   again next round and end with the target's end token at about the square of its probability.)

A request pinned to target-only decoding (``num_draft_tokens=0``, or no draft engine) gets its whole budget in one
plain call where ``target_only_in_one_call`` (native TensorRT-LLM decoding: the speed baseline), else one token
per round (a stream that sends every token).

Draft-ahead (a one-row round whose ``draft_ahead()`` is true): while the target verifies ``tokens + draft``, the
draft continues ``tokens + draft`` by K + 1 tokens beside it (``together``; K: the request's pinned K, else this
round's). If the target accepts every draft token and its bonus token is the draft's first guess, the other K
tokens are the next round's draft, which then skips its propose call; otherwise they are dropped. The target still
decides every token, so greedy output is unchanged and sampled output keeps its distribution (a seeded request
would draw other random numbers: callers do not draft ahead for those).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import torch

from trtspec.core.sequences import common_prefix_len, draft_room
from trtspec.core.token_rules import EngineStops, engine_stops, round_seeds
from trtspec.core.translate import DraftView
from trtspec.core.trtllm import TRTLLM_TOP_K_MAX
from trtspec.core.vocab import draft_input_ids
from trtspec.engines.rounds import Outcome, Row
from trtspec.engines.sampling import SamplingParams, to_vocab

# together(first, second) -> (first(), second()), run at the same time where the caller can (the orchestrator)
Together = Callable[[Callable[[], Any], Callable[[], Any]], tuple[Any, Any]]


def one_after_the_other(first, second):
    """The default ``together``: no parallelism."""
    return first(), second()


@dataclass(frozen=True)
class Call:
    """What every engine call of one round shares: sampling (``greedy``: SamplingParams.greedy's answer; top_k 0 /
    top_p 1 = off), the call's seed (None: the engine's own), and the engines' stops."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    stops: EngineStops


@dataclass
class Draft:
    """One row's proposal: its tokens and, when asked for, their raw logits [len(tokens), V_draft]."""

    tokens: list[int]
    logits: Any = None


class EngineCalls(Protocol):
    """One transport to a draft engine and a target engine; see the module docstring."""

    draft_vocab: int  # ids the draft engine can embed (0: the target's); a padded-vocabulary draft has fewer
    target_logit_rows: int  # rows of the target's draft-logits buffer (draft logits are padded to it)

    def propose(
        self, prefixes: list[list[int]], num_tokens: int, call: Call, want_logits: bool
    ) -> list[Draft]:
        """The draft engine continues each prefix by up to ``num_tokens`` tokens (fewer where it must stop)."""
        ...

    def verify(
        self,
        prefixes: list[list[int]],
        drafts: list[list[int]] | None,
        draft_logits: list | None,
        max_new_tokens: int,
        call: Call,
    ) -> list[list[int]]:
        """The target engine's new tokens per prefix: with ``drafts``, a verification (accepted draft tokens +
        one target token); without, a plain continuation of up to ``max_new_tokens`` tokens."""
        ...


class EngineCallRounds:
    """The round over an ``EngineCalls`` (engines/rounds.py ``Rounds``); see the module docstring.
    ``max_seq_len``: the engines' limit, which a drafted-ahead guess must fit too."""

    def __init__(
        self,
        calls: EngineCalls,
        *,
        max_draft_len: int,
        num_slots: int,
        max_seq_len: int,
        vocab_size: int = 0,
        use_draft_logits: bool = False,
        tokenizer_eos: int | None = None,
        pad_id: int | None = None,
        target_only_in_one_call: bool = True,
        draft_ahead: Callable[[], bool] | None = None,
        together: Together = one_after_the_other,
        has_draft: bool = True,
        translator=None,
    ):
        self.calls, self.max_draft_len, self.num_slots = calls, max_draft_len, num_slots
        self.has_draft = has_draft  # False: a target engine for external draft tokens alone (prompt lookup)
        # TensorRT-LLM clips a larger top_k to this with a log warning, so the request would be sampled otherwise
        # than it asked; the loop refuses it instead
        self.max_top_k = TRTLLM_TOP_K_MAX
        # core/translate.py: the draft engine has a tokenizer of its own; its tokens reach the target as text, and
        # it stops at its own end token (the round's stop ids are target ids, which name other tokens there).
        # That is the draft tokenizer's eos, not rule 1's end ids: their other input, the draft's generation
        # config, is in its model folder, which this round never sees (the translator holds the tokenizer only).
        # A draft end id left out costs at most draft tokens the target rejects: the target's stop ids end the
        # request, so the output is the same.
        self.translator = translator
        self.draft_stops = None
        if translator is not None:
            eos = translator.draft_tok.eos_token_id
            self.draft_stops = engine_stops(
                () if eos is None else (eos,), eos, translator.draft_tok.pad_token_id
            )
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size
        self.use_draft_logits = use_draft_logits
        self.tokenizer_eos, self.pad_id = tokenizer_eos, pad_id
        self.target_only_in_one_call = target_only_in_one_call
        self.draft_ahead, self.together = draft_ahead, together
        self.device = "cpu"  # sampled requests' generators only draw the calls' seeds
        self.ready: dict[int, Draft] = {}  # per slot: the next round's draft, drafted ahead and confirmed
        self.views: dict[int, DraftView] = {}  # per slot, with a translator: its text as the draft's tokens
        # per slot: the row's length when the draft engine last saw it (what its KV cache can reuse)
        self.drafted_len: dict[int, int] = {}

    def release(self, slot: int) -> None:
        self.ready.pop(slot, None)
        self.views.pop(slot, None)
        self.drafted_len.pop(slot, None)

    def move(self, row: Row, slot: int) -> None:
        """The engines keep no slots: only what is kept here per slot follows the row."""
        for kept in (self.ready, self.views, self.drafted_len):
            if row.slot in kept:
                kept[slot] = kept.pop(row.slot)

    def draft_behind(self, row: Row) -> int:
        """Tokens the draft engine has not seen for the row (none where a draft-ahead is waiting)."""
        if row.slot in self.ready:
            return 0
        return len(row.tokens) - self.drafted_len.get(row.slot, 0)

    def run(
        self,
        rows: list[Row],
        num_draft: list[int],
        params: SamplingParams,
        generator,
        proposals: list[list[int] | None] | None = None,
    ) -> list[Outcome]:
        """Rows whose engines stop alike go in one call each (a TensorRT-LLM call takes one end_id). A call takes one
        seed (ModelRunnerCpp builds one SamplingConfig for all its requests) and TensorRT-LLM starts each
        request's random state from it, so the sampled rows of one call draw the same numbers: rows that hold the
        same tokens go in calls of their own (one prompt sent four times would sample one text four times); rows
        that differ keep one call (each row's text follows the target's distribution; rows' draws are alike).
        ``proposals``: rows whose draft tokens are given (prompt lookup) skip the draft engine."""
        given = proposals or [None] * len(rows)
        outcomes: dict[int, Outcome] = {}
        calls: dict[tuple, list[int]] = {}
        seen: dict[tuple, int] = {}
        for i, row in enumerate(rows):
            twin = 0  # the how-manieth sampled row holding these tokens and stop ids
            if not params.greedy:
                key = (row.stop_ids, tuple(row.tokens))
                twin = seen[key] = seen.get(key, -1) + 1
            calls.setdefault((row.stop_ids, twin), []).append(i)
        sampling = (params.greedy, params.temperature, params.top_k, params.top_p)
        for (stop_ids, _), idx in calls.items():
            stops = engine_stops(stop_ids, self.tokenizer_eos, self.pad_id)
            seeds = round_seeds(params.greedy, generator, calls=3)  # target, draft, draft ahead
            target, draft, ahead = (Call(*sampling, seed, stops) for seed in seeds)
            if self.draft_stops is not None:
                draft = replace(draft, stops=self.draft_stops)
            group = self._run(
                [rows[i] for i in idx],
                [num_draft[i] for i in idx],
                params,
                (target, draft, ahead),
                [given[i] for i in idx],
            )
            outcomes.update(zip(idx, group, strict=True))
        return [outcomes[i] for i in range(len(rows))]

    def _run(
        self,
        rows: list[Row],
        num_draft: list[int],
        params,
        calls: tuple[Call, Call, Call],
        given: list[list[int] | None],
    ) -> list[Outcome]:
        target, draft, ahead = calls
        if self.max_draft_len == 0 or params.num_draft_tokens == 0:
            if self.target_only_in_one_call:
                budgets = [row.max_len - len(row.tokens) for row in rows]
                outs = self.calls.verify([r.tokens for r in rows], None, None, max(budgets), target)
                end = target.stops.end_id
                # An adapter may cap one call's tokens so its longest row fits the engine (TrtllmCalls: its
                # max_seq_len, which is this round's or more): a row is owed no more than that cap.
                cap = self.max_seq_len - max(len(r.tokens) for r in rows)
                return [
                    _commit(r, out[:b], [], end, min(b, cap))
                    for r, out, b in zip(rows, outs, budgets, strict=True)
                ]
            num_draft = [0] * len(rows)
        drafts = self._propose(rows, num_draft, draft, given)
        if len(rows) == 1 and given[0] is None and self._ahead(rows[0], drafts[0], params):
            return [self._verify_and_draft_ahead(rows[0], drafts[0], params, target, ahead)]
        emitted = self._verify(rows, drafts, target)
        end = target.stops.end_id
        return [_commit(r, out, d.tokens, end) for r, out, d in zip(rows, emitted, drafts, strict=True)]

    def _propose(
        self, rows: list[Row], num_draft: list[int], call: Call, given: list[list[int] | None]
    ) -> list[Draft]:
        """Step 2: each row's draft ([] where it drafts nothing): given, else from last round's draft-ahead where
        confirmed, else from the draft engine."""
        drafts = [Draft([]) for _ in rows]
        asked = []
        for i, (row, k) in enumerate(zip(rows, num_draft, strict=True)):
            ready = self.ready.pop(row.slot, None)
            if given[i] is not None:
                drafts[i] = self._given(given[i])
            elif k > 0 and ready is not None:
                drafts[i] = _first(ready, k)
            elif k > 0:
                asked.append(i)
        if asked:
            prefixes = [self._draft_view(rows[i]) for i in asked]
            if self.translator is not None:
                # The limits bound a row in target tokens; its text may take more of the draft's. One call drafts
                # the same K for every row, so a row the draft engine could not take with that K drafts nothing
                # this round, and never fails the batch.
                k = max(num_draft[i] for i in asked)
                fits = [draft_room(len(prefix), self.max_seq_len) >= k for prefix in prefixes]
                asked = [i for i, ok in zip(asked, fits, strict=True) if ok]
                prefixes = [prefix for prefix, ok in zip(prefixes, fits, strict=True) if ok]
        if asked:
            self.drafted_len.update((rows[i].slot, len(rows[i].tokens)) for i in asked)
            want_logits = self.use_draft_logits and self.translator is None
            outs = self.calls.propose(prefixes, max(num_draft[i] for i in asked), call, want_logits)
            for i, out in zip(asked, outs, strict=True):
                drafts[i] = _first(out, num_draft[i])
                if self.translator is not None:  # its text as target tokens, verified as point masses
                    tokens = self.translator.to_target(rows[i].tokens, drafts[i].tokens)
                    drafts[i] = self._given(tokens[: num_draft[i]])
        return drafts

    def _given(self, tokens: list[int]) -> Draft:
        """A given proposal; where draft logits decide acceptance, a point mass on each token (as logits: 0 on the
        token, -inf elsewhere), which TensorRT-LLM's rejection sampling reads as the exact rule for a
        deterministic proposal."""
        if not (self.use_draft_logits and tokens):
            return Draft(list(tokens))
        rows = self.calls.target_logit_rows or self.calls.draft_vocab or max(tokens) + 1
        logits = torch.full((len(tokens), rows), float("-inf"))
        logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 0.0
        return Draft(list(tokens), logits)

    def _draft_view(self, row: Row, tokens: list[int] | None = None) -> list[int]:
        """What the draft engine is given for ``row`` (or for ``tokens`` past it: a guess drafted ahead)."""
        tokens = row.tokens if tokens is None else tokens
        if self.translator is not None:
            return self.translator.to_draft(tokens, self.views.setdefault(row.slot, DraftView()))
        vocab = self.calls.draft_vocab
        return draft_input_ids(tokens, vocab) if vocab else tokens

    def _verify(self, rows: list[Row], drafts: list[Draft], call: Call) -> list[list[int]]:
        """Step 3: one verification call for the rows with drafts, one plain step for the rest."""
        emitted: list[list[int]] = [[] for _ in rows]
        verify = [i for i, d in enumerate(drafts) if d.tokens]
        plain = [i for i, d in enumerate(drafts) if not d.tokens]
        if verify:
            outs = self._verify_call([rows[i] for i in verify], [drafts[i] for i in verify], call)()
            for i, out in zip(verify, outs, strict=True):
                emitted[i] = out
        if plain:
            outs = self.calls.verify([rows[i].tokens for i in plain], None, None, 1, call)
            for i, out in zip(plain, outs, strict=True):
                emitted[i] = out
        return emitted

    def _verify_call(self, rows: list[Row], drafts: list[Draft], call: Call) -> Callable[[], list[list[int]]]:
        logits = None
        if self.use_draft_logits and all(d.logits is not None for d in drafts):
            rows_v = self.calls.target_logit_rows
            logits = [to_vocab(d.logits, rows_v) if rows_v else d.logits for d in drafts]
        return partial(
            self.calls.verify,
            [r.tokens for r in rows],
            [d.tokens for d in drafts],
            logits,
            max(len(d.tokens) for d in drafts) + 1,
            call,
        )

    def _ahead(self, row: Row, draft: Draft, params) -> bool:
        """Draft ahead only beside a verification of drafts (never beside the prefill round: it would slow the
        first token) and only if a next round can draft: room for this round's k + 1 tokens and K + 1 more."""
        k = len(draft.tokens)
        budget = row.max_len - len(row.tokens)
        return (
            self.draft_ahead is not None
            and self.translator
            is None  # a guess in the draft's tokens cannot be checked against the target's
            and k > 0
            and budget >= k + 3
            and len(row.tokens) + k + _ahead_k(k, params) <= self.max_seq_len
            and self.draft_ahead()
        )

    def _verify_and_draft_ahead(
        self, row: Row, draft: Draft, params, target: Call, draft_call: Call
    ) -> Outcome:
        ahead_k = _ahead_k(len(draft.tokens), params)
        prefix = self._draft_view(row, row.tokens + draft.tokens)
        self.drafted_len[row.slot] = len(row.tokens)  # the row as the draft engine sees it (beyond: a guess)
        guess_next = partial(self.calls.propose, [prefix], ahead_k, draft_call, self.use_draft_logits)
        (new,), guesses = self.together(self._verify_call([row], [draft], target), guess_next)
        guess = _first(guesses[0], ahead_k) if guesses else Draft([])
        outcome = _commit(row, new, draft.tokens, target.stops.end_id)
        if guess.tokens[1:] and outcome.tokens == draft.tokens + guess.tokens[:1]:
            self.ready[row.slot] = Draft(guess.tokens[1:], None if guess.logits is None else guess.logits[1:])
        return outcome


def _ahead_k(k: int, params: SamplingParams) -> int:
    return (k if params.num_draft_tokens is None else params.num_draft_tokens) + 1


def _first(draft: Draft, n: int) -> Draft:
    """The first n draft tokens and their logits rows (an engine that stopped early returns fewer tokens than
    logits rows: the target takes one row per draft token)."""
    tokens = list(draft.tokens)[:n]
    return Draft(tokens, None if draft.logits is None else draft.logits[: len(tokens)])


def _commit(row: Row, tokens: list[int], draft_tokens: list[int], end_id: int, asked: int = 1) -> Outcome:
    """Step 4: the row's round. With draft tokens, only the accepted ones and the one target token after them are
    verified output; a call that returned fewer than that (without draft tokens: than the ``asked`` ones) ended at
    ``end_id`` (-1: none), which the engine left out (see the module docstring)."""
    tokens = list(tokens)
    num_accepted = 0
    if draft_tokens:
        num_accepted = common_prefix_len(draft_tokens, tokens)
        tokens = tokens[: num_accepted + 1]
        asked = num_accepted + 1
    if len(tokens) < asked and end_id >= 0:
        tokens.append(end_id)
    row.tokens += tokens
    return Outcome(tokens, len(draft_tokens), num_accepted)
