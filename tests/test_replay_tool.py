"""tools/replay_adaptive.py's replay on synthetic acceptance traces (no model): a steady load keeps its slots
full, lockstep groups start together and shrink as rows finish, and group_k is given the rows' tokens left."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from trtspec.engines.adaptive import KPolicy, group_k

TOOL = Path(__file__).resolve().parents[1] / "tools" / "replay_adaptive.py"


@pytest.fixture(scope="module")
def replay_tool():
    spec = importlib.util.spec_from_file_location("replay_adaptive", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recording(calls):
    def choose(rows, size, costs, remaining, spread):
        calls.append((size, None if remaining is None else list(remaining)))
        return group_k(rows, size, costs, remaining, spread)

    return choose


def test_lockstep_groups_start_together_shrink_and_are_judged_by_the_tokens_left(replay_tool):
    # four prompts: two the draft always matches, two it never does (8 positions each)
    matches = [[True] * 8, [False] * 8, [True] * 8, [False] * 8]
    costs = [1.0] + [1.1 + 0.1 * k for k in range(1, 5)]
    calls = []
    replay_tool.replay(matches, costs, 2, _recording(calls), KPolicy(), load="groups")
    sizes = [size for size, _ in calls]
    # a group of 2 starts only when the last has finished, and a row left alone is its own group (no tokens left to
    # judge by): the batch never grows back to 2 before a group's first round
    assert max(sizes) == 2 and 1 in sizes
    for (size, left), (next_size, next_left) in zip(calls, calls[1:], strict=False):
        assert left is None if size == 1 else len(left) == size
        if next_size > size:
            assert next_left == [8, 8]
    first_of_each_pass = [left for size, left in calls if left == [8, 8]]
    assert len(first_of_each_pass) == 4  # two groups per pass, two passes

    steady = []
    replay_tool.replay(matches, costs, 2, _recording(steady), KPolicy())
    assert all(left is None for _, left in steady)
    # under a steady load the next prompt joins as soon as a slot frees: the batch stays at 2 until the queue runs out
    assert [size for size, _ in steady].count(1) < sizes.count(1)


def test_static_k_in_groups_costs_the_slowest_row(replay_tool):
    """Static K=1 on a group whose rows accept all and nothing: the group lasts as long as the row that accepts
    nothing (8 rounds at K=1's cost), where target-only takes 8 rounds at 1: K=1 loses in groups."""
    matches = [[True] * 8, [False] * 8]
    costs = [1.0, 1.5]
    one = replay_tool.replay(matches, costs, 2, lambda *_: 1, KPolicy(), load="groups")[0]
    zero = replay_tool.replay(matches, costs, 2, lambda *_: 0, KPolicy(), load="groups")[0]
    assert zero == pytest.approx(2.0)  # two rows, a token each per round at cost 1
    assert one < zero
