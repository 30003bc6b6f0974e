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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trtspec.core.metrics import analytic_speedup_bound, expected_tokens_per_round


@dataclass(frozen=True)
class KPolicy:
    """Settings of adaptive K. Cost ratios are in target decoding steps (one draft step / one target step; one
    (K+1)-token verification / one target step); acceptance values are probabilities per draft token."""

    draft_cost_ratio: float = 0.2  # the demo pair on CPU (2 of 10 layers); measure yours with trtspec bench
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


def best_k(acceptance: float, cap: int, policy: KPolicy) -> int:
    """The K in 0..cap with the best analytic speedup at ``acceptance``; 0 unless one beats 1 + min_gain."""
    best, best_speedup = 0, 1.0 + policy.min_gain
    for k in range(1, cap + 1):
        tokens = expected_tokens_per_round(acceptance, k)
        speedup = analytic_speedup_bound(tokens, k, policy.draft_cost_ratio, policy.verify_cost_ratio)
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

    def choose(self, in_flight: int) -> int:
        """This round's K for a loop with ``in_flight`` sequences: min(best for the acceptance, schedule, max_k),
        or a 1-token probe after probe_every rounds off."""
        cap = self.max_k
        scheduled = schedule_cap(self.policy.schedule, in_flight)
        if scheduled is not None:
            cap = min(cap, scheduled)
        k = best_k(self.acceptance, cap, self.policy)
        if k == 0 and cap > 0 and self.rounds_off >= self.policy.probe_every:
            return 1
        return k
