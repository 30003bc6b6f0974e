"""Sampling is exact: speculative outputs follow the target's own sampling distribution (and the test can fail).

Each test is parametrised with planted bugs to show it detects them: ``accept_all`` accepts every draft token
(the output then follows the draft), ``target_on_reject`` samples a rejected position from target_probs instead
of the residual (over-weighting tokens the draft already proposed).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from tiny_models import make_model

from trtspec.core.errors import RequestError
from trtspec.engines import sampling
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.sampling import SamplingParams, logits_to_probs, match_accept, rejection_sample

BUGS = [None, "accept_all", "target_on_reject"]


def plant(monkeypatch, bug: str | None) -> None:
    if bug == "accept_all":
        monkeypatch.setattr(sampling, "uniform_like", lambda x, generator: torch.zeros_like(x))
    elif bug == "target_on_reject":
        monkeypatch.setattr(sampling, "recovered_probs", lambda target_probs, draft_probs: target_probs)


def follows(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Chi-square goodness of fit at p > 1e-4 (cells with tiny expectation merged away by masking)."""
    expected = probs * counts.sum()
    keep = expected > 5
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]]).double()
    expected = torch.cat([expected[keep], expected[~keep].sum()[None]]).double()
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return (
        chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue
        > 1e-4
    )


@pytest.mark.parametrize("bug", BUGS)
def test_rejection_sampler_emits_the_target_distribution(monkeypatch, bug):
    plant(monkeypatch, bug)
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 40_000, 6
    draft_probs = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05], [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]])  # [K, V]
    target_probs = torch.tensor(
        [[0.1, 0.3, 0.3, 0.1, 0.1, 0.1], [0.3, 0.1, 0.1, 0.3, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]]
    )  # [K+1, V]
    draft_tokens = torch.multinomial(draft_probs, batch, replacement=True, generator=gen).T  # [B, K]
    num_accepted, next_token = rejection_sample(
        draft_tokens,
        torch.full((batch,), 2),
        draft_probs.expand(batch, -1, -1),
        target_probs.expand(batch, -1, -1),
        gen,
    )
    first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)  # first emitted token [B]
    second_rows = num_accepted > 0  # rows whose second emitted token exists in this round
    second = torch.where(num_accepted > 1, draft_tokens[:, 1], next_token)[second_rows]
    ok = follows(torch.bincount(first, minlength=vocab), target_probs[0]) and follows(
        torch.bincount(second, minlength=vocab), target_probs[1]
    )
    assert ok == (bug is None)


def test_match_accept_without_draft_probs_is_exact_and_greedy_is_argmax():
    gen = torch.Generator().manual_seed(1)
    target_logits = torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]]).expand(30_000, -1, -1)  # [B, K+1, V]
    draft_tokens = torch.ones(30_000, 1, dtype=torch.long)
    params = SamplingParams(temperature=1.0)
    num_accepted, next_token = match_accept(
        draft_tokens, torch.ones(30_000, dtype=torch.long), target_logits, params, gen
    )
    first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)
    assert follows(torch.bincount(first, minlength=3), logits_to_probs(target_logits[0, 0], params))
    greedy = match_accept(
        draft_tokens[:1], torch.ones(1, dtype=torch.long), target_logits[:1], SamplingParams(), None
    )
    assert greedy[0].tolist() == [1] and greedy[1].tolist() == [0]


def test_top_k_and_top_p_keep_the_hf_warper_sets():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert (logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2)) > 0).sum() == 2
    probs = logits.softmax(-1)[0]  # [0.64, 0.24, 0.09, 0.03, 0.01]
    kept = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.85)) > 0
    assert kept.tolist() == [[True, True, False, False, False]] and probs[:2].sum() > 0.85


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.8])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (3, 1.0), (0, 0.6), (4, 0.8), (50, 0.95)])
def test_sampling_probabilities_are_the_transformers_warpers(temperature, top_k, top_p):
    """The sampling tests judge the engine against logits_to_probs, the distribution it samples from; it is checked
    here against an independent oracle: transformers' warpers (temperature, then top-k, then top-p, as generate
    applies them), ties included, so a wrong temperature or cutoff cannot hide in both."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(int(temperature * 10) + top_k)
    logits = torch.randn(6, 40, generator=gen) * 3
    logits[0, :4] = logits[0, 0]  # ties at the top
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected = scores.softmax(-1)
    got = logits_to_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.allclose(got, expected, atol=1e-6)


def test_top_k_1_is_greedy_whatever_the_temperature():
    """One definition of greedy for every entry point: top_k 1 keeps only the argmax, so it is greedy (no draws)."""
    logits = torch.tensor([[0.5, 3.0, 2.9, -1.0]])
    params = SamplingParams(temperature=5.0, top_k=1)
    assert params.greedy and not SamplingParams(temperature=5.0, top_k=2).greedy
    warped = (logits / params.temperature).topk(1).indices  # what the top-k warper would keep
    assert logits_to_probs(logits, params).argmax(-1).tolist() == warped.reshape(-1).tolist() == [1]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0 (0 = greedy), got inf"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0 (0 = greedy), got -1.0"),
        ({"top_k": -2}, "top_k must be >= 0 (0 = off), got -2"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ],
)
def test_bad_sampling_params_raise_one_line_naming_the_field_and_value(fields, message):
    with pytest.raises(RequestError) as err:
        SamplingParams(**fields)
    assert err.value.message == message


def target_joint(target_dir, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """[V * V] exact probability of each 2-token continuation under the target's sampling distribution."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    vocab = model.config.vocab_size
    with torch.no_grad():
        first = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], params)  # [V]
        seqs = torch.tensor([prompt + [t] for t in range(vocab)])
        second = logits_to_probs(model(seqs).logits[:, -1], params)  # [V, V]
    return (first[:, None] * second).reshape(-1)


def two_token_counts(target, draft, prompt: list[int], batch: int = 256, seeds: int = 12) -> torch.Tensor:
    """[64] how often each 2-token continuation (first * 8 + second) came out of the engine at temperature 0.5."""
    engine = SpeculativeEngine.from_pretrained(
        target, draft, max_draft_len=2, max_batch_size=batch, max_seq_len=16
    )
    counts = torch.zeros(64, dtype=torch.long)
    for seed in range(seeds):
        params = SamplingParams(
            max_new_tokens=2, num_draft_tokens=2, temperature=0.5, seed=seed, ignore_eos=True
        )
        for result in engine.generate([prompt] * batch, params):
            counts[result.token_ids[0] * 8 + result.token_ids[1]] += 1
    return counts


def test_the_torch_pair_samples_with_a_top_k_above_tensorrt_llms_limit(small_vocab_pair):
    """Only engines behind TensorRT-LLM refuse a top_k above 1024 (tests/test_engine_calls.py); torch's top-k takes
    any k, and a k at or above the vocabulary keeps every token."""
    target, draft = small_vocab_pair
    engine = SpeculativeEngine.from_pretrained(
        target, draft, max_draft_len=2, max_batch_size=1, max_seq_len=16
    )
    params = SamplingParams(max_new_tokens=3, temperature=0.8, top_k=5000, seed=1, ignore_eos=True)
    (result,) = engine.generate([[1, 2, 3]], params)
    assert len(result.token_ids) == 3


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_engine_samples_follow_the_target_distribution(monkeypatch, small_vocab_pair, bug):
    plant(monkeypatch, bug)
    target, draft = small_vocab_pair
    prompt = [1, 2, 3]
    counts = two_token_counts(target, draft, prompt)
    # Round 1 drafts 1 token (the engine never drafts past max_new_tokens); a rejection leaves round 2 to the
    # target alone: acceptance, recovered and bonus tokens all shape the 2-token joint.
    assert follows(counts, target_joint(target, prompt, SamplingParams(temperature=0.5))) == (bug is None)


@pytest.fixture(scope="module")
def padded_vocab_pairs(tmp_path_factory, shared_tokenizer_dir):
    """An 8-row target with a 6-row draft (Qwen2.5's case: the target has rows the draft lacks) and with a 10-row
    draft (the draft has rows the target lacks)."""
    root = tmp_path_factory.mktemp("paddedvocab")
    opts = dict(
        tokenizer_dir=shared_tokenizer_dir, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    target = make_model(root / "target", "llama", num_hidden_layers=2, seed=31, vocab_size=8, **opts)
    drafts = {
        rows: make_model(
            root / f"draft{rows}", "llama", num_hidden_layers=1, seed=32, vocab_size=rows, **opts
        )
        for rows in (6, 10)
    }
    return target, drafts


@pytest.mark.slow
@pytest.mark.parametrize("draft_rows", [6, 10])
@pytest.mark.parametrize("bug", BUGS)
def test_padded_vocab_pair_samples_follow_the_target_distribution(
    monkeypatch, padded_vocab_pairs, draft_rows, bug
):
    """The target's rows 6 and 7 (which a 6-row draft cannot propose) come out with their target probability,
    and a 10-row draft never makes the target score a row it lacks."""
    plant(monkeypatch, bug)
    target, drafts = padded_vocab_pairs
    prompt = [1, 2, 3]
    counts = two_token_counts(target, drafts[draft_rows], prompt)
    joint = target_joint(target, prompt, SamplingParams(temperature=0.5))
    assert joint.reshape(8, 8)[6:].sum() > 0.03  # the rows the 6-row draft lacks matter in this test
    assert follows(counts, joint) == (bug is None)


def test_padded_vocab_pair_greedy_equals_target_greedy(padded_vocab_pairs):
    from test_engine import hf_greedy

    target, drafts = padded_vocab_pairs
    for rows, draft in drafts.items():
        engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=3, max_seq_len=64)
        # Not the pad id 3 in the prompt: HF generate would mask it out of the attention.
        result = engine.generate([[1, 5, 4]], SamplingParams(max_new_tokens=20))[0]
        assert result.token_ids == hf_greedy(target, [1, 5, 4], 20), rows
        assert result.stats.drafted > 0


def test_the_draft_reads_target_rows_it_lacks(padded_vocab_pairs):
    """A hot target samples its rows 6 and 7, which the 6-row draft has no embedding for: the draft then sees its
    own last row there, and generation goes on (the target decides every token)."""
    target, drafts = padded_vocab_pairs
    engine = SpeculativeEngine.from_pretrained(
        target, drafts[6], max_draft_len=3, max_batch_size=32, max_seq_len=32
    )
    params = SamplingParams(max_new_tokens=10, num_draft_tokens=3, temperature=3.0, seed=0, ignore_eos=True)
    results = engine.generate([[1, 5, 4]] * 32, params)
    assert all(len(r.token_ids) == 10 for r in results)
    assert (
        any(t >= 6 for r in results for t in r.token_ids[:-1]) and sum(r.stats.drafted for r in results) > 0
    )


def test_a_tiny_temperature_is_a_near_greedy_distribution_not_nan():
    """temperature 1e-38 passed the request checks and divided the logits into inf - inf = nan (a RuntimeError
    in torch.multinomial, found by the serving audit); it is the limit of sampling: the argmax."""
    from trtspec.engines.sampling import SamplingParams, logits_to_probs, sample

    logits = torch.tensor([[1.0, 3.0, 2.0, -5.0], [0.5, 0.5, -1.0, 0.0]])
    for temperature in (1e-38, 1e-45):
        params = SamplingParams(max_new_tokens=1, temperature=temperature)
        probs = logits_to_probs(logits, params)
        assert torch.isfinite(probs).all()
        assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0] and probs[1].tolist() == [0.5, 0.5, 0.0, 0.0]
        assert sample(logits, params, torch.Generator().manual_seed(0))[0].item() == 1


def target_joint_n(target_dir, prompt: list[int], params: SamplingParams, n: int) -> torch.Tensor:
    """[V ** n] exact probability of each n-token continuation under the target (first token most significant)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    vocab = model.config.vocab_size
    joint, prefixes = torch.ones(1), [[]]
    with torch.no_grad():
        for _ in range(n):
            nxt = logits_to_probs(model(torch.tensor([prompt + p for p in prefixes])).logits[:, -1], params)
            joint = (joint[:, None] * nxt).reshape(-1)  # [len(prefixes) * V]
            prefixes = [p + [t] for p in prefixes for t in range(vocab)]
    return joint


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_adaptive_k_samples_follow_the_target_distribution(monkeypatch, small_vocab_pair, bug):
    """Adaptive K keeps the target's distribution: a K chosen from past draws before a round is drawn changes
    nothing the round's rejection sampling guarantees. The jumpy policy makes K follow the last outcome (prior 0.9
    drafts 2, then a rejection gives 1 or 0, an acceptance 2), so K in rounds 2-3 depends on earlier draws."""
    plant(monkeypatch, bug)
    target, draft = small_vocab_pair
    prompt = [1, 2, 3]
    jumpy = KPolicy(prior=0.9, smoothing=0.5, min_gain=0.0)
    engine = SpeculativeEngine.from_pretrained(
        target, draft, max_draft_len=2, max_batch_size=256, max_seq_len=16, k_policy=jumpy
    )
    counts, ks = torch.zeros(8**4, dtype=torch.long), set()
    for seed in range(12):
        params = SamplingParams(max_new_tokens=4, temperature=0.5, seed=seed, ignore_eos=True)
        for result in engine.generate([prompt] * 256, params):
            a, b, c, d = result.token_ids
            counts[((a * 8 + b) * 8 + c) * 8 + d] += 1
            ks.update(k for k, n in enumerate(result.stats.num_draft_histogram[1:], 1) if n)
    assert ks == ({2} if bug == "accept_all" else {1, 2})  # K did move (accept_all never rejects)
    joint = target_joint_n(target, prompt, SamplingParams(temperature=0.5), 4).reshape(8, 8, 8, 8)
    counts = counts.reshape(8, 8, 8, 8)
    # The first two tokens' joint and the last two's: both see every K path.
    exact = follows(counts.sum((2, 3)).reshape(-1), joint.sum((2, 3)).reshape(-1)) and follows(
        counts.sum((0, 1)).reshape(-1), joint.sum((0, 1)).reshape(-1)
    )
    assert exact == (bug is None)
