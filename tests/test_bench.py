"""trtspec bench: pure measurement functions (literal cases) and a small sweep on the in-process engine."""

from __future__ import annotations

import json

import pytest
from test_validate import write_recipe

from trtspec.cli import cli
from trtspec.core.metrics import (
    AcceptanceStats,
    analytic_speedup_bound,
    expected_tokens_per_round,
    per_position_acceptance,
)
from trtspec.validate.bench import (
    BenchPoint,
    BenchResult,
    itl_samples,
    make_requests,
    percentile,
)
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


def test_per_position_acceptance_from_histogram():
    stats = AcceptanceStats(max_draft_len=3, rounds=4, accepted_length_histogram=[1, 1, 0, 2])
    assert per_position_acceptance(stats) == [0.75, 0.5, 0.5]
    assert per_position_acceptance(AcceptanceStats(max_draft_len=2)) == []


def _point(k, c, tokens_per_request, wall, accepted=0, drafted=0, hist=None):
    stats = AcceptanceStats(
        max_draft_len=k,
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
    no_ratio = BenchResult("s", 10, 1, points)
    assert all(r["analytic_bound"] is None for r in no_ratio.rows() if r["num_draft_tokens"])


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
    assert grid == {(k, c) for k in (0, 1, 3) for c in (1, 2)}
    assert set(saved["draft_cost_ratio"]) == {"1", "2"} and saved["recommended_num_draft_tokens"]["1"] in (
        0,
        1,
        3,
    )
    for point in saved["points"]:
        assert point["tokens_per_s"] > 0 and point["ttft_p50_s"] > 0
        assert (point["acceptance_rate"] is None) == (point["num_draft_tokens"] == 0)
        assert len(point["per_position_acceptance"]) == point["num_draft_tokens"]
        if point["num_draft_tokens"]:
            assert point["analytic_bound"] > 0
    markdown = (out_dir / "bench.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| K | conc | tok/s") and len({line.count("|") for line in table[:7]}) == 1
    assert len(table[:7]) == 7  # header + 6 points
    for name in ("speedup_acceptance.png", "latency_concurrency.png"):
        with Image.open(out_dir / name) as image:
            assert image.format == "PNG" and image.size[0] > 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench", "tiny.yaml"]  # no temp dir left


def test_bench_refuses_k_above_max_draft_len(runner, tiny_pair, tmp_path):
    target, draft = tiny_pair
    recipe = write_recipe(tmp_path / "tiny.yaml", target, draft, max_draft_len=2)
    result = runner.invoke(cli, ["bench", str(recipe), "--num-draft-tokens", "1,4"])
    assert result.exit_code == 2 and "max_draft_len 2" in result.output
    result = runner.invoke(cli, ["bench", str(recipe), "--concurrency", "1,x"])
    assert result.exit_code == 2 and "comma-separated" in result.output


def test_bench_refuses_an_out_folder_that_is_not_a_bench_report_before_running(
    runner, tiny_pair, tmp_path, monkeypatch
):
    import trtspec.validate.bench as bench_module

    def no_sweep(*args, **kwargs):
        raise AssertionError("the sweep ran before --out was checked")

    monkeypatch.setattr(bench_module, "run_sweep", no_sweep)
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
