"""Adaptive K: each request's draft length follows its running acceptance and the loop's load (pure logic).

    policy = KPolicy(draft_cost_ratio=0.2, schedule={1: 8, 4: 4, 8: 2, 16: 0})
    controller = KController(policy, max_k=8)
    k = controller.choose(in_flight=3)        # this round's K (0 = target-only)
    controller.update(num_draft=k, num_accepted=2)  # after the round

By acceptance: ``acceptance`` is accepted / judged draft positions (each draft token the target looked at:
accepted, or the first rejected one; positions after a rejection were never judged), the request's own counts
decayed by (1 - smoothing) per judged position, so its last ~1/smoothing positions count: the maximum-likelihood
per-token acceptance of the recent rounds (an average of per-position outcomes in order would weigh each round's
last, rejected, position most and run low). To them always add ``prior_weight`` pseudo-positions at the loop's
pooled acceptance (``AcceptancePool``: every adaptive request's rounds, decayed slowly; ``prior`` before any; a
seeded sampled request keeps ``prior``): the estimate shrinks toward what the loop's requests accept, so a
request's first rounds draft what its neighbours say, and a short unlucky stretch (a few rejections in ~20
positions) does not switch a request off for ``probe_every`` rounds while a request that keeps failing still does.
(tools/replay_adaptive.py, the demo pair's greedy acceptance with exact round costs: a prior that decayed with the
request's own positions left up to 59% of the rounds at concurrency 1 without drafting and reached 0.87-1.02x of
the best static K; the lasting prior 0.95-1.01x.) Where in its response a request is matters too: a draft matches a
response's first tokens less often than its later ones, so the pool also keeps acceptance by position, and a
request's estimate is for where it is (its own counts scaled by how the pool did where it judged them:
PositionedAcceptance). ``choose`` takes the K in 0..cap that maximises the expected
speedup for that acceptance (core.metrics' expected tokens per round over the round's cost, below); K = 0
(target-only, speedup 1) wins unless some K beats it by ``min_gain``, so a draft that cannot pay is switched off. A
request that switched off judges nothing, so its own counts age by one position's forgetting per round without
drafting (as in a round that measures the target-only unit, below): its estimate returns toward the pooled one and
it drafts again once that pays; while the pool says no, after ``probe_every`` rounds without drafting it drafts one
token (a probe) to measure again.

By load: ``schedule`` maps in-flight sequences to the largest K (``{4: 4, 16: 0}``: up to 4 in flight at most
4, up to 16 none; past the largest key its K holds). Speculation pays less as the batch grows: the target's
forward turns compute-bound and every draft step costs the whole batch.

By batch: rows batched in one round share its forwards, which run as many draft steps as the largest K among
them and verify that many tokens for every row, so ``group_k`` gives every adaptive row of a batch one K: the best
for the rows' mean acceptance. Not the best mean of the rows' own expected tokens: the geometric model (each draft
token accepted independently at the row's rate) rates a long K by its high-acceptance rows, and the rounds gave
less (demo pair at concurrency 8: K=4 at 1.44x K=2's tokens by the model, 1.36x measured, for 1.47x the cost).
Judging by the mean acceptance drafts shorter for mixed batches; tools/replay_adaptive.py on the demo pair's
greedy acceptance with six bench runs' measured costs: 0.94-1.01x of the best static K at concurrency 1-16
against 0.89-1.01x. That is a steady load's measure, where a row that finishes makes way for another. Rows whose
caller waits for them all (an engine call's batch: loop.GenerationLoop.close) are judged by the time until the
last of them ends instead (``remaining``: each row's rounds at its acceptance, the rows spread as much as
requests differ, and each stretch between two rows' ends priced at the batch size still running:
waited_acceptances, tail_rounds): the call lasts until its last row ends, tokens a faster row gains sooner
shorten nothing, and every round drafted costs every row still running. (The demo pair's grounded set in groups
of 8, static K=1: 69 rounds at batch 8, then 0.38 s at batches 1-7 while the rows that accepted less finished;
1.47 s against target-only's 1.38 s, where the mean acceptance priced K=1 at 1.18x.) Such a group drafts at
break-even until its rows have judged what the prior weighs (``learning``): only its own rounds tell it whether
it pays. Once its choice drafts, it keeps drafting while some K pays at all (``KController.drafting``): its first
rounds judge its rows' first positions, which a draft matches less often than later ones, so a margin to stay on
would switch it off near break-even and leave it off while its rows' counts age back.

By measured cost: ``RoundCosts`` gives each K's round cost in target-only rounds of the same batch size,
measured from the rounds the loop ran, each over its whole cycle (start to the next round's start: the forwards,
the bookkeeping and, on a server, building and sending the responses on the loop's cores). The line a1 + b * K,
a least-squares fit through the speculative rounds (K >= 1, exponentially weighted), carries it: b includes the
draft step and the longer verification, both of which grow with the batch, and a1 what a speculative round pays
beyond its draft steps (the draft's catch-up, the verification, the bookkeeping), which a target-only round does
not. Round time is not quite linear in K (a (K+1)-token verification whose length suits the CPU's matrix kernels
costs less than its neighbours), so each K's own recent rounds pull its cost from the line toward their average,
weighted n / (n + prior_rounds). The unit, a0, is the target-only rounds' average (a1 / policy.verify_cost_ratio
before one ran); a loop whose requests all draft runs a target-only round at a batch size's first timed round
and every few speculative rounds until it has measured a few (``RoundCosts.unit_due``). Where the rounds ran one
K only (a server whose requests all leave K to it), no line fits; the line through the unit, a0 + c * K, then
prices every K from the unit and that K's rounds, so a batch size met for the first time (a jump in load) has
measured costs after two timed rounds and falls back to target-only where drafting does not pay; every few rounds
of one K, a round drafts a neighbour K (RoundCosts.slope_probe), so the line fits and follows. Each batch size
has its own measurements, its power-of-two bucket's until they suffice (RoundCosts); the policy's ratios hold
until anything is measured. Where measured costs switched drafting off, a couple of timed rounds re-measure now
and then (RoundCosts.explore_due), so a price set by a slow spell of the machine does not hold for good.
docs/adaptive-k.md has the whole account.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from trtspec.core.metrics import expected_tokens_per_round, round_cost


@dataclass(frozen=True)
class KPolicy:
    """Settings of adaptive K. Cost ratios are in target decoding steps (one draft step / one target step; one
    (K+1)-token verification / one target step); acceptance values are probabilities per draft token."""

    # until rounds are measured (RoundCosts); the demo pair's is ~0.1 at batch 1
    draft_cost_ratio: float = 0.2
    verify_cost_ratio: float = 1.0  # until target-only rounds are measured (RoundCosts)
    prior: float = 0.7  # optimistic: the first requests draft from their first rounds and measure
    prior_weight: float = 10.0  # pseudo-positions at the pooled acceptance in every estimate (not forgotten)
    # forgetting per judged position (~ the last 20 count): acceptance comes in bursts
    smoothing: float = 0.05
    min_gain: float = 0.05  # a K must beat target-only by 5% (hysteresis against noise near break-even)
    probe_every: int = 16  # target-only rounds between probes
    # Prompt lookup (core/lookup.py): its proposals cost no forward, only a longer verification, each verified
    # token this share of a target step (the demo pair's (K+1)-token verification: ~1.1-1.6 steps at K 2-6 on
    # 2 CPU cores), and are accepted at about ``lookup_prior`` before a request's own rounds say otherwise.
    verify_token_ratio: float = 0.1
    lookup_prior: float = 0.5
    # The share of a request's rounds in which its search finds a match, until its own rounds say (the demo pair's
    # grounded set at 16 rows: 0.85 over a group, 0.6-1.0 per row).
    lookup_hit_prior: float = 0.5
    # The standard deviation of acceptance between requests, until finished requests measure it (RowSpread): rows
    # whose caller waits for them all are judged by the slowest, whom a row's pooled prior cannot tell apart. (The
    # demo pair at K=1, 64 tokens: 0.15 between the grounded set's 20 requests and between the default set's 10,
    # binomial noise taken out.)
    row_spread: float = 0.15
    # A round's cost with no rows left, as a share of the whole batch's, until smaller batch sizes are measured: a
    # size a waited group never ran is priced on the line from it to the nearest measured sizes (AdaptiveState.
    # _shrink). 1 (whole rounds) by default. Lower is optimistic: a cold engine's lockstep batch then drafts, its
    # rows finish apart and the smaller sizes price themselves. On repeated prompts that unlocked a batch of 8
    # whose drafting pays (0.3: 0.93-0.96x the best static K, against 0.83-0.85x target-only for good); on
    # distinct prompts it bought nothing where drafting paid and cost 4% where it did not (the demo pair, AMD
    # EPYC: tools/bench_cold_batches.py). On the 2-core CPUs a round of one row costs 0.38 of eight rows'.
    fixed_round_share: float = 1.0
    schedule: Mapping[int, int] | None = field(default=None)


def policy_for(speculative) -> KPolicy:
    """The policy of a recipe's ``speculative`` section (its schedule and draft_cost_ratio; defaults elsewhere)."""
    return KPolicy(draft_cost_ratio=speculative.draft_cost_ratio, schedule=speculative.schedule)


def schedule_cap(schedule: Mapping[int, int] | None, in_flight: int) -> int | None:
    """The schedule's largest K for ``in_flight`` sequences (None = no schedule): the entry of the smallest key
    >= in_flight, or of the largest key past it."""
    if not schedule:
        return None
    keys = sorted(schedule)
    return schedule[next((n for n in keys if n >= in_flight), keys[-1])]


Costs = Sequence[float]  # a round's cost per K (index K) in target-only rounds: costs[0] == 1


def linear_costs(draft_cost_ratio: float, verify_cost_ratio: float, max_k: int) -> list[float]:
    """K draft steps plus one (K+1)-token verification per K (core.metrics.round_cost), target-only 1."""
    return [1.0] + [round_cost(k, draft_cost_ratio, verify_cost_ratio) for k in range(1, max_k + 1)]


def group_tokens_per_k(
    acceptances: Sequence[float],
    cap: int,
    remaining: Sequence[int] | None = None,
    shrink: Sequence[Sequence[float]] | None = None,
) -> list[float]:
    """What drafting K gives rows batched together, in tokens per round, for K in 0..cap: at the rows' mean
    acceptance (a steady load, whose finished rows make way for new ones), or, for rows whose caller waits for
    them all (``remaining``: each row's tokens left), the group's target-only time over its time at K
    (waited_tokens; ``shrink[K]``: what a round of K costs as rows finish, see there). See the module docstring.
    Expected tokens per round at acceptance a are 1 + a + ... + a^K (core.metrics.expected_tokens_per_round),
    summed here K by K."""
    rows = [sum(acceptances) / len(acceptances)] if remaining is None else list(acceptances)
    budgets = None if remaining is None else waited_budgets(remaining)
    if budgets is not None and len(budgets) != len(rows):
        raise ValueError(f"{len(rows)} rows' acceptances for {len(budgets)} budgets")
    base = None if budgets is None or shrink is None else tail_rounds(sorted(budgets), shrink[0])
    tokens, powers, out = [1.0] * len(rows), [1.0] * len(rows), [1.0]
    for k in range(1, cap + 1):  # row by row in map()s: a round's choice runs this over every row of a batch
        powers = list(map(operator.mul, powers, rows))
        tokens = list(map(operator.add, tokens, powers))
        if budgets is None:
            out.append(tokens[0])
        elif base is None:
            out.append(waited_tokens(tokens, budgets))
        else:
            out.append(base / tail_rounds(sorted(map(operator.truediv, budgets, tokens)), shrink[k]))
    return out


def waited_budgets(remaining: Sequence[int]) -> list[int]:
    """Each row's tokens left as waited_tokens counts them (at least one: a round still runs)."""
    return [max(n, 1) for n in remaining]


def waited_tokens(tokens: Sequence[float], budgets: Sequence[int]) -> float:
    """Rows' expected tokens per round as the group they end gains them, where its caller waits for them all:
    its rounds at one token each (its longest budget) over its rounds at these (the most any row needs), every
    round priced as one of the whole batch. ``budgets``: waited_budgets of the rows' tokens left. (Adaptive K
    prices the rounds after the first rows finish by what a smaller batch costs where it has measured one:
    group_tokens_per_k's ``shrink``.)"""
    if len(budgets) != len(tokens):
        raise ValueError(f"{len(tokens)} rows' tokens per round for {len(budgets)} budgets")
    return max(budgets) / max(map(operator.truediv, budgets, tokens))


def tail_rounds(ends: Sequence[float], shrink: Sequence[float]) -> float:
    """A group's time in rounds of the whole batch, its rows finishing after ``ends`` rounds (ascending): each
    stretch between two finishes costs its rounds times ``shrink[b - 1]``, a round's cost with b rows left over
    its cost with all of them. Rows that finish apart leave a smaller batch, which costs less a round (the demo
    pair on the 2-core Intel Xeon, K=1: 0.95x a round of 4 at 3 rows, 0.72x at 2, 0.57x at 1), so the slowest
    row's last rounds cost less than whole ones; in groups of 2-4, as much as drafting gains there."""
    if len(shrink) != len(ends):
        raise ValueError(f"a shrink for {len(shrink)} rows priced {len(ends)} rows' ends")
    total, before, left = 0.0, 0.0, len(ends)
    for end in ends:
        total += (end - before) * shrink[left - 1]
        before, left = end, left - 1
    return total


def best_k(
    acceptance: float | Sequence[float],
    cap: int,
    policy: KPolicy,
    costs: Costs | None = None,
    remaining: Sequence[int] | None = None,
) -> int:
    """The K in 0..cap with the best expected speedup (expected tokens per round over the round's cost) at this
    acceptance, or for rows batched together (group_tokens_per_k: their mean acceptance, or with
    ``remaining`` the row expected to finish last); 0 unless one beats 1 + min_gain. ``costs``: measured
    (RoundCosts: at least cap + 1 entries), else the policy's ratios."""
    rows = [acceptance] if isinstance(acceptance, int | float) else list(acceptance)
    costs = costs or linear_costs(policy.draft_cost_ratio, policy.verify_cost_ratio, cap)
    return peak_k(group_tokens_per_k(rows, cap, remaining), costs, policy.min_gain)


def peak_k(tokens: Sequence[float], costs: Costs, min_gain: float) -> int:
    """The K (an index of ``tokens``, expected tokens per round per K) with the best tokens over cost, 0 unless
    one beats 1 + ``min_gain``."""
    best, best_speedup = 0, 1.0 + min_gain
    for k in range(1, len(tokens)):
        speedup = tokens[k] / costs[k]
        if speedup > best_speedup:
            best, best_speedup = k, speedup
    return best


def judged_positions(num_draft: int, num_accepted: int) -> int:
    """The draft positions the target judged in a round: the accepted ones and the first rejected one (the target
    stops judging at the first rejection)."""
    return min(num_accepted + 1, num_draft)


class Acceptance:
    """Accepted / judged draft positions, both decayed by (1 - decay) per judged position, plus ``weight``
    pseudo-positions at ``prior`` (a value, or another Acceptance read at each use) that are never forgotten."""

    def __init__(self, prior: float | Acceptance, weight: float, decay: float):
        self.prior, self.weight, self.decay = prior, weight, decay
        # (accepted, judged) in one attribute, so a reader never sees half an update (an engine's pool serves
        # every loop the engine runs)
        self.counts = (0.0, 0.0)

    @property
    def value(self) -> float:
        accepted, judged = self.counts
        prior = self.prior.value if isinstance(self.prior, Acceptance) else self.prior
        return (accepted + self.weight * prior) / (judged + self.weight)

    @property
    def over_rest(self) -> float:
        """The acceptance over the positions still to come (PositionedAcceptance; here ``value``)."""
        return self.value

    @property
    def prior_share(self) -> float:
        """The share of ``value`` that is the prior (1 before anything is judged)."""
        return self.weight / (self.counts[1] + self.weight)

    def update(self, num_draft: int, num_accepted: int) -> None:
        judged = judged_positions(num_draft, num_accepted)
        keep = (1.0 - self.decay) ** judged
        accepted, seen = self.counts
        self.counts = (keep * accepted + num_accepted, keep * seen + judged)

    def age(self) -> None:
        """Forget as much as one judged position would, with nothing judged."""
        accepted, seen = self.counts
        self.counts = ((1.0 - self.decay) * accepted, (1.0 - self.decay) * seen)


class RowSpread:
    """The standard deviation of acceptance between requests: each finished request's own rate (accepted /
    judged over its rounds, from ``minimum`` judged positions), the last ~1/decay requests weighted, less the
    binomial noise of rates measured over few positions, shrunk toward ``prior`` (``weight`` requests' worth)."""

    minimum = 8

    def __init__(self, prior: float, weight: float = 4.0, decay: float = 0.05):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.sums = (0.0, 0.0, 0.0, 0.0)  # weighted requests, rates, squared rates, binomial variances

    def record(self, accepted: float, judged: float) -> None:
        if judged < self.minimum:
            return
        rate = accepted / judged
        added = (1.0, rate, rate * rate, rate * (1 - rate) / judged)
        keep = 1 - self.decay
        self.sums = tuple(keep * total + value for total, value in zip(self.sums, added, strict=True))

    @property
    def value(self) -> float:
        n, rates, squares, noise = self.sums
        if n == 0:
            return self.prior
        measured = math.sqrt(max(squares / n - (rates / n) ** 2 - noise / n, 0.0))
        return (n * measured + self.weight * self.prior) / (n + self.weight)


def position_bucket(position: int) -> int:
    """The bucket of a generated position that AcceptancePool keeps apart: 0-7, 8-15, 16-31, 32-63, ... (a draft's
    acceptance moves most over a response's first tokens)."""
    return max(position.bit_length() - 3, 0)


def bucket_span(bucket: int) -> tuple[int, int]:
    """The positions [start, end) of a position_bucket."""
    return (0, 8) if bucket == 0 else (4 << bucket, 8 << bucket)


class AcceptancePool(Acceptance):
    """Every adaptive request's rounds in a loop (or an engine's loops), decayed slowly: its requests' prior.
    Rounds that say where in their response they ran (``position``: tokens generated before the round) are also
    pooled by position_bucket, each bucket shrunk toward the whole pool: a draft matches a response's first tokens
    less often than its later ones (the demo pair at K=1, groups of 16: 0.56 over positions 0-7, 0.68 over 8-15,
    0.81 over 16-23, 0.89 over 24-63), so a pool of whatever positions ran last reads low at a group's start and
    high at its end, and a row's own first rounds read low for the whole of it (PositionedAcceptance). A bucket
    forgets on its own rounds only: after a change of workload the first buckets, which every request reaches,
    follow it sooner than the far ones."""

    def __init__(self, policy: KPolicy, decay: float = 0.005):
        super().__init__(policy.prior, policy.prior_weight, decay)
        self.by_position: dict[int, Acceptance] = {}  # bucket -> its rounds, shrunk toward this pool
        # a bucket's pseudo-positions at the whole pool: a bucket few rounds reached (a batch of a few rows, a
        # response's far positions) reads near the whole pool, not as its last few rounds did
        self.bucket_weight = 4 * self.weight
        # (whole pool, each bucket's value up to the last with rounds): every row reads it once or twice a round
        self._values: tuple[float, list[float]] | None = None

    def update(self, num_draft: int, num_accepted: int, position: int | None = None) -> None:
        super().update(num_draft, num_accepted)
        if position is not None:
            bucket = self.by_position.setdefault(
                position_bucket(position), Acceptance(self, self.bucket_weight, self.decay)
            )
            bucket.update(num_draft, num_accepted)
        self._values = None

    def by_bucket(self, last: int) -> list[float]:
        """The pooled acceptance of buckets 0..last: each its counts plus ``bucket_weight`` pseudo-positions at
        the whole pool's."""
        cached = self._values
        if cached is None:
            whole = self.value
            buckets = [self.by_position.get(b) for b in range(max(self.by_position, default=-1) + 1)]
            cached = self._values = (whole, [whole if b is None else b.value for b in buckets])
        whole, values = cached
        return values[: last + 1] + [whole] * (last + 1 - len(values))

    def at(self, position: int) -> float:
        """The pooled acceptance at a generated position."""
        return self.by_bucket(position_bucket(position))[-1]

    def ahead(self, start: int, end: int, values: Sequence[float] | None = None) -> float:
        """The pooled acceptance averaged over the positions [start, end) (at ``start`` for an empty range);
        ``values``: by_bucket's, where the caller has them."""
        if end <= start:
            return self.at(start) if values is None else values[position_bucket(start)]
        last = position_bucket(end - 1)
        values = self.by_bucket(last) if values is None else values
        total = 0.0
        for bucket in range(position_bucket(start), last + 1):
            low, high = bucket_span(bucket)
            total += (min(high, end) - max(low, start)) * values[bucket]
        return total / (end - start)


class PositionedAcceptance(Acceptance):
    """A request's acceptance where it is in its response (``position``: tokens it generated, which its loop keeps),
    from a pool that knows acceptance by position: its own rate is moved by as much as the pool's differs between
    the positions it judged and the position at hand (in odds, so a request above the pool stays below 1), and the
    prior is the pool's there. So a request judged on its first positions, which the draft matches less often, does
    not read low for the rest of its response, and one past them drafts as long as its later positions pay for.
    ``over_rest``: the same over the positions it has left (to ``horizon``, the most it may generate), which the
    time until the request ends depends on (waited_acceptances: judged by their first rounds at 0.60-0.70, the demo
    pair's groups of 16, which accepted 0.80 over their 64 tokens, priced K=1 under break-even by their slowest row,
    where it ran 1.13x target-only)."""

    def __init__(self, pool: AcceptancePool, weight: float, decay: float, horizon: int):
        super().__init__(pool, weight, decay)
        self.pool, self.horizon = pool, horizon
        self.position = 0
        self.judged_at: dict[int, float] = {}  # judged positions per position_bucket, decayed as ``counts``

    @property
    def value(self) -> float:
        return self._scaled(position_bucket(self.position), lambda values: values[-1])

    @property
    def over_rest(self) -> float:
        return self._scaled(
            position_bucket(max(self.horizon - 1, self.position)),
            lambda values: self.pool.ahead(self.position, self.horizon, values),
        )

    def _scaled(self, last: int, pooled_of) -> float:
        """The request's own rate moved from the pool's at the positions it judged to ``pooled_of`` the pool's
        buckets (0..``last``), with ``weight`` pseudo-positions at that."""
        (accepted, judged), judged_at = self.counts, self.judged_at
        values = self.pool.by_bucket(max(last, max(judged_at, default=0)))
        pooled = pooled_of(values[: last + 1])
        if not judged:
            return pooled
        where_judged = sum(count * values[bucket] for bucket, count in judged_at.items()) / judged
        own = shifted(accepted / judged, where_judged, pooled)
        return (judged * own + self.weight * pooled) / (judged + self.weight)

    def update(self, num_draft: int, num_accepted: int) -> None:
        judged = judged_positions(num_draft, num_accepted)
        self._age_buckets((1.0 - self.decay) ** judged)
        if judged:
            bucket = position_bucket(self.position)
            self.judged_at[bucket] = self.judged_at.get(bucket, 0.0) + judged
        super().update(num_draft, num_accepted)

    def age(self) -> None:
        self._age_buckets(1.0 - self.decay)
        super().age()

    def _age_buckets(self, keep: float) -> None:
        self.judged_at = {bucket: keep * count for bucket, count in self.judged_at.items()}


def shifted(rate: float, before: float, after: float) -> float:
    """``rate`` measured where the pool reads ``before``, moved to where it reads ``after``: its odds times the
    pool's odds ratio (rates of 0 and 1 stay; the pool's are kept off 0 and 1)."""
    if rate <= 0.0 or rate >= 1.0:
        return rate
    low, high = 0.01, 0.99
    before, after = min(max(before, low), high), min(max(after, low), high)
    odds = rate / (1 - rate) * (after / (1 - after)) / (before / (1 - before))
    return odds / (1 + odds)


def best_lookup_len(
    acceptances: Sequence[float],
    available: Sequence[int],
    batch: int,
    policy: KPolicy,
    costs: Costs | None = None,
    remaining: Sequence[int] | None = None,
    floors: Sequence[float] | None = None,
    hits: Sequence[float] | None = None,
) -> tuple[int, float]:
    """How many looked-up tokens the rows of a batch of ``batch`` rows propose (each at most its ``available``),
    and the round's expected speedup over target-only: the length with the most expected tokens per round over
    the round's cost (lookup_cost). One length for the batch: a batched verification is as wide as its longest
    proposal for every row, so a length pays only if the rows that look up gain more than the whole batch pays:
    their mean gain over the batch, or where the caller waits for every row (``remaining``: each row's tokens
    left; then ``acceptances`` and ``available`` cover every row, 0 for one outside the shared length;
    ``floors``: each row's expected tokens per round without a lookup, above 1 for a row that drafts instead),
    the group's (waited_tokens).

    In a group its caller waits for, the choice is a rule for the rounds to come, not for this one: ``hits`` is
    each row's share of rounds in which its search finds a match, and a row gains in that share of rounds, each
    match priced at its ``available`` (its cap). Judged by this round's matches alone, the group's slowest row
    would be one without a match in nearly every round of a large batch, and lookup would never run, though each
    row finds matches in most rounds (the demo pair's grounded set in groups of 16: 13.5 of 16 rows matched per
    round, and a length was chosen in 6 of 622 rounds). Where no row drafts instead, a round in which no row
    matches costs a target step, so a length's cost is counted in the share of rounds with a match in some row;
    where rows draft, every round pays the wider verification. (0, 1.0) unless one beats 1 + min_gain."""
    best, best_speedup = 0, 1.0 + policy.min_gain
    budgets = None if remaining is None else waited_budgets(remaining)
    if hits is not None and len(hits) != len(acceptances):
        raise ValueError(f"{len(acceptances)} rows' acceptances for {len(hits)} hit rates")
    below = [1.0] * len(acceptances) if floors is None else list(floors)
    # the share of rounds in which the verification is widened for a lookup
    some_match = (
        1.0 if hits is None or max(below, default=1.0) > 1.0 else 1.0 - math.prod(1.0 - h for h in hits)
    )
    for n in range(1, max(available, default=0) + 1):
        cost = lookup_cost(n, policy, costs)
        tokens = [
            expected_tokens_per_round(a, min(n, m)) for a, m in zip(acceptances, available, strict=True)
        ]
        if budgets is None:
            speedup = (batch + sum(tokens) - len(tokens)) / batch / cost
        else:
            tokens = [max(t, f) for t, f in zip(tokens, below, strict=True)]
            if hits is not None:
                tokens = [h * t + (1.0 - h) * f for h, t, f in zip(hits, tokens, below, strict=True)]
                cost = 1.0 + some_match * (cost - 1.0)
            speedup = waited_tokens(tokens, budgets) / cost
        if speedup > best_speedup:
            best, best_speedup = n, speedup
    return (best, best_speedup) if best else (0, 1.0)


def lookup_cost(n: int, policy: KPolicy, costs: Costs | None = None) -> float:
    """A round verifying ``n`` looked-up tokens, in target steps: measured lookup rounds of this batch size, else
    1 + verify_token_ratio per token. A wider verification never costs less than a target step: a measured cost
    below 1 is noise."""
    return max(costs[n], 1.0) if costs else 1.0 + policy.verify_token_ratio * n


def lookup_speedup(acceptance: float, n: int, policy: KPolicy, costs: Costs | None = None) -> float:
    """One row's expected speedup of verifying ``n`` looked-up tokens at this acceptance (as draft_speedup)."""
    return expected_tokens_per_round(acceptance, n) / lookup_cost(n, policy, costs)


def draft_speedup(acceptance: float, k: int, policy: KPolicy, costs: Costs | None = None) -> float:
    """The expected speedup of drafting ``k`` at this acceptance (1.0 for k 0), from measured costs where
    given, else the policy's ratios."""
    if k == 0:
        return 1.0
    cost = costs[k] if costs else round_cost(k, policy.draft_cost_ratio, policy.verify_cost_ratio)
    return expected_tokens_per_round(acceptance, k) / cost


def estimate_for(policy: KPolicy, prior: float | AcceptancePool, horizon: int | None) -> Acceptance:
    """A request's running acceptance: positioned where its prior is a loop's pool and its ``horizon`` (the most
    tokens it may generate) is known (PositionedAcceptance), else plain."""
    if isinstance(prior, AcceptancePool) and horizon is not None:
        return PositionedAcceptance(prior, policy.prior_weight, policy.smoothing, horizon)
    return Acceptance(prior, policy.prior_weight, policy.smoothing)


class KController:
    """One request's K: ``update`` after each round, ``choose`` before the next (see the module docstring).
    ``prior``: the loop's AcceptancePool (read at each round: as its requests' rounds show how the draft does,
    every request's estimate follows), or a fixed value (None: the policy's prior); with a pool, ``horizon`` (the
    most tokens the request may generate) makes the estimate one for the positions it has left (estimate_for; its
    loop then keeps ``estimate.position``)."""

    def __init__(
        self,
        policy: KPolicy,
        max_k: int,
        prior: float | AcceptancePool | None = None,
        horizon: int | None = None,
    ):
        self.policy, self.max_k = policy, max_k
        self.estimate = estimate_for(policy, policy.prior if prior is None else prior, horizon)
        self.rounds_off = 0  # consecutive rounds that drafted nothing
        self.drafting = False  # the last K chosen for its group (AdaptiveState.choose) drafted
        self.lifetime = (0, 0)  # (accepted, judged) over the request's rounds, nothing forgotten: RowSpread's

    @property
    def acceptance(self) -> float:
        return self.estimate.value

    def update(self, num_draft: int, num_accepted: int) -> None:
        """Fold one round in: ``num_accepted`` of ``num_draft`` draft tokens were accepted."""
        if num_draft == 0:
            self.rounds_off += 1
            self.estimate.age()
            return
        self.rounds_off = 0
        self.estimate.update(num_draft, num_accepted)
        accepted, judged = self.lifetime
        self.lifetime = (accepted + num_accepted, judged + judged_positions(num_draft, num_accepted))

    def choose(self, in_flight: int, costs: Costs | None = None) -> int:
        """This round's K for a loop with ``in_flight`` sequences: min(best for the acceptance, schedule, max_k),
        or a 1-token probe after probe_every rounds off."""
        k = group_k([self], in_flight, costs)
        return 1 if k == 0 and probe_due(self, in_flight) else k


def capped(max_k: int, schedule: Mapping[int, int] | None, in_flight: int) -> int:
    """``max_k``, lowered to the schedule's K for ``in_flight`` sequences where there is one."""
    scheduled = schedule_cap(schedule, in_flight)
    return max_k if scheduled is None else min(max_k, scheduled)


def _cap(controllers: Sequence[KController], in_flight: int) -> int:
    return capped(min(c.max_k for c in controllers), controllers[0].policy.schedule, in_flight)


@functools.cache
def normal_order(n: int) -> tuple[float, ...]:
    """The expected draws of ``n`` standard normal ones, largest first (Blom's approximation)."""
    return tuple(NormalDist().inv_cdf((n - i - 0.375) / (n + 0.25)) for i in range(n))


def waited_acceptances(
    controllers: Sequence[KController], spread: float, remaining: Sequence[int] | None = None
) -> list[float]:
    """Each row's acceptance as the group it ends weighs it (rows whose caller waits for them all; over the
    positions each has left: Acceptance.over_rest): rows that
    just started are alike by their estimates, yet as many requests spread around their mean (``spread``, the
    standard deviation between requests), and the one that accepts least ends the group. So the row with the
    lowest estimate is lowered by the expected largest of as many normal draws times the spread, the next by the
    second largest, and so on (the fastest is raised as much as the slowest is lowered), each in proportion to
    the share of its estimate that is the pooled prior: as the rows' own rounds tell them apart, the estimates
    carry it. Rows rank by how low the largest draw would take them, so a row whose own rounds narrow its
    estimate is not handed the largest draw for being a little lower, which would make the group's slowest row
    jump as its estimate crosses another's. Of rows alike, the one with the most tokens left (``remaining``)
    counts as the slowest."""
    draws = normal_order(len(controllers))
    estimates = [(c.estimate.over_rest, c.estimate.prior_share) for c in controllers]
    order = sorted(
        range(len(controllers)),
        key=lambda i: (
            estimates[i][0] - spread * draws[0] * estimates[i][1],
            -remaining[i] if remaining else 0,
        ),
    )
    judged = [0.0] * len(controllers)
    for draw, i in zip(draws, order, strict=True):
        value, share = estimates[i]
        judged[i] = min(max(value - spread * draw * share, 0.0), 1.0)
    return judged


def group_k(
    controllers: Sequence[KController],
    in_flight: int,
    costs: Costs | None = None,
    remaining: Sequence[int] | None = None,
    spread: float = 0.0,
) -> int:
    """One K for adaptive rows batched in one round: the best for their acceptances together (``remaining``: the
    rows' tokens left, where their caller waits for them all, with ``spread`` the standard deviation of
    acceptance between requests: best_k over waited_acceptances), capped by the schedule for ``in_flight`` and
    every row's max_k (0: no K pays; rows then probe on their own, ``probe_due``). The controllers share one
    policy (the loop's)."""
    acceptances = group_acceptances(controllers, remaining, spread)
    return best_k(acceptances, _cap(controllers, in_flight), controllers[0].policy, costs, remaining)


def group_acceptances(
    controllers: Sequence[KController], remaining: Sequence[int] | None, spread: float
) -> list[float]:
    """The rows' acceptances as group_k judges them: their estimates, or where their caller waits for them all
    (``remaining``), waited_acceptances."""
    if remaining is None:
        return [c.acceptance for c in controllers]
    return waited_acceptances(controllers, spread, remaining)


def learning(controllers: Sequence[KController]) -> bool:
    """Whether some row has judged fewer draft positions of its own than the pooled prior weighs: its estimate
    is still mostly what other requests accepted (AdaptiveState.choose lets such a waited group draft at
    break-even)."""
    return any(c.lifetime[1] < c.policy.prior_weight for c in controllers)


def row_pairs(rows: int) -> int:
    """Pairs of rows in a group its caller waits for (at least one): its probes and re-measures come once per so
    many waits, since each makes the whole batch pay (a wider verification, every draft's catch-up) to learn
    about one row or one K."""
    return max(rows // 2, 1)


class Drains:
    """Whether the callers of an open loop (a server's) wait for their requests as groups, told by how its batch
    drains. A client that sends a group at once and the next group when all are done (an offline job, a batch
    evaluation) leaves the loop with nothing to add while a group's last rows run: each time a row finished with
    none queued, the batch ran down to empty before the next request came. Independent clients send their next
    request as one finishes, and it joins rows still running. Where the last ``window`` drains all ran down to
    empty, the loop judges its batches as a closed loop does (by the row that ends the group); one drain that a
    request joined turns that off, and so does a request that joins rows already under way (past their first
    rounds: the late members of one group arrive within a round or so), as independent clients that come after an
    idle spell do. A server cannot know what its clients wait for; this is what it sees. (Judged by the mean,
    served lockstep groups of 16 on the demo pair, AMD EPYC, drafted K=3-4 at 0.86x pinned K=2.)"""

    window = 2

    def __init__(self):
        self.recent: deque[bool] = deque(maxlen=self.window)  # per drain: did it run down to empty
        self.draining = False

    def finished(self, queued: bool) -> None:
        """A row left; ``queued``: a request waits for a slot (it joins at once: no drain)."""
        self.draining = self.draining or not queued

    def joined(self, running: int, under_way: bool = False) -> None:
        """Requests joined the batch while ``running`` rows ran; ``under_way``: some of those rows were past their
        first rounds."""
        if self.draining:
            self.recent.append(running == 0)
            self.draining = False
        elif under_way:
            self.recent.append(False)

    @property
    def waited(self) -> bool:
        return len(self.recent) == self.window and all(self.recent)


def probe_due(controller: KController, in_flight: int) -> bool:
    """A row off for probe_every rounds drafts one token to measure again, where the schedule lets it draft. Per
    row, not per batch: its draft catches up on its own tokens only (a whole batch probing at once would make
    every row's draft catch up on its prompt in one round)."""
    return _cap([controller], in_flight) > 0 and controller.rounds_off >= controller.policy.probe_every


class CatchUp:
    """A draft's cost per token it takes in to catch up, in seconds: a round whose drafts catch up is timed, and
    its time beyond what its K costs (RoundCosts) is the catch-up's. Smoothed like the costs (noisy rounds).
    A catch-up counts from ``minimum`` tokens: a forward over a few more tokens costs what one over fewer does
    (its fixed cost dominates), so a row that sat out a few rounds drafts on unpriced, and their per-token excess
    would price a prompt's catch-up at that fixed cost. A round with such a catch-up is timed as neither: after
    more than ``steady`` rounds sat out (the one a unit measure takes) it is no steady round of its K."""

    minimum = 16
    steady = 1

    def __init__(self, smoothing: float = 0.3):
        self.smoothing = smoothing
        self.per_token: float | None = None

    def record(self, excess_seconds: float, tokens: int) -> None:
        sample = max(excess_seconds, 0.0) / tokens
        self.per_token = (
            sample
            if self.per_token is None
            else ((1 - self.smoothing) * self.per_token + self.smoothing * sample)
        )


def catch_up_pays(
    behind: int,
    remaining: int,
    acceptance: float,
    k: int,
    costs: Costs,
    unit_s: float,
    per_token_s: float,
    batch: int,
) -> bool:
    """Whether a row whose draft is ``behind`` tokens behind should catch up to draft ``k`` now: the time drafting
    saves over the row's ``remaining`` tokens (its share of the batch's rounds: target-only ones cost ``unit_s``,
    drafting ones ``costs[k]`` of that and yield expected_tokens_per_round) against the draft's catch-up, paid
    once. Where a batch is large, drafting barely pays and the catch-up of a long prompt does not; a draft that
    catches up whenever K turns on costs as much as drafting throughout."""
    if behind <= 0 or k == 0:
        return True
    saving = remaining * unit_s / batch * (1 - costs[k] / expected_tokens_per_round(acceptance, k))
    return saving > behind * per_token_s


class _CostTable:
    """The measured rounds of one batch size, or of one power-of-two bucket of them (RoundCosts)."""

    min_spread = 0.5  # the variance of K a slope needs: below it, noise in a few rounds would set the slope
    era = 1  # a target-only round right after a speculative one still prices it (unit_due's come singly)

    def __init__(self, decay: float, line_decay: float):
        self.decay, self.line_decay = decay, line_decay
        self.sums = [0.0] * 5  # weighted [n, k, k^2, t, k*t] of rounds with K >= 1
        self.by_k: dict[int, list[float]] = {}  # K -> weighted [n, t]
        self.fitted: tuple[float, float] | None = None  # the last (a1, b) a fit gave
        self.units = 0  # target-only rounds recorded (since the last drop_unit)
        self.unit_dropped = False  # the next target-only round replaces the unit's rounds (drop_unit)
        # The unit of the speculative rounds' own time, which prices them: as it stood at the last speculative
        # round or at a target-only round timed among them (unit_due's come singly: ``era``), not as a stretch
        # of target-only rounds after drafting stopped moves it. (Against the current unit, the prices wandered with
        # the machine through such a stretch, with no speculative round timed: on the 2-core Intel Xeon, K=2 at
        # 2 streams from 1.75 target-only rounds to 1.93-2.32 over 8 groups, holding drafting off, then
        # 1.70-1.87 once it ran.)
        self.unit_at_spec: float | None = None
        self.since_spec = 0  # target-only rounds recorded since the last speculative one

    def record(self, k: int, seconds: float) -> None:
        if k == 0 and self.unit_dropped:
            self.by_k[0], self.units, self.unit_dropped = [0.0, 0.0], 0, False
            self.unit_at_spec = None
        self.units += k == 0
        if k:
            # every K's rounds age, not only this K's: a K not run lately is priced by the line, not its old rounds
            self.age_speculative(1)
            added = (1.0, k, k * k, seconds, k * seconds)
            self.sums = [total + value for total, value in zip(self.sums, added, strict=True)]
        keep = 1.0 if k else 1 - self.decay  # a speculative K's own rounds aged above
        cell = self.by_k.setdefault(k, [0.0, 0.0])
        cell[0], cell[1] = keep * cell[0] + 1.0, keep * cell[1] + seconds
        self.since_spec = 0 if k else self.since_spec + 1
        if self.since_spec <= self.era and self.sums[0]:
            self.unit_at_spec = self.unit()

    def unit(self) -> float | None:
        """The target-only rounds' average seconds (None before one)."""
        n0, t0 = self.by_k.get(0, (0.0, 0.0))
        return t0 / n0 if n0 else None

    def age_speculative(self, rounds: int, line_decay: float | None = None) -> None:
        """Age the speculative rounds (each K's own and the line's sums) as ``rounds`` rounds would (the line's
        at ``line_decay``, its own by default)."""
        keep = (1 - self.decay) ** rounds
        for k, cell in self.by_k.items():
            if k:
                cell[0], cell[1] = keep * cell[0], keep * cell[1]
        keep = (1 - (self.line_decay if line_decay is None else line_decay)) ** rounds
        self.sums = [keep * value for value in self.sums]

    def spread(self) -> float:
        """The variance of K over the speculative rounds (weighted as the line weighs them)."""
        n, k, kk, _, _ = self.sums
        return kk / n - (k / n) ** 2 if n else 0.0

    def has_slope(self) -> bool:
        """Whether the recent speculative rounds ran enough different K to fit a slope (RoundCosts.slope_probe)."""
        return self.spread() >= self.min_spread

    def below_unit(self, k: int, margin: float = 0.9) -> bool:
        """Whether K's own recent rounds (two or more: two in a row weigh 1.95, each aged by the other) average
        below ``margin`` x the target-only unit. (A round that drafts costs about a target-only one where its
        draft steps are cheap, on a GPU say, so a margin keeps noise from flagging a unit that is right.)"""
        unit = self.unit()
        n, t = self.by_k.get(k, (0.0, 0.0))
        return unit is not None and n >= 2 * (1 - self.decay) and t / n < margin * unit

    def drop_unit(self) -> None:
        """The unit's rounds are wrong (below_unit): the next target-only round replaces them, and the unit counts
        as unmeasured until ``unit_rounds`` new ones ran. Dropped when that round is recorded, not now: a round
        whose time is lost (the loop ran out of work) would leave no unit at all."""
        self.unit_dropped = True

    def line(self) -> tuple[float, float] | None:
        """(a1, b) of the speculative rounds' line. While the recent ones ran (nearly) one K, or the fit is not a
        cost (a1 or b not positive: noise), the last fitted line holds (None before one)."""
        n, k, kk, t, kt = self.sums
        spread = self.spread()
        if spread >= self.min_spread:
            slope = (kt / n - (k / n) * (t / n)) / spread
            intercept = t / n - slope * k / n
            if slope > 0 and intercept > 0:
                self.fitted = (intercept, slope)
        return self.fitted

    def through_unit(self, a0: float) -> tuple[float, float] | None:
        """(a0, c): the line through the target-only unit a0 that fits the speculative rounds' averages best
        (least squares of their excess over a0, c * K), for rounds that ran (nearly) one K: no line of their
        own, yet enough to tell whether speculating costs more than it gives. None before a speculative round."""
        cells = [(k, n, t / n) for k, (n, t) in self.by_k.items() if k and n]
        if not cells:
            return None
        slope = sum(n * k * (mean - a0) for k, n, mean in cells) / sum(n * k * k for k, n, _ in cells)
        return a0, max(slope, 0.0)

    def priced(
        self, max_k: int, prior_rounds: float, verify_cost_ratio: float, through_unit: bool = False
    ) -> tuple[list[float], float] | None:
        """Each K's cost in target-only rounds (RoundCosts.costs) and a target-only round's seconds (measured,
        else the line's K=0 point priced by the verification ratio), or None without a line (``through_unit``:
        the line through the unit, which needs a target-only round and one speculative K)."""
        unit = self.unit_at_spec if self.unit_at_spec is not None else self.unit()
        unit_line = self.through_unit(unit) if unit is not None else None
        line = unit_line if through_unit else self.line()
        if line is None:
            return None
        a1, b = line

        def seconds(k: int) -> float:  # K's own rounds' total, pulled toward the line by prior_rounds of it
            n, t = self.by_k.get(k, (0.0, 0.0))
            return (t + prior_rounds * (a1 + b * k)) / (n + prior_rounds)

        a0 = unit if unit is not None else a1 / verify_cost_ratio
        # A round that drafts does a target-only round's work and more: a K priced below the unit is noise in
        # the unit's few rounds, and would make drafting look better than free.
        return [1.0] + [max(seconds(k) / a0, 1.0) for k in range(1, max_k + 1)], a0


class RoundCosts:
    """Measured round cost per batch size: ``begin_round()`` as a round starts, ``start(batch, k)`` for its batch,
    ``idle()`` when the loop runs out of work;
    ``costs(batch, max_k)`` gives each K's cost in target-only rounds (see the module docstring), or None while a
    batch size has no fit (then the policy's ratios apply).

    Each batch size keeps its own rounds, and so does its power-of-two bucket (1, 2-3, 4-7, ...): a batch size's
    costs come from its own rounds once they include ``unit_rounds`` target-only ones (one noisy unit would scale
    every K) and a speculative one (its line, else the line through its unit), from its bucket's until then. (On
    the 2-core CPU machine a K=3 round took 18 ms at batch 4 and 22 ms at batch 7; with the bucket alone, a K
    looked cheap or dear by the batch size that had last run it, as a batch of 8 drained.) ``decay`` weighs each
    K's own rounds (~1/decay last speculative ones count, of every K: a K's own average fades as others run, so
    one not run lately is priced by the line; the target-only unit forgets only as target-only rounds run),
    ``line_decay`` the line's (~1/line_decay rounds: a slope from
    rounds that mostly ran one K, slope_probe's few others among them, needs more of them than an average does;
    tools/replay_adaptive.py with noisy timings drafted closer to the best K with 0.02 than with 0.05 or 0.01).
    A round that ran several batches (rows in different sampling groups) is left out: its time is not one
    batch's."""

    unit_every, unit_rounds, refresh_every = 8, 3, 256
    explore_every, explore_rounds = 16, 2
    slope_every, slope_step, slope_gain = 6, 2, 0.10

    def __init__(
        self,
        policy: KPolicy,
        decay: float = 0.05,
        line_decay: float = 0.02,
        prior_rounds: float = 8.0,
        clock=time.perf_counter,
    ):
        self.verify_cost_ratio = policy.verify_cost_ratio
        self.decay, self.line_decay, self.prior_rounds, self.clock = decay, line_decay, prior_rounds, clock
        self.by_batch: dict[int, _CostTable] = {}  # batch size -> its rounds
        self.by_bucket: dict[int, _CostTable] = {}  # batch.bit_length() -> its batch sizes' rounds
        # batch size -> speculative rounds since its last target-only one
        self.since_unit: dict[int, int] = {}
        # batch size -> [rounds off since the last re-measure, rounds between re-measures, re-measuring rounds
        # left, whether the group waits] while measured costs keep drafting off there (explore_due)
        self.off: dict[int, list] = {}
        self.exploring: set[int] = set()  # batch sizes whose current round re-measures (explore_due)
        # batch size -> [speculative rounds since its last slope probe, probes so far] (slope_probe)
        self.since_slope: dict[int, list[int]] = {}
        self._pending: tuple[int, int, float, int] | None = None
        self._mixed = False
        # Seconds per token a draft takes in to catch up (its cache behind the row: a prompt it never saw, the
        # tokens of rounds it sat out); None until a timed round measured one (CatchUp).
        self.catch_up = CatchUp()
        # (batch, max_k) -> priced(), kept until a table changes
        self._priced: dict[tuple[int, int], tuple[list[float], float] | None] = {}

    def unit_due(self, batch: int, k: int) -> bool:
        """Should this batch size's round, about to draft ``k`` (>= 1), run target-only instead, to measure the
        unit (a0)? Every ``unit_every`` speculative rounds while fewer than ``unit_rounds`` target-only rounds
        were measured (a speculative round costs well over a target-only one beyond its draft steps, ~1.3-1.6x
        on the 2-core CPU machine, so assuming a0 = a1 made speculation look cheap where it did not pay), then
        every ``refresh_every`` to follow drift. And every ``unit_every`` while the K about to run measures below
        0.9 of the unit: a round that drafts does a target-only round's work and more, so the unit was measured
        slow (a slow spell of the CPU). Its old rounds are then dropped (_CostTable.drop_unit) and measured anew;
        kept, they priced every K near the unit at the floor of 1 until refresh_every, which made a draft accepted
        at 0.05 look worth drafting. A loop whose requests all draft never runs a target-only round otherwise."""
        if k == 0:
            return False
        table = self.by_batch.get(batch)
        units = 0 if table is None else table.units
        # A batch size's first timed round measures the unit at once: with the load just changed, its costs
        # must be known within a few rounds, and without a unit a speculative round's cost means nothing.
        first = units == 0 and batch not in self.since_unit
        since = self.since_unit.get(batch, 0) + 1
        stale = units >= self.unit_rounds and table.below_unit(k)
        due = first or since >= (self.unit_every if units < self.unit_rounds or stale else self.refresh_every)
        if due and stale:
            for dropped in self._tables(batch):  # its bucket holds the same slow rounds
                dropped.drop_unit()
        self.since_unit[batch] = 0 if due else since
        return due

    def explore_due(self, batch: int, k: int, candidate: int, patient: bool = False) -> bool:
        """Measured costs chose ``k`` = 0 at this batch size where the policy's ratios would draft ``candidate``:
        should this round draft ``candidate`` anyway, timed, to measure its cost again? Once costs switch drafting
        off, only target-only rounds are timed, so a speculative cost measured high by a few noisy rounds (a
        slow spell of the CPU, a server's first responses) would keep it off for good, even at one stream where
        drafting pays most. So on the ``explore_every``-th round off, ``explore_rounds`` rounds in a row draft (the
        first may be a draft's catch-up, which is timed apart and priced by the policy's ratios), the rounds timed
        before age by the rounds spent off, and the wait doubles with each re-measure that leaves drafting off, up
        to ``refresh_every`` rounds: where target-only truly wins (a large batch), re-measures end up 2 rounds in
        ~256. The wait is per batch size, so a load whose batch size keeps changing re-measures more often.
        Drafting again (``k`` > 0) resets the wait; a round the policy's ratios would not draft in (``candidate``
        0: a low acceptance, which probes measure) counts for nothing. ``patient``: every wait is per pair of rows
        (rows whose caller waits for them all: there every row's draft takes in all it skipped, a round's worth
        or more of a batch's time; on the 2-core Intel Xeon a group's first drafting round, whose 16 drafts took
        in their prompts alone, took 200 ms against 15.5 ms for a round off). It starts at ``explore_every`` per
        pair, not at its longest: a price measured in a fast spell of the unit held groups of 2 off for 880 of
        1,004 rounds (16 passes, the demo pair on a 2-core Intel Xeon without AMX), 0.73x pinned K=2, where
        doubling from 16 rounds ran them at 0.97x; groups of 4-16 ran alike either way."""
        due = self._explore_due(batch, k, candidate, patient)
        (self.exploring.add if due else self.exploring.discard)(batch)
        return due

    def _explore_due(self, batch: int, k: int, candidate: int, patient: bool) -> bool:
        if k:
            self.off.pop(batch, None)
            return False
        if not candidate:
            return False
        # a waited group's re-measure makes every row's draft take in all it skipped: the wait grows with the rows
        pairs = row_pairs(batch) if patient else 1
        longest = self.refresh_every * pairs
        # the wait belongs to the kind of group that waits (a call's rows switch from open to waited as its last
        # prompt joins): a change of kind starts it anew
        state = self.off.get(batch)
        if state is None or state[3] != patient:
            state = self.off[batch] = [0, self.explore_every * pairs, 0, patient]
        if state[2]:
            state[2] -= 1
            return True
        state[0] += 1
        if state[0] < state[1]:
            return False
        # The speculative rounds timed before drafting stopped are as old as the rounds spent off: they age by
        # them (the line by the K's own rate too), so the longer drafting stayed off, the more the re-measure's
        # rounds weigh against them (after 16 rounds the old keep 0.44 of their weight).
        self._priced.clear()
        for table in self._tables(batch):
            table.age_speculative(state[0], line_decay=self.decay)
        state[:3] = [0, min(2 * state[1], longest), self.explore_rounds - 1]
        return True

    def slope_probe(self, batch: int, k: int, cap: int, speedup: float) -> int:
        """The K this batch size's round, about to draft ``k`` (>= 1) of at most ``cap``, expected to gain
        ``speedup`` over target-only, drafts instead, to give
        its line a slope: ``k`` itself, or every ``slope_every``-th speculative round while the recent rounds ran
        (nearly) one K, ``k`` + ``slope_step`` and ``k`` - ``slope_step`` in turn (the one within 1..``cap`` where
        the other is not; none where neither is). Rounds of one K fit no line, and the line through the
        unit that prices them then assumes a speculative round costs a target-only one beyond its draft steps,
        which it does not (1.3-1.6x on the 2-core CPU machine): it priced a long K dear and a short one cheap, so
        the loop drafted shorter than the best K and, running that K alone, never learned better (the replay's
        cost line 1.4 + 0.2 K at concurrency 4: mean K 2.8-3.9 where K=5 is best). A fitted line that rounds of
        one K no longer refit would keep its shape however stale. The probe's K is a neighbour of a K that pays,
        so it costs a few percent of one round in ``slope_every``; only where that K gains ``slope_gain`` or more,
        though. Where the best K barely pays (a full batch, whose verification costs near a target step a token),
        a K two longer pays less still, and its probe costs what drafting gains: the demo pair's 8 rows on the AMD
        EPYC, K=1 gaining 5%, probed K=3 in one round of 7 at 43 ms against 27 ms for 0.3 more tokens of the row
        that ends the group."""
        table = self.by_batch.get(batch)
        if table is None or not k or table.has_slope() or speedup < 1.0 + self.slope_gain:
            return k
        since = self.since_slope.setdefault(batch, [0, 0])
        since[0] += 1
        if since[0] < self.slope_every:
            return k
        since[0] = 0
        since[1] += 1
        steps = (self.slope_step, -self.slope_step) if since[1] % 2 else (-self.slope_step, self.slope_step)
        # a step of 1 could not give the spread a slope needs (one round in slope_every: a variance of K ~0.14)
        return next((k + step for step in steps if 1 <= k + step <= cap), k)

    def begin_round(self) -> None:
        """The loop starts a round: the previous round's time is now known, its whole cycle (its forwards, the
        bookkeeping after them, and what the caller did with its events before asking for this round: building
        and sending responses on a server), so each K is charged what it costs where it runs."""
        if self._pending is not None and not self._mixed:
            batch, k, began, catch_up = self._pending
            seconds = self.clock() - began
            if not catch_up:
                self.record(batch, k, seconds)
            elif batch not in self.exploring:  # the K's table keeps drafting's steady cost; the excess is the
                # catch-up's (not in a re-measure: its K's price is the one being measured again, and a price
                # set too high would leave the catch-up too little)
                priced = self.priced(batch, k)
                if priced is not None:
                    costs, unit = priced
                    self.catch_up.record(seconds - costs[k] * unit, catch_up)
        self._pending, self._mixed = None, False

    def start(self, batch: int, k: int, catch_up: int = 0) -> None:
        """One batch of this round drafts ``k`` (a second batch in the same round leaves the round out), its
        drafts taking in ``catch_up`` tokens beyond a round's own."""
        self._mixed = self._pending is not None
        self._pending = (batch, k, self.clock(), catch_up)

    def idle(self) -> None:
        """The loop ran out of work: the last round's cycle would include the wait for the next request."""
        self._pending, self._mixed = None, False

    def _tables(self, batch: int) -> list[_CostTable]:
        """This batch size's table and its bucket's, those that exist."""
        found = (self.by_batch.get(batch), self.by_bucket.get(batch.bit_length()))
        return [table for table in found if table is not None]

    def record(self, batch: int, k: int, seconds: float) -> None:
        # the prices this round changes: its batch size's own and those its bucket prices
        bucket = batch.bit_length()
        for key in [key for key in self._priced if key[0].bit_length() == bucket]:
            del self._priced[key]
        for tables, key in ((self.by_batch, batch), (self.by_bucket, batch.bit_length())):
            tables.setdefault(key, _CostTable(self.decay, self.line_decay)).record(k, seconds)

    def costs(self, batch: int, max_k: int) -> list[float] | None:
        """Round cost per K in 0..max_k in target-only rounds of this batch size (None: nothing measured): a
        batch size's own (once it has unit_rounds target-only rounds: one noisy unit would scale every K) before
        its bucket's; of each, the fitted line, else the line through the unit, which a few rounds of a new batch
        size give (its first timed round measures the unit), so a change in load is followed at once."""
        priced = self.priced(batch, max_k)
        return None if priced is None else priced[0]

    def priced(self, batch: int, max_k: int) -> tuple[list[float], float] | None:
        """``costs`` and the seconds of the target-only round they are counted in, from the same table. Kept
        until the tables change (a round recorded, a re-measure's aging): a round asks more than once."""
        key = (batch, max_k)
        if key not in self._priced:
            self._priced[key] = self._price(batch, max_k)
        return self._priced[key]

    def own_priced(self, batch: int, max_k: int) -> tuple[list[float], float] | None:
        """``priced`` where this batch size's own rounds price it (its unit_rounds target-only rounds and a
        speculative one), else None: a size priced by its bucket carries other sizes' rounds (a bucket of 8-15
        rows holds mostly 8's where a load of 8 ran), which would price 15 rows at about half of 16."""
        own = self._own(batch)
        if own is None or not any(n for k, (n, _) in own.by_k.items() if k):
            return None
        return self.priced(batch, max_k)

    def _own(self, batch: int) -> _CostTable | None:
        """This batch size's own table, once it has unit_rounds target-only rounds (one noisy unit would scale
        every K), else None."""
        own = self.by_batch.get(batch)
        return own if own is not None and own.units >= self.unit_rounds else None

    def _price(self, batch: int, max_k: int) -> tuple[list[float], float] | None:
        own = self._own(batch)
        bucket = self.by_bucket.get(batch.bit_length())
        for table, through_unit in ((own, False), (own, True), (bucket, False), (bucket, True)):
            if table is not None:
                priced = table.priced(max_k, self.prior_rounds, self.verify_cost_ratio, through_unit)
                if priced is not None:
                    return priced
        return None


@dataclass(frozen=True)
class Decision:
    """Adaptive K's last choice for one batch size, and why: the rows' mean acceptance (where their caller waits for
    them all, the lowest as judged: waited_acceptances), the chosen K's round cost
    in target-only rounds of that batch size (1 for K 0), its expected speedup over target-only (expected tokens
    per round / round cost; 1 for K 0), whether the costs were measured (else the policy's ratios), and whether
    the rows were judged as a group their caller waits for (GenerationLoop._waited)."""

    k: int
    acceptance: float
    round_cost: float
    expected_speedup: float
    measured: bool
    waited: bool = False


class AdaptiveState:
    """What adaptive K learns that outlives one request: the round costs and the pooled acceptance. An engine
    keeps one across its generate calls; a long-running loop (the Triton model's) owns its own. ``decisions``
    (batch size -> its last Decision) and ``rounds_by_k`` ((batch size, K) -> rounds) say what it chose and why
    (a server's metrics). ``measure`` False: the policy's ratios only, no unit rounds (a loop that lives for one
    request measures too little to price K, and a unit round would only slow it)."""

    hold_rounds, hold_below = 4, 1.0

    def __init__(self, policy: KPolicy, clock=time.perf_counter, measure: bool = True):
        self.policy, self.measure = policy, measure
        self.costs = RoundCosts(policy, clock=clock)
        # Prompt lookup's rounds (no draft steps, only a longer verification) on their own, beside the same
        # target-only units: lookup's cost per proposed token is what its verification costs where it runs.
        self.lookup_costs = RoundCosts(policy, clock=clock)
        self.pool = AcceptancePool(policy)
        # the spread of acceptance between the draft's requests, for groups their caller waits for
        self.spread = RowSpread(policy.row_spread)
        # prompt lookup's acceptance, pooled the same way (a request's own estimate shrinks toward it)
        self.lookup_pool = Acceptance(policy.lookup_prior, policy.prior_weight, 0.005)
        # the share of rounds in which a request's search finds a match, pooled the same way
        self.lookup_hits = Acceptance(policy.lookup_hit_prior, policy.prior_weight, 0.005)
        self.decisions: dict[int, Decision] = {}
        self.rounds_by_k: dict[tuple[int, int], int] = {}
        self._linear: dict[int, tuple[float, ...]] = {}  # _ratios
        # batch size -> (its rows, rounds its target-only choice still holds, the re-measure's K): choose
        self._held: dict[int, tuple[tuple[KController, ...], int, int]] = {}
        # whether the last choose gave a K of its own measuring instead of the policy's (a unit round, a
        # re-measure, a slope probe): the loop then proposes nothing else in that round (no prompt lookup), so
        # the round measures what it was meant to
        self.measuring = False

    def begin_round(self) -> None:
        self.costs.begin_round()
        self.lookup_costs.begin_round()

    def idle(self) -> None:
        self.costs.idle()
        self.lookup_costs.idle()

    def timed(self, batch: int, k: int, looked_up: bool, catch_up: int = 0) -> None:
        """Time this round as one batch of ``batch`` rows verifying up to ``k`` tokens: a target-only round is
        both tables' unit; a round of looked-up proposals is lookup's, else the draft's (``catch_up``: tokens its
        drafts take in beyond a round's own, whose cost the round measures)."""
        if k == 0 or not looked_up:
            self.costs.start(batch, k, catch_up)
        if k == 0 or looked_up:
            self.lookup_costs.start(batch, k)

    def catch_up_pays(
        self, batch: int, max_k: int, k: int, acceptance: float, remaining: int, behind: int
    ) -> bool:
        """``catch_up_pays`` at this batch size's measured costs and catch-up price (True until both are
        measured: the first catch-ups measure it)."""
        priced = self.costs.priced(batch, max_k) if self.measure else None
        per_token = self.costs.catch_up.per_token
        if priced is None or per_token is None:
            return True
        costs, unit = priced
        if batch in self.costs.exploring:
            # a re-measure (RoundCosts.explore_due) prices the catch-up by the policy's ratios, which chose its K:
            # the measured costs would refuse what it re-measures
            costs = self._ratios(max_k)
        return catch_up_pays(behind, remaining, acceptance, k, costs, unit, per_token, batch)

    def draft_prices(self, batch: int, max_k: int) -> Costs | None:
        """The draft's measured cost per K for this batch size (None: not measured, or not measuring)."""
        return self.costs.costs(batch, max_k) if self.measure else None

    def lookup_prices(self, batch: int, max_k: int) -> Costs | None:
        """Lookup's measured cost per proposal length for this batch size (None: not measured, or not measuring)."""
        return self.lookup_costs.costs(batch, max_k) if self.measure else None

    def snapshot(self) -> tuple[dict[int, Decision], dict[tuple[int, int], int]]:
        """Copies of ``decisions`` and ``rounds_by_k`` another thread may read while the loop goes on."""
        return dict(self.decisions), dict(self.rounds_by_k)

    def choose(
        self,
        controllers: Sequence[KController],
        in_flight: int,
        batch: int,
        max_k: int,
        timed: bool = True,
        remaining: Sequence[int] | None = None,
    ) -> int:
        """The K of the adaptive rows of a batch of ``batch`` rows (group_k with this batch size's measured
        costs; ``remaining``: the rows' tokens left, where their caller waits for several rows, with the batch's
        smaller sizes' costs (_shrink) and break-even while the rows are ``learning`` or their last choice
        drafted), or 0 for a round that measures the target-only unit (RoundCosts.unit_due), the policy's K where
        a re-measure is due (RoundCosts.explore_due), or a neighbour K that gives the line a slope
        (RoundCosts.slope_probe).
        ``timed``: the round will be timed as one batch of these rows, all adaptive (a pinned row drafts anyway;
        a round of several batches or with a prompt's prefill is not timed), so a target-only round would
        measure the unit.

        A choice of target-only where every K is priced below break-even (``hold_below``) holds for the next
        ``hold_rounds`` - 1 rounds of the same rows at this batch size without judging them again (a re-measure
        still comes when due): their estimates move little in a few rounds without drafting, and judging a
        group of 16 waited rows took 0.2 ms of a 10 ms target-only round (the demo pair on an AMD EPYC Zen 5),
        where adaptive runs target-only nearly always."""
        rows = tuple(controllers)
        held = self._held.get(batch)
        if (
            held is not None
            and held[1] > 0
            and len(held[0]) == len(rows)
            and all(map(operator.is_, held[0], rows))
        ):
            self._held[batch] = (rows, held[1] - 1, held[2])
            return self._measured(batch, 0, held[2], timed, remaining is not None)
        self._held.pop(batch, None)
        costs = self.costs.costs(batch, max_k) if self.measure else None
        judged = group_acceptances(controllers, remaining, self.spread.value)
        cap = _cap(controllers, in_flight)
        # where every row of the batch is one the caller waits for, the batch shrinks as they finish
        shrink = None
        if remaining is not None and costs is not None and len(remaining) == batch:
            shrink = self._shrink(batch, max_k, cap)
        # once a round: with rows whose caller waits for them all, K by K over every row
        tokens = group_tokens_per_k(judged, cap, remaining, shrink)
        prices = costs or self._ratios(max_k)  # cap <= max_k: each row's K is at most the engine's
        # A waited group judged near break-even by the pool alone drafts (no margin) until its rows have judged
        # what the prior weighs: only its own rounds tell a group that pays from one that does not (the default
        # sets in groups: K=2 ran 1.1-1.4x on raw groups, 0.8-1.0x on chat ones), and a group that never drafts
        # learns nothing but a probe's one position in probe_every rounds. Drafting at break-even costs little;
        # the margin guards against the noise of a group's own estimates, which it does not have yet.
        # A waited group whose last choice drafted keeps drafting while some K pays at all: the margin turns
        # drafting on, not off. A group judged on its rows' first positions, which the draft matches less often
        # than later ones, reads near break-even, and a margin to stay on would switch it off and leave it off
        # while its rows' counts age back (the demo pair's chat groups of 2: 20-30 rounds of K=0 mid-group where
        # static K=2 ran 1.16-1.22x target-only). The choice, not what a round ran: a unit round or a catch-up
        # left out does not turn a drafting group off, nor a re-measure an idle one on.
        at_break_even = remaining is not None and (
            learning(controllers) or all(c.drafting for c in controllers)
        )
        margin = 0.0 if at_break_even else self.policy.min_gain
        k = peak_k(tokens, prices, margin)
        for controller in controllers:
            controller.drafting = k > 0
        self._decided(batch, k, judged, tokens, prices, costs is not None, remaining)
        # where measured costs switched drafting off, what the policy's ratios would draft (explore_due)
        candidate = 0 if costs is None or k else peak_k(tokens, self._ratios(max_k), self.policy.min_gain)
        if not k and all(tokens[j] < self.hold_below * prices[j] for j in range(1, len(tokens))):
            self._held[batch] = (rows, self.hold_rounds - 1, candidate)
        if k and self.measure and timed and self.costs.unit_due(batch, k):
            self.costs.exploring.discard(batch)
            self.measuring = True
            return 0
        chosen = self._measured(batch, k, candidate, timed, remaining is not None)
        if chosen != k or not (self.measure and timed):
            return chosen
        probe = self.costs.slope_probe(batch, k, cap, tokens[k] / prices[k])
        self.measuring = probe != k
        return probe

    def _measured(self, batch: int, k: int, candidate: int, timed: bool, patient: bool) -> int:
        """``k``, or ``candidate`` where a timed round's re-measure is due (RoundCosts.explore_due)."""
        self.costs.exploring.discard(batch)
        self.measuring = False
        if not (self.measure and timed):
            return k
        if self.costs.explore_due(batch, k, candidate, patient=patient):
            self.measuring = True
            return candidate
        return k

    def _shrink(self, batch: int, max_k: int, cap: int) -> list[list[float]] | None:
        """Per K in 0..cap, a round's measured cost with b rows (index b - 1) over its cost with ``batch``
        (group_tokens_per_k's ``shrink``), from the sizes' own rounds (RoundCosts.own_priced: a bucket's price
        carries other sizes' rounds); a size without rounds of its own on the line between the nearest sizes
        that have them (no rows at all: the policy's fixed_round_share); never more than with one row more
        (noise in a rarely run size would price a smaller batch dearer). None where ``batch`` has no rounds of
        its own."""
        full = self.costs.own_priced(batch, max_k)
        if full is None:
            return None
        costs, unit = full
        seconds = [cost * unit for cost in costs]
        known: dict[int, list[float]] = {
            0: [self.policy.fixed_round_share] * (cap + 1),
            batch: [1.0] * (cap + 1),
        }
        for rows in range(1, batch):
            priced = self.costs.own_priced(rows, max_k)
            if priced is not None:
                known[rows] = [priced[0][k] * priced[1] / seconds[k] for k in range(cap + 1)]
        sizes = sorted(known)
        shrink = [[1.0] * batch for _ in range(cap + 1)]
        at = len(sizes) - 1  # sizes[at]: the largest measured size <= rows, walked down with rows
        for rows in range(batch - 1, 0, -1):  # each choice of a measured waited group runs this: plain loops
            while sizes[at] > rows:
                at -= 1
            below = sizes[at]
            above = rows if below == rows else sizes[at + 1]
            part = 0.0 if above == below else (rows - below) / (above - below)
            low, high = known[below], known[above]
            for k, shares in enumerate(shrink):
                share = low[k] + part * (high[k] - low[k])
                larger = shares[rows]
                shares[rows - 1] = larger if larger < share else share
        return shrink

    def _ratios(self, max_k: int) -> tuple[float, ...]:
        """The policy's round costs for K in 0..max_k (linear_costs), computed once per max_k."""
        if max_k not in self._linear:
            self._linear[max_k] = tuple(
                linear_costs(self.policy.draft_cost_ratio, self.policy.verify_cost_ratio, max_k)
            )
        return self._linear[max_k]

    def worth_probing(self, batch: int, max_k: int, in_flight: int) -> bool:
        """Whether a probe can change anything at this batch size: some K pays at a high acceptance (0.95) by
        the measured costs. Where even that does not pay, a probe only costs (its row's draft catching up on
        everything it skipped, the prompt included)."""
        costs = self.costs.costs(batch, max_k) if self.measure else None
        if costs is None:
            return True
        return best_k(0.95, capped(max_k, self.policy.schedule, in_flight), self.policy, costs) > 0

    def ran(self, batch: int, k: int) -> None:
        """Count a round adaptive rows ran with ``k`` draft tokens (a unit round, a first round from the
        target's prefill alone and a K cut to the budget count as what ran, not as what was chosen)."""
        self.rounds_by_k[batch, k] = self.rounds_by_k.get((batch, k), 0) + 1

    def _decided(
        self,
        batch: int,
        k: int,
        judged: Sequence[float],
        tokens: Sequence[float],
        prices: Costs,
        measured: bool,
        remaining: Sequence[int] | None,
    ) -> None:
        """Record the choice (Decision): ``tokens`` and ``prices`` per K, as the choice read them."""
        acceptance = sum(judged) / len(judged) if remaining is None else min(judged)
        self.decisions[batch] = Decision(
            k, acceptance, prices[k], tokens[k] / prices[k], measured, remaining is not None
        )
