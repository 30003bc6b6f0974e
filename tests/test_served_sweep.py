"""tools/bench_served_adaptive.py in its short form against a real tritonserver (the demo pair, torch runtime):
it runs every point at every load step and after a jump, and reports per batch size what adaptive K chose and
why. Its figures are measurements, not asserted here (docs/benchmarks.md records full runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.slow]
TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_served_adaptive.py"


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
        chosen = row["chosen"]  # the server's own account of the batch size's last choice
        assert (
            0 <= chosen["k"] <= 8 and sum(chosen["rounds"].values()) > 0 and chosen["measured"] in (0.0, 1.0)
        )
    jump = result["jump"]
    assert jump["streams"] == 4 and jump["adaptive_vs_target_only"] > 0 and jump["chosen"]["rounds"]
    assert result["cpu"]
