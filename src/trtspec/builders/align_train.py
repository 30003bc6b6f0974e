"""The training of ``trtspec align``: token-level distillation of the draft on the stored target logits.

All weights, float32, AdamW with a short warm-up, on the shards of the work folder in a seeded order, forward KL
(``kl``, the default: mass-covering, what sampled verification rewards) or total variation (``tv``, the bound on
rejection sampling's acceptance). The loss is torch.nn.functional.kl_div's (batchmean) on stored logits, not
nvidia-modelopt's distillation API, which runs the teacher online each step (here the target's logits are computed
once and reused every epoch) and exists only on the pinned stack. Bounded by the budget (``align_work.Clock``); a
checkpoint every CHECKPOINT_S seconds and on Ctrl-C.

Every ESTIMATE_S seconds (less often where measuring would take more than ESTIMATE_SHARE of the time) and at the
end, greedy acceptance at K on the validation prompts picks the weights to keep (``Best``): those of the best
evaluation, the source draft's own included (step 0), which a trained step must beat by more than two standard
errors of its acceptance there (a gain within the noise of a few validation prompts is as likely a loss on other
prompts), so a draft that training does not clearly improve is written unchanged rather than worse.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtspec.builders import align_data, align_report
from trtspec.builders.align_work import Clock, StageProgress, WorkDir

CHECKPOINT_S = 30.0
ESTIMATE_S = 20.0  # validation acceptance is measured this often (the weights written are the best's) ...
ESTIMATE_SHARE = 0.2  # ... or less often, so that measuring takes at most this share of the training time


def distill_loss(draft_logits: torch.Tensor, values: torch.Tensor, indices, kind: str) -> torch.Tensor:
    """Mean over positions of KL(target_probs || draft_probs) or TV(target_probs, draft_probs).

    draft_logits [n, V]; values [n, k] target logits (k = the target's rows for whole rows, else the top-k,
    renormalised: the target's mass outside them is dropped); indices [n, k] vocabulary ids or None.

    A padded-vocabulary pair (align_data.shared_rows) compares over the ids both models have: the target's mass on
    rows the draft lacks is dropped as outside the top-k is, and the draft's on rows the target lacks meets target
    probability 0."""
    draft_logprobs = F.log_softmax(draft_logits.float(), -1)
    rows, values = draft_logprobs.shape[-1], values.float()
    if indices is None:
        width = min(rows, values.shape[-1])
        values, draft_logprobs, kept = values[:, :width], draft_logprobs[:, :width], None
    else:
        kept = indices.long() < rows
        values = values.masked_fill(~kept, float("-inf"))
        draft_logprobs = draft_logprobs.gather(-1, indices.long().clamp(max=rows - 1))
    target_logprobs = F.log_softmax(values, -1)
    target_probs = target_logprobs.exp()
    if kind == "kl":  # as F.kl_div(reduction="batchmean"), with 0 where the target's probability is 0
        gap = target_logprobs.masked_fill(target_probs == 0, 0.0) - draft_logprobs
        return (target_probs * gap).sum(-1).mean()
    draft_probs = draft_logprobs.exp() if kept is None else draft_logprobs.exp().masked_fill(~kept, 0.0)
    # The draft's mass outside the kept ids meets target probability 0 there.
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


def remaining_batches(work: WorkDir, spec, position: dict):
    """(epoch, shard position, batch position, batch) after ``position``, to the end of ``spec.max_epochs``."""
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


def resume(work: WorkDir, draft, optimizer, validation: list[dict], k: int) -> tuple[dict, Best]:
    """The position and best evaluation to go on from: checkpoint.pt's (weights and optimizer restored), else the
    start, where the source draft's validation acceptance is the one to beat."""
    ckpt = work.load_torch("checkpoint.pt")
    if ckpt is not None:
        draft.load_state_dict(ckpt["draft"])
        optimizer.load_state_dict(ckpt["optimizer"])
        return ckpt["position"], Best(**ckpt["best"])
    source = validation_acceptance(draft, validation, k)
    position = {"epoch": 0, "shard_pos": 0, "batch_pos": -1, "step": 0, "loss": None}
    return position, Best(0, source, margin=noise_margin(source, validation, k), source=source)


def step(draft, optimizer, batch: list[dict], spec, pad_id: int, done: int) -> float:
    """One AdamW step on ``batch`` (the learning rate warms up over the first 20 steps; ``done`` steps so far,
    gradients clipped to norm 1); returns its loss."""
    for group in optimizer.param_groups:
        group["lr"] = spec.lr * min(1.0, (done + 1) / 20)
    loss = batch_loss(draft, batch, spec.loss, pad_id)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def train(
    spec,
    work: WorkDir,
    clock: Clock,
    draft,
    validation: list[dict],
    k: int,
    pad_id: int,
    on_progress: StageProgress,
) -> tuple[dict, Best, float | None]:
    """AdamW on the shards until the budget or max_epochs ends, resuming from checkpoint.pt; the validation
    acceptance measured every ESTIMATE_S seconds (at most ESTIMATE_SHARE of the time) and after the last step.
    Returns the last position, the best evaluation (the source draft's at step 0) and the last step's validation
    acceptance. ``spec``: align.AlignSpec (its loss, lr, batch_size, max_epochs and data.seed); ``on_progress``
    gets stage "train", the budget seconds spent of the budget, after each step."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    position, best = resume(work, draft, optimizer, validation, k)
    draft.train()
    shown = "" if best.acceptance is None else f" validation accept@{k}: best {best.acceptance:.3f}"
    total = max(clock.budget_s, 1.0)
    on_progress("train", "train", min(clock.spent(), clock.budget_s), total)
    last_ckpt = time.perf_counter()
    next_estimate = last_ckpt + ESTIMATE_S
    loss_avg = position["loss"]
    try:
        for epoch, shard_pos, batch_pos, batch in remaining_batches(work, spec, position):
            if clock.left() <= 0:
                break
            loss = step(draft, optimizer, batch, spec, pad_id, position["step"])
            loss_avg = loss if loss_avg is None else 0.9 * loss_avg + 0.1 * loss
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
            on_progress(
                "train",
                f"train: epoch {epoch + 1} step {position['step']} {spec.loss} loss {loss_avg:.4f}{shown}",
                min(clock.spent(), clock.budget_s),
                total,
            )
        else:
            position = {**position, "epoch": spec.max_epochs, "shard_pos": 0, "batch_pos": -1}
    except KeyboardInterrupt:
        save_checkpoint(work, clock, draft, optimizer, position, best)
        raise
    # Kept until the output is written: a failure there (a full disk, a file a user added to --out) does not
    # lose the training, whose rerun resumes here and writes.
    save_checkpoint(work, clock, draft, optimizer, position, best)
    # Training is over even where it stopped before the budget (--epochs): the stage's bar stops its clock here,
    # not when the output is written.
    on_progress(
        "train", f"train: {position['step']} steps {spec.loss} loss {loss_avg or 0:.4f}{shown}", total, total
    )
    last = validation_acceptance(draft, validation, k)
    best.consider(draft, position["step"], last)
    return position, best, last


def save_checkpoint(work: WorkDir, clock: Clock, draft, optimizer, position: dict, best: Best) -> None:
    work.save_torch("checkpoint.pt", {"draft": draft.state_dict(), "optimizer": optimizer.state_dict(),
                                      "position": position, "best": vars(best)})  # fmt: skip
    clock.record()
    work.save_state()
