#!/usr/bin/env python
"""Replay adaptive K against every static K on a pair's recorded greedy acceptance, without timing noise.

    python tools/replay_adaptive.py                      # the demo pair, the shipped prompts, 64 new tokens
    python tools/replay_adaptive.py builders/demo.yaml --costs 1.3:0.15,1.1:0.12 --concurrency 1,2,4

Greedy draft-target decoding is deterministic: at each position of the target's greedy continuation the draft's
greedy guess matches it or not, and a round with K drafts accepts the leading run of matches (as
core.metrics.greedy_rounds replays it). So the target generates each prompt's continuation once, the draft reads
it once (teacher-forced, as ``trtspec align`` measures acceptance), and every policy replays on those matches.
Round costs come from lines instead of clocks: a target-only round costs 1, a round drafting K tokens
``a1 + b * K`` (``--costs a1:b,...``; on the 2-core CPU machine ``trtspec bench`` measured about 1.3 + 0.15 K at
batch 1). What the benchmark cannot separate from its 15-25% noise between neighbouring points, this shows
exactly: how close the loop's controller (engines/adaptive.py: KController, group_k, AcceptancePool, with
exact costs) gets to the best static K.

At concurrency N, N requests run as one batch: each round drafts the K that group_k picks for the batch
(static: that K), every row advances by its own accepted tokens + 1, and a finished request's slot takes the next
prompt; the round costs the line's cost of its K. Prompts run twice (a warm-up pass for the pooled acceptance,
then the measured pass, as ``trtspec bench`` measures adaptive in steady state).

Prints, per cost line and concurrency: the best static K and its tokens per target-only round, adaptive's, their
ratio, adaptive's mean K and its share of rounds without drafting.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from trtspec.builders.align_report import draft_matches
from trtspec.engines.adaptive import AcceptancePool, KController, KPolicy, group_k, policy_for
from trtspec.recipe import DEMO_RECIPE, load_recipe
from trtspec.validate.commands import load_requests


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


Chooser = Callable[
    [Sequence[KController], int, list[float]], int
]  # (the batch's controllers, size, costs) -> K


def replay(matches: list[list[bool]], costs: list[float], concurrency: int, choose: Chooser, policy: KPolicy):
    """(tokens per target-only round, mean K, share of rounds at K=0) of the measured (second) pass."""
    pool = AcceptancePool(policy)
    max_k = len(costs) - 1
    for _ in range(2):
        queue = list(range(len(matches)))
        active: list[list] = []  # [trace, position, controller]
        tokens = cost = rounds = ks = off = 0
        while queue or active:
            while queue and len(active) < concurrency:
                active.append([matches[queue.pop(0)], 0, KController(policy, max_k, pool)])
            k = choose([row[2] for row in active], len(active), costs)
            for row in active:
                trace, position, controller = row
                num_draft = min(k, len(trace) - position - 1)
                accepted = 0
                while accepted < num_draft and trace[position + accepted]:
                    accepted += 1
                controller.update(num_draft, accepted)
                if num_draft:
                    pool.update(num_draft, accepted)
                row[1] += accepted + 1
                tokens += accepted + 1
            cost, rounds, ks, off = cost + costs[k], rounds + 1, ks + k, off + (k == 0)
            active = [row for row in active if row[1] < len(row[0])]
    return tokens / cost, ks / rounds, off / rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", nargs="?", default=str(DEMO_RECIPE))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--costs", default="1.3:0.15,1.3:0.19,1.1:0.12,1.5:0.25,1.2:0.10,1.4:0.20")
    parser.add_argument("--concurrency", default="1,2,4")
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe)
    matches = traces(recipe, args.max_tokens)
    judged = sum(len(m) for m in matches)
    print(
        f"{recipe.name}: {len(matches)} prompts, {judged} positions, draft matches the target at "
        f"{sum(map(sum, matches)) / judged:.3f} of them"
    )
    max_k = recipe.speculative.max_draft_len
    policy = policy_for(recipe.speculative)
    ratios = []
    print(
        f"{'a1':>5} {'b':>5} {'conc':>4}  {'best':>5} {'tok/rnd':>7}  {'adaptive':>8} {'ratio':>6} {'mean K':>6} {'K=0':>5}"
    )
    for line in args.costs.split(","):
        a1, b = (float(v) for v in line.split(":"))
        costs = [1.0] + [a1 + b * k for k in range(1, max_k + 1)]
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            static = {
                k: replay(matches, costs, concurrency, lambda _rows, _n, _costs, k=k: k, policy)[0]
                for k in range(max_k + 1)
            }
            best = max(static, key=static.get)
            adaptive, mean_k, off = replay(matches, costs, concurrency, group_k, policy)
            ratios.append(adaptive / static[best])
            print(
                f"{a1:5.2f} {b:5.2f} {concurrency:4d}  K={best:<3d} {static[best]:7.3f}  {adaptive:8.3f} "
                f"{adaptive / static[best]:6.3f} {mean_k:6.2f} {off:5.1%}"
            )
    print(f"adaptive / best static K: min {min(ratios):.3f}, mean {sum(ratios) / len(ratios):.3f}")


if __name__ == "__main__":
    main()
