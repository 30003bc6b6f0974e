"""The draft-target round: the draft proposes, the target verifies in one forward, the caches roll back.

One round for a batch of sequences (gpt-fast ``speculative_decode``, batched):

1. ``propose``: the draft runs K steps; step 0 feeds each row's *pending* tokens (tokens not yet in its cache:
   the last emitted one, plus the last draft token of a fully accepted round, or the whole prompt the first
   time), later steps feed the previous draft token. Row b may ask for fewer tokens (``num_draft[b]``).
2. ``verify``: the target feeds its pending tokens + the K draft tokens in ONE forward and keeps the last K+1
   logits of each row; ``match_accept`` / ``rejection_sample`` return each row's accepted count n and the
   recovered/bonus token.
3. commit: the row grows by n accepted + 1 tokens. Rolling back is bookkeeping only: each model's cached length
   becomes the length of the verified prefix it has seen (models.py overwrites the rejected positions later). The
   draft never re-runs the prefix; it catches up on the recovered/bonus token as pending input of the next step.

Batch > 1: every row keeps its own token list and its own cached lengths in each model, so rows accept different
numbers of tokens per round and simply continue from different positions next round. A batched forward pads
rows at the end (models.py gives each row its own positions, attention span and cache writes), so no row ever
waits for, recomputes or re-pads another; a prompt joining rows that feed a few tokens each runs in a forward of
its own (``width_groups``), so the others are not padded to its length. A row that finished or drafts fewer
tokens feeds nothing in those steps. K = 0 is target-only decoding through the same code (no draft step, a
1-token verification).
"""

from __future__ import annotations

import torch

from trtspec.core.sequences import common_prefix_len, draft_room
from trtspec.core.translate import DraftView
from trtspec.engines.rounds import Outcome, Row
from trtspec.engines.sampling import (
    SamplingParams,
    logits_to_probs,
    match_accept,
    rejection_sample,
    sample_probs,
    to_vocab,
)


class DraftRow(Row):
    """A row as a draft with its own tokenizer sees it: ``tokens`` its text as the draft's tokens, ``draft_len``
    the draft cache's length, ``proposed`` its last proposal (cached but for the last token), ``view`` what
    re-encoding its text next round starts from (core/translate.py)."""

    proposed: list[int]
    view: DraftView
    target_seen: int  # the target row's length at the last sync

    def __init__(self, tokens: list[int], slot: int):
        super().__init__(tokens, slot)
        self.proposed, self.view = [], DraftView()
        self.target_seen = 0

    def sync(self, tokens: list[int], target_len: int) -> None:
        """The row's text re-encoded: the cache keeps what it shares with it (a tokenizer is not prefix-stable)."""
        cached = (self.tokens + self.proposed)[: self.draft_len]
        self.draft_len = common_prefix_len(cached, tokens)
        self.tokens, self.proposed, self.target_seen = tokens, [], target_len


def feed(
    model, slots: list[int], rows: list[list[int]], cached: list[int], num_logits: list[int]
) -> torch.Tensor:
    """Run ``model`` on each row's uncached tail ``rows[b][cached[b]:]``.

    Returns logits [B, J, V] float32 of each row's last ``num_logits[b]`` tokens (J = max; rows with fewer
    are padded with repeats). After the call the model caches all of ``rows[b]``. Rows of very different widths
    (a joining row's prompt among rows that feed a few tokens) run as two forwards (``width_groups``).
    """
    new = [row[start:] for row, start in zip(rows, cached, strict=True)]
    num_out = max(max(num_logits), 1)
    groups = width_groups([len(n) for n in new])
    if len(groups) == 1:
        return _forward(model, slots, new, cached, num_logits, num_out)
    out = None
    for group in groups:
        if not any(new[i] for i in group):
            continue  # rows that feed nothing this step (their logits are never read): zeros
        logits = _forward(
            model,
            [slots[i] for i in group],
            [new[i] for i in group],
            [cached[i] for i in group],
            [num_logits[i] for i in group],
            num_out,
        )
        if out is None:
            out = logits.new_zeros(len(rows), *logits.shape[1:])
        out[group] = logits
    return out


def width_groups(counts: list[int]) -> list[list[int]]:
    """Row indices per forward: one batch, or two where that at least halves the padded positions (a batch pads
    every row to its widest one). A prompt of 500 tokens joining 7 rows that feed 5 each: 8 x 500 positions in
    one forward, 7 x 5 + 500 in two; rows of similar widths stay one forward (each forward has a fixed cost)."""
    order = sorted(range(len(counts)), key=counts.__getitem__)
    widths = [max(counts[i], 1) for i in order]
    padded = len(widths) * widths[-1]
    best, cut = padded, 0
    for i in range(1, len(widths)):
        if widths[i] != widths[i - 1]:
            area = i * widths[i - 1] + (len(widths) - i) * widths[-1]
            if area < best:
                best, cut = area, i
    if cut == 0 or 2 * best > padded:
        return [list(range(len(counts)))]
    return [sorted(order[:cut]), sorted(order[cut:])]


def _forward(model, slots, new: list[list[int]], cached, num_logits, num_out: int) -> torch.Tensor:
    """One padded forward of rows' new tokens; logits [B, num_out, V] (see ``feed``)."""
    counts = [len(n) for n in new]
    width = max(max(counts), 1)
    padded = [n + [0] * (width - len(n)) for n in new]
    index = [
        [min(max(c - k + j, 0), width - 1) for j in range(num_out)]
        for c, k in zip(counts, num_logits, strict=True)
    ]
    device = model.device
    tokens = torch.tensor(padded, dtype=torch.long, device=device)  # [B, T]
    # Only the draft of a padded-vocabulary pair can meet an id past its rows (the target sampled a padding row):
    # it sees its own last row instead (core.vocab.draft_input_ids; the target decides every token).
    tokens.clamp_(max=model.vocab_size - 1)
    logit_index = torch.tensor(index, dtype=torch.long, device=device)  # [B, J]
    return model.forward(tokens, list(slots), list(cached), counts, logit_index)


def propose(
    draft,
    rows: list[Row],
    num_draft: list[int],
    params: SamplingParams,
    generator,
    vocab_size: int | None = None,
):
    """Draft ``num_draft[b]`` tokens per row, autoregressively, over ``vocab_size`` rows (the target's; None = the
    draft's own, as a TensorRT-LLM draft engine returns them; see sampling.to_vocab).

    Returns draft_tokens [B, K] int64, draft_logits [B, K, V] float32 (raw) and draft_probs [B, K, V] (None when
    greedy), K = max(num_draft). Updates each row's draft_len (the last draft token is not fed: it is pending).
    """
    k = max(num_draft, default=0)
    if k == 0:  # target-only decoding (the draft may not even exist)
        return torch.zeros(len(rows), 0, dtype=torch.long), None, None
    slots = [row.slot for row in rows]
    proposed: list[list[int]] = [[] for _ in rows]
    all_logits, all_tokens, all_probs = [], [], []
    for step in range(k):
        active = [step < n for n in num_draft]
        seqs = [
            row.tokens + p if on else row.tokens[: row.draft_len]
            for row, p, on in zip(rows, proposed, active, strict=True)
        ]
        logits = feed(draft, slots, seqs, [row.draft_len for row in rows], [1] * len(rows))[:, 0]  # [B, V]
        if vocab_size is not None:
            logits = to_vocab(logits, vocab_size)
        # Probabilities once per step: sampled from here and kept for verification.
        probs = None if params.greedy else logits_to_probs(logits, params)  # [B, V]
        tokens = logits.argmax(-1) if probs is None else sample_probs(probs, generator)  # [B]
        all_probs.append(probs)
        for row, seq, token, p, on in zip(rows, seqs, tokens.tolist(), proposed, active, strict=True):
            if on:
                row.draft_len = len(seq)
                p.append(token)
        all_logits.append(logits)
        all_tokens.append(tokens)
    draft_tokens, draft_logits = torch.stack(all_tokens, 1), torch.stack(all_logits, 1)  # [B, K], [B, K, V]
    draft_probs = None if params.greedy else torch.stack(all_probs, 1)  # [B, K, V]
    return draft_tokens, draft_logits, draft_probs


def verify(target, rows: list[Row], draft_tokens, num_draft: list[int], draft_probs, params, generator):
    """One target forward over pending + draft tokens; returns num_accepted [B] and next_token [B] (lists).

    draft_tokens [B, K] int64; draft_probs [B, K, V] or None (then the token-match rule). Updates target_len to
    the verified prefix (rolling back the rejected draft tokens).
    """
    seqs = [row.tokens + d[:n] for row, d, n in zip(rows, draft_tokens.tolist(), num_draft, strict=True)]
    target_logits = feed(
        target, [row.slot for row in rows], seqs, [row.target_len for row in rows], [n + 1 for n in num_draft]
    )  # [B, K+1, V]
    k = draft_tokens.shape[1]
    target_logits = target_logits[:, : k + 1]
    # A target-only round's empty draft_tokens come from propose on the CPU (no draft model to take a device from).
    draft_tokens = draft_tokens.to(target_logits.device)
    num = torch.tensor(num_draft, device=target_logits.device)
    if draft_probs is None or params.greedy:
        num_accepted, next_token = match_accept(draft_tokens, num, target_logits, params, generator)
    else:
        target_probs = logits_to_probs(target_logits, params)  # [B, K+1, V]
        num_accepted, next_token = rejection_sample(draft_tokens, num, draft_probs, target_probs, generator)
    return num_accepted.tolist(), next_token.tolist()


def commit(rows: list[Row], draft_tokens, num_accepted: list[int], next_token: list[int]) -> list[list[int]]:
    """Append accepted + recovered/bonus tokens; roll both caches back to what they verifiably hold."""
    emitted = []
    for row, drafts, n, token in zip(rows, draft_tokens.tolist(), num_accepted, next_token, strict=True):
        new = drafts[:n] + [token]
        verified = len(row.tokens) + n  # tokens whose KV is right: old tokens + accepted drafts
        row.tokens += new
        row.target_len = verified
        row.draft_len = min(row.draft_len, verified)
        emitted.append(new)
    return emitted


def speculative_round(
    target,
    draft,
    rows: list[Row],
    num_draft: list[int],
    params: SamplingParams,
    generator,
    proposals: list[list[int] | None] | None = None,
):
    """1. propose, 2. verify, 3. commit. Returns (emitted tokens per row, num_accepted per row). ``proposals``:
    rows whose draft tokens are given (prompt lookup: core/lookup.py; their num_draft is the proposal's length)
    skip the draft model; under sampling their tokens are point masses (``point_mass``)."""
    given = proposals or [None] * len(rows)
    asked = [0 if g is not None else n for g, n in zip(given, num_draft, strict=True)]
    draft_tokens, _, draft_probs = propose(draft, rows, asked, params, generator, target.vocab_size)
    if proposals is not None:
        draft_tokens, draft_probs = with_proposals(
            draft_tokens, draft_probs, given, params, target.vocab_size, target.device
        )
    num_accepted, next_token = verify(target, rows, draft_tokens, num_draft, draft_probs, params, generator)
    return commit(rows, draft_tokens, num_accepted, next_token), num_accepted


def with_proposals(draft_tokens, draft_probs, given: list[list[int] | None], params, vocab_size: int, device):
    """The round's draft tokens [B, K] with the given rows' tokens in place (K: the longest of either), and,
    when sampling, their probabilities: a point mass on each given token (``point_mass``)."""
    k = max([draft_tokens.shape[1], *(len(g) for g in given if g is not None)])
    tokens = torch.zeros(len(given), k, dtype=torch.long, device=device)
    tokens[:, : draft_tokens.shape[1]] = draft_tokens
    for b, g in enumerate(given):
        if g is not None:
            tokens[b, : len(g)] = torch.tensor(g, dtype=torch.long)
    if params.greedy:
        return tokens, None
    probs = torch.zeros(len(given), k, vocab_size, device=device)
    if draft_probs is not None:
        probs[:, : draft_probs.shape[1]] = draft_probs.to(probs.device)
    for b, g in enumerate(given):
        if g is not None:
            probs[b] = point_mass(tokens[b], vocab_size)
    return tokens, probs


def point_mass(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[K, V] probability 1 on each token: a deterministic proposal as rejection sampling reads it (accepted with
    the target's probability of the token; on rejection the target's distribution without it, renormalised),
    which keeps the target's distribution (docs/exactness.md)."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


class TorchRounds:
    """The torch pair's round for the loop (engines/rounds.py ``Rounds``): ``speculative_round`` over the models'
    KV slots. ``draft`` None: no draft model (target-only, or given proposals only). ``translator``
    (core/translate.py): the draft has a tokenizer of its own; it drafts in its own token space and its tokens
    reach the target as text, verified as point masses (``translated_proposals``)."""

    def __init__(self, target, draft=None, *, max_draft_len: int = 8, translator=None):
        self.target, self.draft, self.translator = target, draft, translator
        self.num_slots = target.num_slots
        models = (target,) if translator is not None else (target, draft)
        self.vocab_size = min(m.vocab_size for m in models if m is not None)
        self.max_draft_len = max_draft_len
        self.has_draft = draft is not None
        self.max_top_k = 0  # torch's topk takes any k
        self.device = target.device
        self.draft_rows: dict[int, DraftRow] = {}  # per slot, with a translator: the draft's own tokens

    def run(
        self,
        rows: list[Row],
        num_draft: list[int],
        params: SamplingParams,
        generator,
        proposals: list[list[int] | None] | None = None,
    ) -> list[Outcome]:
        draft = self.draft
        if self.translator is not None and draft is not None:
            num_draft, proposals = self.translated_proposals(rows, num_draft, params, generator, proposals)
            draft = None  # every proposal is given now
        emitted, num_accepted = speculative_round(
            self.target, draft, rows, num_draft, params, generator, proposals
        )
        return [Outcome(*o) for o in zip(emitted, num_draft, num_accepted, strict=True)]

    def translated_proposals(self, rows: list[Row], num_draft: list[int], params, generator, proposals):
        """The draft's proposals in target tokens for the rows not given one: each row's text as the draft's
        tokens (its cache keeps the prefix it shares with them), K draft tokens from the draft's own
        distribution, their text as target tokens (core/translate.py). Returns (num_draft, proposals)."""
        given = list(proposals or [None] * len(rows))
        # the loop's K per row (within its budget and the target's cache): a draft token's text may take several
        # target tokens, and the proposal is cut to K of them
        wanted, num_draft = list(num_draft), list(num_draft)
        asked, states = [], []
        for i, (row, proposal, k) in enumerate(zip(rows, given, num_draft, strict=True)):
            if proposal is not None or k <= 0:
                continue
            state = self.draft_rows.setdefault(row.slot, DraftRow([], row.slot))
            tokens = self.translator.to_draft(row.tokens, state.view)
            # The target's limits bound the row in target tokens; its text may take more of the draft's. Drafting
            # stops where the draft's cache ends (K capped per row), so one row can never fail the batch.
            num_draft[i] = min(k, draft_room(len(tokens), self.draft.max_seq_len))
            if num_draft[i] <= 0:
                given[i], num_draft[i] = [], 0
                continue
            state.sync(tokens, len(row.tokens))
            asked.append(i)
            states.append(state)
        if not asked:
            return num_draft, given
        tokens, _, _ = propose(self.draft, states, [num_draft[i] for i in asked], params, generator)
        for i, state, drafted in zip(asked, states, tokens.tolist(), strict=True):
            state.proposed = drafted[: num_draft[i]]
            proposal = self.translator.to_target(rows[i].tokens, state.proposed)[: wanted[i]]
            # ids past the target's rows (a tokenizer larger than its model) cannot be scored: cut there
            rows_ok = [t < self.target.vocab_size for t in proposal]
            proposal = proposal[: rows_ok.index(False)] if False in rows_ok else proposal
            given[i], num_draft[i] = proposal, len(proposal)
        return num_draft, given

    def release(self, slot: int) -> None:
        """The next row in the slot starts at length 0 and overwrites the cache; its draft tokens start over."""
        self.draft_rows.pop(slot, None)

    def move(self, row: Row, slot: int) -> None:
        """Each model's cache of the row, up to what it holds, into ``slot`` (with a translator, the draft's
        tokens go along)."""
        self.target.move(row.slot, slot, row.target_len)
        state = self.draft_rows.pop(row.slot, None)
        if state is not None:
            state.slot = slot
            self.draft_rows[slot] = state
        if self.draft is not None:
            self.draft.move(row.slot, slot, row.draft_len if state is None else state.draft_len)

    def draft_behind(self, row: Row) -> int:
        """Uncached tokens of the row in the draft (with a translator: target tokens since the draft's last sync,
        beside what its own cache lacks)."""
        if self.translator is None:
            return len(row.tokens) - row.draft_len
        state = self.draft_rows.get(row.slot)
        if state is None:
            return len(row.tokens)
        return len(row.tokens) - state.target_seen + len(state.tokens) - state.draft_len
