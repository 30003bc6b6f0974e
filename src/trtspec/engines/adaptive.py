"""Adaptive K: each request's draft length follows its running acceptance and the loop's load (pure logic).

    policy = KPolicy(draft_cost_ratio=0.2, schedule={1: 8, 4: 4, 8: 2, 16: 0})
    controller = KController(policy, max_k=8)
    k = controller.choose(in_flight=3)        # this round's K (0 = target-only)
    controller.update(num_draft=k, num_accepted=2)  # after the round

By acceptance: ``acceptance`` is an exponential moving average of per-position outcomes (each draft token the
target looked at: accepted 1, the first rejected one 0; positions after a rejection were never judged), starting
from ``prior``. ``choose`` takes the K in 0..cap that maximises core.metrics' analytic speedup bound for that
acceptance and the policy's cost ratios; K = 0 (target-only, speedup 1) wins unless some K beats it by
``min_gain``, so a draft that cannot pay is switched off. A request that switched off learns nothing more, so
after ``probe_every`` rounds without drafting it drafts one token (a probe) to measure again.

By load: ``schedule`` maps in-flight sequences to the largest K (``{4: 4, 16: 0}``: up to 4 in flight at most
4, up to 16 none; past the largest key its K holds). Speculation pays less as the batch grows: the target's
forward turns compute-bound and every draft step costs the whole batch.

By batch: rows batched in one round share its forwards, which run as many draft steps as the largest K among
them and verify that many tokens for every row, so ``group_k`` gives every adaptive row of a batch the one K that
maximises the batch's speedup (the mean of its rows' expected tokens per round over the round's cost).

By measured cost: ``RoundCosts`` fits each batch size's round seconds as a + b * K from the rounds the loop ran
(an exponentially weighted least-squares line), so the cost of one more draft token in target-only rounds, b / a,
is measured where it applies: it includes the draft step and the longer verification, both of which grow with
the batch. ``draft_cost_ratio`` is its value until a batch size has rounds of two different K.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trtspec.core.metrics import analytic_speedup_bound, expected_tokens_per_round


@dataclass(frozen=True)
class KPolicy:
    """Settings of adaptive K. Cost ratios are in target decoding steps (one draft step / one target step; one
    (K+1)-token verification / one target step); acceptance values are probabilities per draft token."""

    draft_cost_ratio: float = (
        0.2  # until rounds are measured (RoundCosts); the demo pair's is ~0.1 at batch 1
    )
    verify_cost_ratio: float = 1.0
    prior: float = 0.7  # optimistic: a new request drafts from its first rounds and measures
    smoothing: float = 0.1  # weight of each judged position (~ the last 10-20): acceptance comes in bursts
    min_gain: float = 0.05  # a K must beat target-only by 5% (hysteresis against noise near break-even)
    probe_every: int = 16  # target-only rounds between probes
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


def best_k(
    acceptance: float | Sequence[float], cap: int, policy: KPolicy, draft_cost_ratio: float | None = None
) -> int:
    """The K in 0..cap with the best analytic speedup for rows batched together at these acceptances (their mean
    expected tokens per round over one round's cost); 0 unless one beats 1 + min_gain. ``draft_cost_ratio``:
    measured (RoundCosts), else the policy's."""
    rows = [acceptance] if isinstance(acceptance, int | float) else list(acceptance)
    ratio = policy.draft_cost_ratio if draft_cost_ratio is None else draft_cost_ratio
    best, best_speedup = 0, 1.0 + policy.min_gain
    for k in range(1, cap + 1):
        tokens = sum(expected_tokens_per_round(a, k) for a in rows) / len(rows)
        speedup = analytic_speedup_bound(tokens, k, ratio, policy.verify_cost_ratio)
        if speedup > best_speedup:
            best, best_speedup = k, speedup
    return best


class KController:
    """One request's K: ``update`` after each round, ``choose`` before the next (see the module docstring)."""

    def __init__(self, policy: KPolicy, max_k: int):
        self.policy, self.max_k = policy, max_k
        self.acceptance = policy.prior
        self.rounds_off = 0  # consecutive rounds that drafted nothing

    def update(self, num_draft: int, num_accepted: int) -> None:
        """Fold one round in: ``num_accepted`` of ``num_draft`` draft tokens were accepted."""
        if num_draft == 0:
            self.rounds_off += 1
            return
        self.rounds_off = 0
        w = self.policy.smoothing
        judged = min(num_accepted + 1, num_draft)  # the target stops judging at the first rejection
        for position in range(judged):
            self.acceptance += w * (float(position < num_accepted) - self.acceptance)

    def choose(self, in_flight: int, draft_cost_ratio: float | None = None) -> int:
        """This round's K for a loop with ``in_flight`` sequences: min(best for the acceptance, schedule, max_k),
        or a 1-token probe after probe_every rounds off."""
        return group_k([self], in_flight, draft_cost_ratio)


def group_k(controllers: Sequence[KController], in_flight: int, draft_cost_ratio: float | None = None) -> int:
    """One K for adaptive rows batched in one round: the best for their acceptances together, capped by the
    schedule for ``in_flight`` and every row's max_k; a 1-token probe once a row has been off probe_every
    rounds. The controllers share one policy (the loop's)."""
    policy = controllers[0].policy
    cap = min(c.max_k for c in controllers)
    scheduled = schedule_cap(policy.schedule, in_flight)
    if scheduled is not None:
        cap = min(cap, scheduled)
    k = best_k([c.acceptance for c in controllers], cap, policy, draft_cost_ratio)
    if k == 0 and cap > 0 and any(c.rounds_off >= policy.probe_every for c in controllers):
        return 1
    return k


class RoundCosts:
    """Measured round cost per batch size: ``start(batch, k)`` before a round, ``stop()`` after it; ``ratio(batch)``
    is the fitted seconds of one more draft token over those of a target-only round (see the module docstring).

    Batch sizes are bucketed by powers of two (1, 2-3, 4-7, ...); ``decay`` weighs the rounds (~1/decay last
    ones count). A round that ran several batches (rows in different sampling groups) is left out: its time is
    not one batch's."""

    def __init__(self, fallback: float, decay: float = 0.05, clock=time.perf_counter):
        self.fallback, self.decay, self.clock = fallback, decay, clock
        self.sums: dict[int, list[float]] = {}  # bucket -> weighted [n, k, k^2, t, k*t]
        self.fitted: dict[int, float] = {}  # bucket -> the last ratio a fit gave
        self._pending: tuple[int, int, float] | None = None
        self._mixed = False

    def start(self, batch: int, k: int) -> None:
        self._mixed = self._pending is not None
        self._pending = (batch, k, self.clock())

    def stop(self) -> None:
        if self._pending is not None and not self._mixed:
            batch, k, began = self._pending
            self.record(batch, k, self.clock() - began)
        self._pending, self._mixed = None, False

    def record(self, batch: int, k: int, seconds: float) -> None:
        sums = self.sums.setdefault(batch.bit_length(), [0.0] * 5)
        for i, value in enumerate((1.0, k, k * k, seconds, k * seconds)):
            sums[i] = (1 - self.decay) * sums[i] + value

    def ratio(self, batch: int) -> float:
        """b / a of the fitted line a + b * K for this batch size. While the recent rounds ran (nearly) one K, or
        the fit is not a cost (a or b not positive: noise), the last fitted ratio holds (``fallback`` before one)."""
        bucket = batch.bit_length()
        sums = self.sums.get(bucket)
        if sums is None:
            return self.fallback
        n, k, kk, t, kt = sums
        spread = kk / n - (k / n) ** 2  # variance of K: a slope needs rounds of different K
        if spread >= 0.5:
            slope = (kt / n - (k / n) * (t / n)) / spread
            intercept = t / n - slope * k / n
            if slope > 0 and intercept > 0:
                self.fitted[bucket] = slope / intercept
        return self.fitted.get(bucket, self.fallback)
