"""``trtspec align``: distil the draft toward the target on the user's prompts; a new draft folder and a report.

    result = run_align(AlignSpec(recipe="demo", prompts=Path("prompts.jsonl"), budget_min=15), console)

1. Refuse early: a pair ``check`` fails, an empty or malformed prompt file, a draft whose AdamW training plus the
   target do not fit in memory, a budget below one prompt's data and MIN_STEPS training steps (timed here).
2. Data (builders/align_data.py): the target's continuations streamed into shards in the work folder.
3. Training: token-level distillation of the draft (all weights, float32, AdamW) on the stored target logits,
   forward KL (``kl``, the default: mass-covering, what sampled verification rewards) or total variation (``tv``,
   the bound on rejection sampling's acceptance). The loss is torch.nn.functional.kl_div on stored logits, not
   nvidia-modelopt's distillation API, which runs the teacher online each step (here the target's logits are
   computed once and reused every epoch) and exists only on the pinned stack. Bounded by the budget (data and
   training together, across interruptions); a checkpoint every CHECKPOINT_S seconds and on Ctrl-C.
   Every ESTIMATE_S seconds (less often where measuring would take more than ESTIMATE_SHARE of the time) and at
   the end, greedy acceptance at K on (up to VALIDATION_MAX) validation prompts; the weights written
   are those of the best evaluation, the source draft's own included (step 0), which a trained step must beat by
   more than two standard errors of its acceptance there (a gain within the noise of a few validation prompts is
   as likely a loss on other prompts), so a draft that training does not clearly improve is written unchanged
   rather than worse (the choice is in align.json and report.md).
4. Output, written whole (outputs.atomic_dir): the draft's weights (safetensors, its dtype), its config and
   tokenizer files copied unchanged, ``align.json`` (how it was made, the report), ``recipe.yaml`` (the recipe
   with draft.model pointing here), ``report.md`` and ``acceptance.png``. The source draft is only read. The work
   folder is removed after success.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from trtspec.builders import align_data, align_report, environment
from trtspec.builders.align_data import DataSpec
from trtspec.core.errors import CheckFailed, ModelError, OutputError, TrtspecError
from trtspec.core.model_dir import count_parameters, load_hf_model, load_tokenizer
from trtspec.outputs import atomic_dir, check_output_dir, write_file_atomic
from trtspec.recipe import Recipe, load_recipe, recipe_copy

MARKER = "align.json"
MIN_STEPS = 20  # a budget must leave at least this many training steps after one prompt's data
CHECKPOINT_S = 30.0
ESTIMATE_S = 20.0  # validation acceptance is measured this often (the weights written are the best's) ...
ESTIMATE_SHARE = 0.2  # ... or less often, so that measuring takes at most this share of the training time
VALIDATION_MAX = 64  # validation prompts measured (the first ones; more add time, not much precision)
DATA_SHARE = 0.5  # training prompts stop being generated past this share of the budget


@dataclass(frozen=True)
class AlignSpec:
    recipe: str = "demo"
    prompts: Path = Path("prompts.jsonl")
    out: Path | None = None  # default align/<name>/draft
    work_dir: Path | None = None  # default align/<name>/work
    budget_min: float = 15.0
    device: str = "cpu"
    loss: str = "kl"
    lr: float = (
        1e-4  # measured: 5e-4 cost the shipped demo draft 0.074 acceptance at K=4, 1e-4 kept it (README)
    )
    batch_size: int = 8
    max_epochs: int = 8
    data: DataSpec = field(default_factory=DataSpec)


def default_dirs(recipe: Recipe) -> tuple[Path, Path]:
    return Path("align") / recipe.name / "draft", Path("align") / recipe.name / "work"


def run_key(spec: AlignSpec, recipe: Recipe) -> str:
    """What a work folder belongs to: the recipe, the prompt file's bytes and every data/training setting."""
    digest = hashlib.sha256()
    with open(spec.prompts, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    settings = {
        k: v for k, v in asdict(spec).items() if k not in ("out", "work_dir", "budget_min", "prompts")
    }
    digest.update(json.dumps([recipe.digest(), settings], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------- refusals


def refuse_failed_check(recipe: Recipe) -> None:
    from trtspec.builders.preflight import run_checks

    failed = [r for r in run_checks(recipe).results if r.status == "fail"]
    if failed:
        first = failed[0]
        raise CheckFailed(
            f"{recipe.source or recipe.name}: check refuses the pair ({first.name}: {first.message}); fix it "
            f"first (trtspec check {recipe.source or recipe.name})"
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


# ---------------------------------------------------------------- the work folder


class WorkDir:
    """state.json (what is done), data/shard-*.pt (training examples), held_out.pt, validation.pt,
    checkpoint.pt."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self.state = {"key": key, "prompts_done": 0, "shards": [], "data_done": False, "seconds": 0.0}
        state_file = self.path / "state.json"
        if state_file.is_file():
            saved = json.loads(state_file.read_text())
            if saved.get("key") != key:
                raise OutputError(
                    f"--work-dir {self.path} holds an align run of other inputs or settings; remove it to "
                    "start again, or pass another --work-dir"
                )
            self.state = saved
        elif self.path.exists() and any(self.path.iterdir()):
            raise OutputError(
                f"--work-dir {self.path} exists and is not an align work folder; choose another"
            )

    @property
    def resumed(self) -> bool:
        return self.state["prompts_done"] > 0 or bool(self.state["shards"])

    def save_state(self) -> None:
        write_file_atomic(self.path / "state.json", json.dumps(self.state, indent=2))

    def save_torch(self, name: str, payload) -> None:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        write_file_atomic(self.path / name, buffer.getvalue())

    def load_torch(self, name: str):
        path = self.path / name
        return torch.load(path, weights_only=False) if path.is_file() else None


class Clock:
    """Seconds spent on the run, across interruptions (the work state's ``seconds`` plus this process's)."""

    def __init__(self, work: WorkDir, budget_s: float):
        self.work, self.budget_s = work, budget_s
        self.base, self.began = work.state["seconds"], time.perf_counter()

    def spent(self) -> float:
        return self.base + time.perf_counter() - self.began

    def left(self) -> float:
        return self.budget_s - self.spent()

    def record(self) -> None:
        self.work.state["seconds"] = self.spent()


# ---------------------------------------------------------------- data


def generate_data(
    spec: AlignSpec, work: WorkDir, clock: Clock, target, draft, tokenizer, eos, progress
) -> None:
    """Stream the prompts into training shards, the held-out and the validation sets, resuming after the saved
    shards."""
    state = work.state
    kept = {name: work.load_torch(f"{name}.pt") or [] for name in ("held_out", "validation")}
    pending: list[dict] = []
    task = progress.add_task("data", total=state["total_prompts"], completed=state["prompts_done"])
    for index, prompt in enumerate(align_data.iter_prompts(spec.prompts)):
        if index < state["prompts_done"]:
            continue
        ids = align_data.prompt_ids(tokenizer, prompt, spec.data)
        split = align_data.prompt_split(index, spec.data.held_out, spec.data.validation)
        if split != "train":
            kept[split].append(align_data.held_out_example(target, ids, spec.data))
        elif clock.spent() < DATA_SHARE * clock.budget_s:
            generator = torch.Generator().manual_seed(spec.data.seed * 1_000_003 + index)
            pending += align_data.training_examples(target, draft, ids, spec.data, eos, generator)
            state["training_prompts"] = state.get("training_prompts", 0) + 1
        progress.update(task, completed=index + 1, description=f"data: {len(pending)} pending examples")
        if len(pending) >= align_data.SHARD_SIZE:
            flush(work, clock, pending, kept, index + 1)
            pending = []
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
    for split, examples in kept.items():
        work.save_torch(f"{split}.pt", examples)
    state["prompts_done"] = prompts_done
    clock.record()
    work.save_state()


# ---------------------------------------------------------------- training


def distill_loss(draft_logits: torch.Tensor, values: torch.Tensor, indices, kind: str) -> torch.Tensor:
    """Mean over positions of KL(target_probs || draft_probs) or TV(target_probs, draft_probs).

    draft_logits [n, V]; values [n, k] target logits (k = V for whole rows, else the top-k, renormalised: the
    target's mass outside them is dropped); indices [n, k] vocabulary ids or None."""
    draft_logprobs = F.log_softmax(draft_logits.float(), -1)
    if indices is not None:
        draft_logprobs = draft_logprobs.gather(-1, indices.long())
    target_logprobs = F.log_softmax(values.float(), -1)
    if kind == "kl":
        return F.kl_div(draft_logprobs, target_logprobs, log_target=True, reduction="batchmean")
    target_probs, draft_probs = target_logprobs.exp(), draft_logprobs.exp()
    # The draft's mass outside the kept ids meets target probability 0 there (0 for whole rows).
    outside = 1.0 - draft_probs.sum(-1)
    return 0.5 * ((target_probs - draft_probs).abs().sum(-1) + outside.clamp_min(0)).mean()


def batch_loss(draft, batch: list[dict], kind: str, pad_id: int) -> torch.Tensor:
    device = next(draft.parameters()).device
    longest = max(len(ex["ids"]) for ex in batch)
    ids = torch.full((len(batch), longest - 1), pad_id, dtype=torch.long)
    for row, ex in enumerate(batch):
        ids[row, : len(ex["ids"]) - 1] = ex["ids"][:-1]
    logits = draft(
        input_ids=ids.to(device)
    ).logits  # [B, longest - 1, V]; right padding never reaches kept rows
    rows = [logits[row, ex["start"] - 1 : len(ex["ids"]) - 1] for row, ex in enumerate(batch)]
    values = torch.cat([ex["values"] for ex in batch]).to(device)
    indices = None if batch[0]["indices"] is None else torch.cat([ex["indices"] for ex in batch]).to(device)
    return distill_loss(torch.cat(rows), values, indices, kind)


def epoch_batches(work: WorkDir, epoch: int, batch_size: int, seed: int):
    """(shard position, batch position, batch) of one epoch: shards and examples in a seeded order, one shard
    in memory at a time."""
    order = list(range(len(work.state["shards"])))
    random.Random(seed * 7919 + epoch).shuffle(order)
    for shard_pos, shard in enumerate(order):
        examples = align_data.load_shard(work.path / work.state["shards"][shard]["name"])
        random.Random(seed * 104729 + epoch * 1000 + shard).shuffle(examples)
        for batch_pos, first in enumerate(range(0, len(examples), batch_size)):
            yield shard_pos, batch_pos, examples[first : first + batch_size]


def remaining_batches(work: WorkDir, spec: AlignSpec, position: dict):
    """(epoch, shard position, batch position, batch) after ``position``, to the end of max_epochs."""
    done = (position["epoch"], position["shard_pos"], position["batch_pos"])
    for epoch in range(position["epoch"], spec.max_epochs):
        for shard_pos, batch_pos, batch in epoch_batches(work, epoch, spec.batch_size, spec.data.seed):
            if (epoch, shard_pos, batch_pos) > done:
                yield epoch, shard_pos, batch_pos, batch


def validation_acceptance(draft, examples: list[dict], k: int) -> float | None:
    """Greedy acceptance at K on the validation continuations (None without any)."""
    if not examples:
        return None
    draft.eval()
    matches = align_report.draft_matches(draft, examples)
    draft.train()
    return align_report.side(matches, k, 1.0)["acceptance_rate"]


def noise_margin(acceptance: float | None, examples: list[dict], k: int) -> float:
    """Two standard errors of an acceptance rate over the validation continuations' draft positions at K (about
    len * K / (K + 1) of them drafted): what a trained step must gain over the source draft to be kept."""
    if acceptance is None:
        return 0.0
    drafted = max(1.0, sum(len(ex["ids"]) - ex["start"] for ex in examples) * k / (k + 1))
    return 2.0 * math.sqrt(acceptance * (1.0 - acceptance) / drafted)


@dataclass
class Best:
    """The evaluation with the highest validation acceptance so far (the first of equals): its step and a copy of
    its weights; step 0 is the source draft (``weights`` None: reload it), which a trained step must beat by
    ``margin``."""

    step: int
    acceptance: float | None
    weights: dict | None = None
    margin: float = 0.0
    source: float | None = None  # the source draft's validation acceptance (checkpointed with the rest)

    def consider(self, draft, step: int, acceptance: float | None) -> None:
        if acceptance is None or self.acceptance is None:
            return
        if acceptance > self.acceptance + (self.margin if self.step == 0 else 0.0):
            self.step, self.acceptance = step, acceptance
            self.weights = {name: t.detach().to("cpu", copy=True) for name, t in draft.state_dict().items()}


def train(
    spec: AlignSpec, work: WorkDir, clock: Clock, draft, validation: list[dict], k: int, pad_id: int, progress
) -> tuple[dict, Best, float | None]:
    """AdamW on the shards until the budget or max_epochs ends, resuming from checkpoint.pt; the validation
    acceptance measured every ESTIMATE_S seconds (at most ESTIMATE_SHARE of the time) and after the last step.
    Returns the last position, the best evaluation (the source draft's at step 0) and the last step's validation
    acceptance."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = work.load_torch("checkpoint.pt")
    position = {"epoch": 0, "shard_pos": 0, "batch_pos": -1, "step": 0, "loss": None}
    if ckpt is not None:
        draft.load_state_dict(ckpt["draft"])
        optimizer.load_state_dict(ckpt["optimizer"])
        position, best = ckpt["position"], Best(**ckpt["best"])
    else:
        source = validation_acceptance(draft, validation, k)
        best = Best(0, source, margin=noise_margin(source, validation, k), source=source)
    draft.train()
    shown = "" if best.acceptance is None else f" validation accept@{k}: best {best.acceptance:.3f}"
    task = progress.add_task(
        "train", total=max(clock.budget_s, 1.0), completed=min(clock.spent(), clock.budget_s)
    )
    last_ckpt = time.perf_counter()
    next_estimate = last_ckpt + ESTIMATE_S
    loss_avg = position["loss"]
    try:
        for epoch, shard_pos, batch_pos, batch in remaining_batches(work, spec, position):
            if clock.left() <= 0:
                break
            warmup = min(1.0, (position["step"] + 1) / 20)
            for group in optimizer.param_groups:
                group["lr"] = spec.lr * warmup
            loss = batch_loss(draft, batch, spec.loss, pad_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            optimizer.step()
            loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
            position = {"epoch": epoch, "shard_pos": shard_pos, "batch_pos": batch_pos,
                        "step": position["step"] + 1, "loss": loss_avg}  # fmt: skip
            now = time.perf_counter()
            if now > next_estimate and validation:
                accept = validation_acceptance(draft, validation, k)
                took = time.perf_counter() - now
                next_estimate = time.perf_counter() + max(ESTIMATE_S, took / ESTIMATE_SHARE)
                best.consider(draft, position["step"], accept)
                shown = f" validation accept@{k} {accept:.3f} (best {best.acceptance:.3f})"
            if now - last_ckpt > CHECKPOINT_S:
                save_checkpoint(work, clock, draft, optimizer, position, best)
                last_ckpt = now
            progress.update(
                task,
                completed=min(clock.spent(), clock.budget_s),
                description=f"train: epoch {epoch + 1} step {position['step']} {spec.loss} loss "
                f"{loss_avg:.4f}{shown}",
            )
        else:
            position = {**position, "epoch": spec.max_epochs, "shard_pos": 0, "batch_pos": -1}
    except KeyboardInterrupt:
        save_checkpoint(work, clock, draft, optimizer, position, best)
        raise
    last = validation_acceptance(draft, validation, k)
    best.consider(draft, position["step"], last)
    return position, best, last


def save_checkpoint(work: WorkDir, clock: Clock, draft, optimizer, position: dict, best: Best) -> None:
    work.save_torch("checkpoint.pt", {"draft": draft.state_dict(), "optimizer": optimizer.state_dict(),
                                      "position": position, "best": vars(best)})  # fmt: skip
    clock.record()
    work.save_state()


# ---------------------------------------------------------------- output


def weights_dtype(model_dir: Path) -> str:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return dtype if dtype in ("float32", "float16", "bfloat16") else "float32"


def write_draft(draft, source: Path, tmp: Path) -> None:
    """The trained weights in the source draft's dtype and its other files copied byte for byte (config and
    tokenizer unchanged; its weight files are not copied)."""
    scratch = tmp / ".weights"
    dtype = getattr(torch, weights_dtype(source))
    draft.to(dtype).save_pretrained(scratch, safe_serialization=True)
    draft.float()
    umask = os.umask(0)
    os.umask(umask)
    for path in scratch.iterdir():
        if path.name.endswith(".safetensors") or path.name == "model.safetensors.index.json":
            path.chmod(0o666 & ~umask)  # a plain file's mode, not the private one of a temp file
            path.rename(tmp / path.name)
    shutil.rmtree(scratch)
    for path in Path(source).iterdir():
        weights = path.suffix in (".safetensors", ".bin", ".pt", ".pth") or path.name.endswith(".index.json")
        if path.is_file() and not weights:
            shutil.copy2(path, tmp / path.name)


# ---------------------------------------------------------------- the run


@dataclass
class AlignResult:
    out: Path
    record: dict
    report: dict


def run_align(spec: AlignSpec, console=None) -> AlignResult:
    """The whole command (module docstring); ``console`` a rich Console for progress, or None."""
    recipe = load_recipe(spec.recipe)
    default_out, default_work = default_dirs(recipe)
    out = check_output_dir(spec.out or default_out, MARKER, "an aligned draft", "--out")
    work_path = Path(spec.work_dir or default_work).absolute()
    if work_path == out or out in work_path.parents:
        raise OutputError(f"--work-dir {work_path} is inside --out {out}; choose a folder beside it")
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but torch sees no GPU; use --device cpu")
    refuse_failed_check(recipe)
    counts = align_data.count_prompts(spec.prompts, spec.data.held_out, spec.data.validation)
    refuse_no_memory(recipe, spec.device)
    work = WorkDir(work_path, run_key(spec, recipe))
    work.state.setdefault("total_prompts", sum(counts.values()))
    began = time.perf_counter()

    tokenizer = load_tokenizer(recipe.target.model, recipe.target.trust_remote_code)
    target_dtype = "float32" if spec.device == "cpu" else recipe.target.dtype
    target = load_hf_model(recipe.target.model, target_dtype, recipe.target.trust_remote_code, "the target")
    target = target.to(spec.device).eval().requires_grad_(False)
    draft = load_hf_model(recipe.draft.model, "float32", recipe.draft.trust_remote_code, "the draft")
    draft = draft.to(spec.device).eval()
    if not work.resumed:
        refuse_small_budget(spec, target, draft, min(128, spec.data.max_new_tokens + 32))
    work.path.mkdir(parents=True, exist_ok=True)
    work.save_state()
    clock = Clock(work, spec.budget_min * 60)
    eos = set(align_data_eos(recipe, tokenizer))
    k_show = recipe.speculative.default_num_draft_tokens
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=console is None, transient=False) as progress:
        if not work.state["data_done"]:
            generate_data(spec, work, clock, target, draft, tokenizer, eos, progress)
        held = work.load_torch("held_out.pt")
        if (
            "before" not in work.state
        ):  # the source draft, measured once (a resumed run holds trained weights)
            work.state["before"] = align_report.draft_matches(draft, held)
            work.save_state()
        if not work.state["shards"]:
            raise OutputError(f"{spec.prompts}: the budget ended before any training data was generated")
        validation = (work.load_torch("validation.pt") or [])[:VALIDATION_MAX]
        position, best, last = train(spec, work, clock, draft, validation, k_show, pad_id, progress)
    if position["step"] == 0:
        raise CheckFailed(
            f"--budget {spec.budget_min:g}: the budget ended before the first training step (data for "
            f"{work.state.get('training_prompts', 0)} prompts is kept in {work.path}); run again with a larger "
            "--budget to resume"
        )
    if validation and best.step == 0:  # training never beat the source draft there: written unchanged
        draft = load_hf_model(recipe.draft.model, "float32", recipe.draft.trust_remote_code, "the draft")
        draft = draft.to(spec.device)
    elif validation and best.step != position["step"]:
        draft.load_state_dict(best.weights)
    draft.eval()
    clock.record()
    after = align_report.draft_matches(draft, held)
    report = align_report.acceptance_report(
        work.state["before"], after, recipe.speculative.max_draft_len, recipe.speculative.draft_cost_ratio
    )
    report["selection"] = {
        "num_draft_tokens": k_show,
        "validation_prompts": len(validation),
        "steps": position["step"],
        "selected_step": best.step if validation else position["step"],
        "margin": best.margin,
        "validation_acceptance": {"source": best.source, "last": last,
                                  "selected": best.acceptance},
    }  # fmt: skip
    record = {
        "source_draft": str(recipe.draft.model),
        "target": str(recipe.target.model),
        "recipe": str(recipe.source or recipe.name),
        "prompts": str(spec.prompts),
        "prompts_used": {
            "training": work.state.get("training_prompts", 0),
            "training_in_file": counts["train"],
            "held_out": counts["held_out"],
            "validation": counts["validation"],
        },
        "training_examples": sum(s["examples"] for s in work.state["shards"]),
        "settings": {k: v for k, v in asdict(spec).items() if k not in ("out", "work_dir")},
        "steps": position["step"],
        "epochs": round(position["epoch"] + (position["shard_pos"] / max(len(work.state["shards"]), 1)), 2),
        "final_loss": position["loss"],
        "seconds": {"budgeted": clock.spent(), "this_process": time.perf_counter() - began},
        "versions": environment.package_versions(),
        "report": report,
    }
    write_output(recipe, draft, out, record, report)
    shutil.rmtree(work.path, ignore_errors=True)
    return AlignResult(out, record, report)


def align_data_eos(recipe: Recipe, tokenizer) -> tuple[int, ...]:
    from trtspec.core.model_dir import end_ids

    return end_ids(recipe.target.model, tokenizer)


def write_output(recipe: Recipe, draft, out: Path, record: dict, report: dict) -> None:
    with atomic_dir(out) as tmp:
        write_draft(draft, recipe.draft.model, tmp)
        for name in ("recipe.yaml", MARKER, "report.md", "acceptance.png"):
            if (tmp / name).exists():
                raise ModelError(
                    f"{recipe.draft.model}: the draft folder holds {name}, which align writes; rename it"
                )
        changes = {"draft.model": str(out.resolve()), "name": f"{recipe.name}-aligned"[:64]}
        header = f"# {recipe.source} with the draft trained by trtspec align (align.json says how).\n"
        text = recipe_copy(recipe.source, changes, out / "recipe.yaml", header, check_paths=False)
        (tmp / "recipe.yaml").write_text(text, encoding="utf-8")
        align_report.write_plot(report, tmp / "acceptance.png")
        (tmp / "report.md").write_text(
            align_report.report_markdown(report, "acceptance.png"), encoding="utf-8"
        )
        (tmp / MARKER).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
