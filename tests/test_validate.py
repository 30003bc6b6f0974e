"""trtspec validate against the in-process engine on tiny models (the demo pair's shape, random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.cli import cli
from trtspec.core.errors import EXIT_CHECK_FAILED, CheckFailed
from trtspec.validate.prompts import load_prompts


def write_recipe(path: Path, target: Path, draft: Path, max_draft_len: int = 4) -> Path:
    path.write_text(
        f"name: tiny\ntarget: {{model: {target}, dtype: float32}}\ndraft: {{model: {draft}, dtype: float32}}\n"
        f"speculative: {{max_draft_len: {max_draft_len}}}\n"
        "limits: {max_batch_size: 4, max_input_len: 128, max_seq_len: 256}\n"
    )
    return path


@pytest.fixture(scope="module")
def recipe_path(tiny_pair, tmp_path_factory) -> Path:
    target, draft = tiny_pair
    return write_recipe(tmp_path_factory.mktemp("recipe") / "tiny.yaml", target, draft)


@pytest.fixture(scope="module")
def engine_and_reference(recipe_path):
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import SystemOptions, open_reference, open_system

    recipe = load_recipe(recipe_path)
    reference = open_reference(recipe, SystemOptions())
    return open_system(recipe, SystemOptions()), reference


class PlantedMismatch:
    """Wraps a system and alters one token of one prompt's speculative output (target-only is left intact)."""

    def __init__(self, inner, prompt_text: str, position: int):
        self.inner, self.prompt_text, self.position = inner, prompt_text, position
        self.name, self.max_draft_len, self.max_batch_size = (
            "planted",
            inner.max_draft_len,
            inner.max_batch_size,
        )
        self.fixed_k = inner.fixed_k

    def generate(self, requests, params):
        generations = self.inner.generate(requests, params)
        if params.num_draft_tokens == 0:
            return generations
        for request, gen in zip(requests, generations, strict=True):
            if request.text == self.prompt_text and len(gen.token_ids) > self.position:
                ids = list(gen.token_ids)
                ids[self.position] = 5 if ids[self.position] != 5 else 6  # 5, 6: ordinary (non-stop) tokens
                gen.token_ids = ids
        return generations

    def close(self):
        pass


class AskedK(PlantedMismatch):
    """Wraps a system and records the K each generate call asked for (alters nothing)."""

    def __init__(self, inner):
        super().__init__(inner, prompt_text="", position=0)
        self.asked: list[int | None] = []

    def generate(self, requests, params):
        self.asked.append(params.num_draft_tokens)
        return self.inner.generate(requests, params)


def test_engine_matches_reference_and_control(engine_and_reference):
    from trtspec.validate.validation import run_validation

    system, reference = engine_and_reference
    prompts, recording = load_prompts(limit=3), AskedK(system)
    for k in (4, None):  # a pinned K, and no K: adaptive K
        recording.asked.clear()
        result = run_validation(recording, reference, prompts, max_new_tokens=12, num_draft_tokens=k)
        # speculative at k (None: the system's adaptive K), and target-only
        assert set(recording.asked) == {k, 0}
        assert result.num_draft_tokens == k
        assert [o.vs_reference.exact_match for o in result.outcomes] == [True, True, True]
        assert result.control_match_rate == 1.0 and result.failures() == []
        assert all(len(o.reference) > 0 for o in result.outcomes)
        # adaptive K may judge this random tiny pair not worth drafting (the engine measured its round costs at
        # K=4 first): exact either way
        assert result.stats.drafted > 0 or k is None
        # 3 prompts x 12 tokens are too few to time (systems.MIN_TIMED_TOKENS): no rate, and a note saying why
        assert result.tokens_per_s is None and result.target_only_tokens_per_s is None
        assert result.speed_withheld in result.notes


def test_validate_defaults_to_adaptive_k_unless_the_recipe_pins_one(runner, tiny_pair, tmp_path, monkeypatch):
    """As deploy writes it: no speculative.num_draft_tokens, no --num-draft-tokens -> None (adaptive K). The real
    run, recorded: the K validate asked of the system, and the K its report names."""
    import trtspec.validate.validation as validation

    seen, real = [], validation.run_validation

    def recorded(system, reference, prompts, *, num_draft_tokens, **kwargs):
        seen.append(num_draft_tokens)
        return real(system, reference, prompts, num_draft_tokens=num_draft_tokens, **kwargs)

    monkeypatch.setattr(validation, "run_validation", recorded)
    target, draft = tiny_pair
    adaptive = write_recipe(tmp_path / "adaptive.yaml", target, draft)
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(
        adaptive.read_text().replace("{max_draft_len: 4}", "{max_draft_len: 4, num_draft_tokens: 3}")
    )
    reported = []
    for recipe, extra in ((adaptive, []), (pinned, []), (adaptive, ["--num-draft-tokens", "2"])):
        args = ["validate", str(recipe), "--limit", "1", "--max-tokens", "4", "--json", *extra]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
        reported.append(json.loads(result.stdout)["num_draft_tokens"])
    assert seen == [None, 3, 2] and reported == ["adaptive", 3, 2]


def test_planted_mismatch_fails_with_first_divergence(engine_and_reference):
    from trtspec.validate.report import validation_markdown
    from trtspec.validate.run_validate import require_passed
    from trtspec.validate.validation import Thresholds, run_validation

    system, reference = engine_and_reference
    prompts = load_prompts(limit=2)
    planted = PlantedMismatch(system, prompts[1].text, position=3)
    result = run_validation(
        planted, reference, prompts, max_new_tokens=10, thresholds=Thresholds(min_exact_match=1.0)
    )
    clean, altered = result.outcomes
    assert clean.vs_reference.exact_match and clean.control.exact_match
    assert altered.vs_reference.first_divergence == 3 and altered.control.first_divergence == 3
    with pytest.raises(
        CheckFailed, match="exact-match rate vs the HF reference 0.500 < --min-exact-match 1.000"
    ) as err:
        require_passed(result)
    assert err.value.exit_code == EXIT_CHECK_FAILED
    assert f"| {prompts[1].id} | NO | 3 |" in validation_markdown(result)


@pytest.mark.parametrize(
    "command, option, inputs",
    [("validate", "--report", ("--prompts", "RECIPE")), ("bench", "--write-recipe", ("--prompts",))],
)
def test_an_output_file_that_is_an_input_is_refused_before_any_work(
    runner, recipe_path, tmp_path, command, option, inputs
):
    """A report never replaces what the run reads; bench may update its recipe in place, never the prompts."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    for output, name in ((prompts, "--prompts"), (recipe_path, "RECIPE")):
        if name not in inputs:
            continue
        before = output.read_text()
        result = runner.invoke(
            cli, [command, str(recipe_path), "--prompts", str(prompts), option, str(output)]
        )
        assert result.exit_code == 2, result.output
        assert f"is the {name} file this run reads" in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1 and output.read_text() == before


@pytest.mark.slow
def test_cli_thresholds_exit_codes_and_reports(runner, recipe_path, tiny_pair, tmp_path):
    # A random draft accepts almost nothing: --min-acceptance fails (exit 1), but the report is still written.
    report = tmp_path / "fail.md"
    args = [
        "validate",
        str(recipe_path),
        "--limit",
        "2",
        "--max-tokens",
        "8",
        "--json",
        "--report",
        str(report),
    ]
    result = runner.invoke(cli, [*args, "--min-acceptance", "0.9"])
    assert result.exit_code == EXIT_CHECK_FAILED, result.output
    payload = json.loads(result.stdout)
    assert payload["passed"] is False and payload["overall"]["exact_match_rate"] == 1.0
    assert "acceptance rate" in payload["failures"][0] and len(payload["prompts"]) == 2
    assert report.read_text().startswith("# trtspec validate")

    # draft == target (the oracle): every draft token is accepted, so the same gate passes; user prompts file.
    target, _ = tiny_pair
    same = write_recipe(tmp_path / "same.yaml", target, target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "add", "prompt": "def add(a, b):"}\n')
    result = runner.invoke(
        cli,
        [
            "validate",
            str(same),
            "--prompts",
            str(prompts),
            "--max-tokens",
            "6",
            "--json",
            "--min-acceptance",
            "0.99",
            "--min-exact-match",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["overall"]["acceptance_rate"] == 1.0 and payload["prompts"][0]["id"] == "add"


def test_cli_bad_prompt_file_is_a_usage_error(runner, recipe_path, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    result = runner.invoke(cli, ["validate", str(recipe_path), "--prompts", str(bad)])
    assert result.exit_code == 2 and "bad.jsonl:1: not valid JSON" in result.output


@pytest.mark.parametrize("command", ["validate", "bench"])
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--system", "engine", "--url", "127.0.0.1:8001"], "--url 127.0.0.1:8001: --system engine runs in-process"),
        (["--protocol", "http"], "--protocol is for a server under test; give --url HOST:PORT or drop it"),
        (["--model", "ensemble"], "--model is for a server under test; give --url HOST:PORT or drop it"),
        (["--system", "triton"], "--system triton needs --url HOST:PORT"),
        (["--num-draft-tokens", "99"], "--num-draft-tokens 99 > the recipe's speculative.max_draft_len 4; use K <= 4"),
    ],
)  # fmt: skip
def test_options_the_run_would_ignore_or_refuse_late_are_refused_before_any_work(
    runner, recipe_path, monkeypatch, command, args, said
):
    """Server options beside an in-process system would measure something other than what was asked (--system
    engine --url runs the engine), and a K over max_draft_len fails in any case: both are said before any model
    loads or any reference runs."""

    def no_requests(*args, **kwargs):
        raise AssertionError("the run started before its options were checked")

    for module in ("run_validate", "run_bench"):
        monkeypatch.setattr(f"trtspec.validate.{module}.load_run_requests", no_requests)
    result = runner.invoke(cli, [command, str(recipe_path), *args])
    assert result.exit_code == 2, result.output
    assert said in result.output and len(result.output.strip().splitlines()) == 1, result.output


def test_prompts_that_do_not_fit_the_limits_fail_before_any_model_loads(
    runner, recipe_path, tmp_path, monkeypatch
):
    import trtspec.validate.run_validate as commands

    def no_system(*args, **kwargs):
        raise AssertionError("a system was opened before the prompt lengths were checked")

    monkeypatch.setattr(commands, "open_system", no_system)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"id": "short", "prompt": "def f():"}\n{"id": "long", "prompt": "' + "x = 1; " * 200 + '"}\n'
    )
    result = runner.invoke(cli, ["validate", str(recipe_path), "--prompts", str(prompts)])
    assert result.exit_code == 2, result.output
    assert "prompt long: " in result.output and "> the recipe's limits.max_input_len 128" in result.output
    result = runner.invoke(
        cli, ["validate", str(recipe_path), "--prompts", str(prompts), "--limit", "1", "--max-tokens", "300"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "prompt short: " in result.output
        and "+ --max-tokens 300 > the recipe's limits.max_seq_len 256" in result.output
    )
    result = runner.invoke(
        cli, ["bench", str(recipe_path), "--prompts", str(prompts), "--limit", "1", "--max-tokens", "300"]
    )
    assert result.exit_code == 2 and "limits.max_seq_len 256" in result.output
    result = runner.invoke(cli, ["bench", str(recipe_path), "--concurrency", "1,100000"])
    assert result.exit_code == 2, result.output
    assert "--concurrency 100000 > the recipe's limits.max_batch_size 4" in result.output


def test_reference_stop_ids_and_greedy_continuation(engine_and_reference):
    _, reference = engine_and_reference
    assert reference.tokenizer.eos_token_id in reference.stop_token_ids()
    import torch

    prompt = reference.tokenizer("def add(a, b):").input_ids
    ids = reference.generate(prompt, 5)
    expected = list(prompt)
    with torch.inference_mode():  # argmax of the raw logits, token by token, to a stop id
        for _ in range(5):
            expected.append(int(reference.model(torch.tensor([expected])).logits[0, -1].argmax()))
            if expected[-1] in reference.stop_token_ids():
                break
    assert 1 <= len(ids) <= 5 and ids == expected[len(prompt) :]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_the_reference_runs_where_device_says_for_a_served_system_too(recipe_path):
    """--device is the reference's device whatever the system under test (the canary gate asks for cuda): on a
    machine without a GPU that is a one-line error, never a reference quietly run on CPU in float32."""
    from trtspec.core.errors import ModelError
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import SystemOptions, open_reference

    served = SystemOptions(system="triton", url="127.0.0.1:8001", device="cuda")
    with pytest.raises(ModelError, match="device 'cuda' was asked for but torch sees no GPU"):
        open_reference(load_recipe(recipe_path), served)


def test_the_reference_loads_onto_its_gpus():
    """Straight onto one GPU; across every visible one, layer after layer, where there are several (a target
    served with tensor parallelism rarely fits one GPU); a device the user named is kept."""
    from trtspec.validate.reference import reference_device_map

    assert reference_device_map("cpu", 0) is None
    assert reference_device_map("cuda", 1) == "cuda"
    assert reference_device_map("cuda", 4) == "balanced_low_0"
    assert reference_device_map("cuda:1", 4) == "cuda:1"


def test_a_reference_placed_by_a_device_map_loads_checked_and_generates_the_same(tiny_pair, tmp_path):
    """The placed load (here accelerate's spread with only the CPU to spread over) keeps load_hf_model's weight
    check and gives the reference the same greedy tokens as the plain load."""
    import shutil

    from trtspec.core.errors import ModelError
    from trtspec.core.model_dir import load_hf_model
    from trtspec.validate.reference import HFReference

    target, _ = tiny_pair
    plain = HFReference.from_pretrained(target)
    placed = HFReference(
        load_hf_model(target, "float32", device_map="balanced_low_0").eval(), plain.tokenizer
    )
    prompt = plain.tokenizer("def add(a, b):").input_ids
    assert placed.generate(prompt, 8) == plain.generate(prompt, 8)
    broken = shutil.copytree(target, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(ModelError, match="has no tensor model.layers.2"):
        load_hf_model(broken, "float32", device_map="balanced_low_0")


def test_a_prompt_file_that_is_not_utf8_is_a_one_line_error(tmp_path):
    from trtspec.core.errors import PromptSetError

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'\xff{"prompt": "x"}\n')
    with pytest.raises(PromptSetError, match=r"prompts.jsonl: not UTF-8 text \(byte 0\)"):
        load_prompts(path)


def test_validate_and_bench_refuse_a_pair_that_check_refuses(runner, tiny_pair, tmp_path):
    """The in-process engine checks the pair's tokenizers as check does (a pair check refuses must not validate),
    and a draft tokenizer that does not load is one line, not a traceback (bench loads the draft alone too)."""
    import shutil

    from tiny_models import make_model, make_tokenizer

    make_tokenizer(tmp_path / "tok", vocab_size=300)
    other = make_model(tmp_path / "other", "llama", tokenizer_dir=tmp_path / "tok")
    broken = Path(shutil.copytree(tiny_pair[1], tmp_path / "broken"))
    (broken / "tokenizer.json").write_text('{"version": ')
    for draft, needle in ((other, "tokenizers differ"), (broken, "broken/tokenizer.json: not valid JSON")):
        recipe = write_recipe(tmp_path / f"{draft.name}.yaml", tiny_pair[0], draft)
        assert runner.invoke(cli, ["check", str(recipe)]).exit_code in (1, 2)
        for command in (["validate", "--limit", "1"], ["bench", "--limit", "1", "--num-draft-tokens", "1"]):
            result = runner.invoke(cli, [command[0], str(recipe), *command[1:], "--max-tokens", "4"])
            assert result.exit_code == 2, (command, result.output)
            assert needle in result.output and "Traceback" not in result.output


def test_the_reference_is_plain_greedy_whatever_the_checkpoints_generation_config_sets(tiny_pair, tmp_path):
    """A checkpoint's generation_config.json may set logits processors (Qwen2.5-Instruct ships a
    repetition_penalty) that trtspec's engines never apply: the reference must not apply them either, or every
    correct system would diverge from it. (transformers fills a passed config's default fields from the model's,
    so the reference replaces the model's own.)"""
    import shutil

    import torch

    from trtspec.validate.reference import HFReference

    target, _ = tiny_pair
    plain = HFReference.from_pretrained(target)
    shaped = shutil.copytree(target, tmp_path / "shaped")
    config = json.loads((shaped / "generation_config.json").read_text())
    processors = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2, "min_new_tokens": 12}
    (shaped / "generation_config.json").write_text(json.dumps(config | processors))
    reference = HFReference.from_pretrained(shaped)
    prompt = plain.tokenizer("def add(a, b):").input_ids
    ids = list(prompt)
    with torch.inference_mode():  # argmax of the raw logits, token by token
        for _ in range(12):
            logits = plain.model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] in plain.stop_token_ids():
                break
    assert reference.generate(prompt, 12) == plain.generate(prompt, 12) == ids[len(prompt) :]
    assert reference.stop_token_ids() == plain.stop_token_ids()
