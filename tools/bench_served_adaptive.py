#!/usr/bin/env python
"""Served adaptive K against pinned K through Triton, side by side in one run (not a test).

The demo pair (or --recipe) is deployed with the torch runtime, its default K left to the server (adaptive), and
served by a real tritonserver on free loopback ports. Requests are streamed over gRPC by client threads that keep their connections, as a serving client does.

1. Load steps (one server): at each concurrency, `concurrency` requests that leave K to the server (adaptive, the
   default) run first, on nothing but what the server has learned so far; then --repeats passes over every point
   (adaptive and each pinned K, target-only K=0 included), in balanced orders pass by pass (each point right after
   every other equally often). A point's figure is its rate pooled over the passes (all its tokens over all its
   seconds; a best pass would set adaptive's best of N against the best of the pinned points' 3N, which favours
   them on noise alone); beside it, adaptive against each pinned point pass by pass (the median of the paired
   ratios: the two ran in the same pass; from 6 passes on, with its bootstrap interval, the passes' noise:
   validate.bench.paired_interval). A pass is one group of `concurrency` requests sent at once (--load
   groups), or `concurrency` clients each sending --per-stream requests back to back, of varied lengths (--load
   streams: a steady load, where requests join and leave at any round).
2. Jump (a fresh server): adaptive requests one at a time, then at once `--jump` of them: the groups after the
   jump, each against the same group on another fresh server where every request pins target-only (a server's
   first group at a new load is slower whatever its K: its clients connect and it meets that batch size first).

Printed per concurrency: tokens/s of every point, adaptive / best pinned and adaptive / target-only, and what the
server's /metrics say adaptive chose at that batch size and why (trtspec_adaptive_*). --json prints one document.

    .venv/bin/python tools/bench_served_adaptive.py                       # 1,2,4,8,16 streams, K 0,2,4, 3 passes
    .venv/bin/python tools/bench_served_adaptive.py --concurrency 1,4 --repeats 1 --max-tokens 16 --short
    .venv/bin/python tools/bench_served_adaptive.py --load streams --prompts grounded --concurrency 8,16 --jump 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_engine import PROMPTS
from cli_common import at_least, comma_list, cpu_name, run_main, stop_like_serve, threads_or_auto

from trtspec.validate.bench import (
    INTERVAL_LEVEL,
    LOADS,
    balanced_orders,
    budget,
    paired_interval,
    paired_median,
)

ADAPTIVE = "adaptive"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="demo", help="recipe file or 'demo' (the shipped pair)")
    parser.add_argument(
        "--concurrency",
        type=comma_list(at_least(1), "a number of streams (1 or more)"),
        default=[1, 2, 4, 8, 16],
        help="load steps (comma-separated)",
    )
    parser.add_argument(
        "--ks",
        type=comma_list(at_least(0), "a K (0 or more)"),
        default=[0, 2, 4],
        help="pinned K values (comma-separated; 0 = target-only)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="passes over every point per load step")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--jump", type=int, default=16, help="streams after the jump from 1 (0: skip it)")
    parser.add_argument(
        "--cpu-threads",
        type=threads_or_auto,
        default=None,
        help="triton.cpu_threads override (a number or auto)",
    )
    parser.add_argument("--short", action="store_true", help="one group per point (the test suite's form)")
    parser.add_argument(
        "--load",
        choices=LOADS,
        default="groups",
        help="groups: `concurrency` requests at once, the next group when all are done; streams: `concurrency`"
        " clients sending --per-stream requests each, back to back, of 0.5x-1.5x --max-tokens (see streams())",
    )
    parser.add_argument(
        "--per-stream", type=int, default=4, help="requests per client stream (--load streams)"
    )
    parser.add_argument(
        "--prompts",
        default=None,
        help="a shipped raw prompt set (raw, grounded) or a JSONL file of raw prompts [default: bench_engine's]",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser.parse_args(argv)


def group(
    client, pool, n: int, k: int | None, max_tokens: int, offset: int = 0, texts: list[str] = PROMPTS
) -> tuple[int, float]:
    """(tokens, seconds) of ``n`` concurrent streamed requests with K ``k`` (None: left to the server), sent at one
    instant (a barrier), so that a loaded client machine does not turn the group into requests one after another."""
    prompts = [texts[(offset + i) % len(texts)] for i in range(n)]
    together = threading.Barrier(n)

    def one(prompt: str):
        together.wait(timeout=60)
        return client.generate(prompt, max_tokens, k, stream=True)

    start = time.perf_counter()
    responses = list(pool.map(one, prompts))
    return sum(len(r.token_ids) for r in responses), time.perf_counter() - start


def streams(
    client, pool, n: int, k: int | None, max_tokens: int, per_stream: int, offset: int, texts: list[str]
) -> tuple[int, float]:
    """(tokens, seconds) of ``n`` client streams, each sending ``per_stream`` streamed requests back to back
    (trtspec bench's steady-load lengths, ``budget``): the server keeps about ``n`` requests in flight and admits each one as another
    leaves, as under a steady load. In lockstep groups (``group``) every request of a group starts and, without
    speculation, ends together: its prompts prefill as one batch and no slot waits on another, which a load of
    independent clients does not give and speculation, ending requests at different rounds, does not keep."""

    def one_stream(stream: int) -> int:
        tokens = 0
        for r in range(per_stream):
            index = offset + stream * per_stream + r
            text = texts[index % len(texts)]
            tokens += len(client.generate(text, budget(max_tokens, index), k, stream=True).token_ids)
        return tokens

    start = time.perf_counter()
    total = sum(pool.map(one_stream, range(n)))
    return total, time.perf_counter() - start


def measure(client, pool, n: int, k: int | None, args, offset: int = 0) -> tuple[int, float]:
    """One pass of a point under ``--load``."""
    if args.load == "streams":
        return streams(
            client, pool, n, k, args.max_tokens, args.per_stream, offset * n * args.per_stream, args.texts
        )
    return group(client, pool, n, k, args.max_tokens, offset, args.texts)


def chosen_at(server, client, pool, n: int, args) -> tuple[dict | None, int]:
    """The server's account of batch ``n``'s last K choice, and how many unmeasured groups it took. A batch size
    has one only once all ``n`` requests of a group met in a round; where none did (a first request ended before
    the last arrived), up to two more adaptive groups, after the measured ones, give it one."""
    extra = 0
    while (chosen := adaptive_metrics(server).get(str(n))) is None and extra < 2:
        group(client, pool, n, None, args.max_tokens, extra, args.texts)
        extra += 1
    return chosen, extra


def adaptive_metrics(server) -> dict[str, dict]:
    """The server's trtspec_adaptive_* series: {batch: {"k": ..., ..., "rounds": {K: count}}}."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        text = response.read().decode()
    out: dict[str, dict] = {}
    for match in re.finditer(r"^trtspec_adaptive_(\w+)\{([^}]*)\} (\S+)$", text, re.M):
        name, labels, value = (
            match.group(1),
            dict(re.findall(r'(\w+)="([^"]*)"', match.group(2))),
            match.group(3),
        )
        entry = out.setdefault(labels["batch"], {"rounds": {}})
        if name == "rounds_total":
            entry["rounds"][int(labels["k"])] = float(value)
        else:
            entry[name] = float(value)
    return out


def pooled_rate(samples: list[tuple[int, float]]) -> float:
    """A point's tokens/s over its passes: all its tokens over all its seconds (each point runs as many passes,
    so each is as likely to meet a busy one)."""
    return sum(t for t, _ in samples) / sum(s for _, s in samples)


def paired_ratios(passes: dict) -> dict:
    """Per pinned point, the median over passes of adaptive's tokens/s over that point's in the same pass
    (validate.bench.paired_median: the passes run the points back to back, so a pair shares the machine's
    state)."""
    return {
        point: paired_median(passes[ADAPTIVE], values)
        for point, values in passes.items()
        if point != ADAPTIVE
    }


def paired_intervals(passes: dict) -> dict:
    """Per pinned point, paired_ratios' bootstrap interval (validate.bench.paired_interval: 6 passes or more)."""
    return {
        point: interval
        for point, values in passes.items()
        if point != ADAPTIVE and (interval := paired_interval(passes[ADAPTIVE], values)) is not None
    }


def load_steps(client, pool, server, args) -> list[dict]:
    """Step 1 of the module docstring: one row per concurrency."""
    points = [ADAPTIVE, *args.ks]
    rows = []
    for n in args.concurrency:
        first = measure(client, pool, n, None, args)
        samples: dict = {p: [] for p in points}
        orders = balanced_orders(len(points))
        for rep in range(1 if args.short else args.repeats):
            for point in (points[i] for i in orders[rep % len(orders)]):
                samples[point].append(
                    measure(client, pool, n, None if point == ADAPTIVE else point, args, rep)
                )
        passes = {p: [tokens / seconds for tokens, seconds in v] for p, v in samples.items()}
        best = {p: pooled_rate(v) for p, v in samples.items()}
        chosen, extra = chosen_at(server, client, pool, n, args)
        pinned = {p: v for p, v in best.items() if p != ADAPTIVE}
        paired = paired_ratios(passes)
        rows.append(
            {
                "concurrency": n,
                "tokens_per_s": {str(p): round(v, 1) for p, v in best.items()},
                "adaptive_first_group_tokens_per_s": round(first[0] / first[1], 1),
                "adaptive_vs_best_pinned": round(best[ADAPTIVE] / max(pinned.values()), 3),
                "adaptive_vs_target_only": round(best[ADAPTIVE] / pinned[0], 3) if 0 in pinned else None,
                "paired_vs_pinned": {str(p): round(r, 3) for p, r in paired.items() if r is not None},
                "paired_interval_vs_pinned": {
                    str(p): [round(v, 3) for v in interval]
                    for p, interval in paired_intervals(passes).items()
                },
                "passes": {str(p): [round(v, 1) for v in values] for p, values in passes.items()},
                "chosen": chosen,
                "chosen_after_extra_groups": extra,
            }
        )
    return rows


def after_jump(client, pool, k: int | None, args) -> list[tuple[int, float]]:
    """Step 2 of the module docstring on a server that has served nothing yet: 4 single requests, then the
    groups of ``--jump`` at once, all with K ``k`` (None: left to the server); (tokens, seconds) per group."""
    for i in range(4):
        group(client, pool, 1, k, args.max_tokens, i, args.texts)
    return [
        group(client, pool, args.jump, k, args.max_tokens, i, args.texts)
        for i in range(1 if args.short else 3)
    ]


def jump(recipe, tmp: Path, pool, args) -> dict:
    """Adaptive after the jump against pinned target-only after the same jump, each on a fresh server of its own:
    a first group at the new load also pays what any server's first time there costs (its clients' connections,
    the first batch of that size), so it is compared with target-only's first group, not with a warm one."""
    from trtspec.validate.triton_client import TritonClient

    runs = {}
    for name, k in (("jump", None), ("jump-target-only", 0)):
        with served(recipe, tmp, name) as server:
            client = TritonClient(server.ports.grpc_url, "grpc")
            runs[k] = after_jump(client, pool, k, args)
            if k is None:
                chosen, extra = chosen_at(server, client, pool, args.jump, args)
    adaptive, target_only = ([t / s for t, s in runs[k]] for k in (None, 0))
    return {
        "streams": args.jump,
        "adaptive_tokens_per_s": round(max(adaptive), 1),
        "target_only_tokens_per_s": round(max(target_only), 1),
        "adaptive_vs_target_only": round(max(adaptive) / max(target_only), 3),
        "first_group_vs_target_only": round(adaptive[0] / target_only[0], 3),
        "groups_vs_target_only": [round(a / t, 3) for a, t in zip(adaptive, target_only, strict=True)],
        "chosen": chosen,
        "chosen_after_extra_groups": extra,
    }


@contextlib.contextmanager
def served(recipe, tmp: Path, name: str):
    from trtspec.triton_repo.deploy import deploy
    from trtspec.triton_repo.server import Ports, TritonServer, free_ports

    repo = deploy(recipe, "torch", tmp / name).repo
    stop_like_serve()
    server = TritonServer(repo, Ports(*free_ports(3)), tmp / f"{name}.log")
    server.start(600)
    try:
        yield server
    finally:
        server.stop()


def raw_texts(name: str) -> list[str]:
    """The raw prompts of a shipped set or a JSONL file (chat lines need the target's template: not sent here)."""
    from trtspec.validate.prompts import load_prompts

    prompts = load_prompts(name)
    if any(p.messages for p in prompts):
        raise SystemExit(f"{name}: chat prompts are not supported here; give raw prompts")
    return [p.text for p in prompts]


def main(argv=None) -> None:
    from trtspec.recipe import load_recipe
    from trtspec.validate.triton_client import TritonClient

    args = parse_args(argv)
    args.texts = PROMPTS if args.prompts is None else raw_texts(args.prompts)
    recipe = load_recipe(args.recipe)
    # Requests that give no K get the repository's default: adaptive only where the recipe pins none.
    speculative = recipe.speculative.model_copy(update={"num_draft_tokens": None})
    recipe = recipe.model_copy(update={"speculative": speculative})
    if args.cpu_threads is not None:
        triton = recipe.triton.model_copy(update={"cpu_threads": args.cpu_threads})
        recipe = recipe.model_copy(update={"triton": triton})
    widest = max([*args.concurrency, args.jump])
    result = {
        "recipe": recipe.name,
        "cpu": cpu_name(),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "load": args.load,
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench_served_adaptive.") as tmp,
        ThreadPoolExecutor(widest) as pool,
    ):
        with served(recipe, Path(tmp), "steps") as server:
            client = TritonClient(server.ports.grpc_url, "grpc")
            group(client, pool, widest, 0, 4)  # every client thread connects
            result["steps"] = load_steps(client, pool, server, args)
        if args.jump:
            result["jump"] = jump(recipe, Path(tmp), pool, args)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"recipe {result['recipe']}, {result['cpu']}, {args.max_tokens} new tokens, pooled over {args.repeats} passes, "
        f"load {args.load}"
    )
    for row in result["steps"]:
        chosen = row["chosen"] or {}
        print(
            f"  {row['concurrency']:>2} streams: {row['tokens_per_s']}  adaptive / best pinned "
            f"{row['adaptive_vs_best_pinned']:.2f}, / target-only {row['adaptive_vs_target_only']}; "
            f"paired medians / pinned {row['paired_vs_pinned']} "
            f"({INTERVAL_LEVEL:.0%} intervals {row['paired_interval_vs_pinned']}); "
            f"chose K {chosen.get('k')} (acceptance {chosen.get('acceptance', 0):.2f}, round cost "
            f"{chosen.get('round_cost', 0):.2f}, expected speedup {chosen.get('expected_speedup', 0):.2f}), "
            f"rounds by K {chosen.get('rounds')}"
        )
    if "jump" in result:
        print(f"  jump 1 -> {args.jump}: {result['jump']}")


if __name__ == "__main__":
    run_main(main)
