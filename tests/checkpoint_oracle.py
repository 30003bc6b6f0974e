"""The checkpoint interpreter's logits against the HF model's, for tests that verify a checkpoint on its own
(`trtspec convert` verifies inside its export: convert._with_verification)."""

from __future__ import annotations

from pathlib import Path

from trtspec.builders import interpreter


def verify_checkpoint(checkpoint_dir: Path, hf_dir: Path) -> dict:
    """Interpreter logits of the checkpoint vs the HF model's (float32, CPU) on interpreter.DEFAULT_PROMPTS;
    ``passed`` False on a failed comparison, CheckpointError/ModelError on bad inputs."""
    from trtspec.core.model_dir import load_source_model, load_tokenizer

    input_ids = interpreter.tokenize_prompts(load_tokenizer(Path(hf_dir)), interpreter.DEFAULT_PROMPTS)
    reference = interpreter.reference_logits_for(load_source_model(Path(hf_dir), device="cpu"), input_ids)
    return interpreter.verify_against(Path(checkpoint_dir), input_ids, reference)
