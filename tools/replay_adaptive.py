#!/usr/bin/env python
"""Replay adaptive K against every static K on a pair's recorded greedy acceptance, without timing noise.

    python tools/replay_adaptive.py                      # the demo pair, the shipped prompts, 64 new tokens
    python tools/replay_adaptive.py builders/demo.yaml --costs 1.3:0.15,1.1:0.12 --concurrency 1,2,4
    python tools/replay_adaptive.py --bench bench/demo/bench.json --noise 0.1   # a bench run's measured costs
    python tools/replay_adaptive.py --noise 0.1 --drift 0.15 --seeds 5            # noisy, drifting clocks
    python tools/replay_adaptive.py --load groups --concurrency 2,4,8              # lockstep groups

Greedy draft-target decoding is deterministic: at each position of the target's greedy continuation the draft's
greedy guess matches it or not, and a round with K drafts accepts the leading run of matches (as
core.metrics.greedy_rounds replays it). So the target generates each prompt's continuation once, the draft reads
it once (teacher-forced, as ``trtspec align`` measures acceptance), and every policy replays on those matches.
Round costs come from tables instead of clocks, in target-only rounds: lines (``--costs a1:b,...``: a round
drafting K tokens costs ``a1 + b * K``; on the 2-core CPU machine ``trtspec bench`` measured about 1.3 + 0.15 K
at batch 1), or what a ``trtspec bench`` run measured per K and concurrency (``--bench``: there the cost is a
staircase, not a line: a (K+1)-token verification costs about what the next longer one costs). What the
benchmark cannot separate from its 15-25% noise between neighbouring points, this shows exactly: how close the
loop's controller (engines/adaptive.py: KController, group_k, AcceptancePool, RoundCosts) gets to the best
static K, given the exact costs or learning them from its own rounds as the loop does (each round timed at its
cost, off by a log-normal factor of sigma ``--noise``). One cost table serves every batch size, so what depends
on the batch size (RoundCosts keeps each size's rounds apart) is not replayed: benchmark that side by side.

At concurrency N, N requests run as one batch: each round drafts the K that group_k picks for the batch
(static: that K), every row advances by its own accepted tokens + 1, and a finished request's slot takes the next
prompt; the round costs its K's cost. With ``--load groups``, N prompts start together and the next N when all
of them have finished (an engine call's batch): each round's K is judged by the row expected to finish last
(group_k's ``remaining``, with the spread between requests that finished requests measure), and the batch shrinks
as rows finish, every round still at its K's one cost. Prompts run twice (a warm-up pass for the pooled
acceptance and the costs, then the measured pass, as ``trtspec bench`` measures adaptive in steady state).

Prints, per cost table and concurrency: the best static K and its tokens per target-only round, and adaptive's
ratio to it with exact and with learned costs (its mean K and share of rounds without drafting; with
``--seeds N``, the mean over N noise seeds and the worst of them).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from cli_common import at_least, comma_list, run_main

from trtspec.builders.align_report import draft_matches
from trtspec.engines.adaptive import (
    AdaptiveState,
    KController,
    KPolicy,
    best_k,
    capped,
    group_k,
    policy_for,
    probe_due,
    row_pairs,
)
from trtspec.recipe import DEMO_RECIPE, load_recipe
from trtspec.validate.inputs import load_requests

DRIFT_ROUNDS = (
    200  # --drift: rounds over which the CPU's speed wanders (a few seconds of a CPU pair's rounds)
)
# --costs: lines (A1, B) around what `trtspec bench` measured at batch 1 on the 2-core CPU machine, 1.3 + 0.15 K
DEFAULT_COSTS = [(1.3, 0.15), (1.3, 0.19), (1.1, 0.12), (1.5, 0.25), (1.2, 0.10), (1.4, 0.20)]


def traces(recipe, max_tokens: int) -> list[list[bool]]:
    """Per shipped prompt: does the draft's greedy guess match the target's greedy token, position by position."""
    from transformers import AutoModelForCausalLM

    _, tokenizer, requests, _ = load_requests(recipe, None, None, False, max_tokens)
    target = AutoModelForCausalLM.from_pretrained(recipe.target.model, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(recipe.draft.model, dtype=torch.float32).eval()
    examples = []
    with torch.inference_mode():
        for request in requests:
            ids = torch.tensor([request.token_ids])
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
            examples.append({"ids": out[0], "start": ids.shape[1]})
        return draft_matches(draft, examples)


# (the batch's controllers, size, costs, each row's tokens left where its caller waits for them all, the spread of
# acceptance between requests) -> K
Chooser = Callable[[Sequence[KController], int, list[float], Sequence[int] | None, float], int]


def replay(
    matches: list[list[bool]],
    costs: list[float],
    concurrency: int,
    choose: Chooser,
    policy: KPolicy,
    learn: bool = False,
    noise: float = 0.0,
    drift: float = 0.0,
    seed: int = 0,
    load: str = "streams",
    probing: bool = True,
):
    """(tokens per target-only round, mean K, share of rounds at K=0) of the measured (second) pass. ``load``
    "streams": a finished request's slot takes the next prompt; "groups": ``concurrency`` prompts start together
    and the next group starts when all of them have finished (an engine call's batch: each round's K is judged by
    the row expected to finish last, group_k's ``remaining``), the batch shrinking as rows finish. ``learn``:
    K comes from AdaptiveState.choose, as in the loop (costs learned from the rounds run, each timed at its
    cost), instead of ``choose`` with ``costs``; ``noise``: each timing off by a log-normal factor of that sigma;
    ``drift``: and by the CPU's speed, whose log wanders with that sigma over ~DRIFT_ROUNDS rounds (AR(1)), so
    rounds timed far apart disagree (a target-only unit measured in a fast spell, a K in a slow one). ``probing``:
    rows probe as the loop's do (``probes``); a static K does not."""
    state = AdaptiveState(policy)
    rng = random.Random(seed)
    keep, speed = math.exp(-1.0 / DRIFT_ROUNDS), 0.0
    max_k = len(costs) - 1
    rounds_run = 0
    for _ in range(2):
        queue = list(range(len(matches)))
        active: list[list] = []  # [trace, position, controller]
        tokens = cost = rounds = ks = off = 0
        while queue or active:
            joining = load == "streams" or not active  # a group starts when the last one has finished
            while joining and queue and len(active) < concurrency:
                trace = matches[queue.pop(0)]
                active.append([trace, 0, KController(policy, max_k, state.pool, len(trace))])
            rows = [row[2] for row in active]
            waited = load == "groups" and len(active) > 1
            remaining = [len(row[0]) - row[1] for row in active] if waited else None
            if learn:
                k = state.choose(rows, len(active), len(active), max_k, True, remaining)
            else:
                k = choose(rows, len(active), costs, remaining, state.spread.value)
            rounds_run += 1
            row_ks = [k] * len(active)
            if probing:
                row_ks = probes(active, k, rounds_run, waited, policy, state if learn else None, costs)
            k = max(row_ks)  # the round runs as many draft steps as its longest K
            for row, row_k in zip(active, row_ks, strict=True):
                trace, position, controller = row
                num_draft = min(row_k, len(trace) - position - 1)
                accepted = 0
                while accepted < num_draft and trace[position + accepted]:
                    accepted += 1
                controller.update(num_draft, accepted)
                if num_draft:
                    state.pool.update(num_draft, accepted, position)
                row[1] += accepted + 1
                controller.estimate.position = row[1]
                tokens += accepted + 1
            if drift:  # (no draw without drift: a seed then gives the noise it gave before --drift existed)
                speed = keep * speed + math.sqrt(1.0 - keep * keep) * rng.gauss(0.0, drift)
            state.costs.record(len(active), k, costs[k] * math.exp(speed + rng.gauss(0.0, noise)))
            cost, rounds, ks, off = cost + costs[k], rounds + 1, ks + k, off + (k == 0)
            for row in active:
                if row[1] >= len(row[0]):
                    state.spread.record(*row[2].lifetime)  # as the loop does when a request finishes
            active = [row for row in active if row[1] < len(row[0])]
    return tokens / cost, ks / rounds, off / rounds


def probes(
    active: list[list], k: int, rounds_run: int, waited: bool, policy: KPolicy, state, costs
) -> list[int]:
    """Each row's K this round as the loop gives it (loop.GenerationLoop._num_drafts): the batch's ``k``, or where
    it is 0 and drafting could pay at this batch size (AdaptiveState.worth_probing, ``state`` None: at the exact
    ``costs``), 1 for a row whose probe is due: any such row, or in a group its caller waits for, the row with
    the most tokens left, once in probe_every rounds per pair of rows. Without probes a row that turned drafting
    off never measures again, and neither does the pool its neighbours start from."""
    ks = [k] * len(active)
    if k:
        return ks
    max_k, batch = len(costs) - 1, len(active)
    worth = (
        state.worth_probing(batch, max_k, batch)
        if state is not None
        else best_k(0.95, capped(max_k, policy.schedule, batch), policy, costs) > 0
    )
    if not worth:
        return ks
    if not waited:
        return [int(probe_due(row[2], batch)) for row in active]
    if rounds_run % (policy.probe_every * row_pairs(batch)) == 0:
        last = max(range(batch), key=lambda i: len(active[i][0]) - active[i][1])
        ks[last] = int(probe_due(active[last][2], batch))
    return ks


def bench_costs(path: Path) -> dict[int, list[float]]:
    """Per concurrency, each K's round cost in target-only rounds as a ``trtspec bench`` run measured it: a
    point's batch round seconds are its tokens per round x concurrency / tokens per second. K = 0..the largest
    K swept, each one measured (a server's points without round counts, or a sweep that skipped a K, cannot be
    replayed). Only the draft model's points count (target-only has no proposer): what is replayed is the draft's
    acceptance, and a prompt lookup's round costs another amount."""
    seconds: dict[int, dict[int, float]] = {}
    try:
        document = json.loads(path.read_text())
    except OSError as err:
        raise SystemExit(
            f"--bench {path}: {err.strerror}; give the bench.json `trtspec bench` wrote"
        ) from None
    except ValueError as err:
        raise SystemExit(
            f"--bench {path}: not JSON ({err}); give the bench.json `trtspec bench` wrote"
        ) from None
    points = document.get("points") if isinstance(document, dict) else None
    if not isinstance(points, list):
        raise SystemExit(
            f"--bench {path}: no points list, so not a trtspec bench.json; give the one it wrote"
        )
    for p in points:
        if p["num_draft_tokens"] is None or p.get("proposer") not in (None, "draft"):
            continue
        if not p["tokens_per_round"]:
            raise SystemExit(f"{path}: K={p['num_draft_tokens']} has no tokens_per_round (a server's totals)")
        per_round = p["tokens_per_round"] * p["concurrency"] / p["tokens_per_s"]
        seconds.setdefault(p["concurrency"], {})[p["num_draft_tokens"]] = per_round
    costs = {}
    for concurrency, by_k in seconds.items():
        if max(by_k) == 0:  # target-only alone: no draft point to replay there
            continue
        missing = sorted(set(range(max(by_k) + 1)) - set(by_k))
        if missing:
            raise SystemExit(f"{path}: concurrency {concurrency} has no point at K={missing}; sweep every K")
        costs[concurrency] = [by_k[k] / by_k[0] for k in range(max(by_k) + 1)]
    return costs


def replayed(path: Path, measured: dict[int, list[float]], asked: list[int] | None) -> list[int]:
    """The concurrencies to replay from a bench run's costs: ``asked`` (default: every one measured), each of
    which the run must have measured."""
    has = sorted(measured)
    missing = [c for c in asked or has if c not in measured]
    if missing or not has:
        where = f" at concurrency {','.join(map(str, missing))}" if missing else ""
        raise SystemExit(
            f"{path} has no draft points to replay{where}; it has them at concurrency "
            f"{','.join(map(str, has)) or 'none'}"
        )
    return asked or has


def cost_line(text: str) -> tuple[float, float]:
    """One --costs line ``A1:B`` as (A1, B); ValueError unless it is two numbers."""
    a1, b = text.split(":")  # a ValueError too where there are not two
    return float(a1), float(b)


def refuse_recipe(recipe) -> None:
    """The replay reads the draft model's greedy guesses against the target's tokens, id for id: a recipe without
    a draft, or whose draft has its own tokenizer, has none to read."""
    if recipe.draft is None:
        raise SystemExit(
            f"{recipe.name}: the recipe has no draft model (proposer {recipe.speculative.proposer}); the replay "
            "needs a draft's greedy guesses"
        )
    if recipe.speculative.heterogeneous_vocab:
        raise SystemExit(
            f"{recipe.name}: the draft has its own tokenizer (heterogeneous_vocab); the replay compares the "
            "draft's ids with the target's, so it needs a draft that shares the target's tokenizer"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", nargs="?", default=str(DEMO_RECIPE))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--costs",
        type=comma_list(cost_line, "A1:B (two numbers: a round drafting K tokens costs A1 + B * K)"),
        default=DEFAULT_COSTS,
        help="round-cost lines A1:B, comma-separated",
    )
    parser.add_argument(
        "--concurrency",
        type=comma_list(at_least(1), "a concurrency (1 or more)"),
        default=None,
        help="concurrencies, comma-separated [default: 1,2,4, or with --bench every one it measured]",
    )
    parser.add_argument(
        "--bench",
        type=Path,
        help="a trtspec bench.json: replay its measured round costs per K instead of --costs",
    )
    parser.add_argument(
        "--noise", type=float, default=0.0, help="sigma of the learned costs' log-normal timing noise"
    )
    parser.add_argument(
        "--drift",
        type=float,
        default=0.0,
        help=f"sigma of the CPU's log speed, wandering over ~{DRIFT_ROUNDS} rounds",
    )
    parser.add_argument(
        "--load",
        choices=["streams", "groups"],
        default="streams",
        help="a steady load (a finished request's slot takes the next prompt) or lockstep groups",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="replay learned costs with this many noise seeds: their mean and worst",
    )
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe)
    refuse_recipe(recipe)
    measured = bench_costs(args.bench) if args.bench else None
    if measured is not None:
        concurrencies = replayed(args.bench, measured, args.concurrency)
    else:
        concurrencies = args.concurrency or [1, 2, 4]
    matches = traces(recipe, args.max_tokens)
    judged = sum(len(m) for m in matches)
    print(
        f"{recipe.name}: {len(matches)} prompts, {judged} positions, draft matches the target at "
        f"{sum(map(sum, matches)) / judged:.3f} of them"
    )
    max_k = recipe.speculative.max_draft_len
    policy = policy_for(recipe.speculative)
    if measured is not None:
        cases = [(f"{args.bench.name} c{c}", c, measured[c]) for c in concurrencies]
    else:
        cases = []
        for a1, b in args.costs:
            costs = [1.0] + [a1 + b * k for k in range(1, max_k + 1)]
            cases += [(f"{a1:.2f} + {b:.2f} K", c, costs) for c in concurrencies]
    ratios: dict[str, list[float]] = {"exact": [], "learned": []}
    print(
        f"{'costs':>18} {'conc':>4}  {'best':>5} {'tok/rnd':>7}  adaptive: exact costs / learned (mean K, K=0)"
    )
    for name, concurrency, costs in cases:
        static = {
            k: replay(matches, costs, concurrency, lambda *_, k=k: k, policy, load=args.load, probing=False)[
                0
            ]
            for k in range(len(costs))
        }
        best = max(static, key=static.get)
        line = f"{name:>18} {concurrency:4d}  K={best:<3d} {static[best]:7.3f} "
        for mode in ratios:
            seeds = range(args.seeds if mode == "learned" else 1)  # exact costs: nothing random
            runs = [
                replay(
                    matches,
                    costs,
                    concurrency,
                    group_k,
                    policy,
                    mode == "learned",
                    args.noise,
                    args.drift,
                    seed,
                    args.load,
                )
                for seed in seeds
            ]
            found = [adaptive / static[best] for adaptive, _, _ in runs]
            ratios[mode] += found
            mean_k, off = (sum(run[i] for run in runs) / len(runs) for i in (1, 2))
            line += f" {sum(found) / len(found):6.3f} ({mean_k:4.2f}, {off:4.1%})"
            if len(found) > 1:
                line += f" worst {min(found):5.3f}"
        print(line)
    for mode, values in ratios.items():
        print(
            f"adaptive ({mode} costs) / best static K: min {min(values):.3f}, mean {sum(values) / len(values):.3f}"
        )


if __name__ == "__main__":
    run_main(main)
