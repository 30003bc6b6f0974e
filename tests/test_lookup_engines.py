"""Prompt lookup on the engine runtimes: a recipe without a draft through check, build and deploy (tensorrtllm: a
target engine for external draft tokens and no draft engine), the orchestrator and the in-process TensorRT-LLM
runner proposing by lookup with the target's greedy output unchanged, and trtllm-pytorch's NGram decoding."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from trtspec.builders import plan as P
from trtspec.builders.manifest import finish_script
from trtspec.builders.preflight import run_checks
from trtspec.core import layout
from trtspec.core.errors import CheckFailed, CheckpointError, RecipeError, RequestError
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import interface as names
from trtspec.triton_repo import llmapi
from trtspec.triton_repo.checks import check_repository
from trtspec.triton_repo.deploy import MANIFEST, deploy
from trtspec.triton_repo.render import parse_model_config

K = 4


def lookup_recipe(target_dir: Path, draft_dir: Path | None = None, proposer: str = "ngram", **sections):
    """A recipe over the tiny target (and draft), proposing by ``proposer``; ``sections``: merged in."""
    data = {
        "name": "lookup",
        "target": {"model": str(target_dir)},
        "speculative": {"proposer": proposer, "max_draft_len": K},
        "limits": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
    }
    if draft_dir is not None:
        data["draft"] = {"model": str(draft_dir)}
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return recipe_from_dict(data)


def repo_configs(repo: Path) -> dict:
    return {
        m.name: parse_model_config((m / "config.pbtxt").read_text(), m.name)
        for m in repo.iterdir()
        if (m / "config.pbtxt").is_file()
    }


def parameters(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


# ------------------------------------------------------------------ check


def test_a_recipe_without_a_draft_needs_prompt_lookup(tiny_pair):
    with pytest.raises(RecipeError, match="draft"):
        lookup_recipe(tiny_pair[0], proposer="draft")
    with pytest.raises(RecipeError, match="draft"):
        lookup_recipe(tiny_pair[0], proposer="draft+ngram")


@pytest.mark.parametrize("runtime", ["tensorrtllm", "trtllm-pytorch", "torch"])
def test_check_of_a_recipe_without_a_draft_has_the_targets_checks_only(tiny_pair, runtime):
    report = run_checks(lookup_recipe(tiny_pair[0], triton={"runtime": runtime}), trtllm_version="1.2.1")
    status = {r.name: r.status for r in report.results}
    assert report.ok, [r for r in report.results if r.status == "fail"]
    assert status["proposer"] == "pass" and "vocab size (target)" in status
    assert not {"tokenizer", "padded vocab", "draft size", "vocab size (draft)"} & set(status)
    assert [row.role for row in report.memory] == ["target"]


def test_check_refuses_draft_plus_ngram_on_trtllm_pytorch_in_one_line(tiny_pair):
    recipe = lookup_recipe(*tiny_pair, proposer="draft+ngram", triton={"runtime": "trtllm-pytorch"})
    report = run_checks(recipe, trtllm_version="1.2.1")
    (runtime,) = [r for r in report.results if r.name == "runtime"]
    assert not report.ok and runtime.status == "fail"
    assert "no combined proposer" in runtime.message and "\n" not in runtime.message
    # the same recipe serves under the engine runtimes, where the orchestrator chooses per row and round
    engine = run_checks(
        recipe.model_copy(update={"triton": recipe.triton.model_copy(update={"runtime": "torch"})})
    )
    assert engine.ok


# ------------------------------------------------------------------ build plan and build


def test_the_plan_without_a_draft_is_the_target_engine_for_external_draft_tokens(tmp_path):
    recipe = recipe_from_dict(
        {
            "name": "lk",
            "target": {"model": "/nowhere"},
            "speculative": {"proposer": "ngram", "max_draft_len": 6},
        },
        check_paths=False,
    )
    facts = P.checkpoint_facts(
        {"architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": 320, "mapping": {}}
    )
    plan = P.make_build_plan(recipe, {"target": (tmp_path / "ckpt", facts)}, {"target": tmp_path / "engine"})
    assert plan.draft is None and [e.role for e in plan.engines()] == ["target"]
    argv = plan.target.command()
    i = argv.index("--speculative_decoding_mode")
    assert argv[i : i + 4] == ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "6"]
    assert P.BuildPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    script = finish_script(recipe, plan, tmp_path)
    builds = [shlex.split(line) for line in script.splitlines() if line.startswith("trtllm-build")]
    assert len(builds) == 1 and builds[0][builds[0].index("--output_dir") + 1] == "target/engine"


@pytest.mark.slow
@pytest.mark.conversion
def test_build_without_a_draft_converts_and_builds_the_target_alone(fake_trtllm, tiny_pair, tmp_path):
    """The real convert of the target, the tensorrt_llm stand-in's engine build, then deploy from the build's
    layout: nothing of a draft anywhere."""
    from trtspec.builders.build import build
    from trtspec.core.engine_config import read_engine_config

    target = Path(shutil.copytree(tiny_pair[0], tmp_path / "target"))
    recipe = lookup_recipe(target, speculative={"use_draft_logits": False})
    result = build(recipe, tmp_path / "engines")
    out = tmp_path / "engines" / "lookup"
    assert result.manifest["status"] == "complete" and sorted(result.ran) == [
        "check",
        "target.checkpoint",
        "target.engine",
    ]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["logs", "target"]
    assert list(result.manifest["inputs"]) == ["target.model"]
    assert list(json.loads((out / "plan.json").read_text())["engines"]) == ["target"]
    engine = read_engine_config(out / "target" / "engine")
    assert (engine["speculative_decoding_mode"], engine["max_draft_len"]) == ("draft_tokens_external", K)
    repo = deploy(recipe, "tensorrtllm", tmp_path / "repo", engines_dir=tmp_path / "engines")
    assert names.DRAFT_MODEL not in repo.models


# ------------------------------------------------------------------ deploy (tensorrtllm)


def test_deploy_without_a_draft_writes_no_draft_engine_model_and_the_lookup_parameters(tiny_pair, tmp_path):
    from harness.repo import fake_engine

    recipe = lookup_recipe(tiny_pair[0], speculative={"prompt_lookup_min": 1, "prompt_lookup_max": 3})
    engines = tmp_path / "engines"
    fake_engine(
        layout.stage_dir(layout.pair_dir("lookup", engines), "target", layout.ENGINE), max_draft_len=K
    )
    result = deploy(recipe, "tensorrtllm", tmp_path / "repo", engines_dir=engines)
    assert sorted(result.models) == sorted([names.ORCHESTRATOR, names.ENSEMBLE, names.TARGET_MODEL])
    configs = repo_configs(tmp_path / "repo")
    params = parameters(configs[names.ORCHESTRATOR])
    assert params["tensorrt_llm_draft_model_name"] == "" and params["draft_vocab_rows"] == "0"
    assert (params["proposer"], params["prompt_lookup_min"], params["prompt_lookup_max"]) == (
        "ngram",
        "1",
        "3",
    )
    info = json.loads((tmp_path / "repo" / MANIFEST).read_text())
    assert list(info["world_size"]) == ["target"] and info["launch"]["mode"] == "orchestrator"
    # The schema checks: fine without the draft model, but a draft model the orchestrator does not name, or a
    # named draft model that is missing, is a broken repository.
    check_repository(configs)
    draft = parse_model_config(
        (tmp_path / "repo" / names.TARGET_MODEL / "config.pbtxt")
        .read_text()
        .replace(f'name: "{names.TARGET_MODEL}"', f'name: "{names.DRAFT_MODEL}"', 1),
        names.DRAFT_MODEL,
    )
    with pytest.raises(CheckFailed, match="names no draft model, yet the repository holds"):
        check_repository(configs | {names.DRAFT_MODEL: draft})
    configs[names.ORCHESTRATOR].parameters["tensorrt_llm_draft_model_name"].string_value = names.DRAFT_MODEL
    with pytest.raises(CheckFailed, match="does not contain"):
        check_repository(configs)


def test_deploy_refuses_a_target_engine_without_external_draft_tokens(tiny_pair, tmp_path):
    from harness.repo import fake_engine

    plain = fake_engine(tmp_path / "target", max_draft_len=0)
    with pytest.raises(CheckFailed, match="draft_tokens_external"):
        deploy(lookup_recipe(tiny_pair[0]), "tensorrtllm", tmp_path / "repo", engine_dirs={"target": plain})
    assert not (tmp_path / "repo").exists()


# ------------------------------------------------------------------ the orchestrator over BLS


class _Metrics:
    def __init__(self, *args):
        self.added = []

    def add(self, counts, finish_reason: str, by_proposer: dict | None = None) -> None:
        self.added.append((counts, by_proposer))

    def refuse(self) -> None:
        self.added.append("refused")


class _Pb:
    @staticmethod
    def using_decoupled_model_transaction_policy(config) -> bool:
        return bool(config.get("model_transaction_policy", {}).get("decoupled"))


def served_orchestrator(monkeypatch, recipe, repo: Path, calls: list):
    """The rendered repository's orchestrator (Orchestrator.from_args over its config.pbtxt), its BLS calls
    answered in-process by the harness's stand-in engine models (the PyTorch engine behind TensorRT-LLM's tensors);
    ``calls`` records the model each call went to."""
    from google.protobuf import json_format
    from harness.engine_model import TorchEngine
    from harness.repo import ROLES, deploy_harness
    from harness.steps import StepModel

    from trtspec.triton_repo.models import orchestrator

    deploy_harness(recipe, repo)
    engines = {
        ROLES[role]: TorchEngine(
            StepModel.from_pretrained(spec.model, num_slots=1, max_seq_len=160, max_draft_len=K + 1), role
        )
        for role, spec in recipe.models().items()
    }

    def bls(model, inputs, outputs):
        calls.append(model)
        ids, _ = engines[model].run(inputs)
        return {"output_ids": np.array([[ids]], dtype=np.int32), "sequence_length": np.array([[len(ids)]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    monkeypatch.setattr(orchestrator.io, "SpecDecodeMetrics", _Metrics)
    monkeypatch.setattr(orchestrator.io, "pb", _Pb)
    config = parse_model_config((repo / names.ORCHESTRATOR / "config.pbtxt").read_text(), names.ORCHESTRATOR)
    model_config = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    return orchestrator.Orchestrator.from_args(
        {"model_config": model_config, "model_name": names.ORCHESTRATOR}
    )


def _request(**fields):
    from trtspec.triton_repo.models.request import parse_request

    def tensor(value):
        return np.array([[value.encode() if isinstance(value, str) else value]])

    return lambda model: parse_request({k: tensor(v) for k, v in fields.items()}, model.limits)


PROMPT = "for i in range(10):"


@pytest.fixture(scope="module")
def reference(tiny_pair):
    from triton_server import hf_greedy

    return hf_greedy(tiny_pair[0])


def test_the_orchestrator_without_a_draft_proposes_by_lookup_with_the_target_greedy_output(
    monkeypatch, tiny_pair, reference, tmp_path
):
    calls = []
    model = served_orchestrator(monkeypatch, lookup_recipe(tiny_pair[0]), tmp_path / "repo", calls)
    assert model.draft is None and model.proposer == "ngram"
    text, ids, stats = model._whole(_request(text_input=PROMPT, max_tokens=32)(model))
    assert (text, ids) == reference(PROMPT, 32, with_ids=True)
    assert set(calls) == {names.TARGET_MODEL}  # no draft engine model to call
    assert stats.drafted > 0 and set(stats.by_proposer) == {"ngram"}
    assert stats.by_proposer["ngram"][1:] == [stats.drafted, stats.accepted]
    assert model.metrics.added[-1][1] == stats.by_proposer  # /metrics counts it under proposer ngram
    with pytest.raises(RequestError, match="needs a draft model and this deployment has none"):
        model._whole(_request(text_input=PROMPT, max_tokens=8, proposer="draft")(model))


def test_the_orchestrator_with_both_proposers_keeps_the_greedy_output_and_a_request_may_pin_one(
    monkeypatch, tiny_pair, reference, tmp_path
):
    calls = []
    recipe = lookup_recipe(*tiny_pair, proposer="draft+ngram")
    model = served_orchestrator(monkeypatch, recipe, tmp_path / "repo", calls)
    assert model.draft == names.DRAFT_MODEL and model.proposer == "draft+ngram"
    expected = reference(PROMPT, 32, with_ids=True)
    for proposer, callee in (("", names.DRAFT_MODEL), ("ngram", None), ("draft", names.DRAFT_MODEL)):
        calls.clear()
        text, ids, stats = model._whole(_request(text_input=PROMPT, max_tokens=32, proposer=proposer)(model))
        assert (text, ids) == expected, proposer
        assert (names.DRAFT_MODEL in calls) == (callee is not None), proposer
        assert stats.drafted > 0
    assert "ngram" not in stats.by_proposer  # the last request pinned the draft model


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.one_stack
def test_a_served_repository_without_a_draft_answers_by_lookup_through_tritonserver(
    tiny_pair, reference, tmp_path
):
    from harness.repo import deploy_harness
    from triton_server import grpc_stream, running_server

    repo = deploy_harness(lookup_recipe(tiny_pair[0]), tmp_path / "repo")
    assert not (repo / names.DRAFT_MODEL).exists()
    with running_server(repo, tmp_path / "server.log") as srv:
        for stream in (True, False):
            pieces, metrics = grpc_stream(srv, PROMPT, stream=stream, max_tokens=32, return_perf_metrics=True)
            assert "".join(pieces) == reference(PROMPT, 32)
            assert metrics["total_draft_tokens"] > 0
        with pytest.raises(Exception, match="needs a draft model"):
            grpc_stream(srv, PROMPT, max_tokens=8, proposer="draft")


# ------------------------------------------------------------------ the in-process TensorRT-LLM runner


@pytest.fixture
def one_thread():
    """Tiny models' forwards on one torch thread (as tests/test_trtllm_runner.py: thread start-up dominates)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_runner_without_a_draft_engine_proposes_by_lookup(fake_trtllm, one_thread, tiny_pair, tmp_path):
    from test_trtllm_runner import hf_greedy, write_engine

    from trtspec.engines.sampling import SamplingParams
    from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner

    engines = tmp_path / "engines"
    root = layout.pair_dir("lookup", engines)
    write_engine(layout.stage_dir(root, "target", layout.ENGINE), tiny_pair[0], max_draft_len=K)
    runner = TrtllmSpeculativeRunner.from_recipe(lookup_recipe(tiny_pair[0]), engines_dir=engines)
    assert runner.draft is None and runner.max_draft_len == K and runner.proposer == "ngram"
    prompt = (1, 40, 41, 42, 43, 40, 41, 42, 43, 40)
    from tensorrt_llm.runtime import ModelRunnerCpp

    ModelRunnerCpp.calls.clear()
    (result,) = runner.generate([list(prompt)], SamplingParams(max_new_tokens=20, ignore_eos=True))
    assert result.token_ids == hf_greedy(tiny_pair[0], prompt, 20)
    assert result.stats.drafted > 0 and set(result.stats.by_proposer) == {"ngram"}
    assert {d for d, _ in ModelRunnerCpp.calls} == {str(layout.stage_dir(root, "target", layout.ENGINE))}
    assert any(kw.get("draft_tokens_list") for _, kw in ModelRunnerCpp.calls)
    # A target engine built without external draft tokens cannot take looked-up ones.
    plain = write_engine(tmp_path / "plain", tiny_pair[0])
    with pytest.raises(CheckpointError, match="built without draft support"):
        TrtllmSpeculativeRunner.from_engine_dirs(plain, None, proposer="ngram")
    assert TrtllmSpeculativeRunner.from_engine_dirs(plain, None).max_draft_len == 0  # target-only still loads


# ------------------------------------------------------------------ trtllm-pytorch: upstream's NGram decoding


def hf_dir(path: Path, vocab_size: int = 320) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size})
    )
    return path


def test_trtllm_pytorch_serves_lookup_as_upstreams_ngram_decoding(tmp_path):
    from test_llmapi import fake_llm_args

    target = hf_dir(tmp_path / "target")
    recipe = lookup_recipe(target, speculative={"prompt_lookup_max": 3}, triton={"runtime": "trtllm-pytorch"})
    result = deploy(recipe, None, tmp_path / "repo")
    assert result.models == [llmapi.MODEL_NAME]
    data = yaml.safe_load((tmp_path / "repo" / llmapi.MODEL_NAME / "1" / "model.yaml").read_text())
    assert data["model"] == str(target.resolve())
    # adaptive K without a draft: no acceptance gate (a lookup costs no forward)
    assert data["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": K,
        "max_matching_ngram_size": 3,
        "is_use_oldest": False,
        "is_public_pool": False,
        "max_concurrency": 2,
    }
    fields = {k: v for k, v in data["speculative_config"].items() if k != "decoding_type"}
    config = fake_llm_args().NGramDecodingConfig(**fields)  # the pinned release's names and checks
    assert (config.max_draft_len, config.max_matching_ngram_size) == (K, 3)
    pinned = lookup_recipe(target, speculative={"num_draft_tokens": 2}, triton={"runtime": "trtllm-pytorch"})
    spec = llmapi.model_yaml(pinned, {"target": target})["speculative_config"]
    assert (spec["max_draft_len"], spec["max_matching_ngram_size"]) == (
        2,
        4,
    ) and "max_concurrency" not in spec


def test_the_ngram_config_takes_only_upstreams_fields(tmp_path):
    from pydantic import ValidationError
    from test_llmapi import fake_llm_args

    recipe = lookup_recipe(hf_dir(tmp_path / "target"), triton={"runtime": "trtllm-pytorch"})
    data = llmapi.model_yaml(recipe, {"target": tmp_path / "target"})
    llmapi.check_model_yaml(data)
    spec = data["speculative_config"]
    for broken, fragment in (
        (spec | {"speculative_model_dir": "x"}, "speculative_config.speculative_model_dir"),
        (spec | {"prompt_lookup_min": 2}, "speculative_config.prompt_lookup_min"),
        (spec | {"decoding_type": "Ngram"}, "decoding_type must be DraftTarget or NGram"),
    ):
        with pytest.raises(CheckFailed, match=fragment):
            llmapi.check_model_yaml(data | {"speculative_config": broken})
    ngram = fake_llm_args().NGramDecodingConfig
    with pytest.raises(ValidationError, match="max_draft_len must be > 0"):
        ngram(max_draft_len=0, max_matching_ngram_size=2)
    with pytest.raises(ValidationError, match="prompt_lookup_max"):
        ngram(max_draft_len=4, prompt_lookup_max=2)


def test_trtllm_pytorch_refuses_draft_plus_ngram_at_deploy(tmp_path):
    recipe = lookup_recipe(
        hf_dir(tmp_path / "target"), hf_dir(tmp_path / "draft"), proposer="draft+ngram",
        triton={"runtime": "trtllm-pytorch"},
    )  # fmt: skip
    with pytest.raises(CheckFailed, match="no combined proposer") as err:
        deploy(recipe, None, tmp_path / "repo")
    assert "\n" not in err.value.message and not (tmp_path / "repo").exists()


def test_check_names_what_ngram_decoding_takes_of_the_recipe(tiny_pair):
    recipe = lookup_recipe(tiny_pair[0], triton={"runtime": "trtllm-pytorch"})
    checks = [r for r in run_checks(recipe, trtllm_version="1.2.1").results if r.name == "adaptive K"]
    assert [c.status for c in checks] == ["pass"]
    assert "max_matching_ngram_size 4" in checks[0].message and "no acceptance gate" in checks[0].message
    assert "acceptance_window" not in checks[0].details
    explicit = lookup_recipe(
        tiny_pair[0], speculative={"prompt_lookup_min": 3}, triton={"runtime": "trtllm-pytorch"}
    )
    warned = [r for r in run_checks(explicit, trtllm_version="1.2.1").results if r.status == "warn"]
    assert [w.name for w in warned] == ["adaptive K"] and "prompt_lookup_min 3" in warned[0].message


@pytest.mark.conversion
def test_convert_both_models_of_a_recipe_without_a_draft_converts_the_target(runner, tiny_pair, tmp_path):
    from trtspec.cli import cli

    path = tmp_path / "lookup.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "lk", "target": {"model": str(tiny_pair[0])}, "speculative": {"proposer": "ngram"}}
        )
    )
    out = tmp_path / "ckpt"
    result = runner.invoke(cli, ["convert", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (converted,) = json.loads(result.stdout)["checkpoints"]  # the target only: there is no draft to convert
    assert converted["role"] == "target" and converted["verification"]["passed"]
    assert (out / "config.json").is_file() and (out / "rank0.safetensors").is_file()


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.one_stack
def test_a_served_trtllm_pytorch_repository_looks_up_through_the_ngram_config(
    tiny_pair, reference, tmp_path, monkeypatch
):
    """Upstream's LLM-API model stand-in (tests/fake_llmapi) validates model.yaml's NGram config as the pinned
    release does and generates by prompt lookup over the target alone."""
    from test_llmapi_serve import FAKE_LLMAPI_DIR
    from triton_server import running_server

    from trtspec.validate.triton_client import TritonClient

    recipe = lookup_recipe(tiny_pair[0], target={"dtype": "float32"}, triton={"runtime": "trtllm-pytorch"})
    deploy(recipe, None, tmp_path / "repo")
    monkeypatch.setenv(llmapi.UPSTREAM_DIR_ENV, str(FAKE_LLMAPI_DIR))
    monkeypatch.setenv("FAKE_LLMAPI_FILLED_METRICS", "1")  # drafted counts, as after #17082: lookup drafted
    with running_server(tmp_path / "repo", tmp_path / "server.log") as server:
        client = TritonClient(server.ports.grpc_url)
        client.check_ready()
        response = client.generate(PROMPT, 32, stream=False)
    assert response.text == reference(PROMPT, 32)
    assert response.metrics["total_draft_tokens"] > 0


def test_align_of_a_recipe_without_a_draft_is_a_one_line_error(tiny_pair, tmp_path):
    from click.testing import CliRunner

    from trtspec.cli import cli

    path = tmp_path / "lookup.yaml"
    path.write_text(yaml.safe_dump(lookup_recipe(tiny_pair[0]).model_dump(mode="json", exclude_none=True)))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    args = ["align", str(path), "--prompts", str(prompts), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "draft: align distils a draft model and this recipe has none" in result.output
    assert not (tmp_path / "out").exists()
