"""The shipped demo pair (src/trtspec/assets/demo/{target,draft}, trained by tools/train_demo_pair.py).

Every command's default recipe points at it, so it must load with plain transformers on a fresh machine, share one
tokenizer byte for byte, stay within the size budget, keep the draft far cheaper than the target, and still write
code-like text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.recipe import DEMO_DIR, resolve_model_path

TARGET_DIR, DRAFT_DIR = DEMO_DIR / "target", DEMO_DIR / "draft"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SIZE_BUDGET_BYTES = 32 * 1024 * 1024
# Not from the stdlib (the training corpus), so neither model has seen it.
CODE_SNIPPET = '''def read_config(path, defaults=None):
    """Read a key=value file into a dict, falling back to defaults."""
    result = dict(defaults or {})
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result
'''

pytestmark = pytest.mark.skipif(
    not (TARGET_DIR / "config.json").is_file() or not (DRAFT_DIR / "config.json").is_file(),
    reason="demo pair not trained yet: run tools/train_demo_pair.py to create src/trtspec/assets/demo/{target,draft}",
)


@pytest.fixture(scope="module")
def pair():
    """(tokenizer, target, draft) loaded exactly as a user would, in fp32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TARGET_DIR)
    target = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(DRAFT_DIR, dtype=torch.float32).eval()
    return tokenizer, target, draft


def test_demo_scheme_resolves_to_the_shipped_dirs():
    assert resolve_model_path("demo:target", Path(".")) == TARGET_DIR
    assert resolve_model_path("demo:draft", Path(".")) == DRAFT_DIR


def test_tokenizer_files_are_identical():
    for name in TOKENIZER_FILES:
        assert (TARGET_DIR / name).read_bytes() == (DRAFT_DIR / name).read_bytes(), name


def test_weights_are_safetensors_within_budget():
    total = sum(f.stat().st_size for d in (TARGET_DIR, DRAFT_DIR) for f in d.iterdir() if f.is_file())
    assert total <= SIZE_BUDGET_BYTES, f"{total / 1e6:.1f} MB"
    for model_dir in (TARGET_DIR, DRAFT_DIR):
        assert (model_dir / "model.safetensors").is_file()
        assert (model_dir / "generation_config.json").is_file()
        assert not list(model_dir.glob("*.bin"))


def test_configs_are_llama_and_compatible(pair):
    tokenizer, target, draft = pair
    for model in (target, draft):
        assert model.config.model_type == "llama"
        assert type(model).__name__ == "LlamaForCausalLM"
        assert model.config.vocab_size == len(tokenizer)
        assert model.config.eos_token_id == tokenizer.eos_token_id
        # The demo recipe's limits.max_seq_len is 512.
        assert model.config.max_position_embeddings >= 512
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    # Continuing code means copying identifiers from the context, which takes two layers (an induction head).
    assert draft.config.num_hidden_layers >= 2


def test_draft_is_much_smaller_than_target(pair):
    _, target, draft = pair
    target_params = sum(p.numel() for p in target.parameters())
    draft_params = sum(p.numel() for p in draft.parameters())
    assert draft_params * 5 <= target_params, (draft_params, target_params)


def test_target_predicts_unseen_code_better_than_draft(pair):
    import torch

    tokenizer, target, draft = pair
    ids = tokenizer(CODE_SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        target_loss = target(input_ids=ids, labels=ids).loss.item()
        draft_loss = draft(input_ids=ids, labels=ids).loss.item()
    assert target_loss < draft_loss, (target_loss, draft_loss)
    assert target_loss < 4.5  # nats/token: well below a uniform guess over the 1024-token vocab (~6.9)


def test_draft_agrees_with_target_argmax_on_unseen_code(pair):
    """Greedy acceptance is the draft agreeing with the target's argmax; teacher-forced here (one forward each).
    The shipped pair agrees on 0.65 of the snippet's positions: its target also copies from the context, which the
    2-layer draft does not."""
    import torch

    tokenizer, target, draft = pair
    ids = tokenizer(CODE_SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        target_choice = target(input_ids=ids).logits.argmax(-1)  # [1, T]
        draft_choice = draft(input_ids=ids).logits.argmax(-1)
    agreement = (target_choice == draft_choice).float().mean().item()
    assert agreement >= 0.6, agreement


def test_greedy_continuation_is_code_like(pair):
    import torch

    tokenizer, target, _ = pair
    # No trailing newline: training text tokenises "\n" plus the indentation together.
    prompt = "import os\n\n\ndef list_python_files(root):"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = target.generate(ids, max_new_tokens=32, do_sample=False)
    new_ids = out[0, ids.shape[1] :].tolist()
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    assert len(set(new_ids)) >= 6, text  # not one token repeated
    assert text.startswith("\n    "), text  # a function body follows, indented
