#!/usr/bin/env python
"""End-to-end speed through Triton vs the in-process PyTorch engine, side by side in one run (not a test).

One recipe (default: the shipped demo pair) is deployed with the torch runtime into a temporary repository and
served by a real tritonserver on free loopback ports. Two measurements, each alternating the two paths:
  - batch 1: for each prompt, greedy, the same K and new-token budget: in-process,
    trtspec.engines.SpeculativeEngine with the dtype / device / slots / max_seq_len and, on cpu, the torch threads
    (triton.cpu_threads) the torch runtime's entry model uses, so the only difference is Triton (gRPC, the python
    model, its loop and sending threads); then a streaming gRPC request to tensorrt_llm_bls
    (trtspec.validate.triton_client.TritonClient). Goals: tokens/s ratio >= 0.95, and Triton's streaming time to first
    token within one round (compared with the engine's first round, which includes the prompt's prefill).
  - concurrency N (default 8): the in-process engine generating N prompts as one batch, against N concurrent
    streaming gRPC requests that join Triton's running batch (in-flight batching), sent by N client threads
    that keep their connections (after one warm-up round). Goal: tokens/s ratio >= 0.90.

    .venv/bin/python tools/bench_triton.py                       # the demo pair, 5 prompts x 128 tokens, 8 streams
    .venv/bin/python tools/bench_triton.py --recipe builders/my_pair.yaml --num-draft-tokens 6 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# The prompts of tools/bench_engine.py, so both benchmarks measure the same text (this folder is on sys.path
# when a tool runs as a script).
from bench_engine import PROMPTS
from cli_common import cpu_name, run_main, stop_like_serve, threads_or_auto


@dataclass
class Sample:
    """One prompt measured both ways. Seconds; tokens = generated tokens of the engine (exact ids)."""

    tokens: int
    engine_s: float
    engine_ttft_s: float
    engine_rounds: int
    triton_s: float
    triton_ttft_s: float
    triton_tokens: int
    same_text: bool


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="demo", help="recipe file or 'demo' (the shipped pair)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-draft-tokens", type=int, default=None, help="K [default: the recipe's]")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per prompt (after one warm-up)")
    parser.add_argument("--load-timeout", type=float, default=600.0, help="seconds for the server to load")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="streams of the concurrent measurement (0: skip it; at most the recipe's limits.max_batch_size)",
    )
    parser.add_argument(
        "--cpu-threads",
        type=threads_or_auto,
        default=None,
        help="triton.cpu_threads for both paths: a number or auto [default: the recipe's]",
    )
    return parser


def recipe_for(args, parser: argparse.ArgumentParser):
    """The recipe with ``--cpu-threads`` applied; a ``--concurrency`` the engine's batch cannot hold is refused
    here, before a server is started and a model is loaded."""
    from trtspec.recipe import load_recipe

    recipe = load_recipe(args.recipe)
    if args.cpu_threads is not None:
        triton = recipe.triton.model_copy(update={"cpu_threads": args.cpu_threads})
        recipe = recipe.model_copy(update={"triton": triton})
    if not 0 <= args.concurrency <= recipe.limits.max_batch_size:
        parser.error(
            f"--concurrency {args.concurrency}: the in-process engine generates the streams as one batch, and "
            f"recipe {recipe.name} allows 0..{recipe.limits.max_batch_size} (limits.max_batch_size)"
        )
    return recipe


def load_engine(recipe):
    """The in-process engine configured like the torch runtime's entry model (values.in_process_values): the
    pair as EngineSystem.from_recipe loads it (K policy, proposer, prompt lookup, a draft's own tokenizer, no
    draft where the recipe has none) at the served length, which leaves room for a round's verification past a
    request's limits.max_seq_len."""
    import torch

    from trtspec.engines.engine import served_max_seq_len
    from trtspec.recipe import torch_runtime_dtype
    from trtspec.triton_repo.models.cores import cpu_threads
    from trtspec.validate.systems import EngineSystem

    if recipe.triton.device == "cpu":
        torch.set_num_threads(cpu_threads(str(recipe.triton.cpu_threads)))
    served = served_max_seq_len(recipe.limits.max_seq_len, recipe.speculative.max_draft_len)
    limits = recipe.limits.model_copy(update={"max_seq_len": served})
    system = EngineSystem.from_recipe(
        recipe.model_copy(update={"limits": limits}),
        device=recipe.triton.device,
        dtype=torch_runtime_dtype(recipe.triton, recipe.target),
    )
    return system.engine


def measure(engine, client, prompt: str, max_new: int, k: int) -> Sample:
    """One greedy generation of ``prompt`` in-process, then the same through Triton (streaming gRPC)."""
    from trtspec.engines.sampling import SamplingParams

    ids = engine.tokenizer(prompt)["input_ids"]
    (result,) = engine.generate([ids], SamplingParams(max_new_tokens=max_new, num_draft_tokens=k))
    text = engine.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    response = client.generate(prompt, max_new, k, stream=True)
    same = response.text == text
    # Triton answers text: when it equals the engine's, the ids are the engine's (exact); otherwise re-tokenise.
    triton_tokens = (
        len(result.token_ids)
        if same
        else len(engine.tokenizer(response.text, add_special_tokens=False).input_ids)
    )
    return Sample(
        tokens=len(result.token_ids),
        engine_s=result.stats.elapsed_s,
        engine_ttft_s=result.stats.time_to_first_token_s or result.stats.elapsed_s,
        engine_rounds=result.stats.target_forwards,
        triton_s=response.elapsed_s,
        triton_ttft_s=response.pieces[0][0] if response.pieces else response.elapsed_s,
        triton_tokens=triton_tokens,
        same_text=same,
    )


def report(samples: list[Sample], header: str) -> None:
    print(header)
    print(
        f"{'prompt':>6} {'tokens':>6} {'engine tok/s':>12} {'triton tok/s':>12} {'ratio':>6} {'same text':>9} "
        f"{'engine TTFT':>11} {'triton TTFT':>11} {'round':>8}"
    )
    for i, s in enumerate(samples):
        e_tps, t_tps = s.tokens / s.engine_s, s.triton_tokens / s.triton_s
        print(
            f"{i:6d} {s.tokens:6d} {e_tps:12.1f} {t_tps:12.1f} {t_tps / e_tps:6.2f} {str(s.same_text):>9} "
            f"{s.engine_ttft_s * 1e3:9.1f}ms {s.triton_ttft_s * 1e3:9.1f}ms {s.engine_s / s.engine_rounds * 1e3:6.1f}ms"
        )
    engine_tps = sum(s.tokens for s in samples) / sum(s.engine_s for s in samples)
    triton_tps = sum(s.triton_tokens for s in samples) / sum(s.triton_s for s in samples)
    ratio = triton_tps / engine_tps
    mean_round = sum(s.engine_s for s in samples) / sum(s.engine_rounds for s in samples)
    triton_ttft = statistics.median(s.triton_ttft_s for s in samples)
    engine_ttft = statistics.median(s.engine_ttft_s for s in samples)
    print(
        f"\ntokens/s: in-process engine {engine_tps:.1f}, Triton {triton_tps:.1f}; Triton / engine = {ratio:.2f} "
        f"(goal >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"
    )
    print(
        f"streaming TTFT (median): Triton {triton_ttft * 1e3:.1f} ms; one speculative round of the engine: "
        f"first round (prefill + round, the engine's TTFT) {engine_ttft * 1e3:.1f} ms, mean round "
        f"{mean_round * 1e3:.1f} ms; Triton TTFT / first round = {triton_ttft / engine_ttft:.2f} "
        f"(goal <= 1: {'met' if triton_ttft <= engine_ttft else 'NOT met'})"
    )
    print(f"outputs identical (greedy): {sum(s.same_text for s in samples)}/{len(samples)}")


@dataclass
class Concurrent:
    """N prompts at once: the engine's one batch against N concurrent Triton streams. Seconds, exact tokens."""

    tokens: int
    engine_s: float
    triton_s: float
    triton_tokens: int
    same_texts: int


def measure_concurrent(engine, client, pool, prompts: list[str], max_new: int, k: int) -> Concurrent:
    """The engine generates ``prompts`` as one batch; then Triton gets them as concurrent streaming requests from
    ``pool``'s threads (each keeps its connection across requests, as a serving client does)."""
    import time

    from trtspec.engines.sampling import SamplingParams

    ids = [engine.tokenizer(p)["input_ids"] for p in prompts]
    start = time.perf_counter()
    results = engine.generate(ids, SamplingParams(max_new_tokens=max_new, num_draft_tokens=k))
    engine_s = time.perf_counter() - start
    texts = [engine.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]
    start = time.perf_counter()
    responses = list(pool.map(lambda p: client.generate(p, max_new, k, stream=True), prompts))
    triton_s = time.perf_counter() - start
    same = [r.text == t for r, t in zip(responses, texts, strict=True)]
    triton_tokens = sum(
        len(res.token_ids) if ok else len(engine.tokenizer(r.text, add_special_tokens=False).input_ids)
        for res, r, ok in zip(results, responses, same, strict=True)
    )
    return Concurrent(sum(len(r.token_ids) for r in results), engine_s, triton_s, triton_tokens, sum(same))


def report_concurrent(runs: list[Concurrent], n: int) -> None:
    print(f"\n{n} concurrent streams (Triton, in-flight batching) vs the engine's batch of {n}:")
    for i, r in enumerate(runs):
        e_tps, t_tps = r.tokens / r.engine_s, r.triton_tokens / r.triton_s
        print(
            f"  run {i}: engine {e_tps:.1f} tok/s ({r.engine_s:.2f} s), Triton {t_tps:.1f} tok/s "
            f"({r.triton_s:.2f} s), ratio {t_tps / e_tps:.2f}, same texts {r.same_texts}/{n}"
        )
    engine_tps = sum(r.tokens for r in runs) / sum(r.engine_s for r in runs)
    triton_tps = sum(r.triton_tokens for r in runs) / sum(r.triton_s for r in runs)
    ratio = triton_tps / engine_tps
    print(
        f"tokens/s: engine batch {engine_tps:.1f}, Triton streams {triton_tps:.1f}; Triton / engine = {ratio:.2f} "
        f"(goal >= 0.90: {'met' if ratio >= 0.90 else 'NOT met'})"
    )


def main(argv=None) -> None:
    import torch

    from trtspec.recipe import torch_runtime_dtype
    from trtspec.triton_repo.deploy import deploy
    from trtspec.triton_repo.server import Ports, TritonServer, free_ports
    from trtspec.validate.triton_client import TritonClient

    cli = build_parser()
    args = cli.parse_args(argv)
    recipe = recipe_for(args, cli)
    k = recipe.speculative.num_draft_tokens if args.num_draft_tokens is None else args.num_draft_tokens
    prompts = PROMPTS[: args.prompts]
    many = [PROMPTS[i % len(PROMPTS)] for i in range(args.concurrency)]
    with tempfile.TemporaryDirectory(prefix="bench_triton.") as tmp, contextlib.ExitStack() as stack:
        repo = deploy(recipe, "torch", Path(tmp) / "repo").repo
        stop_like_serve()
        server = TritonServer(repo, Ports(*free_ports(3)), Path(tmp) / "server.log")
        server.start(args.load_timeout)
        stack.callback(server.stop)
        client = TritonClient(server.ports.grpc_url, "grpc")
        engine = load_engine(recipe)
        measure(engine, client, prompts[0], 8, k)  # warm-up of both paths
        samples = [
            measure(engine, client, p, args.max_new_tokens, k) for p in prompts for _ in range(args.repeats)
        ]
        pool = stack.enter_context(ThreadPoolExecutor(max(len(many), 1)))
        if many:  # warm-up: every client thread connects
            measure_concurrent(engine, client, pool, many, 8, k)
        concurrent = [
            measure_concurrent(engine, client, pool, many, args.max_new_tokens, k)
            for _ in range(args.repeats if many else 0)
        ]
    draft = recipe.draft.model if recipe.draft is not None else f"none ({recipe.speculative.proposer})"
    report(
        samples,
        f"recipe {recipe.name}: target {recipe.target.model}, draft {draft}; {recipe.triton.device} "
        f"{torch_runtime_dtype(recipe.triton, recipe.target)}, {cpu_name()}, torch threads "
        f"{torch.get_num_threads()} (in-process and in Triton's entry model); K={'adaptive' if k is None else k}; {len(prompts)} prompts x {args.repeats} x {args.max_new_tokens} new "
        "tokens; batch 1, greedy, Triton over streaming gRPC\n",
    )
    if concurrent:
        report_concurrent(concurrent, len(many))


if __name__ == "__main__":
    run_main(main)
