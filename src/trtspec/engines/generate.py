"""``trtspec generate``: one prompt through the PyTorch engine, its text passed on as tokens are accepted.

``GenerateSpec`` is what the command's options become; ``resolve_models`` turns it (a recipe, or --target/--draft
directories) into model directories and engine limits, checking the tokenizers with the pre-flight check;
``run_generate`` loads the engine and generates, handing each new piece of text to ``on_text``. ``proposer``
(core/lookup.py) picks who proposes; prompt lookup alone (ngram) loads no draft model. What is shown, and
where, is the CLI edge's: this module returns a ``Generated`` and prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.core.errors import ModelError, RequestError
from trtspec.core.lookup import LookupSpec, uses_draft
from trtspec.core.model_dir import read_hf_config
from trtspec.engines.adaptive import KPolicy, policy_for

if TYPE_CHECKING:
    from trtspec.engines.loop import GenerationResult
    from trtspec.recipe import LimitsSpec


@dataclass(frozen=True, kw_only=True)
class GenerateSpec:
    prompt: str
    recipe: str | None = "demo"
    target: Path | None = None
    draft: Path | None = None
    no_draft: bool = False
    proposer: str | None = None  # None: the recipe's speculative.proposer, else draft
    max_new_tokens: int = 128
    num_draft_tokens: int | None = None
    max_draft_len: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, the recipe's target dtype (or bfloat16) on CUDA
    chat: bool = False  # the prompt is one user message, rendered with the target tokenizer's chat template


@dataclass(frozen=True, kw_only=True)
class _Models:
    target: Path
    draft: Path | None
    max_draft_len: int
    num_draft_tokens: int | None
    max_seq_len: int
    dtype: str
    trust_remote_code: bool
    k_policy: KPolicy = KPolicy()  # adaptive K's settings (the recipe's, else the defaults)
    proposer: str | None = "draft"  # None: target-only
    lookup: LookupSpec = LookupSpec()
    heterogeneous_vocab: bool = False  # the recipe lets the draft have a tokenizer of its own
    limits: LimitsSpec | None = None  # the recipe's (None: --target, no recipe)
    seq_limit: str = "the recipe's limits.max_seq_len"  # what sets max_seq_len, for the error that meets it


def resolve_models(spec: GenerateSpec) -> _Models:
    """Model directories and limits from --target/--draft or the recipe; refuses mismatched tokenizers, and
    options that cannot make a request (an empty prompt or stop string), before any model loads."""
    if not spec.prompt:
        raise RequestError("--prompt is empty; give the text to continue")
    if "" in spec.stop:
        raise RequestError(
            '--stop "": an empty stop string would end generation at once; drop it or give text'
        )
    if spec.draft is not None and spec.target is None:
        raise RequestError("--draft DIR needs --target DIR (the recipe names its own draft)")
    if spec.no_draft and spec.num_draft_tokens:
        raise RequestError(
            f"--num-draft-tokens {spec.num_draft_tokens} needs a draft; --no-draft decodes target-only, drop one"
        )
    if spec.no_draft and spec.proposer:
        raise RequestError(f"--proposer {spec.proposer}: --no-draft decodes target-only, drop one")
    models = _from_dirs(spec) if spec.target is not None else _from_recipe(spec)
    models = replace(models, dtype=spec.dtype or ("float32" if spec.device == "cpu" else models.dtype))
    _check_draft_len(spec, models)
    for path in (models.target, models.draft):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise ModelError(f"{path}: not a Hugging Face model directory (no config.json)")
    return _within_positions(models) if spec.target is not None else models


def _check_draft_len(spec: GenerateSpec, models: _Models) -> None:
    """K against max_draft_len before any model loads, naming the options (or recipe fields) that set each."""
    k = spec.num_draft_tokens if spec.num_draft_tokens is not None else models.num_draft_tokens
    if k is None or k <= models.max_draft_len:
        return
    asked = (
        f"--num-draft-tokens {k}"
        if spec.num_draft_tokens is not None
        else f"the recipe's num_draft_tokens {k}"
    )
    if spec.max_draft_len:
        limit, remedy = f"--max-draft-len {models.max_draft_len}", f"raise --max-draft-len to {k}"
    else:
        source = (
            "generate's default without a recipe" if spec.target else "the recipe's speculative.max_draft_len"
        )
        limit = f"max_draft_len {models.max_draft_len} ({source})"
        remedy = f"pass --max-draft-len {k}"
    raise RequestError(
        f"{asked} is above {limit}; {remedy} or pass --num-draft-tokens {models.max_draft_len}"
    )


def _within_positions(models: _Models) -> _Models:
    """Without a recipe, the length is the models' own: past max_position_embeddings a model's output is not
    defined (rotary positions it never saw, or an index past a learned table)."""
    for path in (models.target, models.draft):
        config = read_hf_config(path) if path is not None else {}
        positions = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
            "max_position_embeddings"
        )
        if isinstance(positions, int) and 0 < positions < models.max_seq_len:
            models = replace(models, max_seq_len=positions, seq_limit=f"max_position_embeddings of {path}")
    return models


def _from_dirs(spec: GenerateSpec) -> _Models:
    proposer = None if spec.no_draft else spec.proposer or "draft"
    if spec.draft is None and proposer and uses_draft(proposer):
        raise RequestError(
            f"--proposer {proposer} needs --draft DIR with --target (or --proposer ngram for prompt lookup alone, "
            "--no-draft for target-only decoding)"
        )
    return _Models(
        target=Path(spec.target),
        draft=Path(spec.draft) if proposer and uses_draft(proposer) else None,
        max_draft_len=spec.max_draft_len or 8,
        num_draft_tokens=None,
        max_seq_len=2048,
        seq_limit="generate's length without a recipe (a recipe's limits.max_seq_len sets another)",
        dtype="bfloat16",
        trust_remote_code=False,
        proposer=proposer,
    )


def _from_recipe(spec: GenerateSpec) -> _Models:
    from trtspec.recipe import load_recipe

    recipe = load_recipe(spec.recipe or "demo")
    proposer = None if spec.no_draft else spec.proposer or recipe.speculative.proposer
    if proposer and uses_draft(proposer) and recipe.draft is None:
        raise RequestError(
            f"recipe {recipe.name} has no draft model, so --proposer {proposer} cannot run; use --proposer ngram "
            "or give the recipe a draft"
        )
    return _Models(
        target=recipe.target.model,
        # prompt lookup alone needs no draft model: none is loaded
        draft=recipe.draft.model if proposer and uses_draft(proposer) else None,
        max_draft_len=spec.max_draft_len or recipe.speculative.max_draft_len,
        # Target-only decoding asks for no draft tokens, whatever K the recipe serves with.
        # No K in the recipe: adaptive (None).
        num_draft_tokens=0 if spec.no_draft else recipe.speculative.num_draft_tokens,
        max_seq_len=recipe.limits.max_seq_len,
        dtype=recipe.target.dtype,
        trust_remote_code=recipe.target.trust_remote_code,
        k_policy=policy_for(recipe.speculative),
        proposer=proposer,
        lookup=recipe.speculative.lookup,
        heterogeneous_vocab=recipe.speculative.heterogeneous_vocab,
        limits=recipe.limits,
    )


@dataclass(frozen=True)
class Generated:
    """One prompt's generation: its prompt ids and the engine's result (text, token ids, finish reason, stats)."""

    prompt_ids: list[int]
    result: GenerationResult
    proposer: str | None  # who proposed (core/lookup.py); None: target-only decoding

    @property
    def speculative(self) -> bool:
        return self.proposer is not None

    def to_dict(self) -> dict:
        return {"prompt_token_ids": self.prompt_ids, "proposer": self.proposer, **self.result.to_dict()}

    def stats_lines(self) -> list[str]:
        """The stats as plain text lines (the speculative lines only where a proposer took part)."""
        stats = self.result.stats
        ttft = (
            f"{stats.time_to_first_token_s * 1e3:.0f} ms" if stats.time_to_first_token_s is not None else "-"
        )
        lines = [
            f"{stats.generated_tokens} tokens ({self.result.finish_reason}) in {stats.elapsed_s:.2f} s: "
            f"{stats.tokens_per_s:.1f} tokens/s, time to first token {ttft}",
            f"forward passes: target {stats.target_forwards}, draft {stats.draft_forwards}",
        ]
        if not self.speculative:
            return lines
        return [
            *lines,
            f"drafted {stats.drafted}, accepted {stats.accepted} (acceptance rate "
            f"{'-' if stats.measured_acceptance is None else format(stats.measured_acceptance, '.1%')}), "
            f"bonus tokens {stats.bonus_tokens}, mean accepted length {stats.mean_accepted_length:.2f}",
            f"accepted-length histogram (0..K): {stats.accepted_length_histogram}",
            f"K per round (target forwards that verified 0, 1, .. draft tokens): {stats.num_draft_histogram}, "
            f"mean K {stats.mean_num_draft_tokens:.2f}",
            f"proposer {self.proposer}: " + (_by_proposer_text(stats) or "nothing drafted"),
        ]


def _by_proposer_text(stats) -> str:
    """Drafted and accepted tokens of each proposer that gave a round's draft tokens (draft model, lookup)."""
    return "; ".join(
        f"{name} drafted {drafted}, accepted {accepted}" + (f" ({rate:.1%})" if rate is not None else "")
        for name, (_, drafted, accepted) in stats.by_proposer.items()
        for rate in [stats.proposer_acceptance(name)]
    )


def run_generate(spec: GenerateSpec, on_text: Callable[[str], None] | None = None) -> Generated:
    """Generate for one prompt; ``on_text`` gets each new piece of decoded text as its tokens are accepted."""
    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.engines.loop import check_prompt
    from trtspec.engines.sampling import SamplingParams

    models = resolve_models(spec)
    prompt_ids = _encode(spec, models)  # before the models load: a chat needs a chat template
    if models.limits is not None and (problem := models.limits.prompt_problem(len(prompt_ids))):
        raise RequestError(f"--prompt: {problem}")
    # before the models load
    hint = f"it is {models.seq_limit}; lower --max-new-tokens or shorten the prompt"
    check_prompt(prompt_ids, spec.max_new_tokens, models.max_seq_len, 0, hint, "--prompt")
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
        proposer=models.proposer or "draft",
        lookup=models.lookup,
        heterogeneous_vocab=models.heterogeneous_vocab,
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
    stream = _TextStream(engine.tokenizer, spec.stop, on_text) if on_text is not None else None
    for event in engine.generate_stream([prompt_ids], params):
        if stream is not None:
            stream.feed(event.new_tokens[0])
        results = event.results
    return Generated(prompt_ids, results[0], models.proposer)


def _encode(spec: GenerateSpec, models: _Models) -> list[int]:
    from trtspec.chat import encode_prompt, user_message
    from trtspec.core.model_dir import has_tokenizer, load_tokenizer

    if not has_tokenizer(models.target):
        raise ModelError(f"{models.target}: no tokenizer; generate needs one to encode the prompt")
    tokenizer = load_tokenizer(Path(models.target), models.trust_remote_code)
    return encode_prompt(tokenizer, spec.prompt, user_message(spec.prompt) if spec.chat else None)[1]


class _TextStream:
    """Decodes tokens as they arrive and passes on the new text; holds back an incomplete UTF-8 tail, never passes
    text past a stop string."""

    def __init__(self, tokenizer, stop: tuple[str, ...], on_text: Callable[[str], None]):
        self.tokenizer, self.stop, self.on_text = tokenizer, stop, on_text
        self.tokens: list[int] = []
        self.passed = 0

    def feed(self, tokens: list[int]) -> None:
        self.tokens += tokens
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in self.stop if s in text]
        text = text[: min(ends)] if ends else text.rstrip("\ufffd")
        if len(text) > self.passed:
            self.on_text(text[self.passed :])
            self.passed = len(text)
