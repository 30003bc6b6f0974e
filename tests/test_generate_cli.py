"""`trtspec generate` through Click's CliRunner on tiny models: streamed text, --json, one-line errors."""

from __future__ import annotations

import json

import pytest
from test_engine import hf_greedy
from tiny_models import make_model, make_tokenizer

from trtspec.cli import cli


def generate_args(target, draft, prompt: str = "x", max_new_tokens: int = 2) -> list[str]:
    """`trtspec generate` over a --target / --draft pair, as the error tests run it."""
    return [*("generate", "--target", str(target), "--draft", str(draft)), "--prompt", prompt,
            "--max-new-tokens", str(max_new_tokens)]  # fmt: skip


def run_trtspec(*args: str, timeout: float = 300):
    """``trtspec`` in a process of its own (what a user's shell sees: the exit status and both streams)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args], capture_output=True, text=True, timeout=timeout
    )


def test_generate_json_is_exact_and_carries_stats(runner, tiny_pair):
    target, draft = tiny_pair
    args = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompt",
        "def add(a, b):",
        "--max-new-tokens",
        "12",
        "--num-draft-tokens",
        "3",
        "--json",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["token_ids"] == hf_greedy(target, payload["prompt_token_ids"], 12)
    assert payload["stats"]["drafted"] > 0 and payload["stats"]["target_forwards"] >= 1
    assert set(payload) >= {"text", "token_ids", "finish_reason", "stats"}
    # the counters the Triton entry models export, under the same names
    spec = payload["stats"]["spec_decode"]
    assert spec["num_draft_tokens"] == payload["stats"]["drafted"]
    assert spec["num_drafts"] + spec["num_rounds_without_speculation"] == payload["stats"]["target_forwards"]
    # which K each round ran with: pinned 3, less only where max_new_tokens leaves fewer
    hist = payload["stats"]["num_draft_histogram"]
    assert sum(hist) == payload["stats"]["target_forwards"] and len(hist) == 4 and hist[3] >= 1


def test_generate_streams_text_then_stats(runner, tiny_pair):
    target, draft = tiny_pair
    args = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompt",
        "for i in",
        "--max-new-tokens",
        "8",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "acceptance rate" in result.output and "tokens/s" in result.output
    assert "K per round (target forwards that verified 0, 1, .. draft tokens): [" in result.output
    as_json = json.loads(runner.invoke(cli, [*args, "--json"]).stdout)
    assert result.output.startswith(as_json["text"])


def test_generate_no_draft_is_target_only(runner, tiny_pair):
    args = [
        "generate",
        "--target",
        str(tiny_pair[0]),
        "--no-draft",
        "--prompt",
        "x",
        "--max-new-tokens",
        "4",
        "--json",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["drafted"] == 0


def test_generate_no_draft_on_a_recipe_with_k_is_target_only(runner):
    """The demo recipe serves K=4; --no-draft still means target-only, not a refused K."""
    args = [
        "generate",
        "--recipe",
        "demo",
        "--no-draft",
        "--prompt",
        "def f(x):",
        "--max-new-tokens",
        "4",
        "--json",
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["drafted"] == 0 and stats["draft_forwards"] == 0


def test_a_prompt_over_the_recipes_max_input_len_is_one_line_everywhere(runner, tmp_path):
    """generate checks limits.max_input_len as validate and bench do, and a prompt longer than the tokenizer's
    model_max_length adds no transformers warning to the line."""
    text = (
        "def f(x):\n    return x\n" * 200
    )  # 1801 demo tokens: over the demo's 384, and its tokenizer's 1024
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": text}) + "\n")
    for args in (
        ["generate", "--prompt", text, "--max-new-tokens", "4"],
        ["validate", "demo", "--prompts", str(prompts), "--max-tokens", "4"],
        ["bench", "demo", "--prompts", str(prompts), "--max-tokens", "4", "--out", str(tmp_path / "b")],
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, (args[0], result.output)
        assert result.output.count("\n") == 1 and "limits.max_input_len 384" in result.output, result.output
    assert not (tmp_path / "b").exists()
    # the warning itself, caught where transformers logs it
    import logging

    from trtspec.core.model_dir import load_tokenizer
    from trtspec.recipe import load_recipe

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.tokenization_utils_base")
    logger.addHandler(handler)
    try:
        tokenizer = load_tokenizer(load_recipe("demo").target.model)
        assert len(tokenizer(text)["input_ids"]) > tokenizer.model_max_length
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records if "longer than the specified maximum" in r.getMessage()]


def test_generate_errors_are_one_line(runner, tiny_pair, tmp_path):
    target, draft = tiny_pair
    base = ["generate", "--prompt", "x", "--target"]
    cases = {
        "--num-draft-tokens 9 is above max_draft_len 8 (generate's default without a recipe); pass --max-draft-len "
        "9 or pass --num-draft-tokens 8": [
            *base,
            str(target),
            "--draft",
            str(draft),
            "--num-draft-tokens",
            "9",
        ],
        # the demo recipe's K 2 over the option's 1, named before any model loads
        "the recipe's num_draft_tokens 2 is above --max-draft-len 1; raise --max-draft-len to 2 or pass "
        "--num-draft-tokens 1": ["generate", "--prompt", "x", "--max-draft-len", "1"],
        "no config.json": [*base, str(tmp_path), "--draft", str(draft)],
        "needs --draft": [*base, str(target)],
        "--draft DIR needs --target DIR": ["generate", "--prompt", "x", "--draft", str(draft)],
        "--prompt is empty": ["generate", "--prompt", "", "--target", str(target), "--draft", str(draft)],
        "an empty stop string": [*base, str(target), "--draft", str(draft), "--stop", "a", "--stop", ""],
    }
    other = make_model(
        tmp_path / "other",
        "llama",
        tokenizer_dir=make_tokenizer(tmp_path / "tok", vocab_size=300) and tmp_path / "tok",
    )
    cases["tokenizers differ"] = [*base, str(target), "--draft", str(other)]
    cases["--num-draft-tokens 3 needs a draft"] = [
        *base,
        str(target),
        "--no-draft",
        "--num-draft-tokens",
        "3",
    ]
    cut = tmp_path / "cut"
    cut.mkdir()
    for path in draft.iterdir():
        (cut / path.name).write_bytes(path.read_bytes())
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cases["cut: cannot load the model (SafetensorError: Error while deserializing header"] = [
        *base,
        str(target),
        "--draft",
        str(cut),
    ]
    for needle, args in cases.items():
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, (needle, result.output)
        assert needle in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    result = runner.invoke(cli, ["serve", str(tmp_path), "--http-port", "99999"])  # a click usage error
    assert result.exit_code == 2 and "is not in the range 1<=x<=65535" in result.output
    for repo, needle in ((tmp_path / "nowhere", "does not exist"), (tmp_path, "not a model repository")):
        result = runner.invoke(cli, ["serve", str(repo)])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert f"Error: {repo}: {needle}" in result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["generate", "--prompt", "caf\udce9"], "Invalid value for '--prompt': not UTF-8 text (a stray byte at character 3)"),
        (["generate", "--prompt", "x", "--stop", "\udcff"], "Invalid value for '--stop': not UTF-8 text"),
        (["generate", "--prompt", "x", "--seed", str(2**64)], "Invalid value for '--seed': 18446744073709551616 is not"),
        (["generate", "--prompt", "x", "--temperature", "nan"], "Invalid value for '--temperature': 'nan' is not a finite"),
        (["validate", "demo", "--min-acceptance", "nan"], "Invalid value for '--min-acceptance': 'nan' is not a finite"),
        (["check", "demo", "--gpu-memory", "nan"], "Invalid value for '--gpu-memory': 'nan' is not a finite number"),
        (["align", "demo", "--budget", "inf", "--prompts", "p.jsonl"], "'--budget': 'inf' is not a finite number"),
        (["validate", "demo", "--url", "127.0.0.1:99999"], "'127.0.0.1:99999' is not HOST:PORT with a port in 1..65535"),
        (["bench", "demo", "--url", ""], "Invalid value for '--url': --url '' is not HOST:PORT"),
        (["bench", "demo", "--url", "https://h:8000"], "scheme 'https' is not http or grpc"),
        (["bench", "demo", "--draft-cost-ratio", "50"], "'--draft-cost-ratio': 50.0 is not in the range 0<x<=10.0"),
    ],
)  # fmt: skip
def test_option_values_that_would_reach_a_traceback_or_pass_every_check_are_refused(runner, args, said):
    """A shell passes a non-UTF-8 byte as a lone surrogate (a tokenizer's TypeError); a seed past 64 bits overflows
    torch's generator; nan passes every bound comparison, so a threshold of nan would pass every run; tritonclient
    wraps a port past 65535, and an empty --url would run in-process; a draft cost ratio the recipe's field refuses
    would fail --write-recipe only after the whole sweep."""
    result = runner.invoke(cli, args)
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, result.output


def test_urls_are_read_alike_by_the_option_and_the_client():
    from trtspec.validate.triton_client import split_url

    assert split_url("http://h:8000/") == ("http", "h:8000")
    assert split_url("[::1]:8001") == ("grpc", "[::1]:8001")
    assert split_url("grpc://h:8001", "http") == ("http", "h:8001")


def test_a_seed_outside_64_bits_is_refused_by_the_sampling_rules():
    from trtspec.core.errors import RequestError
    from trtspec.engines.sampling import SamplingParams

    for seed in (-1, 2**64):
        with pytest.raises(RequestError, match=r"seed must be in \[0, 2\*\*64\)"):
            SamplingParams(temperature=1.0, seed=seed)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


def test_usage_errors_are_one_line_through_the_entry_point():
    """Click's own usage errors (a bad option value, an unknown command) through ``trtspec`` itself: one line with
    where help is, exit 2; --version and --help still exit 0, and ``trtspec`` alone shows the help."""

    def run(*args):
        proc = run_trtspec(*args, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr.strip().splitlines()

    assert run("bench", "--concurrency", "0") == (
        2,
        "",
        [
            "Error: Invalid value for '--concurrency': '0': give integers >= 1, e.g. 1,2,4; see `trtspec bench --help`"
        ],
    )
    assert run("bogus") == (2, "", ["Error: No such command 'bogus'; see `trtspec --help`"])
    code, out, err = run("--version")
    assert code == 0 and out.startswith("trtspec, version ") and not err
    code, out, _ = run("check", "--help")
    assert code == 0 and out.startswith("Usage: trtspec check")
    code, _, err = run()
    assert code == 2 and err[0].startswith("Usage: trtspec") and "Commands:" in err


def test_a_model_too_large_for_memory_is_one_line_naming_it(tmp_path, tiny_pair):
    """A real allocator refusal in a real process: a draft whose config asks for a 128 TiB MLP. transformers'
    load fails inside from_pretrained, and the line names the folder and memory, not incomplete weights."""
    import shutil

    target, draft = tiny_pair
    big = shutil.copytree(draft, tmp_path / "draft")
    config = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "intermediate_size": 2**40}))
    proc = run_trtspec(*generate_args(target, big))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"Error: {big}: the model does not fit in host memory (can't allocate memory: "
    )
    assert lines[0].endswith("; free memory or use a machine with more")


def test_running_out_of_gpu_memory_is_one_line(tiny_pair, monkeypatch, capsys):
    """A GPU that runs out while the engine sets up (its caches, a batch): torch's own OutOfMemoryError, which only
    a GPU raises for real, ends the command in one line through the entry point, exit 1."""
    import torch

    from trtspec.cli import main
    from trtspec.engines import models

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
            "5.62 MiB is free.\nIncluding non-PyTorch memory, this process has 79.14 GiB memory in use."
        )

    monkeypatch.setattr(models.LeanCausalLM, "__init__", no_room)
    target, draft = tiny_pair
    with pytest.raises(SystemExit) as stop:
        main(generate_args(target, draft))
    assert stop.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "Error: out of GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 5.62 MiB is free.); free the GPU, use a machine with more, or lower the dtype or the "
        "concurrency"
    ]


def test_a_model_too_large_for_its_gpu_is_named(tiny_pair, monkeypatch):
    """The move of a loaded model onto a GPU too small for it (torch's OutOfMemoryError, raised for real only by
    a GPU) names the model's folder."""
    import torch

    from trtspec.core.errors import OutOfMemory
    from trtspec.engines import models

    class LoadedModel:  # what load_hf_model returns, moved as torch moves a module onto a full GPU
        def to(self, device):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")

    monkeypatch.setattr(models, "load_hf_model", lambda *args, **kwargs: LoadedModel())
    target = tiny_pair[0]
    expected = (
        f"{target}: the model does not fit in GPU memory (CUDA out of memory. Tried to allocate 20.00 MiB.); "
        "free the GPU or use a machine with more"
    )
    with pytest.raises(OutOfMemory) as refused:
        models.load_causal_lm(target, device="cuda")
    assert refused.value.message == expected


def test_out_of_memory_names_gpu_or_host_and_nothing_else():
    import torch

    from trtspec.core.model_dir import out_of_memory

    gpu = out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore"))
    assert gpu.message == (
        "out of GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB.); free the GPU, use a machine with "
        "more, or lower the dtype or the concurrency"
    )
    assert gpu.exit_code == 1
    with pytest.raises(RuntimeError) as host:
        torch.empty(2**50)
    assert out_of_memory(host.value, "m: the draft").message.startswith(
        "m: the draft does not fit in host memory (can't allocate memory: you tried to allocate "
    )
    assert out_of_memory(MemoryError(), "f.bin").message == (
        "f.bin does not fit in host memory (MemoryError); free memory or use a machine with more"
    )
    assert out_of_memory(RuntimeError("shape mismatch")) is None and out_of_memory(ValueError("x")) is None


def test_weight_files_too_large_to_read_are_not_called_corrupt(tmp_path, monkeypatch):
    """A .bin state dict or a checkpoint rank read when host memory runs out (torch's CPU allocator's own error,
    raised here where the machine cannot be made to run out): named as memory, not as a broken file."""
    import safetensors.torch
    import torch

    from trtspec.builders import interpreter
    from trtspec.core.errors import OutOfMemory
    from trtspec.core.model_dir import _load_state_dict

    with pytest.raises(RuntimeError) as refusal:
        torch.empty(2**50)

    def no_room(*args, **kwargs):
        raise refusal.value

    monkeypatch.setattr(torch, "load", no_room)
    monkeypatch.setattr(safetensors.torch, "load_file", no_room)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "rank0.safetensors").write_bytes(b"")
    for read, path in [
        (lambda: _load_state_dict(tmp_path / "pytorch_model.bin"), tmp_path / "pytorch_model.bin"),
        (lambda: interpreter.read_ranks(tmp_path, 1), tmp_path / "rank0.safetensors"),
    ]:
        with pytest.raises(
            OutOfMemory, match=rf"^{path} does not fit in host memory \(can't allocate memory: "
        ):
            read()


def test_generate_without_a_recipe_stays_within_the_models_positions(runner, tiny_pair, tmp_path):
    """--target/--draft folders bring no limits.max_seq_len: the length is the smaller model's
    max_position_embeddings (past it a model's output is not defined), said before either model loads."""
    import shutil

    target, draft = tiny_pair
    short = shutil.copytree(draft, tmp_path / "draft")
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 24}))
    base = ["generate", "--target", str(target), "--draft", str(short), "--prompt", "def add(a, b):"]
    result = runner.invoke(cli, [*base, "--max-new-tokens", "40"])
    assert result.exit_code == 2, result.output
    prompt_tokens = int(result.output.split(": ")[2].split()[0])
    assert result.output.strip() == (
        f"Error: --prompt: {prompt_tokens} tokens + max_new_tokens 40 > max_seq_len 24; it is "
        f"max_position_embeddings of {short}; lower --max-new-tokens or shorten the prompt"
    )
    fits = runner.invoke(cli, [*base, "--max-new-tokens", str(24 - prompt_tokens), "--json"])
    assert fits.exit_code == 0, fits.output
    assert len(json.loads(fits.stdout)["token_ids"]) <= 24 - prompt_tokens


def test_an_abort_inside_a_command_is_an_interrupt_not_a_memory_error(tiny_pair, monkeypatch, capsys):
    """click.Abort is a RuntimeError (click raises it for Ctrl-C and an end of input): it ends the command as an
    interrupt, exit 130, ahead of the out-of-memory handling that also takes RuntimeErrors."""
    import click

    from trtspec.cli import main
    from trtspec.engines import models

    def abort(*args, **kwargs):
        raise click.Abort()

    monkeypatch.setattr(models.LeanCausalLM, "__init__", abort)
    target, draft = tiny_pair
    with pytest.raises(SystemExit) as stop:
        main(generate_args(target, draft))
    assert stop.value.code == 130 and capsys.readouterr().err.splitlines() == ["Interrupted."]
