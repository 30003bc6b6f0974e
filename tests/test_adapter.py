"""The engine build and core.trtllm against the stand-in package (tests/fake_tensorrt_llm), in a real child process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.builders import plan as P
from trtspec.builders.trtllm_build import build_engines
from trtspec.core.engine_config import read_engine_config, speculative_mode_name
from trtspec.core.errors import CheckFailed, CheckpointError, NeedsTensorRTLLM
from trtspec.core.trtllm import tensorrt_llm_location, version_problem
from trtspec.recipe import recipe_from_dict

SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}  # PretrainedConfig requires them


def write_checkpoint(path: Path, vocab: int = 320, tp: int = 1, dtype: str = "float16") -> Path:
    path.mkdir(parents=True)
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": dtype,
        "vocab_size": vocab,
        **SHAPE,
        "max_position_embeddings": 2048,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": None},
    }
    (path / "config.json").write_text(json.dumps(config))
    for rank in range(tp):
        (path / f"rank{rank}.safetensors").write_bytes(b"\0" * 8)
    return path


def make_plan(tmp_path: Path, use_draft_logits=False, target_tp=1, max_batch_size=2) -> P.BuildPlan:
    recipe = recipe_from_dict(
        {
            "name": "pair",
            "target": {"model": "/x/t", "tp_size": target_tp},
            "draft": {"model": "/x/d"},
            "speculative": {"max_draft_len": 6, "use_draft_logits": use_draft_logits},
            "limits": {"max_batch_size": max_batch_size, "max_input_len": 64, "max_seq_len": 128},
        },
        check_paths=False,
    )
    ckpts = {
        "target": write_checkpoint(tmp_path / "ckpt_target", tp=target_tp),
        "draft": write_checkpoint(tmp_path / "ckpt_draft"),
    }
    facts = {role: (d, P.read_checkpoint_config(d)) for role, d in ckpts.items()}
    return P.make_build_plan(recipe, facts, {r: tmp_path / f"engine_{r}" for r in P.ROLES})


def test_builds_both_engines_in_a_child_and_verifies_them(fake_trtllm, tmp_path):
    plan = make_plan(tmp_path, use_draft_logits=True, target_tp=2)
    result = build_engines(list(plan.engines()), tmp_path / "logs" / "build.log")
    assert result["tensorrt_llm_version"] == "1.2.1"
    target = read_engine_config(plan.target.engine_dir)
    assert target["speculative_decoding_mode"] == "draft_tokens_external"
    assert (target["max_draft_len"], target["max_seq_len"], target["tp_size"]) == (6, 128 + 6, 2)
    assert target["gather_generation_logits"] and not target["gather_context_logits"]
    assert target["use_paged_context_fmha"] and target["gemm_plugin"] == "float16"
    assert sorted(p.name for p in plan.target.engine_dir.iterdir()) == [
        "config.json",
        "rank0.engine",
        "rank1.engine",
    ]
    draft = result["engines"]["draft"]["config"]
    assert (draft["speculative_decoding_mode"], draft["max_draft_len"], draft["max_seq_len"]) == (
        "none",
        0,
        128,
    )
    assert draft["gather_generation_logits"]
    # The real layout: IntFlag written as its integer, config split in pretrained_config / build_config.
    raw = json.loads((plan.target.engine_dir / "config.json").read_text())
    assert raw["build_config"]["speculative_decoding_mode"] == 2
    assert raw["pretrained_config"]["vocab_size"] == 320


def test_verification_catches_an_engine_built_without_speculative_mode(fake_trtllm, tmp_path):
    fake_trtllm.setenv("FAKE_TRTLLM_DROP_SPECULATIVE", "1")
    plan = make_plan(tmp_path)
    with pytest.raises(CheckFailed, match="target engine .*speculative_decoding_mode is 'none'"):
        build_engines([plan.target], tmp_path / "build.log")


def test_wrong_version_is_refused_before_building(fake_trtllm, tmp_path):
    fake_trtllm.setenv("FAKE_TRTLLM_VERSION", "1.3.0rc20")
    plan = make_plan(tmp_path)
    with pytest.raises(NeedsTensorRTLLM, match="1.3.0rc20 is installed") as err:
        build_engines([plan.draft], tmp_path / "build.log")
    assert err.value.exit_code == 3
    assert not plan.draft.engine_dir.exists()


def test_a_crash_in_the_child_is_one_line_naming_the_log(fake_trtllm, tmp_path):
    fake_trtllm.setenv("FAKE_TRTLLM_CRASH", "1")
    plan = make_plan(tmp_path)
    with pytest.raises(CheckFailed, match=r"engine build failed \(exit 1\); see .*build.log") as err:
        build_engines([plan.draft], tmp_path / "build.log")
    assert "fake TensorRT-LLM crash" in err.value.detail


def test_without_tensorrt_llm_it_says_so(tmp_path):
    assert tensorrt_llm_location() is None
    with pytest.raises(NeedsTensorRTLLM, match="not installed here; run inside nvcr.io/nvidia/tritonserver"):
        build_engines([], tmp_path / "build.log")


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("1.2.1", True),
        ("1.2.0", True),
        ("1.2.0rc2", False),
        ("1.3.0", False),
        ("1.1.0", False),
        ("junk", False),
    ],
)
def test_version_range(version, ok):
    assert (version_problem(version) is None) is ok


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (2, "draft_tokens_external"),
        (1, "none"),
        (4, "medusa"),
        ("DRAFT_TOKENS_EXTERNAL", "draft_tokens_external"),
        ("SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL", "draft_tokens_external"),
        (None, "none"),
    ],
)
def test_speculative_mode_names(value, name):
    assert speculative_mode_name(value) == name


def test_an_engine_of_one_slot_holds_max_seq_len_tokens_and_still_verifies(fake_trtllm, tmp_path):
    """TensorRT-LLM lowers max_num_tokens to max_seq_len x max_batch_size before it adds K to max_seq_len (builder
    build: _init_max_seq_len, then max_seq_len += max_draft_len): an engine of one slot holds 128 tokens, not the
    planned max(8192, 128 + 6); the build's verification takes it."""
    plan = make_plan(tmp_path, max_batch_size=1)
    build_engines(list(plan.engines()), tmp_path / "logs" / "build.log")
    target = read_engine_config(plan.target.engine_dir)
    assert (target["max_seq_len"], target["max_num_tokens"]) == (128 + 6, 128)


def test_read_engine_config_old_builder_config_layout(tmp_path):
    old = {
        "builder_config": {
            "name": "llama",
            "precision": "float16",
            "vocab_size": 32000,
            "tensor_parallel": 2,
            "max_batch_size": 8,
            "max_input_len": 512,
            "max_draft_len": 4,
        },
        "plugin_config": {"gemm_plugin": "float16", "use_paged_context_fmha": True},
    }
    (tmp_path / "config.json").write_text(json.dumps(old))
    facts = read_engine_config(tmp_path)
    assert (facts["vocab_size"], facts["tp_size"], facts["max_batch_size"]) == (32000, 2, 8)
    assert (facts["speculative_decoding_mode"], facts["max_draft_len"]) == ("draft_tokens_external", 4)


def test_read_engine_config_errors_are_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read the engine config"):
        read_engine_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"something": 1}))
    with pytest.raises(CheckpointError, match="not a TensorRT-LLM engine config"):
        read_engine_config(tmp_path)
    for config in (
        {"build_config": None},
        {"build_config": {}, "pretrained_config": {"dtype": "float16"}},
        [1],
    ):
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match="not a TensorRT-LLM engine config"):
            read_engine_config(tmp_path)


def test_only_core_trtllm_imports_tensorrt_llm():
    src = Path(__file__).resolve().parents[1] / "src" / "trtspec"
    importers = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if "import tensorrt_llm" in p.read_text() or "from tensorrt_llm" in p.read_text()
    )
    assert importers == ["core/trtllm.py"]
