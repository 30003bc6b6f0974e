"""``trtspec align``: distil the draft toward the target on the user's prompts; a new draft folder and a report.

    result = run_align(AlignSpec(recipe="demo", prompts=Path("prompts.jsonl"), budget_min=15), on_progress)

The work folder (builders/align_work.py) keeps what is done, so an interrupted run resumes where it stopped.

1. Refuse early: a pair ``check`` fails, an empty or malformed prompt file, a draft whose AdamW training plus the
   target do not fit in memory, a budget below one prompt's data and MIN_STEPS training steps (timed here).
2. Data (builders/align_data.py): the target's continuations streamed into shards in the work folder.
3. Training (builders/align_train.py): the draft distilled on the stored target logits within the budget (data and
   training together, across interruptions), the weights of its best evaluation on (up to VALIDATION_MAX)
   validation prompts kept, the source draft's own included, so a draft that training does not clearly improve is
   written unchanged rather than worse (the choice is in align.json and report.md).
4. Output, written whole (outputs.write_output_dir): the draft's weights (safetensors, its dtype), its config and
   tokenizer files copied unchanged, ``align.json`` (how it was made, the report), ``recipe.yaml`` (the recipe
   with draft.model pointing here), ``report.md`` and ``acceptance.png``. The source draft is only read. The work
   folder is removed after success.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trtspec.builders import align_data, align_report, environment
from trtspec.builders.align_data import DataSpec
from trtspec.builders.align_train import Best, train
from trtspec.builders.align_work import Clock, StageProgress, WorkDir, no_progress
from trtspec.core.errors import CheckFailed, ModelError, OutputError, RecipeError, TrtspecError
from trtspec.core.model_dir import count_parameters, load_hf_model, load_tokenizer, require_device
from trtspec.outputs import EDIT_RECORD, check_output_dir, folder_bytes, hash_file, write_output_dir
from trtspec.recipe import Recipe, load_recipe, recipe_copy

MARKER = "align.json"
ALIGNED_SUFFIX = "-aligned"  # the aligned recipe's name: the source's and this
MIN_STEPS = 20  # a budget must leave at least this many training steps after one prompt's data
VALIDATION_MAX = 64  # validation prompts measured (the first ones; more add time, not much precision)
DATA_SHARE = 0.5  # training and held-out prompts stop being generated past this share of the budget
HELD_OUT_MIN = 16  # held-out prompts generated whatever the budget (the report's before/after needs some)
# What align writes into its output beside the draft's own files: an aligned draft aligned again gets new ones
OWN_FILES = ("recipe.yaml", MARKER, "report.md", "acceptance.png", EDIT_RECORD)


@dataclass(frozen=True)
class AlignSpec:
    recipe: str = "demo"
    prompts: Path = Path("prompts.jsonl")
    out: Path | None = None  # default align/<name>/draft
    work_dir: Path | None = None  # default align/<name>/work
    budget_min: float = 15.0
    device: str = "cpu"
    loss: str = "kl"
    # measured: 5e-4 cost the shipped demo draft 0.074 acceptance at K=4, 1e-4 kept it (docs/benchmarks.md)
    lr: float = 1e-4
    batch_size: int = 8
    max_epochs: int = 8
    data: DataSpec = field(default_factory=DataSpec)
    # replace files a user edited or added in an earlier output (outputs.check_output_dir)
    force: bool = False


def aligned_name(name: str) -> str:
    """The aligned recipe's name: the suffix always survives the 64-character limit, and the name is never the
    source's (a realignment's default folders, default_dirs, would be the source's own): where cutting to the
    limit gives the source's name back, a short hash of it tells them apart."""
    aligned = name[: 64 - len(ALIGNED_SUFFIX)] + ALIGNED_SUFFIX
    if aligned == name:
        tag = hashlib.sha256(name.encode()).hexdigest()[:4]
        aligned = f"{name[: 64 - len(ALIGNED_SUFFIX) - 5]}-{tag}{ALIGNED_SUFFIX}"
    return aligned


def default_dirs(recipe: Recipe) -> tuple[Path, Path]:
    return Path("align") / recipe.name / "draft", Path("align") / recipe.name / "work"


def run_key(spec: AlignSpec, recipe: Recipe) -> str:
    """What a work folder belongs to: the recipe, the prompt file's bytes and every data/training setting."""
    digest = hash_file(hashlib.sha256(), spec.prompts)
    settings = {
        k: v
        for k, v in asdict(spec).items()
        if k not in ("out", "work_dir", "budget_min", "prompts", "force")
    }
    models = [model_fingerprint(Path(m.model)) for m in (recipe.target, recipe.draft) if m is not None]
    digest.update(json.dumps([recipe.digest(), settings, models], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def model_fingerprint(model_dir: Path) -> list:
    """Name, size and modification time of a model folder's files: the recipe names the folder, and a folder
    whose checkpoint was replaced must not resume data and training made from the old one."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file()) if model_dir.is_dir() else []
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


# ---------------------------------------------------------------- refusals


def refuse_out_over_models(out: Path, recipe: Recipe) -> None:
    """--out is replaced whole: never the draft it reads (an earlier aligned draft is a valid output folder), the
    target, or a folder holding or inside either (compared where links lead)."""
    real_out = out.resolve()
    for role, spec in (("draft", recipe.draft), ("target", recipe.target)):
        model = Path(spec.model).resolve()
        if real_out == model or real_out in model.parents or model in real_out.parents:
            raise OutputError(
                f"--out {out} is or holds the {role} model this run reads ({spec.model}); choose another --out"
            )


def refuse_failed_check(recipe: Recipe) -> None:
    from trtspec.builders.preflight import run_checks

    failed = [r for r in run_checks(recipe).results if r.status == "fail"]
    if failed:
        first = failed[0]
        raise CheckFailed(
            f"{recipe.source or recipe.name}: check refuses the pair ({first.name}: {first.message}); fix it "
            f"first (trtspec check {recipe.source or recipe.name})"
        )


def refuse_two_tokenizers(recipe: Recipe) -> None:
    """Distillation matches the draft's next-token distribution to the target's at each position, which needs both
    over one vocabulary and one tokenization: a draft with another tokenizer (heterogeneous_vocab) cannot be
    aligned this way."""
    from trtspec.core.tokenizers import tokenizer_difference

    if not recipe.speculative.heterogeneous_vocab:
        return  # check refused a pair whose tokenizers differ already
    target = load_tokenizer(Path(recipe.target.model), recipe.target.trust_remote_code)
    draft = load_tokenizer(Path(recipe.draft.model), recipe.draft.trust_remote_code)
    if tokenizer_difference(target, draft) is not None:
        raise CheckFailed(
            f"{recipe.source or recipe.name}: align distils the draft on the target's token distributions, which "
            "needs one tokenizer, and this draft has its own (speculative.heterogeneous_vocab); train it on the "
            "target's text instead (tools/train_demo_pair.py --help shows how the demo's was)"
        )


def training_memory_bytes(recipe: Recipe) -> tuple[int, int]:
    """(needed, draft parameters): the draft in float32 with gradients, AdamW's two moments and a copy of the best
    weights (20 bytes per parameter) beside the target's float32 weights; activations of a small batch are left
    out."""
    draft = count_parameters(recipe.draft.model) or 0
    target = count_parameters(recipe.target.model) or 0
    return 20 * draft + 4 * target, draft


def refuse_no_memory(recipe: Recipe, device: str) -> None:
    needed, draft = training_memory_bytes(recipe)
    free = environment.available_bytes(device)
    if free is not None and needed > 0.9 * free:
        raise ModelError(
            f"{recipe.draft.model}: training the draft ({draft / 1e6:.1f} M parameters, AdamW) beside the target "
            f"needs about {needed / 2**30:.2f} GiB, {free / 2**30:.2f} GiB of {device} memory is free; use a "
            "smaller draft or a device with more memory"
        )


def refuse_small_budget(spec: AlignSpec, target, draft, example_len: int) -> None:
    """Time one decoding step of the target and one training step of the draft here, now; refuse a budget that
    cannot cover one prompt's data and MIN_STEPS steps."""
    device = next(draft.parameters()).device
    ids = torch.zeros(spec.batch_size, example_len, dtype=torch.long, device=device)

    def decode_step() -> None:
        with torch.no_grad():
            target(input_ids=ids[:2, :8])

    def train_step() -> None:
        draft(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        draft.zero_grad(set_to_none=True)

    step_s, train_s = _timed(decode_step), _timed(train_step)
    needed = spec.data.max_new_tokens * step_s * 2 + MIN_STEPS * train_s
    if spec.budget_min * 60 < needed:
        raise TrtspecError(
            f"--budget {spec.budget_min:g}: too small; one prompt's data and {MIN_STEPS} training steps take about "
            f"{needed:.0f} s here; give at least {math.ceil(needed / 60 * 10) / 10:g} minutes"
        )


def _timed(call) -> float:
    """Seconds of the second of two calls (the first pays one-time setup)."""
    call()
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


# ---------------------------------------------------------------- data


def generate_data(
    spec: AlignSpec, work: WorkDir, clock: Clock, target, draft, tokenizer, eos, on_progress: StageProgress
) -> None:
    """Stream the prompts into training shards, the held-out and the validation sets, resuming after the saved
    shards; ``on_progress`` gets stage "data", the prompts done of all of them, after each prompt."""
    state = work.state
    kept = {name: work.load_torch(f"{name}.pt") or [] for name in ("held_out", "validation")}
    pending: list[dict] = []
    rows = align_data.shared_rows(target, draft)
    on_progress("data", "data", state["prompts_done"], state["total_prompts"])
    splits = align_data.prompt_splits(spec.prompts, spec.data.held_out, spec.data.validation)
    done = state["prompts_done"]
    try:
        for index, (prompt, split, _) in enumerate(splits):
            if index < done:
                continue
            ids = align_data.prompt_ids(tokenizer, prompt, spec.data)
            in_share = clock.spent() < DATA_SHARE * clock.budget_s
            if split != "train":
                # validation: only the first VALIDATION_MAX are ever measured; held-out: past the data share, the
                # few the report needs
                room = VALIDATION_MAX if split == "validation" else (math.inf if in_share else HELD_OUT_MIN)
                if len(kept[split]) < room:
                    kept[split].append(align_data.held_out_example(target, ids, spec.data, rows))
            elif in_share:
                generator = torch.Generator().manual_seed(spec.data.seed * 1_000_003 + index)
                pending += align_data.training_examples(target, draft, ids, spec.data, eos, generator, rows)
                state["training_prompts"] = state.get("training_prompts", 0) + 1
            done = index + 1
            on_progress("data", f"data: {len(pending)} pending examples", done, state["total_prompts"])
            if len(pending) >= align_data.SHARD_SIZE:
                flush(work, clock, pending, kept, done)
    except KeyboardInterrupt:
        # the prompts finished since the last shard, and the time they took, count: the budget spans interrupted
        # runs, and past the data share no shard is written until the file ends
        flush(work, clock, pending, kept, done)
        raise
    flush(work, clock, pending, kept, state["total_prompts"])
    state["data_done"] = True
    work.save_state()


def flush(
    work: WorkDir, clock: Clock, pending: list[dict], kept: dict[str, list[dict]], prompts_done: int
) -> None:
    """Save a shard, the held-out and validation sets, then the state that counts them (so a crash between never
    loses data)."""
    state = work.state
    if pending:
        name = f"data/shard-{len(state['shards']):05d}.pt"
        align_data.save_shard(work.path / name, pending)
        state["shards"].append({"name": name, "examples": len(pending)})
        pending.clear()  # recorded: an interrupt before the state is saved must not write them again
    for split, examples in kept.items():
        work.save_torch(f"{split}.pt", examples)
    state["prompts_done"] = prompts_done
    clock.record()
    work.save_state()


# ---------------------------------------------------------------- output


def weights_dtype(model_dir: Path) -> str:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return dtype if dtype in ("float32", "float16", "bfloat16") else "float32"


def write_draft(draft, source: Path, tmp: Path) -> None:
    """The trained weights in the source draft's dtype and its other files copied byte for byte (config and
    tokenizer unchanged; its weight files are not copied, nor an earlier align's own files: OWN_FILES)."""
    scratch = tmp / ".weights"
    dtype = getattr(torch, weights_dtype(source))
    draft.to(dtype).save_pretrained(scratch, safe_serialization=True)
    draft.float()
    for path in scratch.iterdir():
        if path.name.endswith(".safetensors") or path.name == "model.safetensors.index.json":
            path.rename(tmp / path.name)  # outputs.atomic_dir gives them a plain file's mode
    shutil.rmtree(scratch)
    for path in Path(source).iterdir():
        weights = path.suffix in (".safetensors", ".bin", ".pt", ".pth") or path.name.endswith(".index.json")
        if path.is_file() and not weights and path.name not in OWN_FILES:
            shutil.copy2(path, tmp / path.name)


# ---------------------------------------------------------------- the run


@dataclass
class AlignResult:
    out: Path
    record: dict
    report: dict


def run_align(spec: AlignSpec, on_progress: StageProgress | None = None) -> AlignResult:
    """The whole command (module docstring); ``on_progress(stage, description, completed, total)`` is told how
    far data generation and training are (align_work.StageProgress), or nothing is."""
    recipe = load_recipe(spec.recipe)
    if recipe.draft is None:
        raise RecipeError(
            recipe.source or recipe.name,
            "draft",
            "align distils a draft model and this recipe has none (speculative.proposer ngram); add a draft",
        )
    default_out, default_work = default_dirs(recipe)
    out = check_output_dir(spec.out or default_out, MARKER, "an aligned draft", "--out", spec.force)
    # compared and removed where they lead: `w/../w` or a link must not slip past the check or the removal
    given = Path(spec.work_dir or default_work).absolute()
    work_path, real_out = given.resolve(), out.resolve()
    if work_path == real_out or real_out in work_path.parents:
        raise OutputError(f"--work-dir {given} is inside --out {out}; choose a folder beside it")
    if work_path in real_out.parents:  # the work folder is removed once the output is written
        raise OutputError(f"--out {out} is inside --work-dir {given}; choose a folder beside it")
    refuse_out_over_models(out, recipe)
    refuse_own_files(recipe)
    require_device(spec.device)
    refuse_two_tokenizers(recipe)
    refuse_failed_check(recipe)
    counts = align_data.count_prompts(spec.prompts, spec.data.held_out, spec.data.validation)
    tokenizer = load_tokenizer(recipe.target.model, recipe.target.trust_remote_code)
    align_data.check_chat_lines(spec.prompts, tokenizer)
    refuse_no_memory(recipe, spec.device)
    work = WorkDir(work_path, run_key(spec, recipe))
    work.state.setdefault("total_prompts", sum(counts.values()))
    began = time.perf_counter()

    target, draft = load_pair(recipe, spec.device)
    if not work.resumed:
        refuse_small_budget(spec, target, draft, min(128, spec.data.max_new_tokens + 32))
    work.path.mkdir(parents=True, exist_ok=True)
    work.save_state()
    clock = Clock(work, spec.budget_min * 60)
    k_show = recipe.speculative.default_num_draft_tokens
    position, best, last, validation = distil(
        spec, recipe, work, clock, tokenizer, target, draft, on_progress or no_progress
    )
    if validation and best.step == 0:  # training never beat the source draft there: written unchanged
        draft = load_hf_model(recipe.draft.model, "float32", recipe.draft.trust_remote_code, "the draft")
        draft = draft.to(spec.device)
    elif validation and best.step != position["step"]:
        draft.load_state_dict(best.weights)
    draft.eval()
    clock.record()
    held_out = work.load_torch("held_out.pt")
    after = align_report.draft_matches(draft, held_out)
    report = align_report.acceptance_report(
        work.state["before"], after, recipe.speculative.max_draft_len, recipe.speculative.draft_cost_ratio
    )
    report["selection"] = selection(k_show, validation, position, best, last)
    used = {"held_out_used": len(held_out), "validation_used": len(validation)}
    record = run_record(spec, recipe, work, counts | used, position) | {
        "seconds": {"budgeted": clock.spent(), "this_process": time.perf_counter() - began},
        "versions": environment.package_versions(),
        "report": report,
    }
    write_output(recipe, draft, out, record, report, spec.force)
    shutil.rmtree(work.path, ignore_errors=True)
    return AlignResult(out, record, report)


def refuse_own_files(recipe: Recipe) -> None:
    """A draft folder holding a file align writes into its output, of its own (not an earlier align's output,
    whose files are replaced): refused before any work, as align would have to drop it from the new draft."""
    source = Path(recipe.draft.model)
    if (source / MARKER).is_file():
        return
    for name in OWN_FILES:
        if (source / name).exists():
            raise ModelError(
                f"{source}: the draft folder holds {name}, which align writes beside the draft; rename it"
            )


def load_pair(recipe: Recipe, device: str):
    """(target, draft) on ``device``: the target frozen, in float32 on CPU; the draft in float32."""
    target_dtype = "float32" if device == "cpu" else recipe.target.dtype
    target = load_hf_model(recipe.target.model, target_dtype, recipe.target.trust_remote_code, "the target")
    target = target.to(device).eval().requires_grad_(False)
    draft = load_hf_model(recipe.draft.model, "float32", recipe.draft.trust_remote_code, "the draft")
    return target, draft.to(device).eval()


def distil(
    spec: AlignSpec,
    recipe: Recipe,
    work: WorkDir,
    clock: Clock,
    tokenizer,
    target,
    draft,
    on_progress: StageProgress,
) -> tuple[dict, Best, float | None, list[dict]]:
    """Stages 2 and 3, each reported to ``on_progress``: the data (unless done), the source draft's held-out
    matches (once: a resumed run holds trained weights), then the training. Returns ``train``'s position, best
    evaluation and last validation acceptance, and the validation examples."""
    eos = set(align_data_eos(recipe, tokenizer))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if not work.state["data_done"]:
        generate_data(spec, work, clock, target, draft, tokenizer, eos, on_progress)
    if "before" not in work.state:
        work.state["before"] = align_report.draft_matches(draft, work.load_torch("held_out.pt"))
        work.save_state()
    if not work.state["shards"]:
        raise OutputError(f"{spec.prompts}: the budget ended before any training data was generated")
    validation = (work.load_torch("validation.pt") or [])[:VALIDATION_MAX]
    k_show = recipe.speculative.default_num_draft_tokens
    position, best, last = train(spec, work, clock, draft, validation, k_show, pad_id, on_progress)
    if position["step"] == 0:
        raise CheckFailed(
            f"--budget {spec.budget_min:g}: the budget ended before the first training step (data for "
            f"{work.state.get('training_prompts', 0)} prompts is kept in {work.path}); run again with a larger "
            "--budget to resume"
        )
    return position, best, last, validation


def selection(k: int, validation: list[dict], position: dict, best: Best, last: float | None) -> dict:
    """Which weights were written and why: the report's ``selection`` (align_report.selection_line says it)."""
    return {
        "num_draft_tokens": k,
        "validation_prompts": len(validation),
        "steps": position["step"],
        "selected_step": best.step if validation else position["step"],
        "margin": best.margin,
        "validation_acceptance": {"source": best.source, "last": last, "selected": best.acceptance},
    }


def run_record(
    spec: AlignSpec, recipe: Recipe, work: WorkDir, counts: dict[str, int], position: dict
) -> dict:
    """align.json's account of the inputs, settings and training (the caller adds timings, versions, report)."""
    shards = work.state["shards"]
    # every step is one batch and every epoch the same batches: steps over an epoch's batches counts part-epochs
    epoch_steps = sum(math.ceil(s["examples"] / spec.batch_size) for s in shards)
    return {
        "source_draft": str(recipe.draft.model),
        "target": str(recipe.target.model),
        "recipe": str(recipe.source or recipe.name),
        "prompts": str(spec.prompts),
        "prompts_used": {
            "training": work.state.get("training_prompts", 0),
            "training_in_file": counts["train"],
            "held_out": counts.get("held_out_used", counts["held_out"]),
            "held_out_in_file": counts["held_out"],
            "validation": counts.get("validation_used", counts["validation"]),
            "validation_in_file": counts["validation"],
        },
        "training_examples": sum(s["examples"] for s in shards),
        "settings": {k: v for k, v in asdict(spec).items() if k not in ("out", "work_dir")},
        "steps": position["step"],
        "epochs": round(position["step"] / max(epoch_steps, 1), 2),
        "final_loss": position["loss"],
    }


def align_data_eos(recipe: Recipe, tokenizer) -> tuple[int, ...]:
    from trtspec.core.model_dir import end_ids

    return end_ids(recipe.target.model, tokenizer)


def write_output(recipe: Recipe, draft, out: Path, record: dict, report: dict, force: bool = False) -> None:
    """The output folder, whole, with the record of its files that tells a user's later edits from align's: a
    rerun refuses to replace an edited or added file unless ``force`` (the work folder stays for that rerun)."""

    def fill(tmp: Path) -> None:
        write_draft(draft, recipe.draft.model, tmp)
        changes = {"draft.model": str(out.resolve()), "name": aligned_name(recipe.name)}
        header = f"# {recipe.source} with the draft trained by trtspec align (align.json says how).\n"
        text = recipe_copy(recipe.source, changes, out / "recipe.yaml", header, check_paths=False)
        (tmp / "recipe.yaml").write_text(text, encoding="utf-8")
        align_report.write_plot(report, tmp / "acceptance.png")
        (tmp / "report.md").write_text(
            align_report.report_markdown(report, "acceptance.png"), encoding="utf-8"
        )
        (tmp / MARKER).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")

    # about what it writes: the source draft's folder again, with new weights in the same dtype
    need = folder_bytes(recipe.draft.model)
    write_output_dir(out, MARKER, "an aligned draft", "--out", fill, need_bytes=need, force=force)
