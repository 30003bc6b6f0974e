"""The stand-in engine: one KV model behind the calls TensorRT-LLM's engine models answer (the test harness).

The tensorrtllm runtime's orchestrator calls two engine models, the draft and the target (input_ids ->
output_ids, draft_input_ids, draft_logits, request_output_len). Without TensorRT-LLM, ``StepModel`` answers those
calls: it wraps ONE KV model with a pool of cached sequences and offers the three calls the orchestrator makes,
as thin wrappers over engines/speculative.py (``propose`` / ``verify`` / ``commit``, the rounds under test):

    draft = StepModel.from_pretrained(draft_dir, device="cpu", dtype="float32", num_slots=8, max_seq_len=2048,
                                      max_draft_len=8)
    target = StepModel.from_pretrained(target_dir, ...)
    (d,) = draft.draft([StepRequest(input_ids, num_tokens=k, params=params)])
        # d.tokens: k draft token ids; d.logits: [k, V] float32 raw draft logits (TensorRT-LLM draft_logits)
    (v,) = target.verify([StepRequest(input_ids, draft_ids=d.tokens, draft_logits=d.logits, params=params)])
        # v.tokens: accepted draft tokens + 1 recovered/bonus token; v.num_accepted
    (c,) = target.continue_([StepRequest(input_ids, num_tokens=n, params=params, end_ids=(eos,))])  # target-only
        # c.tokens: up to n tokens (stops after any of end_ids)

KV reuse (like TensorRT-LLM's enable_kv_cache_reuse): each slot remembers the tokens its cache holds; a request
takes the slot that holds its own sequence (``SlotPool.acquire``), else the least recently used one with a prefix
another slot shares copied in, and only the rest is computed; a rolled-back tail is simply overwritten.
Consecutive calls for one growing sequence therefore cost one forward of the new tokens. A list of requests runs
as one batch (grouped by temperature/top_k/top_p, which a batched sampling step shares). Without draft_logits,
verification uses the token-match rule (TensorRT-LLM without use_draft_logits), which is exact for greedy and
sampling alike. Seeds: each call seeds from (seed, len(input_ids)), so a seeded request is reproducible and rounds
stay independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtspec.core.errors import RequestError
from trtspec.core.sequences import common_prefix_len
from trtspec.engines.models import load_causal_lm
from trtspec.engines.rounds import Row
from trtspec.engines.sampling import SamplingParams, check_num_draft_tokens, logits_to_probs
from trtspec.engines.speculative import commit, propose, verify


@dataclass
class StepRequest:
    """input_ids: the whole sequence so far (prompt + generated). num_tokens: k to draft / n to continue.
    draft_ids / draft_logits ([k, V], raw): the draft's proposal, for verify."""

    input_ids: list[int]
    num_tokens: int = 1
    params: SamplingParams = field(default_factory=SamplingParams)
    draft_ids: list[int] = field(default_factory=list)
    draft_logits: torch.Tensor | None = None
    end_ids: tuple[int, ...] = ()


@dataclass
class StepResult:
    tokens: list[int]
    num_accepted: int = 0
    logits: torch.Tensor | None = None  # draft(): [k, V] float32


class SlotPool:
    """Which tokens each cache slot holds, and which slot a request takes (see ``acquire``)."""

    def __init__(self, num_slots: int, max_draft_len: int = 8):
        self.cached: list[list[int]] = [[] for _ in range(num_slots)]
        self.inputs = [0] * num_slots  # the length of the last request's input_ids in each slot
        self.last_used = [0] * num_slots
        self.clock = 0
        # A draft-ahead's input ends in up to max_draft_len unconfirmed draft tokens (+1: the bonus): the next call
        # of that sequence may drop them.
        self.rollback = max_draft_len + 1

    def acquire(self, tokens: list[int], taken: set[int]) -> tuple[int, int, int | None]:
        """(slot, reusable length, source) for a sequence; at least one token is left to compute (its logits are
        needed). ``source`` is None, or the slot whose first ``reusable length`` positions the caller copies into
        ``slot`` before computing the rest.

        Requests carry no id, so a sequence is recognised by its tokens: it only grows, so its next call contains
        the previous call's input (up to a rejected draft-ahead), and such a slot is its own; of those, the one
        with the longest common prefix is taken. Otherwise the least recently used slot (a never-used one first) is
        taken, never the slot of another sequence that merely shares a prefix with this one (a BOS, a system
        prompt, the same prompt again): that sequence may still be live, and taking its slot would make every
        concurrent sequence recompute its whole prefix on every call. The shared prefix is copied instead.
        """
        free = [s for s in range(len(self.cached)) if s not in taken]
        if not free:
            raise RequestError(f"batch larger than the {len(self.cached)} cache slots; raise num_slots")
        shared = [common_prefix_len(cached, tokens) for cached in self.cached]
        own = [s for s in free if shared[s] and shared[s] >= self.inputs[s] - self.rollback]
        source = None
        if own:
            best = max(own, key=lambda s: (shared[s], -self.last_used[s]))
        else:
            best = min(free, key=lambda s: self.last_used[s])
            donor = max(free, key=lambda s: shared[s])  # not a slot this batch already changed
            if shared[donor] > shared[best]:
                source = donor
        reuse = min(shared[best if source is None else source], len(tokens) - 1)
        self.clock += 1
        self.last_used[best] = self.clock
        self.inputs[best] = len(tokens)
        # All the slot surely holds until ``record``: a failed call may have written part of it, and a slot that is
        # to get a copy holds nothing trustworthy until the caller has copied (then it records tokens[:reuse]).
        self.cached[best] = tokens[:reuse] if source is None else []
        return best, reuse, source

    def record(self, slot: int, tokens: list[int]) -> None:
        self.cached[slot] = list(tokens)


class StepModel:
    """One KV model + a SlotPool; see the module docstring."""

    def __init__(self, model, *, max_draft_len: int = 8):
        self.model, self.max_draft_len = model, max_draft_len
        self.pool = SlotPool(model.num_slots, max_draft_len)

    @classmethod
    def from_pretrained(
        cls,
        model_dir: Path | str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        num_slots: int = 8,
        max_seq_len: int = 2048,
        max_draft_len: int = 8,
        trust_remote_code: bool = False,
    ) -> StepModel:
        model = load_causal_lm(
            model_dir,
            device=device,
            dtype=dtype,
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            trust_remote_code=trust_remote_code,
        )
        return cls(model, max_draft_len=max_draft_len)

    def draft(self, requests: list[StepRequest]) -> list[StepResult]:
        """(a) Continue each sequence by num_tokens draft tokens; returns the tokens and raw draft logits."""
        results: dict[int, StepResult] = {}
        for group, params in _groups(requests):
            reqs = [r for _, r in group]
            num = [
                check_num_draft_tokens(
                    r.params.with_(num_draft_tokens=r.num_tokens), self.max_draft_len, True
                )
                for r in reqs
            ]
            rows = self._rows(reqs, "draft_len")
            tokens, logits, _ = propose(self.model, rows, num, params, _generator(group, self.model.device))
            for (i, _), row, k, toks, lg in zip(group, rows, num, tokens.tolist(), logits, strict=True):
                self.pool.record(row.slot, (row.tokens + toks)[: row.draft_len])
                results[i] = StepResult(toks[:k], logits=lg[:k].float().cpu())
        return [results[i] for i in range(len(requests))]

    def verify(self, requests: list[StepRequest]) -> list[StepResult]:
        """(b) One verification forward per sequence: accepted draft tokens + the recovered/bonus token."""
        results: dict[int, StepResult] = {}
        for group, params in _groups(requests):
            reqs = [r for _, r in group]
            num = [len(r.draft_ids) for r in reqs]
            for r in reqs:
                check_num_draft_tokens(
                    r.params.with_(num_draft_tokens=len(r.draft_ids)), self.max_draft_len, True
                )
            width = max(num)
            draft_tokens = torch.tensor(
                [r.draft_ids + [0] * (width - len(r.draft_ids)) for r in reqs],
                dtype=torch.long,
                device=self.model.device,
            )  # [B, K]
            draft_probs = _draft_probs(reqs, width, params, self.model.device, self.model.vocab_size)
            rows = self._rows(reqs, "target_len")
            num_accepted, next_token = verify(
                self.model, rows, draft_tokens, num, draft_probs, params, _generator(group, self.model.device)
            )
            emitted = commit(rows, draft_tokens, num_accepted, next_token)
            for (i, _), row, new, n in zip(group, rows, emitted, num_accepted, strict=True):
                self.pool.record(row.slot, row.tokens[: row.target_len])
                results[i] = StepResult(new, num_accepted=n)
        return [results[i] for i in range(len(requests))]

    def continue_(self, requests: list[StepRequest]) -> list[StepResult]:
        """(c) Target-only continuation by num_tokens tokens (stopping after any of end_ids): 0-draft verifications."""
        out = [[] for _ in requests]
        live = list(range(len(requests)))
        for step in range(max(r.num_tokens for r in requests)):
            live = [
                i
                for i in live
                if step < requests[i].num_tokens and not set(requests[i].end_ids) & set(out[i][-1:])
            ]
            if not live:
                break
            batch = [StepRequest(requests[i].input_ids + out[i], params=requests[i].params) for i in live]
            for i, result in zip(live, self.verify(batch), strict=True):
                out[i] += result.tokens
        return [StepResult(tokens) for tokens in out]

    def _rows(self, requests: list[StepRequest], length_field: str) -> list[Row]:
        taken: set[int] = set()
        rows = []
        for r in requests:
            if len(r.input_ids) + r.num_tokens + len(r.draft_ids) + 1 > self.model.max_seq_len:
                raise RequestError(
                    f"sequence of {len(r.input_ids)} tokens would exceed max_seq_len "
                    f"{self.model.max_seq_len}; raise max_seq_len"
                )
            slot, reuse, source = self.pool.acquire(r.input_ids, taken)
            if source is not None:
                self.model.copy_prefix(source, slot, reuse)
                self.pool.record(slot, r.input_ids[:reuse])
            taken.add(slot)
            rows.append(Row(list(r.input_ids), slot, **{length_field: reuse}))
        return rows


def _groups(requests: list[StepRequest]):
    """[(i, request)] groups sharing the sampling settings a batched sampling step needs."""
    groups: dict[tuple, list] = {}
    for i, r in enumerate(requests):
        if not r.input_ids:
            raise RequestError(f"request {i} has empty input_ids")
        groups.setdefault((r.params.temperature, r.params.top_k, r.params.top_p), []).append((i, r))
    return [(group, group[0][1].params) for group in groups.values()]


def _draft_probs(requests: list[StepRequest], width: int, params: SamplingParams, device, vocab_size: int):
    """[B, K, V] draft probabilities from the requests' raw draft logits [k, V], or None (token-match rule)."""
    if params.greedy or any(r.draft_logits is None for r in requests) or width == 0:
        return None
    probs = []
    for r in requests:
        logits = torch.as_tensor(r.draft_logits, dtype=torch.float32, device=device)
        if logits.shape[0] != len(r.draft_ids):
            raise RequestError(f"draft_logits has {logits.shape[0]} rows for {len(r.draft_ids)} draft tokens")
        if logits.shape[1] != vocab_size:
            # TensorRT-LLM copies them into a buffer of the target's rows and refuses another size.
            raise RequestError(
                f"draft_logits has {logits.shape[1]} columns; the target has {vocab_size} vocab rows (pad a "
                "padded-vocabulary draft's logits with -inf)"
            )
        padded = torch.cat([logits, logits.new_zeros(width - logits.shape[0], logits.shape[1])])
        probs.append(logits_to_probs(padded, params))
    return torch.stack(probs)


def _generator(group, device) -> torch.Generator | None:
    seeds = [(r.params.seed, len(r.input_ids)) for _, r in group if r.params.seed is not None]
    if not seeds:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(hash(tuple(seeds)) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator
