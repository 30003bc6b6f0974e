"""In-process speculative generation: ``SpeculativeEngine`` (the API ``generate``, validate and bench use).

    engine = SpeculativeEngine.from_pretrained(target_dir, draft_dir | None, device="cpu", dtype="float32",
                                               max_draft_len=8, max_batch_size=8, max_seq_len=2048,
                                               trust_remote_code=False)
    results = engine.generate([[1, 2, 3], [1, 5]], SamplingParams(max_new_tokens=64, num_draft_tokens=4))
    results[0].token_ids, results[0].finish_reason, results[0].stats.acceptance_rate, results[0].text
    for event in engine.generate_stream(prompts, params):  # one event per round
        event.new_tokens[b]  # tokens emitted for sequence b this round (after stops), event.finished[b]
    engine.generate_stream(many_prompts, params, in_flight=4, max_new_tokens=budgets)  # a steady load of 4

``num_draft_tokens=None`` (the default) is adaptive K (engines/adaptive.py, settings: ``k_policy``), a number pins K.
``draft_dir=None`` (or ``num_draft_tokens=0``) is target-only decoding through the same loop, the baseline.
``proposer`` (core/lookup.py: draft, ngram, draft+ngram; a request's ``SamplingParams.proposer`` overrides it)
picks who proposes: prompt lookup needs no draft model.
A request with num_draft_tokens > max_draft_len raises ``RequestError`` (TensorRT-LLM refuses it too).
Stops: max_new_tokens, stop ids (core/token_rules.py: the one that ends a request is kept, as HF generate does),
stop strings (the token that completes one is the last token; ``text`` ends at the stop string). Nothing past a
stop is emitted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import ModelError, RequestError
from trtspec.core.lookup import LookupSpec, uses_lookup
from trtspec.core.model_dir import load_tokenizer_if_any, loaded_end_ids, require_device
from trtspec.core.token_rules import request_stop_ids
from trtspec.engines.adaptive import AdaptiveState, KPolicy
from trtspec.engines.loop import (
    GenerationLoop,
    GenerationResult,
    StopChecker,
    check_prompt,
    new_generator,
)
from trtspec.engines.models import load_causal_lm
from trtspec.engines.rounds import Rounds
from trtspec.engines.sampling import SamplingParams, check_num_draft_tokens
from trtspec.engines.speculative import TorchRounds

__all__ = ["GenerationResult", "SpeculativeEngine", "StopChecker", "StreamEvent", "StreamingGenerator"]


@dataclass
class StreamEvent:
    """One round: per sequence, the tokens it emitted (may be empty) and whether it is finished; ``joined``: the
    sequences that joined the loop after this round (``generate_stream``'s ``in_flight``)."""

    new_tokens: list[list[int]]
    finished: list[bool]
    results: list[GenerationResult] | None = None  # set on the last event
    joined: list[int] = field(default_factory=list)


def served_max_seq_len(max_seq_len: int, max_draft_len: int) -> int:
    """The engine's length for a server whose requests are capped at ``max_seq_len`` before they reach it: room
    for a verification of max_draft_len + 1 tokens past a request's last one, so a round near the cap can still
    draft."""
    return max_seq_len + max_draft_len + 1


class StreamingGenerator(ABC):
    """``generate`` / ``generate_stream`` for every runtime that supplies a round (``new_rounds``: the PyTorch
    engine, the TensorRT-LLM runner). A batch is one loop run: every prompt added at once (or, with
    ``in_flight``, that many at a time, the next as one finishes), stepped until done.
    A subclass sets target, draft, tokenizer, eos_ids, max_draft_len, max_seq_len, max_batch_size, k_policy and
    adaptive."""

    # The proposer a request without its own uses, and prompt lookup's settings (core/lookup.py).
    proposer: str = "draft"
    lookup: LookupSpec = LookupSpec()

    # What a user changes to lift each limit (the engine's arguments here; a rebuild for TensorRT engines).
    batch_hint = "raise max_batch_size"
    seq_hint = "shorten it or raise max_seq_len"
    tokenizer_hint = "load the engine from a directory with one"

    @abstractmethod
    def new_rounds(self) -> Rounds:
        """This runtime's round (engines/rounds.py), over its models and slots."""

    def new_loop(self, *, first_token_alone: bool = False) -> GenerationLoop:
        """A GenerationLoop over this runtime's rounds (requests join and leave between rounds)."""
        return GenerationLoop(
            self.new_rounds(),
            max_seq_len=self.max_seq_len,
            tokenizer=self.tokenizer,
            first_token_alone=first_token_alone,
            seq_hint=self.seq_hint,
            k_policy=self.k_policy,
            adaptive=self.adaptive,
            proposer=self.proposer,
            lookup=self.lookup,
        )

    def _eos_ids(self, params: SamplingParams) -> tuple[int, ...]:
        """The ids that end a request with ``params`` (core/token_rules.py rule 2 over the model's ``eos_ids``)."""
        return request_stop_ids(self.eos_ids, ignore_eos=params.ignore_eos, own=params.stop_token_ids)

    def _check_prompts(
        self, prompts: list[list[int]], params: list[SamplingParams], in_flight: int | None = None
    ) -> None:
        """Refuse a batch the runtime cannot take: size (or ``in_flight``), empty prompts, length, ids outside the
        vocabulary. ``params``: each prompt's."""
        if not prompts:
            raise RequestError(f"no prompts; the engine takes 1..{self.max_batch_size}")
        if in_flight is None and len(prompts) > self.max_batch_size:
            raise RequestError(
                f"batch of {len(prompts)} prompts; the engine takes 1..{self.max_batch_size} ({self.batch_hint})"
            )
        if in_flight is not None and not 1 <= in_flight <= self.max_batch_size:
            raise RequestError(
                f"{in_flight} prompts in flight; the engine takes 1..{self.max_batch_size} ({self.batch_hint})"
            )
        for i, (prompt, own) in enumerate(zip(prompts, params, strict=True)):
            check_prompt(
                prompt,
                own.max_new_tokens,
                self.max_seq_len,
                self.input_vocab_size,
                self.seq_hint,
                f"prompt {i}",
            )
        if params[0].stop_strings and self.tokenizer is None:
            raise RequestError(f"stop_strings need a tokenizer; {self.tokenizer_hint}")

    @property
    def input_vocab_size(self) -> int:
        """Ids every model of the runtime can embed (a padded-vocabulary pair's draft may have fewer rows)."""
        return self.target.vocab_size

    def generate_stream(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        in_flight: int | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> Iterator[StreamEvent]:
        """Yield one StreamEvent per round; the last one carries the GenerationResults. ``in_flight``: a steady
        load instead of one batch: at most that many prompts in the loop, in order, the next joining as one
        finishes (so prompts may outnumber max_batch_size). ``max_new_tokens``: each prompt's own budget."""
        check_num_draft_tokens(params, self.max_draft_len, self.max_draft_len > 0)
        own = (
            [params.with_(max_new_tokens=n) for n in max_new_tokens]
            if max_new_tokens
            else [params] * len(prompts)
        )
        self._check_prompts(prompts, own, in_flight)
        loop = self.new_loop()
        generator = new_generator(params, loop.rounds.device)  # one per call: the batch samples together
        eos_ids = self._eos_ids(params)
        waiting = deque(range(len(prompts)))

        def join(count: int) -> list[int]:
            joined = [waiting.popleft() for _ in range(min(count, len(waiting)))]
            for b in joined:
                loop.add(b, prompts[b], own[b], eos_ids=eos_ids, generator=generator)
            if joined and not waiting:
                loop.close()  # the last prompt joined: the call returns when every one is done
            return joined

        join(in_flight or len(prompts))
        results: list[GenerationResult | None] = [None] * len(prompts)
        try:
            while loop.busy:
                new_tokens = [[] for _ in prompts]
                finished = 0
                for event in loop.step():
                    new_tokens[event.request_id] = event.new_tokens
                    results[event.request_id] = event.result
                    finished += event.finished
                joined = join(finished)  # as many as left: the load stays at in_flight
                yield StreamEvent(new_tokens, [r is not None for r in results], joined=joined)
        finally:  # a caller that stops reading leaves a round untimed, not timed across its pause
            loop.adaptive.idle()
        yield StreamEvent([[] for _ in prompts], [True] * len(prompts), results)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Generate for a batch of token-id prompts; returns one result per prompt, in order."""
        last = deque(self.generate_stream(prompts, params), maxlen=1)
        return last[0].results


class SpeculativeEngine(StreamingGenerator):
    """A target (and optional draft) KV model pair; see the module docstring."""

    def __init__(
        self,
        target,
        draft=None,
        *,
        tokenizer=None,
        max_draft_len: int = 8,
        max_seq_len: int = 2048,
        k_policy: KPolicy = KPolicy(),
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
        translator=None,
    ):
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.translator = translator  # core/translate.py: a draft with a tokenizer of its own
        self.k_policy, self.proposer, self.lookup = k_policy, proposer, lookup
        self.adaptive = AdaptiveState(k_policy)  # measured over every call's rounds
        # whether the engine's own proposer proposes: a target-only engine (no draft, proposer "draft") still keeps
        # max_draft_len, for requests that ask for prompt lookup themselves
        self.proposes = draft is not None or uses_lookup(proposer)
        self.max_draft_len = max_draft_len
        self.max_seq_len = max_seq_len
        self.max_batch_size = target.num_slots
        self.eos_ids = loaded_end_ids(target, tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        target_dir: Path | str,
        draft_dir: Path | str | None = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_draft_len: int = 8,
        max_batch_size: int = 8,
        max_seq_len: int = 2048,
        trust_remote_code: bool = False,
        lean: bool | None = None,
        k_policy: KPolicy = KPolicy(),
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
        heterogeneous_vocab: bool = False,
    ) -> SpeculativeEngine:
        require_device(device)
        opts = dict(
            device=device,
            dtype=dtype,
            num_slots=max_batch_size,
            max_seq_len=max_seq_len,
            trust_remote_code=trust_remote_code,
            lean=lean,
        )
        tokenizer = load_tokenizer_if_any(target_dir, trust_remote_code)
        translator = None
        if draft_dir is not None and tokenizer is not None:
            translator = draft_translator(
                tokenizer, target_dir, draft_dir, trust_remote_code, heterogeneous_vocab
            )
        target = load_causal_lm(target_dir, **opts)
        draft = load_causal_lm(draft_dir, **opts) if draft_dir is not None else None
        return cls(
            target,
            draft,
            tokenizer=tokenizer,
            max_draft_len=max_draft_len,
            max_seq_len=max_seq_len,
            k_policy=k_policy,
            proposer=proposer,
            lookup=lookup,
            translator=translator,
        )

    @property
    def input_vocab_size(self) -> int:
        # a draft with its own tokenizer never sees target ids
        models = (self.target,) if self.translator is not None else (self.target, self.draft)
        return min(m.vocab_size for m in models if m is not None)

    def new_rounds(self) -> TorchRounds:
        return TorchRounds(
            self.target, self.draft, max_draft_len=self.max_draft_len, translator=self.translator
        )


def draft_translator(
    target_tokenizer,
    target_dir: Path | str,
    draft_dir: Path | str,
    trust_remote_code: bool,
    heterogeneous_vocab: bool = False,
):
    """None for a draft sharing the target's tokenizer (or one without a tokenizer: ids only); a
    core.translate.Translator for one with its own where ``heterogeneous_vocab`` allows it; else ModelError
    (check's rule)."""
    from trtspec.core.model_dir import has_tokenizer, load_tokenizer
    from trtspec.core.tokenizers import check_tokenizers
    from trtspec.core.translate import Translator

    if not has_tokenizer(draft_dir):
        return None
    draft_tokenizer = load_tokenizer(Path(draft_dir), trust_remote_code)
    result = check_tokenizers(target_tokenizer, draft_tokenizer)
    if result.status != "fail":
        return None
    if heterogeneous_vocab:
        return Translator(target_tokenizer, draft_tokenizer)
    raise ModelError(
        f"draft {draft_dir} and target {target_dir} tokenizers differ: {result.message}; "
        "set speculative.heterogeneous_vocab: true in the pair's recipe to draft through text"
    )
