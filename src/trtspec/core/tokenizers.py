"""Whether a draft and a target share one tokenizer: draft tokens go to the target by id, so the two must map
every id to the same token and agree on the special tokens. ``trtspec check`` reports it; a runtime loading a pair
refuses a draft that fails it."""

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
