#!/usr/bin/env python
"""Train trtspec's shipped demo pair from nothing: a byte-level BPE tokenizer, a Llama target, and a 2-layer Llama
draft distilled from the target's logits, all on CPython's standard-library sources.

    python tools/train_demo_pair.py --gpu --copy-curriculum --device cuda  # the shipped pair (260 s on one H200)
    python tools/train_demo_pair.py --out /tmp/cpu   # the CPU plan (2285 s on 2 threads of a busy shared machine)
    python tools/train_demo_pair.py --smoke --out /tmp/x # ~1-2 min end-to-end check of the pipeline
    python tools/train_demo_pair.py --other-tokenizer-drafts  # issue 28's drafts: draft-othertok, draft-sametok
    python tools/train_demo_pair.py --copy-curriculum --out /tmp/copy  # copy rows in the joint phase (TRAINING.md)

Writes ``<out>/target`` and ``<out>/draft`` (safetensors in fp16, identical tokenizer files, generation_config.json)
via a temp dir inside ``<out>`` renamed on success, and prints what it did plus a final summary: sizes, parameter
counts, held-out perplexities, greedy acceptance at K=2/4 and the draft/target forward-time ratio. Deterministic
given the same Python stdlib (fixed seeds, a file-level train/held-out split by hash of the relative path).

``--out`` defaults to the shipped pair's folder (src/trtspec/assets/demo) only for the two runs that made what ships
there (``--gpu --copy-curriculum``, and ``--other-tokenizer-drafts``; either without --smoke, --set, --budget-s or
--othertok-vocab) and for --evaluate and --copying, which only read it: any other run names its ``--out``, so that
it cannot replace the shipped pair.

Standalone: never imported by the trtspec package.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import random
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # tokenizers' trainer; also keeps BPE training reproducible

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cli_common import cpu_name, run_main  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "src" / "trtspec" / "assets" / "demo"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
# A chat template for a code model: user (and system) messages as docstrings, the assistant's replies as the code
# that follows them, so a chat prompt ends where the model writes code (the shipped chat prompt set runs on it).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + '\\n\\n' }}"
    "{% else %}{{ '\"\"\"' + message['role'] + ': ' + message['content'] + '\"\"\"\\n\\n' }}{% endif %}"
    "{% endfor %}"
)

# Test suites, IDLE's tests, codec tables and pydoc's topic dump are not code a user would prompt with.
EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}
HELDOUT_PERCENT = 5
START = time.perf_counter()


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int


@dataclass(frozen=True)
class Plan:
    vocab_size: int = 1024
    seq_len: int = 128
    max_positions: int = 1024
    target: ModelShape = ModelShape(layers=10, hidden=256, intermediate=688, heads=4, kv_heads=2)
    # Two layers, because continuing code means copying identifiers from the context (an induction head needs a
    # previous-token head in an earlier layer); narrow, to keep its decode step ~0.1 of the target's.
    draft: ModelShape = ModelShape(layers=2, hidden=128, intermediate=384, heads=4, kv_heads=4)
    batch_size: int = 8
    target_steps: int = 2400
    target_lr: float = 2e-3
    draft_steps: int = 600
    draft_lr: float = 2e-3
    distill_temperature: float = 1.0
    # Final draft phase: half of each batch is the finished target's own greedy continuations (what speculative
    # decoding asks the draft to predict), and a cross-entropy on the target's argmax is added to the KL, because
    # greedy acceptance only asks the draft to agree with that argmax.
    onpolicy_sequences: int = 512
    onpolicy_batch: int = 64
    argmax_weight: float = 0.5
    eval_windows: int = 64
    eval_prompts: int = 32
    prompt_len: int = 48
    new_tokens: int = 64
    seed: int = 0
    # The copy curriculum (--copy-curriculum): of each joint batch, ``copy_rows`` rows hold a chunk, a blank line
    # and the chunk again (code from the stream; for the first ``random_copy_share`` of the steps, every other one
    # is random token ids instead, which only the context predicts).
    copy_rows: int = 0
    random_copy_share: float = 0.0
    # The final draft phase's rows (default: the joint phase's): long joint windows on a GPU leave the draft's
    # greedy continuations at the length a request writes.
    draft_seq_len: int = 0
    draft_batch_size: int = 0
    # Held-out windows for perplexity, 128 tokens whatever the training windows, so runs compare.
    eval_seq_len: int = 128
    # Every this many joint steps (0: never), log held-out loss and the repeat losses (``repeat_losses``).
    probe_every: int = 0


# Prompt lookup needs a target that copies from its context; 128-token windows of code did not teach one (see
# TRAINING.md). Windows twice as long (the same tokens per step) leave room for a chunk and its repeat.
COPYING = Plan(seq_len=256, batch_size=4, copy_rows=2, random_copy_share=0.5)

# One GPU (bf16 autocast); with copy rows (GPU_COPYING) the shipped pair's run: windows of 1024 tokens, where copying an
# identifier from hundreds of tokens back pays, 16 k tokens a step, 9 passes over the train tokens (more overfit:
# held-out perplexity rose after ~7 of 16), then 5000 draft steps of 64 x 128 tokens on 4096 continuations.
GPU = Plan(
    seq_len=1024,
    batch_size=16,
    target_steps=1951,
    draft_steps=5000,
    onpolicy_sequences=4096,
    onpolicy_batch=512,
    draft_seq_len=128,
    draft_batch_size=64,
    probe_every=250,
)
# Copy rows from the start (random ids in the first 30 % of steps): the target copies by step ~750 (TRAINING.md).
GPU_COPYING = replace(GPU, copy_rows=4, random_copy_share=0.3)

SMOKE = Plan(
    target=ModelShape(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1),
    draft=ModelShape(layers=1, hidden=32, intermediate=64, heads=2, kv_heads=2),
    vocab_size=512,
    seq_len=64,
    target_steps=20,
    draft_steps=20,
    onpolicy_sequences=8,
    onpolicy_batch=4,
    eval_windows=4,
    eval_prompts=3,
    new_tokens=16,
)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------- corpus and tokenizer


def collect_corpus(stdlib: Path) -> tuple[list[str], list[str]]:
    """(train_texts, heldout_texts): stdlib .py sources split by file on a hash of the relative path."""
    train, heldout = [], []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib).as_posix()
        if EXCLUDED_PARTS.intersection(rel.split("/")) or rel.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        bucket = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100
        (heldout if bucket < HELDOUT_PERCENT else train).append(text)
    return train, heldout


def train_tokenizer(texts: list[str], vocab_size: int, max_positions: int, specials_last: bool = False):
    """Byte-level BPE (GPT-2 style pre-tokenisation) that prepends <s>, as a PreTrainedTokenizerFast.

    The special tokens take ids 0-3, or with ``specials_last`` the last four ids (where GPT-2 and Qwen put
    theirs). BPE trained on one corpus learns the same first merges at any size, so two sizes share ids for the
    texts both hold; moving the specials shifts every other id by four, and then no id means the same text in
    both tokenizers, as across real model families."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) if specials_last else vocab_size,
        special_tokens=[] if specials_last else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if specials_last:
        tok.add_special_tokens(SPECIAL_TOKENS)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_positions,
        chat_template=CHAT_TEMPLATE,
    )


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream ``<s> file </s> <s> file </s> ...``; shape [n_tokens], int64."""
    ids: list[int] = []
    # The backend tokenizer, because the fast wrapper warns about files longer than model_max_length.
    for enc in tokenizer.backend_tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def stream_windows(stream: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """The stream's first ``count`` non-overlapping windows of ``length`` tokens plus the shifted label;
    shape [count, length + 1]."""
    return stream[: count * (length + 1)].view(-1, length + 1)


def sample_batch(stream: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows of the stream; shape [batch_size, seq_len + 1] (inputs plus the shifted labels)."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])


# ---------------------------------------------------------------- models and training


def build_model(shape: ModelShape, plan: Plan, tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=plan.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10% of the peak."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def train_step_losses(loss_fn, batch: torch.Tensor, device: torch.device) -> dict:
    """``loss_fn`` on ``batch`` moved to ``device`` (the models'), in bf16 autocast on a GPU (fp32 master
    weights)."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return loss_fn(batch.to(device, non_blocking=True))


def run_training(phase: str, models: dict, loss_fn, sample, steps: int, seed: int, probe=None, probe_every=0):
    """AdamW over batches from ``sample(generator) -> [B, T+1]``. ``models`` maps a name to (model, peak_lr);
    ``loss_fn(batch[B, T+1])`` returns a loss per name. Each loss only reaches its own model's parameters, so
    summing them trains each model on its own objective in one backward pass. ``probe(step)`` runs every
    ``probe_every`` steps and after the last (never with ``probe_every`` 0)."""
    gen = torch.Generator().manual_seed(seed)
    groups = [{"params": list(m.parameters()), "peak_lr": lr} for m, lr in models.values()]
    device = model_device(next(iter(models.values()))[0])
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda" or None)
    for model, _ in models.values():
        model.train()
    began, running = time.perf_counter(), {}
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, group["peak_lr"])
        losses = train_step_losses(loss_fn, sample(gen), device)
        opt.zero_grad(set_to_none=True)
        sum(losses.values()).backward()
        for model, _ in models.values():
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for name, loss in losses.items():
            running[name] = 0.9 * running.get(name, loss.item()) + 0.1 * loss.item()
        if step % 25 == 0 or step == steps - 1:
            per_step = (time.perf_counter() - began) / (step + 1)
            shown = ", ".join(f"{name} {value:.3f}" for name, value in running.items())
            log(f"{phase} step {step + 1}/{steps}: {shown} ({per_step:.3f} s/step)")
        if probe and probe_every and ((step + 1) % probe_every == 0 or step == steps - 1):
            probe(step + 1)
    for model, _ in models.values():
        model.eval()


def steps_for_budget(models: dict, loss_fn, sample, seconds: float) -> int:
    """How many steps of ``loss_fn`` fit in ``seconds``, timed on the models themselves (3 warm-up steps, the
    median of 10) with an AdamW at lr 0, which leaves every weight as it was: the real run's schedule then
    knows its length from its first step."""
    params = [p for m, _ in models.values() for p in m.parameters()]
    device = model_device(next(iter(models.values()))[0])
    opt = torch.optim.AdamW(params, lr=0.0, fused=device.type == "cuda" or None)
    gen = torch.Generator().manual_seed(12345)
    timings = []
    for _ in range(13):
        sync(device)
        began = time.perf_counter()
        losses = train_step_losses(loss_fn, sample(gen), device)
        opt.zero_grad(set_to_none=True)
        sum(losses.values()).backward()
        opt.step()
        sync(device)
        timings.append(time.perf_counter() - began)
    opt.zero_grad(set_to_none=True)
    per_step = sorted(timings[3:])[5]
    return max(1, int(seconds / per_step))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of predicting ``batch[:, 1:]`` from ``batch[:, :-1]``; batch is [B, T+1]."""
    logits = model(input_ids=batch[:, :-1]).logits  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def distill_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(target_probs || draft_probs) on softened logits [B, T, V], summed over the vocab, mean over tokens."""
    vocab = draft_logits.shape[-1]
    kl = F.kl_div(
        F.log_softmax(draft_logits.reshape(-1, vocab) / temperature, -1),
        F.log_softmax(target_logits.reshape(-1, vocab).detach() / temperature, -1),
        log_target=True,
        reduction="batchmean",
    )
    return kl * temperature**2


def joint_losses(target, draft, temperature: float):
    """Target on next-token loss; the draft follows the target's current logits from the same forward, which
    costs the draft's own forward/backward only (the target forward is the expensive part on CPU)."""

    def loss_fn(batch: torch.Tensor) -> dict:
        target_logits = target(input_ids=batch[:, :-1]).logits  # [B, T, V]
        target_loss = F.cross_entropy(target_logits.flatten(0, 1), batch[:, 1:].flatten())
        draft_logits = draft(input_ids=batch[:, :-1]).logits  # [B, T, V]
        return {"target": target_loss, "draft_kl": distill_loss(draft_logits, target_logits, temperature)}

    return loss_fn


def final_distill_losses(target, draft, temperature: float, argmax_weight: float):
    """The draft alone, distilled from the finished (shipped, fp16-rounded) target: KL to its logits plus
    ``argmax_weight`` x cross-entropy on its argmax (the token a greedy verifier accepts)."""

    def loss_fn(batch: torch.Tensor) -> dict:
        with torch.no_grad():
            target_logits = target(input_ids=batch[:, :-1]).logits  # [B, T, V]
        draft_logits = draft(input_ids=batch[:, :-1]).logits  # [B, T, V]
        argmax_ce = F.cross_entropy(draft_logits.flatten(0, 1), target_logits.argmax(-1).flatten())
        kl = distill_loss(draft_logits, target_logits, temperature)
        return {"draft_kl": kl, "draft_argmax_ce": argmax_weight * argmax_ce}

    return loss_fn


@torch.no_grad()
def target_continuations(target, stream: torch.Tensor, plan: Plan, seed: int) -> torch.Tensor:
    """The target's greedy continuations of ``plan.prompt_len``-token prompts at seeded offsets of the (train)
    stream, each ``seq_len + 1`` tokens long (prompt included, the draft phase's ``seq_len``); shape
    [onpolicy_sequences, seq_len + 1], on CPU."""
    gen = torch.Generator().manual_seed(seed)
    new_tokens = (plan.draft_seq_len or plan.seq_len) + 1 - plan.prompt_len
    pool = []
    for first in range(0, plan.onpolicy_sequences, plan.onpolicy_batch):
        count = min(plan.onpolicy_batch, plan.onpolicy_sequences - first)
        starts = torch.randint(0, len(stream) - plan.prompt_len, (count,), generator=gen).tolist()
        prompts = torch.stack([stream[s : s + plan.prompt_len] for s in starts]).to(model_device(target))
        # Every row has the same length, so no padding and no attention mask are needed.
        out = target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
        pool.append(out.cpu())
    return torch.cat(pool)


def copy_rows(stream: torch.Tensor, count: int, seq_len: int, separator: list[int], random_ids: bool, gen):
    """``count`` rows [count, seq_len + 1]: a chunk of 24 (a smoke run: seq_len / 4) to seq_len / 2 - 8 tokens,
    ``separator``, the chunk again, then the stream where the chunk ended. The chunk is a stream window, or with
    ``random_ids`` uniform ids past the special tokens (nothing but the context predicts them)."""
    rows = []
    for _ in range(count):
        length = int(torch.randint(min(24, seq_len // 4), seq_len // 2 - 8, (1,), generator=gen))
        start = int(torch.randint(0, len(stream) - seq_len - 1, (1,), generator=gen))
        after = stream[start + length : start + seq_len + 1]
        chunk = (
            torch.randint(4, int(stream.max()) + 1, (length,), generator=gen)
            if random_ids
            else stream[start : start + length]
        )
        row = torch.cat([chunk, torch.tensor(separator), chunk, after])
        rows.append(row[: seq_len + 1])
    return torch.stack(rows)


def curriculum_sampler(stream: torch.Tensor, plan: Plan, separator: list[int]):
    """Joint batches: ``batch_size - copy_rows`` stream windows and ``copy_rows`` copy rows (``copy_rows``); in the
    first ``random_copy_share`` of the steps every other copy row is random ids. Counts its calls as steps."""
    random_until = int(plan.target_steps * plan.random_copy_share)
    step = 0

    def sample(gen: torch.Generator) -> torch.Tensor:
        nonlocal step
        windows = sample_batch(stream, plan.batch_size - plan.copy_rows, plan.seq_len, gen)
        randoms = plan.copy_rows // 2 if step < random_until else 0
        parts = [windows, copy_rows(stream, plan.copy_rows - randoms, plan.seq_len, separator, False, gen)]
        if randoms:
            parts.append(copy_rows(stream, randoms, plan.seq_len, separator, True, gen))
        step += 1
        return torch.cat(parts)

    return sample


def mixed_sampler(stream: torch.Tensor, pool: torch.Tensor, plan: Plan):
    """Batches of ``batch_size`` rows: half random stream windows, half rows of ``pool`` [N, seq_len + 1] (the
    draft phase's batch and length where the plan names them)."""
    batch_size = plan.draft_batch_size or plan.batch_size
    from_pool = batch_size // 2

    def sample(gen: torch.Generator) -> torch.Tensor:
        windows = sample_batch(stream, batch_size - from_pool, pool.shape[1] - 1, gen)
        rows = torch.randint(0, len(pool), (from_pool,), generator=gen)
        return torch.cat([windows, pool[rows]])

    return sample


def round_trip_fp16(model):
    """The weights exactly as shipped (fp16 storage), back in fp32. ``.half()`` also rounds buffers, i.e. the
    rotary ``inv_freq`` table (by up to 1.6e-4), which a loaded checkpoint recomputes exactly: the final draft
    phase distils from this slightly-off target (kept so the defaults reproduce the shipped weights), and the
    evaluation therefore re-loads the saved files instead (``load_pair``)."""
    return model.half().float().eval()


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def perplexity(model, windows: torch.Tensor) -> float:
    """exp(mean next-token cross-entropy) over ``windows`` [N, T+1], one window at a time."""
    device = model_device(model)
    losses = [next_token_loss(model, w[None].to(device)).item() for w in windows]
    return math.exp(sum(losses) / len(losses))


@torch.no_grad()
def greedy_speculative(
    target, draft, prompt: torch.Tensor, k: int, new_tokens: int
) -> tuple[list[int], int, int]:
    """Greedy draft-target decoding without KV caches (clarity over speed): the draft proposes ``k`` tokens
    greedily, one target forward over prompt + drafts verifies them, the longest matching prefix is accepted and
    the target's own next token (recovered or bonus) is appended. ``prompt`` is [T] int64.

    Returns (generated token ids, accepted, drafted). The output equals the target's plain greedy decoding.
    """
    seq = prompt.tolist()
    accepted_total = drafted_total = 0
    while len(seq) - len(prompt) < new_tokens:
        drafts: list[int] = []
        for _ in range(k):
            logits = draft(input_ids=torch.tensor([seq + drafts])).logits[0, -1]
            drafts.append(int(logits.argmax()))
        target_logits = target(input_ids=torch.tensor([seq + drafts])).logits[0, -k - 1 :]  # [k+1, V]
        target_choice = target_logits.argmax(-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == target_choice[accepted]:
            accepted += 1
        seq += drafts[:accepted] + [target_choice[accepted]]
        accepted_total += accepted
        drafted_total += k
    return seq[len(prompt) :], accepted_total, drafted_total


@torch.no_grad()
def plain_greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    out = model.generate(prompt[None], max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return out[0, len(prompt) :].tolist()


def acceptance_rate(target, draft, prompts: list[torch.Tensor], k: int, new_tokens: int) -> float:
    """accepted / drafted over all prompts at ``k`` draft tokens per round."""
    accepted = drafted = 0
    for prompt in prompts:
        _, acc, dra = greedy_speculative(target, draft, prompt, k, new_tokens)
        accepted, drafted = accepted + acc, drafted + dra
    return accepted / drafted


def heldout_prompts(stream: torch.Tensor, count: int, prompt_len: int, seed: int) -> list[torch.Tensor]:
    """``count`` prompts of ``prompt_len`` tokens taken at seeded random offsets of the held-out stream."""
    gen = torch.Generator().manual_seed(seed + 7)
    starts = torch.randint(0, len(stream) - prompt_len, (count,), generator=gen).tolist()
    return [stream[s : s + prompt_len] for s in starts]


@torch.no_grad()
def decode_step_ms(model, context: int = 64, query: int = 1, repeats: int = 30) -> float:
    """Best-of-``repeats`` wall time (ms) of one HF forward of ``query`` tokens at batch 1 against a KV cache of
    ``context`` tokens. Best-of, because the machine is shared and contention only ever adds time."""
    from trtspec.engines.models import truncate_cache

    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix = model(
        input_ids=torch.randint(0, vocab, (1, context), generator=gen), use_cache=True
    ).past_key_values
    best = float("inf")
    for _ in range(repeats):
        step = torch.randint(0, vocab, (1, query), generator=gen)
        began = time.perf_counter()
        model(input_ids=step, past_key_values=prefix, use_cache=True)
        best = min(best, time.perf_counter() - began)
        truncate_cache(prefix, context)  # every repeat sees the same cache length
    return best * 1e3


@torch.no_grad()
def lean_step_ms(model, context: int = 64, query: int = 1, repeats: int = 30) -> float:
    """As ``decode_step_ms`` but through trtspec's engine forward (trtspec.engines.models.LeanCausalLM: fused
    matmuls, preallocated KV cache), i.e. what the PyTorch draft-target engine pays per step."""
    from trtspec.engines.models import LeanCausalLM

    lean = LeanCausalLM(model, num_slots=1, max_seq_len=context + query)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    lean.forward(
        torch.randint(0, vocab, (1, context), generator=gen), [0], [0], [context], torch.tensor([[0]])
    )
    best = float("inf")
    for _ in range(repeats):
        step = torch.randint(0, vocab, (1, query), generator=gen)
        began = time.perf_counter()
        lean.forward(step, [0], [context], [query], torch.tensor([[query - 1]]))
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def macs_per_token(config) -> int:
    """Multiply-accumulates of one decode step, ignoring attention over the cache (short contexts here)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
    return layers * per_layer + h * config.vocab_size


# ---------------------------------------------------------------- saving and the run


def save_model(model, tokenizer, out_dir: Path) -> None:
    """fp16 safetensors + config + generation_config + the (shared) tokenizer files."""
    from transformers import GenerationConfig

    model.half().save_pretrained(out_dir, safe_serialization=True)
    model.float()
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    ).save_pretrained(out_dir)
    # The chat template inside tokenizer_config.json (where the shipped pair has it), not a chat_template.jinja.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    # Package data must be readable by every user; the weights are written 0600 inside a mkdtemp() folder.
    for f in out_dir.iterdir():
        f.chmod(0o644)


@contextlib.contextmanager
def staging_in(out: Path) -> Iterator[Path]:
    """A temporary folder inside ``out`` (made with its parents): ``publish`` renames out of it, and a rename
    stays on one file system."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".staging-") as tmp:
        yield Path(tmp)


def publish(staging: Path, out: Path, names: tuple[str, ...] = ("target", "draft")) -> None:
    """Replace ``out/<name>`` for each name with the staged folder, by trtspec's one folder swap
    (outputs.replace_dir: renamed into place, the old folder removed only after, so never half-written)."""
    from trtspec.outputs import replace_dir

    for name in names:
        replace_dir(staging / name, out / name)


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def evaluate(target, draft, heldout: torch.Tensor, plan: Plan) -> dict:
    """Held-out perplexities, greedy acceptance at K=2/4, forward-time and MAC ratios."""
    windows = stream_windows(heldout, plan.eval_windows, plan.eval_seq_len)
    metrics = {"target_ppl": perplexity(target, windows), "draft_ppl": perplexity(draft, windows)}
    log(f"held-out perplexity: target {metrics['target_ppl']:.2f}, draft {metrics['draft_ppl']:.2f}")
    prompts = heldout_prompts(heldout, plan.eval_prompts, plan.prompt_len, plan.seed)
    spec, _, _ = greedy_speculative(target, draft, prompts[0], 4, plan.new_tokens)
    if spec[: plan.new_tokens] != plain_greedy(target, prompts[0], plan.new_tokens):
        raise RuntimeError("speculative output differs from the target's greedy output: the checker is wrong")
    for k in (2, 4):
        metrics[f"acceptance_k{k}"] = acceptance_rate(target, draft, prompts, k, plan.new_tokens)
        log(f"greedy acceptance K={k}: {metrics[f'acceptance_k{k}']:.3f}")
    metrics["target_step_ms"] = decode_step_ms(target)
    metrics["draft_step_ms"] = decode_step_ms(draft)
    metrics["target_verify5_ms"] = decode_step_ms(target, query=5)
    metrics["time_ratio"] = metrics["draft_step_ms"] / metrics["target_step_ms"]
    metrics["target_lean_ms"] = lean_step_ms(target)
    metrics["draft_lean_ms"] = lean_step_ms(draft)
    metrics["lean_ratio"] = metrics["draft_lean_ms"] / metrics["target_lean_ms"]
    metrics["mac_ratio"] = macs_per_token(draft.config) / macs_per_token(target.config)
    return metrics


def shape(config) -> str:
    return (
        f"{config.num_hidden_layers} x {config.hidden_size}, {config.intermediate_size},"
        f" {config.num_attention_heads}/{config.num_key_value_heads}"
    )


def summary(plan: Plan, metrics: dict, target, draft, out: Path, n_train: int, n_heldout: int) -> str:
    """A markdown block with everything measured, printed at the end (and pasted into TRAINING.md)."""
    params = {
        name: sum(p.numel() for p in m.parameters()) for name, m in (("target", target), ("draft", draft))
    }
    t, d = target.config, draft.config
    k4 = metrics["acceptance_k4"]
    return "\n".join(
        [
            "| | target | draft |\n|---|---|---|",
            f"| shape (layers x hidden, ffn, heads/kv) | {shape(t)} | {shape(d)} |",
            f"| parameters | {params['target'] / 1e6:.2f} M | {params['draft'] / 1e6:.2f} M |",
            f"| size on disk (fp16 + tokenizer) | {dir_mb(out / 'target'):.1f} MB | {dir_mb(out / 'draft'):.1f} MB |",
            f"| held-out perplexity (per token) | {metrics['target_ppl']:.2f} | {metrics['draft_ppl']:.2f} |",
            f"| decode step, HF forward, batch 1, 1 token, KV cache of 64, fp32, {torch.get_num_threads()} threads (best of 30) |"
            f" {metrics['target_step_ms']:.2f} ms | {metrics['draft_step_ms']:.2f} ms |",
            f"| decode step, trtspec engine forward (LeanCausalLM), same conditions |"
            f" {metrics['target_lean_ms']:.2f} ms | {metrics['draft_lean_ms']:.2f} ms |",
            "",
            f"- greedy acceptance (accepted / drafted) on {plan.eval_prompts} held-out prompts of {plan.prompt_len}"
            f" tokens, {plan.new_tokens} new tokens each: K=2 {metrics['acceptance_k2']:.3f}, K=4 {k4:.3f}",
            f"- draft/target forward-time ratio: trtspec engine forward {metrics['lean_ratio']:.3f},"
            f" HF forward {metrics['time_ratio']:.3f}; MAC ratio per decode token (incl. lm_head):"
            f" {metrics['mac_ratio']:.3f}",
            f"- target 5-token verification forward: {metrics['target_verify5_ms']:.2f} ms"
            f" ({metrics['target_verify5_ms'] / metrics['target_step_ms']:.2f}x a 1-token step)",
            f"- corpus: {n_train:,} train / {n_heldout:,} held-out tokens, vocab {plan.vocab_size};"
            f" target {plan.target_steps} steps of {plan.batch_size} x {plan.seq_len} tokens, draft {plan.draft_steps}"
            f" more steps (half on {plan.onpolicy_sequences} target greedy continuations) of"
            f" {plan.draft_batch_size or plan.batch_size} x {plan.draft_seq_len or plan.seq_len} tokens; total {time.perf_counter() - START:.0f} s on {torch.get_num_threads()} threads",
            f"- CPU of the timings: {cpu_name()}",
        ]
    )


def load_pair(out: Path):
    """(tokenizer, target, draft) from ``out/{target,draft}`` exactly as a user loads them, fp32 on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32).eval()
    return tokenizer, target, draft


def evaluate_saved(out: Path, plan: Plan, train_texts: list[str], heldout_texts: list[str]) -> int:
    """Re-measure a saved pair (e.g. on a quieter machine) without training."""
    tokenizer, target, draft = load_pair(out)
    train, heldout = encode_stream(tokenizer, train_texts), encode_stream(tokenizer, heldout_texts)
    metrics = evaluate(target, draft, heldout, plan)
    print(summary(plan, metrics, target, draft, out, len(train), len(heldout)), flush=True)
    return 0


@torch.no_grad()
def repeat_losses(
    model, stream: torch.Tensor, separator: list[int], chunks: int = 16, length: int = 80, seed: int = 5
) -> tuple:
    """(loss on a chunk, loss on its exact repeat, argmax accuracy on the repeat): ``chunks`` held-out chunks of
    ``length`` tokens, each followed by ``separator`` (a blank line) and itself again. A model that copies from
    its context (an induction head) predicts the repeat almost perfectly; one that does not scores both passes
    alike, and prompt lookup then finds little to propose in what it writes, whatever the prompt holds."""
    gen = torch.Generator().manual_seed(seed)
    blank = torch.tensor(separator)
    rows = []
    for start in torch.randint(0, len(stream) - length, (chunks,), generator=gen).tolist():
        chunk = stream[start : start + length]
        rows.append(torch.cat([chunk, blank, chunk]))
    batch = torch.stack(rows).to(model_device(model))
    logits = model(input_ids=batch[:, :-1]).logits
    labels = batch[:, 1:]
    first, second = slice(0, length - 1), slice(length + len(separator), None)
    loss = lambda part: F.cross_entropy(logits[:, part].flatten(0, 1), labels[:, part].flatten()).item()  # noqa: E731
    accuracy = (logits[:, second].argmax(-1) == labels[:, second]).float().mean().item()
    return loss(first), loss(second), accuracy


def copying_saved(out: Path, heldout_texts: list[str]) -> int:
    """How far the saved pair copies from its context (``repeat_losses`` on the held-out stream)."""
    tokenizer, target, draft = load_pair(out)
    heldout = encode_stream(tokenizer, heldout_texts)
    blank_line = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    for name, model in (("target", target), ("draft", draft)):
        first, second, accuracy = repeat_losses(model, heldout, blank_line)
        print(
            f"{name}: loss {first:.3f} on 16 held-out chunks of 80 tokens, {second:.3f} on their exact repeat "
            f"(argmax right on {accuracy:.3f} of the repeat)",
            flush=True,
        )
    return 0


# ---------------------------------------------------------------- drafts with their own tokenizer (issue 28)


@dataclass(frozen=True)
class TextPlan:
    """Issue 28's drafts, trained on text alone: the shipped target's greedy continuations and corpus windows,
    each tokenized by the draft's own tokenizer, with next-token cross-entropy (no logit KL exists across two
    vocabularies). The other-tokenizer draft and its same-tokenizer baseline get this plan unchanged, so their
    acceptance can be compared side by side."""

    # 768 over 1536: a 3000-step trial put both within 0.1 of the same-tokenizer draft's acceptance at K=4 (0.733
    # and 0.659 against 0.742) but only 768 at K=2 (0.794 and 0.712 against 0.822), for 6 % fewer target tokens
    # per round; and 768 cannot write 37 % of the target's tokens as one token, so translation has to realign.
    vocab_size: int = 768
    steps: int = 4000
    lr: float = 2e-3
    continuations: int = 4096


SMOKE_TEXT = TextPlan(vocab_size=384, steps=20, continuations=8)
TEXT_DRAFTS = ("draft-othertok", "draft-sametok")


def continuation_texts(
    target, tokenizer, train: torch.Tensor, plan: Plan, count: int, seed: int
) -> list[str]:
    """The target's greedy continuations of ``count`` train-stream prompts, as text (special tokens as their
    text, so a draft tokenizer with the same special tokens reads them back as its own)."""
    pool = target_continuations(target, train, replace(plan, onpolicy_sequences=count), seed)
    return tokenizer.batch_decode(pool, skip_special_tokens=False)


def text_rows(tokenizer, texts: list[str], length: int) -> torch.Tensor:
    """Each text as the tokenizer's first ``length`` tokens, padded with <pad> (which the loss ignores): a text
    is a different number of tokens in each vocabulary. Shape [len(texts), length], int64."""
    rows = torch.full((len(texts), length), tokenizer.pad_token_id, dtype=torch.long)
    for i, enc in enumerate(tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)):
        ids = enc.ids[:length]
        rows[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return rows


def text_losses(draft, pad_id: int):
    """Next-token cross-entropy on the batch's own tokens, <pad> positions left out."""

    def loss_fn(batch: torch.Tensor) -> dict:
        logits = draft(input_ids=batch[:, :-1]).logits  # [B, T, V]
        labels = batch[:, 1:].flatten()
        return {"draft_ce": F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=pad_id)}

    return loss_fn


def train_text_draft(name: str, tokenizer, train_texts, pool_texts, plan: Plan, tplan: TextPlan):
    """(draft, training seconds): a ``plan.draft``-shaped model on half corpus windows, half target
    continuations, all in ``tokenizer``'s tokens."""
    stream = encode_stream(tokenizer, train_texts)
    pool = text_rows(tokenizer, pool_texts, plan.seq_len + 1)
    log(f"{name}: vocab {len(tokenizer)}, {len(stream):,} train tokens, continuations {tuple(pool.shape)}")
    draft = build_model(plan.draft, plan, tokenizer, plan.seed + 2)
    began = time.perf_counter()
    loss_fn = text_losses(draft, tokenizer.pad_token_id)
    sample = mixed_sampler(stream, pool, plan)
    run_training(name, {"draft": (draft, tplan.lr)}, loss_fn, sample, tplan.steps, plan.seed + 2)
    return draft, time.perf_counter() - began


@torch.no_grad()
def own_space_metrics(model, tokenizer, heldout_texts: list[str], plan: Plan) -> dict:
    """Held-out next-token metrics in the model's own tokens: perplexity, top-1 accuracy, and bits per UTF-8
    byte of the text predicted (the one of the three that compares across vocabularies)."""
    stream = encode_stream(tokenizer, heldout_texts)
    windows = stream_windows(stream, plan.eval_windows, plan.eval_seq_len)
    nats = correct = text_bytes = 0
    for window in windows:
        logits = model(input_ids=window[None, :-1]).logits[0]  # [T, V]
        nats += F.cross_entropy(logits, window[1:], reduction="sum").item()
        correct += int((logits.argmax(-1) == window[1:]).sum())
        text_bytes += len(tokenizer.decode(window[1:]).encode())
    tokens = windows[:, 1:].numel()
    return {
        "ppl": math.exp(nats / tokens),
        "top1": correct / tokens,
        "bits_per_byte": nats / text_bytes / math.log(2),
        "bytes_per_token": text_bytes / tokens,
    }


@torch.no_grad()
def translated_speculative(target, draft, translator, prompt: torch.Tensor, k: int, new_tokens: int):
    """``greedy_speculative`` with the draft in its own token space: each round the text so far is re-encoded
    for the draft (``Translator.to_draft``), the draft continues it greedily by ``k`` of its own tokens, and
    ``Translator.to_target`` turns that text into the target tokens one target forward verifies.

    Returns (generated target ids, accepted, proposed target tokens, rounds, seconds spent translating)."""
    seq = prompt.tolist()
    accepted_total = proposed_total = rounds = 0
    translate_s = 0.0
    while len(seq) - len(prompt) < new_tokens:
        began = time.perf_counter()
        draft_seq = translator.to_draft(seq)
        translate_s += time.perf_counter() - began
        continuation: list[int] = []
        for _ in range(k):
            logits = draft(input_ids=torch.tensor([draft_seq + continuation])).logits[0, -1]
            continuation.append(int(logits.argmax()))
        began = time.perf_counter()
        proposal = translator.to_target(seq, continuation)
        translate_s += time.perf_counter() - began
        n = len(proposal)
        target_choice = (
            target(input_ids=torch.tensor([seq + proposal])).logits[0, -n - 1 :].argmax(-1).tolist()
        )
        accepted = 0
        while accepted < n and proposal[accepted] == target_choice[accepted]:
            accepted += 1
        seq += proposal[:accepted] + [target_choice[accepted]]
        accepted_total, proposed_total, rounds = accepted_total + accepted, proposed_total + n, rounds + 1
    return seq[len(prompt) :], accepted_total, proposed_total, rounds, translate_s


def translated_acceptance(target, target_tok, draft, draft_tok, prompts, plan: Plan, target_ms: dict) -> dict:
    """Greedy acceptance through text at K=2/4 draft tokens per round: accepted / proposed target tokens, target
    tokens per round (accepted + 1), translation ms per round, and a speed-up estimate from engine forwards:
    tokens per round x target step / (K draft steps + one (K+1)-token verification + translation).
    ``target_ms`` maps a query length to the target's engine forward (ms), measured once for every draft."""
    from trtspec.core.translate import Translator

    translator = Translator(target_tok, draft_tok)
    spec = translated_speculative(target, draft, translator, prompts[0], 4, plan.new_tokens)[0]
    if spec[: plan.new_tokens] != plain_greedy(target, prompts[0], plan.new_tokens):
        raise RuntimeError("translated speculative output differs from the target's greedy output")
    draft_ms = lean_step_ms(draft)
    metrics = {"draft_lean_ms": draft_ms, "target_lean_ms": target_ms[1]}
    for k in (2, 4):
        runs = [translated_speculative(target, draft, translator, p, k, plan.new_tokens) for p in prompts]
        accepted, proposed, rounds = (sum(r[i] for r in runs) for i in (1, 2, 3))
        generated = sum(len(r[0]) for r in runs)
        translate_ms = 1e3 * sum(r[4] for r in runs) / rounds
        round_ms = k * draft_ms + target_ms[k + 1] + translate_ms
        metrics[f"k{k}"] = {
            "acceptance": accepted / max(1, proposed),
            "proposed_per_round": proposed / rounds,
            "tokens_per_round": generated / rounds,
            "translate_ms": translate_ms,
            "est_speedup": generated / rounds * target_ms[1] / round_ms,
        }
    return metrics


def evaluate_text_drafts(
    drafts: dict[str, Path], target_dir: Path, heldout_texts: list[str], plan: Plan
) -> dict:
    """Each draft (name -> folder) loaded back as shipped: own-space held-out metrics and translated greedy
    acceptance against the target in ``target_dir``, on the same held-out prompts (the target's <s> first, as
    a request starts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.core.translate import vocab_overlap

    target_tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    heldout = encode_stream(target_tok, heldout_texts)
    bos = torch.tensor([target_tok.bos_token_id])
    windows = heldout_prompts(heldout, plan.eval_prompts, plan.prompt_len - 1, plan.seed)
    prompts = [torch.cat([bos, w]) for w in windows]
    # Best of 100: one slow measurement here would skew every draft's speed-up estimate.
    target_ms = {query: lean_step_ms(target, query=query, repeats=100) for query in (1, 3, 5)}
    results = {}
    for name, folder in drafts.items():
        draft_tok = AutoTokenizer.from_pretrained(folder)
        draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        metrics = own_space_metrics(draft, draft_tok, heldout_texts, plan)
        metrics.update(translated_acceptance(target, target_tok, draft, draft_tok, prompts, plan, target_ms))
        metrics["overlap"] = vocab_overlap(target_tok, draft_tok).share
        metrics["vocab"], metrics["mb"] = len(draft_tok), dir_mb(folder)
        metrics["params"] = sum(p.numel() for p in draft.parameters())
        log(
            f"{name}: held-out ppl {metrics['ppl']:.2f}, top-1 {metrics['top1']:.3f}, "
            f"{metrics['bits_per_byte']:.3f} bits/byte; acceptance K=2 {metrics['k2']['acceptance']:.3f}, "
            f"K=4 {metrics['k4']['acceptance']:.3f}"
        )
        results[name] = metrics
    return results


def text_summary(results: dict, seconds: dict, plan: Plan, tplan: TextPlan) -> str:
    """A markdown table of the drafts side by side (pasted into TRAINING.md)."""
    names = list(results)
    rows = [
        ("tokenizer vocab", lambda m: f"{m['vocab']}"),
        (
            "target tokens the draft writes as one token (vocab_overlap.share)",
            lambda m: f"{m['overlap']:.3f}",
        ),
        ("parameters / size on disk", lambda m: f"{m['params'] / 1e6:.2f} M / {m['mb']:.1f} MB"),
        ("held-out perplexity (per own token)", lambda m: f"{m['ppl']:.2f}"),
        ("held-out top-1 next-token accuracy", lambda m: f"{m['top1']:.3f}"),
        (
            "held-out bits per byte / bytes per token",
            lambda m: f"{m['bits_per_byte']:.3f} / {m['bytes_per_token']:.2f}",
        ),
        (
            f"decode step, engine forward (LeanCausalLM), {torch.get_num_threads()} threads",
            lambda m: f"{m['draft_lean_ms']:.2f} ms",
        ),
    ]
    for k in (2, 4):
        rows += [
            (
                f"K={k}: acceptance (accepted / proposed target tokens)",
                lambda m, k=k: f"{m[f'k{k}']['acceptance']:.3f}",
            ),
            (
                f"K={k}: proposed / generated target tokens per round",
                lambda m, k=k: (
                    f"{m[f'k{k}']['proposed_per_round']:.2f} / {m[f'k{k}']['tokens_per_round']:.2f}"
                ),
            ),
            (f"K={k}: translation per round", lambda m, k=k: f"{m[f'k{k}']['translate_ms']:.2f} ms"),
            (
                f"K={k}: estimated speed-up (engine forwards)",
                lambda m, k=k: f"{m[f'k{k}']['est_speedup']:.2f}x",
            ),
        ]
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |" for label, cell in rows]
    trained = (
        ", ".join(f"{name} {secs:.0f} s" for name, secs in seconds.items()) or "(not trained by this run)"
    )
    lines += [
        "",
        f"- training: {tplan.steps} steps of {plan.batch_size} x {plan.seq_len} tokens, half corpus windows, half"
        f" {tplan.continuations} target greedy continuations as text; {trained} on {torch.get_num_threads()}"
        f" threads; whole run {time.perf_counter() - START:.0f} s",
        f"- acceptance: {plan.eval_prompts} held-out prompts (<s> + {plan.prompt_len - 1} tokens),"
        f" {plan.new_tokens} new tokens each, greedy, every draft through core.translate.Translator;"
        f" target engine step {results[names[0]]['target_lean_ms']:.2f} ms",
        f"- CPU of the timings: {cpu_name()}",
    ]
    return "\n".join(lines)


def other_tokenizer_drafts(args, plan: Plan, tplan: TextPlan, train_texts, heldout_texts) -> int:
    """Train (or with --evaluate only re-measure) ``out/draft-othertok`` and ``out/draft-sametok``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The shipped draft (distilled from the target's logits) runs through the same loop, as a reference.
    reference = {"draft (KL-distilled)": args.target.parent / "draft"} if not args.smoke else {}
    if args.evaluate:
        drafts = {name: args.out / name for name in TEXT_DRAFTS}
        results = evaluate_text_drafts(drafts | reference, args.target, heldout_texts, plan)
        print(text_summary(results, {}, plan, tplan), flush=True)
        return 0
    target_tok = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    pool_texts = continuation_texts(
        target, target_tok, encode_stream(target_tok, train_texts), plan, tplan.continuations, plan.seed + 3
    )
    log(f"target greedy continuations: {len(pool_texts)} texts")
    other_tok = train_tokenizer(train_texts, tplan.vocab_size, plan.max_positions, specials_last=True)
    tokenizers = {"draft-othertok": other_tok, "draft-sametok": target_tok}
    seconds = {}
    with staging_in(args.out) as staging:
        for name, tok in tokenizers.items():
            draft, seconds[name] = train_text_draft(name, tok, train_texts, pool_texts, plan, tplan)
            save_model(draft, tok, staging / name)
        # The baseline shares the target's tokenizer byte for byte, as the shipped draft does.
        for f in args.target.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copyfile(f, staging / "draft-sametok" / f.name)
        drafts = {name: staging / name for name in TEXT_DRAFTS}
        results = evaluate_text_drafts(drafts | reference, args.target, heldout_texts, plan)
        publish(staging, args.out, TEXT_DRAFTS)
    log(f"saved {', '.join(str(args.out / n) for n in TEXT_DRAFTS)}")
    print(text_summary(results, seconds, plan, tplan), flush=True)
    return 0


def override(plan: Plan, settings: list[str]) -> Plan:
    """``plan`` with each ``FIELD=VALUE`` applied, the value parsed as the field's default type."""
    fields = {name: type(getattr(plan, name)) for name in plan.__dataclass_fields__}
    changes = {}
    for setting in settings:
        name, _, value = setting.partition("=")
        if fields.get(name) not in (int, float):
            raise SystemExit(f"--set {setting}: no numeric Plan field {name!r}; fields: {', '.join(fields)}")
        try:
            changes[name] = fields[name](value)
        except ValueError:
            raise SystemExit(
                f"--set {setting}: {name} takes a {fields[name].__name__}, not {value!r}"
            ) from None
    return replace(plan, **changes)


def joint_sampler(train: torch.Tensor, plan: Plan, blank_line: list[int]):
    """The joint phase's batches: stream windows, with copy rows where the plan has them."""
    if plan.copy_rows:
        return curriculum_sampler(train, plan, blank_line)
    return lambda gen: sample_batch(train, plan.batch_size, plan.seq_len, gen)


def heldout_probe(target, draft, heldout: torch.Tensor, plan: Plan, blank_line: list[int]):
    """``probe(step)``: the models' held-out perplexity (16 windows of ``plan.seq_len``) and ``repeat_losses``,
    logged, so a run shows when (if ever) the target starts to copy from its context."""
    windows = stream_windows(heldout, 16, plan.seq_len)

    @torch.no_grad()
    def probe(step) -> None:
        for model in (target, draft):
            model.eval()
        shown = []
        for name, model in (("target", target), ("draft", draft)):
            first, second, accuracy = repeat_losses(model, heldout, blank_line)
            ppl = perplexity(model, windows)
            shown.append(
                f"{name} ppl {ppl:.2f}, chunk/repeat {first:.3f}/{second:.3f} (argmax {accuracy:.3f})"
            )
        log(f"probe at step {step}: " + "; ".join(shown))
        for model in (target, draft):
            model.train()

    return probe


def shipped_out(args: argparse.Namespace) -> Path | None:
    """Where a run without --out writes: the shipped pair's folder for the runs that made what ships there and for
    the measurements that only read it (module docstring); None for any other run."""
    changed = args.smoke or args.set or args.budget_s
    pair = args.gpu and args.copy_curriculum and not changed
    text_drafts = args.other_tokenizer_drafts and not (
        changed or args.gpu or args.copy_curriculum or args.othertok_vocab
    )
    # --evaluate and --copying only read, unless text drafts train first (main runs those before them)
    reads_only = (args.evaluate or args.copying) and not args.other_tokenizer_drafts
    return DEFAULT_OUT if pair or text_drafts or reads_only else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder that receives target/ and draft/ [default: the shipped pair's, only for the shipped plans]",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny models and a few steps: checks the pipeline"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--evaluate", action="store_true", help="only re-measure the pair already in --out")
    parser.add_argument(
        "--copying",
        action="store_true",
        help="only measure how far the pair in --out copies from its context",
    )
    parser.add_argument(
        "--other-tokenizer-drafts",
        action="store_true",
        help="train draft-othertok (its own BPE) and draft-sametok (the target's) on --target's text into --out",
    )
    parser.add_argument(
        "--target", type=Path, default=DEFAULT_OUT / "target", help="target of --other-tokenizer-drafts"
    )
    parser.add_argument("--othertok-vocab", type=int, help="BPE size of draft-othertok (default: TextPlan's)")
    parser.add_argument(
        "--copy-curriculum",
        action="store_true",
        help="train the pair with copy rows in the joint phase (Plan COPYING): a try at a target that copies",
    )
    parser.add_argument("--gpu", action="store_true", help="the one-GPU plan (GPU, or GPU_COPYING)")
    parser.add_argument("--device", default="cpu", help="where the models train, e.g. cuda (default: cpu)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a Plan field, e.g. --set seq_len=1024 (repeatable)",
    )
    parser.add_argument(
        "--budget-s", type=float, help="set the joint steps to what fits in this many seconds (timed first)"
    )
    parser.add_argument(
        "--max-epochs",
        type=float,
        default=16.0,
        help="with --budget-s: at most this many passes over the train tokens (8 M parameters overfit 3.5 M tokens)",
    )
    parser.add_argument(
        "--stdlib",
        type=Path,
        help="corpus folder (default: this Python's stdlib, which the split is defined on)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="use this folder's tokenizer instead of training one (e.g. the shipped)",
    )
    parser.add_argument(
        "--train-only",
        action="store_true",
        help="save without evaluating (evaluation needs trtspec installed, saving only its standard-library "
        "trtspec.outputs: PYTHONPATH=src; run --evaluate where it is installed)",
    )
    args = parser.parse_args(argv)
    args.out = args.out or shipped_out(args)
    if args.out is None:
        parser.error(
            f"this run needs --out: only the shipped plans (--gpu --copy-curriculum; --other-tokenizer-drafts) "
            f"write to {DEFAULT_OUT} by default, so that no other run replaces the shipped pair"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = SMOKE if args.smoke else GPU if args.gpu else COPYING if args.copy_curriculum else Plan()
    if args.smoke and args.copy_curriculum:
        plan = replace(SMOKE, copy_rows=2, random_copy_share=0.5)
    if args.gpu and args.copy_curriculum:
        plan = GPU_COPYING
    plan = override(plan, args.set)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)  # the pair's training; evaluation, saving and text drafts run on CPU
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    seed_everything(plan.seed)
    stdlib = args.stdlib or Path(sysconfig.get_paths()["stdlib"])
    train_texts, heldout_texts = collect_corpus(stdlib)
    log(f"corpus: {stdlib} -> {len(train_texts)} train / {len(heldout_texts)} held-out files")
    if args.other_tokenizer_drafts:
        tplan = SMOKE_TEXT if args.smoke else TextPlan()
        tplan = replace(tplan, vocab_size=args.othertok_vocab or tplan.vocab_size)
        return other_tokenizer_drafts(args, plan, tplan, train_texts, heldout_texts)
    if args.evaluate:
        return evaluate_saved(args.out, plan, train_texts, heldout_texts)
    if args.copying:
        return copying_saved(args.out, heldout_texts)
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_tokenizer(train_texts, plan.vocab_size, plan.max_positions)
    train, heldout = encode_stream(tokenizer, train_texts), encode_stream(tokenizer, heldout_texts)
    log(
        f"tokenizer: byte-level BPE, vocab {len(tokenizer)}; {len(train):,} train / {len(heldout):,} held-out tokens"
    )

    target = build_model(plan.target, plan, tokenizer, plan.seed + 1).to(device)
    draft = build_model(plan.draft, plan, tokenizer, plan.seed + 2).to(device)
    log(
        f"target {sum(p.numel() for p in target.parameters()) / 1e6:.2f} M parameters (next-token loss), "
        f"draft {sum(p.numel() for p in draft.parameters()) / 1e6:.2f} M (KL to the target's logits)"
    )
    models = {"target": (target, plan.target_lr), "draft": (draft, plan.draft_lr)}
    joint = joint_losses(target, draft, plan.distill_temperature)
    blank_line = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    if args.budget_s:
        steps = steps_for_budget(models, joint, joint_sampler(train, plan, blank_line), args.budget_s)
        steps = min(steps, int(args.max_epochs * len(train) / (plan.batch_size * plan.seq_len)))
        plan = replace(plan, target_steps=steps)
        log(f"joint steps for {args.budget_s:.0f} s: {steps} (reproduce with --set target_steps={steps})")
    probe = heldout_probe(target, draft, heldout, plan, blank_line) if plan.probe_every else None
    windows = joint_sampler(train, plan, blank_line)
    run_training("joint", models, joint, windows, plan.target_steps, plan.seed + 1, probe, plan.probe_every)
    # Distil from (and evaluate) the target's weights exactly as shipped.
    target = round_trip_fp16(target).requires_grad_(False)
    pool = target_continuations(target, train, plan, plan.seed + 3)
    log(f"target greedy continuations for the draft: {tuple(pool.shape)} tokens (prompt {plan.prompt_len})")
    final = final_distill_losses(target, draft, plan.distill_temperature, plan.argmax_weight)
    sample = mixed_sampler(train, pool, plan)
    run_training("draft", {"draft": (draft, plan.draft_lr)}, final, sample, plan.draft_steps, plan.seed + 2)

    if probe:
        probe("final")
    target, draft = target.cpu(), draft.cpu()
    with staging_in(args.out) as staging:
        save_model(target, tokenizer, staging / "target")
        save_model(draft, tokenizer, staging / "draft")
        if args.train_only:
            publish(staging, args.out)
            log(f"saved {args.out / 'target'} and {args.out / 'draft'} (not evaluated: --train-only)")
            return 0
        # Measure what ships: the saved files loaded back (see round_trip_fp16 for why not the objects above).
        _, target, draft = load_pair(staging)
        metrics = evaluate(target, draft, heldout, plan)
        publish(staging, args.out)
    log(f"saved {args.out / 'target'} and {args.out / 'draft'}")
    print(summary(plan, metrics, target, draft, args.out, len(train), len(heldout)), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
