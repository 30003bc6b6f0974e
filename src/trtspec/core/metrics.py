"""Acceptance metrics of draft-target speculative decoding: the one definition every part of trtspec uses.

Glossary (per request, over all its verification rounds):

- drafted: draft tokens proposed to the target (sum of the rounds' num_draft_tokens).
- accepted: draft tokens the target accepted (the leading run that passed verification).
- bonus tokens: rounds in which every draft token was accepted, so the target's extra (K+1-th) token came free.
  A round that rejects a draft token instead emits a *recovered* token; every round emits accepted + 1 tokens.
- acceptance rate = accepted / drafted.
- mean accepted length = accepted / speculative rounds (draft tokens accepted per round, bonus excluded);
  tokens per round = mean accepted length + 1 in steady state.
- accepted-length histogram: ``histogram[n]`` = rounds that accepted exactly n draft tokens, n = 0..max_draft_len.
- K histogram: ``num_draft_histogram[k]`` = target forwards (rounds, target-only ones included) that verified
  exactly k draft tokens; mean K = drafted / target forwards (adaptive K changes it round by round).
- target / draft forward passes: forwards of each model that included this request (a batched forward counts once
  for each request in the batch).
- tokens/s = generated tokens / wall time; time to first token = seconds from the request to its first token.
- by proposer (core/lookup.py): ``by_proposer[name]`` = [rounds, drafted, accepted] of the rounds whose draft
  tokens that proposer gave (``draft``: the draft model; ``ngram``: prompt lookup, which runs no draft forward).

The same counters under vLLM's spec-decode metric names (``SpecDecodeCounts``, vLLM v1's
vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _num_accepted_tokens_per_pos), so
dashboards and PromQL written for vLLM carry over: num_drafts = rounds, num_draft_tokens = drafted,
num_accepted_tokens = accepted, num_accepted_tokens_per_pos[i] = rounds whose draft token at 0-based position i
was accepted; trtspec adds num_rounds_without_speculation (target forwards that verified no draft token: a
request's prefill-only first round, K=0 requests).

The analytic bound (Leviathan et al. 2023, in target-forward units): a round costs
``K * draft_cost_ratio + verify_cost_ratio`` target decoding steps (draft_cost_ratio = one draft step / one target
step, verify_cost_ratio = one (K+1)-token target forward / one target step) and emits ``tokens_per_round`` tokens,
while target-only decoding emits one token per target step. So the best speedup over target-only decoding is
``tokens_per_round / round_cost``; benchmarks report the achieved speedup as a fraction of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class AcceptanceStats:
    """Counters of one request (or, after ``merge``, of many). Times are seconds."""

    max_draft_len: int = 0
    drafted: int = 0
    accepted: int = 0
    bonus_tokens: int = 0
    rounds: int = 0  # verification rounds with at least one draft token
    target_forwards: int = 0
    draft_forwards: int = 0
    generated_tokens: int = 0
    accepted_length_histogram: list[int] = field(default_factory=list)
    num_draft_histogram: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    time_to_first_token_s: float | None = None
    by_proposer: dict[str, list[int]] = field(default_factory=dict)  # name -> [rounds, drafted, accepted]
    # A server's per-request totals (drafted, accepted): its rounds, forwards and histograms were not seen, so
    # their zeros above mean unknown, not none (validate.triton_system).
    totals_only: bool = False

    def __post_init__(self) -> None:
        if len(self.accepted_length_histogram) < self.max_draft_len + 1:
            pad = self.max_draft_len + 1 - len(self.accepted_length_histogram)
            self.accepted_length_histogram = list(self.accepted_length_histogram) + [0] * pad

    def record_round(self, num_draft: int, num_accepted: int, proposer: str = "draft") -> None:
        """One verification of ``num_draft`` draft tokens (from ``proposer``) that accepted ``num_accepted``."""
        self.target_forwards += 1
        self.draft_forwards += num_draft if proposer == "draft" else 0
        _count(self.num_draft_histogram, num_draft)
        if num_draft == 0:
            return
        cell = self.by_proposer.setdefault(proposer, [0, 0, 0])
        cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + num_draft, cell[2] + num_accepted
        self.rounds += 1
        self.drafted += num_draft
        self.accepted += num_accepted
        self.bonus_tokens += int(num_accepted == num_draft)
        _count(self.accepted_length_histogram, num_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def measured_acceptance(self) -> float | None:
        """acceptance_rate where anything was drafted, else None: a report's rate, which nothing drafted leaves
        undefined (a served response keeps acceptance_rate's 0, as TensorRT-LLM's does)."""
        return self.acceptance_rate if self.drafted else None

    @property
    def mean_num_draft_tokens(self) -> float:
        """Mean K per target forward (0 for target-only rounds included)."""
        return self.drafted / self.target_forwards if self.target_forwards else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Emitted tokens per target forward (1.0 for target-only decoding)."""
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        """Sum of two requests' counters (times: the longer elapsed, the earlier first token)."""
        ttfts = [t for t in (self.time_to_first_token_s, other.time_to_first_token_s) if t is not None]
        return AcceptanceStats(
            max_draft_len=max(self.max_draft_len, other.max_draft_len),
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            bonus_tokens=self.bonus_tokens + other.bonus_tokens,
            rounds=self.rounds + other.rounds,
            target_forwards=self.target_forwards + other.target_forwards,
            draft_forwards=self.draft_forwards + other.draft_forwards,
            generated_tokens=self.generated_tokens + other.generated_tokens,
            accepted_length_histogram=_add(self.accepted_length_histogram, other.accepted_length_histogram),
            num_draft_histogram=_add(self.num_draft_histogram, other.num_draft_histogram),
            elapsed_s=max(self.elapsed_s, other.elapsed_s),
            time_to_first_token_s=min(ttfts) if ttfts else None,
            by_proposer={
                name: _add(self.by_proposer.get(name, []), other.by_proposer.get(name, []))
                for name in {**self.by_proposer, **other.by_proposer}
            },
            totals_only=self.totals_only or other.totals_only,
        )

    def proposer_acceptance(self, proposer: str) -> float | None:
        """accepted / drafted of the rounds ``proposer`` gave (None where it drafted nothing)."""
        _, drafted, accepted = self.by_proposer.get(proposer, [0, 0, 0])
        return accepted / drafted if drafted else None

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            acceptance_rate=self.measured_acceptance,  # a report's: none where nothing was drafted
            mean_accepted_length=self.mean_accepted_length,
            mean_num_draft_tokens=self.mean_num_draft_tokens,
            tokens_per_round=self.tokens_per_round,
            tokens_per_s=self.tokens_per_s,
            spec_decode=SpecDecodeCounts.of(self).to_dict(),
        )
        return data


# Why a request left the generation loop: the ``finish_reason`` label of the entry models' request counter
# (``trtspec_requests_finished_total``), one series per reason. A label rather than a counter of its own, so that
# the cancelled share is one PromQL ratio over the same family; vLLM counts finished requests the same way
# (vllm:request_success_total{finished_reason="stop"|"length"|"abort"}).
FINISH_REASONS = {
    "stop": "an end id, stop word or stop string ended it",
    "length": "it reached max_tokens (or max_seq_len)",
    "cancelled": "its client cancelled it or went away (closed the stream, dropped the connection)",
    "error": "the server failed it (a failed round, or a response that could not be built)",
}


@dataclass(frozen=True)
class SpecDecodeCounts:
    """An AcceptanceStats' counters under vLLM's spec-decode names (module docstring): what the Triton entry
    models add to their ``trtspec_spec_decode_*`` metrics and what ``--json`` reports as ``spec_decode``."""

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # None: not known, for stats built from a server's response totals (drafted and accepted, no rounds).
    num_drafts: int | None = 0
    num_accepted_tokens_per_pos: tuple[int, ...] | None = ()
    num_rounds_without_speculation: int | None = 0

    @classmethod
    def of(cls, stats: AcceptanceStats) -> SpecDecodeCounts:
        if stats.totals_only:  # a server's totals: its rounds were not seen, even where it drafted nothing
            return cls(stats.drafted, stats.accepted, None, None, None)
        hist = stats.accepted_length_histogram
        # A round that accepted n tokens accepted positions 0..n-1: position i counts the rounds with n > i.
        per_pos = tuple(sum(hist[i + 1 :]) for i in range(max(len(hist) - 1, 0)))
        return cls(
            num_draft_tokens=stats.drafted,
            num_accepted_tokens=stats.accepted,
            num_drafts=stats.rounds,
            num_accepted_tokens_per_pos=per_pos,
            num_rounds_without_speculation=stats.target_forwards - stats.rounds,
        )

    @property
    def mean_draft_len(self) -> float:
        """Draft tokens per round that drafted (the K a request ran with, averaged over its rounds)."""
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        if self.num_accepted_tokens_per_pos is not None:
            data["num_accepted_tokens_per_pos"] = list(self.num_accepted_tokens_per_pos)
        return data


def _count(histogram: list[int], n: int) -> None:
    """histogram[n] += 1, growing the list as needed."""
    if n >= len(histogram):
        histogram += [0] * (n + 1 - len(histogram))
    histogram[n] += 1


def _add(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two histograms of any lengths."""
    return [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)), strict=True)]


def merge_stats(stats: list[AcceptanceStats]) -> AcceptanceStats:
    total = AcceptanceStats()
    for item in stats:
        total = total.merge(item)
    return total


def per_position_acceptance(stats: AcceptanceStats) -> list[float]:
    """[K] fraction of rounds whose i-th draft token was accepted (accepted length >= i), i = 1..K, up to the
    largest K a round drafted (an adaptive run that never drafted past K=2 has nothing to say of position 3)."""
    if not stats.rounds:
        return []
    per_position = SpecDecodeCounts.of(stats).num_accepted_tokens_per_pos
    if stats.num_draft_histogram:
        per_position = per_position[: max(k for k, n in enumerate(stats.num_draft_histogram) if n or not k)]
    return [n / stats.rounds for n in per_position]


def expected_tokens_per_round(acceptance_rate: float, num_draft_tokens: int) -> float:
    """Tokens per round if each draft token is accepted independently with ``acceptance_rate``:
    (1 - a^(K+1)) / (1 - a) (Leviathan et al. 2023, eq. 1)."""
    a, k = acceptance_rate, num_draft_tokens
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def round_cost(num_draft_tokens: int, draft_cost_ratio: float, verify_cost_ratio: float = 1.0) -> float:
    """Cost of one round in target decoding steps: K draft steps plus one (K+1)-token verification."""
    return num_draft_tokens * draft_cost_ratio + verify_cost_ratio


# The dearest draft step the bound and adaptive K take, in target steps: a draft ten times the target's step
# is a mistaken figure, not a draft.
MAX_DRAFT_COST_RATIO = 10.0


def analytic_speedup_bound(
    tokens_per_round: float, num_draft_tokens: int, draft_cost_ratio: float, verify_cost_ratio: float = 1.0
) -> float:
    """Best speedup over target-only decoding: tokens per round / round cost (both per target step)."""
    return tokens_per_round / round_cost(num_draft_tokens, draft_cost_ratio, verify_cost_ratio)


def greedy_rounds(matches: list[bool], num_draft_tokens: int) -> AcceptanceStats:
    """The counters greedy draft-target decoding with K = ``num_draft_tokens`` records along one continuation.

    ``matches[i]``: the draft's greedy token after the prompt and the target's first i continuation tokens equals
    the target's (i-th, 0-based) token. Each round drafts min(K, tokens left - 1) tokens (the engine never drafts
    past max_new_tokens), accepts the leading run of matches and the target adds one token, so a round covers
    accepted + 1 positions. Greedy verification accepts exactly these runs: an accepted draft token is the
    target's, so the draft's next guess sees the same prefix it sees here.
    """
    stats = AcceptanceStats(max_draft_len=num_draft_tokens)
    position, total = 0, len(matches)
    while position < total:
        num_draft = min(num_draft_tokens, total - position - 1)
        accepted = 0
        while accepted < num_draft and matches[position + accepted]:
            accepted += 1
        stats.record_round(num_draft, accepted)
        position += accepted + 1
    stats.generated_tokens = total
    return stats
