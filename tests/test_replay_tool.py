"""tools/replay_adaptive.py's replay on synthetic acceptance traces (no model): a steady load keeps its slots
full, lockstep groups start together and shrink as rows finish, and group_k is given the rows' tokens left. And
what it refuses before loading a model: a bench run without the concurrencies asked for, a recipe it cannot
replay, a --costs line that is not two numbers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from trtspec.engines.adaptive import KPolicy, group_k

TOOL = Path(__file__).resolve().parents[1] / "tools" / "replay_adaptive.py"


@pytest.fixture(scope="module")
def replay_tool():
    sys.path.insert(0, str(TOOL.parent))  # the tool imports cli_common, its neighbour
    try:
        spec = importlib.util.spec_from_file_location("replay_adaptive", TOOL)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(TOOL.parent))


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


def _point(k, concurrency, tokens_per_s, proposer="draft", tokens_per_round=2.0):
    """A bench.json point as BenchResult.rows() writes it (target-only has no proposer)."""
    return {
        "num_draft_tokens": k,
        "concurrency": concurrency,
        "tokens_per_s": tokens_per_s,
        "tokens_per_round": 1.0 if k == 0 else tokens_per_round,
        "proposer": None if k == 0 else proposer,
    }


def _bench(tmp_path, points) -> Path:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"points": points}))
    return path


def test_bench_costs_come_from_the_draft_models_points_only(replay_tool, tmp_path):
    """A sweep of proposers has prompt lookup's points at the same K: their rounds cost another amount and must
    not overwrite the draft's."""
    points = [_point(0, 1, 100.0), _point(1, 1, 150.0), _point(1, 1, 400.0, proposer="ngram")]
    points += [_point(None, 1, 160.0), _point(1, 1, 120.0, proposer="draft+ngram")]
    costs = replay_tool.bench_costs(_bench(tmp_path, points))
    # K=1: 2 tokens a round at 150 tokens/s against target-only's 1 at 100
    assert costs == {1: [1.0, pytest.approx(2.0 / 150.0 / (1.0 / 100.0))]}


def test_a_concurrency_the_bench_run_lacks_is_refused_naming_the_ones_it_has(replay_tool, tmp_path):
    path = _bench(tmp_path, [_point(k, c, 100.0 + k) for c in (1, 4) for k in (0, 1)])
    with pytest.raises(SystemExit, match="to replay at concurrency 2,8; it has them at concurrency 1,4"):
        replay_tool.main([str(replay_tool.DEMO_RECIPE), "--bench", str(path), "--concurrency", "1,2,8"])
    assert replay_tool.replayed(path, replay_tool.bench_costs(path), None) == [1, 4]  # default: all measured
    lookup_only = _bench(tmp_path, [_point(0, 1, 100.0), _point(1, 1, 150.0, proposer="ngram")])
    with pytest.raises(SystemExit, match="no draft points to replay; it has them at concurrency none"):
        replay_tool.main([str(replay_tool.DEMO_RECIPE), "--bench", str(lookup_only)])


def test_a_bench_file_that_is_missing_or_not_a_report_is_one_line(replay_tool, tmp_path):
    demo = str(replay_tool.DEMO_RECIPE)
    with pytest.raises(SystemExit, match="nope.json: No such file or directory; give the bench.json"):
        replay_tool.main([demo, "--bench", str(tmp_path / "nope.json")])
    for name, text, why in (
        ("broken.json", "{", "not JSON"),
        ("other.json", '{"results": []}', "no points list"),
        ("list.json", "[1]", "no points list"),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(SystemExit, match=f"{name}: {why}"):
            replay_tool.main([demo, "--bench", str(tmp_path / name)])


def test_a_recipe_without_a_draft_or_with_a_draft_of_its_own_tokenizer_is_refused(replay_tool):
    from trtspec.recipe import load_recipe

    recipe = load_recipe(replay_tool.DEMO_RECIPE)
    other = recipe.speculative.model_copy(update={"heterogeneous_vocab": True})
    with pytest.raises(SystemExit, match="has its own tokenizer"):
        replay_tool.refuse_recipe(recipe.model_copy(update={"speculative": other}))
    with pytest.raises(SystemExit, match="no draft model"):
        replay_tool.refuse_recipe(recipe.model_copy(update={"draft": None}))
    replay_tool.refuse_recipe(recipe)  # the demo pair replays


def test_a_costs_line_that_is_not_two_numbers_is_one_usage_line(replay_tool, capsys):
    with pytest.raises(SystemExit) as exit_info:
        replay_tool.main(["--costs", "1.3:0.15,1.3", "--concurrency", "1"])
    assert exit_info.value.code == 2
    assert "'1.3' in '1.3:0.15,1.3' is not A1:B" in capsys.readouterr().err


def test_adaptive_rows_probe_as_the_loops_do_and_static_rows_never(replay_tool):
    """Six prompts the draft never matches, then two it always does: the pool the later rows start from says
    drafting does not pay, and only probes (one token in probe_every rounds, as the loop's rows draft) measure
    again, where without them no row would ever draft. A static K=0 never probes."""
    matches = [[False] * 64] * 6 + [[True] * 64] * 2
    costs = [1.0] + [1.2 + 0.2 * k for k in range(1, 5)]
    for load, concurrency in (("streams", 1), ("groups", 1), ("groups", 2)):  # 2: the waited group's prober
        _, mean_k, off = replay_tool.replay(matches, costs, concurrency, group_k, KPolicy(), load=load)
        assert mean_k > 0 and off < 1, (load, concurrency)
    assert replay_tool.replay(matches, costs, 1, lambda *_: 0, KPolicy(), probing=False)[1:] == (0.0, 1.0)
