"""``trtspec bench``: sweep num_draft_tokens (K) and concurrency on one system, target-only (K = 0) and adaptive K
included, side by side in one run.

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
acceptance rate where a system reports no rounds, e.g. Triton) and a draft/target cost ratio: measured in-process
as the target-only time per token of the draft over that of the target (same system, same prompts, same
concurrency; the median of their paired timing samples), or given with --draft-cost-ratio (servers).

Timing samples pair: at one concurrency every point runs each group (a window of a steady load) back to back, so
``paired_ratio`` sets two points' samples against each other one by one; ``sweep_summary`` gives adaptive K
against the best point both pooled and paired, the paired ratio with a bootstrap interval (``paired_interval``):
on a machine whose speed moves by tens of percent between samples, it tells a ratio's shortfall from the noise.

Proposers (core/lookup.py: draft, ngram, draft+ngram; ``proposers``) are swept as K is: every static K and adaptive
K runs once per proposer, target-only (K = 0) once, the baseline of them all. Each point names its proposer
(``None``: the system's own, labelled ``BenchResult.proposer``) and reports acceptance per proposer that gave its
draft tokens (draft+ngram picks one per row and round). The bound takes a lookup's cost as 0 (no forward).

Adaptive K (``num_draft_tokens`` None: requests that pin no K, engines/adaptive.py) runs as one more point per
concurrency (and proposer) where the system adapts K itself. ``sweep_summary`` sets it against target-only and the
best measured point (target-only or a static K); ``recommend_schedule`` turns the measured table into a
``speculative.schedule``: per concurrency the largest K worth running (the primary proposer's table).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from trtspec.core.metrics import (
    AcceptanceStats,
    SpecDecodeCounts,
    analytic_speedup_bound,
    expected_tokens_per_round,
    merge_stats,
    per_position_acceptance,
)
from trtspec.validate.systems import Generation, Request, proposer_summary


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated q-th percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def itl_samples(chunks: Sequence[tuple[float, int]]) -> list[float]:
    """Per-token inter-token latencies of one stream: (arrival s, tokens) pieces -> gap/n repeated n times, each
    gap from the last piece that carried tokens (a text-only server's piece may carry none)."""
    samples: list[float] = []
    before = None
    for arrival, tokens in chunks:
        if tokens <= 0:
            continue
        if before is not None:
            samples += [(arrival - before) / tokens] * tokens
        before = arrival
    return samples


ADAPTIVE = "adaptive"  # the K label of adaptive points (num_draft_tokens None)


def k_label(num_draft_tokens: int | None) -> str:
    """'adaptive' for an adaptive point, else its K."""
    return ADAPTIVE if num_draft_tokens is None else str(num_draft_tokens)


@dataclass
class BenchPoint:
    """One (K, concurrency, proposer) measurement. K = 0 is target-only decoding on the same system, K = None
    adaptive K."""

    num_draft_tokens: int | None
    concurrency: int
    generations: list[Generation]
    wall_s: float
    role: str = "pair"  # "pair", or "draft" for the draft model alone (cost-ratio measurement)
    prompt_sets: list[str] = field(default_factory=list)  # per generation: its request's prompt set; [] = raw
    proposer: str | None = None  # the requests' proposer (core/lookup.py); None: the system's own
    # (tokens, seconds) of each timing sample in the order run: sample i of every point at one concurrency ran the
    # same requests back to back with the others' sample i (run_sweep), so they pair (paired_ratio)
    samples: list[tuple[int, float]] = field(default_factory=list)

    def stats_by_set(self) -> dict[str, AcceptanceStats]:
        """AcceptanceStats merged per prompt set ('raw', 'chat'), in order of appearance."""
        by_set: dict[str, list[AcceptanceStats]] = {}
        names = self.prompt_sets or ["raw"] * len(self.generations)
        for name, g in zip(names, self.generations, strict=True):
            if g.stats is not None:
                by_set.setdefault(name, []).append(g.stats)
        return {name: merge_stats(stats) for name, stats in by_set.items()}

    def pooled(self, other: BenchPoint) -> BenchPoint:
        """This point and another pass of it as one point: every generation, the walls added."""
        return BenchPoint(
            self.num_draft_tokens,
            self.concurrency,
            self.generations + other.generations,
            self.wall_s + other.wall_s,
            self.role,
            self.prompt_sets + other.prompt_sets,
            self.proposer,
            self.samples + other.samples,
        )

    @property
    def speculative(self) -> bool:
        """Drafts (a static K or adaptive K), so acceptance applies."""
        return self.num_draft_tokens != 0

    @property
    def tokens(self) -> int:
        return sum(len(g.token_ids) for g in self.generations)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def sample_rates(self) -> list[float]:
        """Tokens/s of each timing sample."""
        return [tokens / seconds if seconds > 0 else 0.0 for tokens, seconds in self.samples]

    @property
    def stats(self) -> AcceptanceStats:
        return merge_stats([g.stats for g in self.generations if g.stats is not None])

    def summary(self) -> dict:
        ttft = [g.time_to_first_token_s for g in self.generations if g.time_to_first_token_s is not None]
        itl = [s for g in self.generations for s in itl_samples(g.chunks)]
        stats, speculative = self.stats, self.speculative
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "k": k_label(self.num_draft_tokens),
            "concurrency": self.concurrency,
            "requests": len(self.generations),
            "generated_tokens": self.tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "samples": [list(sample) for sample in self.samples],  # [tokens, seconds] per timing sample
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "itl_p50_s": percentile(itl, 50),
            "itl_p95_s": percentile(itl, 95),
            "acceptance_rate": stats.measured_acceptance if speculative else None,
            "mean_accepted_length": stats.mean_accepted_length if stats.rounds else None,
            "tokens_per_round": stats.tokens_per_round if stats.target_forwards else None,
            # Which K the requests ran with: K per target forward (rounds that drafted nothing count 0).
            "mean_num_draft_tokens": stats.mean_num_draft_tokens if stats.target_forwards else None,
            "num_draft_histogram": list(stats.num_draft_histogram),
            "per_position_acceptance": per_position_acceptance(stats) if speculative else [],
            "spec_decode": SpecDecodeCounts.of(stats).to_dict(),
            "acceptance_by_proposer": proposer_summary(stats) if speculative else {},
            "acceptance_by_set": {
                name: {
                    "acceptance_rate": s.measured_acceptance,
                    "mean_accepted_length": s.mean_accepted_length if s.rounds else None,
                }
                for name, s in self.stats_by_set().items()
            }
            if speculative
            else {},
        }


SCHEDULE_TOLERANCE = 0.05  # a K within 5% of the best point counts as worth running (this much is noise here)


def paired_median(numerator: Sequence[float], denominator: Sequence[float]) -> float | None:
    """The median over pairs of numerator[i] / denominator[i] (rates measured back to back, one pair per timing
    sample); None without pairs. A pair shares the machine's state, so a slow spell that falls on one sample of
    one point moves one pair, where it moves a pooled ratio by its whole length: on a shared machine whose speed
    moves by 10-25% from one second to the next, the median of the pairs is the steadier ratio of the two."""
    pairs = _pairs(numerator, denominator)
    return statistics.median(pairs) if pairs else None


INTERVAL_LEVEL = 0.9  # paired_interval's coverage
INTERVAL_RESAMPLES = 2000
# Below this many pairs a resample's median is an extreme pair too often (of 3 pairs, the lowest in 7 of 27),
# so the interval would be the pairs' range and hold the true median far less often than INTERVAL_LEVEL says
# (about 75% at 3-4 pairs, 88-90% at 6 or more, in a simulation with a log-normal spread of 0.15).
INTERVAL_MIN_PAIRS = 6


def paired_interval(
    numerator: Sequence[float], denominator: Sequence[float], level: float = INTERVAL_LEVEL
) -> tuple[float, float] | None:
    """A ``level`` bootstrap percentile interval of paired_median: the pairs resampled with replacement, the
    median of each resample, the central ``level`` of those medians. None with fewer than INTERVAL_MIN_PAIRS
    pairs. Seeded, so the same samples always give the same report. It covers the noise between samples of one
    run, not a choice that a whole run made differently (adaptive K's learned costs), nor the pick of the best
    point among several, which favours whichever ran luckiest."""
    pairs = _pairs(numerator, denominator)
    if len(pairs) < INTERVAL_MIN_PAIRS:
        return None
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(pairs, k=len(pairs))) for _ in range(INTERVAL_RESAMPLES))
    outside = round((1 - level) / 2 * INTERVAL_RESAMPLES)  # resample medians left out on each side
    return medians[outside], medians[INTERVAL_RESAMPLES - 1 - outside]


def _pairs(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """numerator[i] / denominator[i] of every pair both of whose samples were timed (a rate of 0 was not)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} samples against {len(denominator)}: not paired")
    return [a / b for a, b in zip(numerator, denominator, strict=True) if a > 0 and b > 0]


def paired_ratio(point: BenchPoint, other: BenchPoint) -> float | None:
    """``point``'s tokens/s over ``other``'s, the median of their paired timing samples (paired_median); None
    where they did not run the same samples (a point built by hand, or another sweep's)."""
    rates = _paired_rates(point, other)
    return None if rates is None else paired_median(*rates)


def paired_ratio_interval(point: BenchPoint, other: BenchPoint) -> tuple[float, float] | None:
    """paired_interval of ``point``'s timing samples over ``other``'s (None where they do not pair)."""
    rates = _paired_rates(point, other)
    return None if rates is None else paired_interval(*rates)


def _paired_rates(point: BenchPoint, other: BenchPoint) -> tuple[list[float], list[float]] | None:
    if not point.samples or len(point.samples) != len(other.samples):
        return None
    return point.sample_rates, other.sample_rates


def best_static(by_k: dict[int | None, float]) -> tuple[int, float]:
    """(K, tokens/s) of the fastest static point (target-only = K 0 included, adaptive left out); ties: smaller K."""
    static = sorted((k, tps) for k, tps in by_k.items() if k is not None)
    return max(static, key=lambda item: item[1])


def recommend_schedule(
    table: dict[int, dict[int | None, float]], tolerance: float = SCHEDULE_TOLERANCE
) -> dict[int, int]:
    """A ``speculative.schedule`` (in-flight sequences -> largest K) from measured tokens/s per concurrency and K.

    Per concurrency the largest static K worth running: at least target-only's tokens/s and within ``tolerance``
    of the best point's (0 where none is). The cap is the largest such K, not the fastest one, so adaptive K
    can still choose below it. Then K must not grow with the in-flight count (the recipe's rule): a K larger
    than a lower concurrency's is cut to it (noise, or a table that measured fewer K there).
    """
    schedule: dict[int, int] = {}
    previous = None
    for c, by_k in sorted(table.items()):
        static = {k: tps for k, tps in by_k.items() if k is not None}
        if not static:
            continue
        best = max(static.values())
        floor = static.get(0, 0.0)
        worth = [k for k, tps in static.items() if k and tps >= floor and tps >= (1 - tolerance) * best]
        k = max(worth, default=0)
        if previous is not None:
            k = min(k, previous)
        schedule[c] = previous = k
    return schedule


# A lookup proposal costs no forward: the bound's draft/target cost ratio for prompt lookup.
LOOKUP_COST_RATIO = 0.0


@dataclass
class BenchResult:
    system: str
    max_new_tokens: int
    prompts: int
    points: list[BenchPoint]
    draft_cost_ratio: dict[int, float] = field(default_factory=dict)  # concurrency -> ratio
    notes: list[str] = field(default_factory=list)
    proposer: str = "draft"  # the system's own: the label of points whose requests named none
    load: str = "groups"  # LOADS: groups of requests issued together, or a steady load (streams)

    def label(self, point: BenchPoint) -> str | None:
        """The proposer a point ran with; None for target-only (and the draft alone), which propose nothing."""
        return None if point.num_draft_tokens == 0 else point.proposer or self.proposer

    @property
    def proposers(self) -> list[str]:
        """The proposers swept, in the order measured."""
        return list(dict.fromkeys(filter(None, (self.label(p) for p in self.points if p.role == "pair"))))

    @property
    def primary(self) -> str:
        """The proposer the recommended K and speculative.schedule are for: the system's own where it was swept."""
        swept = self.proposers
        return self.proposer if self.proposer in swept or not swept else swept[0]

    def rows(self) -> list[dict]:
        """Every pair point's summary with its proposer, speedup vs target-only at the same concurrency, bound and
        fraction."""
        base = {
            p.concurrency: p.tokens_per_s for p in self.points if p.role == "pair" and p.num_draft_tokens == 0
        }
        rows = []
        for point in (p for p in self.points if p.role == "pair"):
            row = {"proposer": self.label(point), **point.summary()}
            row["speedup"] = (
                point.tokens_per_s / base[point.concurrency] if base.get(point.concurrency) else None
            )
            row["analytic_bound"] = self._bound(row, point)
            row["achieved_fraction"] = (
                row["speedup"] / row["analytic_bound"] if row["speedup"] and row["analytic_bound"] else None
            )
            rows.append(row)
        return rows

    def _bound(self, row: dict, point: BenchPoint) -> float | None:
        """The analytic bound of a point: 1 for target-only; none for adaptive K (K changes round by round) or
        draft+ngram (its rounds mix two costs)."""
        k = point.num_draft_tokens
        if k == 0:
            return 1.0
        ratio = {"draft": self.draft_cost_ratio.get(point.concurrency), "ngram": LOOKUP_COST_RATIO}.get(
            row["proposer"]
        )
        if not k or ratio is None:
            return None
        # Measured tokens per round where the system counts rounds: acceptance is bursty, so the i.i.d. formula
        # from the acceptance rate alone underestimates long accepted runs at large K. It assumes K drafted every
        # round, which a lookup (often shorter, or none) does not: no bound for it without counted rounds.
        per_round = row["tokens_per_round"]
        if per_round is None and row["proposer"] == "draft" and row["acceptance_rate"] is not None:
            per_round = expected_tokens_per_round(row["acceptance_rate"], k)
        return analytic_speedup_bound(per_round, k, ratio) if per_round else None

    def grid(self, proposer: str | None = None) -> dict[int, dict[int | None, BenchPoint]]:
        """Per concurrency: the point per K (0 target-only, None adaptive) of ``proposer``'s points (None: the
        primary's), in the order measured."""
        proposer = proposer or self.primary
        out: dict[int, dict[int | None, BenchPoint]] = {}
        for point in (p for p in self.points if p.role == "pair" and self.label(p) in (None, proposer)):
            out.setdefault(point.concurrency, {})[point.num_draft_tokens] = point
        return out

    def table(self, proposer: str | None = None) -> dict[int, dict[int | None, float]]:
        """``grid``'s tokens/s."""
        return {c: {k: p.tokens_per_s for k, p in by_k.items()} for c, by_k in self.grid(proposer).items()}

    def recommended_k(self) -> dict[int, int]:
        """Per concurrency, the static K (0 = do not speculate) with the highest measured tokens/s (the primary
        proposer's)."""
        return {c: best_static(by_k)[0] for c, by_k in sorted(self.table().items())}

    def recommended_schedule(self, tolerance: float = SCHEDULE_TOLERANCE) -> dict[int, int]:
        return recommend_schedule(self.table(), tolerance)

    def sweep_summary(self) -> list[dict]:
        """Per concurrency and proposer with an adaptive point: target-only, the proposer's best point (target-only
        or a static K), adaptive and their ratios, pooled (tokens / seconds of each point) and paired (the median
        of adaptive's timing samples over that point's beside them: paired_ratio, with its paired_interval)."""
        rows = []
        mean_k = {  # unknown (None) where the system reports no target forwards (a server's totals only)
            (p.concurrency, self.label(p)): p.stats.mean_num_draft_tokens if p.stats.target_forwards else None
            for p in self.points
            if p.role == "pair" and p.num_draft_tokens is None
        }
        for proposer in self.proposers:
            for c, grid in sorted(self.grid(proposer).items()):
                if None not in grid:
                    continue
                by_k = {k: p.tokens_per_s for k, p in grid.items()}
                best_k, best = best_static(by_k)
                adaptive, target_only = by_k[None], by_k.get(0)
                rows.append(
                    {
                        "concurrency": c,
                        "proposer": proposer,
                        "target_only_tokens_per_s": target_only,
                        "best_num_draft_tokens": best_k,
                        "best_tokens_per_s": best,
                        "adaptive_tokens_per_s": adaptive,
                        "adaptive_mean_num_draft_tokens": mean_k.get((c, proposer)),
                        "adaptive_vs_best": adaptive / best if best else None,
                        "adaptive_vs_target_only": adaptive / target_only if target_only else None,
                        "adaptive_vs_best_paired": paired_ratio(grid[None], grid[best_k]),
                        "adaptive_vs_best_paired_interval": paired_ratio_interval(grid[None], grid[best_k]),
                        "adaptive_vs_target_only_paired": paired_ratio(grid[None], grid[0])
                        if 0 in grid
                        else None,
                        "adaptive_vs_target_only_paired_interval": paired_ratio_interval(grid[None], grid[0])
                        if 0 in grid
                        else None,
                    }
                )
        return sorted(rows, key=lambda row: row["concurrency"])  # stable: the proposers in sweep order

    def proposer_comparison(self) -> list[dict]:
        """Per concurrency and proposer (where several were swept): its fastest point (a static K or adaptive),
        against target-only and against the fastest point of every other proposer."""
        best: dict[tuple[int, str], tuple[int | None, float]] = {}
        target_only = {c: by_k.get(0) for c, by_k in self.table().items()}
        for proposer in self.proposers:
            for c, by_k in self.table(proposer).items():
                points = [(k, tps) for k, tps in by_k.items() if k != 0]
                if points:
                    best[c, proposer] = max(points, key=lambda item: item[1])
        rows = []
        for (c, proposer), (k, tps) in sorted(best.items(), key=lambda item: item[0][0]):
            others = [v for (oc, op), (_, v) in best.items() if oc == c and op != proposer]
            rows.append(
                {
                    "concurrency": c,
                    "proposer": proposer,
                    "best_num_draft_tokens": k,
                    "best_tokens_per_s": tps,
                    "vs_target_only": tps / target_only[c] if target_only.get(c) else None,
                    "vs_best_other": tps / max(others) if others and max(others) else None,
                }
            )
        return rows if len(self.proposers) > 1 else []


LOADS = ("groups", "streams")
STREAM_REQUESTS = 4  # under a steady load, requests per stream in one timing sample


def window(concurrency: int, load: str) -> int:
    """Requests in one timing sample of a point: a group of ``concurrency`` issued together, or under a steady
    load (``streams``) STREAM_REQUESTS per stream, so the ramp at its start and the drain at its end are a small
    part of it."""
    return concurrency * (STREAM_REQUESTS if load == "streams" else 1)


def budget(max_new_tokens: int, index: int) -> int:
    """Request ``index``'s new-token budget under a steady load: 0.5x-1.5x ``max_new_tokens``, spread evenly
    (golden-ratio steps, the same sequence for every point). Equal budgets would keep target-only requests in
    lockstep: started together, they end together and their successors prefill as one batch, which independent
    clients do not do."""
    return max(1, round(max_new_tokens * (0.5 + (index * 0.6180339887) % 1.0)))


def make_requests(
    requests: Sequence[Request], concurrency: int, load: str = "groups", max_new_tokens: int = 0
) -> list[Request]:
    """The prompt set cycled up to a whole number of windows (at least one); under a steady load each with its
    ``budget``."""
    total = sweep_groups(len(requests), concurrency, load) * window(concurrency, load)
    cycled = [requests[i % len(requests)] for i in range(total)]
    if load == "streams":
        return [replace(r, max_new_tokens=budget(max_new_tokens, i)) for i, r in enumerate(cycled)]
    return cycled


def run_point(
    system, requests: Sequence[Request], params, concurrency: int, role: str = "pair", load: str = "groups"
) -> BenchPoint:
    """Issue ``requests`` in groups of ``concurrency`` (each group together), or as a steady load of
    ``concurrency`` in flight (``streams``), and time the whole point."""
    generations: list[Generation] = []
    start = time.perf_counter()
    if load == "streams":
        generations = system.generate(list(requests), params, in_flight=concurrency)
    else:
        for first in range(0, len(requests), concurrency):
            generations += system.generate(list(requests[first : first + concurrency]), params)
    wall_s = time.perf_counter() - start
    prompt_sets = [r.prompt_set for r in requests]
    point = BenchPoint(
        params.num_draft_tokens, concurrency, generations, wall_s, role, prompt_sets, params.proposer
    )
    point.samples = [(point.tokens, wall_s)]  # one timing sample: run_sweep pools a point's samples
    return point


def cost_ratios(points: Sequence[BenchPoint]) -> dict[int, float]:
    """Per concurrency: target-only seconds per token of the draft / of the target (needs both points), paired
    sample by sample where both ran the same samples (paired_ratio: the draft alone runs in every group's
    rotation beside target-only), else pooled."""
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
            paired = paired_ratio(target, draft)
            out[draft.concurrency] = target.tokens_per_s / draft.tokens_per_s if paired is None else paired
    return out


def sweep_groups(num_requests: int, concurrency: int, load: str = "groups") -> int:
    """How many timing samples (``window``s: groups, or a steady load's windows) a pass of a point runs."""
    size = window(concurrency, load)
    return math.ceil(max(num_requests, size) / size)


def sweep_passes(
    num_requests: int, concurrency: int, repeats: int, min_groups: int = 1, load: str = "groups"
) -> int:
    """Passes at one concurrency: ``repeats``, or more until each point pools ``min_groups`` groups."""
    return max(repeats, math.ceil(min_groups / sweep_groups(num_requests, concurrency, load)))


def sweep_steps(
    num_requests: int,
    concurrency: Sequence[int],
    repeats: int,
    adaptive: bool,
    min_groups: int = 1,
    num_proposers: int = 1,
    load: str = "groups",
) -> int:
    """How many times run_sweep calls ``advance``: per concurrency, its warm-ups (one per proposer; one without
    adaptive K) and each pass's groups."""
    return sum(
        (num_proposers if adaptive else 1)
        + sweep_passes(num_requests, c, repeats, min_groups, load) * sweep_groups(num_requests, c, load)
        for c in concurrency
    )


def sweep_runs(
    ks: Sequence[int], proposers: Sequence[str | None], adaptive: bool
) -> list[tuple[str | None, int | None]]:
    """The (proposer, K) of each pair point at one concurrency: per proposer adaptive K and every static K, and
    target-only (proposer None) once, after the first proposer's adaptive point."""
    runs: list[tuple[str | None, int | None]] = []
    for i, proposer in enumerate(proposers):
        runs += [(proposer, None)] * adaptive + [(None, 0)] * (i == 0) + [(proposer, k) for k in ks]
    return runs


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` points in which each comes right after every other equally often (a Williams design:
    ``n`` orders for an even ``n``, and for an odd one those and their mirrors), so that what a point leaves behind
    falls on every point alike: the CPU caches it filled, or another engine's weights in them. Rotation alone does
    not: rotating adaptive, target-only, K=2 and the draft alone puts adaptive right after the draft alone in
    three orders of four, where its rounds run on colder caches (docs/benchmarks.md, "The bench's order of
    points")."""
    steps, low, high = [0], 1, n - 1
    while len(steps) < n:
        steps.append(low)
        low += 1
        if len(steps) < n:
            steps.append(high)
            high -= 1
    orders = [[(first + step) % n for step in steps] for first in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def run_sweep(
    system,
    requests: Sequence[Request],
    *,
    ks: Sequence[int],
    concurrency: Sequence[int],
    max_new_tokens: int,
    adaptive: bool = False,
    repeats: int = 1,
    min_groups: int = 1,
    draft_system=None,
    advance: Callable[[str], None] | None = None,
    proposers: Sequence[str | None] = (None,),
    load: str = "groups",
) -> list[BenchPoint]:
    """Every (K, concurrency, proposer) point: per proposer (None: the system's own) adaptive K (``adaptive``:
    requests that give no K) and ``ks``, and K = 0 once; ``draft_system`` (the draft alone, target-only) adds draft
    points. Adaptive K is measured in steady state: at
    each concurrency one untimed adaptive pass runs first, so it has measured that batch size's round costs
    (engines/adaptive.py: what a server learns in its first seconds and keeps for its lifetime; an engine keeps
    them across calls). Without adaptive K (a server whose default is not), one untimed target-only pass runs
    instead: a server that reuses cached prompt prefixes (the tensorrtllm runtime) would run a group's first point
    cold and the others warm.

    The points are interleaved group by group: each group of ``concurrency`` requests runs under every point back
    to back, in balanced_orders from group to group, and ``repeats`` passes do that again (more where a pass
    has fewer than ``min_groups`` groups); each point pools its groups and passes. Neighbouring points measured
    one after another over minutes differed by 15-25% on a shared machine (its speed drifts); interleaved within
    seconds, a slow spell falls on every point alike. A group is one timing sample of a point, and at high
    concurrency a pass has few (16 prompts at concurrency 16: one), so ``min_groups`` evens out the precision.

    ``load`` "streams": each group is a window of a steady load instead (``window``: ``concurrency`` requests in
    flight, the next issued as one finishes, each with its own ``budget``), the load a server meets from
    independent clients."""
    from trtspec.engines.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens)
    step = advance or (lambda _label: None)
    for warm in (system, draft_system):  # first calls pay one-off costs (allocations, lazy inits)
        if warm is not None:
            warm.generate([requests[0]], params.with_(max_new_tokens=4, num_draft_tokens=0))
    runs = [("pair", p, k) for p, k in sweep_runs(ks, proposers, adaptive)]
    runs += [("draft", None, 0)] if draft_system is not None else []
    order = {p: i for i, p in enumerate(proposers)}
    orders = balanced_orders(len(runs))
    points = []
    for c in concurrency:
        batch = make_requests(requests, c, load, max_new_tokens)
        size = window(c, load)
        groups = [batch[i : i + size] for i in range(0, len(batch), size)]
        pooled: dict[tuple, BenchPoint] = {}
        for proposer, k in [(p, None) for p in proposers] if adaptive else [(None, 0)]:
            named = f" proposer={proposer}" if proposer else ""
            step(f"K={k_label(k)}{named} concurrency={c} warm-up (untimed)")
            run_point(system, batch, params.with_(num_draft_tokens=k, proposer=proposer), c, load=load)
        num_passes = sweep_passes(len(requests), c, repeats, min_groups, load)
        for n in range(num_passes):
            for g, group in enumerate(groups):
                passes = f" pass {n + 1}/{num_passes}" if num_passes > 1 else ""
                step(f"concurrency={c}{passes} group {g + 1}/{len(groups)}: every point")
                for key in (runs[i] for i in orders[(n * len(groups) + g) % len(orders)]):
                    role, proposer, k = key
                    runner = system if role == "pair" else draft_system
                    point = run_point(
                        runner,
                        group,
                        params.with_(num_draft_tokens=k, proposer=proposer),
                        c,
                        role=role,
                        load=load,
                    )
                    pooled[key] = pooled[key].pooled(point) if key in pooled else point
        # Reported target-only first, then per proposer in K order, adaptive last, whatever order they ran in.
        points += sorted(
            pooled.values(),
            key=lambda p: (
                p.role != "pair",
                p.num_draft_tokens != 0 and order[p.proposer] + 1,
                p.num_draft_tokens is None,
                p.num_draft_tokens or 0,
            ),
        )
    return points
