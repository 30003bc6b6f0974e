"""Draft-target speculative generation over TensorRT-LLM 1.2.x engines (NGC image only).

    runner = TrtllmSpeculativeRunner.from_engine_dirs(target_engine_dir, draft_engine_dir,
                                                      tokenizer_dir=target_hf_dir, use_draft_logits=False)
    runner = TrtllmSpeculativeRunner.from_recipe(recipe, engines_dir="engines")  # engines/<name>/{target,draft}/engine
    results = runner.generate([[1, 2, 3]], SamplingParams(max_new_tokens=64, num_draft_tokens=4))
    results[0].token_ids, results[0].finish_reason, results[0].stats.acceptance_rate
    for event in runner.generate_stream(prompts, params): ...   # one StreamEvent per round, as SpeculativeEngine

The same API as the PyTorch ``SpeculativeEngine`` (``GenerationResult`` / ``StreamEvent``, ``max_draft_len``,
``max_batch_size``), so ``validate.systems.EngineSystem(runner, name=...)`` drives it unchanged; like it, a batch is
one run of the one generation loop (engines/loop.py: stops, stats, adaptive K for requests that pin no
num_draft_tokens), and this module supplies the engine calls only.

The round is engines/engine_calls.py's (the one every engine-call runtime runs); this module is its adapter over
TensorRT-LLM's C++ runner (``TrtllmCalls``), mirroring upstream's draft-target runner, ``run_dtm_pld`` in
NVIDIA/TensorRT-LLM examples/prompt_lookup/run_dtm_pld.py (what ``examples/run.py --draft_target_model_config``
calls), over ``ModelRunnerCpp.generate`` (tensorrt_llm/runtime/model_runner_cpp.py; see engines/trtllm_engine.py):
propose is the draft engine's ``generate(max_new_tokens=K)`` (its generation logits too when use_draft_logits),
verify the target's ``generate(prefix, draft_tokens_list=..., [draft_logits_list=...], max_new_tokens=K+1)``.
Where trtspec differs from upstream (a plain target step instead of a placeholder ``[end_id]`` draft, seeds per
round and per model) the reason is in engine_calls.py and core/token_rules.py.

Prompt lookup (``proposer`` ngram or draft+ngram, core/lookup.py): the loop's looked-up tokens go to the target's
verify call as given drafts; with ngram alone no draft engine is loaded at all, and the target engine still needs
``draft_tokens_external`` (``check_pair``).

Not verified on a GPU: whether the executor ends a verification request after one step (the stats count one
target forward per verification call). The end token it leaves out of its output (TensorRT-LLM's sampling and
acceptance kernels count it in no sequence length) is put back by the round (engine_calls.py, step 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.core import layout
from trtspec.core.engine_config import engine_vocab_rows, pair_problems, read_engine_config
from trtspec.core.errors import CheckpointError, ModelError
from trtspec.core.lookup import LookupSpec, uses_lookup
from trtspec.engines import trtllm_engine as adapter
from trtspec.engines.adaptive import AdaptiveState, KPolicy, policy_for
from trtspec.engines.engine import StreamingGenerator
from trtspec.engines.engine_calls import Call, Draft, EngineCallRounds

if TYPE_CHECKING:
    from trtspec.recipe import Recipe

# KV-cache share of free GPU memory for each executor when draft and target share a GPU (the runtime's default,
# 0.9, would leave nothing for the second one).
SHARED_GPU_KV_FRACTION = 0.4


class TrtllmSpeculativeRunner(StreamingGenerator):
    """A target engine and an optional draft engine (``adapter.EngineRunner``); see the module docstring. Without
    a draft engine it decodes target-only, or by prompt lookup where ``proposer`` looks up (ngram)."""

    batch_hint = "rebuild with a larger limits.max_batch_size"
    seq_hint = "shorten it or rebuild with a larger limits.max_seq_len"
    tokenizer_hint = "pass tokenizer_dir (the target's HF directory)"

    def __init__(
        self,
        target: adapter.EngineRunner,
        draft: adapter.EngineRunner | None = None,
        *,
        use_draft_logits: bool = False,
        tokenizer=None,
        eos_ids: tuple[int, ...] = (),
        pad_id: int | None = None,
        k_policy: KPolicy = KPolicy(),
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
        translator=None,
    ):
        proposes = draft is not None or uses_lookup(proposer)
        draft_facts = draft.facts if draft else None
        check_pair(
            target.engine_dir,
            target.facts,
            draft_facts,
            use_draft_logits,
            external=proposes,
            own_tokenizer=translator is not None,
        )
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.translator = translator  # core/translate.py: a draft engine with a tokenizer of its own
        self.proposer, self.lookup = proposer, lookup
        self.use_draft_logits = use_draft_logits and proposes
        # a target engine verifies external draft tokens only where check_pair checked it does (``proposes``)
        self.proposes = proposes
        self.max_draft_len = target.max_draft_len if proposes else 0
        self.max_batch_size = min(r.max_batch_size for r in (target, draft) if r is not None)
        # The target engine's max_seq_len includes max_draft_len (trtllm-build adds it).
        self.max_seq_len = target.max_seq_len - target.max_draft_len
        if draft is not None:
            self.max_seq_len = min(self.max_seq_len, draft.max_seq_len)
        self.eos_ids, self.pad_id = tuple(eos_ids), pad_id  # eos_ids: core/token_rules.py rule 1
        self.k_policy = k_policy
        self.adaptive = AdaptiveState(k_policy)  # adaptive K's measurements, kept across calls

    @classmethod
    def from_engine_dirs(
        cls,
        target_engine_dir: str | Path,
        draft_engine_dir: str | Path | None = None,
        *,
        tokenizer_dir: str | Path | None = None,
        use_draft_logits: bool = False,
        target_device_ids: list[int] | None = None,
        draft_device_ids: list[int] | None = None,
        max_batch_size: int | None = None,
        trust_remote_code: bool = False,
        k_policy: KPolicy = KPolicy(),
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
        draft_tokenizer_dir: str | Path | None = None,
    ) -> TrtllmSpeculativeRunner:
        """Load the engines (configs are checked first, so a bad pair fails before any GPU work); no draft engine
        dir: the target alone (target-only, or prompt lookup for a ``proposer`` that looks up).
        ``draft_tokenizer_dir``: the draft's own tokenizer, for a draft that tokenizes differently (its tokens
        then reach the target as text: core/translate.py).

        Raises CheckpointError (missing / mismatched engines), NeedsTensorRTLLM (exit 3: no tensorrt_llm here).
        """
        target_facts = read_engine_config(target_engine_dir)
        draft_facts = read_engine_config(draft_engine_dir) if draft_engine_dir else None
        external = draft_facts is not None or uses_lookup(proposer)
        own = draft_tokenizer_dir is not None
        check_pair(
            Path(target_engine_dir),
            target_facts,
            draft_facts,
            use_draft_logits,
            external=external,
            own_tokenizer=own,
        )
        target_ids = list(target_device_ids or range(target_facts["tp_size"] * target_facts["pp_size"]))
        draft_ids = list(draft_device_ids or target_ids[:1])
        shared = draft_facts is not None and bool(set(target_ids) & set(draft_ids))
        opts: dict[str, Any] = dict(
            max_batch_size=max_batch_size,
            kv_cache_free_gpu_memory_fraction=SHARED_GPU_KV_FRACTION if shared else None,
            gather_generation_logits=use_draft_logits,
        )
        target = adapter.load_engine_runner(target_engine_dir, device_ids=target_ids, **opts)
        draft = None
        if draft_engine_dir:
            draft = adapter.load_engine_runner(draft_engine_dir, device_ids=draft_ids, **opts)
        tokenizer, eos_ids, pad_id = _tokenizer_facts(tokenizer_dir, trust_remote_code)
        translator = None
        if own:
            from trtspec.core.model_dir import load_tokenizer
            from trtspec.core.translate import Translator

            if tokenizer is None:
                raise ModelError(
                    f"the draft tokenizes with its own tokenizer ({draft_tokenizer_dir}), so its tokens reach the "
                    "target as text: give the target's tokenizer (tokenizer_dir, the recipe's target.model)"
                )
            translator = Translator(tokenizer, load_tokenizer(Path(draft_tokenizer_dir), trust_remote_code))
        return cls(
            target,
            draft,
            use_draft_logits=use_draft_logits,
            tokenizer=tokenizer,
            eos_ids=eos_ids,
            pad_id=pad_id,
            k_policy=k_policy,
            proposer=proposer,
            lookup=lookup,
            translator=translator,
        )

    @classmethod
    def from_recipe(
        cls, recipe: Recipe, engines_dir: str | Path = layout.ENGINES_DIR, max_batch_size: int | None = None
    ) -> TrtllmSpeculativeRunner:
        """The engines ``trtspec build`` wrote for ``recipe`` (engines_dir/<name>/{target,draft}/engine; the target
        alone where the recipe has no draft), proposing as its speculative.proposer says."""
        root = layout.pair_dir(recipe.name, engines_dir)
        draft = recipe.draft
        return cls.from_engine_dirs(
            layout.stage_dir(root, "target", layout.ENGINE),
            layout.stage_dir(root, "draft", layout.ENGINE) if draft is not None else None,
            tokenizer_dir=recipe.target.model,
            use_draft_logits=recipe.speculative.use_draft_logits,
            target_device_ids=list(recipe.target.devices),
            draft_device_ids=list(draft.devices) if draft is not None else None,
            max_batch_size=max_batch_size,
            trust_remote_code=recipe.target.trust_remote_code,
            k_policy=policy_for(recipe.speculative),
            proposer=recipe.speculative.proposer,
            lookup=recipe.speculative.lookup,
            draft_tokenizer_dir=recipe.draft_tokenizer_dir(),
        )

    def close(self) -> None:
        """Shut both executors down (frees their GPU memory and worker processes)."""
        for runner in (self.draft, self.target):
            if runner is not None:
                runner.close()
        self.draft = None

    # ------------------------------------------------------------ generation

    def new_rounds(self) -> EngineCallRounds:
        return EngineCallRounds(
            TrtllmCalls(self.target, self.draft),
            max_draft_len=self.max_draft_len,
            num_slots=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            vocab_size=self.input_vocab_size,
            use_draft_logits=self.use_draft_logits,
            tokenizer_eos=self.tokenizer.eos_token_id if self.tokenizer is not None else None,
            pad_id=self.pad_id,
            has_draft=self.draft is not None,
            translator=self.translator,
        )

    @property
    def input_vocab_size(self) -> int:
        # a draft with its own tokenizer never sees target ids
        runners = (self.target,) if self.translator is not None else (self.target, self.draft)
        return min(r.vocab_size for r in runners if r is not None)


class TrtllmCalls:
    """engine_calls.EngineCalls over two ``adapter.EngineRunner`` (ModelRunnerCpp). The engines keep no per-row
    state between calls (each call resubmits the prefix; KV-cache block reuse keeps that cheap)."""

    def __init__(self, target: adapter.EngineRunner, draft: adapter.EngineRunner | None):
        self.target, self.draft = target, draft
        self.draft_vocab = draft.vocab_size if draft is not None else 0
        self.target_logit_rows = engine_vocab_rows(target.facts)

    def propose(
        self, prefixes: list[list[int]], num_tokens: int, call: Call, want_logits: bool
    ) -> list[Draft]:
        # One max_new_tokens for the batch: capped so the longest prefix still fits the draft engine.
        steps = min(num_tokens, self.draft.max_seq_len - max(map(len, prefixes)))
        if steps <= 0:
            return [Draft([]) for _ in prefixes]
        outs = self.draft.generate(
            prefixes,
            max_new_tokens=steps,
            sampling=_sampling(call),
            return_logits=want_logits,
            **_stops(call),
        )
        return [Draft(o.token_ids, o.logits) for o in outs]

    def verify(self, prefixes, drafts, draft_logits, max_new_tokens: int, call: Call) -> list[list[int]]:
        if drafts is None:  # a plain call: capped so the longest prefix still fits the target engine
            max_new_tokens = min(max_new_tokens, self.target.max_seq_len - max(map(len, prefixes)))
        outs = self.target.generate(
            prefixes,
            max_new_tokens=max_new_tokens,
            sampling=_sampling(call),
            draft_tokens=drafts,
            draft_logits=draft_logits,
            **_stops(call),
        )
        return [o.token_ids for o in outs]


def _sampling(call: Call) -> dict:
    temperature = 0.0 if call.greedy else call.temperature  # sampling_kwargs' greedy is temperature 0
    return adapter.sampling_kwargs(temperature, call.top_k, call.top_p, call.seed)


def _stops(call: Call) -> dict:
    words = [list(w) for w in call.stops.stop_words] or None
    return {"end_id": call.stops.end_id, "pad_id": call.stops.pad_id, "stop_words": words}


def check_pair(
    target_dir: Path,
    target: dict,
    draft: dict | None,
    use_draft_logits: bool,
    external: bool | None = None,
    own_tokenizer: bool = False,
) -> None:
    """Engine-config checks of a draft-target pair (core.engine_config.pair_problems; CheckpointError, one line),
    before any engine is loaded. ``external``: the target gets draft tokens from outside (default: when there is a
    draft engine; prompt lookup gives them without one); ``own_tokenizer``: the draft tokenizes differently."""
    external = draft is not None if external is None else external
    if not external:
        return
    # the sequences it will serve: up to the target engine's max_seq_len less the K trtllm-build added to it
    serves = target["max_seq_len"] - target["max_draft_len"] if target.get("max_seq_len") else None
    problems = pair_problems(
        target, draft, max_seq_len=serves, use_draft_logits=use_draft_logits, own_tokenizer=own_tokenizer
    )
    if problems:
        raise CheckpointError(f"{target_dir}: {problems[0]}", detail="\n".join(problems))


def _tokenizer_facts(tokenizer_dir, trust_remote_code: bool) -> tuple[Any, tuple[int, ...], int | None]:
    """(tokenizer or None, the model's end ids (core/token_rules.py rule 1, model_dir.end_ids), the tokenizer's pad)
    of the target's HF dir; None where it has no tokenizer (ids only), ModelError for one that does not load."""
    if tokenizer_dir is None:
        return None, (), None
    from trtspec.core.model_dir import end_ids, load_tokenizer_if_any

    tokenizer = load_tokenizer_if_any(tokenizer_dir, trust_remote_code)
    pad_id = tokenizer.pad_token_id if tokenizer is not None else None
    return tokenizer, end_ids(tokenizer_dir, tokenizer), pad_id
