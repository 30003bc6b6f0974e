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
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}

# One tiny draft/target pair per family, each keeping every key of the published config.json that changes what the
# model computes or when it stops (dims shrunk; windows and vocab padding shrunk in proportion). "specials": extra
# special tokens of the family's tokenizer (the pair shares one); "eos": the eos_token_id list of config.json or
# generation_config.json, by token ("</s>" is the tokenizer's eos, id 2); "vocab_size": padded model vocab rows.
_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
FAMILIES: dict[str, dict] = {
    # meta-llama/Llama-3.1-8B-Instruct target, Llama-3.2-1B-Instruct draft (tied embeddings, rope factor 32);
    # eos_token_id [128001 <|end_of_text|>, 128008 <|eom_id|>, 128009 <|eot_id|>]. With head_dim 16 and theta 5e5
    # the llama3 rope keeps, smooths and divides by the factor different frequencies, as at head_dim 128.
    "llama3": {
        "arch": "llama",
        "specials": ("<|eom_id|>", "<|eot_id|>"),
        "eos": ("</s>", "<|eom_id|>", "<|eot_id|>"),
        "common": dict(
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            head_dim=16,
            attention_bias=False,
            mlp_bias=False,
        ),
        "target": dict(num_key_value_heads=2, rope_scaling=_LLAMA3_ROPE | {"factor": 8.0}),
        "draft": dict(
            hidden_size=32,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_scaling=_LLAMA3_ROPE | {"factor": 32.0},
        ),
    },
    # Qwen/Qwen2.5-7B-Instruct target (vocab 152064), Qwen2.5-0.5B-Instruct draft (vocab 151936, tied): qkv bias,
    # use_sliding_window false beside sliding_window / max_window_layers; generation_config eos
    # [151645 <|im_end|>, 151643 <|endoftext|>]. Tokenizer 324 tokens, vocab rows 336 / 352 (same relation).
    "qwen2.5": {
        "arch": "qwen2",
        "specials": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "eos": ("<|im_end|>", "<|endoftext|>"),
        "common": dict(
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=32768,
            use_sliding_window=False,
            sliding_window=32768,
        ),
        "target": dict(num_key_value_heads=2, vocab_size=352, max_window_layers=2),
        "draft": dict(
            hidden_size=32,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            vocab_size=336,
            max_window_layers=1,
        ),
    },
    # Qwen/Qwen3-8B target, Qwen3-0.6B draft: q/k norm, head_dim 128 with 16 heads and hidden 1024 in the draft
    # (head_dim * heads != hidden), tied draft; eos 151645 <|im_end|> (config), [151645, 151643] (generation).
    "qwen3": {
        "arch": "qwen3",
        "specials": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "eos": ("<|im_end|>", "<|endoftext|>"),
        "common": dict(
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=40960,
            head_dim=16,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
        ),
        "target": dict(num_key_value_heads=2),
        "draft": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    },
    # mistralai/Mistral-7B-v0.1 (both: there is no smaller Mistral): sliding_window 4096 of a 32768 context,
    # here 16 tokens, so generations run past it.
    "mistral": {
        "arch": "mistral",
        "common": dict(
            rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=32768, sliding_window=16
        ),
        "target": dict(num_key_value_heads=1),
        "draft": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1),
    },
    # google/gemma-2-9b-it target, gemma-2-2b-it draft: logit soft-capping (final 30, attention 50),
    # query_pre_attn_scalar, alternating sliding (4096) / global layers, gelu_pytorch_tanh, tied embeddings,
    # generation eos [1 <eos>, 107 <end_of_turn>].
    "gemma2": {
        "arch": "gemma2",
        "specials": ("<end_of_turn>",),
        "eos": ("</s>", "<end_of_turn>"),
        "common": dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            final_logit_softcapping=30.0,
            attn_logit_softcapping=50.0,
            sliding_window=8,
            hidden_activation="gelu_pytorch_tanh",
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
        "target": dict(num_key_value_heads=2),
        "draft": dict(num_attention_heads=2, num_key_value_heads=1),
    },
    # google/gemma-3-1b-it draft and the text model of gemma-3-4b-it target (rope_scaling linear 8): layer_types
    # 5 sliding (512) : 1 full, rope_local_base_freq 10000 beside rope_theta 1e6, q/k norm, no soft-capping;
    # generation eos [1 <eos>, 106 <end_of_turn>].
    "gemma3": {
        "arch": "gemma3",
        "specials": ("<end_of_turn>",),
        "eos": ("</s>", "<end_of_turn>"),
        "common": dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=8,
            rope_local_base_freq=10000.0,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=32768,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            tie_word_embeddings=True,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "target": dict(num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 8.0}),
        "draft": dict(num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2),
    },
    # microsoft/Phi-3-medium-4k-instruct target, Phi-3-mini-4k-instruct draft: fused qkv / gate_up, sliding_window
    # 2047 of a 4096 context (here 16), vocab 32064 padded past the 32011 tokens; generation eos
    # [32000 <|endoftext|>, 32001 <|assistant|>, 32007 <|end|>]. partial_rotary_factor 0.75 as in Phi-4-mini
    # (a Phi3ForCausalLM) on the target.
    "phi3": {
        "arch": "phi3",
        "specials": ("<|assistant|>", "<|end|>"),
        "eos": ("</s>", "<|assistant|>", "<|end|>"),
        "common": dict(
            sliding_window=16,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            original_max_position_embeddings=4096,
            vocab_size=336,
        ),
        "target": dict(num_key_value_heads=2, partial_rotary_factor=0.75),
        "draft": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2),
    },
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
    defaults = dict(max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    config = config_cls(
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads or num_attention_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size or len(tokenizer),
        tie_word_embeddings=tie_word_embeddings,
        **(defaults | config_overrides),
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


def make_family_pair(out_dir: Path, family: str, seed: int = 0) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of ``FAMILIES[family]``: a 2-layer x 64 target and a 1-layer draft (unless the
    family says otherwise) sharing one tokenizer; the eos list goes where the published model keeps it."""
    from transformers import GenerationConfig

    spec = FAMILIES[family]
    out_dir = Path(out_dir)
    tokenizer = make_tokenizer(out_dir / "tokenizer", extra_special=spec.get("specials", ()))
    eos = [tokenizer.convert_tokens_to_ids(t) for t in spec.get("eos", ("</s>",))]
    dirs = []
    for i, (role, shape) in enumerate((("target", {}), ("draft", {"num_hidden_layers": 1}))):
        kwargs = shape | spec["common"] | spec[role]
        if len(eos) > 1 and spec["arch"] == "llama":
            kwargs["eos_token_id"] = eos  # Llama 3.x: the list is in config.json itself
        else:
            kwargs["eos_token_id"] = eos[0]
        path = make_model(out_dir / role, spec["arch"], tokenizer_dir=out_dir / "tokenizer",
                          seed=seed + i, **kwargs)  # fmt: skip
        if len(eos) > 1:  # the others list it in generation_config.json only
            GenerationConfig(
                bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
            ).save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1]


def steer_to_eos(target: Path, out: Path, eos_id: int, prompt: list[int]) -> Path:
    """A copy of ``target`` whose greedy continuation of ``prompt`` ends at ``eos_id``: its output row becomes 1.5x
    the row of a token greedy picks with a positive logit, so eos outscores that token wherever it would win."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(target, out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(8):
            logits = model(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            if len(ids) - len(prompt) >= 2 and logits[token] > 0 and token > eos_id:
                weight = model.get_output_embeddings().weight
                weight[eos_id] = 1.5 * weight[token]
                model.save_pretrained(out)
                return out
            ids.append(token)
    raise AssertionError(f"{target}: no greedy token to steer to {eos_id}")


# Tokenizers of two real families for a pair whose vocabularies differ (issue 28). Both are byte-level BPEs trained
# on CORPUS, at different sizes, with the families' special-token texts, start-token rules and chat templates:
# meta-llama/Llama-3.1-8B-Instruct (bos <|begin_of_text|> prepended by the post-processor, eos <|eot_id|>, no pad)
# and Qwen/Qwen2.5-0.5B-Instruct (no bos, eos <|im_end|>, pad <|endoftext|>, ChatML).
_LLAMA3_CHAT = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CROSS_FAMILY_TOKENIZERS: dict[str, dict] = {
    "llama3": {
        "vocab_size": 300,
        "specials": (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
        ),
        "roles": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "prepend": "<|begin_of_text|>",
        "chat_template": _LLAMA3_CHAT,
    },
    "qwen2.5": {
        "vocab_size": 330,
        "specials": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "roles": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "prepend": None,
        "chat_template": _CHATML,
    },
}


def make_family_tokenizer(out_dir: Path, family: str):
    """``CROSS_FAMILY_TOKENIZERS[family]`` saved with save_pretrained; returns the PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = CROSS_FAMILY_TOKENIZERS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        special_tokens=list(spec["specials"]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if spec["prepend"]:
        bos = spec["prepend"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **spec["roles"])
    fast.add_special_tokens({"additional_special_tokens": [
        t for t in spec["specials"] if t not in spec["roles"].values()]})  # fmt: skip
    fast.chat_template = spec["chat_template"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def make_cross_family_pair(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """(target_dir, draft_dir): a Llama-3.1-style target (FAMILIES["llama3"], vocab rows = its 300 tokens, eos
    list in config.json) and a Qwen2.5-style draft (FAMILIES["qwen2.5"], its own 330-token tokenizer padded to 352
    rows, so the draft has more rows than the target, as Qwen2.5's 151936 beside Llama 3's 128256)."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    made = {}
    # The published eos lists: Llama 3.1's config.json [<|end_of_text|>, <|eom_id|>, <|eot_id|>]; Qwen2.5's
    # config.json <|im_end|>, its generation_config.json [<|im_end|>, <|endoftext|>].
    roles = (
        ("target", "llama3", {}, ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")),
        (
            "draft",
            "qwen2.5",
            {"num_hidden_layers": 1, "intermediate_size": 64},
            ("<|im_end|>", "<|endoftext|>"),
        ),
    )
    for role, family, shape, eos_texts in roles:
        spec = FAMILIES[family]
        tok_dir = out_dir / f"{role}-tokenizer"
        tokenizer = make_family_tokenizer(tok_dir, family)
        eos = [tokenizer.convert_tokens_to_ids(t) for t in eos_texts]
        kwargs = shape | spec["common"] | spec[role]
        if family == "llama3":
            kwargs |= {"eos_token_id": eos, "vocab_size": len(tokenizer)}
        else:
            kwargs |= {"eos_token_id": eos[0], "vocab_size": -(-len(tokenizer) // 32) * 32}
        path = make_model(
            out_dir / role, spec["arch"], tokenizer_dir=tok_dir, seed=seed + len(made), **kwargs
        )
        if family == "qwen2.5":
            GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id).save_pretrained(path)
        made[role] = path
    return made["target"], made["draft"]


def make_sentencepiece_tokenizer():
    """A Llama-2 / Mistral-style tokenizer (the SentencePiece BPE as `tokenizers` converts it): spaces become
    ``▁``, the normalizer prepends one to every text, the decoder drops the space that starts a text, ``<s>``
    prepended, and byte fallback: the 256 ``<0xNN>`` pieces after the specials, no piece holding a line break
    (Llama 2 writes "\\n" as ``<0x0A>``). Trained on CORPUS; its word starts are marked, not split off as byte-level
    BPE's."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=["\u2581"], show_progress=False
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    tok.train_from_iterator(["\u2581" + text.replace(" ", "\u2581") for text in CORPUS] * 3, trainer)
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [t for t, _ in trained if t not in specials and "\n" not in t]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] = [
        pair for pair in spec["model"]["merges"] if all(p in vocab for p in pair) and "".join(pair) in vocab
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
