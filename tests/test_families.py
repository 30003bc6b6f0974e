"""Every common model family through every stage, on tiny pairs that keep each published quirk (tiny_models.FAMILIES).

Stages: check (which stage cannot take a family, and why), convert (real modelopt export, verified by the checkpoint
interpreter), generate (the engine's greedy output equals HF generate, lean or HF forward), validate, and stopping
at any id of an eos list.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from test_engine import hf_greedy
from tiny_models import FAMILIES, make_family_pair, steer_to_eos

from trtspec.builders import support
from trtspec.builders.convert import export_checkpoint
from trtspec.core.errors import ModelError
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import CalibrationSpec, ModelSpec, load_recipe

CALIB = CalibrationSpec(size=2, seq_len=16)
MAX_SEQ_LEN = 128
PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 100, 7]]
MAX_NEW = 16
TEXTS = ["def fibonacci(n):\n    if n < 2:\n", "The quick brown fox jumps over"]  # validate's prompts


def _hf_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def _convertible(family: str) -> bool:
    return (
        support.convert_problem(
            {"model_type": ARCH_MODEL_TYPE[family], "architectures": [ARCH_CLASS[family]]}
        )
        is None
    )


ARCH_MODEL_TYPE = {f: {"gemma3": "gemma3_text"}.get(s["arch"], s["arch"]) for f, s in FAMILIES.items()}
ARCH_CLASS = {
    f: {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
        "mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
        "phi3": "Phi3ForCausalLM"}[s["arch"]]
    for f, s in FAMILIES.items()
}  # fmt: skip
CONVERTIBLE = [f for f in FAMILIES if _convertible(f)]
NOT_CONVERTIBLE = [f for f in FAMILIES if not _convertible(f)]
# Families the lean forward reproduces exactly (engines/models.lean_unsupported_reason); the others run through the
# HF forward: Mistral because its window (16) is shorter than max_seq_len, Gemma and Phi-3 by model_type.
LEAN = {"llama3", "qwen2.5", "qwen3"}
EOS_LIST_FAMILIES = [f for f, s in FAMILIES.items() if len(s.get("eos", ())) > 1]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """family -> (target_dir, draft_dir), built on first use and shared by the module's tests."""
    built: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in built:
            seed = 10 * list(FAMILIES).index(family)
            built[family] = make_family_pair(tmp_path_factory.mktemp(family), family, seed=seed)
        return built[family]

    return get


def write_recipe(path: Path, target: Path, draft: Path, *, runtime: str = "torch", dtype: str = "float16",
                 max_seq_len: int = MAX_SEQ_LEN) -> Path:  # fmt: skip
    data = {
        "name": "family",
        "target": {"model": str(target), "dtype": dtype},
        "draft": {"model": str(draft), "dtype": dtype},
        "speculative": {"max_draft_len": 4},
        "limits": {
            "max_batch_size": 2,
            "max_input_len": min(64, max_seq_len - 1),
            "max_seq_len": max_seq_len,
        },
        "triton": {"runtime": runtime},
    }
    path.write_text(yaml.safe_dump(data))
    return path


# ---------------------------------------------------------------- check


def _architecture_checks(recipe_path: Path) -> tuple[object, list[tuple[str, str]]]:
    from trtspec.builders.preflight import run_checks

    report = run_checks(load_recipe(recipe_path))
    rows = [(r.status, r.message) for r in report.results if r.name.startswith("architecture (")]
    return report, rows


@pytest.mark.parametrize("family", list(FAMILIES))
def test_check_torch_runtime_passes_and_names_the_stage_it_skips(pairs, tmp_path, family):
    report, rows = _architecture_checks(write_recipe(tmp_path / "r.yaml", *pairs(family)))
    failed = [(r.name, r.message) for r in report.results if r.status == "fail"]
    assert report.ok, failed
    # `build` builds engines for this runtime too, and they would not apply Mistral's window
    if family == "mistral":
        for status, message in rows:
            assert status == "warn" and message.startswith(
                "engine: sliding_window 16 < limits.max_seq_len 128"
            )
            assert message.endswith("the torch runtime serves it through the HF forward"), message
    elif family in CONVERTIBLE:
        assert [status for status, _ in rows] == ["pass", "pass"], rows
    else:
        for status, message in rows:
            assert status == "warn" and message.startswith(
                f"convert: nvidia-modelopt 0.37 cannot export model_type {ARCH_MODEL_TYPE[family]} to a "
                "TensorRT-LLM checkpoint"
            ), message


@pytest.mark.parametrize("family", list(FAMILIES))
def test_check_tensorrtllm_runtime_fails_at_the_stage_that_cannot(pairs, tmp_path, family):
    recipe = write_recipe(tmp_path / "r.yaml", *pairs(family), runtime="tensorrtllm")
    _, rows = _architecture_checks(recipe)
    if family in NOT_CONVERTIBLE:
        assert all(s == "fail" and m.startswith("convert: nvidia-modelopt 0.37 cannot") for s, m in rows), (
            rows
        )
    elif family == "mistral":  # the window (16) applies within max_seq_len: the engine would not apply it
        assert all(
            s == "fail" and m.startswith("engine: sliding_window 16 < limits.max_seq_len 128")
            for s, m in rows
        )
        short = write_recipe(tmp_path / "short.yaml", *pairs(family), runtime="tensorrtllm", max_seq_len=16)
        assert [s for s, _ in _architecture_checks(short)[1]] == ["pass", "pass"]
    else:
        assert [s for s, _ in rows] == ["pass", "pass"], rows


# ---------------------------------------------------------------- convert


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("family", CONVERTIBLE)
@pytest.mark.conversion
def test_convert_is_verified_by_the_interpreter(pairs, tmp_path, family, role):
    hf = dict(zip(("target", "draft"), pairs(family), strict=True))[role]
    summary = export_checkpoint(ModelSpec(model=hf), tmp_path / "ckpt", calibration=CALIB)
    v = summary["verification"]
    assert v["passed"] and v["top1_agreement"] >= 0.99 and v["max_rel_logit_error"] < 0.01, v
    ckpt, source = json.loads((tmp_path / "ckpt" / "config.json").read_text()), _hf_config(hf)
    assert ckpt["vocab_size"] == source["vocab_size"]  # Qwen2.5's padded rows (336 / 352) are kept
    assert ckpt["head_size"] == (
        source.get("head_dim") or source["hidden_size"] // source["num_attention_heads"]
    )
    assert ckpt["rotary_base"] == source["rope_theta"]
    if source[
        "tie_word_embeddings"
    ]:  # modelopt writes a tied lm_head as its own tensor (shared only for Gemma)
        from safetensors.torch import load_file

        tensors = load_file(tmp_path / "ckpt" / "rank0.safetensors")
        assert torch.equal(tensors["lm_head.weight"], tensors["transformer.vocab_embedding.weight"])
    if source.get("rope_scaling"):
        assert ckpt["rotary_scaling"]["factor"] == source["rope_scaling"]["factor"]
    if (
        family == "mistral"
    ):  # verified inside the window only: the checkpoint has none (see check's engine rule)
        assert v["tokens"] <= 16 * 4


@pytest.mark.parametrize("family", NOT_CONVERTIBLE)
@pytest.mark.conversion
def test_convert_refuses_what_modelopt_cannot_export(pairs, tmp_path, family):
    """The table's reason is modelopt's own behaviour: its export of the family's decoder type raises
    NotImplementedError here (no tensorrt_llm); trtspec's convert says so before loading anything."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from modelopt.torch.export.model_utils import get_model_type
    from transformers import AutoModelForCausalLM

    target = pairs(family)[0]
    with pytest.raises(
        ModelError, match=f"convert: nvidia-modelopt 0.37 cannot export model_type {ARCH_MODEL_TYPE[family]} "
    ):
        export_checkpoint(ModelSpec(model=target), tmp_path / "ckpt", calibration=CALIB)
    assert not (tmp_path / "ckpt").exists()
    model = AutoModelForCausalLM.from_pretrained(target)
    with pytest.raises(NotImplementedError, match="Cannot export tensorrt_llm checkpoint"):
        export_tensorrt_llm_checkpoint(
            model, get_model_type(model), torch.float16, tmp_path / "direct", inference_tensor_parallel=1
        )


# ---------------------------------------------------------------- generate and validate


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_equals_hf_greedy(pairs, family):
    from trtspec.engines.models import LeanCausalLM

    target, draft = pairs(family)
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4, max_seq_len=MAX_SEQ_LEN)
    assert isinstance(engine.target, LeanCausalLM) == (family in LEAN)
    assert isinstance(engine.draft, LeanCausalLM) == (family in LEAN)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4))
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, MAX_NEW)
        assert result.stats.drafted > 0


@pytest.mark.parametrize("family", EOS_LIST_FAMILIES)
def test_generation_stops_at_a_later_id_of_the_eos_list(pairs, tmp_path, family):
    from transformers import AutoTokenizer

    target, draft = pairs(family)
    last_eos = AutoTokenizer.from_pretrained(target).convert_tokens_to_ids(FAMILIES[family]["eos"][-1])
    steered = steer_to_eos(target, tmp_path / "target", last_eos, PROMPTS[0])
    reference = hf_greedy(steered, PROMPTS[0], MAX_NEW)  # its generation_config's eos ids stop it
    assert reference[-1] == last_eos and len(reference) < MAX_NEW  # HF stops there too
    engine = SpeculativeEngine.from_pretrained(steered, draft, max_draft_len=4, max_seq_len=MAX_SEQ_LEN)
    (result,) = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4))
    assert result.token_ids == reference and result.finish_reason == "stop"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_validate_passes(pairs, tmp_path, family):
    from trtspec.validate.inputs import SystemOptions, open_reference, open_system
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.validation import run_validation

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", *pairs(family), dtype="float32"))
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(TEXTS))
    )
    system, reference = open_system(recipe, SystemOptions()), open_reference(recipe, SystemOptions())
    try:
        result = run_validation(system, reference, load_prompts(prompt_file), max_new_tokens=8)
    finally:
        system.close()
    assert [o.vs_reference.exact_match for o in result.outcomes] == [True, True]
    assert result.control_match_rate == 1.0 and result.failures() == []
