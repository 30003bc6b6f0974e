#!/usr/bin/env python
"""Adaptive K on cold engines given lockstep batches, against static K, side by side in one run (not a test).

    .venv/bin/python tools/bench_cold_batches.py                  # the shipped demo pair, batches of 8
    .venv/bin/python tools/bench_cold_batches.py --batch 16 --prompts grounded --shares 0.3,0.6,1.0

Each point calls ``engine.generate`` with ``--batch`` prompts at once (an engine call: its caller waits for every
row, so adaptive K judges the batch by the row expected to finish last), ``--groups`` such calls per pass, passes in
alternating order. Every adaptive point is an engine of its own that starts cold (nothing measured, the pool at
its prior), with KPolicy's ``fixed_round_share`` set to one of ``--shares``: what a round of a smaller batch,
never run, is priced at (1.0: whole rounds). The static points share one engine. Prints each point's tokens/s over
all its passes, each adaptive point over the best static point and over target-only, and its mean K at the full
batch. Every row of a pass is a distinct prompt (rows of one prompt would finish together and exaggerate the
lockstep this measures). Only an adaptive engine's first pass is cold; the figures pool every pass.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_served_adaptive import raw_texts
from cli_common import at_least, comma_list, cpu_name, run_main

from trtspec.engines.adaptive import KPolicy
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import DEMO_DIR


def share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(text)
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=str(DEMO_DIR / "target"), help="target model folder")
    parser.add_argument("--draft", default=str(DEMO_DIR / "draft"), help="draft model folder")
    parser.add_argument("--batch", type=at_least(2), default=8, help="rows per engine call")
    parser.add_argument("--groups", type=at_least(1), default=1, help="engine calls per pass")
    parser.add_argument("--repeats", type=at_least(1), default=4, help="passes over every point")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=64)
    parser.add_argument(
        "--ks",
        type=comma_list(at_least(0), "a K of 0 or more"),
        default=[0, 1, 2],
        help="static K (0: target-only)",
    )
    parser.add_argument(
        "--shares",
        type=comma_list(share, "a share in 0..1"),
        default=[0.3, 1.0],
        help="fixed_round_share of each adaptive engine",
    )
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch threads")
    parser.add_argument(
        "--prompts", default="raw", help="a shipped raw prompt set (raw, grounded) or a JSONL file"
    )
    args = parser.parse_args(argv)
    args.texts = raw_texts(args.prompts)
    if args.batch * args.groups > len(args.texts):
        parser.error(
            f"--batch {args.batch} x --groups {args.groups} needs {args.batch * args.groups} distinct prompts; "
            f"{args.prompts} has {len(args.texts)}: lower --groups or give a larger --prompts set"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    def engine(policy: KPolicy) -> SpeculativeEngine:
        return SpeculativeEngine.from_pretrained(
            args.target,
            args.draft,
            max_batch_size=args.batch,
            max_draft_len=max([*args.ks, 4]),
            k_policy=policy,
        )

    adaptive = {f"adaptive {s}": engine(KPolicy(fixed_round_share=s)) for s in args.shares}
    static = engine(KPolicy())
    tokenizer = static.tokenizer
    prompts = [tokenizer(text)["input_ids"] for text in args.texts[: args.groups * args.batch]]
    points = [(name, e, None) for name, e in adaptive.items()] + [(f"K={k}", static, k) for k in args.ks]
    totals = {name: [0, 0.0] for name, _, _ in points}
    for rep in range(args.repeats):  # forward and reverse order in turn (an even --repeats balances them)
        for name, eng, k in points if rep % 2 == 0 else points[::-1]:
            params = SamplingParams(max_new_tokens=args.max_new_tokens, num_draft_tokens=k)
            start = time.perf_counter()
            for g in range(0, len(prompts), args.batch):
                results = eng.generate(prompts[g : g + args.batch], params)
                totals[name][0] += sum(len(r.token_ids) for r in results)
            totals[name][1] += time.perf_counter() - start
        print(f"pass {rep + 1}/{args.repeats} done", flush=True)
    rate = {name: tokens / seconds for name, (tokens, seconds) in totals.items()}
    best = max((rate[f"K={k}"], k) for k in args.ks)
    print(
        f"{cpu_name()}, batches of {args.batch} ({args.prompts} prompts), {args.max_new_tokens} new tokens, "
        f"{args.repeats} passes"
    )
    print("tokens/s: " + ", ".join(f"{name} {value:.1f}" for name, value in rate.items()))
    for name, eng in adaptive.items():
        rounds = {k: n for (batch, k), n in eng.adaptive.snapshot()[1].items() if batch == args.batch}
        mean_k = sum(k * n for k, n in rounds.items()) / max(sum(rounds.values()), 1)
        line = f"{name}: / best static (K={best[1]}) {rate[name] / best[0]:.3f}"
        if 0 in args.ks:
            line += f", / target-only {rate[name] / rate['K=0']:.3f}"
        print(f"{line}, mean K at {args.batch} rows {mean_k:.2f}")


if __name__ == "__main__":
    run_main(main)
