"""Prompt lookup (core/lookup.py) behind the Rounds seam: the proposal rule, exact greedy output for lookup alone and
combined with the draft (one batch mixing proposers), samples that follow the target's distribution when the
proposal is a point mass (and the test fails on a planted bug), and an engine-call round that verifies given
tokens without its draft engine."""

from __future__ import annotations

import pytest
import torch
from test_engine import hf_greedy
from test_engine_sampling import BUGS, follows, plant, target_joint

from trtspec.core.errors import RequestError
from trtspec.core.lookup import LookupSpec, lookup
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.engine_calls import Draft, EngineCallRounds
from trtspec.engines.rounds import Row
from trtspec.engines.sampling import SamplingParams

# A prompt that repeats itself: its tail "40 41 42" occurred before, so lookup proposes what followed it.
REPEATING = [1, 40, 41, 42, 43, 44, 45, 46, 7, 8, 40, 41, 42]


@pytest.mark.parametrize(
    "tokens, num, spec, expected",
    [
        ([1, 2, 3, 4, 5, 9, 1, 2, 3], 3, LookupSpec(), [4, 5, 9]),  # the longest suffix n-gram, 3
        ([1, 2, 3, 4, 5, 9, 1, 2, 3], 1, LookupSpec(), [4]),  # at most num tokens
        ([5, 1, 2, 6, 0, 1, 2, 7, 3, 1, 2], 2, LookupSpec(), [7, 3]),  # the latest occurrence wins
        ([9, 2, 3, 8, 1, 2, 3, 4, 0, 1, 2, 3], 2, LookupSpec(), [4, 0]),  # a longer match beats a later one
        ([1, 2, 3], 3, LookupSpec(), []),  # nothing repeats
        ([7, 7, 7, 7], 3, LookupSpec(), [7]),  # a run overlaps its own suffix; only what exists follows
        ([1, 2, 3, 4, 9, 4], 2, LookupSpec(2, 4), []),  # a 1-gram match is below prompt_lookup_min
        ([1, 2, 3, 4, 9, 4], 2, LookupSpec(1, 4), [9, 4]),
        ([1, 2, 3, 1, 2], 0, LookupSpec(), []),
    ],
)
def test_lookup_proposes_what_followed_the_longest_latest_suffix_match(tokens, num, spec, expected):
    assert lookup(tokens, num, spec) == expected


@pytest.mark.parametrize("proposer", ["ngram", "draft+ngram"])
def test_lookup_alone_and_combined_are_exact_under_greedy(tiny_pair, proposer):
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4, max_seq_len=128)
    params = SamplingParams(max_new_tokens=24, proposer=proposer)
    (result,) = engine.generate([REPEATING], params)
    assert result.token_ids == hf_greedy(target, REPEATING, 24)
    if (
        proposer == "ngram"
    ):  # lookup proposed, and the target judged it (combined: the draft may win every round)
        assert result.stats.by_proposer["ngram"][1] > 0
        assert set(result.stats.by_proposer) == {"ngram"}
        assert result.stats.draft_forwards == 0


def test_lookup_needs_no_draft_model_and_a_draft_proposer_then_is_refused(tiny_pair):
    target, _ = tiny_pair
    engine = SpeculativeEngine.from_pretrained(
        target, None, max_draft_len=4, max_seq_len=128, proposer="ngram"
    )
    (result,) = engine.generate([REPEATING], SamplingParams(max_new_tokens=24))
    assert result.token_ids == hf_greedy(target, REPEATING, 24)
    assert result.stats.by_proposer["ngram"][1] > 0
    with pytest.raises(RequestError, match="proposer 'draft\\+ngram' needs a draft model"):
        engine.generate([REPEATING], SamplingParams(max_new_tokens=4, proposer="draft+ngram"))


def test_a_request_may_ask_a_target_only_engine_for_prompt_lookup(tiny_pair):
    """An engine loaded without a draft and with the draft proposer (target-only by default) keeps its
    max_draft_len: a request naming prompt lookup looks up with its own K, or leaves K to the engine."""
    target, _ = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, None, max_draft_len=4, max_seq_len=128)
    (plain,) = engine.generate([REPEATING], SamplingParams(max_new_tokens=24))
    assert plain.stats.drafted == 0  # its own proposer has no draft: target-only
    (pinned,) = engine.generate(
        [REPEATING], SamplingParams(max_new_tokens=24, proposer="ngram", num_draft_tokens=2)
    )
    assert pinned.token_ids == plain.token_ids and pinned.stats.by_proposer["ngram"][1] > 0
    # adaptive: taken (whether lookup pays is the engine's measured choice)
    (adaptive,) = engine.generate([REPEATING], SamplingParams(max_new_tokens=24, proposer="ngram"))
    assert adaptive.token_ids == plain.token_ids and adaptive.stats.max_draft_len == 4


def test_a_seeded_requests_lookup_probes_do_not_depend_on_when_it_joined(small_vocab_pair):
    """Lookup priced off (a low prior): a seeded sampled request looks up in probes, timed by its own rounds, not
    the loop's, so its draws, and so its tokens, are the same whatever the loop ran before it."""
    engine = SpeculativeEngine.from_pretrained(
        small_vocab_pair[0],
        None,
        proposer="ngram",
        k_policy=KPolicy(lookup_prior=0.05),
        max_draft_len=4,
        max_batch_size=2,
        max_seq_len=512,
    )
    outputs = []
    for before in (0, 1, 3, 5):
        loop = engine.new_loop()
        if before:
            loop.add(
                "warm", [1, 2, 3], SamplingParams(max_new_tokens=before, num_draft_tokens=0, ignore_eos=True)
            )
            while loop.busy:
                loop.step()
        params = SamplingParams(max_new_tokens=300, temperature=6.0, seed=3, ignore_eos=True)
        loop.add("x", [1, 2, 3, 4], params)
        while loop.busy:
            outputs += [e.result for e in loop.step() if e.result is not None]
    assert outputs[0].stats.drafted > 0  # it probed
    assert all(o.token_ids == outputs[0].token_ids for o in outputs[1:])


def test_one_batch_mixes_proposers_row_by_row_and_each_row_stays_exact(tiny_pair):
    """Greedy rows share one round whatever their proposer: the draft drafts for some rows while others are
    verified against looked-up tokens, and the draft's cache catches up on a row that looked up."""
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4, max_seq_len=128)
    loop = engine.new_loop()
    prompts = {"draft": [1, 7, 8, 9], "ngram": REPEATING, "draft+ngram": REPEATING[:-1], "pinned": REPEATING}
    for name, prompt in prompts.items():
        proposer = "ngram" if name == "pinned" else name
        k = 3 if name == "pinned" else None
        params = SamplingParams(max_new_tokens=20, proposer=proposer, num_draft_tokens=k)
        loop.add(name, prompt, params, eos_ids=engine.eos_ids)
    results, mixed = {}, 0
    while loop.busy:
        events = loop.step()
        mixed += len({e.request_id for e in events if e.num_draft}) > 1
        results.update({e.request_id: e.result for e in events if e.result is not None})
    assert mixed > 0
    for name, prompt in prompts.items():
        assert results[name].token_ids == hf_greedy(target, prompt, 20), name
    assert "ngram" not in results["draft"].stats.by_proposer
    assert max(n for _, n, _ in [results["pinned"].stats.by_proposer["ngram"]]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_point_mass_proposals_keep_the_target_distribution(monkeypatch, small_vocab_pair, bug):
    """The prompt's tail 1 2 occurred before, followed by 3: lookup proposes 3 (a point mass). Accepted with the
    target's probability of 3, else the residual (the target's distribution without 3); then a bonus token or
    the next round: the 2-token joint must be the target's. A planted bug (accept every proposal; sample a
    rejection from the target's distribution, 3 included) is detected."""
    plant(monkeypatch, bug)
    target, _ = small_vocab_pair
    prompt = [1, 2, 3, 1, 2]
    engine = SpeculativeEngine.from_pretrained(
        target, None, max_draft_len=2, max_batch_size=256, max_seq_len=16, proposer="ngram"
    )
    counts = torch.zeros(64, dtype=torch.long)
    proposed = 0
    for seed in range(12):
        params = SamplingParams(max_new_tokens=2, temperature=0.5, seed=seed, ignore_eos=True)
        for result in engine.generate([prompt] * 256, params):
            counts[result.token_ids[0] * 8 + result.token_ids[1]] += 1
            proposed += result.stats.by_proposer.get("ngram", [0, 0, 0])[1]
    assert proposed >= 12 * 256  # every first round verified a looked-up token
    assert follows(counts, target_joint(target, prompt, SamplingParams(temperature=0.5))) == (bug is None)


class GivenCalls:
    """An EngineCalls whose draft must not be called and whose target accepts the first two tokens of any draft,
    then says 99: enough to see given tokens reach the verification untouched."""

    draft_vocab, target_logit_rows = 0, 128

    def __init__(self):
        self.verified = []

    def propose(self, prefixes, num_tokens, call, want_logits):
        raise AssertionError("the draft engine was called for a given proposal")

    def verify(self, prefixes, drafts, draft_logits, max_new_tokens, call):
        self.verified.append((drafts, draft_logits))
        return [d[:2] + [99] for d in drafts] if drafts else [[99] for _ in prefixes]


@pytest.mark.parametrize("use_draft_logits", [False, True])
def test_engine_call_round_verifies_given_tokens_without_its_draft_engine(use_draft_logits):
    calls = GivenCalls()
    rounds = EngineCallRounds(
        calls,
        max_draft_len=4,
        num_slots=2,
        max_seq_len=64,
        use_draft_logits=use_draft_logits,
        has_draft=False,
    )
    rounds.ready[0] = Draft([5, 6])  # a stale draft-ahead guess for the slot: a given proposal replaces it
    row = Row([1, 2, 3], 0, max_len=32)
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=1)
    (outcome,) = rounds.run([row], [3], params, torch.Generator().manual_seed(0), [[10, 11, 12]])
    assert (outcome.tokens, outcome.num_draft, outcome.num_accepted) == ([10, 11, 99], 3, 2)
    assert row.tokens == [1, 2, 3, 10, 11, 99] and 0 not in rounds.ready
    ((drafts, logits),) = calls.verified
    assert drafts == [[10, 11, 12]]
    if use_draft_logits:  # a point mass: probability 1 on each given token
        probs = logits[0].softmax(-1)
        assert (
            probs.shape == (3, 128)
            and probs[torch.arange(3), torch.tensor([10, 11, 12])].tolist() == [1.0] * 3
        )
    else:
        assert logits is None


def test_lookup_priced_off_still_probes_every_probe_every_matching_rounds(tiny_pair):
    """A lookup acceptance of 0 never pays, so only probes propose: one every probe_every rounds that found a
    match (a server's first rounds can price lookup off; a probe lets later rounds measure it again)."""
    from trtspec.engines.adaptive import KPolicy

    target, _ = tiny_pair
    policy = KPolicy(lookup_prior=0.0, prior_weight=1e6, probe_every=4)
    engine = SpeculativeEngine.from_pretrained(
        target, None, max_draft_len=4, max_seq_len=128, proposer="ngram", k_policy=policy
    )
    loop = engine.new_loop()
    loop.add("a", REPEATING * 2, SamplingParams(max_new_tokens=40), eos_ids=())
    request = loop.queued[0]
    matched = proposed = 0
    while loop.busy:
        found = bool(lookup(request.row.tokens, 4, loop.lookup_spec))
        (event,) = loop.step()
        matched += found
        proposed += event.num_draft > 0
        if event.num_draft:
            assert request.lookup_off == 0
    assert matched >= 8 and 1 <= proposed <= matched // 4 + 1
    assert event.result.token_ids == hf_greedy(target, REPEATING * 2, 40)


def test_one_lookup_length_for_a_batch_pays_only_if_its_rows_gain_more_than_the_batch_pays():
    """A batched verification is as wide as its longest proposal for every row: one row's match that doubles its
    own tokens pays at batch 1 and not among 16 rows that found nothing, where the whole batch pays its width."""
    from trtspec.engines.adaptive import KPolicy, best_lookup_len

    policy = KPolicy(verify_token_ratio=0.1)
    assert best_lookup_len([0.8], [4], 1, policy)[0] == 4
    assert best_lookup_len([0.8], [4], 16, policy) == (0, 1.0)
    n, speedup = best_lookup_len([0.8] * 16, [4] * 16, 16, policy)  # every row found one: as at batch 1
    assert n == 4 and speedup == pytest.approx(best_lookup_len([0.8], [4], 1, policy)[1])
    # measured costs (lookup rounds of this batch size) replace the prior ratio: a dear verification declines
    assert best_lookup_len([0.8], [4], 1, policy, costs=[1.0, 3.0, 3.5, 4.0, 4.5]) == (0, 1.0)


def test_a_lookup_for_rows_their_caller_waits_for_pays_only_where_it_advances_the_row_that_ends_them():
    """Rows whose caller waits for them all gain from a lookup round only as the group they end does: a match for
    the row with the most tokens left shortens the call, a match for a row ahead of it does not (the mean counts
    both alike)."""
    from trtspec.engines.adaptive import KPolicy, best_lookup_len

    policy = KPolicy(verify_token_ratio=0.1)
    matched_one = ([0.8, 0.0], [4, 0], 2, policy)
    assert best_lookup_len(*matched_one)[0] == 4  # the mean: 1 + 2.36 / 2 = 2.18 tokens for 1.4
    assert best_lookup_len(*matched_one, remaining=[40, 40]) == (0, 1.0)  # the other row ends the call
    assert best_lookup_len(*matched_one, remaining=[30, 40]) == (0, 1.0)  # ... and is behind
    behind = best_lookup_len(*matched_one, remaining=[50, 40])  # the matched row is the one behind
    assert behind[0] > 0 and behind[1] == pytest.approx(50 / 40 / (1 + 0.1 * behind[0]))
    # The other row drafts with its draft model instead (2 tokens a round): the matched row must keep up with it.
    drafting = best_lookup_len(*matched_one, remaining=[40, 40], floors=[1.0, 2.0])
    assert drafting[0] >= 2 and drafting[1] == pytest.approx(2.0 / (1 + 0.1 * drafting[0]))
    # Every row matched alike: as one row.
    assert best_lookup_len([0.8] * 2, [4] * 2, 2, policy, remaining=[40, 40]) == best_lookup_len(
        [0.8], [4], 1, policy
    )


def test_a_waited_group_prices_lookup_by_each_rows_share_of_rounds_with_a_match():
    """In a group its caller waits for, lookup is a rule for the rounds to come: each row gains in its share of
    rounds with a match (``hits``), so rows that match in most rounds look up even in a round where the row that
    ends the call found nothing (judged by this round alone, a large batch would almost never look up); a row that
    never matches bounds the group at one token a round, and lookup's wider verification then only costs."""
    from trtspec.core.metrics import expected_tokens_per_round
    from trtspec.engines.adaptive import KPolicy, best_lookup_len

    policy = KPolicy(verify_token_ratio=0.1)
    acceptances, available, remaining = [0.8] * 16, [4, 4] + [0] * 14, [40] * 16
    assert best_lookup_len(acceptances, available, 16, policy, remaining=remaining) == (0, 1.0)
    # every row's next match is priced at its cap
    n, speedup = best_lookup_len(acceptances, [4] * 16, 16, policy, remaining=remaining, hits=[0.85] * 16)
    per_row = 0.85 * expected_tokens_per_round(0.8, n) + 0.15
    some_match = 1 - 0.15**16
    assert n > 0 and speedup == pytest.approx(per_row / (1 + some_match * 0.1 * n))
    never = [0.85] * 15 + [0.0]
    assert best_lookup_len(acceptances, [4] * 16, 16, policy, remaining=remaining, hits=never) == (0, 1.0)
    # a round with no match anywhere costs a target step: a length's price counts only the rounds with one
    n, speedup = best_lookup_len([0.8], [4], 1, policy, remaining=[40], hits=[0.5])
    assert speedup == pytest.approx((0.5 * expected_tokens_per_round(0.8, n) + 0.5) / (1 + 0.5 * 0.1 * n))
    # rows that draft instead make every round a drafting one: the wider verification is paid in every round
    n, speedup = best_lookup_len([0.8] * 2, [4] * 2, 2, policy, None, [40] * 2, [1.0, 1.5], [0.5] * 2)
    assert n > 0 and speedup == pytest.approx((0.5 * expected_tokens_per_round(0.8, n) + 0.5) / (1 + 0.1 * n))
    with pytest.raises(ValueError, match="hit rates"):
        best_lookup_len([0.8], [4], 1, policy, remaining=[40], hits=[0.5, 0.5])


def test_an_engine_calls_rows_look_up_in_rounds_where_the_row_that_ends_the_call_found_no_match(tiny_pair):
    """An engine call's rows (a closed loop: its caller waits for all of them) look up in rounds in which the row
    with the most tokens left found no match, as their shares of rounds with a match make it pay; the output
    stays the target's greedy one."""
    from trtspec.engines.adaptive import AdaptiveState, KPolicy

    target, _ = tiny_pair
    # fixed estimates (a huge prior weight) and the policy's cost ratios: no clock decides the rounds
    policy = KPolicy(lookup_prior=0.9, lookup_hit_prior=0.8, prior_weight=1e6, probe_every=10_000)
    engine = SpeculativeEngine.from_pretrained(
        target, None, max_draft_len=4, max_seq_len=128, proposer="ngram", k_policy=policy
    )
    engine.adaptive = AdaptiveState(policy, measure=False)
    loop = engine.new_loop()
    prompts = [REPEATING * 2, REPEATING[3:] * 2, [5, 6] + REPEATING * 2, REPEATING + [9, 10]]
    for i, prompt in enumerate(prompts):
        loop.add(i, prompt, SamplingParams(max_new_tokens=32), eos_ids=())
    loop.close()
    requests, results, unmatched_rounds = list(loop.queued), {}, 0
    while loop.busy:
        rows = [r for r in requests if r in loop.active]
        last = max((r.params.max_new_tokens - len(r.generated) for r in rows), default=0)
        behind_unmatched = any(
            r.params.max_new_tokens - len(r.generated) == last
            and not lookup(r.row.tokens, 4, loop.lookup_spec)
            for r in rows
        )
        events = loop.step()
        unmatched_rounds += behind_unmatched and any(e.num_draft for e in events)
        results.update({e.request_id: e.result for e in events if e.finished})
    assert unmatched_rounds > 0
    for i, prompt in enumerate(prompts):
        assert results[i].token_ids == hf_greedy(target, prompt, 32), i


class _TimedRounds:
    """A runtime whose rows accept every proposal and whose clock advances by each round's cost: a target-only
    round 10 ms, a round drafting K 10 x (1.4 + 0.15 K) ms (what a speculative round pays beyond its draft steps on
    the 2-core CPU machine); the loop's interface (engines/rounds.py) and nothing more."""

    num_slots, vocab_size, max_draft_len, has_draft, max_top_k, device = 4, 0, 4, True, 0, "cpu"

    def __init__(self):
        self.now = 0.0

    def run(self, rows, num_draft, params, generator, proposals=None):
        from trtspec.engines.rounds import Outcome

        k = max(num_draft)
        self.now += 0.010 if k == 0 else 0.010 * (1.4 + 0.15 * k)
        out = []
        for row, n in zip(rows, num_draft, strict=True):
            row.tokens += [7] * (n + 1)
            out.append(Outcome([7] * (n + 1), n, n))
        return out

    def release(self, slot):
        pass

    def move(self, row, slot):
        pass

    def draft_behind(self, row):
        return 0


def test_the_combined_proposers_measuring_rounds_are_the_drafts_own():
    """With draft+ngram and text that repeats, lookup matches in nearly every round: the rounds adaptive K runs to
    measure the draft (its target-only unit among them) must not turn into lookup rounds, or the draft's table never
    measures its unit and prices every K from the line alone, about 30% too cheap here."""
    from trtspec.engines.adaptive import AdaptiveState
    from trtspec.engines.loop import GenerationLoop

    prices = {}
    for proposer in ("draft", "draft+ngram"):
        rounds = _TimedRounds()
        state = AdaptiveState(KPolicy(), clock=lambda rounds=rounds: rounds.now)
        loop = GenerationLoop(rounds, max_seq_len=100_000, adaptive=state, proposer=proposer)
        for i in range(2):
            loop.add(i, [7, 7, 7, 7], SamplingParams(max_new_tokens=400))
        while loop.busy:
            loop.step()
        assert state.costs.by_batch[2].units >= 3, proposer
        prices[proposer] = state.costs.costs(2, 4)
    true = [1.0] + [1.4 + 0.15 * k for k in range(1, 5)]
    assert prices["draft+ngram"] == pytest.approx(true, rel=0.02) and prices["draft"] == pytest.approx(
        true, rel=0.02
    )
