"""The trtllm-pytorch runtime: upstream's Triton LLM-API model, its model.yaml (field names of the pinned
TensorRT-LLM), config.pbtxt parsed by Triton's schema and kept equal to model.yaml's triton_config, the launcher
that loads upstream's model.py from the image, and the manifest clients read.

tensorrt_llm cannot run here: the loaded "upstream" model.py is a stand-in with upstream's layout (model.py
importing its sibling helpers.py, a TritonPythonModel class).
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from trtspec.builders import support
from trtspec.core.errors import CheckFailed, ServerError
from trtspec.outputs import EDIT_RECORD
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import llmapi
from trtspec.triton_repo.deploy import MANIFEST, deploy
from trtspec.triton_repo.render import parse_model_config
from trtspec.triton_repo.serve import ServeSpec, serve


def hf_dir(path, vocab_size: int = 320):
    path.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def pair(tmp_path):
    return hf_dir(tmp_path / "hf" / "target"), hf_dir(tmp_path / "hf" / "draft")


def make_recipe(pair, **sections):
    target, draft = pair
    data = {
        "name": "llm",
        "target": {"model": str(target)},
        "draft": {"model": str(draft)},
        "speculative": {"max_draft_len": 5},
        "limits": {"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 300},
        "triton": {"runtime": "trtllm-pytorch"},
    }
    for key, value in sections.items():
        data[key] = data.get(key, {}) | value
    return recipe_from_dict(data)


def test_deploy_writes_the_llmapi_model(pair, tmp_path):
    recipe = make_recipe(
        pair,
        target={"tp_size": 2, "dtype": "bfloat16"},
        triton={"decoupled": True, "kv_cache_free_gpu_mem_fraction": {"target": 0.8, "draft": 0.1}},
    )
    repo = tmp_path / "repo"
    result = deploy(recipe, None, repo)
    assert result.runtime == "trtllm-pytorch" and result.models == ["tensorrt_llm"]
    assert sorted(p.name for p in repo.iterdir()) == [EDIT_RECORD, "tensorrt_llm", MANIFEST]
    assert sorted(p.name for p in (repo / "tensorrt_llm" / "1").iterdir()) == ["model.py", "model.yaml"]
    data = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data == {
        "model": str(pair[0].resolve()),
        "backend": "pytorch",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "dtype": "bfloat16",
        "trust_remote_code": False,
        "max_batch_size": 4,
        "max_input_len": 100,
        "max_seq_len": 300,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": True},
        "speculative_config": {
            "decoding_type": "DraftTarget",
            "max_draft_len": 5,
            "speculative_model_dir": str(pair[1].resolve()),
            # adaptive K (no num_draft_tokens): the acceptance gate at K 5 x draft_cost_ratio 0.2
            "max_concurrency": 4,
            "acceptance_window": support.LLMAPI_ACCEPTANCE_WINDOW,
            "acceptance_length_threshold": 1.0,
        },
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    config = parse_model_config((repo / "tensorrt_llm" / "config.pbtxt").read_text(), "tensorrt_llm")
    assert (config.name, config.backend, config.max_batch_size) == ("tensorrt_llm", "python", 0)
    assert config.model_transaction_policy.decoupled is True
    inputs = {t.name for t in config.input}
    assert {"text_input", "streaming", "sampling_param_max_tokens"} <= inputs
    assert [t.name for t in config.input if not t.optional] == ["text_input"]
    assert "load_upstream_model" in (repo / "tensorrt_llm" / "1" / "model.py").read_text()
    info = json.loads((repo / MANIFEST).read_text())
    assert (info["entry_point"], info["interface"], info["runtime"]) == (
        "tensorrt_llm",
        "llmapi",
        "trtllm-pytorch",
    )
    assert info["tensorrt_llm"] == {
        "version": support.TRTLLM_PYTORCH_VERSION,
        "image": support.NGC_TRITON_TRTLLM_PYTORCH_IMAGE,
    }
    assert info["launch"]["mode"] == "llmapi" and info["launch"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_padded_vocab_pair_is_refused_with_the_reason(tmp_path):
    """TensorRT-LLM's DraftTarget subtracts the draft's probabilities from the target's at a rejected sampled
    token; with Qwen2.5's 151936/152064 rows that is a size error, so deploy refuses the pair as check does."""
    pair = hf_dir(tmp_path / "target", 152064), hf_dir(tmp_path / "draft", 151936)
    with pytest.raises(CheckFailed, match="DraftTarget .* serve this pair with runtime torch or tensorrtllm"):
        deploy(make_recipe(pair), None, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_model_yaml_uses_only_the_pinned_field_names(pair):
    data = llmapi.model_yaml(make_recipe(pair), {"target": pair[0], "draft": pair[1]})
    llmapi.check_model_yaml(data)
    assert set(data) <= llmapi.LLM_ARGS_KEYS
    assert set(data["speculative_config"]) <= llmapi.SPECULATIVE_KEYS
    assert {"decoding_type", "max_draft_len", support.LLMAPI_SPECULATIVE_MODEL_KEY} <= set(
        data["speculative_config"]
    )
    for broken, fragment in (
        (data | {"speculative_model_dir": "x"}, "unknown key speculative_model_dir"),
        (
            data | {"speculative_config": data["speculative_config"] | {"speculative_model": "x"}},
            "speculative_config.speculative_model",
        ),
        (data | {"kv_cache_config": {"free_gpu_mem_fraction": 0.5}}, "kv_cache_config.free_gpu_mem_fraction"),
        (
            data | {"speculative_config": data["speculative_config"] | {"decoding_type": "Draft_Target"}},
            "DraftTarget",
        ),
        ({k: v for k, v in data.items() if k != "triton_config"}, "triton_config is required"),
    ):
        with pytest.raises(CheckFailed, match=fragment):
            llmapi.check_model_yaml(broken)


def fake_llm_args():
    """tests/fake_llmapi/llm_args.py: TensorRT-LLM 1.2.x's DraftTarget config and K rules, written apart from
    trtspec's support.py."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "fake_llmapi" / "llm_args.py"
    name = "fake_llmapi_llm_args"
    if name not in sys.modules:  # pydantic resolves the annotations through the module
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def upstream_config(data: dict):
    fields = {k: v for k, v in data["speculative_config"].items() if k != "decoding_type"}
    return fake_llm_args().DraftTargetDecodingConfig(**fields)


SCHEDULES = [
    None,
    {4: 8, 16: 0},  # on up to 4 in flight, then off: max_concurrency alone
    {2: 8, 8: 4, 16: 2, 32: 0},
    {1: 8, 4: 4, 8: 2, 16: 0},
    {3: 4, 9: 4, 12: 1},  # K 4 at one request (< max_draft_len 8), past the last key K 1 holds
    {8: 8},
]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_adaptive_k_is_written_as_tensorrt_llm_reads_it(pair, schedule):
    """For every number of requests in flight, 1.2.x's rules on the written fields give the K trtspec's schedule
    caps an adaptive request at (engines.adaptive.schedule_cap), and the written config passes 1.2.x's
    validation."""
    from trtspec.engines.adaptive import schedule_cap

    recipe = make_recipe(
        pair, speculative={"max_draft_len": 8, "schedule": schedule}, limits={"max_batch_size": 40}
    )
    data = llmapi.model_yaml(recipe, {"target": pair[0], "draft": pair[1]})
    llmapi.check_model_yaml(data)
    config = upstream_config(data)
    rules = fake_llm_args()
    for in_flight in range(1, 41):
        cap = schedule_cap(schedule, in_flight)
        expected = 8 if cap is None else min(cap, 8)
        assert rules.iteration_draft_len(config, in_flight, 40) == expected, (schedule, in_flight)
    assert (config.acceptance_window, config.max_concurrency is not None) == (
        support.LLMAPI_ACCEPTANCE_WINDOW,
        True,
    )


def test_the_acceptance_gate_stops_drafting_below_break_even(pair):
    """The threshold is where core.metrics' analytic speedup is 1 (accepted draft tokens per round = K x
    draft_cost_ratio): requests just above it keep drafting, a window of requests below it turns drafting off."""
    from trtspec.core.metrics import analytic_speedup_bound

    recipe = make_recipe(pair, speculative={"max_draft_len": 4, "draft_cost_ratio": 0.3})
    config = upstream_config(llmapi.model_yaml(recipe, {"target": pair[0], "draft": pair[1]}))
    threshold = config.acceptance_length_threshold
    assert analytic_speedup_bound(1 + threshold, 4, 0.3) == pytest.approx(1.0)
    window, gate_class = config.acceptance_window, fake_llm_args().SpeculationGate
    paying = gate_class(window, threshold)
    for _ in range(3 * window):
        paying.record(1 + threshold + 0.01)  # decoded tokens per iteration = 1 + accepted draft tokens
    assert not paying.disabled
    gate = gate_class(window, threshold)
    for _ in range(window - 1):  # judged only once a window of requests has finished
        gate.record(1 + threshold - 0.01)
    assert not gate.disabled
    gate.record(1 + threshold - 0.01)
    assert gate.disabled
    assert fake_llm_args().iteration_draft_len(config, 1, 4, gate.disabled) == 0


def test_a_pinned_k_is_every_requests_k(pair):
    recipe = make_recipe(pair, speculative={"max_draft_len": 6, "num_draft_tokens": 3, "schedule": {4: 2}})
    data = llmapi.model_yaml(recipe, {"target": pair[0], "draft": pair[1]})
    assert {k: v for k, v in data["speculative_config"].items() if k != "speculative_model_dir"} == {
        "decoding_type": "DraftTarget",
        "max_draft_len": 3,
    }
    assert fake_llm_args().iteration_draft_len(upstream_config(data), 4, 4) == 3


def test_a_schedule_that_never_drafts_is_refused(pair, tmp_path):
    recipe = make_recipe(pair, speculative={"schedule": {2: 0}})
    with pytest.raises(
        CheckFailed, match=r"schedule \{2: 0\} drafts nothing even with one request in flight"
    ):
        deploy(recipe, None, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_the_stand_in_refuses_what_tensorrt_llm_refuses():
    """The fake's validation is 1.2.x's, so a field trtspec wrote wrongly fails in these tests as in the image."""
    from pydantic import ValidationError

    config = fake_llm_args().DraftTargetDecodingConfig
    good = {"max_draft_len": 4, "speculative_model_dir": "/d"}
    assert config(**good, draft_len_schedule={4: 2, 1: 4}).draft_len_schedule == {1: 4, 4: 2}
    for extra in (
        {"num_draft_tokens": 2},  # not a DecodingBaseConfig field
        {"draft_len_schedule": {2: 4}},  # must hold batch size 1
        {"draft_len_schedule": {1: 3}},  # [1] must equal max_draft_len
        {"acceptance_window": -1},
        {"acceptance_rate_threshold": 0.5},  # 1.3's name
    ):
        with pytest.raises(ValidationError):
            config(**good, **extra)


def test_config_must_agree_with_triton_config(pair, tmp_path):
    deploy(make_recipe(pair, triton={"decoupled": False}), None, tmp_path / "r")
    text = (tmp_path / "r" / "tensorrt_llm" / "config.pbtxt").read_text()
    data = yaml.safe_load((tmp_path / "r" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    llmapi.check_llmapi_config(parse_model_config(text, "t"), data)
    with pytest.raises(CheckFailed, match="differ from model.yaml triton_config"):
        llmapi.check_llmapi_config(
            parse_model_config(text, "t"), data | {"triton_config": {"max_batch_size": 0, "decoupled": True}}
        )
    renamed = text.replace('"text_output"', '"OUTPUT"')
    with pytest.raises(CheckFailed, match="output 'text_output' must be TYPE_STRING"):
        llmapi.check_llmapi_config(parse_model_config(renamed, "t"), data)


def test_quantized_models_load_the_modelopt_hf_export(pair, tmp_path):
    recipe = make_recipe(pair, target={"quantization": "fp8"})
    dirs = llmapi.hf_model_dirs(recipe, tmp_path / "engines")
    assert dirs["target"] == (tmp_path / "engines" / "llm" / "target" / "hf_checkpoint").resolve()
    assert dirs["draft"] == pair[1].resolve()
    with pytest.raises(CheckFailed, match="run `trtspec build` with this recipe first"):
        deploy(recipe, None, tmp_path / "r", engines_dir=tmp_path / "engines")
    assert not (tmp_path / "r").exists()
    hf_dir(dirs["target"])
    deploy(recipe, None, tmp_path / "r", engines_dir=tmp_path / "engines")
    data = yaml.safe_load((tmp_path / "r" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["model"] == str(dirs["target"])


def fake_upstream(path):
    """Upstream's layout: model.py does `from helpers import ...` and defines TritonPythonModel."""
    path.mkdir(parents=True)
    (path / "helpers.py").write_text("def get_streaming_from_request(request):\n    return False\n")
    (path / "model.py").write_text(
        "from helpers import get_streaming_from_request\n\n\nclass TritonPythonModel:\n"
        "    streaming = staticmethod(get_streaming_from_request)\n"
    )
    return path


def test_launcher_loads_upstream_model_from_the_image(tmp_path, monkeypatch):
    upstream = fake_upstream(tmp_path / "all_models" / "llmapi" / "tensorrt_llm" / "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        cls = llmapi.load_upstream_model({llmapi.UPSTREAM_DIR_ENV: str(upstream)})
        assert cls.__name__ == "TritonPythonModel" and cls.streaming(None) is False
    finally:
        sys.modules.pop("trtllm_llmapi_model", None)
        sys.modules.pop("helpers", None)
    with pytest.raises(ServerError, match=llmapi.UPSTREAM_DIR_ENV):
        llmapi.find_upstream_model_dir({llmapi.UPSTREAM_DIR_ENV: str(tmp_path / "missing")})


def test_serve_refuses_before_starting_without_upstream_model(pair, tmp_path, monkeypatch):
    deploy(make_recipe(pair), None, tmp_path / "r")
    monkeypatch.setenv(llmapi.UPSTREAM_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ServerError, match="upstream's LLM-API model"):
        serve(ServeSpec(tmp_path / "r"), echo=lambda *_: None)


def test_cli_deploy_trtllm_pytorch(runner, pair, tmp_path):
    from trtspec.cli import cli

    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(
        yaml.safe_dump({"name": "c", "target": {"model": str(pair[0])}, "draft": {"model": str(pair[1])}})
    )
    out = tmp_path / "repo"
    result = runner.invoke(
        cli, ["deploy", str(recipe_file), "--runtime", "trtllm-pytorch", "--out", str(out), "--json", "-q"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["entry_point"] == "tensorrt_llm" and payload["models"] == ["tensorrt_llm"]


@pytest.mark.parametrize(
    ("speculative", "k"),
    [
        ({}, 5),
        ({"num_draft_tokens": 3}, 3),
        ({"max_draft_len": 8, "schedule": {4: 4, 16: 1}}, 4),
        ({"schedule": {1: 0}}, None),
    ],
)
def test_validate_measures_the_k_model_yaml_gets(pair, speculative, k):
    """validate/bench against a trtllm-pytorch endpoint treat its K as fixed: the one written in model.yaml."""
    from trtspec.validate.inputs import llmapi_max_draft_len

    recipe = make_recipe(pair, speculative=speculative)
    assert llmapi_max_draft_len(recipe) == k
    if k is not None:
        data = llmapi.model_yaml(recipe, {"target": pair[0], "draft": pair[1]})
        assert data["speculative_config"]["max_draft_len"] == k
