"""``trtspec generate``: one prompt through the PyTorch engine, text streamed as tokens are accepted, then stats.

``GenerateSpec`` is what the command's options become; ``resolve_models`` turns it (a recipe, or --target/--draft
directories) into model directories and engine limits, checking the tokenizers with the pre-flight check;
``run_generate`` loads the engine, streams and reports.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from trtspec.core.errors import ModelError, RequestError
from trtspec.engines.adaptive import KPolicy, policy_for


@dataclass(frozen=True)
class GenerateSpec:
    prompt: str
    recipe: str | None = "demo"
    target: Path | None = None
    draft: Path | None = None
    no_draft: bool = False
    max_new_tokens: int = 128
    num_draft_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, the recipe's target dtype (or bfloat16) on CUDA
    max_draft_len: int | None = None
    chat: bool = False  # the prompt is one user message, rendered with the target tokenizer's chat template


@dataclass(frozen=True)
class _Models:
    target: Path
    draft: Path | None
    max_draft_len: int
    num_draft_tokens: int | None
    max_seq_len: int
    dtype: str
    trust_remote_code: bool
    k_policy: KPolicy = KPolicy()  # adaptive K's settings (the recipe's, else the defaults)


def resolve_models(spec: GenerateSpec) -> _Models:
    """Model directories and limits from --target/--draft or the recipe; refuses mismatched tokenizers."""
    if spec.draft is not None and spec.target is None:
        raise RequestError("--draft DIR needs --target DIR (the recipe names its own draft)")
    if spec.no_draft and spec.num_draft_tokens:
        raise RequestError(
            f"--num-draft-tokens {spec.num_draft_tokens} needs a draft; --no-draft decodes target-only, drop one"
        )
    if spec.target is not None:
        if spec.draft is None and not spec.no_draft:
            raise RequestError("--target needs --draft DIR (or --no-draft for target-only decoding)")
        max_draft_len = spec.max_draft_len or 8
        models = _Models(
            Path(spec.target),
            None if spec.no_draft else Path(spec.draft),
            max_draft_len,
            None,
            2048,
            "bfloat16",
            False,
        )
    else:
        from trtspec.recipe import load_recipe

        recipe = load_recipe(spec.recipe or "demo")
        models = _Models(
            recipe.target.model,
            None if spec.no_draft else recipe.draft.model,
            spec.max_draft_len or recipe.speculative.max_draft_len,
            # Target-only decoding asks for no draft tokens, whatever K the recipe serves with.
            # No K in the recipe: adaptive (None).
            0 if spec.no_draft else recipe.speculative.num_draft_tokens,
            recipe.limits.max_seq_len,
            recipe.target.dtype,
            recipe.target.trust_remote_code,
            policy_for(recipe.speculative),
        )
    dtype = spec.dtype or ("float32" if spec.device == "cpu" else models.dtype)
    models = _Models(
        models.target,
        models.draft,
        models.max_draft_len,
        models.num_draft_tokens,
        models.max_seq_len,
        dtype,
        models.trust_remote_code,
        models.k_policy,
    )
    for path in (models.target, models.draft):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise ModelError(f"{path}: not a Hugging Face model directory (no config.json)")
    return models


def run_generate(spec: GenerateSpec, out) -> dict:
    """Generate for one prompt; stream text (unless --json), then print stats. Returns the JSON payload."""
    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.engines.sampling import SamplingParams

    models = resolve_models(spec)
    prompt_ids = _encode(spec, models)  # before the models load: a chat needs a chat template
    engine = SpeculativeEngine.from_pretrained(
        models.target,
        models.draft,
        device=spec.device,
        dtype=models.dtype,
        max_draft_len=models.max_draft_len,
        max_batch_size=1,
        max_seq_len=models.max_seq_len,
        trust_remote_code=models.trust_remote_code,
        k_policy=models.k_policy,
    )
    num_draft = spec.num_draft_tokens if spec.num_draft_tokens is not None else models.num_draft_tokens
    params = SamplingParams(
        max_new_tokens=spec.max_new_tokens,
        num_draft_tokens=num_draft,
        temperature=spec.temperature,
        top_k=spec.top_k,
        top_p=spec.top_p,
        seed=spec.seed,
        stop_strings=spec.stop,
    )
    stream = _TextStream(engine.tokenizer, spec.stop, enabled=not (out.json or out.quiet))
    for event in engine.generate_stream([prompt_ids], params):
        stream.feed(event.new_tokens[0])
        results = event.results
    stream.close()
    result = results[0]
    payload = {"prompt_token_ids": prompt_ids, **result.to_dict()}
    if out.json:
        out.emit_json(payload)
    else:
        _print_stats(out.console(), result, models.draft is not None)
    return payload


def _encode(spec: GenerateSpec, models: _Models) -> list[int]:
    from trtspec.chat import encode_prompt, user_message
    from trtspec.core.model_dir import has_tokenizer, load_tokenizer

    if not has_tokenizer(models.target):
        raise ModelError(f"{models.target}: no tokenizer; generate needs one to encode the prompt")
    tokenizer = load_tokenizer(Path(models.target), models.trust_remote_code)
    return encode_prompt(tokenizer, spec.prompt, user_message(spec.prompt) if spec.chat else None)[1]


class _TextStream:
    """Prints decoded text as tokens arrive; holds back an incomplete UTF-8 tail, never prints past a stop."""

    def __init__(self, tokenizer, stop: tuple[str, ...], enabled: bool):
        self.tokenizer, self.stop, self.enabled = tokenizer, stop, enabled
        self.tokens: list[int] = []
        self.printed = 0

    def feed(self, tokens: list[int]) -> None:
        self.tokens += tokens
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in self.stop if s in text]
        text = text[: min(ends)] if ends else text.rstrip("\ufffd")
        if self.enabled and len(text) > self.printed:
            sys.stdout.write(text[self.printed :])
            sys.stdout.flush()
        self.printed = max(self.printed, len(text))

    def close(self) -> None:
        if self.enabled:
            sys.stdout.write("\n")


def _print_stats(console, result, speculative: bool) -> None:
    stats = result.stats
    ttft = f"{stats.time_to_first_token_s * 1e3:.0f} ms" if stats.time_to_first_token_s is not None else "-"
    lines = [
        f"{stats.generated_tokens} tokens ({result.finish_reason}) in {stats.elapsed_s:.2f} s: "
        f"{stats.tokens_per_s:.1f} tokens/s, time to first token {ttft}",
        f"forward passes: target {stats.target_forwards}, draft {stats.draft_forwards}",
    ]
    if speculative:
        lines.append(
            f"drafted {stats.drafted}, accepted {stats.accepted} (acceptance rate {stats.acceptance_rate:.1%}), "
            f"bonus tokens {stats.bonus_tokens}, mean accepted length {stats.mean_accepted_length:.2f}"
        )
        lines.append(f"accepted-length histogram (0..K): {stats.accepted_length_histogram}")
        lines.append(
            f"K per round (target forwards that verified 0, 1, .. draft tokens): {stats.num_draft_histogram}, "
            f"mean K {stats.mean_num_draft_tokens:.2f}"
        )
    for line in lines:
        console.print(line, highlight=False, markup=False)
