"""Tiny Hugging Face models and tokenizers built in the test, for every area of the suite.

``make_tokenizer`` trains a deterministic byte-level BPE on a fixed corpus; ``make_model`` saves a randomly
initialised causal LM of one architecture with that tokenizer beside it. Both write real files (save_pretrained)
so the code under test reads them exactly as it reads a user's checkpoint.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
] * 4

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def make_tokenizer(
    out_dir: Path, vocab_size: int = 320, eos: str = "</s>", extra_special: tuple[str, ...] = ()
):
    """A byte-level BPE tokenizer saved with save_pretrained; returns the PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", eos, "<pad>", *extra_special]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token=eos, pad_token="<pad>"
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def make_model(
    out_dir: Path,
    arch: str = "llama",
    *,
    tokenizer_dir: Path | None = None,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int | None = None,
    intermediate_size: int = 128,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """Save a random ``arch`` model (fp32) plus a tokenizer to ``out_dir``; returns ``out_dir``.

    ``vocab_size`` defaults to the tokenizer's size. ``tokenizer_dir`` reuses an existing tokenizer (a shared one
    for a matching pair); otherwise a default one is trained into ``out_dir``.
    """
    import torch
    import transformers
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else make_tokenizer(out_dir)
    if tokenizer_dir:
        tokenizer.save_pretrained(out_dir)
    config_cls, model_cls = (getattr(transformers, name) for name in ARCHS[arch])
    config = config_cls(
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads or num_attention_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size or len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # Larger-than-default init so random models have peaked, seed-dependent next-token distributions.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.08)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
