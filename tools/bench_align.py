#!/usr/bin/env python
"""Benchmark of ``trtspec align`` on the demo target: does a draft trained on other text gain acceptance within
the budget, and does the shipped demo draft keep its own?

    python tools/bench_align.py                        # 15-minute budget for the misaligned draft, 5 for the demo draft
    python tools/bench_align.py --budget 3 --demo-budget 1 --prompts 60   # a quick look

1. A misaligned draft: the demo draft's config, trained from nothing for ``--prose-steps`` steps on English prose
   (pydoc's topic texts from CPython's standard library), not on the code the demo target continues.
2. Prompts: windows of CPython standard-library code (the demo target's kind of text), as a JSONL file.
3. ``run_align`` (what ``trtspec align`` runs) on each draft with ``--budget`` / ``--demo-budget`` minutes; the
   report gives greedy acceptance at every K before and after on the held-out prompts.
4. End to end: SpeculativeEngine at K=4 (greedy, 64 new tokens) on held-out prompts with the target alone, each
   draft before and after, side by side in one run (rounds alternate, best of ``--repeats``), in tokens/s and
   as ratios to target-only.

Writes nothing outside ``--work`` (default a temp folder) and prints one summary.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import yaml
from cli_common import cpu_name, run_main

from trtspec.builders.align import AlignSpec, run_align
from trtspec.builders.align_data import DataSpec, is_held_out
from trtspec.builders.align_report import selection_line
from trtspec.builders.align_work import StageProgress
from trtspec.recipe import DEMO_DIR, DEMO_RECIPE

STDLIB = Path(sysconfig.get_paths()["stdlib"])
EXCLUDED = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def misaligned_draft(out: Path, steps: int, seed: int = 0) -> Path:
    """The demo draft's shape trained on prose for ``steps`` steps of 8 x 128 tokens. A draft an earlier run with
    the same ``--work`` finished with the same settings is used again; anything else in ``out`` is this tool's own
    and is written anew."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    settings = {"steps": steps, "seed": seed}
    done = out / "bench_align.json"  # written last: the draft beside it is whole
    if done.is_file() and json.loads(done.read_text()) == settings:
        log(f"misaligned draft: reusing {out} ({steps} steps on prose)")
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in (DEMO_DIR / "draft").iterdir():
        if not path.name.endswith(".safetensors"):
            shutil.copy2(path, out / path.name)
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    prose = (STDLIB / "pydoc_data" / "topics.py").read_text(encoding="utf-8")
    stream = torch.tensor(tokenizer.backend_tokenizer.encode(prose).ids)
    torch.manual_seed(seed)
    draft = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).float()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        starts = torch.randint(0, len(stream) - 129, (8,), generator=gen).tolist()
        batch = torch.stack([stream[s : s + 129] for s in starts])
        loss = draft(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"misaligned draft on prose: step {step + 1}/{steps}, loss {loss.item():.3f}")
    draft.half().save_pretrained(out, safe_serialization=True)
    done.write_text(json.dumps(settings))
    return out


def code_prompts(path: Path, count: int, seed: int = 0) -> Path:
    """``count`` windows of ~200 characters, each from a different standard-library module, starting at a line."""
    files = sorted(p for p in STDLIB.rglob("*.py") if not EXCLUDED.intersection(p.relative_to(STDLIB).parts))
    rng = random.Random(seed)
    rng.shuffle(files)
    lines = []
    for file in files:
        if len(lines) == count:
            break
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 2000:
            continue
        start = text.index("\n", rng.randrange(0, len(text) - 400)) + 1
        lines.append(
            json.dumps({"id": file.relative_to(STDLIB).as_posix(), "prompt": text[start : start + 200]})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def recipe_for(path: Path, name: str, draft: Path) -> Path:
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    data["name"], data["draft"]["model"] = name, str(draft)
    path.write_text(yaml.safe_dump(data))
    return path


def end_to_end(prompts: list[list[int]], drafts: dict[str, Path | None], repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` tokens/s per system at K=4, greedy, 64 new tokens, prompts one by one; systems
    alternate within each repeat so machine load falls on all of them alike."""
    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.engines.sampling import SamplingParams

    engines = {
        name: SpeculativeEngine.from_pretrained(DEMO_DIR / "target", draft, max_draft_len=8, max_seq_len=512)
        for name, draft in drafts.items()
    }
    best = dict.fromkeys(engines, 0.0)
    for _ in range(repeats):
        for name, engine in engines.items():
            k = 4 if drafts[name] is not None else None
            params = SamplingParams(max_new_tokens=64, num_draft_tokens=k, ignore_eos=True)
            began, tokens = time.perf_counter(), 0
            for prompt in prompts:
                tokens += len(engine.generate([prompt], params)[0].token_ids)
            best[name] = max(best[name], tokens / (time.perf_counter() - began))
    return best


def progress_log() -> StageProgress:
    """run_align's ``on_progress``: a log line at each stage's start and at every tenth of it, not per prompt."""
    shown: dict[str, int] = {}

    def on_progress(stage: str, description: str, completed: float, total: float) -> None:
        tenth = int(10 * completed / total) if total else 10
        if shown.get(stage) != tenth:
            shown[stage] = tenth
            log(f"  {description}: {completed:g}/{total:g}")

    return on_progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--budget", type=float, default=15.0, help="minutes for the misaligned draft (0: skip)"
    )
    parser.add_argument(
        "--demo-budget", type=float, default=5.0, help="minutes for the shipped demo draft (0: skip)"
    )
    parser.add_argument("--prompts", type=int, default=240)
    parser.add_argument("--prose-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_align-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work folder {work}; {cpu_name()}, {args.threads} torch threads")
    prompts = code_prompts(work / "prompts.jsonl", args.prompts)
    runs = {}
    if args.budget > 0:
        runs["misaligned"] = (misaligned_draft(work / "misaligned", args.prose_steps), args.budget)
    if args.demo_budget > 0:
        runs["demo"] = (DEMO_DIR / "draft", args.demo_budget)
    results = {}
    for name, (draft, budget) in runs.items():
        log(f"align {name} draft, budget {budget:g} min")
        spec = AlignSpec(
            recipe=str(recipe_for(work / f"{name}.yaml", name, draft)),
            prompts=prompts,
            out=work / f"{name}-aligned",
            work_dir=work / f"{name}-work",
            budget_min=budget,
            data=DataSpec(max_new_tokens=64, held_out=0.1),
        )
        began = time.perf_counter()
        result = run_align(spec, on_progress=progress_log())
        results[name] = (draft, result, time.perf_counter() - began)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    lines = prompts.read_text().splitlines()
    held = [json.loads(line)["prompt"] for i, line in enumerate(lines) if is_held_out(i, 0.1)]
    held_ids = [tokenizer(p).input_ids for p in held[:8]]
    systems: dict[str, Path | None] = {"target only": None}
    for name, (draft, result, _) in results.items():
        systems[f"{name} before"], systems[f"{name} after"] = draft, result.out
    log(f"end to end: {len(held_ids)} held-out prompts x 64 tokens, K=4, best of {args.repeats}")
    speed = end_to_end(held_ids, systems, args.repeats)

    print(
        "\n| draft | budget | wall s | steps | train prompts | K=4 accept before | after | gain | acc len before | after | tok/s before | after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (_, result, wall) in results.items():
        k4 = result.report["per_k"][4]
        b, a = k4["before"], k4["after"]
        record = result.record
        print(
            f"| {name} | {record['settings']['budget_min']:g} min | {wall:.0f} | {record['steps']} | "
            f"{record['prompts_used']['training']} | {b['acceptance_rate']:.3f} | {a['acceptance_rate']:.3f} | "
            f"{a['acceptance_rate'] - b['acceptance_rate']:+.3f} | {b['mean_accepted_length']:.2f} | "
            f"{a['mean_accepted_length']:.2f} | {speed[f'{name} before']:.1f} | {speed[f'{name} after']:.1f} |"
        )
    base = speed["target only"]
    print(
        f"\n{cpu_name()}, {args.threads} torch threads: target only {base:.1f} tokens/s; "
        + ", ".join(f"{n} {v / base:.2f}x" for n, v in speed.items() if v != base)
    )
    for name, (_, result, _) in results.items():
        print(
            f"{name}: {result.report['held_out_prompts']} held-out prompts; {selection_line(result.report)}"
        )
    return 0


if __name__ == "__main__":
    run_main(main)
