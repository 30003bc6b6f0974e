"""`trtspec check`: every pre-flight check against tiny real models and tokenizers built here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiny_models import make_model, make_tokenizer

from trtspec.cli import cli
from trtspec.core.model_dir import TOKENIZER_FILES


def write_recipe(path: Path, target_dir: Path, draft_dir: Path, **sections) -> Path:
    data = {"name": "tiny", "target": {"model": str(target_dir)}, "draft": {"model": str(draft_dir)}}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


def run_check(runner, recipe: Path, *args):
    result = runner.invoke(cli, ["check", str(recipe), "--json", *args])
    payload = json.loads(result.output) if result.output.strip().startswith("{") else None
    return result, payload


def status_of(payload, name: str) -> tuple[str, str]:
    row = next(c for c in payload["checks"] if c["name"] == name)
    return row["status"], row["message"]


@pytest.fixture
def draft_with(tmp_path, shared_tokenizer_dir):
    """Build a draft next to the shared target tokenizer, with a tokenizer and config of the test's choosing."""

    def build(tokenizer_dir=None, **model_kwargs):
        out = tmp_path / "draft"
        defaults = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
        return make_model(
            out, "llama", tokenizer_dir=tokenizer_dir or shared_tokenizer_dir, **(defaults | model_kwargs)
        )

    return build


def test_matching_pair_passes(runner, tmp_path, tiny_pair):
    target, draft = tiny_pair
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", target, draft))
    assert result.exit_code == 0, result.output
    assert payload["ok"] is True
    assert status_of(payload, "tokenizer")[0] == "pass"
    names = {c["name"] for c in payload["checks"]}
    assert {"padded vocab", "precision", "max_seq_len", "draft fits", "draft size", "memory"} <= names
    assert {m["role"] for m in payload["memory"]} == {"target", "draft"}


def test_rich_table_output(runner, tmp_path, tiny_pair):
    target, draft = tiny_pair
    result = runner.invoke(cli, ["check", str(write_recipe(tmp_path / "r.yaml", target, draft))])
    assert result.exit_code == 0
    assert "trtspec check: tiny" in result.output and "Estimated GPU memory" in result.output


def test_different_vocab_size(runner, tmp_path, tiny_pair, draft_with):
    make_tokenizer(tmp_path / "tok300", vocab_size=300)
    draft = draft_with(tokenizer_dir=tmp_path / "tok300")
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "tokenizer")
    assert status == "fail" and "target 320 tokens, draft 300" in message


def test_same_size_different_tokens_names_first_difference(runner, tmp_path, draft_with):
    make_tokenizer(tmp_path / "tok_x", extra_special=("<x>",))
    make_tokenizer(tmp_path / "tok_y", extra_special=("<y>",))
    target = make_model(tmp_path / "target", tokenizer_dir=tmp_path / "tok_x")
    draft = draft_with(tokenizer_dir=tmp_path / "tok_y")
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", target, draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "tokenizer")
    assert status == "fail"
    assert "id 4: target '<x>' vs draft '<y>'" in message


def test_different_eos(runner, tmp_path, draft_with):
    from transformers import AutoTokenizer

    make_tokenizer(tmp_path / "tok", extra_special=("<|end|>",))
    other = AutoTokenizer.from_pretrained(tmp_path / "tok", eos_token="<|end|>")
    other.save_pretrained(tmp_path / "tok_end")
    target = make_model(tmp_path / "target", tokenizer_dir=tmp_path / "tok")
    draft = draft_with(tokenizer_dir=tmp_path / "tok_end")
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", target, draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "tokenizer")
    assert status == "fail" and message.startswith("eos_token ids differ")


def test_model_vocab_smaller_than_tokenizer(runner, tmp_path, tiny_pair, draft_with):
    draft = draft_with(vocab_size=300)
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "vocab size (draft)")
    assert status == "fail" and "vocab_size 300 < tokenizer size 320" in message


@pytest.fixture
def padded_pair(tmp_path, shared_tokenizer_dir, draft_with):
    """Qwen2.5's shape: one 320-id tokenizer, a target with 352 vocab rows and a draft with 336."""
    target = make_model(tmp_path / "target", "llama", tokenizer_dir=shared_tokenizer_dir, vocab_size=352)
    return target, draft_with(vocab_size=336)


def test_padded_vocab_pair_passes_and_names_the_padding(runner, tmp_path, padded_pair):
    target, draft = padded_pair
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", target, draft))
    assert result.exit_code == 0, result.output
    status, message = status_of(payload, "padded vocab")
    assert status == "pass" and "target rows 320-351 and draft rows 320-335 are padding" in message
    logits = write_recipe(tmp_path / "r2.yaml", target, draft, speculative={"use_draft_logits": True})
    status, message = status_of(run_check(runner, logits)[1], "padded vocab")
    assert status == "pass" and "padded with -inf to the target's 352 rows" in message


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"triton": {"runtime": "tensorrtllm"}}, None),
        (
            {
                "triton": {"runtime": "tensorrtllm", "fast_logits": True},
                "speculative": {"use_draft_logits": True},
            },
            "set triton.fast_logits: false",
        ),
        ({"triton": {"runtime": "trtllm-pytorch"}}, "serve this pair with runtime torch or tensorrtllm"),
    ],
)
def test_padded_vocab_pair_per_runtime(runner, tmp_path, padded_pair, sections, needle):
    """What TensorRT-LLM 1.2.x accepts (support.vocab_pair_problem): draft tokens by id, draft logits padded by the
    orchestrator, but neither fast logits nor the PyTorch backend's DraftTarget sampling."""
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", *padded_pair, **sections))
    status, message = status_of(payload, "padded vocab")
    assert (status, needle is None or needle in message) == ("pass" if needle is None else "fail", True)


def test_draft_with_more_vocab_rows_than_the_target_fails(runner, tmp_path, tiny_pair, draft_with):
    draft = draft_with(vocab_size=384)
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "padded vocab")
    assert status == "fail" and "the draft has 384 vocab rows and the target 320" in message


@pytest.mark.conversion
def test_build_stops_at_preflight_on_vocab_mismatch(runner, tmp_path, tiny_pair, draft_with):
    """The build refuses the pair before converting anything."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft_with(vocab_size=384))
    out = tmp_path / "engines"
    result = runner.invoke(cli, ["build", str(recipe), "--engines-dir", str(out)])
    assert result.exit_code == 1, result.output
    assert "pre-flight check padded vocab failed" in result.output
    assert not (out / "target").exists()


@pytest.mark.parametrize("keep", ["half", "header"])
def test_truncated_weights_are_one_line_model_errors(runner, tmp_path, tiny_pair, draft_with, keep):
    """A half-copied model.safetensors (header intact) or one cut inside its header: exit 2, the file named."""
    draft = draft_with()
    weights = draft / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if keep == "half" else data[:100])
    result = runner.invoke(cli, ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))])
    assert result.exit_code == 2, result.output
    assert f"{weights}: not a readable safetensors file" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "config, needle",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got a list"),
        ('{"hidden_size": 32}', 'no "model_type" string'),
    ],
)
def test_a_broken_config_json_is_one_short_line_naming_it(
    runner, tmp_path, tiny_pair, draft_with, config, needle
):
    """transformers' own errors would list every model type it knows (4,800 characters) or blame the weights."""
    draft = draft_with()
    (draft / "config.json").write_text(config)
    for args in (
        ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))],
        ["generate", "--prompt", "x", "--target", str(tiny_pair[0]), "--draft", str(draft)],
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert f"{draft}/config.json: {needle}" in line and len(line.splitlines()) == 1 and len(line) < 300, (
            line
        )


# A config.json field that check and generate must both refuse in one line naming it, with the kind it must be.
_BAD_FIELDS = [
    # sizes: check compares them as numbers (a TypeError traceback otherwise)
    ("vocab_size", "1024", "a positive integer"), ("vocab_size", None, "a positive integer"),
    ("num_hidden_layers", "10", "a positive integer"), ("max_position_embeddings", "1024", "a positive integer"),
    ("hidden_size", 0, "a positive integer"), ("num_attention_heads", True, "a positive integer"),
    # another kind than the config class's default: transformers 4 keeps it and generate failed inside the
    # forward with a traceback (check passed); 5 refuses it while the tokenizer loads, which was reported as a
    # broken tokenizer
    ("rms_norm_eps", "1e-6", "a number"), ("rope_theta", [10000], "a number"),
    ("attention_bias", 0, "true or false"), ("hidden_act", 3, "a string"),
    ("tie_word_embeddings", "false", "true or false"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value", "kind"), _BAD_FIELDS)
def test_a_config_field_of_the_wrong_kind_is_one_line_naming_it(
    runner, tmp_path, tiny_pair, draft_with, key, value, kind
):
    """Refused before any load by check and generate alike; a published optional size left null still loads."""
    draft = draft_with()
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {key: value}))
    for args in (
        ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))],
        ["generate", "--prompt", "x", "--target", str(tiny_pair[0]), "--draft", str(draft)],
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.output.strip() == (
            f"Error: {draft}/config.json: {key}: must be {kind} (got {value!r}); fix config.json"
        )
    (draft / "config.json").write_text(json.dumps(config | {"head_dim": None}))
    assert runner.invoke(cli, ["check", str(tmp_path / "r.yaml")]).exit_code == 0


def test_a_model_type_transformers_does_not_know_is_one_whole_line(runner, tmp_path, tiny_pair, draft_with):
    """Named with its field and what to do, not transformers' error cut mid-word."""
    draft = draft_with()
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {"model_type": "foobar"}))
    for args in (
        ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))],
        ["generate", "--prompt", "x", "--target", str(tiny_pair[0]), "--draft", str(draft)],
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert (
            f'Error: {draft}/config.json: model_type "foobar" is not a family transformers' in result.output
        )
        assert "docs/pairs.md" in result.output


def test_a_library_error_is_cut_at_a_word():
    from trtspec.core.model_dir import error_line

    assert error_line(ValueError("short\nsecond line")) == "short"
    cut = error_line(ValueError("word " * 100), limit=23)
    assert cut == "word word word word ..." and len(cut) <= 23 + 4
    # a long path keeps what fits rather than falling back to the last space far before the cut
    path = error_line(OSError("no file '/data/" + "a" * 300 + "'"), limit=60)
    assert path.startswith("no file '/data/aaaa") and len(path) == 60 + 4


def test_published_size_quirks_are_read_as_sizes(tmp_path):
    """Gemma 3n gives intermediate_size per layer inside text_config; Mistral leaves head_dim null."""
    from trtspec.core.errors import ModelError
    from trtspec.core.model_dir import read_hf_config

    text = {
        "vocab_size": 262400,
        "hidden_size": 2048,
        "num_hidden_layers": 30,
        "intermediate_size": [8192] * 30,
    }
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma3n", "text_config": text, "head_dim": None})
    )
    assert read_hf_config(tmp_path)["text_config"]["intermediate_size"][0] == 8192
    text["intermediate_size"] = [8192, "x"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3n", "text_config": text}))
    with pytest.raises(
        ModelError, match=r"intermediate_size: must be a positive integer \(got \[8192, 'x'\]\)"
    ):
        read_hf_config(tmp_path)


def test_an_end_id_past_the_vocabulary_fails_check(runner, tmp_path, tiny_pair, draft_with):
    draft = draft_with()
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {"eos_token_id": 99999}))
    (draft / "generation_config.json").unlink(missing_ok=True)
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))
    assert result.exit_code == 1
    status, message = status_of(payload, "vocab size (draft)")
    assert status == "fail" and message.startswith("end id 99999 (eos_token_id of generation_config.json")


def test_a_remote_code_config_without_a_model_type_is_not_refused_for_it(tmp_path):
    """transformers reads such a config through its auto_map's class (with trust_remote_code)."""
    from trtspec.core.model_dir import read_model_config

    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "cfg.MyConfig"}}))
    assert read_model_config(tmp_path)["auto_map"]


def test_a_model_without_tokenizer_files_says_which_files_it_needs(runner, tmp_path, tiny_pair, draft_with):
    draft = draft_with()
    for name in TOKENIZER_FILES + ("special_tokens_map.json",):
        (draft / name).unlink(missing_ok=True)
    result = runner.invoke(cli, ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"Error: {draft}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); copy the Hugging Face checkpoint's "
        "tokenizer files into it"
    ]


def test_model_without_weights(runner, tmp_path, tiny_pair, draft_with):
    draft = draft_with()
    (draft / "model.safetensors").unlink()
    result = runner.invoke(cli, ["check", str(write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft))])
    assert result.exit_code == 2, result.output
    assert "draft model has no weights (*.safetensors or pytorch_model*.bin)" in result.output


def test_padded_vocab_counts_tp_and_awq(runner, tmp_path, tiny_pair):
    from trtspec.core.vocab import padded_vocab_size

    assert padded_vocab_size(32000, 1, "none") == 32000
    assert padded_vocab_size(32001, 2, "none") == 32002
    assert padded_vocab_size(32001, 1, "int4_awq") == 32064  # modelopt 0.37 pads AWQ to 64, then to tp
    assert padded_vocab_size(32001, 2, "w4a8_awq") == 32064


def test_an_engines_logit_rows_are_padded_to_its_whole_world_pipeline_stages_included():
    # TensorRT-LLM's runtime: ModelConfig::getVocabSizePadded(worldConfig.getSize()), tp x pp; a draft's logits
    # padded to fewer rows would fail every verification ("Incompatible buffer sizes")
    from trtspec.core.engine_config import engine_vocab_rows

    assert engine_vocab_rows({"vocab_size": 50257, "tp_size": 1, "pp_size": 2}) == 50258
    assert engine_vocab_rows({"vocab_size": 50257, "tp_size": 2, "pp_size": 2}) == 50260
    assert engine_vocab_rows({"vocab_size": 50257, "tp_size": 1, "pp_size": 1}) == 50257


def test_unsupported_architecture(runner, tmp_path, shared_tokenizer_dir, tiny_pair):
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(shared_tokenizer_dir)
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok))).save_pretrained(gpt2)
    tok.save_pretrained(gpt2)
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], gpt2, triton={"runtime": "tensorrtllm"})
    result, payload = run_check(runner, recipe)
    assert result.exit_code == 1
    status, message = status_of(payload, "architecture (draft)")
    assert (
        status == "fail" and "GPT2LMHeadModel is not supported" in message and "LlamaForCausalLM" in message
    )
    # The torch runtime serves any causal LM: the same pair only warns there.
    recipe = write_recipe(tmp_path / "r2.yaml", tiny_pair[0], gpt2)
    assert status_of(run_check(runner, recipe)[1], "architecture (draft)")[0] == "warn"


def test_precision_outside_support_matrix(runner, tmp_path, tiny_pair):
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, target={"quantization": "int4_awq"})
    result, payload = run_check(runner, recipe)
    assert result.exit_code == 1
    status, message = status_of(payload, "precision")
    assert (
        status == "fail"
        and "target int4_awq" in message
        and "set speculative.allow_unsupported_precision: true (check: --allow-unsupported-precision)"
        in message
    )
    result, payload = run_check(runner, recipe, "--allow-unsupported-precision")
    assert result.exit_code == 0 and status_of(payload, "precision")[0] == "warn"


def test_limits(runner, tmp_path, tiny_pair):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        *tiny_pair,
        speculative={"max_draft_len": 12},
        limits={"max_input_len": 4090, "max_seq_len": 4096},
    )
    result, payload = run_check(runner, recipe)
    assert result.exit_code == 1
    assert status_of(payload, "max_draft_len")[0] == "warn"
    assert (
        "exceeds max_position_embeddings of target 2048, draft 2048" in status_of(payload, "max_seq_len")[1]
    )
    assert status_of(payload, "draft fits")[0] == "fail"
    # -q prints nothing but errors: each failed check is one, the passing and warning rows are not
    quiet = runner.invoke(cli, ["check", str(recipe), "-q"])
    assert quiet.exit_code == 1
    failed = [c for c in payload["checks"] if c["status"] == "fail"]
    assert quiet.output.strip().splitlines() == [f"FAIL {c['name']}: {c['message']}" for c in failed]


def test_memory_estimate_and_gpu_limit(runner, tmp_path, tiny_pair):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        *tiny_pair,
        target={"tp_size": 2, "gpu_ids": [0, 1]},
        limits={"max_batch_size": 64, "max_seq_len": 2048},
    )
    result, payload = run_check(runner, recipe)
    target = next(m for m in payload["memory"] if m["role"] == "target")
    draft = next(m for m in payload["memory"] if m["role"] == "draft")
    # KV: 2 (k,v) x 2 layers x 4 kv heads x 16 head_dim x 2 bytes x 64 x 2048 tokens, split over 2 ranks.
    assert target["kv_cache_gib"] == pytest.approx(2 * 2 * 4 * 16 * 2 * 64 * 2048 / 2 / 2**30)
    assert target["gpus"] == [0, 1] and draft["gpus"] == [0]
    assert payload["per_gpu_gib"]["0"] == pytest.approx(target["total_gib"] + draft["total_gib"], rel=1e-3)
    result, payload = run_check(runner, recipe, "--gpu-memory", "0.01")
    assert result.exit_code == 1 and status_of(payload, "memory")[0] == "fail"


def test_draft_not_smaller_warns(runner, tmp_path, tiny_pair):
    result, payload = run_check(runner, write_recipe(tmp_path / "r.yaml", tiny_pair[0], tiny_pair[0]))
    assert result.exit_code == 0
    status, message = status_of(payload, "draft size")
    assert status == "warn" and "= 1.00" in message


@pytest.mark.parametrize(
    ("section", "value", "field", "fragment"),
    [
        ("speculative", {"max_draft_len": 0}, "speculative.max_draft_len", "greater than or equal to 1"),
        ("speculative", {"max_draft_len": "four"}, "speculative.max_draft_len", "'four'"),
        ("target", {"dtype": "float8"}, "target.dtype", "'float8'"),
        (
            "limits",
            {"max_batch_sise": 4},
            "limits.max_batch_sise",
            "unknown field; did you mean 'max_batch_size'?",
        ),
        ("name", "../escape", "name", "'../escape'"),
        ("name", "a/b", "name", "'a/b'"),
        (
            "limits",
            {"max_input_len": 1024, "max_seq_len": 1024},
            None,
            "max_input_len 1024 must be < limits.max_seq_len",
        ),
    ],
)
def test_bad_recipe_fields(runner, tmp_path, tiny_pair, section, value, field, fragment):
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, **{section: value})
    result = runner.invoke(cli, ["check", str(recipe)])
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: {recipe}")
    if field:
        assert f": {field}: " in line
    assert fragment in line
    assert "Traceback" not in result.output


def test_missing_model_directory(runner, tmp_path, tiny_pair):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], tmp_path / "nowhere")
    result = runner.invoke(cli, ["check", str(recipe)])
    assert result.exit_code == 2
    assert "draft.model: model directory" in result.output and "nowhere does not exist" in result.output
    (tmp_path / "weights.bin").write_bytes(b"")
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], tmp_path / "weights.bin")
    result = runner.invoke(cli, ["check", str(recipe)])
    assert result.exit_code == 2 and "draft.model: " in result.output
    assert "weights.bin is a file, not a model folder" in result.output


def test_model_directory_without_config(runner, tmp_path, tiny_pair):
    (tmp_path / "empty").mkdir()
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], tmp_path / "empty")
    result = runner.invoke(cli, ["check", str(recipe)])
    assert result.exit_code == 2 and "draft model has no config.json" in result.output


def test_relative_paths_resolve_against_recipe_folder(runner, tmp_path, tiny_pair):
    import shutil

    folder = tmp_path / "recipes"
    shutil.copytree(tiny_pair[0], folder / "models" / "t")
    shutil.copytree(tiny_pair[1], folder / "models" / "d")
    recipe = write_recipe(folder / "pair.yaml", Path("models/t"), Path("models/d"))
    result = runner.invoke(cli, ["check", str(recipe), "--json"])
    assert result.exit_code == 0, result.output


def test_unreadable_recipe_and_bad_yaml(runner, tmp_path):
    result = runner.invoke(cli, ["check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "cannot read the recipe" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    result = runner.invoke(cli, ["check", str(bad)])
    assert result.exit_code == 2 and "not valid YAML" in result.output


def test_env_var_names_recipe(runner, tmp_path, tiny_pair):
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair)
    result = runner.invoke(cli, ["check", "--json"], env={"TRTSPEC_RECIPE": str(recipe)})
    assert result.exit_code == 0 and json.loads(result.output)["recipe"] == "tiny"
    help_text = runner.invoke(cli, ["check", "--help"]).output
    assert "TRTSPEC_CHECK_GPU_MEMORY" in help_text


def test_help_does_not_import_heavy_libraries():
    code = "import sys; from trtspec.cli import main; sys.argv=['trtspec','--help']\ntry: main()\nexcept SystemExit: pass\n"
    code += "heavy=[m for m in ('torch','transformers','modelopt','tritonclient') if m in sys.modules]; print('HEAVY', heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
    assert "check" in out


def test_python_dash_m_is_the_same_program():
    out = subprocess.run(
        [sys.executable, "-m", "trtspec", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "trtspec, version 0.1.0"


def test_tensorrtllm_runtime_options_are_checked_and_left_out_for_torch(runner, tmp_path, tiny_pair):
    from trtspec.builders.build import run_preflight
    from trtspec.builders.preflight import ENGINE_ONLY_CHECKS
    from trtspec.recipe import load_recipe

    path = write_recipe(
        tmp_path / "r.yaml",
        *tiny_pair,
        draft={"quantization": "int4_awq", "kv_cache_dtype": "fp8"},
        speculative={"allow_unsupported_precision": True},
        triton={"runtime": "tensorrtllm", "fast_logits": True},
    )
    result, payload = run_check(runner, path)
    assert result.exit_code == 1
    status, message = status_of(payload, "kv cache")
    assert status == "fail" and "draft.kv_cache_dtype fp8 beside quantization int4_awq" in message
    status, message = status_of(payload, "fast logits")
    assert status == "warn" and "without speculative.use_draft_logits" in message
    # the tiny draft's 32-wide layers cannot take AWQ's 128-wide groups: named before any stage runs
    status, message = status_of(payload, "layer split (draft)")
    assert status == "fail" and message.startswith("draft: int4_awq needs layer input sizes divisible by 128")
    assert status_of(payload, "layer split (target)")[0] == "pass"
    # deploy --runtime torch runs the checks that concern the checkpoints only: these are reported but skipped
    # (run_preflight raises on any other failed check)
    results = run_preflight(load_recipe(path), skip=ENGINE_ONLY_CHECKS)["results"]
    assert results["kv cache"] == "fail" and results["fast logits"] == "warn"
    assert results["layer split (draft)"] == "fail"


def test_a_split_the_layers_cannot_take_is_named_by_check_for_every_model_and_only_warns_for_torch(
    runner, tmp_path, tiny_pair
):
    """build refuses a model's split at that model's own stage, after the earlier stages ran; check names it first.
    The torch runtime serves the HF models unsplit."""
    path = write_recipe(
        tmp_path / "r.yaml", *tiny_pair, target={"tp_size": 3}, triton={"runtime": "tensorrtllm"}
    )
    result, payload = run_check(runner, path)
    assert result.exit_code == 1
    status, message = status_of(payload, "layer split (target)")
    assert status == "fail" and message.startswith("target: tp_size=3 must divide num_attention_heads=")
    assert status_of(payload, "layer split (draft)")[0] == "pass"
    torch_path = write_recipe(tmp_path / "t.yaml", *tiny_pair, target={"tp_size": 3})
    status, message = status_of(run_check(runner, torch_path)[1], "layer split (target)")
    assert status == "warn" and message.endswith("the torch runtime serves the HF model unsplit")


def test_a_config_without_architectures_is_named_so(runner, tmp_path, tiny_pair):
    """The missing field is what to fix, not the config class named as an architecture."""
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft)
    config = json.loads((draft / "config.json").read_text())
    config.pop("architectures")
    (draft / "config.json").write_text(json.dumps(config))
    path = write_recipe(tmp_path / "r.yaml", tiny_pair[0], draft, triton={"runtime": "tensorrtllm"})
    status, message = status_of(run_check(runner, path)[1], "architecture (draft)")
    assert status == "fail" and 'config.json has no "architectures" entry naming the model class' in message
    assert "LlamaConfig" not in message


def test_a_quantized_model_for_trtllm_pytorch_needs_safetensors_weights(runner, tmp_path, tiny_pair):
    """Its ModelOpt HF export reads them: a .bin-only quantized draft fails check, as build would refuse it."""
    import shutil

    import torch
    from safetensors.torch import load_file

    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft)
    state = load_file(draft / "model.safetensors")
    (draft / "model.safetensors").unlink()
    torch.save(state, draft / "pytorch_model.bin")  # the same weights, as .bin only
    fp8 = {"quantization": "fp8"}
    path = write_recipe(
        tmp_path / "r.yaml", tiny_pair[0], draft, draft=fp8, triton={"runtime": "trtllm-pytorch"}
    )
    status, message = status_of(run_check(runner, path)[1], "draft weights")
    assert (
        status == "fail"
        and message
        == f"{draft}: no *.safetensors weights; the ModelOpt HF export's check "
        + ("reads them (re-save the model with save_pretrained, which writes them)")
    )
    plain = write_recipe(tmp_path / "p.yaml", tiny_pair[0], draft, triton={"runtime": "trtllm-pytorch"})
    assert status_of(run_check(runner, plain)[1], "draft weights")[0] == "pass"  # served as is


@pytest.mark.parametrize("tied", [False, True])
def test_parameters_are_counted_alike_from_safetensors_and_bin_checkpoints(
    tmp_path, shared_tokenizer_dir, tied
):
    """One owner (model_dir.count_parameters) for check's facts and convert's memory estimate; a .bin-only
    checkpoint is counted from its tensors (memory-mapped), a tied embedding once."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.core.errors import ModelError
    from trtspec.core.model_dir import count_parameters

    safe = make_model(tmp_path / "safe", tokenizer_dir=shared_tokenizer_dir, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_pretrained(safe)
    expected = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    assert count_parameters(safe) == expected
    bins = tmp_path / "bins"
    bins.mkdir()
    torch.save(model.state_dict(), bins / "pytorch_model.bin")  # both names of a tied tensor, one storage
    torch.save({"output_dir": "x"}, bins / "training_args.bin")  # a Trainer's pickle beside the weights
    assert count_parameters(bins) == expected
    # the pre-1.6 (non-zip) format cannot be memory-mapped: read instead
    torch.save(model.state_dict(), bins / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert count_parameters(bins) == expected
    # sharded: the index names the files
    (bins / "pytorch_model.bin").unlink()
    state = model.state_dict()
    names = list(state)
    half = len(names) // 2
    shards = {
        "pytorch_model-00001-of-00002.bin": names[:half],
        "pytorch_model-00002-of-00002.bin": names[half:],
    }
    for shard, keys in shards.items():
        torch.save({k: state[k] for k in keys}, bins / shard)
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (bins / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if not tied:  # a tied tensor split over two shards is saved twice: only one file can say they are one
        assert count_parameters(bins) == expected
    for shard in shards:
        (bins / shard).unlink()
    (bins / "pytorch_model.bin.index.json").unlink()
    (bins / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match=r"pytorch_model.bin: not a readable PyTorch checkpoint \(") as err:
        count_parameters(bins)
    assert "\n" not in err.value.message
    torch.save([1, 2], bins / "pytorch_model.bin")
    with pytest.raises(ModelError, match="holds a list, not a state dict"):
        count_parameters(bins)
    assert count_parameters(tmp_path) is None  # no weight files


def test_safetensors_beside_the_ones_transformers_loads_are_not_counted(tmp_path, shared_tokenizer_dir):
    """Mistral's folders hold consolidated.safetensors beside model.safetensors (or its shards): the same weights
    again, which transformers never reads, so they count once; an index that is not one is a one-line error."""
    import shutil

    from trtspec.core.errors import ModelError
    from trtspec.core.model_dir import count_parameters

    model = make_model(tmp_path / "m", tokenizer_dir=shared_tokenizer_dir)
    expected = count_parameters(model)
    shutil.copy(model / "model.safetensors", model / "consolidated.safetensors")
    assert count_parameters(model) == expected
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    weight_map = dict.fromkeys(
        safe_names(model / "model-00001-of-00001.safetensors"), "model-00001-of-00001.safetensors"
    )
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert count_parameters(model) == expected
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": None}))
    with pytest.raises(
        ModelError, match=r"model.safetensors.index.json: weight_map must map tensor names"
    ) as err:
        count_parameters(model)
    assert "\n" not in err.value.message


def safe_names(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        return list(handle.keys())  # noqa: SIM118


@pytest.mark.parametrize(
    ("units", "fragment"),
    [
        (("avx512_bf16", "amx_bf16"), "this CPU has bf16 matrix units (avx512_bf16, amx_bf16)"),
        ((), "this CPU has no bf16 matrix units (no avx512_bf16 or amx_bf16)"),
        (None, "bf16 matrix units unknown"),
    ],
)
def test_check_names_the_cpu_dtype_and_the_bf16_units(tiny_pair, units, fragment):
    """One line: the dtype the torch runtime runs on CPU, and whether this CPU multiplies bfloat16 natively."""
    from triton_server import tiny_recipe

    from trtspec.builders.preflight import check_cpu_dtype

    (result,) = check_cpu_dtype(tiny_recipe(tiny_pair), units)
    assert result.status == "pass" and result.message.startswith("the torch runtime runs float32 on this CPU")
    assert fragment in result.message
    (pinned,) = check_cpu_dtype(tiny_recipe(tiny_pair, torch_dtype="bfloat16"), units)
    assert pinned.details["dtype"] == "bfloat16"
    assert check_cpu_dtype(tiny_recipe(tiny_pair, runtime="tensorrtllm"), units) == []
    assert check_cpu_dtype(tiny_recipe(tiny_pair, device="cuda"), units) == []


def test_cpu_bf16_units_reads_the_cpu_flags():
    from trtspec.builders.environment import BF16_MATRIX_FLAGS, cpu_bf16_units

    units = cpu_bf16_units()
    assert units is None or set(units) <= set(BF16_MATRIX_FLAGS)


# Published configs' own quirks the field check must accept (shapes copied from their config.json files).
_PUBLISHED = {
    "llama-3.1": {
        "model_type": "llama", "rope_theta": 500000, "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
    },
    "qwen2.5": {
        "model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 21,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "bos_token_id": 151643, "rope_scaling": None,
    },
    "mistral": {"model_type": "mistral", "sliding_window": None, "head_dim": None, "rope_theta": 1000000.0},
    "gemma-3": {
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
        "text_config": {"model_type": "gemma3_text", "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024, "query_pre_attn_scalar": 256, "final_logit_softcapping": None},
    },
    "remote code": {"model_type": "my_arch", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}, "x": "y"},
    "a generation parameter": {"model_type": "llama", "early_stopping": "never", "num_beams": 1},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_PUBLISHED))
def test_published_config_quirks_pass_the_field_check(tmp_path, name):
    from trtspec.core.model_dir import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(_PUBLISHED[name]))
    assert read_model_config(tmp_path)["model_type"] == _PUBLISHED[name]["model_type"]


@pytest.mark.parametrize(
    ("config", "needle"),
    [({"model_type": ["llama"], "auto_map": {"AutoConfig": "c.C"}}, None),
     ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "rms_norm_eps": "1e-6"}},
      "rms_norm_eps: must be a number (got '1e-6')")],
)  # fmt: skip
def test_the_field_check_on_odd_layouts_is_one_line_or_nothing(tmp_path, config, needle):
    """A list for model_type (with remote code, which skips the model_type check) is left to the loaders, not a
    TypeError; a multimodal text_config is checked against its own model_type."""
    from trtspec.core.errors import ModelError
    from trtspec.core.model_dir import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(config))
    if needle is None:
        assert read_model_config(tmp_path) == config
        return
    with pytest.raises(ModelError, match=re.escape(needle)):
        read_model_config(tmp_path)


def test_an_orchestrator_instance_count_the_runtime_does_not_use_is_a_warning(runner, tmp_path, tiny_pair):
    triton = {"instances": {"orchestrator": 4}}
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair, triton=triton)
    status, message = status_of(run_check(runner, recipe)[1], "instances")
    assert status == "warn" and "the torch runtime serves with one instance" in message
    engine = write_recipe(tmp_path / "e.yaml", *tiny_pair, triton=triton | {"runtime": "tensorrtllm"})
    assert not [c for c in run_check(runner, engine)[1]["checks"] if c["name"] == "instances"]
