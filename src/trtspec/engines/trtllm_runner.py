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
num_draft_tokens), and this module supplies the round only (``TrtllmRounds``).

The round mirrors upstream's draft-target runner, ``run_dtm_pld`` in NVIDIA/TensorRT-LLM
examples/prompt_lookup/run_dtm_pld.py (what ``examples/run.py --draft_target_model_config`` calls), over
``ModelRunnerCpp.generate`` (tensorrt_llm/runtime/model_runner_cpp.py; see builders/trtllm_adapter.py):

1. the draft engine generates the loop's K tokens for every row that drafts (its generation logits too when
   use_draft_logits);
2. the target engine verifies them: ``generate(prefix, draft_tokens_list=..., [draft_logits_list=...],
   max_new_tokens=K+1)`` returns the accepted draft tokens plus one target token (recovered or bonus).

Differences from upstream, each for a reason: a row with no room left for a draft token (its last token), whose
draft ended at once or whose adaptive K is 0 gets a plain target step instead of a placeholder draft token
(upstream sends ``[end_id]``, which would count as drafted); sampling seeds differ per round and between draft and
target (upstream reuses one seed every call, which correlates the rounds' draws). Accepted counts are the leading
run of draft tokens equal to the target's emitted tokens, exact under both acceptance rules (a recovered token
never equals the rejected draft token). ``num_draft_tokens=0`` or no draft engine is target-only decoding: one
plain target ``generate`` per batch (the speed baseline). The end token is kept as the last token (the HF
convention of this API; engines/loop.py StopChecker).

Not verified on a GPU: whether the executor keeps the end token in its output (trtspec keeps it when present and
stops either way) and whether it ends a verification request after one step (the stats count one target forward
per verification call).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtspec.builders import support
from trtspec.builders import trtllm_adapter as adapter
from trtspec.core import layout
from trtspec.core.errors import CheckpointError, ModelError
from trtspec.core.sequences import common_prefix_len
from trtspec.engines.adaptive import AdaptiveState, KPolicy, policy_for
from trtspec.engines.engine import StreamingGenerator
from trtspec.engines.loop import GenerationLoop
from trtspec.engines.rounds import Outcome, Row
from trtspec.engines.sampling import SamplingParams, to_vocab

if TYPE_CHECKING:
    from trtspec.recipe import Recipe

# KV-cache share of free GPU memory for each executor when draft and target share a GPU (the runtime's default,
# 0.9, would leave nothing for the second one).
SHARED_GPU_KV_FRACTION = 0.4


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
        k_policy: KPolicy = KPolicy(),
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
            k_policy=k_policy,
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
            k_policy=policy_for(recipe.speculative),
        )

    def close(self) -> None:
        """Shut both executors down (frees their GPU memory and worker processes)."""
        for runner in (self.draft, self.target):
            if runner is not None:
                runner.close()
        self.draft = None

    # ------------------------------------------------------------ generation

    def new_loop(self, *, first_token_alone: bool = False) -> GenerationLoop:
        """A GenerationLoop over these engines (max_batch_size requests in flight)."""
        rounds = TrtllmRounds(
            self.target,
            self.draft,
            use_draft_logits=self.use_draft_logits,
            num_slots=self.max_batch_size,
            vocab_size=self.input_vocab_size,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
        )
        return GenerationLoop(
            rounds,
            max_seq_len=self.max_seq_len,
            tokenizer=self.tokenizer,
            first_token_alone=first_token_alone,
            seq_hint=self.seq_hint,
            k_policy=self.k_policy,
            adaptive=self.adaptive,
        )

    @property
    def input_vocab_size(self) -> int:
        return min(r.vocab_size for r in (self.target, self.draft) if r is not None)

    def _eos_ids(self, params: SamplingParams) -> set[int]:
        return set(eos_ids_for(params, self.eos_ids))


def eos_ids_for(params: SamplingParams, default: tuple[int, ...]) -> tuple[int, ...]:
    """A request's stop ids: none with ignore_eos, its stop_token_ids when given, else the tokenizer's EOS ids."""
    if params.ignore_eos:
        return ()
    return tuple(params.stop_token_ids) if params.stop_token_ids is not None else default


class TrtllmRounds:
    """The round over two ``adapter.EngineRunner`` (engines/rounds.py ``Rounds``); see the module docstring. The
    engines keep no per-row state (each call resubmits the prefix; KV-cache block reuse keeps that cheap)."""

    device = "cpu"  # sampled requests' generators only draw the calls' seeds

    def __init__(
        self,
        target: adapter.EngineRunner,
        draft: adapter.EngineRunner | None,
        *,
        use_draft_logits: bool,
        num_slots: int,
        vocab_size: int,
        eos_ids: tuple[int, ...] = (),
        pad_id: int | None = None,
    ):
        self.target, self.draft, self.use_draft_logits = target, draft, use_draft_logits
        self.num_slots, self.vocab_size = num_slots, vocab_size
        self.max_draft_len = target.max_draft_len if draft is not None else 0
        self.eos_ids, self.pad_id = eos_ids, pad_id

    def release(self, slot: int) -> None:
        """Nothing to drop: the engines hold no state of a row between calls."""

    def run(self, rows: list[Row], num_draft: list[int], params: SamplingParams, generator) -> list[Outcome]:
        """Draft (where num_draft > 0), then verify; plain target steps where there is no draft. A request pinned
        to target-only decoding gets its whole budget in one plain call, as native TensorRT-LLM decoding (the
        speed baseline). Rows of one call share its sampling settings, end_id and stop words (``params``)."""
        target_seed, draft_seed = _seeds(params, generator)
        call = self._call_options(eos_ids_for(params, self.eos_ids))
        if self.draft is None or params.num_draft_tokens == 0:
            budgets = [row.max_len - len(row.tokens) for row in rows]
            outs = self._plain(rows, max(budgets), params, call, target_seed)
            return [
                _commit(row, tokens[:b], [], 0) for row, tokens, b in zip(rows, outs, budgets, strict=True)
            ]
        drafts = self._propose(rows, num_draft, params, call, draft_seed)
        verify = [i for i, d in enumerate(drafts) if d.token_ids]
        plain = [i for i, d in enumerate(drafts) if not d.token_ids]
        emitted: list[list[int]] = [[] for _ in rows]
        if verify:
            outs = self.target.generate(
                [rows[i].tokens for i in verify],
                max_new_tokens=max(len(drafts[i].token_ids) for i in verify) + 1,
                sampling=_sampling(params, target_seed),
                draft_tokens=[drafts[i].token_ids for i in verify],
                draft_logits=self._draft_logits([drafts[i] for i in verify]),
                **call,
            )
            for i, out in zip(verify, outs, strict=True):
                emitted[i] = out.token_ids
        if plain:
            outs = self._plain([rows[i] for i in plain], 1, params, call, target_seed)
            for i, tokens in zip(plain, outs, strict=True):
                emitted[i] = tokens
        return [
            _commit(row, tokens, d.token_ids, common_prefix_len(d.token_ids, tokens))
            for row, tokens, d in zip(rows, emitted, drafts, strict=True)
        ]

    def _call_options(self, eos: tuple[int, ...]) -> dict:
        """end_id / pad_id / stop words of every generate call: the first stop id ends, the others are stop words.

        end_id -1 (no stop token) never matches a token.
        """
        end_id = eos[0] if eos else -1
        pad_id = self.pad_id if self.pad_id is not None else max(end_id, 0)
        stop_words = [[t] for t in eos[1:]] or None
        return {"end_id": end_id, "pad_id": pad_id, "stop_words": stop_words}

    def _draft_logits(self, drafts: list[adapter.RunnerOutput]) -> list | None:
        """Each draft's logits [n, target rows]: a padded-vocabulary draft's rows are padded with -inf, as the
        target's draft-logits buffer has the target's rows (support.vocab_pair_problem)."""
        if not self.use_draft_logits:
            return None
        rows = vocab_rows(self.target.facts)
        return [to_vocab(d.logits, rows) for d in drafts]

    def _propose(
        self, rows: list[Row], num_draft: list[int], params, call: dict, seed: int | None
    ) -> list[adapter.RunnerOutput]:
        """Draft tokens per row ([] where num_draft is 0); their logits [n, V] when use_draft_logits."""
        drafts = [adapter.RunnerOutput([]) for _ in rows]
        asked = [i for i, n in enumerate(num_draft) if n > 0]
        if not asked:
            return drafts
        prefixes = [support.draft_input_ids(rows[i].tokens, self.draft.vocab_size) for i in asked]
        # One max_new_tokens for the batch: capped so the longest prefix still fits the draft engine.
        steps = min(max(num_draft[i] for i in asked), self.draft.max_seq_len - max(map(len, prefixes)))
        if steps <= 0:
            return drafts
        outs = self.draft.generate(
            prefixes,
            max_new_tokens=steps,
            sampling=_sampling(params, seed),
            return_logits=self.use_draft_logits,
            **call,
        )
        for i, out in zip(asked, outs, strict=True):
            n = min(num_draft[i], len(out.token_ids))
            drafts[i] = adapter.RunnerOutput(
                out.token_ids[:n], out.logits[:n] if out.logits is not None else None
            )
        return drafts

    def _plain(self, rows: list[Row], max_new_tokens: int, params, call: dict, seed) -> list[list[int]]:
        prefixes = [row.tokens for row in rows]
        steps = min(max_new_tokens, self.target.max_seq_len - max(map(len, prefixes)))
        outs = self.target.generate(prefixes, max_new_tokens=steps, sampling=_sampling(params, seed), **call)
        return [o.token_ids for o in outs]


def _commit(row: Row, tokens: list[int], draft_tokens: list[int], num_accepted: int) -> Outcome:
    """The row's round: only the accepted draft tokens and the one target token after them are verified output
    (anything a verification call returns beyond that is not part of this round)."""
    if draft_tokens:
        tokens = tokens[: num_accepted + 1]
    row.tokens += tokens
    return Outcome(tokens, len(draft_tokens), num_accepted)


def _seeds(params: SamplingParams, generator) -> tuple[int | None, int | None]:
    """(target, draft) seeds of one round, drawn from the request's generator: distinct per round and per model,
    so no two calls replay the same random draws, and reproducible for a seeded request. None when greedy."""
    if params.greedy or generator is None:
        return None, None
    target, draft = torch.randint(0, 2**31 - 1, (2,), generator=generator).tolist()
    return target, draft


def _sampling(params: SamplingParams, seed: int | None) -> dict:
    return adapter.sampling_kwargs(params.temperature, params.top_k, params.top_p, seed)


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
