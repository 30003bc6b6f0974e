"""tools/bench_served_adaptive.py in its short form against a real tritonserver (the demo pair, torch runtime):
it runs every point at every load step and after a jump, and reports per batch size what adaptive K chose and
why. Its figures are measurements, not asserted here (docs/benchmarks.md records full runs)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtspec.validate.bench import paired_interval

pytestmark = pytest.mark.one_stack  # a bench tool over the served adaptive policy; it asserts no figure

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_served_adaptive.py"


@pytest.fixture
def tool(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOL.parent))  # the tool imports bench_engine, its neighbour
    spec = importlib.util.spec_from_file_location("bench_served_adaptive", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_ratios_compare_adaptive_with_each_point_pass_by_pass(tool):
    """The median of adaptive's pass over the point's pass run beside it, not a ratio of two maxima: a machine
    fast in one pass for every point changes nothing."""
    passes = {"adaptive": [90.0, 200.0, 110.0], 0: [100.0, 200.0, 100.0], 4: [100.0, 100.0, 100.0]}
    assert tool.paired_ratios(passes) == pytest.approx({0: 1.0, 4: 1.1})
    two = {"adaptive": [90.0, 120.0], 0: [100.0, 100.0]}
    assert tool.paired_ratios(two) == pytest.approx({0: 1.05})
    # each ratio's bootstrap interval from six passes on (validate.bench.paired_interval); none from three
    assert tool.paired_intervals(passes) == {}
    six = {"adaptive": [90.0, 200.0, 110.0, 100.0, 95.0, 105.0], 0: [100.0] * 6}
    low, high = tool.paired_intervals(six)[0]
    assert (low, high) == paired_interval(six["adaptive"], six[0]) and 0.9 <= low < 1.0 < high <= 2.0


def test_a_points_figure_is_its_rate_pooled_over_the_passes_not_its_best(tool):
    """A best pass would set adaptive's best of N against the best of the pinned points' 3N: equal speeds with
    noise would read below 1 for adaptive most of the time."""
    assert tool.pooled_rate([(100, 1.0), (100, 0.5), (100, 2.0)]) == pytest.approx(300 / 3.5)


def test_streams_spread_request_lengths_so_no_point_runs_in_lockstep(tool):
    """Under --load streams each request's budget is 0.5x-1.5x --max-tokens, the same sequence for every point, so
    target-only requests do not all end at one round as a lockstep group's do."""
    budgets = [tool.budget(64, i) for i in range(200)]
    assert min(budgets) >= 32 and max(budgets) <= 96 and len(set(budgets)) > 40
    assert budgets == [tool.budget(64, i) for i in range(200)]
    assert abs(sum(budgets) / len(budgets) - 64) < 2  # the mean stays --max-tokens


@pytest.mark.server
@pytest.mark.slow
def test_the_served_sweep_reports_every_point_and_adaptive_ks_choice_per_load():
    command = [sys.executable, str(TOOL), "--concurrency", "1,4", "--ks", "0,2", "--max-tokens", "12"]
    command += ["--jump", "4", "--short", "--json", "--cpu-threads", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [row["concurrency"] for row in result["steps"]] == [1, 4]
    for row in result["steps"]:
        assert set(row["tokens_per_s"]) == {"adaptive", "0", "2"} and min(row["tokens_per_s"].values()) > 0
        assert row["adaptive_vs_best_pinned"] > 0 and row["adaptive_vs_target_only"] > 0
        assert set(row["paired_vs_pinned"]) == {"0", "2"} and min(row["paired_vs_pinned"].values()) > 0
        assert row["paired_interval_vs_pinned"] == {}  # one pass (--short): no interval
        assert {p: len(v) for p, v in row["passes"].items()} == {"adaptive": 1, "0": 1, "2": 1}
        chosen = row["chosen"]  # the server's own account of the batch size's last choice
        assert chosen is not None, f"no adaptive series for batch {row['concurrency']}"
        assert (
            0 <= chosen["k"] <= 8 and sum(chosen["rounds"].values()) > 0 and chosen["measured"] in (0.0, 1.0)
        )
    jump = result["jump"]
    assert jump["chosen"] is not None and jump["chosen"]["rounds"], jump
    assert jump["streams"] == 4 and jump["adaptive_vs_target_only"] > 0
    # the first group after the jump against target-only's first group on its own fresh server
    assert (
        jump["groups_vs_target_only"] == [jump["first_group_vs_target_only"]]
        and jump["target_only_tokens_per_s"] > 0
    )
    assert result["cpu"]


@pytest.mark.server
@pytest.mark.slow
def test_the_served_sweep_under_a_steady_load_of_client_streams():
    command = [
        sys.executable,
        str(TOOL),
        "--concurrency",
        "2",
        "--ks",
        "0",
        "--max-tokens",
        "8",
        "--jump",
        "0",
    ]
    command += ["--short", "--json", "--cpu-threads", "1", "--load", "streams", "--per-stream", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["load"] == "streams" and [row["concurrency"] for row in result["steps"]] == [2]
    row = result["steps"][0]
    assert set(row["passes"]) == {"adaptive", "0"} and min(row["tokens_per_s"].values()) > 0
