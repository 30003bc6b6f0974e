#!/usr/bin/env python
"""A draft with another tokenizer against a same-tokenizer draft of the same size trained the same way, side by
side in one run (not a test: numbers are only compared within one run).

The shipped demo target with three drafts (src/trtspec/assets/demo/TRAINING.md): ``draft-othertok`` (its own
768-token BPE: its tokens reach the target as text, core/translate.py), ``draft-sametok`` (the target's tokenizer,
trained identically) and the shipped ``draft`` (distilled on the target's logits). Batch 1, greedy, the shipped
raw prompt set; the points (target-only, then each draft at each K and adaptive K) run interleaved prompt by prompt
over ``--repeats`` passes, each point timed over all its prompts. It prints tokens/s, the speedup over target-only,
acceptance (accepted / proposed target tokens) and tokens per round, and checks every output equals target-only's.

    OMP_NUM_THREADS=1 .venv/bin/python tools/bench_othertok.py --ks 2 4 --repeats 3
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from cli_common import cpu_name, run_main

from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import DEMO_DIR
from trtspec.validate.prompts import load_prompts

DRAFTS = {"draft-sametok": False, "draft-othertok": True, "draft": False}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ks", type=int, nargs="+", default=[2, 4], help="static K values (adaptive K always)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=16, help="first N prompts of the raw set")
    args = parser.parse_args(argv)

    engines = {
        name: SpeculativeEngine.from_pretrained(
            DEMO_DIR / "target", DEMO_DIR / name, max_draft_len=max(args.ks + [6]), heterogeneous_vocab=own
        )
        for name, own in DRAFTS.items()
    }
    tokenizer = engines["draft"].tokenizer
    prompts = [tokenizer(p.text)["input_ids"] for p in load_prompts(None, chat_set=False)[: args.limit]]
    points = [("target-only", "draft", 0)]
    points += [(name, name, k) for name in DRAFTS for k in [*args.ks, None]]
    seconds, tokens, outputs = defaultdict(float), defaultdict(int), {}
    accepted, drafted, forwards = defaultdict(int), defaultdict(int), defaultdict(int)
    for engine in engines.values():  # one-off costs (allocations, lazy inits) before timing
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=8))
    for _ in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for label, name, k in points:
                params = SamplingParams(max_new_tokens=args.max_new_tokens, num_draft_tokens=k)
                began = time.perf_counter()
                (result,) = engines[name].generate([prompt], params)
                key = (label, k)
                seconds[key] += time.perf_counter() - began
                tokens[key] += len(result.token_ids)
                accepted[key] += result.stats.accepted
                drafted[key] += result.stats.drafted
                forwards[key] += result.stats.target_forwards
                outputs.setdefault((key, i), result.token_ids)
                assert result.token_ids == outputs[(("target-only", 0), i)], (
                    f"{label} K={k} differs on prompt {i}"
                )
    base = tokens["target-only", 0] / seconds["target-only", 0]
    print(
        f"{cpu_name()}, torch threads {torch.get_num_threads()}; {len(prompts)} raw prompts, "
        f"{args.max_new_tokens} new tokens, greedy, batch 1, {args.repeats} passes; every output = target-only's"
    )
    print(f"{'draft':15} {'K':>8} {'tok/s':>7} {'speedup':>7} {'accept':>6} {'tok/rnd':>7}")
    for label, _, k in points:
        key = (label, k)
        rate = tokens[key] / seconds[key]
        accept = f"{accepted[key] / drafted[key]:6.3f}" if drafted[key] else "     -"
        print(
            f"{label:15} {'adaptive' if k is None else k:>8} {rate:7.1f} {rate / base:6.2f}x {accept} "
            f"{tokens[key] / forwards[key]:7.2f}"
        )


if __name__ == "__main__":
    run_main(main)
