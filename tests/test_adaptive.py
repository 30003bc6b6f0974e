"""Adaptive K: the controller's literal cases (acceptance -> K, switching off, probing back, schedule caps), the
loop's use of it (pinned requests keep K, stats say which K ran) and outputs unchanged (HF greedy)."""

from __future__ import annotations

import itertools

import pytest
from test_engine import MAX_NEW, PROMPTS, hf_greedy

from trtspec.core.errors import RecipeError
from trtspec.core.metrics import AcceptanceStats, expected_tokens_per_round
from trtspec.engines.adaptive import (
    Acceptance,
    AcceptancePool,
    AdaptiveState,
    Drains,
    KController,
    KPolicy,
    RoundCosts,
    RowSpread,
    best_k,
    estimate_for,
    group_k,
    group_tokens_per_k,
    linear_costs,
    normal_order,
    policy_for,
    position_bucket,
    probe_due,
    schedule_cap,
    tail_rounds,
    waited_acceptances,
)
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.models.request import Limits, parse_request
from trtspec.triton_repo.values import in_process_values


def expected_max_normal(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom's approximation; 0 for one)."""
    return normal_order(n)[0]


def test_best_k_grows_with_acceptance_and_is_zero_when_drafting_cannot_pay():
    policy = KPolicy(draft_cost_ratio=0.3)
    assert best_k(0.9, 8, policy) == 5  # (1 - 0.9^6) / 0.1 / (5 * 0.3 + 1) = 1.87, the peak
    assert best_k(0.7, 8, policy) == 2
    assert best_k(0.99, 8, policy) == 8
    assert best_k(0.2, 8, policy) == 0 and best_k(0.35, 8, policy) == 0  # 1.35 / 1.3 < 1.05
    assert best_k(0.9, 3, policy) == 3
    assert best_k(0.9, 8, KPolicy(draft_cost_ratio=0.05)) == 8  # cheap drafts: draft more


def test_acceptance_is_accepted_over_judged_positions_with_a_lasting_pooled_prior():
    no_forgetting = KPolicy(prior=0.5, prior_weight=2.0, smoothing=0.0)
    controller = KController(no_forgetting, max_k=8)
    assert controller.acceptance == 0.5  # the prior's 2 pseudo-positions
    controller.update(num_draft=4, num_accepted=1)  # accepted, rejected; positions 3-4 never judged
    assert controller.acceptance == pytest.approx((1 + 1) / (2 + 2))
    controller.update(num_draft=2, num_accepted=2)  # both accepted, no rejection
    assert controller.acceptance == pytest.approx((2 + 2) / (4 + 2))
    controller.update(num_draft=0, num_accepted=0)  # a target-only round judges nothing
    assert controller.acceptance == pytest.approx(4 / 6) and controller.rounds_off == 1
    # forgetting: each judged position keeps (1 - smoothing) of the request's own counts; the prior's
    # pseudo-positions are never forgotten
    forgetting = KController(KPolicy(prior=0.5, prior_weight=2.0, smoothing=0.5), max_k=8)
    forgetting.update(num_draft=2, num_accepted=2)  # own: (0.25 * 0 + 2, 0.25 * 0 + 2)
    assert forgetting.acceptance == pytest.approx((2 + 1) / (2 + 2))
    forgetting.update(num_draft=3, num_accepted=0)  # one judged position, rejected: (1, 1 + 1)
    assert forgetting.acceptance == pytest.approx((1 + 1) / (2 + 2))
    # a round without drafting ages the own counts as one judged position would: back toward the prior
    forgetting.update(num_draft=0, num_accepted=0)
    assert forgetting.acceptance == pytest.approx((0.5 + 1) / (1 + 2))
    # a new request's prior is the loop's pooled acceptance, with the prior's weight
    started = KController(no_forgetting, max_k=8, prior=0.9)
    assert started.acceptance == pytest.approx(0.9)
    started.update(num_draft=4, num_accepted=0)
    assert started.acceptance == pytest.approx(1.8 / 3)


def test_a_short_unlucky_stretch_does_not_switch_a_request_off():
    """With the pooled acceptance at 0.83 (the demo pair's), three rounds that each reject the first draft token
    leave drafting on; a request that keeps failing is switched off (demo-like costs: a round drafting K costs
    1.3 + 0.15 K target-only rounds)."""
    costs = linear_costs(0.15, 1.3, 8)
    request = KController(KPolicy(), max_k=8, prior=0.83)
    assert request.choose(1, costs) >= 5
    for _ in range(3):
        request.update(request.choose(1, costs), 0)
    assert request.choose(1, costs) >= 1
    for _ in range(30):
        request.update(request.choose(1, costs) or 1, 0)
    assert request.choose(1, costs) == 0


def test_the_unbiased_estimate_drafts_what_the_true_acceptance_says():
    """Simulated i.i.d. drafts, requests of 16 rounds one after another, each starting from the pooled acceptance
    (as the loop runs them): the estimates centre on the true per-token acceptance, so the Ks chosen centre on
    the best K for it (an in-order moving average of outcomes ran about 0.05 low here)."""
    import random

    policy = KPolicy(draft_cost_ratio=0.1)
    rng = random.Random(0)
    for true in (0.7, 0.82):
        pool, estimates = AcceptancePool(policy), []
        for _ in range(300):
            controller = KController(policy, max_k=8, prior=pool)
            for _ in range(16):
                k = controller.choose(1)
                accepted = 0
                while accepted < k and rng.random() < true:
                    accepted += 1
                controller.update(k, accepted)
                pool.update(k, accepted)
                estimates.append(controller.acceptance)
        assert abs(sum(estimates) / len(estimates) - true) < 0.015, true


def early_low(position: int, i: int) -> int:
    """1 where a draft token at this generated position is accepted (``i`` counts rounds): 1 in 2 over a
    response's first 16 positions, 9 in 10 after (a draft that matches later tokens more often)."""
    return int(i % 2 == 0) if position < 16 else int(i % 10 != 0)


def early_low_pool(policy: KPolicy) -> AcceptancePool:
    """A pool of 60 requests of 64 positions each, drafting one token a round, accepted as early_low says."""
    pool, i = AcceptancePool(policy), itertools.count()
    for _ in range(60):
        for position in range(64):
            pool.update(1, early_low(position, next(i)), position)
    return pool


def test_the_pool_keeps_acceptance_by_position_and_a_row_reads_it_where_it_is():
    """Requests whose drafts are accepted less over their first 16 positions than after: the pool reads each
    position's own rate, a bucket no round reached reads as the whole pool, and over a range the average. A
    row that accepted as the pool did over its first positions reads, past them, what the pool does there, not
    its own early rate as a position-blind estimate does; one that accepted half as often reads lower."""
    assert [position_bucket(p) for p in (0, 7, 8, 15, 16, 31, 32, 64, 300)] == [0, 0, 1, 1, 2, 2, 3, 4, 6]
    policy = KPolicy()
    pool = early_low_pool(policy)
    # each bucket shrunk toward the whole pool (0.8)
    assert pool.at(3) == pytest.approx(0.5, abs=0.1) and pool.at(12) == pytest.approx(0.5, abs=0.1)
    assert pool.at(20) == pytest.approx(0.9, abs=0.05) and pool.at(50) == pytest.approx(0.9, abs=0.05)
    assert pool.at(1000) == pool.value  # no round reached it
    expected = (8 * pool.at(0) + 8 * pool.at(8) + 16 * pool.at(16) + 32 * pool.at(32)) / 64
    assert pool.ahead(0, 64) == pytest.approx(expected)
    assert pool.ahead(4, 20) == pytest.approx((4 * pool.at(4) + 8 * pool.at(8) + 4 * pool.at(16)) / 16)
    assert pool.ahead(40, 40) == pool.at(40)

    def row(accept_every: int, horizon: int | None = 64) -> Acceptance:
        estimate = estimate_for(policy, pool, horizon)
        for position in range(16):
            estimate.update(1, int(position % accept_every == 0))
            estimate.position = position + 1
        return estimate

    like_pool, half, every, blind = row(2), row(4), row(1), row(2, horizon=None)
    assert blind.value < like_pool.value - 0.1  # its own first positions, shrunk toward the whole pool
    assert like_pool.value == pytest.approx(pool.at(16), abs=0.07)
    assert like_pool.over_rest == pytest.approx(pool.ahead(16, 64), abs=0.07)
    assert half.value < like_pool.value - 0.07
    # above the pool where it judged, so above it past there too, but short of certainty (moved in odds)
    assert like_pool.value < every.value < 0.99
    like_pool.position = 0  # back where it judged: about its own rate there
    assert like_pool.value == pytest.approx(0.5, abs=0.05)


def test_a_waited_group_is_judged_over_its_rows_remaining_positions():
    """Rows whose caller waits for them all end when their slowest one does, after all their remaining positions:
    waited_acceptances reads each row's acceptance over them, not at the position at hand (here the low first
    ones)."""
    policy = KPolicy()
    pool = early_low_pool(policy)
    rows = [KController(policy, 4, pool, horizon=64) for _ in range(2)]
    assert rows[0].acceptance == pytest.approx(pool.at(0), abs=0.01)  # nothing of its own yet
    judged = waited_acceptances(rows, spread=0.0)
    assert judged == pytest.approx([pool.ahead(0, 64)] * 2, abs=0.01) and judged[0] > rows[0].acceptance + 0.2


def test_a_loop_pools_acceptance_where_its_rows_are():
    """Through a real loop: the pool learns each position bucket its adaptive rows judged, each row's estimate
    knows where the row is (its tokens generated), and a seeded sampled row keeps a plain estimate (its K must
    not depend on other requests)."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = PricedRounds(), KPolicy()
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
    loop.add(0, [1, 2, 3], SamplingParams(max_new_tokens=40))
    loop.step()
    loop.step()
    (request,) = loop.active
    assert request.controller.estimate.position == len(request.generated) > 0
    while loop.busy:
        loop.step()
    assert set(state.pool.by_position) == {0, 1, 2, 3}  # positions 0-39 drafted
    assert state.pool.at(20) > policy.prior  # PricedRounds: nearly every draft token accepted
    loop.add(1, [1, 2, 3], SamplingParams(max_new_tokens=40, temperature=1.0, seed=7))
    loop.step()
    assert type(loop.active[0].controller.estimate) is Acceptance


def test_high_acceptance_drafts_long_low_acceptance_switches_off_then_probes_back():
    policy = KPolicy(probe_every=3)
    pool = AcceptancePool(policy)
    controller = KController(policy, max_k=8, prior=pool)

    def run(k: int, accepted: int) -> None:  # the loop folds every adaptive round into both
        controller.update(k, accepted)
        pool.update(k, accepted)

    for _ in range(20):
        run(4, 4)
    assert controller.choose(1) >= 7
    for _ in range(80):
        run(controller.choose(1) or 1, 0)
    # the request's own rounds say 0; the pool, which forgets more slowly, still says about 0.43
    assert controller.acceptance < 0.2 and controller.choose(1) == 0
    ks = []
    for _ in range(8):  # target-only rounds: every 3rd one after them is a 1-token probe
        ks.append(controller.choose(1))
        run(ks[-1], 0)
    assert ks == [0, 0, 0, 1, 0, 0, 0, 1]
    for _ in range(12):  # the probes accept again: drafting comes back
        run(controller.choose(1) or 1, 1)
    assert controller.choose(1) >= 1


def test_the_schedule_caps_k_by_load():
    schedule = {1: 8, 4: 4, 8: 2, 16: 0}
    assert [schedule_cap(schedule, n) for n in (1, 2, 4, 5, 8, 9, 16, 40)] == [8, 4, 4, 2, 2, 0, 0, 0]
    assert schedule_cap(None, 5) is None
    controller = KController(KPolicy(schedule=schedule, prior=0.99), max_k=6)
    assert [controller.choose(n) for n in (1, 3, 6, 12)] == [6, 4, 2, 0]  # min(adaptive, schedule, max_k)


def test_a_batch_shares_the_k_best_for_its_rows_together():
    policy = KPolicy(draft_cost_ratio=0.3)
    high, low = KController(policy, max_k=8, prior=0.9), KController(policy, max_k=8, prior=0.2)
    assert best_k(0.9, 8, policy) == 5 and best_k(0.2, 8, policy) == 0
    # Judged at the rows' mean acceptance 0.55: K 1 1.55 / 1.3 = 1.19, K 2 1.8525 / 1.6 = 1.16, then less: the
    # batch drafts 1, not 5 for one row and 0 for the other. (The mean of the rows' own expected tokens would
    # say K 2: (2.71 + 1.24) / 2 / 1.6 = 1.234 against K 1's 1.19, rating K by the high row's long runs.)
    assert group_k([high, low], in_flight=2) == 1
    assert best_k([0.9, 0.2], 8, policy) == 1 == best_k(0.55, 8, policy)
    assert best_k([0.9, 0.9], 8, policy) == 5  # rows alike: each one's best
    # cheap drafts: longer (at 0.55, K 4 2.110 / 1.2 = 1.759 against K 3 1.755 and K 5 1.729)
    assert group_k([high, low], in_flight=2, costs=linear_costs(0.05, 1.0, 8)) == 4
    assert group_k([high, low], in_flight=2, costs=linear_costs(3.0, 1.0, 8)) == 0  # dear drafts: target-only
    # a speculative round costing 1.2 target-only steps before its drafts: acceptance 0.5 no longer pays (K 1:
    # 1.5 / (0.3 + 1.2) = 1.0)
    assert best_k(0.9, 8, policy, linear_costs(0.3, 1.0, 8)) == 5
    assert best_k(0.5, 8, policy, linear_costs(0.3, 1.2, 8)) == 0
    capped = KController(policy, max_k=1)
    assert group_k([high, capped], in_flight=2) == 1  # every row's max_k caps the shared K
    low.rounds_off = policy.probe_every
    assert group_k([low], in_flight=1) == 0 and probe_due(low, in_flight=1)  # off long enough: the row probes


def test_rows_whose_caller_waits_for_them_all_are_judged_by_the_row_expected_to_finish_last():
    policy = KPolicy(draft_cost_ratio=0.3)
    # One row: its own tokens per round (the geometric model), whatever its budget; rows alike: the same.
    alone = [expected_tokens_per_round(0.6, k) for k in range(5)]
    assert group_tokens_per_k([0.6], 4, [40]) == pytest.approx(alone) == group_tokens_per_k([0.6], 4)
    assert group_tokens_per_k([0.6, 0.6], 4, [40, 40]) == pytest.approx(alone)
    # Steady load: the mean acceptance. Equal budgets: the slower row ends the group. At 0.2, K 1 gives 1.2
    # tokens per round for 1.3 of the cost.
    assert group_tokens_per_k([0.9, 0.2], 2) == pytest.approx(
        [expected_tokens_per_round(0.55, k) for k in range(3)]
    )
    assert group_tokens_per_k([0.9, 0.2], 2, [64, 64]) == pytest.approx([1.0, 1.2, 1.24])
    assert best_k([0.9, 0.2], 8, policy) == 1  # a steady load's throughput: the mean acceptance 0.55
    assert best_k([0.9, 0.2], 8, policy, remaining=[64, 64]) == 0
    # A row far behind ends the group even if it accepts more: 100 tokens at 0.9 (K 5: 4.69 per round, 21.3
    # rounds) against 10 at 0.2 (1.25 per round, 8 rounds at most), so the group drafts the high row's K.
    assert best_k([0.9, 0.2], 8, policy, remaining=[100, 10]) == best_k(0.9, 8, policy) == 5
    high, low = KController(policy, max_k=8, prior=0.9), KController(policy, max_k=8, prior=0.2)
    assert group_k([high, low], in_flight=2, remaining=[64, 64]) == 0
    assert group_k([high, low], in_flight=2) == 1


def test_rows_that_just_started_are_judged_by_the_slowest_of_as_many_requests():
    """Fresh rows carry the pooled estimate alike, yet one of them will accept least and end the group: ranked by
    their estimates, the lowest is lowered by the spread between requests times the expected largest of as many
    normal draws, the next by the second largest, and so on, in proportion to the share of its estimate that is
    the prior."""
    policy = KPolicy()
    fresh = [KController(policy, max_k=8, prior=0.58) for _ in range(8)]
    assert waited_acceptances(fresh[:1], 0.15) == [pytest.approx(0.58)]  # a row alone is its own group
    assert expected_max_normal(8) == pytest.approx(1.4236, rel=0.01)  # the exact expected largest of 8
    assert expected_max_normal(1) == 0.0
    draws = normal_order(8)
    assert draws[0] == expected_max_normal(8) and list(draws) == sorted(draws, reverse=True)
    assert sum(draws) == pytest.approx(0.0, abs=1e-12)  # the fastest raised as much as the slowest lowered
    judged = waited_acceptances(fresh, 0.15)
    assert sorted(judged) == pytest.approx([0.58 - 0.15 * z for z in draws])
    assert min(judged) == pytest.approx(0.58 - 0.15 * expected_max_normal(8))
    # of rows alike, the one with the most tokens left is the slowest (it ends the group)
    remaining = [64, 64, 64, 64, 64, 64, 90, 64]
    assert min(waited_acceptances(fresh, 0.15, remaining)) == waited_acceptances(fresh, 0.15, remaining)[6]
    seasoned = KController(policy, max_k=8, prior=0.58)
    # its own positions outweigh the prior's 10: it accepts less than the rest, so it ranks lowest
    for _ in range(30):
        seasoned.update(num_draft=2, num_accepted=1)
    assert seasoned.estimate.prior_share < 0.4 and seasoned.acceptance < 0.58
    assert (
        waited_acceptances([seasoned] + fresh[1:], 0.15)[0]
        > seasoned.acceptance - 0.15 * expected_max_normal(8) * 0.4
    )
    # The demo pair's groups of 8 on its grounded set: K 1 costs 1.44 target-only rounds, which the pooled
    # acceptance 0.58 pays for in a steady load (1.58 / 1.44 = 1.10) but the slowest of 8 does not.
    costs = [1.0] + [1.0 + 0.44 * k for k in range(1, 9)]
    assert group_k(fresh, 8, costs) == 1
    assert group_k(fresh, 8, costs, remaining=[64] * 8, spread=0.15) == 0
    assert group_k(fresh[:1], 1, costs, remaining=[64], spread=0.15) == 1  # alone: its own acceptance
    # A row whose own rounds narrowed its estimate (prior share 0.1) among fresh ones: the group's slowest does not
    # jump as its estimate crosses theirs; the largest draw stays with a fresh row, which it takes lowest.
    slowest = []
    for estimate in (0.579, 0.581):
        narrowed = KController(policy, max_k=8, prior=0.58)
        narrowed.estimate.counts = (estimate * 100 - 10 * 0.58, 90.0)
        assert narrowed.acceptance == pytest.approx(estimate) and narrowed.estimate.prior_share == 0.1
        slowest.append(min(waited_acceptances([narrowed] + fresh[1:], 0.15)))
    assert slowest == pytest.approx([0.58 - 0.15 * expected_max_normal(8)] * 2)


def measured_state(small_batch_ms: float, smaller: tuple[int, ...] = (3, 2, 1)) -> AdaptiveState:
    """An AdaptiveState whose batch 4 measured 10 ms target-only and 15.2 ms + 4 ms per draft token beyond one
    (K=1 1.52 target-only rounds), and the ``smaller`` batch sizes ``small_batch_ms`` per target-only round with
    the same share per K."""
    state = AdaptiveState(KPolicy())
    for batch, unit in ((4, 10.0),) + tuple((b, small_batch_ms) for b in smaller):
        scale = unit / 10.0
        for k in (0, 0, 0, 1, 3, 1, 3):
            ms = 10.0 if k == 0 else 15.2 + 4.0 * (k - 1)
            state.costs.record(batch, k, scale * ms / 1000)
    return state


def learned(controllers: list[KController]) -> list[KController]:
    """The rows as if each had judged as many draft positions of its own as the prior weighs (KController.lifetime),
    their estimates unchanged, and their group's last choice had not drafted: past the start where a waited group
    drafts at break-even (adaptive.learning), and not a group that keeps drafting at break-even (drafting)."""
    for controller in controllers:
        controller.lifetime = (7, controller.policy.prior_weight)
        controller.drafting = False
    return controllers


def test_a_group_whose_rows_finish_apart_is_priced_by_what_its_smaller_batches_cost():
    """Rows whose caller waits for them all finish apart, and after the first ones the batch is smaller: where a
    smaller batch's round costs less, the slowest row's last rounds cost less than a whole batch's."""
    assert tail_rounds([40, 40, 40], [0.5, 0.7, 1.0]) == 40  # rows that finish together: all rounds whole
    assert tail_rounds([30, 36, 40], [1.0, 1.0, 1.0]) == 40  # rounds as dear at any size: the slowest row's
    assert tail_rounds([30, 36, 40], [0.5, 0.7, 1.0]) == pytest.approx(30 + 6 * 0.7 + 4 * 0.5)
    rows, budgets = [0.5, 0.6, 0.8], [64, 64, 64]
    whole = [[1.0] * 3 for _ in range(3)]
    assert group_tokens_per_k(rows, 2, budgets, whole) == pytest.approx(group_tokens_per_k(rows, 2, budgets))
    cheaper = [[1.0, 1.0, 1.0], [0.5, 0.7, 1.0], [0.6, 0.8, 1.0]]
    tokens = group_tokens_per_k(rows, 2, budgets, cheaper)
    ends = sorted(64 / expected_tokens_per_round(a, 1) for a in rows)
    assert tokens[1] == pytest.approx(64 / tail_rounds(ends, cheaper[1]))
    assert tokens[0] == 1.0 and tokens[1] > group_tokens_per_k(rows, 2, budgets)[1]
    # budgets apart: target-only's rows finish apart too, priced by its own shrinking rounds (shrink[0])
    apart = group_tokens_per_k([0.6, 0.6], 1, [64, 32], [[0.5, 1.0], [0.5, 1.0]])
    assert apart[0] == 1.0 and apart[1] == pytest.approx(expected_tokens_per_round(0.6, 1))
    with pytest.raises(ValueError, match="3 rows' acceptances for 2 budgets"):
        group_tokens_per_k(rows, 2, budgets[:2])

    # Four fresh rows at the pooled 0.7 (spread 0.15): the slowest at 0.55 makes K=1 pay 1.55 / 1.52 = 1.02,
    # under the 5% margin, where every round costs a batch of 4; with rounds of 1-3 rows at 0.6 of that, the
    # group's time at K=1 is 4% shorter and drafting pays.
    # (The rows have judged what the prior weighs and their group has not drafted: a group still learning, or one
    # whose last choice drafted, would draft at break-even anyway.)
    fresh = learned([KController(KPolicy(), max_k=4) for _ in range(4)])
    assert measured_state(10.0).choose(fresh, 4, 4, 4, timed=False, remaining=[64] * 4) == 0
    cheap = measured_state(6.0)
    assert cheap.choose(fresh, 4, 4, 4, timed=False, remaining=[64] * 4) > 0
    assert cheap.decisions[4].expected_speedup > 1.05
    # A batch with a row the call does not wait for (3 of 4 waited): no shrink (batch 4's, whose first share
    # below the whole batch is at 2 rows here, would price 3 waited rows' group at K=1 1.09x).
    partial = measured_state(6.0, smaller=(2, 1))
    assert partial.choose(learned(fresh[:3]), 4, 4, 4, timed=False, remaining=[64] * 3) == 0
    # A batch size priced by its bucket (batch 4 never ran; batch 5 did): no shrink either
    bucket_only = AdaptiveState(KPolicy())
    for k in (0, 0, 0, 1, 3, 1, 3):
        bucket_only.costs.record(5, k, 0.010 if k == 0 else 0.0152 + 0.004 * (k - 1))
    assert bucket_only.costs.costs(4, 4) is not None and bucket_only._shrink(4, 4, 4) is None
    assert measured_state(10.0).costs.costs(4, 4) == cheap.costs.costs(4, 4)
    # Only sizes measured on their own count: batch 3 unmeasured (its bucket, 2-3, holds batch 2's rounds) is on
    # the line between batches 2 and 4; batch 1, below the smallest measured size, on the line from it down to a
    # round without rows at fixed_round_share (whole rounds by default: no cheaper than batch 2)
    assert measured_state(6.0, smaller=(2,))._shrink(4, 4, 4)[1] == pytest.approx([0.6, 0.6, 0.8, 1.0])
    lower = measured_state(6.0, smaller=(2,))
    lower.policy = KPolicy(fixed_round_share=0.3)
    assert lower._shrink(4, 4, 4)[1] == pytest.approx([0.45, 0.6, 0.8, 1.0])
    assert measured_state(6.0, smaller=(2,)).costs.costs(3, 4) == cheap.costs.costs(2, 4)
    # a size below a cheaper one costs no more than it (noise in a rarely run size)
    noisy = measured_state(6.0, smaller=(2,))
    for k in (0, 0, 0, 1, 3, 1, 3):
        noisy.costs.record(1, k, 0.9 * (0.010 if k == 0 else 0.0152 + 0.004 * (k - 1)))
    assert noisy._shrink(4, 4, 4)[1][:2] == pytest.approx([0.6, 0.6])


def test_a_cold_engines_lockstep_group_prices_the_smaller_batches_it_never_ran_by_fixed_round_share():
    """Rows that decode target-only in lockstep finish together, so a cold engine's batch of 8 has no smaller size
    measured. Priced as whole rounds (the default), the group's last rounds cost as much as its first, and a group
    near break-even stays target-only; with a lower fixed_round_share the sizes it never ran lie on the line down
    to it, the group drafts, and the sizes it then runs price themselves."""
    # batch 8: K=1 1.43, K=2 1.85 target-only rounds (the demo pair, AMD EPYC)
    measured = AdaptiveState(KPolicy()).costs
    for k in (0, 0, 0, 1, 2, 1, 2):
        measured.record(8, k, 0.0185 * (1.0 if k == 0 else 1.0 + 0.43 * k - 0.005 * (k - 1)))
    rows = learned([KController(KPolicy(), max_k=4) for _ in range(8)])
    # their own first positions at 0.55, the pool's too (the demo pair's first 16 positions: 0.55-0.6)
    for controller in rows:
        controller.estimate.counts = (11.0, 20.0)
        controller.estimate.prior = 0.55
    ks = {}
    for share in (1.0, 0.3):
        state = AdaptiveState(KPolicy(fixed_round_share=share))
        state.costs = measured
        assert state._shrink(8, 4, 4)[1] == pytest.approx([share + (1 - share) * b / 8 for b in range(1, 9)])
        ks[share] = state.choose(rows, 8, 8, 4, timed=False, remaining=[40] * 8)
    assert ks[1.0] == 0 and ks[0.3] > 0
    assert KPolicy().fixed_round_share == 1.0


def test_a_waited_group_drafts_at_break_even_until_its_rows_have_judged_what_the_prior_weighs():
    """Fresh rows carry the pool's estimate alike, and a group judged near break-even by it learns nothing while
    it does not draft: it drafts at break-even (no margin) until its rows' own rounds have judged as many positions
    as the prior weighs; then the margin holds again (for a group that did not draft: one that did keeps drafting
    at break-even, below). A steady load's rows keep the margin from the start."""
    state = measured_state(10.0)  # K=1 priced 1.52: the slowest of 4 fresh rows at 0.55 gives 1.02
    fresh = [KController(KPolicy(), max_k=4) for _ in range(4)]
    assert state.choose(fresh, 4, 4, 4, timed=False, remaining=[64] * 4) == 1
    assert 1.0 < state.decisions[4].expected_speedup < 1.05
    learned(fresh[:1])  # one row has learned, the others have judged nothing yet: still learning
    assert state.choose(fresh, 4, 4, 4, timed=False, remaining=[64] * 4) == 1
    assert state.choose(learned(fresh), 4, 4, 4, timed=False, remaining=[64] * 4) == 0
    # below break-even it does not draft, learning or not
    doubtful = [KController(KPolicy(), max_k=4, prior=0.5) for _ in range(4)]
    assert state.choose(doubtful, 4, 4, 4, timed=False, remaining=[64] * 4) == 0
    # a steady load at the same expectation (the rows' mean 0.55, K=1 1.55 / 1.52 = 1.02): the margin holds
    steady = [KController(KPolicy(), max_k=4, prior=0.55) for _ in range(4)]
    assert state.choose(steady, 4, 4, 4, timed=False) == 0


def test_target_only_priced_below_break_even_at_every_k_holds_for_a_few_rounds_of_the_same_rows():
    """Judging a group costs a fraction of a short target-only round: a choice of target-only where no K breaks
    even holds for hold_rounds rounds of the same rows, then they are judged again; other rows are judged at once,
    and a held round still re-measures when one is due (the same rounds as without the hold)."""
    state = measured_state(10.0)  # K=1 priced 1.52: rows at 0.3 or 0.5 pay at no K
    hold = AdaptiveState.hold_rounds
    assert hold > 1

    def choose(rows: list[KController], timed: bool = False) -> int:
        return state.choose(rows, 4, 4, 4, timed=timed, remaining=[64] * 4)

    def rows(acceptance: float, n: int = 4) -> list[KController]:
        return [KController(KPolicy(), max_k=4, prior=acceptance) for _ in range(n)]

    low = rows(0.3)
    assert choose(low) == 0
    for controller in low:  # now they would draft, judged again
        controller.estimate = estimate_for(KPolicy(), 0.95, None)
    assert [choose(low) for _ in range(hold - 1)] == [0] * (hold - 1)
    assert choose(low) > 0
    others = rows(0.3)
    assert choose(others) == 0
    assert choose(rows(0.95, 1) + low[1:]) > 0  # one row replaced: judged at once

    def remeasures(hold_rounds: int) -> list[int]:
        nonlocal state
        state = measured_state(10.0)
        state.hold_rounds = hold_rounds
        group = rows(0.5)  # the policy's ratios would draft: its re-measures come (explore_due)
        return [choose(group, timed=True) for _ in range(80)]

    held = remeasures(hold)
    assert any(held) and held == remeasures(1)


def test_a_waited_group_that_drafts_keeps_drafting_while_a_k_pays_at_all():
    """The margin turns a waited group's drafting on, not off: a group whose last choice drafted keeps drafting at
    break-even, since a group's first rounds judge its rows' first positions, which a draft matches less often
    than later ones. Off, or with a row that joined since (its own choice not yet made), the margin holds; below
    break-even nothing drafts; a steady load keeps the margin both ways. The choice sets it, not what a round ran:
    a unit round leaves a drafting group drafting."""
    state = measured_state(10.0)  # K=1 priced 1.52: the slowest of 4 rows at 0.55 gives 1.02

    def rows(drafting: list[bool], prior: float = 0.7) -> list[KController]:
        controllers = learned([KController(KPolicy(), max_k=4, prior=prior) for _ in drafting])
        for controller, flag in zip(controllers, drafting, strict=True):
            controller.drafting = flag
        return controllers

    def choose(controllers: list[KController], timed: bool = False, waited: bool = True) -> int:
        return state.choose(controllers, 4, 4, 4, timed=timed, remaining=[64] * 4 if waited else None)

    assert choose(rows([True] * 4)) == 1
    assert 1.0 < state.decisions[4].expected_speedup < 1.05
    assert choose(rows([False] * 4)) == 0
    assert choose(rows([True, True, False, True])) == 0
    assert choose(rows([True] * 4, prior=0.5)) == 0
    assert choose(rows([True] * 4, prior=0.55), waited=False) == 0
    # the group's choice sets each row's flag, a measuring round's K does not
    group = rows([True] * 4)
    state.costs.since_unit[4] = state.costs.refresh_every  # the unit's refresh is due
    assert choose(group, timed=True) == 0 and state.measuring
    assert all(c.drafting for c in group)
    assert choose(group) == 1
    off = rows([True] * 4, prior=0.5)
    assert choose(off) == 0 and not any(c.drafting for c in off)


def test_the_spread_between_requests_is_measured_less_the_noise_of_few_positions():
    spread = RowSpread(prior=0.15)
    assert spread.value == 0.15
    spread.record(2, RowSpread.minimum - 1)  # too few positions to say anything
    assert spread.value == 0.15
    for rate in [0.3, 0.7] * 20:  # a true spread of 0.2, each rate over 400 positions
        spread.record(rate * 400, 400)
    noise = (0.21 / 400) ** 0.5  # what binomial noise alone would spread: taken out
    assert 0.2 - noise < spread.value < 0.2
    alike = RowSpread(prior=0.15)
    for i in range(
        40
    ):  # requests alike at 0.5, each measured over 10 positions: 0.1 of spread is noise alone
        alike.record(4 + 2 * (i % 2), 10)
    assert alike.value < 0.03


def test_round_costs_per_k_in_target_only_rounds():
    policy = KPolicy(draft_cost_ratio=0.2, verify_cost_ratio=1.0)
    costs = RoundCosts(policy, decay=0.0, line_decay=0.0, prior_rounds=2)
    assert costs.costs(1, 8) is None  # nothing measured: the policy's ratios apply
    assert best_k(0.9, 8, policy) == best_k(0.9, 8, policy, linear_costs(0.2, 1.0, 8))
    for _ in range(3):  # batch 1: speculative rounds 12 ms + 1 ms per draft token
        costs.record(1, 4, 0.016)
    assert costs.costs(1, 8) is None  # one K only: no line yet
    costs.record(1, 2, 0.014)
    costs.record(1, 8, 0.020)
    # every round on the line 12 ms + 1 ms * K; no target-only round yet: the unit is a1 / verify_cost_ratio
    assert costs.costs(1, 8) == pytest.approx([1.0] + [(12 + k) / 12 for k in range(1, 9)])
    for _ in range(2):
        costs.record(1, 0, 0.010)  # target-only rounds: 10 ms, the unit from now on
    for _ in range(6):
        costs.record(1, 7, 0.015)  # K 7 runs faster than the line says (19 ms)
    per_k = costs.costs(1, 8)
    a1, b = costs.by_batch[1].line()  # the line refitted through K 7's rounds too
    # each K: its own rounds' total plus prior_rounds (2) rounds on the line, per round, in 10 ms units
    assert per_k[7] == pytest.approx((6 * 0.015 + 2 * (a1 + 7 * b)) / 8 / 0.010)
    assert per_k[4] == pytest.approx((3 * 0.016 + 2 * (a1 + 4 * b)) / 5 / 0.010)
    assert per_k[5] == pytest.approx((a1 + 5 * b) / 0.010) and per_k[0] == 1.0  # K 5 never ran: the line
    assert per_k[7] < (a1 + 7 * b) / 0.010 and per_k[7] < per_k[6]  # pulled toward what K 7 costs
    for k in (0, 0, 0, 1, 4):  # batches of 4-7 are another bucket: 20 ms target-only; 24 ms + 6 ms per token
        costs.record(5, k, 0.020 if k == 0 else 0.024 + 0.006 * k)
    assert costs.costs(5, 2) == pytest.approx([1.0, 1.5, 1.8])
    assert costs.costs(4, 2) == pytest.approx([1.0, 1.5, 1.8])  # batch 4 not measured: its bucket's
    assert costs.costs(16, 8) is None  # not measured
    # batch 7's own rounds count once they fit a line and include unit_rounds (3) target-only ones: 40 ms; 48 ms
    # + 24 ms per token
    for k in (1, 4, 0, 0):
        costs.record(7, k, 0.040 if k == 0 else 0.048 + 0.024 * k)
    # Until then the bucket's: a0 as its speculative rounds' time had it, (3 x 20 + 40) / 4 = 25 ms (the second
    # 40 ms round comes after drafting stopped); the line through (1, 30) (4, 48) (1, 72) (4, 144) ms is
    # 36 + 15 K; K 1's rounds (30 + 72) / 2 pulled by 2 rounds of the line's 51: 51; K 2: 66
    bucket = pytest.approx([1.0, 51 / 25, 66 / 25])
    assert costs.costs(7, 2) == bucket and costs.costs(6, 2) == bucket
    costs.record(7, 0, 0.040)
    assert costs.costs(7, 2) == pytest.approx([1.0, 1.8, 2.4])  # its own
    assert costs.costs(5, 2) == pytest.approx([1.0, 1.5, 1.8])  # batch 5 keeps its own
    # batch 6: target-only rounds and a single K, so no line of its own; its line through the unit (30 ms + 10 ms
    # per K) prices it before the bucket's line does (that line is other batch sizes' rounds)
    for k in (0, 0, 0, 2):
        costs.record(6, k, 0.030 if k == 0 else 0.050)
    assert costs.costs(6, 2) == pytest.approx([1.0, 40 / 30, 50 / 30]) != costs.costs(4, 2)
    noisy = RoundCosts(policy, decay=0.0, line_decay=0.0)
    noisy.record(2, 1, 0.02)
    noisy.record(2, 4, 0.01)  # more draft tokens, less time: noise, not a cost
    assert noisy.costs(2, 8) is None
    # A batch size never seen before (the load jumped to 16): its first round measured the unit (10 ms), its
    # next ones ran K 3 only (40 ms: a compute-bound verification of 4 tokens per row): no line, but the line
    # through the unit, 10 ms + 10 ms per K, prices every K
    jump = RoundCosts(policy, decay=0.0, line_decay=0.0, prior_rounds=2)
    for k in (0, 3, 3):
        jump.record(16, k, 0.010 if k == 0 else 0.040)
    assert jump.costs(16, 4) == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])
    assert best_k(0.7, 4, policy, jump.costs(16, 4)) == 0  # nothing pays at that price: target-only
    assert best_k(0.7, 4, policy) > 0  # where the policy's ratios alone would have drafted
    # The unit measured on slow rounds (the machine was busy), K 1 and 3 on quick ones: no K costs less than a
    # target-only round
    slow_unit = RoundCosts(policy, decay=0.0, line_decay=0.0, prior_rounds=2)
    for k, ms in ((0, 12), (0, 12), (0, 12), (1, 10), (3, 18), (1, 10), (3, 18)):  # line 6 ms + 4 ms per K
        slow_unit.record(3, k, ms / 1000)
    assert slow_unit.costs(3, 3) == pytest.approx([1.0, 1.0, 14 / 12, 18 / 12])


def test_a_rounds_cost_is_its_whole_cycle_and_mixed_or_idle_rounds_are_left_out():
    """A round is charged from its start to the next round's start (its forwards, the bookkeeping and what the
    caller did with its events, such as a server building and sending responses), not its forwards alone."""
    clock = iter([1.0, 1.5, 2.0, 2.1, 3.0])
    costs = RoundCosts(KPolicy(), decay=0.0, line_decay=0.0, clock=lambda: next(clock))
    costs.begin_round()  # nothing before it
    costs.start(1, 0)  # 1.0
    costs.begin_round()  # 1.5: the K 0 round took 0.5 s
    costs.begin_round()  # the round before was not timed (a prefill): nothing
    costs.start(1, 2)  # 2.0
    costs.start(3, 1)  # 2.1: a second batch in the same round: left out
    costs.begin_round()
    costs.start(1, 1)  # 3.0
    costs.idle()  # the loop ran out of work: the wait for the next request is no round's
    costs.begin_round()
    assert list(costs.by_batch) == [1] and costs.by_batch[1].by_k == {0: [1.0, 0.5]}


def test_stats_count_rounds_by_k_and_merge_them():
    a, b = AcceptanceStats(max_draft_len=4), AcceptanceStats(max_draft_len=4)
    for k, n in ((4, 4), (2, 1), (0, 0)):
        a.record_round(k, n)
    b.record_round(6, 0)
    assert a.num_draft_histogram == [1, 0, 1, 0, 1] and a.mean_num_draft_tokens == 2.0
    merged = a.merge(b)
    assert merged.num_draft_histogram == [1, 0, 1, 0, 1, 0, 1] and merged.mean_num_draft_tokens == 3.0
    assert a.to_dict()["mean_num_draft_tokens"] == 2.0 and "accepted_length_histogram" in a.to_dict()


def _free_drafts(engine: SpeculativeEngine) -> SpeculativeEngine:
    """The engine with a clock that charges every round the same: drafting costs nothing (a tiny target used as
    its own draft costs as much as the target per draft step, which no K repays)."""
    ticks = itertools.count()
    engine.adaptive = AdaptiveState(engine.k_policy, clock=lambda: float(next(ticks)))
    return engine


def _policy_ratios(engine: SpeculativeEngine) -> SpeculativeEngine:
    """The engine pricing K by its policy's ratios alone: what it drafts then follows the acceptance, not the
    timings of a machine that may be busy."""
    engine.adaptive = AdaptiveState(engine.k_policy, measure=False)
    return engine


def test_adaptive_default_is_exact_climbs_with_a_perfect_draft_and_drops_a_random_one(tiny_pair):
    target, draft = tiny_pair
    params = SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)  # no num_draft_tokens: adaptive
    same = _free_drafts(SpeculativeEngine.from_pretrained(target, target, max_draft_len=4))
    (perfect,) = same.generate([PROMPTS[0]], params)
    hist = perfect.stats.num_draft_histogram
    assert hist[4] >= 3 and perfect.stats.acceptance_rate == 1.0  # from the prior's K 2 up to max_draft_len
    poor = _policy_ratios(SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4))
    (result,) = poor.generate([PROMPTS[0]], params.with_(max_new_tokens=64))
    assert result.token_ids == hf_greedy(target, PROMPTS[0], 64)
    assert result.stats.num_draft_histogram[0] > 30  # switched off after a few rejections
    assert result.stats.drafted < 24  # its first rounds, then 1-token probes
    pinned = poor.generate([PROMPTS[0]], params.with_(num_draft_tokens=4))[0].stats
    # K 4 whatever the acceptance, but never past max_new_tokens (24 tokens, one per round: the last 4 rounds).
    assert pinned.num_draft_histogram == [1, 1, 1, 1, 20]


def test_rounds_whose_drafts_all_came_from_lookup_are_not_counted_as_k_0(tiny_pair):
    """trtspec_adaptive_rounds_total{k} counts the draft model's K: a round that verified looked-up tokens is no
    target-only round, so it is not counted there."""
    target, draft = tiny_pair
    engine = _policy_ratios(SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4))
    prompt = [5, 6, 7, 8, 9] * 8  # lookup finds the prompt's own n-grams, and the tiny target's loops
    params = SamplingParams(max_new_tokens=48, ignore_eos=True, proposer="draft+ngram")
    (result,) = engine.generate([prompt], params)
    looked_up = result.stats.by_proposer.get("ngram", [0])[0]
    assert looked_up > 0, result.stats.by_proposer
    # one row: every round the loop ran is one target forward, counted by K unless lookup gave its drafts
    assert sum(engine.adaptive.rounds_by_k.values()) == result.stats.target_forwards - looked_up


def test_the_engine_schedule_turns_drafting_off_under_load_and_output_stays_exact(tiny_pair):
    target = tiny_pair[0]
    engine = SpeculativeEngine.from_pretrained(
        target, target, max_draft_len=4, k_policy=KPolicy(schedule={1: 4, 2: 0})
    )
    params = SamplingParams(max_new_tokens=MAX_NEW)
    results = engine.generate(PROMPTS[:2], params)
    for prompt, result in zip(PROMPTS[:2], results, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, MAX_NEW)
        assert result.stats.drafted == 0  # two in flight: the schedule says off
    (alone,) = engine.generate(PROMPTS[:1], params)
    assert alone.stats.drafted > 0


def demo_with(**speculative) -> dict:
    return {"name": "x", "target": {"model": "demo:target"}, "draft": {"model": "demo:draft"}} | {
        "speculative": {"max_draft_len": 8} | speculative
    }


def test_the_recipe_schedule_is_validated_with_errors_naming_the_field():
    recipe = recipe_from_dict(demo_with(schedule={1: 8, 4: 4, 8: 2, 16: 0}, draft_cost_ratio=0.2))
    assert policy_for(recipe.speculative) == KPolicy(draft_cost_ratio=0.2, schedule={1: 8, 4: 4, 8: 2, 16: 0})
    assert recipe_from_dict(demo_with()).speculative.schedule is None
    bad = {
        "K in 0..max_draft_len 8": {1: 9},
        "in-flight counts must be >= 1": {0: 2},
        "must not grow with the in-flight count": {1: 2, 4: 4},
    }
    for message, schedule in bad.items():
        with pytest.raises(RecipeError, match=f"speculative: schedule .*{message}"):
            recipe_from_dict(demo_with(schedule=schedule))
    with pytest.raises(RecipeError, match=r"speculative.schedule.*\(got"):
        recipe_from_dict(demo_with(schedule={1: "4"}))  # strict: no coercion
    with pytest.raises(RecipeError, match="speculative.draft_cost_ratio"):
        recipe_from_dict(demo_with(draft_cost_ratio=0))


def test_the_torch_repository_passes_adaptive_k_to_its_entry_model():
    schedule = {1: 8, 4: 4, 16: 0}
    values = in_process_values(recipe_from_dict(demo_with(schedule=schedule)))
    assert values["num_draft_tokens"] == names.ADAPTIVE and values["k_schedule"] == "1:8,4:4,16:0"
    assert names.parse_schedule(values["k_schedule"]) == schedule and names.parse_schedule("") is None
    pinned = in_process_values(recipe_from_dict(demo_with(num_draft_tokens=3)))
    assert pinned["num_draft_tokens"] == 3
    limits = Limits(max_draft_len=8, num_draft_tokens=None, max_seq_len=64)
    assert parse_request({"text_input": ["hi"], "max_tokens": [4]}, limits).params.num_draft_tokens is None
    pinned_request = {"text_input": ["hi"], "max_tokens": [4], "num_draft_tokens": [2]}
    assert parse_request(pinned_request, limits).params.num_draft_tokens == 2


def test_a_loop_whose_requests_all_draft_measures_target_only_rounds_now_and_then():
    """The unit of the round costs (a target-only round) is measured, not assumed: a batch size's first timed
    round, then every unit_every-th speculative round until unit_rounds of them are measured, then every
    refresh_every."""
    costs = RoundCosts(KPolicy(), decay=0.0, line_decay=0.0)
    every = RoundCosts.unit_every
    assert costs.unit_due(4, 3) and costs.unit_due(5, 3)  # each batch size's first round
    due = [costs.unit_due(4, 3) for _ in range(3 * every)]
    assert [i for i, d in enumerate(due) if d] == [every - 1, 2 * every - 1, 3 * every - 1]
    assert not costs.unit_due(4, 0)  # a round that drafts nothing measures the unit anyway
    for _ in range(every - 1):  # batch 4 one round short of due: batch 5 (same bucket) counts its own rounds
        costs.unit_due(4, 3)
    assert [costs.unit_due(5, 3) for _ in range(every)].index(True) == every - 1
    assert costs.unit_due(4, 3)
    for _ in range(RoundCosts.unit_rounds):  # batch 5's target-only rounds do not end batch 4's search
        costs.record(5, 0, 0.010)
    assert [costs.unit_due(4, 3) for _ in range(every)][-1]
    assert not any(costs.unit_due(5, 3) for _ in range(every))
    # the default decay: unit_rounds target-only rounds recorded, whatever their decayed weight, end the search
    costs = RoundCosts(KPolicy())
    for _ in range(RoundCosts.unit_rounds - 1):
        costs.record(4, 0, 0.010)
    assert [costs.unit_due(4, 3) for _ in range(every)][-1]
    costs.record(4, 0, 0.010)
    due = [costs.unit_due(4, 3) for _ in range(RoundCosts.refresh_every)]
    assert due.count(True) == 1 and due[-1]
    # the engine's state: the chosen K, or 0 on such a round, where the round is timed (one batch, all adaptive)
    state = AdaptiveState(KPolicy())
    controller = KController(KPolicy(), max_k=8, prior=0.9)
    ks = [state.choose([controller], 1, 1, 8) for _ in range(every + 1)]
    assert ks[0] == ks[-1] == 0 and ks[1:-1] == [ks[1]] * (every - 1) and ks[1] > 0
    untimed = [state.choose([controller], 1, 2, 8, timed=False) for _ in range(2 * every)]
    assert 0 not in untimed


class PricedRounds:
    """A Rounds whose round costs what a CPU pair costs (a fake clock): at batch 1-2 a draft step adds 15% of a
    target step; at 8 and more rows the verification is compute-bound, so K draft tokens cost K more target
    steps. Every row accepts its first 3 draft tokens (of any K) and the target adds one."""

    num_slots, vocab_size, max_draft_len, has_draft, max_top_k, device = 16, 0, 4, True, 0, "cpu"

    def __init__(self):
        self.now, self.log = 0.0, []  # log: (batch, K) of every round

    def cost(self, batch: int, k: int) -> float:
        unit = 0.010 if batch <= 2 else 0.020
        return unit * (1 + (0.15 if batch <= 2 else 1.0) * k)

    def run(self, rows, num_draft, params, generator):
        from trtspec.engines.rounds import Outcome

        k = max(num_draft)
        self.now += self.cost(len(rows), k)
        self.log.append((len(rows), k))
        outcomes = []
        for row, n in zip(rows, num_draft, strict=True):
            accepted = self.accepted(row, n)
            row.tokens += [7] * (accepted + 1)
            outcomes.append(Outcome([7] * (accepted + 1), n, accepted))
        return outcomes

    def accepted(self, row, num_draft: int) -> int:
        return min(num_draft, 3)

    def release(self, slot: int) -> None:
        pass

    def move(self, row, slot: int) -> None:
        pass  # no state per slot

    def draft_behind(self, row) -> int:
        return 0  # its round costs are injected: no draft cache to catch up


class UnevenRounds(PricedRounds):
    """PricedRounds whose rows accept by their prompt: a prompt that starts with 9 has every draft token rejected,
    any other has every one accepted. A round costs 10 ms, and 30% more per draft token (a CPU pair at a batch of
    a few rows)."""

    num_slots = 4

    def cost(self, batch: int, k: int) -> float:
        return 0.010 * (1 + 0.3 * k)

    def accepted(self, row, num_draft: int) -> int:
        return 0 if row.tokens[0] == 9 else num_draft


class BreakEvenRounds(PricedRounds):
    """PricedRounds for two rows that end near break-even: K draft tokens cost 1 + 0.6 K target-only rounds, and
    each row accepts every draft token in its first 20 rounds, then its draft token in 2 of every 3 rounds, from
    ``phase`` in that cycle (a K=1 round then gives 1.67 tokens for 1.6 rounds' time: 1.04x target-only, which
    the slower row, lowered by the spread between requests, prices between break-even and the margin)."""

    num_slots = 2
    early, cycle = 20, (1, 1, 0)

    def __init__(self, phase: int = 0):
        super().__init__()
        self.phase, self.rounds_of = phase, {}

    def cost(self, batch: int, k: int) -> float:
        return 0.010 * (1 + 0.60 * k)

    def accepted(self, row, num_draft: int) -> int:
        n = self.rounds_of.get(row.slot, 0)  # the rows never move: both end in one round
        self.rounds_of[row.slot] = n + 1
        if n < self.early:
            return num_draft
        return min(num_draft, self.cycle[(n + self.phase) % len(self.cycle)])


@pytest.mark.parametrize("phase", range(len(BreakEvenRounds.cycle)))
def test_a_waited_group_near_break_even_keeps_drafting_through_a_real_loop_and_ends_sooner(phase):
    """The keep-drafting rule (AdaptiveState.choose) where it acts: a call's two rows draft from the start, then
    accept less, and judged by the slower one (lowered by the spread between requests) price K=1 between break-even
    and the margin. The group keeps drafting in such rounds, and the call ends sooner than with the margin both
    ways (each row's flag cleared before every round), where it stops as the estimates fall and stays off but for
    probes; a steady load, whose rows keep the margin both ways, stops too. Every phase of the acceptance cycle:
    where its probes and estimates land must not decide it."""
    from trtspec.engines.loop import GenerationLoop

    def call(rule: bool = True, close: bool = True) -> tuple[float, float, int]:
        rounds, policy = BreakEvenRounds(phase), KPolicy()
        state = AdaptiveState(policy, clock=lambda: rounds.now)
        loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
        for i in range(2):
            loop.add(i, [1, 2, 3], SamplingParams(max_new_tokens=300))
        if close:
            loop.close()
        under_margin = 0  # rounds the group chose to draft at an expected speedup under 1 + min_gain
        while loop.busy:
            if not rule:
                for request in loop.active:
                    request.controller.drafting = False
            drafted = any(event.num_draft for event in loop.step())
            decision = state.decisions.get(2)
            under_margin += drafted and decision.k > 0 and decision.expected_speedup < 1 + policy.min_gain
        ks = [k for _, k in rounds.log[1:]]  # the prefill round left out
        late = ks[len(ks) // 2 :]
        return sum(k > 0 for k in late) / len(late), rounds.now, under_margin

    kept, kept_time, under_margin = call()
    assert kept > 0.9 and under_margin > 20
    dropped, dropped_time, _ = call(rule=False)
    assert dropped < 0.3 and kept_time < 0.98 * dropped_time  # 4% sooner
    assert call(close=False)[0] < 0.5


def test_a_batch_the_caller_waits_for_drafts_only_where_that_shortens_the_slowest_row():
    """Two rows started together with one budget, one whose drafts are all accepted and one whose are all rejected:
    the mean acceptance says drafting pays, but the call ends with the rejecting row, which gains nothing from it.
    A loop told that its caller waits for every row (close) drafts in few rounds (those where the rejecting row's
    estimate, held up by the pooled prior its accepting neighbour sets, nears break-even) and ends sooner than one
    that is not, which drafts in most rounds."""
    from trtspec.engines.loop import GenerationLoop

    def makespan(close: bool, k: int | None = None) -> tuple[float, list[int]]:
        rounds, policy = UnevenRounds(), KPolicy()
        state = AdaptiveState(policy, clock=lambda: rounds.now)
        loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
        for prompt in ([1, 2, 3], [9, 2, 3]):
            loop.add(prompt[0], prompt, SamplingParams(max_new_tokens=300, num_draft_tokens=k))
        if close:
            loop.close()
        while loop.busy:
            loop.step()
        return rounds.now, [k for _, k in rounds.log]

    target_only, _ = makespan(close=True, k=0)
    waited, log = makespan(close=True)
    steady, steady_log = makespan(close=False)
    assert len(log) == len(steady_log) == 300  # the rejecting row gains one token a round either way
    assert sum(k > 0 for k in steady_log) > 0.5 * len(steady_log)
    assert steady > 1.15 * target_only
    assert sum(k > 0 for k in log) < 0.35 * len(log)
    assert waited < 0.95 * steady


class SwitchingRounds(UnevenRounds):
    """UnevenRounds whose rows reject every draft token while ``rejecting`` is set, and accept every one after."""

    rejecting = True

    def run(self, rows, num_draft, params, generator):
        for row in rows:
            row.tokens[0] = 9 if self.rejecting else 1
        return super().run(rows, num_draft, params, generator)


def test_calls_whose_caller_waits_for_every_row_draft_again_once_the_draft_is_accepted_again():
    """An engine's adaptive state outlives its calls. After calls whose drafts were all rejected switched drafting
    off, calls whose drafts are all accepted draft again: in the first, the row that ends the call probes now and
    then (one row, once in probe_every rounds) and the pool follows its probes; the next drafts from its start."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = SwitchingRounds(), KPolicy()
    state = AdaptiveState(policy, clock=lambda: rounds.now)

    def call() -> list[int]:
        start = len(rounds.log)
        loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
        for i in range(2):
            loop.add(i, [1, 2, 3], SamplingParams(max_new_tokens=200))
        loop.close()
        while loop.busy:
            loop.step()
        return [k for _, k in rounds.log[start + 1 :]]

    for _ in range(2):
        call()
    off = call()
    assert sum(k > 0 for k in off) <= len(off) // policy.probe_every + 2  # the probes, a re-measure or two
    rounds.rejecting = False
    probed = call()
    assert sum(k > 0 for k in probed) > 0 and len(probed) < 199  # probes, then drafting late in the call
    assert state.pool.value > 0.5  # from 0.2: the probes were accepted
    again = call()
    assert len(again) < 60 and sum(k > 0 for k in again) > 0.9 * len(again)


def test_a_group_the_caller_waits_for_probes_once_in_probe_every_rounds_per_pair_of_rows():
    """A probe widens every row's verification and tells about one row: a group of 8 whose drafts are all
    rejected probes once in 4 x probe_every rounds. (A pair probes once in 2 x probe_every: the prober is the
    row least behind, the one that probed last, and it is due again probe_every rounds after its probe.)"""
    from trtspec.engines.loop import GenerationLoop

    def probes(rows: int) -> int:
        rounds, policy = UnevenRounds(), KPolicy(prior=0.05)
        rounds.num_slots = rows
        loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=AdaptiveState(policy))
        for i in range(rows):
            loop.add(i, [9, 2, i], SamplingParams(max_new_tokens=400))
        loop.close()
        count = 0
        while loop.busy:
            count += sum(e.num_draft > 0 for e in loop.step()) == 1
        return count

    every = KPolicy().probe_every
    assert 400 // (2 * every) - 1 <= probes(2) <= 400 // (2 * every) + 1
    assert 400 // (4 * every) - 1 <= probes(8) <= 400 // (4 * every) + 1


def test_a_closed_loop_judges_by_the_row_that_ends_it_only_once_nothing_is_queued():
    from trtspec.engines.loop import GenerationLoop

    rounds = UnevenRounds()
    loop = GenerationLoop(rounds, max_seq_len=100_000)
    for i in range(6):  # 4 slots: 2 queued
        loop.add(i, [1, 2, 3], SamplingParams(max_new_tokens=8))
    loop.step()
    assert loop._waited(loop.active) is None  # open
    loop.close()
    assert loop._waited(loop.active) is None  # closed, 2 still queued
    while loop.queued:
        loop.step()
    assert loop._waited(loop.active) == [8 - len(r.generated) for r in loop.active]


def test_drains_tell_groups_a_client_waits_for_from_requests_that_join_running_rows():
    drains = Drains()
    assert not drains.waited
    for drained in range(1, Drains.window + 1):  # a group ends, the loop runs empty, the next group joins
        drains.finished(queued=False)
        drains.finished(queued=False)
        drains.joined(running=0)
        assert drains.waited == (drained == Drains.window)
    # Joining without a drain before it (a first group, a second admission) is no drain.
    drains.joined(running=0)
    assert drains.waited
    drains.finished(queued=False)
    drains.joined(running=3)  # a request joined rows still running: independent clients
    assert not drains.waited
    for _ in range(Drains.window):
        drains.finished(queued=False)
        drains.joined(running=0)
    assert drains.waited
    drains.finished(queued=True)  # a queue refills the slot at once: no drain, nothing learned
    drains.joined(running=3)
    assert drains.waited
    drains.joined(running=3, under_way=True)  # no drain, but the rows it joins are past their first rounds
    assert not drains.waited


def test_an_open_loop_whose_groups_drain_to_empty_judges_by_the_row_that_ends_them_and_stops_when_requests_join():
    """A server's loop is never closed: it judges its batches as a closed loop does once its last two groups ran
    down to empty before the next joined (adaptive.Drains), and by the mean again once a request joins rows that
    are still running."""
    from trtspec.engines.loop import GenerationLoop

    loop = GenerationLoop(UnevenRounds(), max_seq_len=100_000)
    next_id = itertools.count()

    def group(rows: int, budget: int = 8) -> None:
        for _ in range(rows):
            loop.add(next(next_id), [1, 2, 3], SamplingParams(max_new_tokens=budget))

    for _ in range(Drains.window):
        group(3)
        loop.step()
        assert loop._waited(loop.active) is None  # every group before has been refilled or none drained yet
        while loop.busy:
            loop.step()
    group(3)
    loop.step()
    assert loop._waited(loop.active) == [8 - len(r.generated) for r in loop.active]
    assert loop.adaptive.decisions[3].waited
    # A late member of the group, queued: judged by the mean while a request waits, then it joins rows in their
    # first round (no drain, nothing under way: nothing learned).
    group(1, budget=4000)
    assert loop._waited(loop.active) is None
    loop.step()
    while len(loop.active) == 4:
        loop.step()
    assert list(loop.drains.recent) == [True] * Drains.window
    group(1)  # joins while the long row runs: independent clients
    loop.step()
    assert loop.drains.recent[-1] is False
    assert loop._waited(loop.active) is None
    assert not loop.adaptive.decisions[2].waited


def test_an_open_loop_judges_by_the_mean_again_when_requests_join_rows_under_way_or_a_step_failed():
    """After lockstep groups, independent clients that come one by one after an idle spell join rows past their
    first rounds without any drain between: the mean again. A failed step forgets how the batches drained."""
    from trtspec.engines.loop import GenerationLoop

    loop = GenerationLoop(UnevenRounds(), max_seq_len=100_000)
    next_id = itertools.count()

    def drained_groups() -> None:
        for _ in range(Drains.window + 1):
            for _ in range(3):
                loop.add(next(next_id), [1, 2, 3], SamplingParams(max_new_tokens=8))
            while loop.busy:
                loop.step()
        assert loop.drains.waited

    drained_groups()
    loop.add(next(next_id), [1, 2, 3], SamplingParams(max_new_tokens=4000))
    loop.step()
    loop.step()
    loop.add(next(next_id), [1, 2, 3], SamplingParams(max_new_tokens=4000))
    loop.step()
    assert not loop.drains.waited
    assert loop._waited(loop.active) is None and not loop.adaptive.decisions[2].waited
    loop.fail_all("a step failed")
    drained_groups()
    loop.fail_all("a step failed")
    assert not loop.drains.waited


def test_served_adaptive_k_falls_back_to_target_only_where_it_is_cheaper_and_speculates_again_when_load_drops():
    """Adaptive K over measured round costs alone (no static points, as a server whose requests leave K to it):
    speculating at 1 in flight, target-only within a few rounds of a jump to 16 (where a draft token costs a whole
    target step), speculating again when the load drops back to 1."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = PricedRounds(), KPolicy()
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)

    def serve(n: int, new_tokens: int) -> list[tuple[int, int]]:
        start = len(rounds.log)
        for i in range(n):
            loop.add((n, i, start), [1, 2, 3], SamplingParams(max_new_tokens=new_tokens))
        while loop.busy:
            loop.step()
        return [(b, k) for b, k in rounds.log[start:] if b == n][1:]  # the prefill round left out

    def drafting(log) -> float:
        return sum(k > 0 for _, k in log) / len(log)

    alone = serve(1, 400)
    assert drafting(alone) > 0.9 and max(k for _, k in alone) >= 3
    crowd = serve(16, 200)
    assert sum(k > 0 for _, k in crowd[:6]) <= 2  # the unit round, at most one speculative one, then off
    assert drafting(crowd[6:]) < 0.1  # probes, and re-measures of the costs that switched it off
    costs = state.costs.costs(16, 4)
    assert costs[1] == pytest.approx(2.0, rel=0.05)  # what a draft token costs at 16 rows: one target step
    again = serve(1, 400)
    assert drafting(again) > 0.9


class SlowSpellRounds(PricedRounds):
    """PricedRounds whose first ``slow`` speculative rounds ran in a slow spell of the CPU, at 3x their cost."""

    def __init__(self, slow: int):
        super().__init__()
        self.slow = slow

    def cost(self, batch: int, k: int) -> float:
        if k and self.slow:
            self.slow -= 1
            return 3 * super().cost(batch, k)
        return super().cost(batch, k)


def serve_alone(loop, rounds, new_tokens: int) -> list[int]:
    """One request of ``new_tokens`` through ``loop``: the K of each of its rounds after the prefill."""
    start = len(rounds.log)
    loop.add("alone", [1, 2, 3], SamplingParams(max_new_tokens=new_tokens))
    while loop.busy:
        loop.step()
    return [k for _, k in rounds.log[start + 1 :]]


def test_a_ks_price_holds_through_a_stretch_of_target_only_rounds_after_drafting_stopped():
    """A K is priced against the unit of its own time: the target-only rounds timed among the speculative ones
    move it, a stretch of them after drafting stopped (nothing speculative timed, the machine's speed wandering)
    does not, so the price that switched drafting off is the one that switches it on again."""
    costs = RoundCosts(KPolicy(), decay=0.05, line_decay=0.0, prior_rounds=2)
    for k in (0, 0, 0, 1, 2, 0, 1, 2, 1, 2, 0):  # 10 ms target-only, 13 ms + 3 ms per draft token
        costs.record(2, k, 0.010 if k == 0 else 0.013 + 0.003 * k)
    before = costs.costs(2, 2)
    assert before == pytest.approx([1.0, 1.6, 1.9], rel=0.05)
    for _ in range(40):  # drafting off; the machine speeds up: target-only rounds take 8 ms
        costs.record(2, 0, 0.008)
    assert costs.costs(2, 2) == pytest.approx(before)
    assert costs.by_batch[2].unit() == pytest.approx(0.008, rel=0.15)  # the unit itself follows
    for k in [1, 2] * 40:  # drafting again at the new speed: its rounds, against the unit of their time
        costs.record(2, k, (0.013 + 0.003 * k) * 0.8)
    assert costs.costs(2, 2) == pytest.approx(before, rel=0.05)


def test_speculative_costs_measured_in_a_slow_spell_are_measured_again_and_drafting_resumes():
    """Slow speculative rounds (the CPU's slow spell, a server's first responses) switch drafting off at one stream,
    where it pays most. Only target-only rounds are timed after that, so the stale costs would hold for good; the
    re-measure (RoundCosts.explore_due) drafts again on the 16th round off, times K=1 at its true cost and keeps
    drafting, and slope probes re-measure the other K. Where target-only truly wins, re-measures back off: the wait doubles each time."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = SlowSpellRounds(slow=3), KPolicy()
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
    ks = serve_alone(loop, rounds, 400)
    # the first round is the unit; a slow speculative round switches drafting off
    off = ks.index(0, 2)
    assert all(k == 0 for k in ks[off : off + RoundCosts.explore_every - 1])
    resumed = ks[off + RoundCosts.explore_every :]
    assert rounds.slow == 0 and sum(k > 0 for k in resumed) / len(resumed) > 0.9
    assert state.costs.costs(1, 4)[1] == pytest.approx(1.15, rel=0.02)  # K=1 re-measured: 1 + 0.15
    # the slow spell also fitted the line (K 4, 3, 1): slope probes refit it, so K=4 is priced right again
    assert state.costs.costs(1, 4)[4] == pytest.approx(1.6, rel=0.02)

    # target-only is cheaper: a re-measure on the 16th, 32nd, 64th round off, each explore_rounds long
    every, length = RoundCosts.explore_every, RoundCosts.explore_rounds
    costs = RoundCosts(KPolicy())
    due = [costs.explore_due(16, 0, 4) for _ in range(7 * every + 3 * length)]
    starts = [i for i, d in enumerate(due) if d and (i == 0 or not due[i - 1])]
    # each wait counts from the round after the last re-measure round: every, then 2 * every, then 4 * every
    second = every - 1 + length + 2 * every - 1
    assert starts == [every - 1, second, second + length + 4 * every - 1]
    assert due.count(True) == 3 * length
    # nothing the policy would draft (low acceptance): nothing to measure, not even a re-measure under way
    costs = RoundCosts(KPolicy())
    assert [costs.explore_due(16, 0, 4) for _ in range(every)][-1]
    assert not costs.explore_due(16, 0, 0)
    costs.explore_due(16, 2, 0)  # drafting again resets the wait
    assert [costs.explore_due(16, 0, 4) for _ in range(every)].index(True) == every - 1
    # rows whose caller waits for them all: every wait is per pair of rows (each re-measure there makes every
    # row's draft take in all it skipped), doubling from explore_every per pair to refresh_every per pair
    for rows, pairs in ((2, 1), (3, 1), (16, 8)):
        costs = RoundCosts(KPolicy())
        due = [costs.explore_due(rows, 0, 4, patient=True) for _ in range(40 * RoundCosts.refresh_every)]
        starts = [i for i, d in enumerate(due) if d and not due[i - 1]]
        waits = [b - a - length + 1 for a, b in itertools.pairwise(starts)]  # rounds off between re-measures
        assert starts[0] == every * pairs - 1
        assert waits[:4] == [2 * every * pairs, 4 * every * pairs, 8 * every * pairs, 16 * every * pairs]
        assert waits[-1] == RoundCosts.refresh_every * pairs


def test_prices_asked_twice_in_a_round_are_the_same_and_follow_every_change_to_the_rounds():
    """RoundCosts.priced keeps its prices until the rounds change: a recorded round, or a re-measure aging the
    rounds timed before it (a K whose own rounds sit off the line then leans toward the line)."""
    costs = RoundCosts(KPolicy())
    for k, seconds in ((0, 0.010),) * 3 + ((1, 0.015), (3, 0.020), (2, 0.021)) * 4:
        costs.record(4, k, seconds)
    before = costs.costs(4, 3)
    assert costs.costs(4, 3) is before  # asked again in the same round: not priced again
    costs.record(4, 2, 0.021)
    recorded = costs.costs(4, 3)
    assert recorded[2] > before[2]  # one more round of K=2 above the line: priced higher
    bucket_priced = costs.costs(6, 3)  # batch 6 never ran: its bucket's (4-7), so far batch 4's rounds
    assert bucket_priced == recorded
    costs.record(1, 0, 0.004)  # a round in another bucket changes neither price
    assert costs.costs(4, 3) is recorded and costs.costs(6, 3) is bucket_priced
    costs.record(5, 2, 0.030)  # a round of batch 5 is in the bucket: batch 6's price follows it
    assert costs.costs(6, 3)[2] > bucket_priced[2]
    # K=0 chosen where the policy's ratios would draft: the re-measure that comes ages the rounds before it
    while not costs.explore_due(4, 0, 2):
        pass
    assert costs.costs(4, 3)[2] < recorded[2]  # its own rounds now weigh less against the line


def test_a_re_measure_prices_a_drafts_catch_up_by_the_policys_ratios():
    """The measured costs that switched drafting off would also refuse the catch-up a re-measure needs; the
    policy's ratios, which chose the re-measured K, decide it instead, so a long prompt at a large batch is still
    not taken in."""
    state = AdaptiveState(KPolicy(draft_cost_ratio=0.1))
    for k, seconds in ((0, 0.010), (0, 0.010), (0, 0.010), (1, 0.030), (3, 0.050), (1, 0.030), (3, 0.050)):
        state.costs.record(1, k, seconds)
        state.costs.record(16, k, seconds)
    state.costs.catch_up.per_token = 0.0005
    args = dict(max_k=4, k=2, acceptance=0.8, remaining=200, behind=20)
    assert not state.catch_up_pays(1, **args)  # K=2 measured at 4x a target-only round: never pays
    state.costs.exploring.add(1)
    assert state.catch_up_pays(1, **args)
    state.costs.exploring.add(16)
    assert not state.catch_up_pays(16, **{**args, "behind": 300})


def test_a_round_with_another_groups_prefill_is_not_charged_to_the_timed_batch():
    """A greedy request runs; a sampled one (another sampling group) joins and is prefilled in the same round: that
    round's time holds the prompt and a second batch, so it is recorded for no batch size; the rounds around it
    are."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = PricedRounds(), KPolicy()
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    recorded = []
    state.costs.record = lambda batch, k, seconds: recorded.append((batch, k, round(seconds, 6)))
    loop = GenerationLoop(rounds, max_seq_len=10_000, k_policy=policy, adaptive=state)
    loop.add("greedy", [1, 2, 3], SamplingParams(max_new_tokens=200))
    for _ in range(4):
        loop.step()
    before = len(recorded)
    loop.add("sampled", [4, 5], SamplingParams(max_new_tokens=200, temperature=0.8, seed=1))
    loop.step()  # the joining round: two batches, one of them a prefill (its start closes the round before)
    loop.step()  # two batches again
    loop.step()
    assert len(recorded) == before + 1  # the round before the joining one; none of the two-batch rounds
    assert all(seconds == pytest.approx(rounds.cost(b, k)) for b, k, seconds in recorded)
    loop.fail_all("stop")  # a failed round leaves nothing pending for the next loop on this state
    assert state.costs._pending is None


def test_a_row_off_long_enough_probes_alone_while_its_batch_stays_target_only(tiny_pair):
    """When no K pays, each row probes on its own every probe_every rounds: one row drafts a token while the
    others verify none (a whole batch probing at once would make every row's draft catch up on its prompt)."""
    policy = KPolicy(prior=0.0, prior_weight=1e6, probe_every=3)  # acceptance 0: drafting never pays
    engine = SpeculativeEngine.from_pretrained(*tiny_pair, max_draft_len=4, max_seq_len=128, k_policy=policy)
    loop = engine.new_loop()
    drafting_rows = []
    for i in range(3):  # joining one round apart, their counters of rounds off are staggered
        loop.add(i, [1, 7 + i, 8, 9], SamplingParams(max_new_tokens=24), eos_ids=())
        drafting_rows.append(sum(e.num_draft > 0 for e in loop.step()))
    while loop.busy:
        drafting_rows.append(sum(e.num_draft > 0 for e in loop.step()))
    assert drafting_rows.count(1) >= 6  # each row's own probes
    assert drafting_rows.count(3) == 0 and drafting_rows.count(2) == 0


@pytest.mark.parametrize(("per_k", "worth"), [(1.0, False), (0.1, True)])
def test_probes_only_where_some_k_could_pay_at_that_batch_size(per_k, worth):
    """At a batch size whose measured rounds cost 1 + per_k target rounds per draft token, a probe can change
    something only if drafting pays at a high acceptance; where it cannot, the probe would only cost."""
    state = AdaptiveState(KPolicy())
    for _ in range(4):
        state.costs.record(16, 0, 0.01)
    for k in (1, 2, 3, 4):
        for _ in range(3):
            state.costs.record(16, k, 0.01 * (1 + per_k * k))
    assert state.worth_probing(16, 4, in_flight=16) is worth
    assert state.worth_probing(2, 4, in_flight=2)  # nothing measured there: the policy's ratios, probe


def test_a_catch_up_pays_where_drafting_saves_more_than_the_draft_takes_in_and_not_otherwise():
    from trtspec.engines.adaptive import catch_up_pays

    costs = [1.0, 1.15, 1.3]  # target-only rounds of this batch size
    # one row, 64 tokens to go at 0.6 acceptance (1.96 tokens per K=2 round): saves 64 * 10 ms * (1 - 1.3 / 1.96)
    assert catch_up_pays(200, 64, 0.6, 2, costs, 0.010, 0.0005, 1)  # 0.216 s saved > 0.1 s of catch-up
    assert not catch_up_pays(200, 64, 0.6, 2, costs, 0.010, 0.0005, 16)  # a sixteenth of the rounds is its
    assert not catch_up_pays(200, 8, 0.6, 2, costs, 0.010, 0.0005, 1)  # 8 tokens left: 0.027 s < 0.1 s
    assert not catch_up_pays(2, 64, 0.1, 2, costs, 0.010, 0.0005, 1)  # drafting does not pay at all
    assert catch_up_pays(0, 1, 0.0, 2, costs, 0.010, 1.0, 16) and catch_up_pays(
        500, 1, 0.0, 0, costs, 0.01, 1.0, 1
    )


def test_a_timed_round_whose_drafts_catch_up_prices_the_catch_up_and_leaves_the_ks_costs_alone():
    now = [0.0]
    costs = RoundCosts(KPolicy(), clock=lambda: now[0])

    def round_(k: int, seconds: float, catch_up: int = 0) -> None:
        costs.begin_round()
        costs.start(4, k, catch_up)
        now[0] += seconds

    for k in (0, 0, 0, 1, 2, 1, 2, 1, 2):
        round_(k, 0.010 * (1 + 0.2 * k))
    costs.begin_round()
    before = costs.costs(4, 2)
    assert costs.catch_up.per_token is None  # unpriced: catch-ups go ahead until one is measured
    round_(2, 0.014 + 0.050, catch_up=100)  # K=2 costs 14 ms here; the other 50 ms took in 100 tokens
    costs.begin_round()
    assert costs.catch_up.per_token == pytest.approx(0.0005, rel=0.02)
    assert costs.costs(4, 2) == pytest.approx(before)


class CatchUpRounds(PricedRounds):
    """PricedRounds whose draft keeps a cache: a row that sat out rounds (or never drafted: its prompt) makes its
    draft take those tokens in before proposing, at ``per_token`` seconds each."""

    per_token = 0.0005

    def __init__(self):
        super().__init__()
        self.seen: dict[int, int] = {}
        self.caught_up = 0

    def run(self, rows, num_draft, params, generator):
        for row, n in zip(rows, num_draft, strict=True):
            if n:
                behind = self.draft_behind(row)
                self.caught_up += behind
                self.now += self.per_token * behind
        outcomes = super().run(rows, num_draft, params, generator)
        for row, n in zip(rows, num_draft, strict=True):
            if n:
                self.seen[row.slot] = len(row.tokens) - 1
        return outcomes

    def release(self, slot: int) -> None:
        self.seen.pop(slot, None)

    def move(self, row, slot: int) -> None:
        if row.slot in self.seen:
            self.seen[slot] = self.seen.pop(row.slot)

    def draft_behind(self, row) -> int:
        return len(row.tokens) - self.seen.get(row.slot, 0)


def test_rows_with_long_prompts_in_a_full_batch_do_not_catch_up_a_draft_that_barely_pays_there():
    """Where drafting saves little per row (16 rows), a row whose draft would first take in a 300-token prompt
    decodes target-only; one row alone with the same prompt catches up and drafts (it saves far more)."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = CatchUpRounds(), KPolicy()
    rounds.cost = lambda batch, k: (
        (0.010 if batch <= 2 else 0.020) * (1 + 0.15 * k)
    )  # drafting pays everywhere
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)

    def serve(n: int, prompt_len: int, new_tokens: int) -> list[tuple[int, int]]:
        start = len(rounds.log)
        for i in range(n):
            loop.add((n, i, start), list(range(1, prompt_len + 1)), SamplingParams(max_new_tokens=new_tokens))
        while loop.busy:
            loop.step()
        return rounds.log[start:]

    serve(16, 4, 200)  # short prompts: the costs of 16 rows are measured, and drafting pays there
    serve(1, 4, 200)
    assert state.costs.costs(16, 4) is not None and state.costs.costs(1, 4) is not None
    state.costs.catch_up.per_token = CatchUpRounds.per_token  # as a timed catch-up round would have measured
    rounds.caught_up = 0
    crowd = serve(16, 300, 32)
    assert rounds.caught_up == 0 and all(k == 0 for b, k in crowd if b == 16)
    alone = serve(1, 300, 200)
    assert rounds.caught_up >= 300 and sum(k > 0 for _, k in alone) > len(alone) // 2


def test_a_row_that_sat_out_a_round_or_two_drafts_on_whatever_a_catch_up_costs():
    """A few tokens more in the draft's first step cost what its fixed cost does: only a catch-up from
    CatchUp.minimum tokens is priced, so the unit rounds a batch sits out do not switch its rows off."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = CatchUpRounds(), KPolicy()
    rounds.cost = lambda batch, k: (0.010 if batch <= 2 else 0.020) * (1 + 0.15 * k)
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
    for warm in (True, False):
        if not warm:
            state.costs.catch_up.per_token = 1.0  # a second per token: no priced catch-up could ever pay
        start = len(rounds.log)
        for i in range(8):
            loop.add((warm, i), [1, 2, 3, 4], SamplingParams(max_new_tokens=200))
        while loop.busy:
            loop.step()
    ks = [k for b, k in rounds.log[start:] if b == 8]
    assert sum(k > 0 for k in ks) > 0.8 * len(ks)


def test_a_round_whose_drafts_take_in_rounds_they_sat_out_is_not_priced_as_its_k():
    """A draft that sat out rounds takes their tokens in before proposing: under CatchUp.minimum tokens that is
    priced as neither a catch-up nor the K's steady cost. Timed as the K's, ten rounds off made a K=1 round cost
    what several steady ones do, and the K stayed priced too dear to run again."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = CatchUpRounds(), KPolicy(probe_every=10**6)
    rounds.per_token = 0.002  # a steady K=1 round takes in one token per row: 14 + 4 x 2 ms at 4 rows
    rounds.cost = lambda batch, k: 0.010 * (1 + 0.4 * k)
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    script = itertools.chain(itertools.repeat(1, 6), itertools.repeat(0, 10), itertools.repeat(1))
    state.choose = lambda *args, **kwargs: next(script)  # the K of each round, whatever it would choose
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
    for i in range(4):
        loop.add(i, [1, 2, 3, 4], SamplingParams(max_new_tokens=64))
    while loop.busy:
        loop.step()
    assert (4, 1) in rounds.log[17:19]  # drafting again after ten rounds off
    n, seconds = state.costs.by_batch[4].by_k[1]
    assert seconds / n == pytest.approx(0.014 + 4 * 0.002)


class EngineCallBehind(PricedRounds):
    """PricedRounds whose draft is an engine called with the row's tokens each round, as EngineCallRounds: after
    a round it drafted in, it has not seen that round's accepted tokens and the target's one."""

    def __init__(self):
        super().__init__()
        self.seen: dict[int, int] = {}

    def run(self, rows, num_draft, params, generator):
        for row, n in zip(rows, num_draft, strict=True):
            if n:
                self.seen[row.slot] = len(row.tokens)
        return super().run(rows, num_draft, params, generator)

    def draft_behind(self, row) -> int:
        return len(row.tokens) - self.seen.get(row.slot, 0)


def test_steady_rounds_of_a_draft_engine_that_trails_by_a_round_are_timed():
    """A draft engine called with the row's tokens trails by the last round's tokens (4 after 3 accepted), a few
    more than the torch pair's 1-2: that is its steady state, not a catch-up of rounds sat out, so its rounds
    price its K."""
    from trtspec.engines.loop import GenerationLoop

    rounds, policy = EngineCallBehind(), KPolicy(probe_every=10**6)
    state = AdaptiveState(policy, clock=lambda: rounds.now)
    state.choose = lambda *args, **kwargs: 4
    timed = []
    record = state.costs.record
    state.costs.record = lambda batch, k, seconds: (timed.append((batch, k)), record(batch, k, seconds))
    loop = GenerationLoop(rounds, max_seq_len=100_000, k_policy=policy, adaptive=state)
    for i in range(4):
        loop.add(i, [1, 2, 3, 4], SamplingParams(max_new_tokens=41))
    while loop.busy:
        loop.step()
    drafting = sum(1 for batch, k in rounds.log if batch == 4 and k == 4)
    assert drafting >= 8 and timed == [(4, 4)] * (drafting - 1)  # all but the prefill round
    n, seconds = state.costs.by_batch[4].by_k[4]
    assert seconds / n == pytest.approx(PricedRounds().cost(4, 4))


def test_rounds_of_one_k_are_given_a_slope_and_the_loop_finds_the_best_k():
    """A speculative round costs 1.4 target-only rounds plus 0.2 per draft token; at acceptance 0.8 K=5 pays most
    (1.54x), K=3 4% less. Rounds of one K fit no line, and the line through the unit that prices them then puts
    the 0.4 beyond a target-only round into the slope: long K looks dear, so the loop drafts K=3 and, drafting it
    alone, never learns better. Slope probes (K +- 2 every slope_every rounds) give the line its slope."""
    policy, now = KPolicy(), [0.0]
    state = AdaptiveState(policy, clock=lambda: now[0])
    rows = [KController(policy, 8, prior=0.8)]
    ran = []
    for _ in range(400):
        state.begin_round()
        k = state.choose(rows, 1, 1, 8)
        state.timed(1, k, looked_up=False)
        now[0] += 0.010 * (1.4 + 0.2 * k if k else 1.0)
        ran.append(k)
    costs = state.costs.costs(1, 8)
    assert costs[3:7] == pytest.approx([2.0, 2.2, 2.4, 2.6], rel=0.01)
    last = ran[-120:]
    assert state.decisions[1].k in (4, 5) and last.count(state.decisions[1].k) > 0.75 * len(last)
    # the probes: K +- 2 in turn, one round in slope_every while the rounds lack a slope
    assert 0.05 < sum(k in (2, 3, 6, 7) for k in last) / len(last) < 1 / RoundCosts.slope_every + 0.05


def test_a_unit_measured_in_a_slow_spell_is_measured_again_when_a_k_costs_less():
    """The target-only unit is measured in a slow spell (3x): every K then measures below it and costs the floor
    of 1, so a draft accepted at 0.1 (K=1: 1.1 tokens per round) would look worth drafting until the unit's refresh
    256 rounds later. A K measured below the unit says the unit is wrong: it is measured again within unit_every
    rounds, and the bad draft stops."""
    policy, now = KPolicy(), [0.0]
    state = AdaptiveState(policy, clock=lambda: now[0])
    slow_units = [3]

    def run(rows, count):
        ran = []
        for _ in range(count):
            state.begin_round()
            k = state.choose(rows, 1, 1, 4)
            state.timed(1, k, looked_up=False)
            slow = not k and slow_units[0] > 0
            slow_units[0] -= slow
            now[0] += 0.010 * (3.0 if slow else 1.0 + 0.15 * k + (0.25 if k else 0.0))
            ran.append(k)
        return ran

    run([KController(policy, 4, prior=0.9)], 40)  # a good draft: three unit rounds, all slow
    assert slow_units[0] == 0
    bad = run([KController(policy, 4, prior=0.1)], 60)
    assert state.costs.costs(1, 4)[1] == pytest.approx(1.4, rel=0.02)  # the unit again 10 ms: K=1 1.25 + 0.15
    assert bad[-30:].count(0) >= 29


def test_a_dropped_unit_is_replaced_by_recorded_rounds_only():
    """The unit found wrong is dropped when its next round is recorded, not when that round is chosen: a unit
    round whose time is lost (the loop ran out of work after it) leaves the old unit, still flagged, and the next
    unit round comes within unit_every rounds. The new unit counts as measured after unit_rounds new rounds."""
    costs = RoundCosts(KPolicy(), decay=0.0, line_decay=0.0)
    for k, seconds in ((0, 0.03), (0, 0.03), (0, 0.03), (1, 0.012), (1, 0.012)):
        costs.record(1, k, seconds)
    # K=1 at 0.4 of the unit: a unit round within unit_every rounds, not refresh_every
    assert [costs.unit_due(1, 1) for _ in range(RoundCosts.unit_every)][-1]
    costs.idle()  # the unit round's time is lost
    table = costs.by_batch[1]
    assert table.by_k[0] == [3.0, pytest.approx(0.09)] and table.unit_dropped
    due = [costs.unit_due(1, 1) for _ in range(RoundCosts.unit_every)]
    assert due.index(True) == RoundCosts.unit_every - 1
    costs.record(1, 0, 0.010)
    assert table.by_k[0] == [1.0, 0.010] and table.units == 1 and costs.by_bucket[1].by_k[0] == [1.0, 0.010]
    assert costs.costs(1, 1) == pytest.approx([1.0, 1.2])  # priced by the new unit
    # a K within 0.9 of the unit is noise, not a wrong unit
    near = RoundCosts(KPolicy(), decay=0.0, line_decay=0.0)
    for k, seconds in ((0, 0.010), (0, 0.010), (0, 0.010), (1, 0.0095), (1, 0.0095)):
        near.record(1, k, seconds)
    assert not any(near.unit_due(1, 1) for _ in range(RoundCosts.unit_every * 4))


def test_slope_probes_step_by_slope_step_within_the_cap_or_not_at_all():
    costs = RoundCosts(KPolicy())
    costs.record(5, 0, 0.01)
    every = RoundCosts.slope_every
    probes = [costs.slope_probe(5, 3, 8, 1.3) for _ in range(4 * every)]
    assert [k for k in probes if k != 3] == [5, 1, 5, 1]
    assert {costs.slope_probe(5, 1, 8, 1.3) for _ in range(2 * every)} == {1, 3}  # no K=-1: up each time
    assert {costs.slope_probe(5, 1, 2, 1.3) for _ in range(2 * every)} == {1}  # K=2 would be a step of 1
    assert costs.slope_probe(5, 0, 8, 1.0) == 0


def test_a_k_that_barely_pays_is_not_slope_probed():
    """Where the chosen K gains under slope_gain (a full batch), a K two longer pays less still: its probe would
    cost what drafting gains, so none runs; where the K gains more, the probes run."""
    costs = RoundCosts(KPolicy())
    costs.record(8, 0, 0.01)
    barely = 1.0 + RoundCosts.slope_gain * 0.9
    assert {costs.slope_probe(8, 1, 8, barely) for _ in range(4 * RoundCosts.slope_every)} == {1}
    clearly = 1.0 + RoundCosts.slope_gain * 1.1
    assert {costs.slope_probe(8, 1, 8, clearly) for _ in range(4 * RoundCosts.slope_every)} == {1, 3}


def test_an_engine_call_closes_its_loop_once_its_last_prompt_joined(tiny_pair, monkeypatch):
    """The engine's caller waits for every prompt of a call: its loop is closed when the last one joins (at once
    for a batch; for a steady load, when the queue of prompts runs out), and the output stays exact."""
    from trtspec.engines.loop import GenerationLoop

    added, closed_after = [], []
    add, close = GenerationLoop.add, GenerationLoop.close
    monkeypatch.setattr(
        GenerationLoop, "add", lambda self, *a, **kw: (added.append(1), add(self, *a, **kw))[1]
    )
    monkeypatch.setattr(
        GenerationLoop, "close", lambda self: (closed_after.append(len(added)), close(self))[1]
    )
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    batch = engine.generate(PROMPTS[:2], params)
    assert closed_after == [2]
    steady = list(engine.generate_stream(PROMPTS[:3], params, in_flight=1))[-1].results
    assert closed_after == [2, 5]
    assert [r.token_ids for r in batch] == [hf_greedy(target, p, 8) for p in PROMPTS[:2]]
    assert steady[2].token_ids == hf_greedy(target, PROMPTS[2], 8)


def test_the_re_measure_wait_starts_anew_when_the_kind_of_group_changes():
    """A call's rows are an open group until its last prompt joins, then a waited one: the wait before a re-measure
    is the kind's own (16 rounds open, 16 per pair of rows waited, each doubling), never the other kind's carried
    over."""
    costs = RoundCosts(KPolicy())
    for _ in range(5):
        assert not costs.explore_due(8, 0, 2, patient=False)
    waited = [costs.explore_due(8, 0, 2, patient=True) for _ in range(200)]
    assert waited.index(True) + 1 == RoundCosts.explore_every * 4
    assert sum(1 for i, d in enumerate(waited) if d and (i == 0 or not waited[i - 1])) == 2
    costs = RoundCosts(KPolicy())
    for _ in range(5):
        costs.explore_due(8, 0, 2, patient=True)
    opened = [costs.explore_due(8, 0, 2, patient=False) for _ in range(40)]
    assert opened.index(True) + 1 == RoundCosts.explore_every


def test_two_rounds_in_a_row_of_a_k_below_the_unit_flag_it():
    costs = RoundCosts(KPolicy())
    for _ in range(3):
        costs.record(2, 0, 0.010)
    costs.record(2, 2, 0.004)
    assert not costs.by_batch[2].below_unit(2)
    costs.record(2, 2, 0.004)
    assert costs.by_batch[2].below_unit(2)


def test_a_re_measures_catch_up_is_not_priced_against_the_cost_it_measures_again():
    """The catch-up's price is a round's time beyond its K's measured cost; in a re-measure that cost is the one
    in doubt (set high by a slow spell, it would leave the catch-up nearly nothing)."""
    now = [0.0]
    costs = RoundCosts(KPolicy(), clock=lambda: now[0])
    for k, seconds in ((0, 0.010), (0, 0.010), (0, 0.010), (1, 0.030), (3, 0.050), (1, 0.030), (3, 0.050)):
        costs.record(1, k, seconds)
    costs.exploring.add(1)
    costs.start(1, 1, catch_up=100)
    now[0] += 0.061
    costs.begin_round()
    assert costs.catch_up.per_token is None
    costs.exploring.discard(1)
    costs.start(1, 1, catch_up=100)
    now[0] += 0.061
    costs.begin_round()
    assert costs.catch_up.per_token == pytest.approx(0.0003, rel=0.05)
