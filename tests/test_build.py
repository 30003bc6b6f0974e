"""`trtspec build` end to end on tiny models: real convert, the tensorrt_llm stand-in for the engine stage."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FAKE_TRTLLM_DIR

from trtspec.builders import build as B
from trtspec.builders import environment, stage_cache
from trtspec.cli import cli
from trtspec.core.engine_config import read_engine_config
from trtspec.core.errors import CheckFailed, CheckpointError, NeedsTensorRTLLM
from trtspec.recipe import load_recipe

pytestmark = pytest.mark.slow  # each test converts (or reuses) two tiny checkpoints


def write_recipe(path: Path, target: Path, draft: Path, **limits) -> Path:
    data = {
        "name": "tiny",
        "target": {"model": str(target), "dtype": "float16"},
        "draft": {"model": str(draft), "dtype": "float16"},
        "speculative": {"max_draft_len": 3, "use_draft_logits": True},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128} | limits,
    }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def pair(tmp_path, tiny_pair):
    """A private copy of the tiny pair (tests modify inputs) and a recipe file beside it."""
    target, draft = (Path(shutil.copytree(p, tmp_path / "models" / p.name)) for p in tiny_pair)
    (tmp_path / "recipes").mkdir()
    return write_recipe(tmp_path / "recipes" / "tiny.yaml", target, draft)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_pair):
    """One no-tensorrt_llm build (real convert of both models), copied by the tests that start from it."""
    root = tmp_path_factory.mktemp("converted")
    target, draft = (Path(shutil.copytree(p, root / "models" / p.name)) for p in tiny_pair)
    (root / "recipes").mkdir()
    recipe_path = write_recipe(root / "recipes" / "tiny.yaml", target, draft)
    with pytest.raises(NeedsTensorRTLLM):
        B.build(load_recipe(recipe_path), root / "engines")
    return root


@pytest.fixture
def workdir(tmp_path, converted):
    """A copy of the converted tree (models, recipe, engines with checkpoints) at a path with a space."""
    dst = tmp_path / "work dir"
    shutil.copytree(converted, dst)
    recipe = dst / "recipes" / "tiny.yaml"
    data = yaml.safe_load(recipe.read_text())
    for role in ("target", "draft"):
        data[role]["model"] = str(dst / "models" / Path(data[role]["model"]).name)
    recipe.write_text(yaml.safe_dump(data))
    return dst


@pytest.mark.conversion
def test_without_tensorrt_llm_exits_3_with_one_line_and_a_finish_script(runner, pair, tmp_path):
    engines = tmp_path / "my engines"
    result = runner.invoke(cli, ["build", str(pair), "--engines-dir", str(engines)])
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert (
        len(error_lines) == 1 and "finish_in_ngc.sh" in error_lines[0] and "tritonserver:" in error_lines[0]
    )
    out = engines / "tiny"
    for role in ("target", "draft"):
        assert (out / role / "checkpoint" / "rank0.safetensors").is_file()
        assert not (out / role / "engine").exists()
    script = out / "finish_in_ngc.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True)  # valid bash
    (docker,) = [line[1:].strip() for line in script.read_text().splitlines() if "docker run" in line]
    mounts = shlex.split(docker.rstrip("\\"))
    assert f"{engines.resolve()}:{engines.resolve()}" in mounts  # the engines folder (--engines-dir ..)
    assert f"{pair.parent.resolve()}:{pair.parent.resolve()}" in mounts  # the recipe's, named relative to it
    plan = json.loads((out / "plan.json").read_text())
    commands = [
        shlex.split(line) for line in script.read_text().splitlines() if line.startswith("trtllm-build")
    ]
    target_cmd = commands[0]
    assert target_cmd[target_cmd.index("--speculative_decoding_mode") + 1] == "draft_tokens_external"
    assert target_cmd[1:] == [
        a if not a.startswith(str(out)) else os.path.relpath(a, out)
        for a in plan["engines"]["target"]["trtllm_build"][1:]
    ]
    assert "--gather_generation_logits" in commands[1] and "--speculative_decoding_mode" not in commands[1]
    # trtspec in the image finishes for the runtime this build ran for (build --runtime may set it over the recipe)
    (finish,) = [
        shlex.split(line.strip())[1:] for line in script.read_text().splitlines() if "exec trtspec" in line
    ]
    assert (
        finish[finish.index("--runtime") + 1] == load_recipe(pair).triton.runtime
        and "--engines-only" in finish
    )
    # The commands are printed too, unwrapped, with the real (quoted) paths.
    for role in ("target", "draft"):
        assert shlex.join(plan["engines"][role]["trtllm_build"]) in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "needs_tensorrt_llm" and manifest["finish_script"] == "finish_in_ngc.sh"
    # With --json the same manifest is the one document on stdout (the stages are up to date now), still exit 3.
    result = runner.invoke(cli, ["build", str(pair), "--engines-dir", str(engines), "--json"])
    assert result.exit_code == 3, result.output
    payload = json.loads(result.stdout)
    assert payload["status"] == "needs_tensorrt_llm" and set(payload["skipped"]) >= {"target.checkpoint"}


@pytest.mark.conversion
def test_finish_script_completes_the_build_with_engines_only(fake_trtllm, workdir):
    out = workdir / "engines" / "tiny"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv's `trtspec`
    env["PYTHONPATH"] = str(FAKE_TRTLLM_DIR)
    # Run from elsewhere: the script must not depend on the working directory.
    proc = subprocess.run(
        ["bash", str(out / "finish_in_ngc.sh")], cwd="/", env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert {"target.checkpoint", "draft.checkpoint"} <= set(manifest["skipped"])
    assert (
        read_engine_config(out / "target" / "engine")["speculative_decoding_mode"] == "draft_tokens_external"
    )


@pytest.mark.conversion
def test_engines_only_from_the_cli_and_its_manifest(runner, fake_trtllm, workdir):
    recipe = workdir / "recipes" / "tiny.yaml"
    engines = workdir / "engines"
    result = runner.invoke(
        cli, ["build", str(recipe), "--engines-dir", str(engines), "--engines-only", "--json"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.output[result.output.index("{") :])
    assert manifest == json.loads((engines / "tiny" / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["recipe"]["hash"] == load_recipe(recipe).digest()
    versions = manifest["versions"]
    assert (
        versions["tensorrt_llm"] == "1.2.1"
        and versions["trtspec"]
        and versions["torch"]
        and versions["transformers"]
    )
    assert "nvidia-modelopt" in versions
    assert set(manifest["outputs"]) == {
        "target.checkpoint",
        "draft.checkpoint",
        "target.engine",
        "draft.engine",
    }
    assert set(manifest["inputs"]) == {"target.model", "draft.model"}
    assert all(isinstance(manifest["timings"][k], float) for k in manifest["outputs"])
    target_plan = manifest["plan"]["engines"]["target"]
    assert target_plan["build_config"]["speculative_decoding_mode"] == "draft_tokens_external"
    assert target_plan["build_config"]["max_draft_len"] == 3
    for role in ("target", "draft"):
        assert (
            stage_cache.tree_hash(engines / "tiny" / role / "engine") == manifest["outputs"][f"{role}.engine"]
        )


def test_engines_only_without_checkpoints_says_what_to_do(runner, fake_trtllm, pair, tmp_path):
    result = runner.invoke(cli, ["build", str(pair), "--engines-dir", str(tmp_path / "e"), "--engines-only"])
    assert result.exit_code == 2
    assert "no finished checkpoint; run `trtspec build` without --engines-only" in result.output
    assert not (tmp_path / "e").exists()  # the folders the build created for its output are gone again
    (tmp_path / "mine").mkdir()  # ... and a folder the user had stays
    result = runner.invoke(
        cli, ["build", str(pair), "--engines-dir", str(tmp_path / "mine"), "--engines-only"]
    )
    assert result.exit_code == 2 and sorted(p.name for p in (tmp_path / "mine").iterdir()) == []


@pytest.mark.conversion
def test_stages_skip_when_up_to_date_and_rerun_when_recipe_or_inputs_change(fake_trtllm, workdir):
    recipe_path, engines = workdir / "recipes" / "tiny.yaml", workdir / "engines"
    first = B.build(load_recipe(recipe_path), engines)
    assert first.ran == ["check", "target.engine", "draft.engine"]  # checkpoints came with the copy
    again = B.build(load_recipe(recipe_path), engines)
    assert again.ran == ["check"]
    # A limit changes the engines only.
    limits = B.build(load_recipe(recipe_path, {"limits.max_batch_size": 4}), engines)
    assert limits.ran == ["check", "target.engine", "draft.engine"]
    # An input file of the draft re-converts the draft; the checkpoint comes out byte-identical (generation
    # settings are not in it), so its engine, keyed by checkpoint content, stays up to date.
    gen = workdir / "models" / "draft" / "generation_config.json"
    gen.write_text(json.dumps(json.loads(gen.read_text()) | {"do_sample": True, "temperature": 0.5}))
    changed = B.build(load_recipe(recipe_path, {"limits.max_batch_size": 4}), engines)
    assert changed.ran == ["check", "draft.checkpoint"]
    # A dtype of the target re-converts the target; an edited engine file is rebuilt.
    (engines / "tiny" / "draft" / "engine" / "rank0.engine").write_bytes(b"tampered")
    dtype = B.build(
        load_recipe(recipe_path, {"limits.max_batch_size": 4, "target.dtype": "bfloat16"}), engines
    )
    assert dtype.ran == ["check", "target.checkpoint", "target.engine", "draft.engine"]
    assert read_engine_config(engines / "tiny" / "target" / "engine")["gemm_plugin"] == "bfloat16"


@pytest.mark.conversion
def test_engines_rebuild_for_another_tensorrt_llm_or_gpu(fake_trtllm, workdir, monkeypatch):
    recipe_path, engines = workdir / "recipes" / "tiny.yaml", workdir / "engines"
    B.build(load_recipe(recipe_path), engines)
    assert B.build(load_recipe(recipe_path), engines).ran == ["check"]
    monkeypatch.setattr(environment, "gpu_identity", lambda: ["NVIDIA H100 80GB HBM3, 9.0"])
    assert B.build(load_recipe(recipe_path), engines).ran == ["check", "target.engine", "draft.engine"]
    assert B.build(load_recipe(recipe_path), engines).ran == ["check"]
    versions = environment.package_versions()
    # one release, then a patch release of it: engines are built for the exact TensorRT-LLM version
    for release, ran in (("1.2.1", ["check", "target.engine", "draft.engine"]), ("1.2.1", ["check"])):
        monkeypatch.setattr(
            environment, "package_versions", lambda *a, r=release: versions | {"tensorrt_llm": r}
        )
        assert B.build(load_recipe(recipe_path), engines).ran == ran
    monkeypatch.setattr(environment, "package_versions", lambda *a: versions | {"tensorrt_llm": "1.2.2"})
    assert B.build(load_recipe(recipe_path), engines).ran == ["check", "target.engine", "draft.engine"]


def _hidden_leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


@pytest.mark.conversion
def test_interrupted_convert_leaves_no_half_written_checkpoint(monkeypatch, pair, tmp_path):
    real_export = B._export

    def interrupted(spec, out_dir, recipe, console):
        real_export(spec, out_dir, recipe, console)  # the files are there...
        raise KeyboardInterrupt  # ...and the user presses Ctrl-C before the stage is finished

    monkeypatch.setattr(B, "_export", interrupted)
    with pytest.raises(KeyboardInterrupt):
        B.build(load_recipe(pair), tmp_path / "engines")
    out = tmp_path / "engines" / "tiny"
    assert not (out / "target" / "checkpoint").exists()
    assert _hidden_leftovers(out) == []
    # A build killed outright leaves a hidden temporary; the next run removes it.
    stale = out / "target" / ".checkpoint.tmp-999-deadbeef"
    stale.mkdir(parents=True)
    (stale / "rank0.safetensors").write_bytes(b"half")
    monkeypatch.setattr(B, "_export", real_export)
    with pytest.raises(NeedsTensorRTLLM):
        B.build(load_recipe(pair), tmp_path / "engines")
    assert not stale.exists() and (out / "target" / "checkpoint" / "config.json").is_file()


@pytest.mark.conversion
def test_crashed_engine_build_leaves_no_engine_and_keeps_checkpoints(fake_trtllm, workdir):
    recipe_path, engines = workdir / "recipes" / "tiny.yaml", workdir / "engines"
    fake_trtllm.setenv("FAKE_TRTLLM_CRASH", "1")
    with pytest.raises(CheckFailed, match="engine build failed"):
        B.build(load_recipe(recipe_path), engines, engines_only=True)
    out = engines / "tiny"
    assert not (out / "target" / "engine").exists() and not (out / "draft" / "engine").exists()
    assert _hidden_leftovers(out) == []
    fake_trtllm.delenv("FAKE_TRTLLM_CRASH")
    assert B.build(load_recipe(recipe_path), engines, engines_only=True).ran == [
        "target.engine",
        "draft.engine",
    ]


@pytest.mark.conversion
def test_engine_without_speculative_mode_is_discarded(runner, fake_trtllm, workdir):
    fake_trtllm.setenv("FAKE_TRTLLM_DROP_SPECULATIVE", "1")
    recipe, engines = workdir / "recipes" / "tiny.yaml", workdir / "engines"
    result = runner.invoke(cli, ["build", str(recipe), "--engines-dir", str(engines), "--engines-only"])
    assert result.exit_code == 1
    assert "target engine" in result.output and "speculative_decoding_mode is 'none'" in result.output
    assert not (engines / "tiny" / "target" / "engine").exists()


@pytest.mark.conversion
def test_failed_preflight_stops_before_converting(tmp_path, tiny_pair):
    from tiny_models import make_model

    other = make_model(
        tmp_path / "other",
        "llama",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=400,
    )  # its own tokenizer and vocab
    recipe = write_recipe(tmp_path / "r.yaml", tiny_pair[0], other)
    # an earlier build's manifest, plan and finish script would describe checkpoints this build does not make
    earlier = tmp_path / "engines" / "tiny"
    earlier.mkdir(parents=True)
    for name in ("manifest.json", "plan.json", "finish_in_ngc.sh"):
        (earlier / name).write_text("{}")
    with pytest.raises(CheckFailed, match="pre-flight check"):
        B.build(load_recipe(recipe), tmp_path / "engines")
    assert not (tmp_path / "engines" / "tiny" / "target" / "checkpoint").exists()
    assert not list(earlier.iterdir())


def test_a_calibration_file_counts_by_its_content_not_its_path(tmp_path, tiny_pair):
    """An edited calibration file re-quantizes (its path alone would keep the stale checkpoint), and the same file
    at another path (a moved folder, the NGC container's mount) does not."""
    first, moved = tmp_path / "a" / "calib.txt", tmp_path / "b" / "calib.txt"
    for path in (first, moved):
        path.parent.mkdir()
        path.write_text("def f():\n    return 1\n")

    def part(path: Path) -> dict:
        recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair)
        overrides = {"target.quantization": "fp8", "calibration.dataset": str(path)}
        return B.convert_recipe_part(load_recipe(recipe, overrides), "target")

    before = part(first)
    assert part(moved) == before
    first.write_text("class Other:\n    pass\n")
    assert part(first) != before


def test_a_calibration_file_gone_from_its_path_is_one_line_naming_the_field(tmp_path, tiny_pair):
    """--engines-only in the NGC image, with the calibration file's folder not mounted: one line naming the
    recipe's field and the path."""
    from trtspec.core.errors import RecipeError

    calib = tmp_path / "calib.txt"
    calib.write_text("def f():\n    return 1\n")
    recipe = write_recipe(tmp_path / "r.yaml", *tiny_pair)
    overrides = {"target.quantization": "fp8", "calibration.dataset": str(calib)}
    loaded = load_recipe(recipe, overrides, check_paths=False)
    calib.unlink()
    with pytest.raises(
        RecipeError, match=r"r\.yaml: calibration\.dataset: .*calib\.txt: cannot be read \(No such"
    ):
        B.convert_recipe_part(loaded, "target")


def test_the_finish_scripts_docker_run_mounts_every_folder_it_reads(tmp_path, tiny_pair):
    """The engines folder, the recipe's folder (named relative to the script) and a quantized checkpoint's
    calibration file's, each at its own path, one folder where another holds it."""
    from trtspec.builders.manifest import script_mounts

    recipes, calib = tmp_path / "recipes", tmp_path / "data" / "calib.txt"
    recipes.mkdir()
    calib.parent.mkdir()
    calib.write_text("x\n")
    path = write_recipe(recipes / "r.yaml", *tiny_pair)
    engines = tmp_path / "proj" / "engines"
    out = engines / "tiny"
    plain = load_recipe(path)
    assert set(script_mounts(plain, out)) == {engines.resolve(), recipes.resolve()}
    quantized = load_recipe(path, {"draft.quantization": "fp8", "calibration.dataset": str(calib)})
    assert set(script_mounts(quantized, out)) == {
        engines.resolve(),
        recipes.resolve(),
        calib.parent.resolve(),
    }
    # the recipe inside the folder that holds the engines: one mount
    engines.mkdir(parents=True)
    inside = write_recipe(tmp_path / "proj" / "r.yaml", *tiny_pair)
    assert script_mounts(load_recipe(inside), out) == [(tmp_path / "proj").resolve()]
    assert script_mounts(load_recipe("demo"), out) == [engines.resolve()]


@pytest.mark.conversion
def test_engines_only_refuses_checkpoints_of_other_settings(workdir):
    recipe = load_recipe(workdir / "recipes" / "tiny.yaml", {"draft.dtype": "bfloat16"}, check_paths=False)
    with pytest.raises(CheckpointError, match="converted with other draft settings"):
        B.build(recipe, workdir / "engines", engines_only=True)
    # a checkpoint whose files changed after the build stamped them (a copy that did not keep the times of files
    # stamped by size and time): named as changed, with how to copy a build
    config = workdir / "engines" / "tiny" / "target" / "checkpoint" / "config.json"
    config.write_text(config.read_text() + "\n")
    recipe = load_recipe(workdir / "recipes" / "tiny.yaml", check_paths=False)
    with pytest.raises(
        CheckpointError, match=r"target/checkpoint: its files changed since the build wrote them; copy"
    ):
        B.build(recipe, workdir / "engines", engines_only=True)
