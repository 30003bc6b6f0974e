#!/usr/bin/env python
"""Side-by-side speed of the PyTorch draft-target engine (not a test: numbers are only compared within one run).

On one machine, in one run, batch 1, greedy, the same prompts and new-token budget:
  - HF target-only:  target.generate(do_sample=False)
  - HF assisted:     target.generate(assistant_model=draft), constant K = 1..8 and HF's default heuristic schedule
  - engine target-only (K = 0) and engine K = 1..8 (trtspec.engines.SpeculativeEngine)
  - engine through the HF-forward fallback (lean=False), target-only and at the best K: the lean forward's gain
For each engine K it prints tokens/s, acceptance, tokens per round, the measured draft/target cost ratio and
(K+1)-token verification cost, the analytic bound (trtspec.core.metrics.analytic_speedup_bound) and the
achieved fraction of it, and the speedups over engine target-only, HF target-only and the best HF assisted.

    .venv/bin/python tools/bench_engine.py                      # the shipped demo pair
    .venv/bin/python tools/bench_engine.py --target T --draft D --max-new-tokens 64 --ks 1 2 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from cli_common import cpu_name, run_main

from trtspec.core.metrics import analytic_speedup_bound, merge_stats
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import DEMO_DIR

PROMPTS = [
    "def read_config(path):\n    ",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "The module provides functions for",
    "for key, value in sorted(mapping.items()):\n",
]


def timed(fn, repeats: int = 1) -> float:
    """Median wall seconds of fn() (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hf_tokens_per_s(target, prompts, max_new, **kwargs) -> float:
    """tokens/s of HF generate over all prompts, each generating exactly ``max_new`` tokens: the engine runs with
    ignore_eos, so an EOS must not end HF's runs early either (min_new_tokens), or the ratios compare lengths."""
    counts = []

    def run():
        counts.clear()
        for ids in prompts:
            out = target.generate(
                torch.tensor([ids], device=target.device),
                do_sample=False,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                **kwargs,
            )
            counts.append(out.shape[1] - len(ids))

    seconds = timed(run)
    return sum(counts) / seconds


def engine_run(engine, prompts, max_new, k):
    """(tokens/s, merged AcceptanceStats) of the engine over all prompts, one at a time (batch 1)."""
    params = SamplingParams(max_new_tokens=max_new, num_draft_tokens=k, ignore_eos=True)
    results = []

    def run():
        results.clear()
        results.extend(engine.generate([ids], params)[0] for ids in prompts)

    seconds = timed(run)
    stats = merge_stats([r.stats for r in results])
    return sum(len(r.token_ids) for r in results) / seconds, stats


def step_costs(engine, max_k: int, position: int = 64) -> tuple[float, dict[int, float]]:
    """Measured draft_cost_ratio (1-token draft forward / 1-token target forward) and verify_cost_ratio[K]
    ((K+1)-token target forward / 1-token target forward), at a mid-sequence position, through the engine's models."""

    def forward(model, n):
        tokens = torch.ones(1, n, dtype=torch.long, device=model.device)
        index = torch.arange(n, device=model.device)[None]
        return lambda: model.forward(tokens, [0], [position], [n], index)

    reps = 30
    target_1 = timed(lambda: [forward(engine.target, 1)() for _ in range(reps)]) / reps
    draft_1 = timed(lambda: [forward(engine.draft, 1)() for _ in range(reps)]) / reps
    verify = {
        k: timed(lambda k=k: [forward(engine.target, k + 1)() for _ in range(reps)]) / reps / target_1
        for k in range(1, max_k + 1)
    }
    return draft_1 / target_1, verify


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=DEMO_DIR / "target")
    parser.add_argument("--draft", type=Path, default=DEMO_DIR / "draft")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--ks",
        type=int,
        nargs="+",
        default=list(range(1, 9)),
        help="K values (engine target-only always runs)",
    )
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if min(args.ks) < 1:
        parser.error(f"--ks {min(args.ks)}: K is 1 or more (engine target-only, K=0, always runs)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    max_k, max_new = max(args.ks), args.max_new_tokens
    opts = dict(device=args.device, dtype=args.dtype, max_draft_len=max_k, max_batch_size=1, max_seq_len=1024)
    engine = SpeculativeEngine.from_pretrained(args.target, args.draft, **opts)
    prompts = [engine.tokenizer(p)["input_ids"] for p in PROMPTS[: args.prompts]]
    hf_target, hf_draft = engine.target.hf_model, engine.draft.hf_model
    print(
        f"target {args.target}  draft {args.draft}  device {args.device} {args.dtype}  {cpu_name()}, threads "
        f"{torch.get_num_threads()}  prompts {len(prompts)} x {max_new} new tokens, batch 1, greedy\n"
    )

    hf_base = hf_tokens_per_s(hf_target, prompts, max_new)
    print(f"HF target-only            {hf_base:8.1f} tokens/s", flush=True)
    hf_assisted = {}
    for name in [*(f"K={k}" for k in args.ks), "heuristic"]:
        schedule = (
            {}
            if name == "heuristic"
            else dict(
                num_assistant_tokens=int(name[2:]),
                num_assistant_tokens_schedule="constant",
                assistant_confidence_threshold=0.0,
            )
        )
        tps = hf_assisted[name] = hf_tokens_per_s(
            hf_target, prompts, max_new, assistant_model=hf_draft, **schedule
        )
        print(f"HF assisted {name:13s} {tps:8.1f} tokens/s  {tps / hf_base:5.2f}x HF target-only", flush=True)
    best_hf = max(hf_assisted, key=hf_assisted.get)
    print()

    base_tps, _ = engine_run(engine, prompts, max_new, 0)
    draft_ratio, verify_ratio = step_costs(engine, max_k)
    print(f"engine target-only        {base_tps:8.1f} tokens/s  {base_tps / hf_base:5.2f}x HF target-only")
    print(
        f"measured draft/target cost ratio {draft_ratio:.3f}; (K+1)-token verify / 1-token target: "
        + ", ".join(f"K={k}: {v:.2f}" for k, v in verify_ratio.items())
        + "\n"
    )
    header = (
        f"{'K':>2} {'tok/s':>8} {'accept':>7} {'tok/rnd':>7} {'bound':>6} {'speedup':>7} {'of bound':>8} "
        f"{'vs HF tgt':>9} {'vs HF asst':>10}"
    )
    print(header)
    rows = {}
    for k in args.ks:
        tps, stats = engine_run(engine, prompts, max_new, k)
        bound = analytic_speedup_bound(stats.tokens_per_round, k, draft_ratio, verify_ratio[k])
        speedup = tps / base_tps
        rows[k] = tps
        print(
            f"{k:2d} {tps:8.1f} {stats.acceptance_rate:7.1%} {stats.tokens_per_round:7.2f} {bound:6.2f} "
            f"{speedup:6.2f}x {speedup / bound:8.0%} {tps / hf_base:8.2f}x {tps / hf_assisted[best_hf]:9.2f}x"
        )
    best_k = max(rows, key=rows.get)
    print(
        f"\nbest K = {best_k}: {rows[best_k] / hf_base:.2f}x HF target-only, "
        f"{rows[best_k] / hf_assisted[best_hf]:.2f}x HF assisted at its best ({best_hf}), "
        f"{rows[best_k] / base_tps:.2f}x engine target-only"
    )

    slow = SpeculativeEngine.from_pretrained(args.target, args.draft, lean=False, **opts)
    slow_base, _ = engine_run(slow, prompts, max_new, 0)
    slow_best, _ = engine_run(slow, prompts, max_new, best_k)
    print(
        f"engine via HF forward (lean=False): target-only {slow_base:.1f} tokens/s, K={best_k} {slow_best:.1f} "
        f"tokens/s ({slow_best / slow_base:.2f}x); the lean forward is {base_tps / slow_base:.2f}x / "
        f"{rows[best_k] / slow_best:.2f}x faster"
    )


if __name__ == "__main__":
    run_main(main)
