"""Whether a draft and a target share one tokenizer: draft tokens go to the target by id, so the two must map
every id to the same token and agree on the special tokens. ``trtspec check`` reports it; a runtime loading a pair
refuses a draft that fails it.

A recipe may opt in to a draft with another tokenizer (``speculative.heterogeneous_vocab``): its tokens then reach
the target as text (core/translate.py). ``check_pair_tokenizers`` is check's rule for both cases, and
``heterogeneous_problem`` says where a runtime or setting cannot serve such a draft.
"""

from __future__ import annotations

from trtspec.core.checks import CheckResult

SPECIAL_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _first_vocab_differences(
    target_vocab: dict[str, int], draft_vocab: dict[str, int], limit: int = 3
) -> list[str]:
    """The first few ids (ascending) whose token differs, as readable strings."""
    target_by_id = {i: t for t, i in target_vocab.items()}
    draft_by_id = {i: t for t, i in draft_vocab.items()}
    diffs = []
    for idx in sorted(set(target_by_id) | set(draft_by_id)):
        tok_t, tok_d = target_by_id.get(idx), draft_by_id.get(idx)
        if tok_t != tok_d:
            diffs.append(f"id {idx}: target {tok_t!r} vs draft {tok_d!r}")
            if len(diffs) == limit:
                break
    return diffs


def tokenizer_difference(target_tok, draft_tok) -> str | None:
    """None when the tokenizers are interchangeable, else what differs first (vocab, special ids, specials)."""
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        sizes = f"target {len(target_vocab)} tokens, draft {len(draft_vocab)}"
        return f"vocabularies differ ({sizes}); first differences: {'; '.join(_first_vocab_differences(target_vocab, draft_vocab))}"
    for role in SPECIAL_ROLES:
        tid, did = getattr(target_tok, f"{role}_id"), getattr(draft_tok, f"{role}_id")
        if tid != did:
            return f"{role} ids differ: target {tid} ({getattr(target_tok, role)!r}) vs draft {did} ({getattr(draft_tok, role)!r})"
    if sorted(target_tok.all_special_tokens) != sorted(draft_tok.all_special_tokens):
        only_t = sorted(set(target_tok.all_special_tokens) - set(draft_tok.all_special_tokens))
        only_d = sorted(set(draft_tok.all_special_tokens) - set(target_tok.all_special_tokens))
        return f"special tokens differ: only in target {only_t}, only in draft {only_d}"
    return None


def check_tokenizers(target_tok, draft_tok) -> CheckResult:
    diff = tokenizer_difference(target_tok, draft_tok)
    if diff is None:
        return CheckResult(
            "tokenizer", "pass", f"identical: {len(target_tok.get_vocab())} tokens, same special tokens"
        )
    return CheckResult("tokenizer", "fail", f"{diff}; draft and target must share one tokenizer")


# What the recipe's opt-in runs (core/translate.py), as check and the docs name it.
HETEROGENEOUS_ALGORITHM = "string-level exact match: draft tokens as text, re-encoded with the target tokenizer, verified as point masses"
# Below this share of the target's tokens written as one draft token, few draft tokens come through as they were
# drafted (acceptance falls with the overlap: Timor et al. report 72-75% across families).
LOW_OVERLAP = 0.25


def heterogeneous_problem(runtime: str, use_draft_logits: bool) -> str | None:
    """Why ``runtime`` with these settings cannot serve a draft with another tokenizer (None: it can)."""
    if runtime == "trtllm-pytorch":
        return (
            "runtime trtllm-pytorch cannot serve a draft with another tokenizer: TensorRT-LLM's DraftTarget passes "
            "draft tokens to the target by id (not supported upstream); use runtime torch or tensorrtllm"
        )
    if use_draft_logits:
        return (
            "speculative.use_draft_logits cannot be used with a draft with another tokenizer: its logits are over "
            "another vocabulary, and its tokens are accepted as point masses; set use_draft_logits: false"
        )
    return None


def check_pair_tokenizers(
    target_tok, draft_tok, *, heterogeneous_vocab: bool, runtime: str, use_draft_logits: bool
) -> CheckResult:
    """check's tokenizer rule: one tokenizer, or (opted in, on a runtime that can) a draft with its own, reported
    with its vocabulary overlap and the algorithm that carries its tokens to the target."""
    from trtspec.core.translate import vocab_overlap

    same = check_tokenizers(target_tok, draft_tok)
    if same.status == "pass":
        if heterogeneous_vocab:
            note = "; speculative.heterogeneous_vocab changes nothing: draft tokens go to the target by id"
            return CheckResult(same.name, "pass", same.message + note, {"heterogeneous": False})
        return same
    diff = tokenizer_difference(target_tok, draft_tok)
    overlap = vocab_overlap(target_tok, draft_tok)
    details = {
        "heterogeneous": True,
        "algorithm": HETEROGENEOUS_ALGORITHM if heterogeneous_vocab else None,
        "overlap": round(overlap.share, 4),
        "shared_tokens": overlap.shared,
        "target_tokens": overlap.target_size,
        "draft_tokens": overlap.draft_size,
        "specials": overlap.specials,
    }
    if not heterogeneous_vocab:
        message = (
            f"{diff}; draft and target must share one tokenizer, or set speculative.heterogeneous_vocab: true "
            f"to draft through text ({overlap.share:.0%} of the target's tokens are one draft token)"
        )
        return CheckResult(same.name, "fail", message, details)
    problem = heterogeneous_problem(runtime, use_draft_logits)
    if problem is not None:
        return CheckResult(same.name, "fail", problem, details)
    message = f"the draft has its own tokenizer; {HETEROGENEOUS_ALGORITHM}; {overlap.describe()}"
    if runtime == "tensorrtllm":
        message += "; draft-ahead is off (a guess in the draft's tokens cannot be matched to the target's)"
    if overlap.share < LOW_OVERLAP:
        return CheckResult(same.name, "warn", message + "; so little overlap means low acceptance", details)
    return CheckResult(same.name, "pass", message, details)


def draft_tokenizer_differs(target_dir, draft_dir, trust_remote_code: bool = False) -> bool:
    """Whether the draft folder's tokenizer is another than the target folder's (loads both; a draft folder
    without a tokenizer is driven by ids: False)."""
    from pathlib import Path

    from trtspec.core.model_dir import has_tokenizer, load_tokenizer

    if not has_tokenizer(draft_dir):
        return False
    target = load_tokenizer(Path(target_dir), trust_remote_code)
    draft = load_tokenizer(Path(draft_dir), trust_remote_code)
    return tokenizer_difference(target, draft) is not None
