"""The tensorrtllm runtime's repository over the stand-in engine models, for a real tritonserver without
TensorRT-LLM.

``deploy_harness`` runs `trtspec deploy` for the tensorrtllm runtime over engine folders that hold only the
config.json trtllm-build writes (``fake_engine``), then puts the python stand-in (engine_model.py, rendered from
engine_config.pbtxt) in place of the two C++ backend models and runs the cross-model check on the result, so the
orchestrator is served exactly as deployed and talks to engine models with the backend's tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.recipe import Recipe, torch_runtime_dtype
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.checks import check_repository
from trtspec.triton_repo.deploy import deploy
from trtspec.triton_repo.render import parse_model_config, render_template

HARNESS_DIR = Path(__file__).parent
ROLES = {"target": names.TARGET_MODEL, "draft": names.DRAFT_MODEL}
# The stub imports model.py from the repository: the harness package lives beside the tests, not in trtspec.
MODEL_PY = """import sys

sys.path.insert(0, {tests!r})
from harness.engine_model import TritonPythonModel  # noqa: E402,F401
"""


def fake_engine(
    path: Path,
    *,
    max_draft_len: int,
    vocab_size: int = 320,
    gather: bool = False,
    max_batch_size: int = 8,
    max_num_tokens: int = 8192,
    logits_dtype: str = "float32",
    tp_size: int = 1,
    pp_size: int = 1,
) -> Path:
    """An engine dir whose config.json has TensorRT-LLM 1.2's layout (pretrained_config + build_config)."""
    path.mkdir(parents=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "logits_dtype": logits_dtype,
            "vocab_size": vocab_size,
            "mapping": {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size},
        },
        "build_config": {
            "max_batch_size": max_batch_size,
            "max_input_len": 512,
            "max_seq_len": 1024,
            "max_num_tokens": max_num_tokens,
            "max_beam_width": 1,
            "max_draft_len": max_draft_len,
            # SpeculativeDecodingMode flags: 1 NONE, 2 DRAFT_TOKENS_EXTERNAL
            "speculative_decoding_mode": 2 if max_draft_len else 1,
            "gather_generation_logits": gather,
            "plugin_config": {"use_paged_context_fmha": True, "gemm_plugin": "float16"},
        },
    }
    (path / "config.json").write_text(json.dumps(config))
    for rank in range(tp_size * pp_size):
        (path / f"rank{rank}.engine").write_bytes(b"")
    return path


def engine_values(recipe: Recipe, role: str) -> dict:
    """Values of engine_config.pbtxt for ``role``'s stand-in: the recipe's checkpoint, device and limits."""
    spec = recipe.models()[role]
    return {
        "model_name": ROLES[role],
        "triton_max_batch_size": recipe.limits.max_batch_size,
        "logits_datatype": "TYPE_FP32",
        "role": role,
        "model_dir": str(spec.model),
        "device": recipe.triton.device,
        "dtype": torch_runtime_dtype(recipe.triton, spec),
        "cpu_threads": recipe.triton.cpu_threads,
        "max_draft_len": recipe.speculative.max_draft_len,
        "max_seq_len": recipe.limits.max_seq_len,
        "trust_remote_code": spec.trust_remote_code,
    }


def engine_config(recipe: Recipe, role: str) -> tuple[str, object]:
    """(config.pbtxt text, parsed ModelConfig) of ``role``'s stand-in engine model."""
    where = f"{ROLES[role]}/config.pbtxt (harness engine_config.pbtxt)"
    template = (HARNESS_DIR / "engine_config.pbtxt").read_text()
    text = render_template(template, engine_values(recipe, role), where)
    return text, parse_model_config(text, where)


def fake_engines(recipe: Recipe, root: Path) -> dict[str, Path]:
    """Engine folders that fit the recipe's checkpoints (their vocabulary, its K and batch limits)."""
    spec = recipe.speculative
    engines = {}
    for role, model in recipe.models().items():
        vocab = json.loads((Path(model.model) / "config.json").read_text())["vocab_size"]
        engines[role] = fake_engine(
            root / role,
            max_draft_len=spec.max_draft_len if role == "target" else 0,
            vocab_size=vocab,
            gather=spec.use_draft_logits,
            max_batch_size=recipe.limits.max_batch_size,
        )
    return engines


def deploy_harness(recipe: Recipe, out: Path) -> Path:
    """The tensorrtllm runtime's repository at ``out`` with the stand-in engine models; its fake engine folders
    go beside it (``<out>-engines``), where tritonserver does not take them for models."""
    deploy(recipe, "tensorrtllm", out, engine_dirs=fake_engines(recipe, out.with_name(out.name + "-engines")))
    for role in recipe.models():  # no draft model where prompt lookup proposes alone
        name = ROLES[role]
        (out / name / "config.pbtxt").write_text(engine_config(recipe, role)[0])
        (out / name / "1" / "model.py").write_text(MODEL_PY.format(tests=str(HARNESS_DIR.parent)))
    models = [path for path in out.iterdir() if (path / "config.pbtxt").is_file()]
    check_repository({m.name: parse_model_config((m / "config.pbtxt").read_text(), m.name) for m in models})
    return out
