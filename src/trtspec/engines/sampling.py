"""Sampling parameters, logits -> probabilities, and the verification rules (pure tensor functions).

Glossary (as vLLM's rejection sampler): for each sequence the draft proposed K *draft tokens*; the target scored
them in one forward, giving K+1 target distributions (one before each draft token, one after the last). The
leading draft tokens that pass verification are *accepted*; at the first rejected position the target's
*recovered* token replaces the draft token; if all K are accepted the target's extra distribution gives a
*bonus* token. Either way a round emits accepted + 1 tokens.

Two verification rules, both exact (outputs follow the target's distribution):

- ``match_accept`` (greedy, or sampling without draft probabilities, as TensorRT-LLM without use_draft_logits):
  draw the target's own token at every position (argmax when greedy); accept while it equals the draft token.
- ``rejection_sample`` (with draft probabilities): accept draft token x with probability
  min(1, target_probs[x] / draft_probs[x]); at the first rejection sample the recovered token from the normalised
  positive part of target_probs - draft_probs (Leviathan et al. 2023; Chen et al. 2023).

A deterministic proposal (prompt lookup, core/lookup.py) is a point mass: draft_probs[x] = 1. Rejection sampling
then accepts x with probability target_probs[x], and on rejection samples from target_probs - onehot(x)'s positive
part: the target's distribution with x removed, renormalised. So token y comes out with probability
p(x) [y = x] + (1 - p(x)) p(y) / (1 - p(x)) [y != x] = p(y): the target's distribution, for any choice of x,
which is why a proposer needs no distribution of its own to stay exact. ``match_accept`` is the same rule
(draw y from the target; accept x iff y = x; on rejection y is already a draw from p without x), so a runtime that
accepts by token match (TensorRT-LLM without draft logits) is exact for looked-up tokens too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from trtspec.core.errors import RequestError
from trtspec.core.lookup import PROPOSERS


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings, the one type every entry point builds (the CLI, validate, and the Triton
    models' request parsing); its checks are the only range checks of these settings.

    temperature 0 or top_k 1 = greedy (TensorRT-LLM's greedy is top_k 1). num_draft_tokens None = adaptive K up
    to the engine's max_draft_len (engines/adaptive.py); 0 = target-only decoding.
    stop_token_ids None = the target's EOS ids (generation_config); ignore_eos drops every stop id, a request's
    own stop_token_ids too (vLLM keeps those): it ends at max_new_tokens or a stop string or token sequence.
    stop_strings need a tokenizer (the engine's). seed None = nondeterministic. proposer None = the engine's
    (core/lookup.py PROPOSERS: draft, ngram, draft+ngram).
    """

    max_new_tokens: int = 64
    num_draft_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    proposer: str | None = None

    def __post_init__(self) -> None:
        checks = [
            (
                self.proposer is None or self.proposer in PROPOSERS,
                "proposer",
                self.proposer,
                f"must be one of {', '.join(PROPOSERS)}",
            ),
            (self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be >= 1"),
            (
                self.num_draft_tokens is None or self.num_draft_tokens >= 0,
                "num_draft_tokens",
                self.num_draft_tokens,
                "must be >= 0",
            ),
            (
                math.isfinite(self.temperature) and self.temperature >= 0,
                "temperature",
                self.temperature,
                "must be a finite number >= 0 (0 = greedy)",
            ),
            (self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 = off)"),
            (0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed", self.seed, "must be in [0, 2**64)"),
        ]
        for ok, name, value, rule in checks:
            if not ok:
                raise RequestError(f"{name} {rule}, got {value!r}")

    @property
    def greedy(self) -> bool:
        # top_k 1 keeps only the argmax whatever the temperature: the same tokens as greedy, with no draws
        return self.temperature == 0 or self.top_k == 1

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: its tokens must not depend on other requests (nor on timing), so neither may the
        random draws it consumes."""
        return self.seed is not None and not self.greedy

    def with_(self, **changes) -> SamplingParams:
        return replace(self, **changes)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k, top-p (HF warper order).

    Greedy requests get a one-hot of the argmax, so every rule below also works for them.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # Shifted so the largest is 0 first: a tiny temperature (1e-38) then gives -inf elsewhere, not inf - inf = nan.
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1)  # ascending, as HF TopPLogitsWarper
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative <= 1 - params.top_p
        drop_sorted[..., -1] = False  # keep at least the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def to_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., V_draft] draft logits -> [..., vocab_size] over the target's rows.

    A padded-vocabulary pair (one tokenizer, e.g. 151936 draft rows and 152064 target rows) differs only in rows
    no text produces. Rows the draft lacks get -inf (draft probability 0: it never proposes them, and rejection
    sampling's residual gives them their full target probability); draft rows the target lacks are cut, so the
    draft never proposes a token the target cannot score. Proposing from, and accepting with, these logits keeps
    the output distribution the target's.
    """
    extra = vocab_size - logits.shape[-1]
    if extra == 0:
        return logits
    if extra < 0:
        return logits[..., :vocab_size]
    return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] logits -> [B] tokens (argmax when greedy)."""
    if params.greedy:
        return logits.argmax(-1)
    return sample_probs(logits_to_probs(logits, params), generator)


def sample_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] probabilities -> [B] sampled tokens."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _leading_accepted(accepted: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """[B, K] bool per position -> [B] length of the accepted prefix, capped at each row's num_draft."""
    k = accepted.shape[1]
    in_range = torch.arange(k, device=accepted.device)[None, :] < num_draft[:, None]
    return (accepted & in_range).int().cumprod(dim=1).sum(dim=1)


def match_accept(
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-match verification.

    draft_tokens [B, K] int64; num_draft [B] (row b drafted num_draft[b] <= K tokens);
    target_logits [B, K+1, V]. Returns num_accepted [B] and next_token [B] (recovered or bonus).
    """
    batch, k1, vocab = target_logits.shape
    target_tokens = sample(target_logits.reshape(batch * k1, vocab), params, generator).view(
        batch, k1
    )  # [B, K+1]
    num_accepted = _leading_accepted(draft_tokens == target_tokens[:, :-1], num_draft)  # [B]
    next_token = target_tokens.gather(1, num_accepted[:, None].long()).squeeze(1)  # [B]
    return num_accepted, next_token


def rejection_sample(
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard rejection sampling.

    draft_tokens [B, K] int64; num_draft [B]; draft_probs [B, K, V] (the distributions the draft tokens were
    sampled from); target_probs [B, K+1, V]. Returns num_accepted [B] and next_token [B].
    """
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    index = draft_tokens[..., None]
    target_token_probs = target_probs[:, :k].gather(-1, index).squeeze(-1)  # [B, K]
    draft_token_probs = draft_probs.gather(-1, index).squeeze(-1)  # [B, K]
    uniform = uniform_like(draft_token_probs, generator)  # [B, K]
    # u < min(1, target/draft)  <=>  u * draft < target  (no division; the draft never proposes a 0-prob token)
    num_accepted = _leading_accepted(uniform * draft_token_probs < target_token_probs, num_draft)  # [B]
    at = num_accepted.long()
    next_target_probs = target_probs[rows, at]  # [B, V]
    rejected = at < num_draft  # [B]: recovered token, else bonus token
    next_draft_probs = (
        draft_probs[rows, at.clamp(max=max(k - 1, 0))] if k else torch.zeros_like(next_target_probs)
    )
    next_draft_probs = next_draft_probs * rejected[:, None]  # [B, V]; zero for bonus rows
    next_token = torch.multinomial(
        recovered_probs(next_target_probs, next_draft_probs), 1, generator=generator
    )
    return num_accepted, next_token.squeeze(1)


def uniform_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """U[0, 1) draws shaped like x (its own function so tests can plant a broken acceptance rule)."""
    return torch.rand(x.shape, generator=generator, device=x.device)


def recovered_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """[B, V] the normalised positive part of target_probs - draft_probs (draft_probs = 0 gives the bonus
    distribution). Unnormalised: torch.multinomial normalises."""
    residual = (target_probs - draft_probs).clamp(min=0)
    # A zero residual only happens through rounding (target == draft there); fall back to the target.
    empty = residual.sum(-1, keepdim=True) <= 0
    return torch.where(empty, target_probs, residual)


def check_num_draft_tokens(params: SamplingParams, max_draft_len: int, has_draft: bool) -> int:
    """The request's K (adaptive requests: the largest), or a RequestError naming the engine limit (the TensorRT-LLM
    contract)."""
    k = max_draft_len if params.num_draft_tokens is None else params.num_draft_tokens
    if k > max_draft_len:
        raise RequestError(
            f"num_draft_tokens={k} is larger than the engine's max_draft_len={max_draft_len}; "
            f"ask for at most {max_draft_len} or load the engine with a larger max_draft_len"
        )
    return k if has_draft else 0
