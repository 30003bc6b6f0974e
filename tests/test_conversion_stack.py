"""The conversion path (ModelOpt) runs on the pinned stack only; elsewhere its commands refuse in one line.

These tests run on both stacks CI tests: the pinned one (where a transformers 5 stack is passed in or patched in)
and the newest releases (where it is the real one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtspec.builders import environment, support
from trtspec.builders.preflight import check_conversion
from trtspec.cli import cli
from trtspec.recipe import recipe_from_dict

PINNED = {"nvidia-modelopt": "0.37.0", "transformers": "4.57.3"}
NEWEST = {"nvidia-modelopt": None, "transformers": "5.23.0"}


@pytest.mark.parametrize(
    "versions",
    [PINNED, {"nvidia-modelopt": "0.37.1", "transformers": "4.56.0"}],
    ids=["trtllm-1.2.1", "oldest"],
)
def test_the_pinned_stack_converts(versions):
    assert support.conversion_stack_problem(versions) is None


@pytest.mark.parametrize(
    "versions, found",
    [
        (NEWEST, "found no nvidia-modelopt, transformers 5.23.0;"),
        (PINNED | {"transformers": "5.0.0"}, "found transformers 5.0.0;"),
        (PINNED | {"transformers": "4.55.4"}, "found transformers 4.55.4;"),
        (PINNED | {"nvidia-modelopt": "0.39.0"}, "found nvidia-modelopt 0.39.0;"),
        ({"transformers": "4.57.3"}, "found no nvidia-modelopt;"),
        (PINNED | {"transformers": "not-a-version"}, "found transformers not-a-version;"),
    ],
)
def test_any_other_stack_is_one_line_naming_the_pinned_one_and_the_install(versions, found):
    problem = support.conversion_stack_problem(versions)
    assert problem is not None and "\n" not in problem
    assert "nvidia-modelopt>=0.37,<0.38, transformers>=4.56,<5" in problem
    assert found in problem
    assert "pip install 'trtspec[convert]'" in problem


def test_the_convert_extra_installs_the_stack_the_gate_accepts():
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["convert"]]
    assert {r.name: str(r.specifier) for r in extra} == {
        name: str(Requirement(name + spec).specifier) for name, spec in support.CONVERSION_STACK.items()
    }


@pytest.fixture
def without_conversion_stack(monkeypatch):
    """A stack without the pinned conversion libraries: the real one on the newest-releases run, else
    transformers 5 without nvidia-modelopt patched in where trtspec reads the installed versions."""
    if support.conversion_stack_problem(environment.package_versions()) is None:
        real = environment.package_versions
        monkeypatch.setattr(environment, "package_versions", lambda *a: real(*a) | NEWEST)
    assert support.conversion_stack_problem(environment.package_versions()) is not None


def _recipe(tiny_pair, runtime="tensorrtllm", quantization="none") -> dict:
    target, draft = tiny_pair
    return {
        "name": "tiny",
        "target": {"model": str(target), "quantization": quantization},
        "draft": {"model": str(draft)},
        "triton": {"runtime": runtime},
    }


@pytest.mark.parametrize(
    "command, runtime, quantization",
    [
        (["convert"], "tensorrtllm", "none"),
        (["quantize", "--target-format", "fp8"], "tensorrtllm", "none"),
        (["build"], "tensorrtllm", "none"),
        (["build"], "trtllm-pytorch", "fp8"),
    ],
    ids=["convert", "quantize", "build", "build-trtllm-pytorch"],
)
def test_conversion_commands_refuse_in_one_line_before_any_work(
    runner, tmp_path, tiny_pair, without_conversion_stack, command, runtime, quantization
):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tiny_pair, runtime, quantization)))
    out = tmp_path / "out"
    where = ["--engines-dir", str(out)] if command[0] == "build" else ["--out", str(out)]
    result = runner.invoke(cli, [*command, str(path), *where])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: converting with ModelOpt needs the TensorRT-LLM 1.2.1 stack")
    assert "pip install 'trtspec[convert]'" in line
    assert not out.exists()


def test_engines_only_and_unquantized_trtllm_pytorch_builds_need_no_conversion(tiny_pair):
    assert environment.conversion_roles(recipe_from_dict(_recipe(tiny_pair, "trtllm-pytorch"))) == []
    quantized = recipe_from_dict(_recipe(tiny_pair, "trtllm-pytorch", "fp8"))
    assert environment.conversion_roles(quantized) == ["target"]
    assert environment.conversion_roles(recipe_from_dict(_recipe(tiny_pair))) == ["target", "draft"]


def test_check_reports_the_conversion_stack_where_the_runtime_converts(tiny_pair):
    recipe = recipe_from_dict(_recipe(tiny_pair))
    (passed,) = check_conversion(recipe, PINNED)
    assert passed.status == "pass" and "transformers 4.57.3" in passed.message
    (warned,) = check_conversion(recipe, NEWEST)
    assert warned.status == "warn" and "pip install 'trtspec[convert]'" in warned.message
    assert check_conversion(recipe_from_dict(_recipe(tiny_pair, "torch")), NEWEST) == []
    assert check_conversion(recipe_from_dict(_recipe(tiny_pair, "trtllm-pytorch")), NEWEST) == []


def test_check_cli_warns_without_failing(runner, tmp_path, tiny_pair, without_conversion_stack):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tiny_pair)))
    result = runner.invoke(cli, ["check", str(path), "--json"])
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["conversion"]["status"] == "warn"
    assert "pip install 'trtspec[convert]'" in checks["conversion"]["message"]
