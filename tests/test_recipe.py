"""Recipe loading: overrides, the demo recipe, and builders/README.md documenting every field."""

from __future__ import annotations

import re

import pytest
from conftest import REPO_ROOT

from trtspec.core.errors import RecipeError
from trtspec.recipe import DEMO_DIR, Recipe, load_recipe, recipe_from_dict


def field_paths(model: type, prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        if name == "source":
            continue
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            paths += field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def test_builders_readme_documents_every_field():
    readme = (REPO_ROOT / "builders" / "README.md").read_text()
    documented = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)*)`", readme))
    missing = [p for p in field_paths(Recipe) if p not in documented]
    assert not missing, f"builders/README.md lacks {missing}"


def test_demo_recipe_resolves_to_packaged_models():
    recipe = load_recipe("demo", check_paths=False)
    assert recipe.name == "demo"
    assert recipe.target.model == DEMO_DIR / "target" and recipe.draft.model == DEMO_DIR / "draft"
    assert (REPO_ROOT / "builders" / "demo.yaml").resolve() == (DEMO_DIR / "recipe.yaml").resolve()


def test_overrides_apply_before_validation(tmp_path, tiny_pair):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: x\ntarget: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n")
    recipe = load_recipe(
        path, {"target.dtype": "bfloat16", "speculative.max_draft_len": 6, "draft.dtype": None}
    )
    assert recipe.target.dtype == "bfloat16" and recipe.draft.dtype == "float16"
    assert recipe.speculative.default_num_draft_tokens == 6
    with pytest.raises(RecipeError, match=r"speculative.max_draft_len: .*\(got 0\)"):
        load_recipe(path, {"speculative.max_draft_len": 0})


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("triton:", "triton: empty section; give its fields or remove it"),
        ("triton: 5", "triton: must be a mapping to take triton.runtime from the command line (got 5)"),
    ],
)
def test_an_option_into_a_section_that_cannot_hold_it_names_the_recipe(tmp_path, tiny_pair, section, said):
    """A command-line option (--runtime) lands in the recipe's section; where the file's section cannot hold it
    the error names the file and the section, as the recipe's own check does: the file is what to fix."""
    path = tmp_path / "r.yaml"
    path.write_text(
        f"name: x\ntarget: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n{section}\n"
    )
    with pytest.raises(RecipeError) as refused:
        load_recipe(path, {"triton.runtime": "torch"})
    assert refused.value.message == f"{path}: {said}"


def test_a_model_path_of_a_user_or_home_this_machine_lacks_is_a_field_error(tmp_path, monkeypatch):
    path = tmp_path / "r.yaml"
    path.write_text("name: x\ntarget: {model: ~no-such-user-here/m}\n")
    with pytest.raises(RecipeError) as refused:
        load_recipe(path)
    assert refused.value.message == (
        f"{path}: target.model: ~no-such-user-here: no such user here; give the folder's full path (got "
        "'~no-such-user-here/m')"
    )
    # ~ where no home directory can be found (no HOME and no password entry: os.path.expanduser leaves it as is)
    import os

    monkeypatch.setattr(os.path, "expanduser", lambda text: text)
    path.write_text("name: x\ntarget: {model: ~/m}\n")
    with pytest.raises(RecipeError, match=r"target.model: ~: no home directory is set here; give the folder"):
        load_recipe(path)


def test_the_recipe_path_expands_a_home_as_its_model_paths_do(tmp_path, tiny_pair, monkeypatch):
    """TRTSPEC_RECIPE="~/r.yaml" (or a quoted argument) reaches trtspec unexpanded."""
    (tmp_path / "r.yaml").write_text(
        f"name: x\ntarget: {{model: {tiny_pair[0]}}}\nspeculative: {{proposer: ngram}}\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_recipe("~/r.yaml").name == "x"
    with pytest.raises(RecipeError, match=r"~no-such-user-here/r.yaml: cannot expand ~ \(no such user"):
        load_recipe("~no-such-user-here/r.yaml")
    # expanded once at the command line, so a report cannot be written over the recipe it names another way
    from click.testing import CliRunner

    from trtspec.cli import cli

    args = ["validate", "~/r.yaml", "--report", str(tmp_path / "r.yaml"), "--force"]
    result = CliRunner().invoke(cli, args, env={"HOME": str(tmp_path)})
    assert result.exit_code == 2 and "is the RECIPE file this run reads" in result.output, result.output


def test_num_draft_tokens_cannot_exceed_max_draft_len(tiny_pair):
    data = {
        "name": "x",
        "target": {"model": str(tiny_pair[0])},
        "draft": {"model": str(tiny_pair[1])},
        "speculative": {"max_draft_len": 2, "num_draft_tokens": 3},
    }
    with pytest.raises(RecipeError, match="num_draft_tokens 3 > max_draft_len 2"):
        recipe_from_dict(data)


def test_gpu_ids_must_match_world_size(tiny_pair):
    data = {
        "name": "x",
        "target": {"model": str(tiny_pair[0]), "tp_size": 2, "gpu_ids": [0]},
        "draft": {"model": str(tiny_pair[1])},
    }
    with pytest.raises(RecipeError, match=r"target: .*gpu_ids has 1 ids but tp_size\*pp_size is 2"):
        recipe_from_dict(data)


def test_an_fp8_kv_cache_needs_a_quantization(tiny_pair):
    data = {
        "name": "x",
        "target": {"model": str(tiny_pair[0])},
        "draft": {"model": str(tiny_pair[1]), "kv_cache_dtype": "fp8"},
    }
    with pytest.raises(RecipeError, match="draft: .*kv_cache_dtype fp8 needs a quantization"):
        recipe_from_dict(data)
    data["draft"]["quantization"] = (
        "int4_awq"  # for the engine path, `check` refuses this pair (test_check_runtime)
    )
    assert recipe_from_dict(data).draft.kv_cache_dtype == "fp8"


def test_digest_changes_with_fields(tiny_pair):
    base = {"name": "x", "target": {"model": str(tiny_pair[0])}, "draft": {"model": str(tiny_pair[1])}}
    a = recipe_from_dict(base)
    b = recipe_from_dict(base | {"limits": {"max_batch_size": 4}})
    assert a.digest() == recipe_from_dict(base).digest() != b.digest()


def test_a_recipe_that_is_not_utf8_is_a_one_line_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(RecipeError, match=r"latin1.yaml: not UTF-8 text \(byte 9\)"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "speculative: {max_draft_len: true}",
            "speculative.max_draft_len: Input should be a valid integer (got True)",
        ),
        ("triton: {decoupled: 1}", "triton.decoupled: Input should be a valid boolean (got 1)"),
        ("target: {model: T, tp_size: 2.5}", "target.tp_size: Input should be a valid integer (got 2.5)"),
        (
            "triton: {cpu_threads: 0}",
            "triton.cpu_threads: Input should be greater than or equal to 1 or Input should be 'auto' (got 0)",
        ),
        ("triton: {cpu_thread: 2}", "triton.cpu_thread: unknown field; did you mean 'cpu_threads'?"),
        (
            "limits: {max_input_len: 600, max_seq_len: 512}",
            "limits.max_input_len 600 must be < limits.max_seq_len 512",
        ),
        ("name: again", "line 4: not valid YAML: key 'name' is given twice; keep one"),
        ("target: {model: ''}", "target.model: give a Hugging Face checkpoint folder or demo:NAME (got '')"),
        (
            "target: {model: null}",
            "target.model: give a Hugging Face checkpoint folder or demo:NAME (got None)",
        ),
        (
            "limits: {max_batch_size: '16'}",
            "limits.max_batch_size: Input should be a valid integer (got '16'); a quoted value is text in YAML: "
            "remove the quotes",
        ),
        ("speculative:", "speculative: empty section; give its fields or remove it"),
    ],
)
def test_recipe_values_are_not_coerced_and_errors_name_the_field(tmp_path, tiny_pair, text, needle):
    """YAML's true/1/2.5 are not taken as 1/True/2; a key given twice is refused; messages carry no pydantic
    internals (union tags, the whole section as 'got')."""
    path = tmp_path / "r.yaml"
    base = f"name: x\ntarget: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n"
    if text.startswith("target:"):
        base = base.replace(f"target: {{model: {tiny_pair[0]}}}\n", "")
        text = text.replace("model: T", f"model: {tiny_pair[0]}")
    path.write_text(base + text + "\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value.message)
    assert message == f"{path}: {needle}" or message.startswith(f"{path}: {needle}"), message
    assert "constrained-int" not in message and "{'" not in message


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ("targte: {model: T}\ndraft: {model: D}", "targte: unknown field; did you mean 'target'?"),
        ("target: {model: T}\ndraft: {modle: D}", "draft.modle: unknown field; did you mean 'model'?"),
        ("target: {modle: T}\ndraft: {model: D}", "target.modle: unknown field; did you mean 'model'?"),
    ],
)
def test_a_misspelt_required_field_is_named_with_the_field_it_means(tmp_path, tiny_pair, sections, needle):
    """pydantic reports the required field missing before the unknown one: the misspelling is the error to show."""
    path = tmp_path / "r.yaml"
    path.write_text("name: x\n" + sections.replace("T", str(tiny_pair[0])).replace("D", str(tiny_pair[1])))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert caught.value.message.startswith(f"{path}: {needle}"), caught.value.message


def test_a_missing_required_field_says_to_add_it(tmp_path, tiny_pair):
    path = tmp_path / "r.yaml"
    path.write_text(f"target: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert caught.value.message.startswith(f"{path}: name: required field missing; add it"), (
        caught.value.message
    )


def test_the_remove_the_quotes_hint_only_where_the_text_is_the_value_wanted(tmp_path, tiny_pair):
    path = tmp_path / "r.yaml"
    base = f"name: x\ntarget: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n"
    for value, hint in (("'16'", True), ("abc", False), ("'1.5'", False), ("'true'", False)):
        path.write_text(base + f"limits: {{max_batch_size: {value}}}\n")
        with pytest.raises(RecipeError) as caught:
            load_recipe(path)
        assert ("remove the quotes" in caught.value.message) is hint, caught.value.message


def test_verbose_adds_the_details_of_an_error(runner, tmp_path, tiny_pair):
    from trtspec.cli import cli

    path = tmp_path / "r.yaml"
    path.write_text(f"name: x\ntarget: {{model: {tiny_pair[0]}}}\ndraft: {{model: {tiny_pair[1]}}}\n")
    path.write_text(path.read_text() + "speculative: {max_draft_len: 0}\n")
    plain = runner.invoke(cli, ["check", str(path)])
    verbose = runner.invoke(cli, ["check", str(path), "-v"])
    assert plain.exit_code == verbose.exit_code == 2
    assert len(plain.stderr.strip().splitlines()) == 1
    assert "1 validation error for Recipe" in verbose.stderr and "greater_than_equal" in verbose.stderr


def test_yaml_anchors_and_merge_keys_still_load(tmp_path, tiny_pair):
    """The duplicate-key check must not refuse YAML merge keys (`<<: *anchor`), which recipes use to share fields."""
    path = tmp_path / "r.yaml"
    path.write_text(
        f"name: x\ntarget: &common {{model: {tiny_pair[0]}, dtype: bfloat16}}\n"
        f"draft: {{<<: *common, model: {tiny_pair[1]}}}\n"
    )
    recipe = load_recipe(path)
    assert recipe.draft.dtype == "bfloat16" and recipe.draft.model == tiny_pair[1]
    path.write_text(path.read_text() + "? [1, 2]\n: 3\n")
    with pytest.raises(RecipeError, match=r"a key must be a name, got \[1, 2\]"):
        load_recipe(path)
