"""Honest figures for a small run: `validate` warms each system up before it times it, and reports no tokens/s or
speedup when the timed runs generated too few tokens for a rate to mean anything (with the reason as a note)."""

from __future__ import annotations

import json

import pytest
from test_validate import write_recipe

from trtspec.cli import cli
from trtspec.validate.systems import MIN_TIMED_TOKENS, speed_withheld


def test_speed_is_withheld_below_the_minimum_of_timed_tokens():
    assert speed_withheld(MIN_TIMED_TOKENS) is None
    reason = speed_withheld(MIN_TIMED_TOKENS - 1)
    assert f"generated {MIN_TIMED_TOKENS - 1} tokens, fewer than the {MIN_TIMED_TOKENS}" in reason
    assert "--max-tokens" in reason and "\n" not in reason


class Recording:
    """A system that records every call (batch size, max_new_tokens, num_draft_tokens) before passing it on."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.max_draft_len, self.max_batch_size = (
            "recording",
            inner.max_draft_len,
            inner.max_batch_size,
        )
        self.fixed_k, self.adaptive = inner.fixed_k, inner.adaptive

    def generate(self, requests, params):
        self.calls.append((len(requests), params.max_new_tokens, params.num_draft_tokens))
        return self.inner.generate(requests, params)

    def close(self):
        self.inner.close()


def test_each_mode_is_warmed_up_before_it_is_timed(tiny_pair, tmp_path):
    """One short untimed request speculative, then one target-only, before the timed runs (first-call costs:
    allocations, caches, lazy initialisation, stay out of the timing)."""
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import SystemOptions, open_reference, open_system
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.validation import run_validation

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", *tiny_pair))
    system = Recording(open_system(recipe, SystemOptions()))
    run_validation(system, open_reference(recipe, SystemOptions()), load_prompts(limit=2), max_new_tokens=12,
                   num_draft_tokens=3)  # fmt: skip
    assert system.calls == [(1, 4, 3), (1, 4, 0), (2, 12, 3), (2, 12, 0)]


def run_validate(runner, tiny_pair, tmp_path, prompts: int, *options):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"def f{i}(a, b):"}) + "\n" for i in range(prompts)))
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair)
    result = runner.invoke(cli, ["validate", str(recipe), "--prompts", str(path), *options])
    assert result.exit_code == 0, result.output
    return result


def test_one_short_prompt_reports_no_speed_and_says_why(runner, tiny_pair, tmp_path):
    table = run_validate(runner, tiny_pair, tmp_path, 1, "--max-tokens", "8").output
    assert "speedup" in table and not any(line.rstrip(" │").endswith("x") for line in table.splitlines())
    assert "note: tokens/s and speedup are not reported: the timed run generated" in table
    # nor per prompt (a rate over fewer tokens still), in the table, the JSON and the report
    tok_s = table.splitlines()[[i for i, line in enumerate(table.splitlines()) if "tok/s" in line][0] + 2]
    assert tok_s.rstrip(" │").endswith("-"), table
    markdown = tmp_path / "r.md"
    report = run_validate(
        runner, tiny_pair, tmp_path, 1, "--max-tokens", "8", "--json", "--report", str(markdown)
    )
    payload = json.loads(report.stdout)
    overall = payload["overall"]
    assert overall["tokens_per_s"] is None and overall["speedup"] is None
    assert any("not reported" in note for note in payload["notes"])
    assert payload["prompts"][0]["tokens_per_s"] is None and payload["stats"]["tokens_per_s"] is None
    (row,) = [line for line in markdown.read_text().splitlines() if line.startswith("| p0 ")]
    assert row.endswith("| - |")


def test_a_report_file_that_is_not_a_validate_report_is_kept_unless_forced(runner, tiny_pair, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair)
    args = ["validate", str(recipe), "--limit", "1", "--max-tokens", "4", "--report", str(notes)]
    refused = runner.invoke(cli, args)
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert f"--report {notes} exists and is not a trtspec validate report" in refused.output
    assert notes.read_text() == "my notes\n"
    assert runner.invoke(cli, [*args, "--force"]).exit_code == 0
    assert notes.read_text().startswith("# trtspec validate:")
    assert runner.invoke(cli, args).exit_code == 0  # an earlier report is replaced as before


def test_enough_timed_tokens_report_the_speed(runner, tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setattr("trtspec.validate.systems.MIN_TIMED_TOKENS", 8)  # 2 prompts x 8 tokens, unless at eos
    report = run_validate(runner, tiny_pair, tmp_path, 2, "--max-tokens", "8", "--json")
    payload = json.loads(report.stdout)
    assert sum(p["generated_tokens"] for p in payload["prompts"]) >= 8
    assert payload["overall"]["tokens_per_s"] > 0 and payload["overall"]["speedup"] > 0
    assert all(p["tokens_per_s"] > 0 for p in payload["prompts"]) and payload["stats"]["tokens_per_s"] > 0
    assert not any("not reported" in note for note in payload["notes"])


@pytest.mark.parametrize("tokens", [MIN_TIMED_TOKENS - 1, MIN_TIMED_TOKENS])
def test_the_target_only_run_counts_too(tokens):
    """Both timed runs need the minimum: the speedup divides one by the other."""
    from test_validate_core import _result

    result = _result([[5] * MIN_TIMED_TOKENS], [[5] * tokens], [[5] * MIN_TIMED_TOKENS])
    assert (result.speed_withheld is None) == (tokens >= MIN_TIMED_TOKENS)
    assert (result.tokens_per_s is None) == (tokens < MIN_TIMED_TOKENS)
