"""Build-plan rules: one test per pain point of shared/reference/trtllm-engine-flow.md ("Build flags")."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from trtspec.builders import plan as P
from trtspec.core.errors import CheckpointError, RecipeError
from trtspec.recipe import recipe_from_dict


def make_recipe(**over):
    data = {
        "name": "pair",
        "target": {"model": "/nowhere/target", "dtype": "float16"},
        "draft": {"model": "/nowhere/draft", "dtype": "float16"},
        "speculative": {"max_draft_len": 5},
        "limits": {"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 300},
    }
    for key, value in over.items():
        section, _, leaf = key.partition("__")
        data.setdefault(section, {})[leaf] = value
    return recipe_from_dict(data, check_paths=False)


def ckpt_config(dtype="float16", vocab=320, tp=1, pp=1, quant=None) -> dict:
    """A checkpoint config.json as modelopt 0.37 writes it (keys the plan reads)."""
    return {
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "architecture": "LlamaForCausalLM",
        "dtype": dtype,
        "vocab_size": vocab,
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        "quantization": {"quant_algo": quant, "kv_cache_quant_algo": None},
    }


def build_plan(recipe, target_cfg=None, draft_cfg=None):
    facts = {
        "target": (Path("/c/target"), P.checkpoint_facts(target_cfg or ckpt_config())),
        "draft": (Path("/c/draft"), P.checkpoint_facts(draft_cfg or ckpt_config())),
    }
    return P.make_build_plan(recipe, facts, {"target": Path("/e/target"), "draft": Path("/e/draft")})


def test_target_gets_draft_tokens_external_and_max_draft_len_draft_gets_neither():
    plan = build_plan(make_recipe(speculative__max_draft_len=7))
    assert plan.target.build_config["speculative_decoding_mode"] == "draft_tokens_external"
    assert plan.target.build_config["max_draft_len"] == 7
    assert plan.draft.build_config["speculative_decoding_mode"] is None
    assert plan.draft.build_config["max_draft_len"] == 0
    target_cmd, draft_cmd = plan.target.command(), plan.draft.command()
    i = target_cmd.index("--speculative_decoding_mode")
    assert target_cmd[i + 1 : i + 4] == ["draft_tokens_external", "--max_draft_len", "7"]
    assert "--speculative_decoding_mode" not in draft_cmd and "--max_draft_len" not in draft_cmd


def test_paged_context_fmha_on_both_engines_explicitly():
    plan = build_plan(make_recipe())
    for engine in plan.engines():
        assert engine.build_config["plugin_config"]["use_paged_context_fmha"] is True
        cmd = engine.command()
        assert cmd[cmd.index("--use_paged_context_fmha") + 1] == "enable"


@pytest.mark.parametrize("use_draft_logits", [True, False])
def test_gather_generation_logits_on_both_when_draft_logits_and_never_context_logits(use_draft_logits):
    plan = build_plan(make_recipe(speculative__use_draft_logits=use_draft_logits))
    for engine in plan.engines():
        assert engine.build_config["gather_generation_logits"] is use_draft_logits
        assert ("--gather_generation_logits" in engine.command()) is use_draft_logits
        assert engine.build_config["gather_context_logits"] is False
        assert "--gather_context_logits" not in engine.command()
        assert "--gather_all_token_logits" not in engine.command()


def test_limits_come_from_the_recipe():
    plan = build_plan(
        make_recipe(limits__max_batch_size=16, limits__max_input_len=64, limits__max_seq_len=96)
    )
    for engine in plan.engines():
        cfg, cmd = engine.build_config, engine.command()
        assert (cfg["max_batch_size"], cfg["max_input_len"], cfg["max_seq_len"], cfg["max_beam_width"]) == (
            16,
            64,
            96,
            1,
        )
        for flag, value in [("--max_batch_size", "16"), ("--max_input_len", "64"), ("--max_seq_len", "96")]:
            assert cmd[cmd.index(flag) + 1] == value


def test_max_num_tokens_covers_a_whole_sequence_and_never_falls_below_the_default():
    # Chunked context is off in trtspec's runtimes, so the runtime takes no prompt longer than
    # min(max_seq_len - 1, max_num_tokens), and each round sends a row's whole sequence.
    for seq, target, draft in [(300, 8192, 8192), (20000, 20005, 20000)]:
        plan = build_plan(make_recipe(limits__max_seq_len=seq))
        assert (plan.target.build_config["max_num_tokens"], plan.draft.build_config["max_num_tokens"]) == (
            target,
            draft,
        )
        for engine, want in [(plan.target, target), (plan.draft, draft)]:
            cmd = engine.command()
            assert cmd[cmd.index("--max_num_tokens") + 1] == str(want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_logits_are_float32_whatever_the_checkpoint_dtype(dtype):
    # modelopt writes float16 logits into float16 and bfloat16 checkpoints; the repository declares FP32.
    recipe = make_recipe(target__dtype=dtype, draft__dtype=dtype)
    plan = build_plan(recipe, ckpt_config(dtype=dtype), ckpt_config(dtype=dtype))
    for engine in plan.engines():
        assert engine.build_config["logits_dtype"] == "float32"
        cmd = engine.command()
        assert cmd[cmd.index("--logits_dtype") + 1] == "float32"
        assert P.expected_engine(engine)["logits_dtype"] == "float32"


def test_a_plan_written_before_max_num_tokens_and_logits_still_renders_and_verifies():
    engine = build_plan(make_recipe()).target
    old = P.EnginePlan.from_dict(
        {
            **engine.to_dict(),
            "build_config": {
                k: v for k, v in engine.build_config.items() if k not in ("max_num_tokens", "logits_dtype")
            },
        }
    )
    assert "--max_num_tokens" not in old.command() and "--logits_dtype" not in old.command()
    assert not {"max_num_tokens", "logits_dtype"} & P.expected_engine(old).keys()


def test_an_engine_whose_max_num_tokens_trtllm_lowered_to_what_a_batch_holds_still_matches():
    engine = build_plan(make_recipe(limits__max_batch_size=2, limits__max_seq_len=300)).target
    expected = P.expected_engine(engine)["max_num_tokens"]
    assert expected == (600, 610)  # min(8192, max_seq_len x 2), max_seq_len as built: 300 or 300 + K


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gemm_plugin_dtype_is_the_checkpoint_dtype(dtype):
    recipe = make_recipe(target__dtype=dtype, draft__dtype=dtype)
    plan = build_plan(recipe, ckpt_config(dtype=dtype), ckpt_config(dtype=dtype))
    for engine in plan.engines():
        assert engine.build_config["plugin_config"]["gemm_plugin"] == dtype
        assert engine.command()[engine.command().index("--gemm_plugin") + 1] == dtype


def test_parallelism_comes_from_the_checkpoint_and_must_match_the_recipe():
    recipe = make_recipe(target__tp_size=2)
    plan = build_plan(recipe, ckpt_config(tp=2), ckpt_config())
    assert (plan.target.checkpoint.tp_size, plan.target.checkpoint.world_size) == (2, 2)
    assert "--tp_size" not in plan.target.command()  # fixed at convert time; trtllm-build has no such flag
    with pytest.raises(CheckpointError, match="tp_size=1 .*target.tp_size=2"):
        build_plan(recipe, ckpt_config(tp=1), ckpt_config())


def test_padded_vocab_checkpoints_plan_and_a_larger_draft_is_refused():
    plan = build_plan(make_recipe(), ckpt_config(vocab=352), ckpt_config(vocab=336))  # Qwen2.5's shape
    assert (plan.target.checkpoint.vocab_size, plan.draft.checkpoint.vocab_size) == (352, 336)
    with pytest.raises(RecipeError, match="the draft has 384 vocab rows and the target 320"):
        build_plan(make_recipe(), ckpt_config(vocab=320), ckpt_config(vocab=384))


def test_bad_checkpoint_config_names_the_file():
    with pytest.raises(CheckpointError, match="where.json.*vocab_size"):
        P.checkpoint_facts({"architecture": "LlamaForCausalLM", "dtype": "float16"}, "where.json")
    with pytest.raises(CheckpointError, match="dtype 'int8'"):
        P.checkpoint_facts(ckpt_config(dtype="int8"))


@pytest.mark.parametrize(
    "config, named",
    [
        ({**ckpt_config(), "vocab_size": None}, "vocab_size is None, not a positive integer"),
        ({**ckpt_config(), "vocab_size": "320"}, "vocab_size is '320', not a positive integer"),
        ({**ckpt_config(), "mapping": [1, 2]}, "mapping is \\[1, 2\\], not an object"),
        ({**ckpt_config(), "mapping": {"tp_size": 0}}, "mapping.tp_size is 0"),
        ({**ckpt_config(), "quantization": "fp8"}, "quantization is 'fp8', not an object"),
        ({**ckpt_config(), "architecture": None}, "architecture is None, not a string"),
        ([ckpt_config()], "the file is 'list', not a JSON object"),
    ],
)
def test_each_bad_field_of_a_checkpoint_config_is_named_in_one_line(config, named):
    with pytest.raises(CheckpointError, match=f"^where.json: {named}") as caught:
        P.checkpoint_facts(config, "where.json")
    assert "\n" not in str(caught.value)


def test_a_checkpoint_config_that_is_not_utf8_json_is_one_line(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="cannot read the checkpoint config"):
        P.read_checkpoint_config(tmp_path)


def test_read_checkpoint_config_requires_every_rank_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(ckpt_config(tp=2)))
    (tmp_path / "rank0.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="rank1.safetensors"):
        P.read_checkpoint_config(tmp_path)
    (tmp_path / "rank1.safetensors").write_bytes(b"x")
    assert P.read_checkpoint_config(tmp_path).world_size == 2


def test_command_is_an_argv_that_round_trips_through_shlex():
    plan = build_plan(make_recipe())
    cmd = plan.target.command(checkpoint_dir="dir with space/ckpt", output_dir="out")
    assert cmd[0] == "trtllm-build"
    assert shlex.split(shlex.join(cmd)) == cmd
    assert cmd[cmd.index("--checkpoint_dir") + 1] == "dir with space/ckpt"


def test_plan_is_json_data_and_round_trips():
    plan = build_plan(make_recipe(speculative__use_draft_logits=True))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["engines"]["target"]["trtllm_build"] == plan.target.command()
    assert P.BuildPlan.from_dict(data) == plan


def test_engine_mismatches_accept_the_planned_engine_and_catch_a_missing_speculative_mode():
    plan = build_plan(make_recipe(speculative__max_draft_len=4, limits__max_seq_len=300))
    good = {
        "speculative_decoding_mode": "draft_tokens_external",
        "max_draft_len": 4,
        "vocab_size": 320,
        "max_batch_size": 4,
        "max_input_len": 100,
        "max_seq_len": 304,  # TensorRT-LLM's build adds max_draft_len for speculative engines
        "gather_generation_logits": False,
        "gather_context_logits": False,
        "use_paged_context_fmha": True,
        "gemm_plugin": "float16",
        "tp_size": 1,
        "pp_size": 1,
        "max_num_tokens": 1216,  # lowered to max_seq_len x max_batch_size by the build
        "logits_dtype": "float32",
    }
    assert P.engine_mismatches(plan.target, good) == []
    assert P.engine_mismatches(plan.target, good | {"logits_dtype": "float16"}) == [
        "logits_dtype is 'float16', expected float32"
    ]
    bad = good | {"speculative_decoding_mode": "none", "max_draft_len": 0}
    problems = P.engine_mismatches(plan.target, bad)
    assert any("speculative_decoding_mode is 'none'" in p for p in problems)
    assert any("max_draft_len is 0" in p for p in problems)
    draft_like = good | {
        "speculative_decoding_mode": "none",
        "max_draft_len": 0,
        "max_seq_len": 300,
        "max_num_tokens": 1200,
    }
    assert P.engine_mismatches(plan.draft, draft_like) == []
    assert P.engine_mismatches(plan.draft, draft_like | {"max_seq_len": 304}) != []
