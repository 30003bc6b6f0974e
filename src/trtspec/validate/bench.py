"""``trtspec bench``: sweep num_draft_tokens (K) and concurrency on one system, target-only (K = 0) included.

Each point runs the prompt set in groups of ``concurrency`` requests issued together (one batch in-process,
concurrent requests to a server), greedy, and measures from the streamed pieces:

- tokens/s: generated tokens / wall seconds of the point (all groups).
- time to first token (TTFT): per request, seconds from issue to its first streamed piece (p50 / p95).
- inter-token latency (ITL): per streamed piece after the first, the gap since the previous piece divided by
  the piece's tokens, one sample per token, so a speculative round that delivers n tokens at once counts as n
  tokens at gap/n each (p50 / p95 over all tokens of the point).
- acceptance: AcceptanceStats merged over the point (core/metrics.py), also per prompt set (raw text, chat
  template); per-position acceptance: the fraction of rounds whose i-th draft token (1-based) was accepted, from
  the accepted-length histogram.

The analytic bound (metrics.analytic_speedup_bound) uses the measured tokens per round (the i.i.d. formula from the
acceptance rate where a system reports no rounds, e.g. Triton) and a draft/target cost ratio: measured in-process as the target-only time per token of the draft over that of the target (same
system, same prompts, same concurrency), or given with --draft-cost-ratio (servers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trtspec.core.metrics import (
    AcceptanceStats,
    SpecDecodeCounts,
    analytic_speedup_bound,
    expected_tokens_per_round,
    merge_stats,
    per_position_acceptance,
)
from trtspec.validate.systems import Generation, Request


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated q-th percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def itl_samples(chunks: Sequence[tuple[float, int]]) -> list[float]:
    """Per-token inter-token latencies of one stream: (arrival s, tokens) pieces -> gap/n repeated n times."""
    samples: list[float] = []
    for (before, _), (arrival, tokens) in zip(chunks, chunks[1:], strict=False):
        if tokens > 0:
            samples += [(arrival - before) / tokens] * tokens
    return samples


@dataclass
class BenchPoint:
    """One (K, concurrency) measurement. K = 0 is target-only decoding on the same system."""

    num_draft_tokens: int
    concurrency: int
    generations: list[Generation]
    wall_s: float
    role: str = "pair"  # "pair", or "draft" for the draft model alone (cost-ratio measurement)
    prompt_sets: list[str] = field(default_factory=list)  # per generation: its request's prompt set; [] = raw

    def stats_by_set(self) -> dict[str, AcceptanceStats]:
        """AcceptanceStats merged per prompt set ('raw', 'chat'), in order of appearance."""
        by_set: dict[str, list[AcceptanceStats]] = {}
        names = self.prompt_sets or ["raw"] * len(self.generations)
        for name, g in zip(names, self.generations, strict=True):
            if g.stats is not None:
                by_set.setdefault(name, []).append(g.stats)
        return {name: merge_stats(stats) for name, stats in by_set.items()}

    @property
    def tokens(self) -> int:
        return sum(len(g.token_ids) for g in self.generations)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stats(self) -> AcceptanceStats:
        return merge_stats([g.stats for g in self.generations if g.stats is not None])

    def summary(self) -> dict:
        ttft = [g.time_to_first_token_s for g in self.generations if g.time_to_first_token_s is not None]
        itl = [s for g in self.generations for s in itl_samples(g.chunks)]
        stats = self.stats
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "concurrency": self.concurrency,
            "requests": len(self.generations),
            "generated_tokens": self.tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "itl_p50_s": percentile(itl, 50),
            "itl_p95_s": percentile(itl, 95),
            "acceptance_rate": stats.acceptance_rate if self.num_draft_tokens else None,
            "mean_accepted_length": stats.mean_accepted_length if stats.rounds else None,
            "tokens_per_round": stats.tokens_per_round if stats.target_forwards else None,
            "per_position_acceptance": per_position_acceptance(stats) if self.num_draft_tokens else [],
            "spec_decode": SpecDecodeCounts.of(stats).to_dict(),
            "acceptance_by_set": {
                name: {
                    "acceptance_rate": s.acceptance_rate,
                    "mean_accepted_length": s.mean_accepted_length if s.rounds else None,
                }
                for name, s in self.stats_by_set().items()
            }
            if self.num_draft_tokens
            else {},
        }


@dataclass
class BenchResult:
    system: str
    max_new_tokens: int
    prompts: int
    points: list[BenchPoint]
    draft_cost_ratio: dict[int, float] = field(default_factory=dict)  # concurrency -> ratio
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict]:
        """Every pair point's summary with speedup vs target-only at the same concurrency, bound and fraction."""
        base = {
            p.concurrency: p.tokens_per_s for p in self.points if p.role == "pair" and p.num_draft_tokens == 0
        }
        rows = []
        for point in (p for p in self.points if p.role == "pair"):
            row = point.summary()
            k, ratio = point.num_draft_tokens, self.draft_cost_ratio.get(point.concurrency)
            row["speedup"] = (
                point.tokens_per_s / base[point.concurrency] if base.get(point.concurrency) else None
            )
            bound = None
            if k and ratio is not None:
                # Measured tokens per round where the system counts rounds: acceptance is bursty, so the
                # i.i.d. formula from the acceptance rate alone underestimates long accepted runs at large K.
                per_round = row["tokens_per_round"] or expected_tokens_per_round(row["acceptance_rate"], k)
                bound = analytic_speedup_bound(per_round, k, ratio)
            row["analytic_bound"] = bound if k else 1.0
            row["achieved_fraction"] = (
                row["speedup"] / row["analytic_bound"] if row["speedup"] and row["analytic_bound"] else None
            )
            rows.append(row)
        return rows

    def recommended_k(self) -> dict[int, int]:
        """Per concurrency, the K (0 = do not speculate) with the highest measured tokens/s."""
        best: dict[int, tuple[float, int]] = {}
        for row in self.rows():
            c = row["concurrency"]
            if c not in best or row["tokens_per_s"] > best[c][0]:
                best[c] = (row["tokens_per_s"], row["num_draft_tokens"])
        return {c: k for c, (_, k) in sorted(best.items())}


def make_requests(requests: Sequence[Request], concurrency: int) -> list[Request]:
    """The prompt set cycled up to a whole number of groups (at least one group of ``concurrency``)."""
    total = max(len(requests), concurrency)
    total = math.ceil(total / concurrency) * concurrency
    return [requests[i % len(requests)] for i in range(total)]


def run_point(
    system, requests: Sequence[Request], params, concurrency: int, role: str = "pair"
) -> BenchPoint:
    """Issue ``requests`` in groups of ``concurrency`` (each group together) and time the whole point."""
    generations: list[Generation] = []
    start = time.perf_counter()
    for first in range(0, len(requests), concurrency):
        generations += system.generate(list(requests[first : first + concurrency]), params)
    wall_s = time.perf_counter() - start
    k = params.num_draft_tokens or 0
    return BenchPoint(k, concurrency, generations, wall_s, role, [r.prompt_set for r in requests])


def cost_ratios(points: Sequence[BenchPoint]) -> dict[int, float]:
    """Per concurrency: target-only seconds per token of the draft / of the target (needs both points)."""
    out = {}
    for draft in (p for p in points if p.role == "draft"):
        target = next(
            (
                p
                for p in points
                if p.role == "pair" and p.num_draft_tokens == 0 and p.concurrency == draft.concurrency
            ),
            None,
        )
        if target and draft.tokens_per_s > 0:
            out[draft.concurrency] = target.tokens_per_s / draft.tokens_per_s
    return out


def run_sweep(
    system,
    requests: Sequence[Request],
    *,
    ks: Sequence[int],
    concurrency: Sequence[int],
    max_new_tokens: int,
    draft_system=None,
    advance: Callable[[str], None] | None = None,
) -> list[BenchPoint]:
    """Every (K, concurrency) point, K = 0 first; ``draft_system`` (the draft alone, target-only) adds draft points."""
    from trtspec.engines.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens)
    step = advance or (lambda _label: None)
    for warm in (system, draft_system):  # first calls pay one-off costs (allocations, lazy inits)
        if warm is not None:
            warm.generate([requests[0]], params.with_(max_new_tokens=4, num_draft_tokens=0))
    points = []
    for c in concurrency:
        batch = make_requests(requests, c)
        for k in [0, *ks]:
            step(f"K={k} concurrency={c}")
            points.append(run_point(system, batch, params.with_(num_draft_tokens=k), c))
        if draft_system is not None:
            step(f"draft alone, concurrency={c}")
            points.append(run_point(draft_system, batch, params.with_(num_draft_tokens=0), c, role="draft"))
    return points
