"""Demo pair, in-process engine: tokens/s of target-only, static K and adaptive K at concurrency 1 and 4, side by
side in one run (greedy, 8 code prompts x 96 new tokens).

    python tools/bench_adaptive.py [TORCH_THREADS]
"""

from __future__ import annotations

import sys
import time

import torch

from trtspec.core.metrics import merge_stats
from trtspec.engines.adaptive import policy_for
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import load_recipe

PROMPTS = [
    "def fibonacci(n):",
    "import os\n\ndef walk(path):",
    "class Stack:\n    def __init__(self):",
    "def parse_args(argv):",
    "for line in open(path):",
    "def merge(a, b):",
    "try:\n    import json",
    "def main():",
]


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    recipe = load_recipe("demo")
    engine = SpeculativeEngine.from_pretrained(
        recipe.target.model,
        recipe.draft.model,
        max_draft_len=8,
        max_batch_size=4,
        max_seq_len=512,
        k_policy=policy_for(recipe.speculative),
    )
    prompts = [engine.tokenizer.encode(text) for text in PROMPTS]
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, num_draft_tokens=0))  # warm-up
    for concurrency in (1, 4):
        for k in (0, 2, 4, 8, None):  # None: adaptive
            params = SamplingParams(max_new_tokens=96, num_draft_tokens=k, ignore_eos=True)
            start, tokens, stats = time.perf_counter(), 0, []
            for i in range(0, len(prompts), concurrency):
                for result in engine.generate(prompts[i : i + concurrency], params):
                    tokens += len(result.token_ids)
                    stats.append(result.stats)
            wall = time.perf_counter() - start
            merged = merge_stats(stats)
            label = "adaptive" if k is None else k
            print(
                f"concurrency {concurrency} K={label}: {tokens / wall:7.1f} tokens/s, acceptance "
                f"{merged.acceptance_rate:.2f}, mean K {merged.mean_num_draft_tokens:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
