"""core.metrics' spec-decode counters (vLLM's names) from recorded rounds: literal cases."""

from __future__ import annotations

from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts, merge_stats


def _stats(rounds: list[tuple[int, int]], max_draft_len: int = 3) -> AcceptanceStats:
    stats = AcceptanceStats(max_draft_len=max_draft_len)
    for num_draft, num_accepted in rounds:
        stats.record_round(num_draft, num_accepted)
    return stats


def test_counts_of_recorded_rounds():
    # a prefill-only round, then K=3 accepting 1, K=3 accepting all, K=2 (near max_tokens) accepting none
    counts = SpecDecodeCounts.of(_stats([(0, 0), (3, 1), (3, 3), (2, 0)]))
    assert counts == SpecDecodeCounts(
        num_draft_tokens=8,
        num_accepted_tokens=4,
        num_drafts=3,
        num_accepted_tokens_per_pos=(
            2,
            1,
            1,
        ),  # position 0: the rounds accepting 1 and 3; 1 and 2: only the 3
        num_rounds_without_speculation=1,
    )
    assert counts.mean_draft_len == 8 / 3


def test_counts_of_merged_requests_are_the_sums():
    a, b = (
        _stats([(0, 0), (2, 2), (2, 1)], max_draft_len=2),
        _stats([(4, 4), (0, 0), (0, 0)], max_draft_len=4),
    )
    merged = SpecDecodeCounts.of(merge_stats([a, b]))
    assert merged.num_accepted_tokens_per_pos == (3, 2, 1, 1)
    assert merged.num_drafts == 3 and merged.num_rounds_without_speculation == 3
    assert sum(merged.num_accepted_tokens_per_pos) == merged.num_accepted_tokens == 7


def test_totals_from_a_response_leave_the_per_round_counts_unknown():
    # validate.triton_system builds stats from return_perf_metrics: drafted and accepted, no rounds; a server's
    # totals leave its round counts unknown even where it drafted nothing, and so does a merge with them
    merged = AcceptanceStats().merge(AcceptanceStats(drafted=4, accepted=3, totals_only=True))
    for drafted, accepted, stats in (
        (12, 7, AcceptanceStats(max_draft_len=4, drafted=12, accepted=7, totals_only=True)),
        (0, 0, AcceptanceStats(max_draft_len=4, totals_only=True)),
        (4, 3, merged),
    ):
        counts = SpecDecodeCounts.of(stats)
        assert (counts.num_draft_tokens, counts.num_accepted_tokens) == (drafted, accepted)
        assert (
            counts.num_drafts
            is counts.num_accepted_tokens_per_pos
            is counts.num_rounds_without_speculation
            is None
        )
    assert (
        SpecDecodeCounts.of(AcceptanceStats(max_draft_len=4)).num_drafts == 0
    )  # every round seen and nothing drafted: known zeros


def test_stats_dict_keeps_its_keys_and_adds_the_metric_names():
    data = _stats([(0, 0), (3, 2)]).to_dict()
    assert {"drafted", "accepted", "rounds", "accepted_length_histogram", "acceptance_rate"} <= set(data)
    assert data["spec_decode"]["num_accepted_tokens_per_pos"] == [1, 1, 0]
