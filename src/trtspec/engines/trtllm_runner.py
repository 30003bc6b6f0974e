"""Draft-target speculative generation over TensorRT-LLM 1.2.x engines (NGC image only).

    runner = TrtllmSpeculativeRunner.from_engine_dirs(target_engine_dir, draft_engine_dir,
                                                      tokenizer_dir=target_hf_dir, use_draft_logits=False)
    runner = TrtllmSpeculativeRunner.from_recipe(recipe, engines_dir="engines")  # engines/<name>/{target,draft}/engine
    results = runner.generate([[1, 2, 3]], SamplingParams(max_new_tokens=64, num_draft_tokens=4))
    results[0].token_ids, results[0].finish_reason, results[0].stats.acceptance_rate
    for event in runner.generate_stream(prompts, params): ...   # one StreamEvent per round, as SpeculativeEngine

The same API as the PyTorch ``SpeculativeEngine`` (``GenerationResult`` / ``StreamEvent``, ``max_draft_len``,
``max_batch_size``), so ``validate.systems.EngineSystem(runner, name=...)`` drives it unchanged.

The loop mirrors upstream's draft-target runner, ``run_dtm_pld`` in NVIDIA/TensorRT-LLM
examples/prompt_lookup/run_dtm_pld.py (what ``examples/run.py --draft_target_model_config`` calls), over
``ModelRunnerCpp.generate`` (tensorrt_llm/runtime/model_runner_cpp.py; see builders/trtllm_adapter.py): each round

1. the draft engine generates num_draft_tokens tokens for every unfinished request (its generation logits too
   when use_draft_logits);
2. the target engine verifies them: ``generate(prefix, draft_tokens_list=..., [draft_logits_list=...],
   max_new_tokens=K+1)`` returns the accepted draft tokens plus one target token (recovered or bonus);
3. the emitted tokens are appended; a request stops on max_new_tokens, an end / stop token, a stop string, or
   when the target emitted nothing (no progress).

Differences from upstream, each for a reason: a request with no room left for a draft token (its last token) or
whose draft ended at once gets a plain target step instead of a placeholder draft token (upstream sends
``[end_id]``, which would count as drafted); the draft never drafts past max_new_tokens; sampling seeds differ per
round and between draft and target (upstream reuses one seed every call, which correlates the rounds' draws).
Accepted counts are the leading run of draft tokens equal to the target's emitted tokens, exact under both
acceptance rules (a recovered token never equals the rejected draft token). ``num_draft_tokens=0`` or no draft
engine is target-only decoding: one plain target ``generate`` per batch (the speed baseline).

Not verified on a GPU: whether the executor keeps the end token in its output (trtspec keeps it when present and
stops either way) and whether it ends a verification request after one step (the stats count one target forward
per verification call).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.builders import support
from trtspec.builders import trtllm_adapter as adapter
from trtspec.core import layout
from trtspec.core.errors import CheckpointError, ModelError
from trtspec.core.metrics import AcceptanceStats
from trtspec.core.sequences import common_prefix_len
from trtspec.engines.engine import GenerationResult, StopChecker, StreamEvent, StreamingGenerator
from trtspec.engines.sampling import SamplingParams, check_num_draft_tokens, to_vocab

if TYPE_CHECKING:
    from trtspec.recipe import Recipe

# KV-cache share of free GPU memory for each executor when draft and target share a GPU (the runtime's default,
# 0.9, would leave nothing for the second one).
SHARED_GPU_KV_FRACTION = 0.4


@dataclass
class _Request:
    prompt: list[int]
    stats: AcceptanceStats
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated


@dataclass
class _Emitted:
    """One request's round: the tokens the target emitted, and the draft tokens it was given."""

    tokens: list[int]
    draft_tokens: list[int]

    @property
    def num_accepted(self) -> int:
        return common_prefix_len(self.draft_tokens, self.tokens)


class TrtllmSpeculativeRunner(StreamingGenerator):
    """A target engine and an optional draft engine (``adapter.EngineRunner``); see the module docstring."""

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
    ):
        check_pair(target.engine_dir, target.facts, draft.facts if draft else None, use_draft_logits)
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.use_draft_logits = use_draft_logits and draft is not None
        self.max_draft_len = target.max_draft_len if draft is not None else 0
        self.max_batch_size = min(r.max_batch_size for r in (target, draft) if r is not None)
        # The target engine's max_seq_len includes max_draft_len (trtllm-build adds it).
        self.max_seq_len = target.max_seq_len - target.max_draft_len
        if draft is not None:
            self.max_seq_len = min(self.max_seq_len, draft.max_seq_len)
        self.eos_ids, self.pad_id = tuple(eos_ids), pad_id

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
    ) -> TrtllmSpeculativeRunner:
        """Load the engines (configs are checked first, so a bad pair fails before any GPU work).

        Raises CheckpointError (missing / mismatched engines), NeedsTensorRTLLM (exit 3: no tensorrt_llm here).
        """
        target_facts = adapter.read_engine_config(target_engine_dir)
        draft_facts = adapter.read_engine_config(draft_engine_dir) if draft_engine_dir else None
        check_pair(Path(target_engine_dir), target_facts, draft_facts, use_draft_logits)
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
        return cls(
            target,
            draft,
            use_draft_logits=use_draft_logits,
            tokenizer=tokenizer,
            eos_ids=eos_ids,
            pad_id=pad_id,
        )

    @classmethod
    def from_recipe(
        cls, recipe: Recipe, engines_dir: str | Path = layout.ENGINES_DIR, max_batch_size: int | None = None
    ) -> TrtllmSpeculativeRunner:
        """The engines ``trtspec build`` wrote for ``recipe`` (engines_dir/<name>/{target,draft}/engine)."""
        root = layout.pair_dir(recipe.name, engines_dir)
        return cls.from_engine_dirs(
            layout.stage_dir(root, "target", layout.ENGINE),
            layout.stage_dir(root, "draft", layout.ENGINE),
            tokenizer_dir=recipe.target.model,
            use_draft_logits=recipe.speculative.use_draft_logits,
            target_device_ids=list(recipe.target.devices),
            draft_device_ids=list(recipe.draft.devices),
            max_batch_size=max_batch_size,
            trust_remote_code=recipe.target.trust_remote_code,
        )

    def close(self) -> None:
        """Shut both executors down (frees their GPU memory and worker processes)."""
        for runner in (self.draft, self.target):
            if runner is not None:
                runner.close()
        self.draft = None

    # ------------------------------------------------------------ generation

    def generate_stream(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[StreamEvent]:
        """Yield one StreamEvent per round; the last one carries the GenerationResults."""
        k = check_num_draft_tokens(params, self.max_draft_len, self.draft is not None)
        self._check_prompts(prompts, params)
        eos = self._eos_ids(params)
        stops = StopChecker(params, set(eos), self.tokenizer)
        call = self._call_options(params, eos)
        requests = [_Request(list(p), AcceptanceStats(max_draft_len=k)) for p in prompts]
        base_seed = params.seed if params.seed is not None else random.getrandbits(31)
        start, round_index = time.perf_counter(), 0
        while active := [r for r in requests if r.finish_reason is None]:
            # Distinct seeds per round and per model, so no two calls replay the same random draws.
            seeds = (base_seed + 2 * round_index, base_seed + 2 * round_index + 1)
            emitted = self._round(active, k, params, call, seeds)
            now = time.perf_counter() - start
            new_tokens = {id(r): [] for r in requests}
            for req, out in zip(active, emitted, strict=True):
                _record(req.stats, out)
                new_tokens[id(req)] = self._accept_tokens(req, out.tokens, stops, now)
            round_index += 1
            yield StreamEvent(
                [new_tokens[id(r)] for r in requests], [r.finish_reason is not None for r in requests]
            )
        results = [
            GenerationResult(r.generated, r.finish_reason, r.stats, stops.text(r.generated)) for r in requests
        ]
        yield StreamEvent([[] for _ in requests], [True] * len(requests), results)

    def _round(self, active: list[_Request], k: int, params, call: dict, seeds) -> list[_Emitted]:
        """One round for every active request: draft (k > 0), then verify; plain target steps where no draft."""
        budgets = [params.max_new_tokens - len(r.generated) for r in active]
        if k == 0:  # target-only: the whole budget in one plain call, as native TensorRT-LLM decoding
            outs = self._plain(active, max(budgets), params, call, seeds[0])
            return [_Emitted(o, []) for o in outs]
        # Never draft past max_new_tokens: the round's last token comes from the target anyway.
        drafts = self._propose(active, [min(k, b - 1) for b in budgets], params, call, seeds[1])
        emitted = [_Emitted([], d.token_ids) for d in drafts]
        verify = [i for i, d in enumerate(drafts) if d.token_ids]
        plain = [i for i, d in enumerate(drafts) if not d.token_ids]
        if verify:
            outs = self.target.generate(
                [active[i].tokens for i in verify],
                max_new_tokens=max(len(drafts[i].token_ids) for i in verify) + 1,
                sampling=_sampling(params, seeds[0]),
                draft_tokens=[drafts[i].token_ids for i in verify],
                draft_logits=self._draft_logits([drafts[i] for i in verify]),
                **call,
            )
            for i, out in zip(verify, outs, strict=True):
                emitted[i].tokens = out.token_ids
        if plain:
            outs = self._plain([active[i] for i in plain], 1, params, call, seeds[0])
            for i, tokens in zip(plain, outs, strict=True):
                emitted[i].tokens = tokens
        return emitted

    def _draft_logits(self, drafts: list[adapter.RunnerOutput]) -> list | None:
        """Each draft's logits [n, target rows]: a padded-vocabulary draft's rows are padded with -inf, as the
        target's draft-logits buffer has the target's rows (support.vocab_pair_problem)."""
        if not self.use_draft_logits:
            return None
        rows = vocab_rows(self.target.facts)
        return [to_vocab(d.logits, rows) for d in drafts]

    @property
    def input_vocab_size(self) -> int:
        return min(r.vocab_size for r in (self.target, self.draft) if r is not None)

    def _propose(
        self, active, num_draft: list[int], params, call: dict, seed: int
    ) -> list[adapter.RunnerOutput]:
        """Draft tokens per request ([] where num_draft is 0); their logits [n, V] when use_draft_logits."""
        drafts = [adapter.RunnerOutput([]) for _ in active]
        rows = [i for i, n in enumerate(num_draft) if n > 0]
        if not rows:
            return drafts
        prefixes = [support.draft_input_ids(active[i].tokens, self.draft.vocab_size) for i in rows]
        # One max_new_tokens for the batch: capped so the longest prefix still fits the draft engine.
        steps = min(max(num_draft[i] for i in rows), self.draft.max_seq_len - max(map(len, prefixes)))
        if steps <= 0:
            return drafts
        outs = self.draft.generate(
            prefixes,
            max_new_tokens=steps,
            sampling=_sampling(params, seed),
            return_logits=self.use_draft_logits,
            **call,
        )
        for i, out in zip(rows, outs, strict=True):
            n = min(num_draft[i], len(out.token_ids))
            drafts[i] = adapter.RunnerOutput(
                out.token_ids[:n], out.logits[:n] if out.logits is not None else None
            )
        return drafts

    def _plain(self, requests, max_new_tokens: int, params, call: dict, seed: int) -> list[list[int]]:
        prefixes = [r.tokens for r in requests]
        steps = min(max_new_tokens, self.target.max_seq_len - max(map(len, prefixes)))
        outs = self.target.generate(prefixes, max_new_tokens=steps, sampling=_sampling(params, seed), **call)
        return [o.token_ids for o in outs]

    def _accept_tokens(self, req: _Request, tokens: list[int], stops: StopChecker, now: float) -> list[int]:
        kept = super()._accept_tokens(req, tokens, stops, now)
        if not tokens and req.finish_reason is None:
            req.finish_reason = "stop"  # no tokens at all: no progress (upstream's "no change" stop)
        return kept

    # ------------------------------------------------------------ requests and stops

    def _eos_ids(self, params: SamplingParams) -> tuple[int, ...]:
        if params.ignore_eos:
            return ()
        return tuple(params.stop_token_ids) if params.stop_token_ids is not None else self.eos_ids

    def _call_options(self, params: SamplingParams, eos: tuple[int, ...]) -> dict:
        """end_id / pad_id / stop words of every generate call: the first stop id ends, the others are stop words.

        end_id -1 (no stop token) never matches a token.
        """
        end_id = eos[0] if eos else -1
        pad_id = self.pad_id if self.pad_id is not None else max(end_id, 0)
        stop_words = [[t] for t in eos[1:]] or None
        return {"end_id": end_id, "pad_id": pad_id, "stop_words": stop_words}


def _sampling(params: SamplingParams, seed: int) -> dict:
    return adapter.sampling_kwargs(
        params.temperature, params.top_k, params.top_p, None if params.greedy else seed
    )


def _record(stats: AcceptanceStats, out: _Emitted) -> None:
    """A verification call is one target forward; a plain call is one per emitted token."""
    if out.draft_tokens:
        stats.record_round(len(out.draft_tokens), out.num_accepted)
    else:
        for _ in range(max(len(out.tokens), 1)):
            stats.record_round(0, 0)


def vocab_rows(facts: dict) -> int:
    """Logit rows of an engine (read_engine_config facts): vocab_size padded to its tp_size."""
    return support.vocab_rows(facts["vocab_size"], "tensorrtllm", facts["tp_size"] or 1, "none")


def check_pair(target_dir: Path, target: dict, draft: dict | None, use_draft_logits: bool) -> None:
    """Engine-config checks of a draft-target pair (CheckpointError, one line), before any engine is loaded."""
    if draft is None:
        return
    if target["speculative_decoding_mode"] != "draft_tokens_external" or target["max_draft_len"] < 1:
        raise CheckpointError(
            f"{target_dir}: the target engine was built without draft support (speculative_decoding_mode "
            f"{target['speculative_decoding_mode']!r}, max_draft_len {target['max_draft_len']}); rebuild it with "
            "`trtspec build` (--speculative_decoding_mode draft_tokens_external --max_draft_len K)"
        )
    problem = support.vocab_pair_problem(
        vocab_rows(target), vocab_rows(draft), "tensorrtllm", use_draft_logits, fast_logits=False
    )
    if problem is not None:
        raise ModelError(f"{target_dir}: engines: {problem}")
    if use_draft_logits and not (draft["gather_generation_logits"] and target["gather_generation_logits"]):
        # Without gathered logits the runtime hangs (TensorRT-LLM issue 2798): refuse up front.
        raise CheckpointError(
            f"{target_dir}: use_draft_logits needs both engines built with --gather_generation_logits; "
            "rebuild with `trtspec build` or set speculative.use_draft_logits: false"
        )


def _tokenizer_facts(tokenizer_dir, trust_remote_code: bool) -> tuple[Any, tuple[int, ...], int | None]:
    """(tokenizer or None, EOS ids: generation_config's else the tokenizer's, pad id) of the target's HF dir."""
    if tokenizer_dir is None:
        return None, (), None
    from transformers import AutoTokenizer

    from trtspec.core.model_dir import end_ids

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError):
        tokenizer = None
    pad_id = tokenizer.pad_token_id if tokenizer is not None else None
    return tokenizer, end_ids(tokenizer_dir, tokenizer), pad_id
