"""Systems under test: one small protocol that validate and bench drive, whatever serves the model.

A system takes a batch of requests (issued together: one batch in-process, concurrent requests to a server) and
returns one ``Generation`` per request: generated token ids (prompt excluded, as the system returned them, a kept
stop token included), text, per-request ``AcceptanceStats`` and timings. ``num_draft_tokens=0`` in the sampling
parameters asks the same system for target-only decoding, the control and the speed baseline.

Implementations: ``EngineSystem`` (the in-process PyTorch ``SpeculativeEngine``, or TensorRT-LLM engines through
engines/trtllm_runner.py's runner of the same API, NGC image only) and ``TritonSystem`` (validate/triton_system.py, a
Triton endpoint over gRPC streaming or HTTP). inputs.py's ``open_system`` picks one.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from trtspec.core.metrics import AcceptanceStats

if TYPE_CHECKING:
    from trtspec.engines.sampling import SamplingParams
    from trtspec.recipe import Recipe


@dataclass(frozen=True)
class Request:
    """One prompt, as text and as the target tokenizer's ids (systems use whichever they take). ``text`` is what
    a server's text_input gets: for a chat prompt, the chat template's rendering (trtspec/chat.py)."""

    text: str
    token_ids: list[int]
    prompt_set: str = "raw"  # 'raw', 'chat' or a file's label (prompts.Prompt.prompt_set): per-set reports
    chat: bool = False  # rendered with the chat template
    # its own budget (bench's steady load); None: the call's SamplingParams'
    max_new_tokens: int | None = None


def encode_prompts(tokenizer, prompts) -> list[Request]:
    """The prompt set (``prompts.Prompt``) as Requests of the target tokenizer, chats through its chat template."""
    from trtspec.chat import encode_prompt

    return [
        Request(*encode_prompt(tokenizer, p.text, p.messages), p.prompt_set, p.messages is not None)
        for p in prompts
    ]


@dataclass
class Generation:
    """One request's output. Times are seconds from the moment the batch was issued.

    ``chunks``: (arrival time, tokens in it) per streamed piece; one piece for non-streaming systems.
    ``ids_from_text``: the token ids were obtained by tokenising ``text`` (the system returns text only).
    """

    token_ids: list[int]
    text: str | None
    stats: AcceptanceStats | None
    elapsed_s: float
    time_to_first_token_s: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)
    ids_from_text: bool = False


# Where a proposer's acceptance is listed: the draft model, then prompt lookup, then any other in name order.
PROPOSER_ORDER = {"draft": 0, "ngram": 1}


def proposer_summary(stats) -> dict[str, dict]:
    """Acceptance per proposer (core/metrics.py ``by_proposer``): the draft tokens each proposer gave, how many the
    target accepted, and its share of every drafted token. Rounds 0: the system reports totals only (a server)."""
    cells = sorted(stats.by_proposer.items(), key=lambda item: (PROPOSER_ORDER.get(item[0], 2), item[0]))
    return {
        name: {
            "rounds": rounds,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": stats.proposer_acceptance(name),
            "mean_accepted_length": accepted / rounds if rounds else None,
            "share_of_drafted": drafted / stats.drafted if stats.drafted else None,
        }
        for name, (rounds, drafted, accepted) in cells
    }


class SystemUnderTest(Protocol):
    name: str
    max_draft_len: int  # the most draft tokens a request may ask for (0: target-only system)
    max_batch_size: int  # the most requests generate() takes at once
    fixed_k: int | None  # K the system sets itself (no per-request K, no target-only mode); None: any K
    adaptive: bool | None  # a request that gives no K gets adaptive K (engines/adaptive.py); None: unknown
    proposer: str  # who proposes for a request that names no proposer (core/lookup.py PROPOSERS)
    notes: list[str]  # what reports say about it: a setting it did not publish, a figure it cannot give
    # what its target computes in (a quantization's name for quantized weights); None: unknown
    dtype: str | None

    def generate(
        self, requests: list[Request], params: SamplingParams, in_flight: int | None = None
    ) -> list[Generation]:
        """Generations of ``requests`` issued together, or with ``in_flight`` as a steady load: that many at a
        time, in order, the next issued as one finishes (times per request count from its issue)."""

    def close(self) -> None: ...


# A run that times fewer generated tokens than this reports a tokens/s made mostly of its prompt's prefill and of
# per-call overhead, which one scheduler hiccup moves by tens of percent: no speed is reported for it. (The
# untimed warm-up before a timed run takes its first-call costs, allocations and caches, out of the timing.)
MIN_TIMED_TOKENS = 64


def too_few_timed(timed_tokens: int) -> str | None:
    """Why a rate over ``timed_tokens`` means nothing, or None where there are enough."""
    if timed_tokens >= MIN_TIMED_TOKENS:
        return None
    return (
        f"the timed run generated {timed_tokens} tokens, fewer than the {MIN_TIMED_TOKENS} a rate needs to mean "
        "anything (it would be mostly prefill and per-call overhead)"
    )


def speed_withheld(timed_tokens: int) -> str | None:
    """Why a timed run's tokens/s is not reported (too few tokens timed), or None when it is."""
    why = too_few_timed(timed_tokens)
    return why and f"tokens/s and speedup are not reported: {why}; time more prompts or a larger --max-tokens"


def generate_all(
    system: SystemUnderTest, requests: list[Request], params: SamplingParams
) -> tuple[list[Generation], float]:
    """Run ``requests`` through ``system`` in batches of its max_batch_size; returns generations and wall seconds."""
    out: list[Generation] = []
    start = time.perf_counter()
    for first in range(0, len(requests), system.max_batch_size):
        out += system.generate(requests[first : first + system.max_batch_size], params)
    return out, time.perf_counter() - start


class EngineSystem:
    """The in-process PyTorch ``SpeculativeEngine`` (streamed, so every round's arrival time is recorded)."""

    def __init__(self, engine, name: str = "engine", adaptive: bool = False, dtype: str | None = None):
        self.engine, self.name, self.dtype = engine, name, dtype
        self.max_draft_len = engine.max_draft_len if engine.proposes else 0
        self.max_batch_size = engine.max_batch_size
        self.fixed_k = None
        self.adaptive = adaptive and self.max_draft_len > 0
        self.proposer = engine.proposer
        self.notes: list[str] = []

    @classmethod
    def from_recipe(
        cls,
        recipe: Recipe,
        device: str = "cpu",
        dtype: str = "auto",
        max_batch_size: int | None = None,
        proposers: Collection[str] = (),
    ):
        """The recipe's pair; ``proposers`` (core/lookup.py) the requests will name: without one that uses the
        draft model, none is loaded (prompt lookup proposes alone)."""
        from trtspec.core.lookup import uses_draft
        from trtspec.engines.adaptive import policy_for
        from trtspec.engines.engine import SpeculativeEngine

        dtype = runtime_dtype(recipe, device, dtype)
        needed = any(map(uses_draft, proposers or [recipe.speculative.proposer]))
        draft = recipe.draft.model if recipe.draft is not None and needed else None
        # A request that names no proposer gets the recipe's, where the pair loaded can serve it.
        proposer = recipe.speculative.proposer
        proposer = proposer if draft is not None or not uses_draft(proposer) else "ngram"
        engine = SpeculativeEngine.from_pretrained(
            recipe.target.model,
            draft,
            device=device,
            dtype=dtype,
            max_draft_len=recipe.speculative.max_draft_len,
            max_batch_size=max_batch_size or recipe.limits.max_batch_size,
            max_seq_len=recipe.limits.max_seq_len,
            trust_remote_code=recipe.target.trust_remote_code,
            k_policy=policy_for(recipe.speculative),
            proposer=proposer,
            lookup=recipe.speculative.lookup,
            heterogeneous_vocab=recipe.speculative.heterogeneous_vocab,  # a draft with its own tokenizer
        )
        return cls(engine, name=f"in-process engine ({device}, {dtype})", adaptive=True, dtype=dtype)

    def generate(
        self, requests: list[Request], params: SamplingParams, in_flight: int | None = None
    ) -> list[Generation]:
        chunks: list[list[tuple[float, int]]] = [[] for _ in requests]
        own = (
            [r.max_new_tokens or params.max_new_tokens for r in requests]
            if any(r.max_new_tokens for r in requests)
            else None
        )
        start = time.perf_counter()
        issued = [0.0] * len(requests)  # a request that waits for a free place is issued when it joins
        event = None
        prompts = [r.token_ids for r in requests]
        for event in self.engine.generate_stream(prompts, params, in_flight=in_flight, max_new_tokens=own):
            now = time.perf_counter() - start
            for b, tokens in enumerate(event.new_tokens):
                if tokens:
                    chunks[b].append((now - issued[b], len(tokens)))
            for b in event.joined:
                issued[b] = now
        return [
            Generation(
                token_ids=list(result.token_ids),
                text=result.text,
                stats=result.stats,
                elapsed_s=chunks[b][-1][0] if chunks[b] else 0.0,
                time_to_first_token_s=chunks[b][0][0] if chunks[b] else None,
                chunks=chunks[b],
            )
            for b, result in enumerate(event.results)
        ]

    def close(self) -> None:
        self.engine = None


def served_dtype(recipe: Recipe, runtime: str | None = None) -> str:
    """What the recipe's deployment (``runtime``: the recipe's by default) computes the target in: the torch
    runtime's dtype on its device, else the engine's or checkpoint's dtype, or the quantization's name for
    quantized weights."""
    from trtspec.recipe import torch_runtime_dtype

    if (runtime or recipe.triton.runtime) == "torch":
        return torch_runtime_dtype(recipe.triton, recipe.target)
    quantization = recipe.target.quantization
    return recipe.target.dtype if quantization == "none" else quantization


def runtime_dtype(recipe: Recipe, device: str, dtype: str = "auto") -> str:
    """``auto``: the torch runtime's rule (float32 on CPU, the target's dtype on CUDA); else ``dtype``."""
    from trtspec.recipe import torch_runtime_dtype

    if dtype != "auto":
        return dtype
    return torch_runtime_dtype(
        recipe.triton.model_copy(update={"device": device, "torch_dtype": "auto"}), recipe.target
    )
