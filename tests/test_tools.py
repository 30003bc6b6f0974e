"""The scripts under tools/ at their command line: --help describes each, bad input is refused in one line before
anything is loaded or started, an expected trtspec error is one line rather than a traceback, and what each
benchmark compares is alike on both sides (the runs these tools time take minutes and are not run here)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

# tool -> the function that reads its command line
PARSERS = {
    "bench_align": "main",
    "bench_engine": "parse_args",
    "bench_othertok": "main",
    "bench_real_sizes": "parse_args",
    "bench_served_adaptive": "parse_args",
    "bench_triton": "build_parser",
    "client": "parse_args",
    "bench_cold_batches": "parse_args",
    "fetch_real_model": "main",
    "replay_adaptive": "main",
    "soak": "parse_args",
    "train_demo_pair": "parse_args",
}


def load_tool(name: str, monkeypatch) -> types.ModuleType:
    """tools/<name>.py as a module, its folder on sys.path as when it runs as a script (tools import neighbours)."""
    monkeypatch.syspath_prepend(str(TOOLS))
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def usage_error(capsys, call) -> str:
    """The one error line argparse prints for ``call()`` (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1, lines
    return lines[0]


def words(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- what every tool shares


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_describes_the_tool_with_its_docstrings_first_paragraph(name, monkeypatch, capsys):
    tool = load_tool(name, monkeypatch)
    reader = getattr(tool, PARSERS[name])
    with pytest.raises(SystemExit) as exit_info:
        reader().parse_args(["--help"]) if name == "bench_triton" else reader(["--help"])
    assert exit_info.value.code == 0
    first = words(tool.__doc__.split("\n\n")[0])
    assert len(first) > 40 and first in words(capsys.readouterr().out)


def test_an_expected_error_is_one_line_with_its_exit_status_and_a_bug_still_a_traceback(monkeypatch, capsys):
    from trtspec.core.errors import RecipeError

    common = load_tool("cli_common", monkeypatch)

    def bad_recipe():
        raise RecipeError("x.yaml", "draft", "missing")

    with pytest.raises(SystemExit) as exit_info:
        common.run_main(bad_recipe)
    assert exit_info.value.code == RecipeError.exit_code
    assert capsys.readouterr().err == "Error: x.yaml: draft: missing\n"
    with pytest.raises(KeyError):
        common.run_main(lambda: {}["bug"])
    with pytest.raises(SystemExit) as exit_info:
        common.run_main(lambda: 1)  # a tool's own status (a soak check failed)
    assert exit_info.value.code == 1


def test_a_tool_given_a_recipe_that_does_not_exist_says_so_in_one_line(tmp_path):
    missing = tmp_path / "missing.yaml"
    done = subprocess.run(
        [sys.executable, str(TOOLS / "soak.py"), "--recipe", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: ") and str(missing) in done.stderr and done.stderr.count("\n") == 1


def test_a_comma_list_names_its_bad_item(monkeypatch, capsys):
    common = load_tool("cli_common", monkeypatch)
    parse = common.comma_list(common.at_least(1), "a number of 1 or more")
    assert parse("1, 4,16") == [1, 4, 16]
    with pytest.raises(argparse.ArgumentTypeError, match="'x' in '1,x' is not a number of 1 or more"):
        parse("1,x")
    soak = load_tool("soak", monkeypatch)
    line = usage_error(capsys, lambda: soak.parse_args(["--lengths", "16,0"]))
    assert "--lengths: '0' in '16,0' is not a max_tokens (1 or more)" in line
    served = load_tool("bench_served_adaptive", monkeypatch)
    assert served.parse_args(["--ks", "0,4", "--concurrency", "2"]).ks == [0, 4]
    assert "'two'" in usage_error(capsys, lambda: served.parse_args(["--concurrency", "1,two"]))
    assert "'x'" in usage_error(capsys, lambda: served.parse_args(["--cpu-threads", "x"]))


def test_the_cpu_model_is_read_in_one_place_and_every_benchmark_prints_it():
    defining = [p.name for p in TOOLS.glob("*.py") if "def cpu_name" in p.read_text()]
    assert defining == ["cli_common.py"]
    benches = ["bench_align", "bench_engine", "bench_othertok", "bench_real_sizes", "bench_served_adaptive"]
    for name in [*benches, "bench_triton", "train_demo_pair"]:
        assert "cpu_name()" in (TOOLS / f"{name}.py").read_text(), name


def test_every_tool_that_starts_a_server_takes_ctrl_c_as_serve_does(monkeypatch):
    """A Ctrl-C landing inside a poll of the server process could hang the tool's stop for good; serve's handler
    holds it back for the instant of the poll (core/interrupts.stop_signals_held)."""
    from trtspec.core.interrupts import stop_or_hold, stop_signals_held

    starting = sorted(p.stem for p in TOOLS.glob("*.py") if "TritonServer(" in p.read_text())
    assert starting == ["bench_served_adaptive", "bench_triton", "soak"]
    for name in starting:
        text = (TOOLS / f"{name}.py").read_text()
        assert text.index("stop_like_serve()") < text.index("TritonServer("), name
    common = load_tool("cli_common", monkeypatch)
    before = signal.getsignal(signal.SIGINT)
    try:
        common.stop_like_serve()
        assert signal.getsignal(signal.SIGINT) is stop_or_hold
        held = []
        with pytest.raises(KeyboardInterrupt), stop_signals_held():
            signal.raise_signal(signal.SIGINT)
            held.append("the block went on")  # and the interrupt came as it ended
        assert held
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------- bench_engine


def test_bench_cold_batches_refuses_a_bad_share_and_too_few_distinct_prompts(monkeypatch, capsys):
    tool = load_tool("bench_cold_batches", monkeypatch)
    line = usage_error(capsys, lambda: tool.parse_args(["--shares", "0.3,1.5"]))
    assert "'1.5' in '0.3,1.5' is not a share in 0..1" in line
    line = usage_error(capsys, lambda: tool.parse_args(["--batch", "8", "--groups", "2"]))
    assert "--batch 8 x --groups 2 needs 16 distinct prompts; raw has 10" in line


def test_bench_engine_refuses_a_k_below_one(monkeypatch, capsys):
    tool = load_tool("bench_engine", monkeypatch)
    assert "--ks 0: K is 1 or more" in usage_error(capsys, lambda: tool.parse_args(["--ks", "0", "2"]))
    assert tool.parse_args(["--ks", "1", "4"]).ks == [1, 4]


def test_bench_engine_has_hf_generate_every_token_of_the_budget_as_the_engine_does(monkeypatch):
    """The engine ignores EOS; HF generate must not stop at one either, or the ratios compare other lengths."""
    import torch

    tool = load_tool("bench_engine", monkeypatch)
    calls = []

    class Target:
        device = torch.device("cpu")

        def generate(self, ids, **kwargs):
            calls.append(kwargs)
            return torch.cat([ids, torch.zeros(1, 2, dtype=torch.long)], dim=1)  # stopped early, at EOS

    tool.hf_tokens_per_s(Target(), [[1, 2, 3]], 5, assistant_model="draft")
    assert calls and all(c["min_new_tokens"] == c["max_new_tokens"] == 5 for c in calls)
    assert all(c["assistant_model"] == "draft" for c in calls)


# ---------------------------------------------------------------- bench_triton


def test_bench_triton_refuses_more_streams_than_the_recipes_batch_before_starting(monkeypatch, capsys):
    tool = load_tool("bench_triton", monkeypatch)
    cli = tool.build_parser()
    line = usage_error(capsys, lambda: tool.recipe_for(cli.parse_args(["--concurrency", "17"]), cli))
    assert "--concurrency 17" in line and "0..16 (limits.max_batch_size)" in line
    recipe = tool.recipe_for(cli.parse_args(["--concurrency", "16", "--cpu-threads", "1"]), cli)
    assert recipe.triton.cpu_threads == 1
    assert "'0'" in usage_error(capsys, lambda: cli.parse_args(["--cpu-threads", "0"]))


def test_bench_triton_loads_the_engine_the_server_runs(monkeypatch):
    """As the torch runtime's entry model: the served length, and what the recipe says of its proposer, K policy
    and draft tokenizer, a recipe without a draft included."""
    import torch

    from trtspec.engines.engine import served_max_seq_len
    from trtspec.recipe import load_recipe

    tool = load_tool("bench_triton", monkeypatch)
    threads = torch.get_num_threads()
    try:
        demo = load_recipe("demo")
        speculative = demo.speculative.model_copy(update={"proposer": "ngram"})
        lookup_alone = demo.model_copy(update={"draft": None, "speculative": speculative})
        engine = tool.load_engine(lookup_alone)
        assert engine.draft is None and engine.proposer == "ngram"
        served = served_max_seq_len(demo.limits.max_seq_len, demo.speculative.max_draft_len)
        assert engine.max_seq_len == served
        other = load_recipe(ROOT / "builders" / "demo-othertok.yaml")
        if not Path(other.draft.model).is_dir():
            pytest.skip("draft-othertok not trained")
        assert tool.load_engine(other).translator is not None
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- bench_real_sizes


def test_bench_real_sizes_refuses_what_a_demo_pair_would_ignore(monkeypatch, capsys):
    tool = load_tool("bench_real_sizes", monkeypatch)
    argv = ["--pair", "demo-othertok", "--weights", "echo", "--prompt-len", "32"]
    line = usage_error(capsys, lambda: tool.parse_args(argv))
    assert "--pair demo-othertok" in line and "--weights, --prompt-len" in line
    assert tool.parse_args(["--pair", "demo", "--batch", "2"]).batch == 2
    assert tool.parse_args(["--weights", "echo", "--prompt-len", "32"]).prompt_len == 32  # random models


@pytest.mark.parametrize("pair", ["demo", "demo-othertok"])
def test_bench_real_sizes_gives_every_demo_pair_the_real_prompts(pair, monkeypatch):
    from transformers import AutoTokenizer

    from trtspec.recipe import DEMO_DIR

    tool = load_tool("bench_real_sizes", monkeypatch)
    from bench_engine import PROMPTS

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    engine = types.SimpleNamespace(tokenizer=tokenizer)
    prompts = tool.batch_prompts(engine, tool.parse_args(["--pair", pair, "--batch", "2"]))
    assert prompts == [tokenizer(text)["input_ids"] for text in PROMPTS[:2]]


# ---------------------------------------------------------------- bench_align


def test_bench_align_logs_align_progress_by_the_tenth(monkeypatch, capsys):
    tool = load_tool("bench_align", monkeypatch)
    on_progress = tool.progress_log()
    for done in range(101):
        on_progress("data", "data", done, 100)
    for done in range(3):
        on_progress("train", "training", done, 2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 11 + 3 and lines[-1].endswith("training: 2/2")


def test_bench_align_reuses_a_finished_misaligned_draft_and_rewrites_anything_else(monkeypatch, tmp_path):
    tool = load_tool("bench_align", monkeypatch)
    out = tmp_path / "misaligned"
    out.mkdir()
    (out / "left-over.bin").write_text("an interrupted run's")
    assert tool.misaligned_draft(out, 0) == out  # a --work used before
    assert not (out / "left-over.bin").exists() and (out / "config.json").is_file()
    assert json.loads((out / "bench_align.json").read_text()) == {"steps": 0, "seed": 0}
    weights = sorted(out.glob("*.safetensors"))
    stamp = [p.stat().st_mtime_ns for p in weights]
    assert tool.misaligned_draft(out, 0) == out
    assert [p.stat().st_mtime_ns for p in weights] == stamp  # not trained again


# ---------------------------------------------------------------- demo.sh


def test_demo_sh_checks_the_recipe_before_anything_reads_it(tmp_path):
    """A recipe trtspec check refuses stops the demo with check's own line, not a traceback from reading it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    trtspec = bin_dir / "trtspec"
    trtspec.write_text('#!/bin/sh\necho "Error: $2: the recipe file does not exist" >&2\nexit 2\n')
    trtspec.chmod(0o755)
    python = bin_dir / "python"  # the one the script would read the recipe with (this venv's)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(TOOLS / "demo.sh"), str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "the recipe file does not exist" in done.stderr
