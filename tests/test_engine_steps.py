"""The test harness's stand-in engine (tests/harness/steps.py): the engine's rounds behind TensorRT-LLM's calls,
with KV reuse across calls."""

from __future__ import annotations

import pytest
from harness.steps import StepModel, StepRequest
from test_engine import hf_greedy

from trtspec.core.errors import RequestError
from trtspec.engines.sampling import SamplingParams


class CountingModel:
    """The real KV model, counting the tokens each forward computes (to see the prefix is not recomputed)."""

    def __init__(self, model):
        self.model, self.computed = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, tokens, slots, starts, num_new, logit_index):
        self.computed += sum(num_new)
        return self.model.forward(tokens, slots, starts, num_new, logit_index)


@pytest.fixture(scope="module")
def step_pair(tiny_pair):
    target, draft = (
        StepModel.from_pretrained(d, num_slots=4, max_seq_len=128, max_draft_len=4) for d in tiny_pair
    )
    target.model, draft.model = CountingModel(target.model), CountingModel(draft.model)
    return target, draft


def orchestrate(target, draft, prompts, k, params, new_tokens):
    """What the Triton orchestrator does: per round, one batched draft call then one batched verify call."""
    seqs, rounds = [list(p) for p in prompts], 0
    while min(len(s) - len(p) for s, p in zip(seqs, prompts, strict=True)) < new_tokens:
        drafts = draft.draft([StepRequest(s, num_tokens=k, params=params) for s in seqs])
        verified = target.verify(
            [
                StepRequest(s, draft_ids=d.tokens, draft_logits=d.logits, params=params)
                for s, d in zip(seqs, drafts, strict=True)
            ]
        )
        for s, v in zip(seqs, verified, strict=True):
            s += v.tokens
        rounds += 1
    return [s[len(p) : len(p) + new_tokens] for s, p in zip(seqs, prompts, strict=True)], rounds


def test_draft_then_verify_rounds_match_hf_greedy_and_reuse_the_kv_cache(step_pair, tiny_pair):
    target, draft = step_pair
    prompts = [[1, 40, 41, 42, 43], [1, 7, 8]]
    target.model.computed = draft.model.computed = 0
    outputs, rounds = orchestrate(target, draft, prompts, 3, SamplingParams(), 20)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out == hf_greedy(tiny_pair[0], prompt, 20)
    # With reuse each verify computes only the pending token + the K draft tokens (the prompt once); without it,
    # every call would recompute the whole prefix.
    assert target.model.computed == sum(len(p) - 1 + rounds * (3 + 1) for p in prompts)
    assert draft.model.computed <= sum(len(p) + rounds * (3 + 1) for p in prompts)


def test_continue_is_target_only_greedy(step_pair, tiny_pair):
    target, _ = step_pair
    (result,) = target.continue_([StepRequest([1, 7, 8], num_tokens=12)])
    assert result.tokens == hf_greedy(tiny_pair[0], [1, 7, 8], 12)


def test_sampled_rounds_with_draft_logits_run_and_respect_k(step_pair):
    target, draft = step_pair
    params = SamplingParams(temperature=0.8, top_k=20, seed=3)
    (d,) = draft.draft([StepRequest([1, 7, 8], num_tokens=4, params=params)])
    assert len(d.tokens) == 4 and d.logits.shape == (4, draft.model.vocab_size)
    (v,) = target.verify([StepRequest([1, 7, 8], draft_ids=d.tokens, draft_logits=d.logits, params=params)])
    assert (
        1 <= len(v.tokens) == v.num_accepted + 1 <= 5
        and v.tokens[: v.num_accepted] == d.tokens[: v.num_accepted]
    )
    with pytest.raises(RequestError, match="max_draft_len=4"):
        draft.draft([StepRequest([1, 7, 8], num_tokens=5)])
    with pytest.raises(RequestError, match="max_draft_len=4"):
        target.verify([StepRequest([1, 7, 8], draft_ids=[5] * 5)])


# ------------------------------------------------------------------ the slot pool (KV-cache prefix reuse)


def test_slot_pool_picks_the_longest_shared_prefix():
    from harness.steps import SlotPool

    pool = SlotPool(3)
    pool.record(0, [1, 2, 3])
    pool.record(1, [1, 2, 3, 4, 5])
    pool.record(2, [9])
    assert pool.acquire([1, 2, 3, 4, 5, 6, 7], set()) == (1, 5, None)
    assert pool.acquire([1, 2, 3, 8], set()) == (0, 3, None)  # a tie: the least recently used of the two
    assert pool.acquire([9, 9], set()) == (2, 1, None)
    assert pool.acquire([1, 2, 3, 4, 5, 6, 7], {1}) == (
        0,
        3,
        None,
    )  # a slot taken by the same batch is skipped


def test_slot_pool_keeps_concurrent_sequences_that_share_a_prefix_apart():
    """8 live sequences that all start with BOS (and two with a longer shared prompt), called in turn as the Triton
    engine models are: each keeps its own slot, so every call computes only its new tokens. (Picking the longest
    common prefix alone put them all in one slot, recomputing each whole sequence on every call.)"""
    from harness.steps import SlotPool

    pool = SlotPool(8, max_draft_len=4)
    seqs = [[1, 50, 51, 52, 53, 54] + [60 + i] * 6 if i < 2 else [1, 100 + i] + [7] * 10 for i in range(8)]
    slots = {}
    for step in range(6):
        for i, seq in enumerate(seqs):
            before = list(seq)
            seq += [200 + step, 300 + i]  # this call's new tokens
            slot, reuse, _ = pool.acquire(seq, set())
            if step:
                assert slots[i] == slot and reuse == len(before), (step, i)
            slots[i] = slot
            pool.record(
                slot, seq + [9, 9, 9]
            )  # the call also cached draft tokens that the next one rolls back
    assert sorted(slots.values()) == list(range(8))


def test_a_prompt_seen_before_is_copied_into_a_new_slot_not_taken_over(step_pair, tiny_pair):
    """A second request with the same prompt (or a shared system prompt) reuses the cached prefix by copying it into
    a slot of its own: the first sequence keeps its slot and cache, and the copy gives exactly the outputs of a
    fresh computation (HF greedy) while computing only the new tokens."""
    target, _ = step_pair
    prompt = [1, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    expected = hf_greedy(tiny_pair[0], prompt, 12)  # more than a round's rollback past the prompt
    (first,) = target.continue_([StepRequest(prompt, num_tokens=12, params=SamplingParams())])
    assert first.tokens == expected
    holders = [s for s, cached in enumerate(target.pool.cached) if cached[: len(prompt)] == prompt]
    before = target.model.computed
    (second,) = target.continue_([StepRequest(prompt + [99], num_tokens=6, params=SamplingParams())])
    assert second.tokens == hf_greedy(tiny_pair[0], prompt + [99], 6)
    assert (
        target.model.computed - before <= 1 + 6
    )  # the new token (+ the last one fed again), then 1 per step
    now = [s for s, cached in enumerate(target.pool.cached) if cached[: len(prompt)] == prompt]
    assert len(holders) == 1 and holders[0] in now and len(now) == 2  # the first sequence's slot is intact


def test_slot_pool_leaves_one_token_to_feed():
    from harness.steps import SlotPool

    pool = SlotPool(1)
    pool.record(0, [1, 2, 3])
    assert pool.acquire([1, 2, 3], set()) == (0, 2, None)  # the last token is fed again: it yields the logits
    assert pool.acquire([1, 2], set()) == (0, 1, None)


def test_slot_pool_evicts_the_least_recently_used_slot():
    from harness.steps import SlotPool

    pool = SlotPool(2)
    a, _, _ = pool.acquire([1, 1], set())
    pool.record(a, [1, 1])
    b, _, _ = pool.acquire([2, 2], set())
    assert b != a  # the empty slot, not the one just used
    pool.record(b, [2, 2])
    pool.acquire([1, 1, 5], set())  # touches slot a
    c, cached, source = pool.acquire(
        [3, 3], set()
    )  # nothing shared: the least recently used slot (b) is replaced
    assert (c, cached, source) == (b, 0, None)
    pool.record(c, [3, 3])
    assert pool.cached[a] == [1, 1] and pool.cached[b] == [3, 3]


def test_engine_model_refuses_what_the_tensorrt_llm_backend_would(step_pair):
    """The stand-in engine models called directly with bad tensors: a clear RequestError (INVALID_ARG to the
    client), not a second row silently dropped, a negative length taken as a slice, or an IndexError."""
    import numpy as np
    from harness.engine_model import TorchEngine

    target, _ = step_pair
    engine = TorchEngine(target, "target")
    ok = {"input_ids": np.array([[1, 5, 6]], dtype=np.int32), "request_output_len": np.array([[2]])}
    assert engine.check_input_ids(ok) == [1, 5, 6]
    assert engine.check_input_ids(ok | {"input_lengths": np.array([[2]])}) == [1, 5]
    cases = {
        "input 'input_ids' is required": {"request_output_len": np.array([[2]])},
        "holds 2 sequences": ok | {"input_ids": np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)},
        "input_lengths -3 is outside 1..3": ok | {"input_lengths": np.array([[-3]])},
        "input_lengths 100 is outside 1..3": ok | {"input_lengths": np.array([[100]])},
        "outside the vocabulary": ok | {"input_ids": np.array([[1, 10**6]], dtype=np.int32)},
    }
    for needle, inputs in cases.items():
        with pytest.raises(RequestError, match=needle):
            engine.run(inputs)


@pytest.mark.parametrize("lean", [True, False])
def test_copy_prefix_gives_the_logits_of_a_fresh_computation(tiny_pair, lean):
    """Both KV models: slot 1, given slot 0's first 6 positions by copy_prefix, continues exactly as slot 0 would."""
    import torch

    from trtspec.engines.models import load_causal_lm

    model = load_causal_lm(tiny_pair[0], num_slots=2, max_seq_len=64, lean=lean)
    prompt = torch.tensor([[1, 31, 32, 33, 34, 35, 36, 37]])
    last = torch.tensor([[7]])
    full = model.forward(prompt, [0], [0], [8], last)  # slot 0 computes all 8 positions
    model.copy_prefix(0, 1, 6)
    tail = model.forward(prompt[:, 6:], [1], [6], [2], torch.tensor([[1]]))  # slot 1 computes only the last 2
    torch.testing.assert_close(tail, full, rtol=1e-4, atol=1e-4)


def test_a_failed_prefix_copy_leaves_no_slot_the_pool_trusts(tiny_pair, monkeypatch):
    """If copy_prefix raises (out of memory on a GPU), the pool must not believe the slot holds the prefix: a later
    request with that prefix would reuse another sequence's KV and get a wrong token."""
    from trtspec.engines.models import load_causal_lm

    model = StepModel(load_causal_lm(tiny_pair[0], num_slots=2, max_seq_len=128), max_draft_len=4)
    greedy = SamplingParams()
    prefix = [1, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    model.continue_([StepRequest(prefix, num_tokens=1, params=greedy)])  # slot 0 holds the prefix
    model.continue_([StepRequest([1, 90, 91, 92, 93, 94, 95, 96, 97], num_tokens=1, params=greedy)])  # slot 1
    model.continue_([StepRequest(prefix + [5], num_tokens=10, params=greedy)])  # slot 1 is now the LRU one

    def out_of_memory(*args):
        raise RuntimeError("out of memory (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(model.model, "copy_prefix", out_of_memory)
        with pytest.raises(RuntimeError, match="out of memory"):
            model.verify([StepRequest(prefix + [40], params=greedy)])  # LRU slot 1, a copy from slot 0
    (result,) = model.verify([StepRequest(prefix + [40, 41], params=greedy)])
    assert result.tokens == hf_greedy(tiny_pair[0], prefix + [40, 41], 1)
