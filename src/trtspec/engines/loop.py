"""ONE generation loop for every runtime: requests join and leave between rounds; each runtime supplies its round.

    loop = GenerationLoop(TorchRounds(target, draft, max_draft_len=8), max_seq_len=2048, tokenizer=None)
    loop.add("a", prompt_ids, SamplingParams(max_new_tokens=64, num_draft_tokens=4), eos_ids={2})
    while loop.busy:
        for event in loop.step():  # one speculative round for every active request
            event.request_id, event.new_tokens, event.finished, event.result  # result: once finished
    loop.cancel("a")  # from any thread: the request leaves before the next round

The round (propose + verify) is the runtime's, behind engines/rounds.py ``Rounds``: the torch pair's KV slots
(speculative.TorchRounds), and engines behind calls (engine_calls.EngineCallRounds: TensorRT-LLM's ModelRunnerCpp
in-process, the Triton orchestrator's BLS calls to the engine models). Everything else is here, once.

Each ``step``: 1. retire cancelled requests, admit queued ones into the lowest free slots (their prompt is
prefilled by this round) and move rows into the holes no newcomer took (engines/rounds.py says why and when),
2. run one round for all active rows, grouped by what a batched sampling step shares (greedy rows together;
sampled rows by temperature/top_k/top_p and random generator), 3. record stats and cut each row's new tokens at
its stops and emit them, 4. release the slots of finished rows. Rows do not wait for each other: a row keeps its
own state (rounds.Row), so a joining row changes nothing in the others' tokens. The engine's and the
TensorRT-LLM runner's ``generate_stream`` add their prompts and step until done; the Triton ``torch`` runtime's
entry model feeds one loop from a thread (triton_repo/models/loop_thread.py); the ``tensorrtllm`` runtime's
orchestrator runs one loop per request on that request's thread.

K per round: a request that pins ``num_draft_tokens`` drafts that many; one that gives none is adaptive
(engines/adaptive.py: its running acceptance, capped by the policy's schedule for the rows in flight; in a
``close``d loop, or an open one whose batches drain to empty before a request joins, the row expected to finish
last).

Proposers (core/lookup.py): the loop's ``proposer``, or the request's own. Prompt lookup runs here, once for every
runtime: a row that uses it gets its looked-up tokens as the round's given proposal, and the runtime verifies them
without its draft model. Its length is the one with the best expected speedup for the request's lookup
acceptance (adaptive.best_lookup_len, at most the row's K); with ``draft+ngram`` a row takes the lookup where that
speedup is at least the draft's expected speedup at this round's K, else the draft.

Stops are per request (``StopChecker``): max_new_tokens, EOS ids, stop token sequences and stop strings, and a
round that emitted nothing. Which ids stop a request and whether the one that stopped it is returned
(``keep_end``) are core/token_rules.py's rules. With ``first_token_alone`` a row's first round drafts
nothing when no other row drafts in it: its first token comes from the target's prefill alone (a streaming
client's TTFT); a row joining a running batch gets its first token with that batch's round anyway.
"""

from __future__ import annotations

import bisect
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from trtspec.core.errors import RequestError
from trtspec.core.lookup import LookupSpec, lookup, uses_draft, uses_lookup
from trtspec.core.metrics import AcceptanceStats, expected_tokens_per_round
from trtspec.core.token_rules import KEEP_END, generator_seed
from trtspec.engines.adaptive import (
    Acceptance,
    AdaptiveState,
    CatchUp,
    Drains,
    KController,
    KPolicy,
    PositionedAcceptance,
    best_lookup_len,
    draft_speedup,
    estimate_for,
    group_k,
    lookup_speedup,
    probe_due,
    row_pairs,
)
from trtspec.engines.rounds import Outcome, Rounds, Row
from trtspec.engines.sampling import SamplingParams, check_num_draft_tokens


@dataclass
class GenerationResult:
    """One sequence's output: generated token ids (prompt excluded), why it stopped, its stats, and text."""

    token_ids: list[int]
    finish_reason: str  # "length" | "stop" | "cancelled"
    stats: AcceptanceStats
    text: str | None = None

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


class StopChecker:
    """Cuts a round's new tokens at the first stop (max_new_tokens, EOS id, stop token sequence, stop string).

    ``keep_end``: an EOS id is the last emitted token (HF generate) or is left out (TensorRT-LLM's end_id)."""

    def __init__(
        self,
        params: SamplingParams,
        eos_ids: Iterable[int],
        tokenizer,
        *,
        keep_end: bool = KEEP_END["in-process"],
        stop_sequences: Sequence[Sequence[int]] = (),
    ):
        self.params, self.eos_ids, self.tokenizer = params, set(eos_ids), tokenizer
        self.keep_end = keep_end
        self.stop_sequences = [list(s) for s in stop_sequences if s]
        # Decode only a tail window when looking for stop strings (a token is at least one byte).
        self.window = max((len(s.encode()) for s in params.stop_strings), default=0) + 4
        self.tail = max([self.window] + [len(s) for s in self.stop_sequences])

    def cut(self, generated: list[int], new: list[int]) -> tuple[list[int], str | None]:
        kept: list[int] = []
        for token in new:
            if token in self.eos_ids:
                return kept + [token] if self.keep_end else kept, "stop"
            kept.append(token)
            if self._stopped((generated[-self.tail :] + kept)[-self.tail :]):
                return kept, "stop"
            if len(generated) + len(kept) >= self.params.max_new_tokens:
                return kept, "length"
        return kept, None

    def _stopped(self, tail: list[int]) -> bool:
        if any(tail[-len(s) :] == s for s in self.stop_sequences):
            return True
        if not self.params.stop_strings:
            return False
        text = self.tokenizer.decode(tail[-self.window :])
        return any(s in text for s in self.params.stop_strings)

    def text(self, tokens: list[int]) -> str | None:
        """Decoded text, ending at the end of the first stop string."""
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in self.params.stop_strings if s in text]
        return text[: min(ends)] if ends else text


def check_prompt(
    prompt: list[int], max_new_tokens: int, max_seq_len: int, vocab: int, seq_hint: str, name: str
):
    """RequestError unless ``prompt`` is non-empty, fits max_seq_len with its new tokens and has vocabulary ids."""
    if not prompt:
        raise RequestError(f"{name} is empty; give at least one token")
    if len(prompt) + max_new_tokens > max_seq_len:
        raise RequestError(
            f"{name}: {len(prompt)} tokens + max_new_tokens {max_new_tokens} > max_seq_len {max_seq_len}; {seq_hint}"
        )
    if vocab and (max(prompt) >= vocab or min(prompt) < 0):
        raise RequestError(f"{name} has token ids outside the vocabulary [0, {vocab})")


def new_generator(params: SamplingParams, device) -> torch.Generator | None:
    """The random generator of a sampled request (seeded when it has a seed); None when greedy."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(generator_seed(params.seed))
    else:
        generator.seed()
    return generator


@dataclass
class RowEvent:
    """What one round gave one request: its new tokens (after stops; may be empty), the round's draft tokens and
    accepted count, and, once it is finished, its GenerationResult (a failed round carries ``error`` instead)."""

    request_id: Hashable
    new_tokens: list[int]
    stats: AcceptanceStats
    result: GenerationResult | None = None
    error: str | None = None
    num_draft: int = 0
    num_accepted: int = 0

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Active:
    """A request in the loop: its Row (slot, tokens, cached lengths), settings, stops and stats."""

    request_id: Hashable
    row: Row
    params: SamplingParams
    k: int
    stops: StopChecker
    generator: torch.Generator | None
    start: float
    stats: AcceptanceStats
    controller: KController | None = None  # None: K pinned by the request
    generated: list[int] = field(default_factory=list)
    rounds: int = 0
    proposer: str = "draft"  # core/lookup.py PROPOSERS
    lookup: Acceptance | None = None  # prompt lookup's acceptance, where the request uses it
    lookup_off: int = 0  # rounds since a match was last proposed
    lookup_hits: Acceptance | None = None  # the share of its searches that found a match
    draft_estimate: Acceptance | None = None  # the draft's acceptance where K is pinned and lookup competes
    draft_off: int = 0  # rounds since its draft model last proposed (a prefill and lookup rounds count)

    @property
    def draft_acceptance(self) -> Acceptance | None:
        """The draft's running acceptance for this request (its adaptive K's estimate, else the one kept where K
        is pinned and lookup competes; None: neither)."""
        return self.controller.estimate if self.controller else self.draft_estimate

    def group_key(self) -> tuple:
        """Rows one batched sampling step can serve together."""
        p = self.params
        return ("greedy",) if p.greedy else (p.temperature, p.top_k, p.top_p, id(self.generator))


class GenerationLoop:
    """Requests sharing one runtime's rounds; see the module docstring. ``add`` and ``cancel``
    may be called from any thread, ``step`` from one thread at a time."""

    def __init__(
        self,
        rounds: Rounds,
        *,
        max_seq_len: int,
        tokenizer=None,
        first_token_alone: bool = False,
        seq_hint: str = "shorten it or raise max_seq_len",
        k_policy: KPolicy = KPolicy(),
        adaptive: AdaptiveState | None = None,
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
    ):
        self.rounds, self.tokenizer = rounds, tokenizer
        self.proposer, self.lookup_spec = proposer, lookup
        self.k_policy = k_policy
        # Adaptive K's measured costs and pooled acceptance; an engine passes its own so they outlive one call.
        self.adaptive = adaptive or AdaptiveState(k_policy)
        self.max_draft_len = rounds.max_draft_len
        self.max_seq_len, self.seq_hint = max_seq_len, seq_hint
        self.first_token_alone = first_token_alone
        self.free_slots = list(range(rounds.num_slots))
        self.queued: deque[_Active] = deque()
        self.active: list[_Active] = []
        self.cancelled: set[Hashable] = set()
        self.lock = threading.Lock()
        self._shared_generator = new_generator(SamplingParams(temperature=1.0), rounds.device)
        self.rounds_run = 0
        self.closed = False  # close(): no request will be added
        self.drains = Drains()  # an open loop's: whether its callers wait for groups (_waited)
        self.undelivered: list[RowEvent] = []  # the events of the step under way (step, fail_all)

    @property
    def busy(self) -> bool:
        return bool(self.active or self.queued)

    def close(self) -> None:
        """No request will be added, and the caller waits for all it added (an engine call's batch): once none
        is queued, adaptive K judges each batch by the time until its last row ends (the rows' remaining
        budgets, adaptive.group_tokens_per_k), since that row ends the call, instead of by the mean acceptance,
        which a steady load's throughput follows. A loop that is never closed (a server's) keeps the mean, except while
        its batches drain to empty before a request joins (adaptive.Drains: clients that wait for groups)."""
        self.closed = True

    def add(
        self,
        request_id: Hashable,
        prompt: list[int],
        params: SamplingParams,
        *,
        eos_ids: Sequence[int] = (),
        keep_end: bool = KEEP_END["in-process"],
        stop_sequences: Sequence[Sequence[int]] = (),
        generator: torch.Generator | None = None,
    ) -> None:
        """Queue a request; RequestError now for one the loop cannot take. ``generator``: the sampled request's
        random generator (rows sharing one are sampled together; None = one of its own when it has a seed,
        else the loop's shared one)."""
        proposer = self._proposer(params)
        has_draft = uses_draft(proposer) and self.rounds.has_draft
        k = check_num_draft_tokens(params, self.max_draft_len, has_draft or uses_lookup(proposer))
        vocab = self.rounds.vocab_size
        check_prompt(prompt, params.max_new_tokens, self.max_seq_len, vocab, self.seq_hint, "the prompt")
        if params.stop_strings and self.tokenizer is None:
            raise RequestError("stop_strings need a tokenizer; load the engine from a directory with one")
        top = self.rounds.max_top_k
        if top and not params.greedy and params.top_k > top:
            raise RequestError(
                f"top_k {params.top_k} is above the engine's limit {top} (it would sample from {top} tokens); "
                f"send top_k <= {top}, or 0 for no top-k"
            )
        if generator is None and not params.greedy:
            seeded = params.seed is not None
            generator = new_generator(params, self.rounds.device) if seeded else self._shared_generator
        stops = StopChecker(params, eos_ids, self.tokenizer, keep_end=keep_end, stop_sequences=stop_sequences)
        stats = AcceptanceStats(max_draft_len=k)
        controller = lookup_estimate = None
        if params.num_draft_tokens is None and k > 0 and has_draft:
            # A seeded sampled request's K must not depend on other requests (it decides its random draws).
            prior = None if params.seeded else self.adaptive.pool
            controller = KController(self.k_policy, k, prior, params.max_new_tokens)
        if uses_lookup(proposer) and k > 0:
            prior = self.k_policy.lookup_prior if params.seeded else self.adaptive.lookup_pool
            lookup_estimate = Acceptance(prior, self.k_policy.prior_weight, self.k_policy.smoothing)
        row = Row(list(prompt), -1, max_len=len(prompt) + params.max_new_tokens, stop_ids=tuple(eos_ids))
        start = time.perf_counter()
        request = _Active(
            request_id, row, params, k, stops, generator, start, stats, controller, proposer=proposer
        )
        request.lookup = lookup_estimate
        if lookup_estimate is not None and not params.seeded:
            request.lookup_hits = Acceptance(
                self.adaptive.lookup_hits, self.k_policy.prior_weight, self.k_policy.smoothing
            )
        if proposer == "draft+ngram" and has_draft and controller is None and k > 0:
            prior = self.k_policy.prior if params.seeded else self.adaptive.pool
            request.draft_estimate = estimate_for(self.k_policy, prior, params.max_new_tokens)
        with self.lock:
            self.queued.append(request)

    def _proposer(self, params: SamplingParams) -> str:
        """The request's proposer: its own (RequestError where this runtime lacks what it needs), else the
        loop's (a loop without a draft model then drafts nothing from it)."""
        if params.proposer is None:
            return self.proposer
        if uses_draft(params.proposer) and not self.rounds.has_draft:
            raise RequestError(
                f"proposer {params.proposer!r} needs a draft model and this deployment has none; "
                "ask for proposer 'ngram' or leave it out"
            )
        return params.proposer

    def cancel(self, request_id: Hashable) -> None:
        """The request leaves before the next round (finish_reason "cancelled"); unknown ids are ignored."""
        with self.lock:
            self.cancelled.add(request_id)

    def step(self) -> list[RowEvent]:
        """Retire the cancelled, admit, move rows into holes, run one round for the active rows; the events of
        this step."""
        # kept until the step returns them: should a move or the round fail, fail_all delivers them still
        self.undelivered = self._admit_and_cancel()
        self._compact()
        if self.active:
            self.undelivered += self._round()
        events, self.undelivered = self.undelivered, []
        if not self.busy:
            self.adaptive.idle()
        return events

    def fail_all(self, message: str) -> list[RowEvent]:
        """End every request with ``message`` (after a step failed: the caches' state is unknown), after the
        events the failed step had already made (a request cancelled in it ends as cancelled)."""
        with self.lock:
            requests, self.queued, self.cancelled = [*self.active, *self.queued], deque(), set()
        for request in self.active:
            self.rounds.release(request.row.slot)
        self.active = []
        self.free_slots = list(range(self.rounds.num_slots))
        self.adaptive.idle()  # the failed round's time is no K's
        self.drains = Drains()  # requests retried after a failure tell nothing of how clients wait
        made, self.undelivered = self.undelivered, []
        return made + [RowEvent(r.request_id, [], r.stats, error=message) for r in requests]

    def _admit_and_cancel(self) -> list[RowEvent]:
        """Retire the cancelled requests (queued or active), then fill the free slots from the queue."""
        with self.lock:
            cancelled, self.cancelled = self.cancelled, set()
            queued = [r for r in self.queued if r.request_id in cancelled]
            self.queued = deque(r for r in self.queued if r.request_id not in cancelled)
            leaving = [r for r in self.active if r.request_id in cancelled]
            for request in leaving:
                self._retire(request)
            if self.queued and self.free_slots:
                self.drains.joined(len(self.active), any(r.rounds > 1 for r in self.active))
            while self.queued and self.free_slots:
                request = self.queued.popleft()
                request.row.slot = self.free_slots.pop(0)  # the lowest: a hole a row left, if any
                self.active.append(request)
            # rows in slot order (engines/rounds.py): a row that joined in a freed slot runs in its place
            self.active.sort(key=lambda request: request.row.slot)
        return [self._finished(r, "cancelled") for r in queued + leaving]

    def _retire(self, request: _Active) -> None:
        if request.controller is not None and not request.params.seeded:
            self.adaptive.spread.record(*request.controller.lifetime)
        self.drains.finished(bool(self.queued))
        self.active.remove(request)
        self.rounds.release(request.row.slot)
        self.free_slots.append(request.row.slot)
        self.free_slots.sort()

    def _compact(self) -> None:
        """Rows on the lowest slots (engines/rounds.py says why): while a slot below an active row is free, the row
        on the highest slot moves into the lowest free one. Only while every row is in one sampling group: each
        group runs as a batch of its own, and a row moved into another group's hole would break up its own group's
        consecutive slots."""
        # the hole first: every step comes here, and most leave none
        if not self._hole() or len({request.group_key() for request in self.active}) > 1:
            return
        while self._hole():
            last, slot = self.active[-1], self.free_slots[0]
            self.rounds.move(last.row, slot)  # first: a failed move leaves the loop's records as they were
            self.active.pop()
            self.free_slots[0] = last.row.slot
            last.row.slot = slot
            bisect.insort(self.active, last, key=lambda request: request.row.slot)
            self.free_slots.sort()

    def _hole(self) -> bool:
        """Whether a slot below the highest active row is free."""
        return bool(self.active and self.free_slots) and self.free_slots[0] < self.active[-1].row.slot

    def _finished(self, request: _Active, reason: str) -> RowEvent:
        result = GenerationResult(
            request.generated, reason, request.stats, request.stops.text(request.generated)
        )
        return RowEvent(request.request_id, [], request.stats, result)

    @torch.inference_mode()  # sampling and bookkeeping too, not only the forwards: no autograd dispatch per op
    def _round(self) -> list[RowEvent]:
        self.adaptive.begin_round()
        self.rounds_run += 1
        groups: dict[tuple, list[_Active]] = {}
        for request in self.active:
            groups.setdefault(request.group_key(), []).append(request)
        outcome, looked_up = {}, set()
        running = any(r.rounds for r in self.active)  # rows past their first round run beside any newcomer
        for group in groups.values():
            num_draft, proposals = self._num_drafts(group, running, only_group=len(groups) == 1)
            rows = [r.row for r in group]
            if proposals is None:
                outcomes = self.rounds.run(rows, num_draft, group[0].params, group[0].generator)
            else:
                outcomes = self.rounds.run(rows, num_draft, group[0].params, group[0].generator, proposals)
                looked_up.update(id(r) for r, p in zip(group, proposals, strict=True) if p is not None)
            for r, out in zip(group, outcomes, strict=True):
                outcome[id(r)] = out
        now = time.perf_counter()
        return [
            self._emit(request, outcome[id(request)], now, id(request) in looked_up)
            for request in list(self.active)
        ]

    def _num_drafts(
        self, group: list[_Active], running: bool, only_group: bool
    ) -> tuple[list[int], list[list[int] | None] | None]:
        """Each row's K this round for one batched group, and the given proposals (None: no row looks up):
        adaptive rows share one K (adaptive.group_k: the batch runs as many draft steps as its largest K anyway),
        from the measured round costs of this batch size. A seeded sampled group (one seeded request, or one
        engine call's batch sharing its generator) uses neither the load nor measured times: its K decides which
        random draws it consumes, so its tokens must not depend on them."""
        adaptive = [r.controller for r in group if r.controller is not None]
        no_prefill = all(r.rounds for r in group)  # a prefill round's time is the prompt's, not the K's
        shared, remaining, measuring = 0, None, False
        waited = self._waited(group)
        if adaptive and group[0].params.seeded:
            shared = group_k(adaptive, 1)
        elif adaptive:
            # a unit round measures only where the round is timed as one batch and every row is adaptive
            unit = only_group and no_prefill and len(adaptive) == len(group)
            if waited is not None:
                remaining = [n for n, r in zip(waited, group, strict=True) if r.controller]
            shared = self.adaptive.choose(
                adaptive, len(self.active), len(group), self.max_draft_len, unit, remaining
            )
            measuring = self.adaptive.measuring

        # Per-row probes (adaptive.probe_due) only where drafting could pay at this batch size, asked once a probe
        # is due: pricing every K at this size each round cost as much as the K choice.
        def worth() -> bool:
            return group[0].params.seeded or self.adaptive.worth_probing(
                len(group), self.max_draft_len, len(self.active)
            )

        if shared == 0 and remaining is not None:
            prober = self._waited_prober(group)
            num_draft = [self._num_draft(r, running, shared, worth if r is prober else None) for r in group]
        else:
            probes = functools.cache(worth) if shared == 0 else None
            num_draft = [self._num_draft(r, running, shared, probes) for r in group]
        behind = self._catch_ups(group, num_draft)
        probing = adaptive and shared == 0 and any(num_draft)  # a few rows' probes: no K's cost to learn
        # a round measuring the draft's costs (a unit round, a re-measure, a slope probe) is the draft's: a lookup
        # in it would be timed as lookup's, and the draft's table would never measure its unit
        proposals = self._lookups(group, num_draft, running, waited, skip_drafting=measuring)
        drafted = [0 if proposals and proposals[i] is not None else k for i, k in enumerate(num_draft)]
        # counted by the draft's K; a round whose draft tokens all came from prompt lookup is no K=0 round (the
        # proposer counters count it)
        if adaptive and not group[0].params.seeded and (proposals is None or any(drafted)):
            self.adaptive.ran(len(group), max(drafted))
        # Timed only as the round's one batch (another group's prefill or forwards would be charged to this K),
        # and only where one proposer gave every proposal (a mixed round's cost is neither's).
        # A draft that sat out rounds takes them in; under CatchUp.minimum tokens that is unpriced, and such a
        # round is no steady round of its K either (on the AMD EPYC, a K=1 round of 8 rows after 12 off took 32 ms
        # against 27 ms, and K=1, priced 1.54 target-only rounds for 1.43, stayed off for good): not timed. Rounds
        # sat out, not tokens behind, tell it: what a steady round leaves behind differs by runtime (the torch
        # pair 1-2 tokens, an engine call's draft the tokens of the last round).
        looked_up = proposals is not None
        drafting = [(r, b) for r, b, k in zip(group, behind, drafted, strict=True) if k]
        caught_up = [b for _, b in drafting if b >= CatchUp.minimum]
        steady = all(r.draft_off <= CatchUp.steady or b >= CatchUp.minimum for r, b in drafting)
        if no_prefill and only_group and not probing and steady and (not looked_up or not any(drafted)):
            self.adaptive.timed(len(group), max(num_draft), looked_up, sum(caught_up))
        return num_draft, proposals

    @staticmethod
    def _draft_tokens(request: _Active, k: int) -> float:
        """Expected tokens per round of a row that drafts ``k`` with its draft model if it takes no lookup (1 for
        a row that cannot), over the tokens it has left (a group its caller waits for weighs it so)."""
        estimate = request.draft_acceptance
        if not k or estimate is None or not uses_draft(request.proposer):
            return 1.0
        return expected_tokens_per_round(estimate.over_rest, k)

    def _waited_prober(self, group: list[_Active]) -> _Active | None:
        """The one row that may probe in a group its caller waits for, once in probe_every rounds: the row with
        the most tokens left (it ends the call; another row's estimate does not move the group's K), of those
        the one whose draft is least behind (a row that probed before catches up on a few tokens, not its
        prompt). Rows probing in turn made every few rounds one in which a draft took in all it had skipped (the
        demo pair's groups of 16: 0.89x-0.92x target-only with per-row probes). None where no row may. Once in
        probe_every rounds per pair of rows: the probe widens every row's verification, so it costs the batch a
        drafting round's excess over target-only while it tells about one row (the demo pair on the 2-core
        Intel Xeon: a probe round took 14.0 ms at batch 8 against 10.7 ms for a round off, 18.7 ms at batch 16
        against 15.5 ms)."""
        if self.rounds_run % (self.k_policy.probe_every * row_pairs(len(group))):
            return None
        return max(
            group,
            key=lambda r: (r.params.max_new_tokens - len(r.generated), -self.rounds.draft_behind(r.row)),
        )

    def _waited(self, group: list[_Active]) -> list[int] | None:
        """Each row's tokens left where the caller waits for every row of a group of several (a closed loop, or an
        open one whose batches drain to empty before anything joins (adaptive.Drains), with none queued:
        adaptive K judges the group by the row expected to finish last), else None (a row alone is its own
        group: the rule gives what its own acceptance does)."""
        if not (self.closed or self.drains.waited) or self.queued or len(group) < 2:
            return None
        return [r.params.max_new_tokens - len(r.generated) for r in group]

    def _catch_ups(self, group: list[_Active], num_draft: list[int]) -> list[int]:
        """Per row, the tokens its draft takes in this round beyond a round's own (a prompt it never saw, the
        rounds it sat out), after dropping the adaptive rows whose catch-up would cost more than their drafting
        can save (adaptive.catch_up_pays; sets their num_draft to 0). Pinned and seeded rows draft as asked."""
        # only rows that may draft with the draft model: a lookup-only row's draft never catches up
        behind = [
            self.rounds.draft_behind(r.row) - 2 if k and uses_draft(r.proposer) else 0
            for r, k in zip(group, num_draft, strict=True)
        ]
        for i, request in enumerate(group):
            if behind[i] >= CatchUp.minimum and request.controller is not None and not request.params.seeded:
                remaining = request.params.max_new_tokens - len(request.generated)
                acceptance = request.controller.estimate.over_rest  # the saving runs over its tokens left
                if not self.adaptive.catch_up_pays(
                    len(group), self.max_draft_len, num_draft[i], acceptance, remaining, behind[i]
                ):
                    num_draft[i], behind[i] = 0, 0
        return behind

    def _lookups(
        self,
        group: list[_Active],
        num_draft: list[int],
        running: bool,
        waited: list[int] | None,
        skip_drafting: bool = False,
    ) -> list[list[int] | None] | None:
        """Prompt lookup for the group's rows that use it (see the module docstring); sets their num_draft to the
        proposal's length (``waited``: the group's _waited; ``skip_drafting``: not for rows whose adaptive K
        drafts). None where no row takes a lookup."""
        proposals: list[list[int] | None] = [None] * len(group)
        rows = [
            i
            for i, r in enumerate(group)
            if r.lookup is not None and not (skip_drafting and r.controller is not None)
        ]
        if not rows:
            return None
        costs = self.adaptive.lookup_prices(len(group), self.max_draft_len)
        caps = {i: self._num_draft(group[i], running, group[i].k) for i in rows}
        # Where lookup cannot pay at this batch size even if every row found a match accepted at 0.95 (measured
        # costs), nobody looks up or probes: the search and the wider verification would only cost.
        hopeless = (
            costs is not None
            and not best_lookup_len(
                [0.95] * len(rows), list(caps.values()), len(group), self.k_policy, costs
            )[0]
        )
        found = {}
        for i in rows:
            seeded = group[i].params.seeded
            searching = caps[i] > 0 and (seeded or not hopeless)
            found[i] = lookup(group[i].row.tokens, caps[i], self.lookup_spec) if searching else []
            if searching and not seeded:
                group[i].lookup_hits.update(1, int(bool(found[i])))
                self.adaptive.lookup_hits.update(1, int(bool(found[i])))
        # One length for the group (adaptive.best_lookup_len); a seeded request's choice must not depend on the
        # load, so it prices by the policy's ratios alone, as one row.
        shared = [i for i in rows if found[i] and not group[i].params.seeded]
        probe_round = self.rounds_run % self.k_policy.probe_every == 0
        n_shared, speedup_shared = 0, 1.0
        if shared:
            # Every row of the group (0 for one outside the shared length): the rows with a match now, or where the
            # caller waits for the group, every row that looks up, priced by its share of rounds with a match.
            waits = waited is not None
            ours = {i for i in rows if caps[i] > 0 and not group[i].params.seeded} if waits else set(shared)
            n_shared, speedup_shared = best_lookup_len(
                [r.lookup.value if i in ours else 0.0 for i, r in enumerate(group)],
                [(caps[i] if waits else len(found[i])) if i in ours else 0 for i in range(len(group))],
                len(group),
                self.k_policy,
                costs,
                waited,
                [self._draft_tokens(r, k) for r, k in zip(group, num_draft, strict=True)] if waits else None,
                [r.lookup_hits.value if i in ours else 0.0 for i, r in enumerate(group)] if waits else None,
            )
        for i in rows:
            request = group[i]
            if request.params.seeded:
                n, speedup = best_lookup_len([request.lookup.value], [len(found[i])], 1, self.k_policy)
            else:
                n, speedup = min(n_shared, len(found[i])), speedup_shared
                if waited is not None and n:
                    # the group's speedup is its rule's over the rounds to come; against the row's draft in
                    # this round, the row's own lookup this round
                    speedup = lookup_speedup(request.lookup.value, n, self.k_policy, costs)
            # a seeded row probes by its own rounds: its draws must not depend on when it joined the loop
            due = request.rounds % self.k_policy.probe_every == 0 if request.params.seeded else probe_round
            if n == 0 and found[i] and request.lookup_off >= self.k_policy.probe_every and due:
                # A probe: the acceptance and lookup's costs were measured where it last ran (a server's first
                # rounds may price it off for good: a target-only round without responses to send is cheap).
                # The rows due probe in the same round, one round in probe_every: a probe widens the whole
                # batch's verification, and rows probing in turn would widen nearly every round. One token, as a
                # draft probe: its acceptance is what a probe measures, and a whole match would widen every row of
                # a large batch to its length for a few rows' matches.
                n, speedup = 1, float("inf")
            if n == 0:
                request.lookup_off += bool(found[i])
                if not uses_draft(request.proposer):
                    num_draft[i] = 0
                continue
            if request.proposer == "draft+ngram" and num_draft[i] > 0:
                estimate = request.draft_acceptance
                draft_costs = (
                    None
                    if request.params.seeded
                    else self.adaptive.draft_prices(len(group), self.max_draft_len)
                )
                if draft_speedup(estimate.value, num_draft[i], self.k_policy, draft_costs) > speedup:
                    request.lookup_off += 1
                    continue
            request.lookup_off = 0
            proposals[i], num_draft[i] = found[i][:n], n
        return proposals if any(p is not None for p in proposals) else None

    def _num_draft(
        self, request: _Active, running: bool, shared: int, probes: Callable[[], bool] | None = None
    ) -> int:
        """The row's K this round (``shared``: the adaptive rows' K). A first round drafts nothing
        (first_token_alone) where no row is past its first round: the round is then the prompts' prefill alone,
        and drafting would add the draft's prefill and its steps before the first token. Beside running rows the
        round lasts their forwards anyway, and a new row drafts as its K says. A seeded sampled row always drafts
        nothing in its first round, and probes by its own rounds alone, so that its random draws, and so its
        tokens, do not depend on the other rows. ``probes``: whether the row may probe where one is due."""
        if self.first_token_alone and request.rounds == 0 and (request.params.seeded or not running):
            return 0
        k = shared if request.controller is not None else request.k
        in_flight = 1 if request.params.seeded else len(self.active)
        if probes and request.controller is not None and k == 0 and probe_due(request.controller, in_flight):
            k = 1 if probes() else 0
        # Never draft past max_new_tokens: the round's last token comes from the target anyway.
        return min(k, request.params.max_new_tokens - len(request.generated) - 1)

    def _emit(self, request: _Active, out: Outcome, now: float, looked_up: bool = False) -> RowEvent:
        """Record the round, cut its tokens at the request's stops, retire the request if it finished.
        ``looked_up``: its draft tokens came from prompt lookup."""
        request.rounds += 1
        request.draft_off = 0 if out.num_draft and not looked_up else request.draft_off + 1
        stats = request.stats
        proposer = "ngram" if looked_up else "draft"
        if out.num_draft:
            stats.record_round(out.num_draft, out.num_accepted, proposer)
        else:  # target-only: one target step per token (a runtime may take several in one call)
            for _ in range(max(len(out.tokens), 1)):
                stats.record_round(0, 0)
        if looked_up:
            request.lookup.update(out.num_draft, out.num_accepted)
            if not request.params.seeded:
                self.adaptive.lookup_pool.update(out.num_draft, out.num_accepted)
        elif request.controller is not None:
            request.controller.update(out.num_draft, out.num_accepted)
            if out.num_draft:
                self.adaptive.pool.update(out.num_draft, out.num_accepted, len(request.generated))
        elif request.draft_estimate is not None and out.num_draft:
            request.draft_estimate.update(out.num_draft, out.num_accepted)
        tokens = out.tokens
        kept, reason = request.stops.cut(request.generated, tokens)
        request.generated += kept
        if isinstance(request.draft_acceptance, PositionedAcceptance):
            request.draft_acceptance.position = len(request.generated)
        stats.generated_tokens = len(request.generated)
        stats.elapsed_s = now - request.start
        if stats.time_to_first_token_s is None and kept:
            stats.time_to_first_token_s = stats.elapsed_s
        if reason is None and not tokens:
            reason = (
                "stop"  # a runtime that emitted nothing cannot make progress (an engine at its own limit)
            )
        if reason is None:
            return RowEvent(
                request.request_id, kept, stats, num_draft=out.num_draft, num_accepted=out.num_accepted
            )
        self._retire(request)
        event = self._finished(request, reason)
        event.new_tokens, event.num_draft, event.num_accepted = kept, out.num_draft, out.num_accepted
        return event
