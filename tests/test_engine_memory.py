"""The lean forward holds no second copy of the weights: its fused q/k/v and gate/up tensors are the HF model's
parameters (tools/bench_real_sizes.py measures the peak memory this gives at real sizes)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_model

from trtspec.engines.models import LeanCausalLM

CASES = {
    "llama": ("llama", dict(num_key_value_heads=2)),
    "qwen2-bias-tied": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-qk-norm": ("qwen3", dict(num_key_value_heads=1)),
}


def storage_bytes(tensors) -> dict[int, int]:
    """data pointer -> bytes of each distinct storage behind ``tensors``."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def lean_tensors(lean: LeanCausalLM) -> list[torch.Tensor]:
    per_layer = [t for layer in lean.layers for t in vars(layer).values() if t is not None]
    return [lean.embed, lean.final_norm, lean.lm_head, *per_layer]


@pytest.mark.parametrize("case", list(CASES))
def test_lean_model_shares_the_hf_weights_and_keeps_them_exact(tmp_path, shared_tokenizer_dir, case):
    from transformers import AutoModelForCausalLM

    arch, overrides = CASES[case]
    hf = AutoModelForCausalLM.from_pretrained(
        make_model(tmp_path, arch, tokenizer_dir=shared_tokenizer_dir, **overrides)
    ).eval()
    ids = torch.tensor([[1, 40, 41, 7, 8]])
    with torch.no_grad():
        before = hf(ids).logits  # [1, 5, V]
    param_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # a tied tensor once

    lean = LeanCausalLM(hf, num_slots=2, max_seq_len=32)

    hf_storages = storage_bytes(hf.parameters())
    assert set(storage_bytes(lean_tensors(lean))) <= set(hf_storages)  # nothing the HF model does not hold
    assert sum(hf_storages.values()) == param_bytes  # and the HF model holds each weight once
    if overrides.get("tie_word_embeddings"):
        assert lean.embed.data_ptr() == lean.lm_head.data_ptr() == hf.lm_head.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, before)  # the HF forward reads the fused storage, same values
    logits = lean.forward(ids, [0], [0], [5], torch.arange(5)[None])
    torch.testing.assert_close(logits, before, rtol=1e-5, atol=1e-5)
