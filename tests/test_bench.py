"""trtspec bench: pure measurement functions (literal cases: rows, the adaptive summary, the recommended schedule)
and a small sweep on the in-process engine (target-only, static K and adaptive K; --write-recipe)."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from test_validate import write_recipe

from trtspec.cli import cli
from trtspec.core.metrics import (
    AcceptanceStats,
    analytic_speedup_bound,
    expected_tokens_per_round,
    per_position_acceptance,
)
from trtspec.validate.bench import (
    INTERVAL_MIN_PAIRS,
    BenchPoint,
    BenchResult,
    itl_samples,
    make_requests,
    paired_interval,
    paired_median,
    paired_ratio,
    percentile,
    recommend_schedule,
)
from trtspec.validate.bench_report import sweep_table
from trtspec.validate.systems import Generation, Request


def test_percentile_literal():
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([0.0, 10.0], 95) == 9.5


def test_itl_counts_every_token_of_a_piece():
    # first piece at 0.1 s (TTFT, not an ITL sample), then 3 tokens after 0.3 s, then 1 token after 0.1 s
    samples = itl_samples([(0.1, 1), (0.4, 3), (0.5, 1)])
    assert samples == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert itl_samples([(0.2, 5)]) == []
    # a piece without tokens (a text-only server's, re-tokenised into the token before) is no arrival: the next
    # gap counts from the last piece that carried tokens
    assert itl_samples([(0.1, 1), (0.2, 0), (0.3, 1)]) == pytest.approx([0.2])
    assert itl_samples([(0.1, 0), (0.2, 1), (0.5, 3)]) == pytest.approx([0.1, 0.1, 0.1])


def test_per_position_acceptance_from_histogram():
    stats = AcceptanceStats(max_draft_len=3, rounds=4, accepted_length_histogram=[1, 1, 0, 2])
    assert per_position_acceptance(stats) == [0.75, 0.5, 0.5]
    assert per_position_acceptance(AcceptanceStats(max_draft_len=2)) == []
    # an adaptive run that never drafted past K=2 of 8 says nothing of positions 3-8
    adaptive = AcceptanceStats(
        max_draft_len=8, rounds=23, accepted_length_histogram=[8, 13, 2], num_draft_histogram=[26, 21, 2]
    )
    assert per_position_acceptance(adaptive) == pytest.approx([15 / 23, 2 / 23])


def _point(k, c, tokens_per_request, wall, accepted=0, drafted=0, hist=None):
    stats = AcceptanceStats(
        max_draft_len=k if k is not None else max(len(hist or []) - 1, 0),  # None: adaptive
        accepted=accepted,
        drafted=drafted,
        rounds=sum(hist or []),
        accepted_length_histogram=hist or [],
        generated_tokens=tokens_per_request,
    )
    gen = Generation(
        list(range(tokens_per_request)), None, stats, wall, 0.01, [(0.01, 1), (wall, tokens_per_request - 1)]
    )
    return BenchPoint(k, c, [gen], wall)


def test_rows_speedup_bound_and_recommendation():
    points = [
        _point(0, 1, 10, 1.0),
        _point(2, 1, 10, 0.5, accepted=6, drafted=8, hist=[0, 2, 2]),
        _point(4, 1, 10, 0.8, accepted=4, drafted=16, hist=[2, 1, 0, 1, 0]),
    ]
    result = BenchResult("s", 10, 1, points, draft_cost_ratio={1: 0.1})
    rows = {r["num_draft_tokens"]: r for r in result.rows()}
    assert rows[0]["speedup"] == 1.0 and rows[0]["acceptance_rate"] is None
    assert rows[2]["speedup"] == pytest.approx(2.0) and rows[2]["acceptance_rate"] == 0.75
    bound = analytic_speedup_bound(expected_tokens_per_round(0.75, 2), 2, 0.1)
    assert rows[2]["analytic_bound"] == pytest.approx(bound)
    assert rows[2]["achieved_fraction"] == pytest.approx(2.0 / bound)
    assert rows[2]["per_position_acceptance"] == [1.0, 0.5]
    assert rows[2]["spec_decode"]["num_accepted_tokens_per_pos"] == [4, 2]  # counts under the metric names
    assert result.recommended_k() == {1: 2}
    # a K whose requests drafted nothing (a lookup that never matched) has no acceptance rate and no bound
    idle = BenchResult("s", 10, 1, [_point(0, 1, 10, 1.0), _point(2, 1, 10, 1.0)], draft_cost_ratio={1: 0.1})
    row = next(r for r in idle.rows() if r["num_draft_tokens"] == 2)
    assert row["acceptance_rate"] is None and row["analytic_bound"] is None
    no_ratio = BenchResult("s", 10, 1, points)
    assert all(r["analytic_bound"] is None for r in no_ratio.rows() if r["num_draft_tokens"])


def test_sweep_warms_adaptive_up_untimed_then_interleaves_every_point_group_by_group():
    from trtspec.validate.bench import run_sweep, sweep_steps

    calls, steps = [], []

    class Recorder:  # a system that answers at once and records each call's (prompts, K, max tokens)
        def generate(self, requests, params):
            calls.append(("".join(r.text for r in requests), params.num_draft_tokens, params.max_new_tokens))
            # request "c" stops a token early, so the groups' samples differ (ab: 6 tokens, cd: 5)
            return [
                Generation([5] * (params.max_new_tokens - (r.text == "c")), None, None, 0.001)
                for r in requests
            ]

    reqs = [Request("a", [1]), Request("b", [2]), Request("c", [3]), Request("d", [4])]
    points = run_sweep(
        Recorder(),
        reqs,
        ks=[2],
        concurrency=[2],
        max_new_tokens=3,
        adaptive=True,
        repeats=2,
        advance=steps.append,
    )
    warm = [("a", 0, 4), ("ab", None, 3), ("cd", None, 3)]
    # each group of 2 runs under every point back to back (adaptive, 0, 2), in balanced_orders
    interleaved = [
        ("ab", None, 3), ("ab", 0, 3), ("ab", 2, 3),  # pass 1, group 1
        ("cd", 0, 3), ("cd", 2, 3), ("cd", None, 3),  # pass 1, group 2
        ("ab", 2, 3), ("ab", None, 3), ("ab", 0, 3),  # pass 2, group 1
        ("cd", 2, 3), ("cd", 0, 3), ("cd", None, 3),  # pass 2, group 2: the first order's mirror
    ]  # fmt: skip
    assert calls == warm + interleaved
    # the warm-up pass is not a point: each point pools its two groups of two passes
    assert [(p.num_draft_tokens, len(p.generations)) for p in points] == [(0, 8), (2, 8), (None, 8)]
    # one timing sample per group and pass, in the order run: sample i of every point ran the same group
    assert all([tokens for tokens, _ in p.samples] == [6, 5, 6, 5] for p in points)
    assert len(steps) == sweep_steps(len(reqs), [2], 2, True) == 5


def test_a_sweep_without_adaptive_k_warms_up_target_only_untimed():
    """Without adaptive K one untimed target-only pass runs first at each concurrency: a server that reuses
    cached prompt prefixes would otherwise run each group's first point cold and the rest warm."""
    from trtspec.validate.bench import run_sweep, sweep_steps

    calls, steps = [], []

    class Recorder:
        def generate(self, requests, params):
            calls.append(("".join(r.text for r in requests), params.num_draft_tokens))
            return [Generation([5] * params.max_new_tokens, None, None, 0.001) for r in requests]

    reqs = [Request("a", [1]), Request("b", [2])]
    points = run_sweep(Recorder(), reqs, ks=[2], concurrency=[1], max_new_tokens=3, advance=steps.append)
    assert calls[:3] == [("a", 0), ("a", 0), ("b", 0)]  # the first call's warm-up, then the untimed pass
    assert [(p.num_draft_tokens, len(p.generations)) for p in points] == [(0, 2), (2, 2)]
    assert len(steps) == sweep_steps(len(reqs), [1], 1, False) == 3


@pytest.mark.parametrize("n", range(1, 8))
def test_every_point_runs_right_after_every_other_equally_often(n):
    """What a point leaves behind (the CPU caches it filled, another engine's weights in them) must fall on every
    point alike: rotated, four points A, B, C, D put A right after D in three orders of four."""
    from trtspec.validate.bench import balanced_orders

    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    after = Counter(pair for order in orders for pair in pairwise(order))
    assert set(after) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(after.values())) <= 1  # every ordered pair alike


def test_the_draft_alone_and_every_proposer_pair_sample_by_sample_with_target_only():
    from trtspec.validate.bench import run_sweep

    class Echo:  # tokens per request = the request's prompt length, so each group's samples are its own
        def generate(self, requests, params, in_flight=None):
            return [Generation([5] * len(r.token_ids), None, None, 0.001) for r in requests]

    reqs = [Request(t, [1] * n) for t, n in zip("abcd", (1, 2, 3, 4), strict=True)]
    points = run_sweep(
        Echo(),
        reqs,
        ks=[2],
        concurrency=[2],
        max_new_tokens=4,
        adaptive=True,
        repeats=2,
        draft_system=Echo(),
        proposers=("draft", "ngram"),
        load="groups",
    )
    assert len(points) == 6  # target-only, per proposer K=2 and adaptive, the draft alone
    assert all([tokens for tokens, _ in p.samples] == [3, 7, 3, 7] for p in points)
    steady = run_sweep(Echo(), reqs, ks=[2], concurrency=[2], max_new_tokens=4, load="streams")
    assert [len(p.samples) for p in steady] == [1, 1]  # one window of 4 x 2 requests (the set cycled)


def test_min_groups_adds_passes_where_a_pass_has_few_groups():
    from trtspec.validate.bench import run_sweep, sweep_passes, sweep_steps

    calls, steps = [], []

    class Recorder:
        def generate(self, requests, params):
            calls.append((len(requests), params.num_draft_tokens))
            return [Generation([5] * params.max_new_tokens, None, None, 0.001) for _ in requests]

    reqs = [Request(t, [i]) for i, t in enumerate("abcd")]
    points = run_sweep(
        Recorder(), reqs, ks=[], concurrency=[1, 2, 4], max_new_tokens=2, min_groups=4, advance=steps.append
    )
    # 4 groups per pass at concurrency 1: one pass; 2 at concurrency 2: two; 1 at concurrency 4: four
    assert [sweep_passes(4, c, 1, 4) for c in (1, 2, 4)] == [1, 2, 4]
    assert [(p.concurrency, len(p.generations)) for p in points] == [(1, 4), (2, 8), (4, 16)]
    # at concurrency 4, its untimed target-only pass (one group) and four timed ones
    assert calls.count((4, 0)) == 5 and len(steps) == sweep_steps(4, [1, 2, 4], 1, False, 4) == 15
    assert sweep_passes(4, 4, 3, 2) == 3  # repeats is the least


def test_a_steady_load_runs_windows_of_requests_in_flight_with_spread_budgets():
    """--load streams: each timing sample is 4 x concurrency requests issued as a steady load (in_flight), each with
    its own budget of 0.5x-1.5x max_new_tokens, the same sequence for every point."""
    from trtspec.validate.bench import budget, run_sweep, sweep_groups, sweep_steps

    calls = []

    class Recorder:
        def generate(self, requests, params, in_flight=None):
            calls.append((params.num_draft_tokens, in_flight, [r.max_new_tokens for r in requests]))
            return [
                Generation([5] * (r.max_new_tokens or params.max_new_tokens), None, None, 0.001)
                for r in requests
            ]

    reqs = [Request(t, [i]) for i, t in enumerate("abc")]
    points = run_sweep(Recorder(), reqs, ks=[2], concurrency=[2], max_new_tokens=10, load="streams")
    window = [budget(10, i) for i in range(8)]
    # the untimed first call, then one window of 4 x 2 requests per point, 2 in flight
    assert calls == [(0, None, [None]), (0, 2, window), (0, 2, window), (2, 2, window)]  # untimed pass first
    assert all(5 <= b <= 15 for b in window) and len(set(window)) > 4
    assert [(p.num_draft_tokens, len(p.generations)) for p in points] == [(0, 8), (2, 8)]
    assert sweep_groups(3, 2, "streams") == 1 and sweep_groups(9, 2, "streams") == 2
    assert sweep_steps(3, [2], 1, False, load="streams") == 2
    budgets = [budget(64, i) for i in range(400)]
    assert min(budgets) >= 32 and max(budgets) <= 96 and abs(sum(budgets) / 400 - 64) < 2


def test_make_requests_fills_whole_groups():
    reqs = [Request("a", [1]), Request("b", [2]), Request("c", [3])]
    assert [r.text for r in make_requests(reqs, 2)] == ["a", "b", "c", "a"]
    assert len(make_requests(reqs, 8)) == 8 and len(make_requests(reqs, 1)) == 3


@pytest.mark.slow
def test_bench_cli_small_sweep_writes_json_markdown_and_pngs(runner, tiny_pair, tmp_path):
    from PIL import Image

    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft)
    out_dir = tmp_path / "bench"
    result = runner.invoke(
        cli,
        [
            "bench",
            str(recipe),
            "--limit",
            "2",
            "--max-tokens",
            "8",
            "--num-draft-tokens",
            "1,3",
            "--concurrency",
            "1,2",
            "--out",
            str(out_dir),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    saved = json.loads((out_dir / "bench.json").read_text())
    assert saved["points"] == payload["points"]
    grid = {(p["num_draft_tokens"], p["concurrency"]) for p in saved["points"]}
    assert grid == {(k, c) for k in (0, 1, 3, None) for c in (1, 2)}  # None: adaptive K
    assert set(saved["draft_cost_ratio"]) == {"1", "2"} and saved["recommended_num_draft_tokens"]["1"] in (
        0,
        1,
        3,
    )
    for point in saved["points"]:
        k = point["num_draft_tokens"]
        assert point["tokens_per_s"] > 0 and point["ttft_p50_s"] > 0
        # no rate where nothing was drafted: target-only, or an adaptive point that chose K=0 throughout
        assert (point["acceptance_rate"] is None) == (point["spec_decode"]["num_draft_tokens"] == 0)
        assert k != 0 or point["acceptance_rate"] is None
        if k is None:  # adaptive: K per round up to max_draft_len, which the histogram records
            assert point["k"] == "adaptive" and point["analytic_bound"] is None
            assert len(point["num_draft_histogram"]) <= 5 and sum(point["num_draft_histogram"]) > 0
            assert 0 <= point["mean_num_draft_tokens"] <= 4
            continue
        assert point["k"] == str(k) and len(point["per_position_acceptance"]) == k
        assert point["mean_num_draft_tokens"] <= k  # first rounds and the last tokens draft less
        if k:
            assert point["analytic_bound"] > 0
    summary = {row["concurrency"]: row for row in saved["adaptive_sweep"]}
    assert set(summary) == {1, 2}
    for c, row in summary.items():
        measured = {
            (p["num_draft_tokens"]): p["tokens_per_s"] for p in saved["points"] if p["concurrency"] == c
        }
        assert row["best_tokens_per_s"] == max(v for k, v in measured.items() if k is not None)
        assert row["adaptive_vs_best"] == pytest.approx(measured[None] / row["best_tokens_per_s"])
        assert row["adaptive_vs_target_only"] == pytest.approx(measured[None] / measured[0])
        samples = {p["num_draft_tokens"]: p["samples"] for p in saved["points"] if p["concurrency"] == c}
        assert len({len(s) for s in samples.values()}) == 1  # every point ran the same timing samples
        rates = {k: [tokens / seconds for tokens, seconds in s] for k, s in samples.items()}
        best = row["best_num_draft_tokens"]
        assert row["adaptive_vs_best_paired"] == pytest.approx(paired_median(rates[None], rates[best]))
        assert row["adaptive_vs_target_only_paired"] == pytest.approx(paired_median(rates[None], rates[0]))
        # one or two timing samples a point here: too few for an interval (INTERVAL_MIN_PAIRS)
        assert len(rates[None]) < INTERVAL_MIN_PAIRS
        assert row["adaptive_vs_best_paired_interval"] is None
        assert row["adaptive_vs_target_only_paired_interval"] is None
    schedule = {int(c): k for c, k in saved["recommended_schedule"].items()}
    assert set(schedule) == {1, 2} and schedule[2] <= schedule[1] and set(schedule.values()) <= {0, 1, 3}
    markdown = (out_dir / "bench.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert (
        table[0].startswith("| K | mean K | conc | tok/s")
        and len({line.count("|") for line in table[:9]}) == 1
    )
    assert [line.split(" | ")[0] for line in table[1:9]].count("| adaptive") == 2  # header + 8 points
    sweep = markdown.split("## Adaptive K against target-only and every static K")[1].split("\n## ")[0]
    assert sweep.count("\n| 1 | ") == 1 and sweep.count("\n| 2 | ") == 1
    assert "| paired / best | paired / target-only |" in sweep
    assert "Recommended speculative.schedule: {1: " in markdown
    for name in ("speedup_acceptance.png", "latency_concurrency.png"):
        with Image.open(out_dir / name) as image:
            assert image.format == "PNG" and image.size[0] > 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench", "tiny.yaml"]  # no temp dir left


def test_bench_cli_under_a_steady_load_says_so_and_times_each_request_from_its_issue(
    runner, tiny_pair, tmp_path
):
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft)
    out_dir = tmp_path / "bench"
    args = ["bench", str(recipe), "--limit", "2", "--max-tokens", "8", "--num-draft-tokens", "2"]
    result = runner.invoke(
        cli, [*args, "--concurrency", "2", "--load", "streams", "--out", str(out_dir), "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["load"] == "streams"
    for point in payload["points"]:
        # 8 requests (4 per stream) of 4-12 tokens; a request that waited for a place is timed from its issue, so
        # its first token comes within a round or two, not after the requests before it. Timed from the point's
        # start, the issues spread over three quarters of it and the median would be about a third of it; the median,
        # not p95, so that one pause of a loaded machine in one request's first round does not decide it.
        assert point["requests"] == 8 and point["ttft_p50_s"] < point["wall_s"] / 4, point
    markdown = (out_dir / "bench.md").read_text()
    assert (
        "a steady load (`concurrency` requests in flight" in markdown
        and "4 x `concurrency` requests" in markdown
    )
    result = runner.invoke(cli, [*args, "--load", "bursts"])
    assert result.exit_code == 2 and "'bursts' is not one of 'groups', 'streams'" in result.output


def test_bench_refuses_k_above_max_draft_len(runner, tiny_pair, tmp_path):
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft, max_draft_len=2)
    result = runner.invoke(cli, ["bench", str(recipe), "--num-draft-tokens", "1,4"])
    assert result.exit_code == 2 and "max_draft_len 2" in result.output
    # the one line alone: no blank line from a progress display that never showed
    assert result.stdout == "" and len(result.output.splitlines()) == 1, repr(result.output)
    result = runner.invoke(cli, ["bench", str(recipe), "--concurrency", "1,x"])
    assert result.exit_code == 2 and "comma-separated" in result.output


def forbid_sweep(monkeypatch, option: str) -> None:
    """bench's sweep fails the test if it starts: ``option`` must be refused before any measuring."""
    import trtspec.validate.bench as bench_module

    def no_sweep(*args, **kwargs):
        raise AssertionError(f"the sweep ran before {option} was checked")

    monkeypatch.setattr(bench_module, "run_sweep", no_sweep)


def test_bench_refuses_an_out_folder_that_is_not_a_bench_report_before_running(
    runner, tiny_pair, tmp_path, monkeypatch
):
    forbid_sweep(monkeypatch, "--out")
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = runner.invoke(cli, ["bench", str(recipe), "--out", str(mine)])
    assert result.exit_code == 2, result.output
    assert "exists and is not a trtspec bench report (no bench.json)" in result.output
    assert (mine / "notes.txt").read_text() == "keep me"
    monkeypatch.chdir(mine)
    result = runner.invoke(cli, ["bench", str(recipe), "--out", "."])
    assert result.exit_code == 2 and "is the current folder" in result.output
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    # An earlier report whose bench.md the user annotated: refused before the sweep, unless --force.
    from trtspec.outputs import write_output_dir
    from trtspec.validate.run_bench import BENCH_OUTPUT

    report = tmp_path / "report"
    write_output_dir(
        report, *BENCH_OUTPUT, lambda tmp: [(tmp / n).write_text("{}") for n in ("bench.json", "bench.md")]
    )
    (report / "bench.md").write_text("my notes")
    result = runner.invoke(cli, ["bench", str(recipe), "--out", str(report)])
    assert result.exit_code == 2 and "bench.md was changed since trtspec wrote it" in result.output
    result = runner.invoke(cli, ["bench", str(recipe), "--out", str(report), "--force"])
    assert "the sweep ran before --out was checked" in str(result.exception)
    assert (report / "bench.md").read_text() == "my notes"


def test_recommend_schedule_takes_the_largest_k_worth_running_and_never_grows_with_load():
    table = {
        1: {0: 100.0, 1: 150.0, 2: 190.0, 4: 200.0, 8: 196.0, None: 195.0},  # K 8 is within 5% of K 4: cap 8
        4: {0: 300.0, 1: 390.0, 2: 400.0, 4: 330.0, 8: 250.0},  # K 4 is 17% off the best: cap 2
        8: {0: 500.0, 1: 505.0, 2: 480.0, 4: 400.0, 8: 300.0},  # K 2 is within 5% but slower than target-only
        16: {0: 600.0, 1: 560.0, 2: 500.0, 4: 420.0, 8: 310.0},  # target-only is best by more than 5%
    }
    assert recommend_schedule(table) == {1: 8, 4: 2, 8: 1, 16: 0}
    assert recommend_schedule(table, tolerance=0.0) == {1: 4, 4: 2, 8: 1, 16: 0}
    # A concurrency that measured a larger K than a lower one (noise) is cut to the lower one's K: the recipe
    # refuses a schedule whose K grows with the in-flight count.
    assert recommend_schedule({1: {0: 10.0, 2: 20.0}, 2: {0: 10.0, 2: 15.0, 4: 30.0}}) == {1: 2, 2: 2}
    assert recommend_schedule({1: {0: 10.0, None: 50.0}}) == {1: 0}  # adaptive is not a K to recommend


def test_sweep_summary_sets_adaptive_against_the_best_point_and_target_only():
    adaptive = _point(None, 1, 10, 0.55, accepted=6, drafted=8, hist=[0, 2, 2])
    adaptive.generations[0].stats.target_forwards = 5
    points = [_point(0, 1, 10, 1.0), _point(2, 1, 10, 0.5, accepted=6, drafted=8, hist=[0, 2, 2]), adaptive]
    points += [_point(0, 2, 10, 0.5), _point(2, 2, 10, 0.6)]  # no adaptive point at concurrency 2: no row
    result = BenchResult("s", 10, 1, points, draft_cost_ratio={1: 0.1})
    (row,) = result.sweep_summary()
    assert row["concurrency"] == 1 and row["best_num_draft_tokens"] == 2
    assert row["best_tokens_per_s"] == pytest.approx(20.0) and row["adaptive_tokens_per_s"] == pytest.approx(
        10 / 0.55
    )
    assert row["adaptive_vs_best"] == pytest.approx(0.5 / 0.55)
    assert row["adaptive_vs_target_only"] == pytest.approx(1.0 / 0.55)
    assert row["adaptive_mean_num_draft_tokens"] == pytest.approx(8 / 5)
    assert result.recommended_k() == {1: 2, 2: 0}  # adaptive is never the recommended K
    rows = {r["k"]: r for r in result.rows() if r["concurrency"] == 1}
    assert rows["adaptive"]["analytic_bound"] is None and rows["adaptive"]["acceptance_rate"] == 0.75
    assert rows["0"]["analytic_bound"] == 1.0


def test_paired_median_is_the_median_of_sample_by_sample_ratios():
    assert paired_median([2.0, 3.0, 4.0], [1.0, 3.0, 2.0]) == pytest.approx(2.0)
    assert paired_median([1.0, 2.0], [1.0, 1.0]) == pytest.approx(
        1.5
    )  # even count: the mean of the middle two
    assert paired_median([], []) is None
    with pytest.raises(ValueError, match="not paired"):
        paired_median([1.0], [1.0, 2.0])


def test_paired_interval_is_the_central_share_of_bootstrapped_medians():
    rates = [1.0, 0.9, 1.1, 0.95, 1.05, 0.8, 1.2, 1.0, 0.85, 1.15, 0.97, 1.03]
    ones = [1.0] * len(rates)
    low, high = paired_interval(rates, ones)
    # the same resamples drawn apart: the 100th and 1900th of 2000 sorted medians (5% left out on each side)
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(rates, k=len(rates))) for _ in range(2000))
    assert (low, high) == (medians[100], medians[1899])
    assert min(rates) < low < paired_median(rates, ones) < high < max(rates)  # inside the pairs' range
    assert paired_interval(rates, ones) == (low, high)  # seeded: the same report twice
    # a lower level never gives a wider interval; a wider spread between samples gives a wider one
    narrow = paired_interval(rates, ones, level=0.5)
    assert low <= narrow[0] <= narrow[1] <= high and narrow[1] - narrow[0] < high - low
    wide = paired_interval([1 + 2 * (r - 1) for r in rates], ones)
    assert wide[1] - wide[0] > high - low
    assert paired_interval([2.0, 4.0, 6.0, 8.0, 10.0, 12.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == (2.0, 2.0)


def test_paired_interval_needs_six_timed_pairs():
    """At 3-4 pairs a resample's median is an extreme pair so often that the interval is their range, which
    holds the true median about 75% of the time, not 90%."""
    assert INTERVAL_MIN_PAIRS == 6
    assert paired_interval([1.0, 0.9, 1.1, 0.95, 1.05], [1.0] * 5) is None
    assert paired_interval([1.0, 0.9, 1.1, 0.95, 1.05, 1.2], [1.0] * 6) is not None
    # an untimed sample (rate 0) pairs with nothing, on either side
    assert paired_interval([1.0, 0.9, 1.1, 0.95, 1.05, 1.2], [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]) is None
    with pytest.raises(ValueError, match="not paired"):
        paired_interval([1.0], [1.0, 2.0])


def test_the_draft_cost_ratio_pairs_the_draft_alone_with_target_only_sample_by_sample():
    from trtspec.validate.bench import cost_ratios

    target_only = _point(0, 1, 30, 3.0)
    target_only.samples = [(10, 1.0), (10, 1.0), (10, 1.0)]
    draft = _point(0, 1, 30, 2.4)
    draft.role = "draft"
    draft.samples = [(10, 0.2), (10, 0.2), (10, 2.0)]  # a slow spell on its last sample
    assert cost_ratios([target_only, draft]) == pytest.approx({1: 0.2})  # pooled it would be 0.8
    draft.samples = []  # unpaired (points built elsewhere): pooled
    assert cost_ratios([target_only, draft]) == pytest.approx({1: 0.8})


def test_sweep_summary_pairs_adaptive_with_each_point_sample_by_sample():
    # Adaptive ran at the best point's speed in two of three samples; a slow spell took its third sample 5x as
    # long. Pooled, that spell alone puts adaptive at 0.44 of the best point; paired, one pair of three.
    adaptive = _point(None, 1, 30, 7.0, accepted=6, drafted=8, hist=[0, 2, 2])
    adaptive.samples = [(10, 1.0), (10, 1.0), (10, 5.0)]
    best = _point(2, 1, 30, 3.1, accepted=6, drafted=8, hist=[0, 2, 2])
    best.samples = [(10, 1.0), (10, 1.1), (10, 1.0)]
    target_only = _point(0, 1, 30, 6.0)
    target_only.samples = [(10, 2.0), (10, 2.0), (10, 2.0)]
    (row,) = BenchResult("s", 10, 1, [target_only, best, adaptive]).sweep_summary()
    assert row["best_num_draft_tokens"] == 2
    assert row["adaptive_vs_best"] == pytest.approx(3.1 / 7.0)
    assert row["adaptive_vs_best_paired"] == pytest.approx(1.0)  # the pairs: 1.0, 1.1, 0.2
    assert row["adaptive_vs_target_only"] == pytest.approx(6.0 / 7.0)
    assert row["adaptive_vs_target_only_paired"] == pytest.approx(2.0)  # the pairs: 2, 2, 0.4
    # three samples: too few for an interval, so the cells give the paired ratio alone
    assert row["adaptive_vs_best_paired_interval"] is None
    header, (cells,) = sweep_table([row])
    assert cells[header.index("paired / best")] == "1.00"
    # six: the interval beside it, in the terminal's and bench.md's cells alike
    for point, more in ((adaptive, [(10, 1.0), (10, 1.2), (10, 0.9)]), (best, [(10, 1.0)] * 3)):
        point.samples += more
    target_only.samples *= 2
    (row,) = BenchResult("s", 10, 1, [target_only, best, adaptive]).sweep_summary()
    low, high = row["adaptive_vs_best_paired_interval"]
    assert (low, high) == paired_interval(adaptive.sample_rates, best.sample_rates) and low < high
    header, (cells,) = sweep_table([row])
    assert (
        cells[header.index("paired / best")] == f"{row['adaptive_vs_best_paired']:.2f} ({low:.2f}-{high:.2f})"
    )
    low, high = row["adaptive_vs_target_only_paired_interval"]
    assert cells[header.index("paired / target-only")].endswith(f" ({low:.2f}-{high:.2f})")
    # points that did not run the same samples do not pair
    assert paired_ratio(adaptive, _point(2, 1, 30, 3.0)) is None
    best.samples = best.samples[:2]
    assert paired_ratio(adaptive, best) is None
    # a sample that timed nothing (no tokens) pairs with nothing, on either side
    assert paired_median([0.0, 2.0, 3.0], [1.0, 1.0, 0.0]) == pytest.approx(2.0)


@pytest.mark.slow
def test_bench_write_recipe_saves_a_loadable_copy_with_the_schedule(runner, tiny_pair, tmp_path):
    from trtspec.recipe import load_recipe

    target, draft = tiny_pair
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "target").symlink_to(target)  # relative model paths: the copy elsewhere must still find them
    (folder / "draft").symlink_to(draft)
    recipe = folder / "tiny.yaml"
    recipe.write_text(
        "name: tiny\ntarget: {model: target, dtype: float32}\ndraft: {model: draft, dtype: float32}\n"
        "speculative: {max_draft_len: 3, num_draft_tokens: 2}\n"
        "limits: {max_batch_size: 2, max_input_len: 128, max_seq_len: 256}\n"
    )
    copy = tmp_path / "elsewhere" / "tuned.yaml"
    args = ["bench", str(recipe), "--limit", "2", "--max-tokens", "6", "--out", str(tmp_path / "bench")]
    args += ["--repeats", "2", "--min-groups", "3"]
    result = runner.invoke(cli, [*args, "--write-recipe", str(copy), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["recipe_written"] == str(copy)
    # Defaults: K 1..max_draft_len, concurrency 1, 2, 4, 8, 16 up to limits.max_batch_size (noted).
    grid = {(p["num_draft_tokens"], p["concurrency"]) for p in payload["points"]}
    assert grid == {(k, c) for k in (0, 1, 2, 3, None) for c in (1, 2)}
    assert any("limits.max_batch_size 2" in note for note in payload["notes"])
    # 2 prompts: at concurrency 1 two groups x 2 passes; at 2 one group x 3 passes (--min-groups), pooled
    assert {(p["concurrency"], p["requests"]) for p in payload["points"]} == {(1, 4), (2, 6)}
    assert any("passes (2 at concurrency 1, 3 at concurrency 2)" in note for note in payload["notes"])
    # 4-6 requests of at most 6 tokens a point: too few for a rate, and the report says so
    fewest = min(p["generated_tokens"] for p in payload["points"])
    assert fewest < 64 and any(
        f"are noise: the timed run generated {fewest} tokens, fewer than the 64 a rate needs" in note
        for note in payload["notes"]
    )
    written = load_recipe(copy)
    schedule = {int(c): k for c, k in payload["recommended_schedule"].items()}
    assert written.speculative.schedule == schedule
    assert written.speculative.num_draft_tokens is None  # adaptive K is the copy's default
    assert written.speculative.draft_cost_ratio == pytest.approx(payload["draft_cost_ratio"]["1"], abs=1e-3)
    assert written.target.model == target.resolve() and written.draft.model == draft.resolve()
    assert yaml.safe_load(copy.read_text())["limits"] == {
        "max_batch_size": 2,
        "max_input_len": 128,
        "max_seq_len": 256,
    }
    assert copy.read_text().startswith("# Written by trtspec bench from ")
    assert sorted(p.name for p in copy.parent.iterdir()) == ["tuned.yaml"]  # no temp file left


def test_bench_refuses_a_write_recipe_path_it_cannot_write_before_running(
    runner, tiny_pair, tmp_path, monkeypatch
):
    forbid_sweep(monkeypatch, "--write-recipe")
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft)
    (tmp_path / "notes.txt").write_text("keep me")
    result = runner.invoke(
        cli, ["bench", str(recipe), "--write-recipe", str(tmp_path / "notes.txt" / "x.yaml")]
    )
    assert result.exit_code == 2, result.output
    assert "--write-recipe" in result.output and "is a file, not a folder" in result.output
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    # inside --out it may go, but not onto one of the report's own files
    out = tmp_path / "report"
    for name in ("bench.json", "bench.md", "speedup_acceptance.png", ".trtspec-files.json"):
        args = ["bench", str(recipe), "--out", str(out), "--write-recipe", str(out / name)]
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            f"Error: --write-recipe {out / name} is the report's own {name}; choose another name, e.g. "
            f"{out / 'recipe.yaml'}"
        )


def test_bench_refuses_inputs_the_report_would_replace_before_running(
    runner, tiny_pair, tmp_path, monkeypatch
):
    """The report replaces --out whole: a recipe saved there by --write-recipe and benchmarked again, or a prompt
    file there, would be gone; --write-recipe onto --out itself, or reaching it through "..", is refused too."""
    forbid_sweep(monkeypatch, "the inputs inside --out")
    target, draft = tiny_pair
    out = tmp_path / "report"
    out.mkdir()
    (out / "bench.json").write_text(
        "{}"
    )  # an earlier report (one without an edit record is replaced as it is)
    recipe = write_recipe(out / "recipe.yaml", target, draft)
    result = runner.invoke(cli, ["bench", str(recipe), "--out", str(out)])
    assert result.exit_code == 2 and result.output.strip() == (
        f"Error: the recipe {recipe} lies inside --out {out}, which this run replaces; copy it out of the folder "
        "or choose another --out"
    )
    outside = write_recipe(tmp_path / "tiny.yaml", target, draft)
    prompts = out / "p.txt"
    prompts.write_text("def f():\n")
    result = runner.invoke(cli, ["bench", str(outside), "--out", str(out), "--prompts", str(prompts)])
    assert result.exit_code == 2 and f"--prompts {prompts} lies inside --out" in result.output
    for copy in (out, tmp_path / "report" / ".." / "report" / "bench.json", tmp_path):
        result = runner.invoke(cli, ["bench", str(outside), "--out", str(out), "--write-recipe", str(copy)])
        assert result.exit_code == 2 and "--write-recipe" in result.output, result.output
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "p.txt", "recipe.yaml"]


def test_bound_uses_measured_tokens_per_round_where_rounds_are_counted():
    # Acceptance 6/8 = 0.75 predicts (1 - 0.75^5) / 0.25 = 3.05 tokens per round at K=4 if i.i.d.; the engine
    # measured 10 tokens in 2 target forwards (bursty acceptance): the bound must use the measured 5.
    point = _point(4, 1, 10, 0.5, accepted=6, drafted=8, hist=[0, 0, 0, 0, 2])
    point.generations[0].stats.target_forwards = 2
    result = BenchResult("s", 10, 1, [_point(0, 1, 10, 1.0), point], draft_cost_ratio={1: 0.1})
    row = next(r for r in result.rows() if r["num_draft_tokens"] == 4)
    assert row["tokens_per_round"] == 5.0
    assert row["analytic_bound"] == pytest.approx(analytic_speedup_bound(5.0, 4, 0.1))
    assert row["analytic_bound"] > analytic_speedup_bound(expected_tokens_per_round(0.75, 4), 4, 0.1)


def test_a_steady_load_sends_each_request_with_its_budget_and_keeps_in_flight_requests_open(monkeypatch):
    """TritonSystem.generate(in_flight=2): two client threads, each sending its next request as its last one is
    answered, so at most two are open at once; each request carries its own max_tokens."""
    import threading
    import time

    from trtspec.engines.sampling import SamplingParams
    from trtspec.validate import triton_system
    from trtspec.validate.triton_client import EndpointResponse, ServedConfig

    open_now, most, sent, lock = [0], [0], [], threading.Lock()
    # the first two requests are open together, however the threads are scheduled
    first_two = threading.Barrier(2)

    class Client:  # TritonClient's surface that TritonSystem uses
        model, address, protocol, interface = "tensorrt_llm_bls", "127.0.0.1:1", "grpc", "trtspec"

        def __init__(self, *args):
            pass

        def check_ready(self):
            pass

        def served_config(self):
            return ServedConfig({}, decoupled=True)

        def generate(self, text, max_tokens, k, stream, **sampling):
            with lock:
                open_now[0] += 1
                most[0] = max(most[0], open_now[0])
                sent.append((text, max_tokens))
                meet = len(sent) <= 2
            if meet:
                first_two.wait(timeout=10)
            time.sleep(0.02)
            with lock:
                open_now[0] -= 1
            response = EndpointResponse(elapsed_s=0.02)
            response.add_ids(0.01, [7] * max_tokens)
            return response

    monkeypatch.setattr(triton_system, "TritonClient", Client)
    system = triton_system.TritonSystem("127.0.0.1:1", tokenizer=None)
    requests = [Request(t, [1], max_new_tokens=n) for t, n in zip("abcdef", (3, 5, 2, 4, 6, 1), strict=True)]
    generations = system.generate(requests, SamplingParams(max_new_tokens=64), in_flight=2)
    assert most[0] == 2 and sorted(sent) == sorted(zip("abcdef", (3, 5, 2, 4, 6, 1), strict=True))
    assert [len(g.token_ids) for g in generations] == [3, 5, 2, 4, 6, 1]


def test_bench_lists_measure_a_value_given_twice_once_and_refuse_what_is_not_a_list(runner, tmp_path):
    from trtspec.cli import _int_list

    assert _int_list(None, None, "4,2,4,1") == (4, 2, 1)  # a K run twice would pool twice the samples
    assert _int_list(None, None, " 1, 2") == (1, 2)
    for option, value, said in [
        ("--num-draft-tokens", "2,x", "'2,x' is not a comma-separated list of integers"),
        # a typo, not a list of two:
        ("--concurrency", "1,,2", "'1,,2' is not a comma-separated list of integers"),
        ("--concurrency", "", "'' is not a comma-separated list of integers"),
        ("--proposer", "draft,,ngram", "'draft,,ngram' is not a proposer"),
        ("--proposer", "draft,lookup", "'lookup' is not a proposer"),
    ]:
        result = runner.invoke(cli, ["bench", "demo", option, value, "--out", str(tmp_path / "b")])
        assert result.exit_code == 2 and said in result.output, (option, value, result.output)
        assert "Traceback" not in result.output and not (tmp_path / "b").exists()


def test_a_report_whose_folder_was_edited_during_the_sweep_goes_beside_it_and_a_recipe_copy_inside_it_counts(
    tmp_path,
):
    """--out was checked before the sweep; a file added there while it ran (an editor's swap file) must not cost
    the measured sweep: the report goes to a new folder beside it and says why. A --write-recipe copy inside
    --out is part of the report's own write, so it does not block the next bench."""
    from trtspec.outputs import EDIT_RECORD
    from trtspec.validate.run_bench import write_bench

    result = BenchResult(
        "s", 10, 1, [_point(0, 1, 10, 1.0), _point(2, 1, 10, 0.5)], draft_cost_ratio={1: 0.1}
    )
    out = tmp_path / "report"
    payload = write_bench(result, out, (out / "tuned.yaml", "name: tuned\n"))
    assert payload["out_dir"] == str(out) and payload["recipe_written"] == str(out / "tuned.yaml")
    assert (out / "tuned.yaml").read_text() == "name: tuned\n" and "tuned.yaml" in (
        out / EDIT_RECORD
    ).read_text()
    assert write_bench(result, out, (out / "tuned.yaml", "name: again\n"))["out_dir"] == str(
        out
    )  # not blocked
    (out / ".bench.md.swp").write_bytes(b"vim")
    payload = write_bench(result, out)
    moved = Path(payload["out_dir"])
    assert moved.parent == tmp_path and moved.name.startswith("report-") and (moved / "bench.json").is_file()
    assert payload["moved"].startswith(f"--out {out}: .bench.md.swp was added since trtspec wrote it")
    assert payload["moved"].endswith(f"this run's report went to {moved} instead")
    assert (out / ".bench.md.swp").read_bytes() == b"vim" and (
        out / "tuned.yaml"
    ).read_text() == "name: again\n"
    assert (
        write_bench(result, out, force=True)["out_dir"] == str(out) and not (out / ".bench.md.swp").exists()
    )
