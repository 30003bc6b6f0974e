"""The shipped drafts of issue 28 (src/trtspec/assets/demo/draft-{othertok,sametok}, trained by
``tools/train_demo_pair.py --other-tokenizer-drafts``).

``draft-othertok`` has its own byte-level BPE (another size, special tokens at other ids), so every command has a
different-tokenizer pair out of the box; ``draft-sametok`` is the same model trained the same way with the target's
tokenizer, the baseline its acceptance is compared with. Both must load with plain transformers, keep the shipped
draft's architecture, and write code text their tokenizers read back unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.recipe import DEMO_DIR, load_recipe, resolve_model_path

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_DIR, DRAFT_DIR = DEMO_DIR / "target", DEMO_DIR / "draft"
OTHERTOK_DIR, SAMETOK_DIR = DEMO_DIR / "draft-othertok", DEMO_DIR / "draft-sametok"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ARCHITECTURE = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "tie_word_embeddings",
)
# Not from the stdlib (the training corpus); tabs, a non-ASCII character and a trailing newline on purpose.
CODE_SNIPPET = '''class RingBuffer:
    """A fixed-size FIFO that overwrites its oldest item — café-grade."""

    def __init__(self, size):
\tself.items = [None] * size
        self.start = 0

    def push(self, item):
        self.items[self.start] = item
        self.start = (self.start + 1) % len(self.items)
'''

pytestmark = pytest.mark.skipif(
    not all((d / "config.json").is_file() for d in (TARGET_DIR, DRAFT_DIR, OTHERTOK_DIR, SAMETOK_DIR)),
    reason="issue 28's drafts not trained: run tools/train_demo_pair.py --other-tokenizer-drafts",
)


@pytest.fixture(scope="module")
def tokenizers():
    from transformers import AutoTokenizer

    return {d.name: AutoTokenizer.from_pretrained(d) for d in (TARGET_DIR, OTHERTOK_DIR, SAMETOK_DIR)}


@pytest.fixture(scope="module")
def drafts():
    import torch
    from transformers import AutoModelForCausalLM

    return {
        d.name: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        for d in (DRAFT_DIR, OTHERTOK_DIR, SAMETOK_DIR)
    }


def test_demo_names_resolve_to_the_shipped_dirs():
    assert resolve_model_path("demo:draft-othertok", Path(".")) == OTHERTOK_DIR
    assert resolve_model_path("demo:draft-sametok", Path(".")) == SAMETOK_DIR


def test_recipe_pairs_the_target_with_the_other_tokenizer_draft():
    recipe = load_recipe(REPO_ROOT / "builders" / "demo-othertok.yaml")
    assert recipe.speculative.heterogeneous_vocab is True
    assert recipe.target.model == TARGET_DIR
    assert recipe.draft.model == OTHERTOK_DIR


def test_weights_are_fp16_safetensors_of_demo_size():
    import torch
    from safetensors import safe_open

    for model_dir in (OTHERTOK_DIR, SAMETOK_DIR):
        assert (model_dir / "generation_config.json").is_file()
        assert not list(model_dir.glob("*.bin"))
        with safe_open(model_dir / "model.safetensors", framework="pt") as weights:
            dtypes = {weights.get_tensor(k).dtype for k in weights.keys()}  # noqa: SIM118 (no __iter__)
            assert dtypes == {torch.float16}, model_dir.name
        size = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
        assert size <= 3 * 1024 * 1024, f"{model_dir.name}: {size / 1e6:.1f} MB"


def test_drafts_keep_the_shipped_draft_architecture(drafts, tokenizers):
    shipped = drafts["draft"].config
    for name in ("draft-othertok", "draft-sametok"):
        config = drafts[name].config
        assert type(drafts[name]).__name__ == "LlamaForCausalLM"
        for field in ARCHITECTURE:
            assert getattr(config, field) == getattr(shipped, field), (name, field)
        assert config.vocab_size == len(tokenizers[name])
        assert config.eos_token_id == tokenizers[name].eos_token_id
        assert config.bos_token_id == tokenizers[name].bos_token_id


def test_othertok_tokenizer_differs_from_the_targets(tokenizers):
    target, other = tokenizers["target"], tokenizers["draft-othertok"]
    assert len(other) != len(target)
    # The same special tokens by text, at other ids, so a runtime that passes ids through unchanged is caught.
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(other, attr) == getattr(target, attr)
        assert getattr(other, f"{attr}_id") != getattr(target, f"{attr}_id"), attr
    other_by_id = {idx: text for text, idx in other.get_vocab().items()}
    assert not [text for text, idx in target.get_vocab().items() if other_by_id.get(idx) == text]
    snippet_ids = other(CODE_SNIPPET, add_special_tokens=False)["input_ids"]
    assert snippet_ids != target(CODE_SNIPPET, add_special_tokens=False)["input_ids"]
    # Both prepend <s>, as the target's does, and both render the same chat template text.
    assert other("x")["input_ids"][0] == other.bos_token_id
    chat = [{"role": "user", "content": "sort a list"}]
    assert other.apply_chat_template(chat, tokenize=False) == target.apply_chat_template(chat, tokenize=False)


def test_sametok_shares_the_targets_tokenizer_byte_for_byte():
    for name in TOKENIZER_FILES:
        assert (SAMETOK_DIR / name).read_bytes() == (TARGET_DIR / name).read_bytes(), name


@pytest.mark.parametrize("name", ["target", "draft-othertok", "draft-sametok"])
def test_tokenizers_round_trip_code_text(tokenizers, name):
    tokenizer = tokenizers[name]
    ids = tokenizer(CODE_SNIPPET, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == CODE_SNIPPET
    assert tokenizer.unk_token_id not in ids  # byte-level: every byte has a token


def test_vocab_overlap_with_the_target(tokenizers):
    from trtspec.core.translate import vocab_overlap

    overlap = vocab_overlap(tokenizers["target"], tokenizers["draft-othertok"])
    print(overlap.describe())
    # TRAINING.md records 0.875: the share of the target's tokens with a one-token twin of the same text.
    assert overlap.share > 0.5, overlap.describe()
    assert overlap.draft_size == len(tokenizers["draft-othertok"])
    assert all(overlap.specials[text] == text for text in ("<s>", "</s>", "<unk>", "<pad>")), overlap.specials


@pytest.mark.parametrize("name", ["draft-othertok", "draft-sametok"])
def test_drafts_predict_unseen_code_far_better_than_chance(drafts, tokenizers, name):
    import math

    import torch

    ids = tokenizers[name](CODE_SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = drafts[name](input_ids=ids, labels=ids).loss.item()
    assert loss < 0.6 * math.log(len(tokenizers[name])), loss


def test_generate_validate_and_bench_run_on_the_second_demo_pair(runner, tmp_path):
    """The commands a user runs first, on the shipped pair whose draft has its own tokenizer: generate gives the
    target-only text, validate passes (exact), bench sweeps (the draft alone, which would be fed target ids, is
    not timed: the cost ratio then comes from --draft-cost-ratio)."""
    import json

    from trtspec.cli import cli

    recipe = str(Path(__file__).parent.parent / "builders" / "demo-othertok.yaml")
    prompt = "def read_config(path):\n"
    texts = []
    for k in ("0", "3"):
        result = runner.invoke(
            cli,
            ["generate", "--recipe", recipe, "--prompt", prompt, "--max-new-tokens", "24"]
            + ["--num-draft-tokens", k, "--json"],
        )
        assert result.exit_code == 0, result.output
        texts.append(json.loads(result.stdout)["text"])
    assert texts[0] == texts[1]
    result = runner.invoke(cli, ["validate", recipe, "--limit", "2", "--max-tokens", "12"])
    assert result.exit_code == 0 and "validation passed" in result.output, result.output
    args = [
        "bench",
        recipe,
        "--concurrency",
        "1",
        "--num-draft-tokens",
        "2",
        "--limit",
        "2",
        "--max-tokens",
        "12",
    ]
    result = runner.invoke(cli, [*args, "--out", str(tmp_path / "bench"), "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout)["points"]
    assert any(p["k"] == "2" and p["acceptance_rate"] > 0 for p in points)
