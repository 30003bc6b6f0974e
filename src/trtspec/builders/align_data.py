"""Distillation data for ``trtspec align``: the target's continuations of the user's prompts, with its logits.

Per training prompt, one batch of rows continues the same prompt (so no padding): the target's greedy
continuation, ``samples`` continuations sampled from the target at ``temperature``, and with ``on_policy`` one
continuation sampled from the draft (the sequences speculative decoding shows the target, as DistillSpec
recommends). One target forward then scores every row; each row's continuation positions keep the target's logits:
whole rows for vocabularies up to FULL_ROWS_MAX, else the top ``top_k_logits`` entries (values and ids).
Held-out prompts (every ``1/held_out``-th prompt of the file, so the split needs no second pass) get only the
target's greedy continuation of exactly ``max_new_tokens`` tokens (EOS ignored): the acceptance report's data.
Validation prompts (every ``1/validation``-th of the others, half a period later) get the same: the data that picks
which training step's weights are written, kept apart from the report's so the report is not the selection's.

Prompts stream from the file into shards of ``SHARD_SIZE`` examples saved in the work folder, whose
``state.json`` (align_work.WorkDir) records how many prompts the saved shards cover, so an interrupted run resumes
after them.

Shapes: ``ids`` [T] int64 (prompt + continuation), ``start`` = prompt length; ``values`` [T - start, k] float16 are
the target's logits at positions start-1 .. T-2 (each predicting the next token), ``indices`` [T - start, k] int32
their vocabulary ids (None for whole rows, k = vocab).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.chat import Prompt, encode_prompt, has_chat_template, read_prompt_file, render_chat
from trtspec.core.errors import ModelError, PromptSetError
from trtspec.outputs import write_file_atomic

FULL_ROWS_MAX = 4096  # larger vocabularies keep top-k logits per position
SHARD_SIZE = 64


@dataclass(frozen=True)
class DataSpec:
    max_new_tokens: int = 64
    samples: int = 1  # target-sampled continuations per prompt, beside the greedy one
    temperature: float = 1.0
    on_policy: bool = True  # a draft-sampled continuation per prompt, scored by the target
    top_k_logits: int = 64
    held_out: float = 0.1
    validation: float = 0.1  # 0: no selection, the last step's weights are written
    max_prompt_tokens: int = 384  # longer prompts keep their last tokens
    seed: int = 0


def prompt_format(path: Path) -> bool:
    """True for plain text (one prompt per line), False for JSONL (``.jsonl`` / ``.json``)."""
    return Path(path).suffix.lower() not in (".jsonl", ".json")


def iter_prompts(path: Path) -> Iterator[Prompt]:
    return read_prompt_file(Path(path), text_lines=prompt_format(path))


def is_held_out(index: int, fraction: float) -> bool:
    """Every 1/fraction-th prompt (by position in the file): a split that streams and repeats exactly."""
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


def prompt_split(index: int, held_out: float, validation: float) -> str:
    """The split of the prompt at ``index``: "held_out" (``is_held_out``), "validation" (of the other prompts,
    every 1/validation-th by its rank among them, half a period early) or "train"."""
    if is_held_out(index, held_out):
        return "held_out"
    rank = index - math.floor(index * held_out)  # floor(index * held_out) held-out prompts come before it
    if validation > 0 and is_held_out(rank + max(1, round(0.5 / validation)), validation):
        return "validation"
    return "train"


def prompt_splits(path: Path, held_out: float, validation: float) -> Iterator[tuple[Prompt, str, bool]]:
    """Each line's prompt, split and whether it repeats an earlier line: distinct prompts split by their rank
    among distinct prompts (prompt_split), a repeat in the split of its first occurrence. Traffic logs repeat
    prompts, and a held-out or validation prompt that is also trained on would measure the training set."""
    seen: dict[bytes, str] = {}
    for prompt in iter_prompts(path):
        key = hashlib.blake2b(
            json.dumps([prompt.text, prompt.messages], sort_keys=True).encode(), digest_size=16
        ).digest()
        split = seen.get(key)
        repeat = split is not None
        if split is None:
            split = seen[key] = prompt_split(len(seen), held_out, validation)
        yield prompt, split, repeat


def count_prompts(path: Path, held_out: float, validation: float = 0.0) -> dict[str, int]:
    """Prompts per split ({"train", "held_out", "validation"}, repeats counted); reading every line first also
    refuses a malformed one before any work."""
    counts = {"train": 0, "held_out": 0, "validation": 0}
    distinct = 0
    for _, split, repeat in prompt_splits(path, held_out, validation):
        counts[split] += 1
        distinct += not repeat
    total = sum(counts.values())
    # the splits are drawn over distinct prompts: what a fraction gives, and the advice, count those
    what = f"{total} prompt(s)" if distinct == total else f"{distinct} distinct prompt(s) ({total} lines)"
    if total == 0:
        raise PromptSetError(f'{path}: no prompts; write one prompt per line (or JSONL with "prompt" lines)')
    if counts["held_out"] == 0 and held_out > 0:
        # --held-out is below 1, so raising it helps only where the prompts could still train.
        # rounded up: at the value shown, floor(total * held_out) must reach one prompt
        raise_it = (
            f" or raise --held-out to at least {math.ceil(100 / distinct) / 100:.2f}" if distinct >= 2 else ""
        )
        raise PromptSetError(
            f"{path}: {what} give no held-out prompt at --held-out {held_out}; add prompts{raise_it}"
        )
    if counts["validation"] == 0 and validation > 0:
        raise PromptSetError(
            f"{path}: {what} give no validation prompt at --validation {validation}; add prompts, raise "
            "--validation, or pass --validation 0 to write the last training step's weights"
        )
    if counts["train"] == 0:
        raise PromptSetError(
            f"{path}: every prompt is held out or validation at --held-out {held_out} --validation {validation}; "
            "lower them or add prompts"
        )
    return counts


def check_chat_lines(path: Path, tokenizer) -> None:
    """Chat lines need the target tokenizer's chat template, and one that takes them (a template may refuse a
    system message): refused before any work, naming the line."""
    template = has_chat_template(tokenizer)
    for number, prompt in enumerate(iter_prompts(path), start=1):
        if prompt.messages is None:
            continue
        if not template:
            raise PromptSetError(
                f'{path}: prompt {number} has "messages", which are rendered with the target tokenizer\'s chat '
                f"template, and {tokenizer.name_or_path} has none (chat_template in tokenizer_config.json); give "
                '{"prompt": ...} lines instead'
            )
        try:
            render_chat(tokenizer, prompt.messages)
        except ModelError as err:
            raise PromptSetError(f"{path}: prompt {number}: {err.message}") from None


def prompt_ids(tokenizer, prompt: Prompt, spec: DataSpec) -> list[int]:
    """Token ids of a prompt (chat messages through the chat template), keeping its last max_prompt_tokens."""
    _, ids = encode_prompt(tokenizer, prompt.text, prompt.messages)
    return ids[-spec.max_prompt_tokens :]


def logit_rows(model) -> int:
    """The rows of a model's logits (its vocabulary as the checkpoint pads it)."""
    return model.get_output_embeddings().weight.shape[0]


def shared_rows(target, draft) -> int:
    """The ids both models have rows for. A padded-vocabulary pair (Qwen2.5: 152064 target rows, 151936 draft
    rows) differs only in rows no text produces; continuations stay within the shared ones, so the draft can read
    every token and the target's distribution is compared over ids both have (align_train.distill_loss)."""
    return min(logit_rows(target), logit_rows(draft))


@torch.no_grad()
def continue_rows(
    model, prompt: list[int], greedy: list[bool], steps: int, temperature: float, generator, rows: int
):
    """Continue ``prompt`` in len(greedy) rows for ``steps`` tokens with a KV cache: row r greedy or sampled at
    ``temperature``, over the first ``rows`` ids (shared_rows). Returns [R, steps] int64 (EOS is not a stop here;
    callers cut rows)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt] * len(greedy), device=device)
    greedy_mask = torch.tensor(greedy, device=device)
    out = model(input_ids=ids, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :rows].float()
    tokens = []
    for step in range(steps):
        chosen = logits.argmax(-1)
        if not all(greedy):
            probs = torch.softmax(logits / temperature, -1)
            sampled = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
            chosen = torch.where(greedy_mask, chosen, sampled)
        tokens.append(chosen)
        if step + 1 < steps:
            out = model(input_ids=chosen[:, None], past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :rows].float()
    return torch.stack(tokens, 1)


def cut_at_eos(row: list[int], eos_ids: set[int]) -> list[int]:
    """The row up to and including its first EOS token."""
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[: i + 1]
    return row


@torch.no_grad()
def score(target, prompt: list[int], continuations: list[list[int]], top_k: int) -> list[dict]:
    """One target forward over prompt + each continuation (rows padded to the longest, right side, which the
    causal mask keeps from the kept positions); the examples with their kept logits."""
    device = next(target.parameters()).device
    start = len(prompt)
    longest = max(len(c) for c in continuations)
    batch = torch.tensor([prompt + c + [0] * (longest - len(c)) for c in continuations], device=device)
    logits = target(input_ids=batch[:, :-1]).logits.float()  # [R, start + longest - 1, V]
    examples = []
    for row, cont in enumerate(continuations):
        kept = logits[row, start - 1 : start - 1 + len(cont)]  # [n, V]
        ids = torch.tensor(prompt + cont)
        examples.append({"ids": ids, "start": start, **keep_logits(kept.cpu(), top_k)})
    return examples


def keep_logits(logits: torch.Tensor, top_k: int) -> dict:
    """Whole rows of [n, V] logits for small vocabularies, else the top_k values and ids (float16 / int32)."""
    if logits.shape[-1] <= FULL_ROWS_MAX:
        return {"values": logits.half(), "indices": None}
    values, indices = logits.topk(top_k, dim=-1)
    return {"values": values.half(), "indices": indices.int()}


def training_examples(
    target, draft, prompt: list[int], spec: DataSpec, eos_ids: set[int], generator, shared: int
) -> list:
    """Greedy + sampled target rows and the on-policy draft row for one prompt over the first ``shared`` ids
    (shared_rows), scored by the target."""
    greedy, steps, temperature = [True] + [False] * spec.samples, spec.max_new_tokens, spec.temperature
    rows = continue_rows(target, prompt, greedy, steps, temperature, generator, shared).tolist()
    if spec.on_policy:
        rows += continue_rows(draft, prompt, [False], steps, temperature, generator, shared).tolist()
    rows = [cut_at_eos(r, eos_ids) for r in rows]
    return score(target, prompt, rows, spec.top_k_logits)


def held_out_example(target, prompt: list[int], spec: DataSpec, rows: int) -> dict:
    """The target's greedy continuation of exactly max_new_tokens tokens over the first ``rows`` ids (shared_rows;
    no logits: the report compares argmaxes)."""
    row = continue_rows(target, prompt, [True], spec.max_new_tokens, 1.0, None, rows)[0].tolist()
    return {"ids": torch.tensor(prompt + row), "start": len(prompt)}


def save_shard(path: Path, examples: list[dict]) -> None:
    buffer = io.BytesIO()
    torch.save(examples, buffer)
    write_file_atomic(path, buffer.getvalue())


def load_shard(path: Path) -> list[dict]:
    return torch.load(path, weights_only=True)
