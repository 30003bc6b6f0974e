"""The PyTorch draft-target engine: exact greedy outputs vs HF generate, acceptance oracles, batches, stops, limits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import make_model
from torch.nn.attention.bias import CausalBias, causal_lower_right

from trtspec.core.errors import ModelError, RequestError
from trtspec.engines.engine import SpeculativeEngine
from trtspec.engines.models import MAX_BIAS_CELLS, single_row_mask, uses_causal_bias
from trtspec.engines.sampling import SamplingParams
from trtspec.recipe import DEMO_DIR

PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 7, 8], [1, 100]]
MAX_NEW = 24

# arch -> make_model overrides: grouped-query attention, qkv bias (qwen2), q/k norm + tied embeddings (qwen3).
ARCH_CASES = {
    "llama-gqa": ("llama", dict(num_key_value_heads=2)),
    "mistral": ("mistral", dict(num_key_value_heads=2)),
    "qwen2-gqa-bias": ("qwen2", dict(num_key_value_heads=2)),
    "qwen3-tied": ("qwen3", dict(num_key_value_heads=1, tie_word_embeddings=True)),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory, shared_tokenizer_dir):
    root = tmp_path_factory.mktemp("targets")
    return {
        name: make_model(root / name, arch, tokenizer_dir=shared_tokenizer_dir, seed=10 + i, **overrides)
        for i, (name, (arch, overrides)) in enumerate(ARCH_CASES.items())
    }


def hf_greedy(model_dir, prompt: list[int], max_new_tokens: int, dtype=torch.float32) -> list[int]:
    """The oracle: HF generate(do_sample=False) on the target alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("case", list(ARCH_CASES))
def test_greedy_matches_hf_generate_per_sequence_in_a_batch(targets, tiny_pair, case):
    engine = SpeculativeEngine.from_pretrained(targets[case], tiny_pair[1], max_draft_len=4, max_seq_len=128)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4))
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == hf_greedy(targets[case], prompt, MAX_NEW)
        assert result.stats.drafted > 0


def test_hf_forward_fallback_is_exact_too(targets, tiny_pair):
    engine = SpeculativeEngine.from_pretrained(
        targets["qwen3-tied"], tiny_pair[1], max_draft_len=3, lean=False
    )
    results = engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=MAX_NEW))
    for prompt, result in zip(PROMPTS[:2], results, strict=True):
        assert result.token_ids == hf_greedy(targets["qwen3-tied"], prompt, MAX_NEW)


@pytest.mark.parametrize("lean", [True, False])
def test_attention_over_several_queries_never_runs_on_cudnn(tiny_pair, monkeypatch, lean):
    """cuDNN's attention plans each new shape of a call with several queries (about 0.13 s on an H200), and a
    verification's shape changes every round, so both forwards leave it out of such calls
    (models.ATTENTION_BACKENDS; docs/benchmarks.md, "GPU"); a single-token step keeps torch's own choice. The
    flags are process-wide, so this holds on any machine."""
    real, seen = F.scaled_dot_product_attention, []

    def recording(query, *args, **kwargs):
        seen.append((query.shape[-2], torch.backends.cuda.cudnn_sdp_enabled()))
        return real(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    engine = SpeculativeEngine.from_pretrained(*tiny_pair, max_draft_len=2, max_seq_len=64, lean=lean)
    engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, num_draft_tokens=2))
    several = {on for queries, on in seen if queries > 1}
    single = {on for queries, on in seen if queries == 1}
    assert several == {False} and single == {True}
    assert torch.backends.cuda.cudnn_sdp_enabled()  # left as it was outside the forwards


@pytest.mark.parametrize(("start", "length"), [(0, 5), (7, 3), (40, 9)])
def test_one_rows_mask_on_cuda_is_the_bottom_right_bias_that_sees_what_the_cpu_mask_sees(start, length):
    """A GPU verification's mask is torch's causal bias (flash runs it with grouped-query heads); it must let
    each query see exactly the keys the tensor mask does."""
    cpu = single_row_mask(start, length, torch.device("cpu"))
    cuda = single_row_mask(start, length, torch.device("cuda"))  # a description: no GPU is touched
    assert isinstance(cuda, CausalBias) and cpu.shape == (1, 1, length, start + length)
    assert torch.equal(cuda._materialize(torch.device("cpu")), cpu[0, 0])
    assert (
        single_row_mask(start, 1, torch.device("cuda")) is None
        and single_row_mask(start, 1, torch.device("cpu")) is None
    )


def test_the_causal_bias_is_kept_to_verifications_and_short_prompts():
    """Each bias holds a host tensor of 2 x queries x keys (torch's legacy constructor): a long prompt keeps the
    tensor mask, a verification over a long cache still gets the bias, a CPU never does."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert uses_causal_bias(cuda, 100_000, 9) and uses_causal_bias(cuda, 0, 1024)
    assert not uses_causal_bias(cuda, 0, 2048) and not uses_causal_bias(cuda, 500_000, 9)
    assert not uses_causal_bias(cpu, 40, 9) and not uses_causal_bias(cuda, 40, 1)
    assert causal_lower_right(9, 100_009).untyped_storage().nbytes() <= 8 * MAX_BIAS_CELLS


def test_the_lean_forward_under_the_causal_bias_gives_the_tensor_masks_logits(targets, monkeypatch):
    """The bias through the whole lean forward (its scale, grouped-query heads and backend context), here on
    CPU where torch materializes it: a prompt from position 0 (the square case torch runs as is_causal) and a
    verification after it give the logits of the tensor mask."""
    from trtspec.engines import models

    model = models.load_causal_lm(targets["llama-gqa"], num_slots=2, max_seq_len=64)
    assert model.num_heads != model.num_kv_heads
    prompt, verify = torch.tensor([PROMPTS[0]]), torch.tensor([[50, 51, 52, 53]])

    def run():
        first = model.forward(prompt, [0], [0], [prompt.shape[1]], torch.arange(prompt.shape[1])[None])
        again = model.forward(verify, [0], [prompt.shape[1]], [4], torch.arange(4)[None])
        return first, again

    by_mask = run()
    real = models.single_row_mask
    monkeypatch.setattr(
        models, "single_row_mask", lambda start, length, device: real(start, length, torch.device("cuda"))
    )
    for ours, theirs in zip(run(), by_mask, strict=True):
        torch.testing.assert_close(ours, theirs)


def test_draft_equal_to_target_accepts_every_token(tiny_pair):
    target = tiny_pair[0]
    engine = SpeculativeEngine.from_pretrained(target, target, max_draft_len=4)
    params = SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4, ignore_eos=True)
    (result,) = engine.generate([PROMPTS[0]], params)
    stats = result.stats
    assert stats.acceptance_rate == 1.0 and stats.accepted == stats.drafted
    assert stats.bonus_tokens == stats.rounds
    assert stats.target_forwards == -(-MAX_NEW // 5)  # K+1 tokens per target forward
    assert sum(stats.accepted_length_histogram) == stats.rounds


def test_random_draft_accepts_almost_nothing_and_output_is_still_exact(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4)
    (result,) = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4))
    assert result.stats.acceptance_rate < 0.2
    assert result.token_ids == hf_greedy(target, PROMPTS[0], MAX_NEW)


def test_target_only_mode_is_the_same_loop_without_a_draft(tiny_pair):
    target = tiny_pair[0]
    engine = SpeculativeEngine.from_pretrained(target, None)
    (result,) = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
    assert result.stats.drafted == 0 and result.stats.draft_forwards == 0
    assert result.stats.target_forwards == MAX_NEW == len(result.token_ids)


def test_eos_stops_and_is_the_last_token(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4)
    free = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))[0].token_ids
    stop = free[5]
    first = free.index(stop)
    (result,) = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=(stop,)))
    assert result.token_ids == free[: first + 1]
    assert result.finish_reason == "stop"


def test_stop_string_ends_the_text_and_nothing_follows(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=4)
    free = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))[0]
    tokenizer = engine.tokenizer
    stop = tokenizer.decode(free.token_ids[6:8])
    (result,) = engine.generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True, stop_strings=(stop,))
    )
    assert result.finish_reason == "stop"
    assert result.text.endswith(stop) and result.text.count(stop) == 1
    n = len(result.token_ids)
    assert result.token_ids == free.token_ids[:n]
    assert stop in tokenizer.decode(result.token_ids) and stop not in tokenizer.decode(result.token_ids[:-1])


def test_max_new_tokens_is_exact_for_every_k(tiny_pair):
    target = tiny_pair[0]
    engine = SpeculativeEngine.from_pretrained(target, target, max_draft_len=8)
    for k in (1, 3, 8):
        params = SamplingParams(max_new_tokens=7, num_draft_tokens=k, ignore_eos=True)
        result = engine.generate([PROMPTS[2]], params)[0]
        assert len(result.token_ids) == 7 and result.finish_reason == "length"


def test_streaming_yields_rounds_that_add_up_to_the_result(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine.from_pretrained(target, target, max_draft_len=4)
    events = list(
        engine.generate_stream(
            PROMPTS[:2], SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=4, ignore_eos=True)
        )
    )
    results = events[-1].results
    for b in range(2):
        streamed = [t for event in events for t in event.new_tokens[b]]
        assert streamed == results[b].token_ids
    assert max(len(tokens) for tokens in events[0].new_tokens) == 5  # K accepted + 1 bonus in one round


def test_a_steady_load_keeps_in_flight_prompts_in_the_loop_with_their_own_budgets(tiny_pair):
    """generate_stream(in_flight=2) over more prompts than slots: at most 2 emit in a round, the next joins as one
    finishes (``joined``), each stops at its own budget, and each equals the prompt generated alone."""
    engine = SpeculativeEngine.from_pretrained(*tiny_pair, max_draft_len=4, max_batch_size=2)
    prompts, budgets = [PROMPTS[i % len(PROMPTS)] for i in range(5)], [3, 9, 5, 7, 4]
    params = SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=2, ignore_eos=True)
    events = list(engine.generate_stream(prompts, params, in_flight=2, max_new_tokens=budgets))
    emitting = [sum(bool(tokens) for tokens in event.new_tokens) for event in events]
    assert max(emitting) == 2
    assert [b for event in events for b in event.joined] == [2, 3, 4]  # in order, one per finished prompt
    results = events[-1].results
    assert [len(r.token_ids) for r in results] == budgets
    for prompt, budget, result in zip(prompts, budgets, results, strict=True):
        alone = engine.generate([prompt], params.with_(max_new_tokens=budget))[0]
        assert result.token_ids == alone.token_ids
    with pytest.raises(RequestError, match="3 prompts in flight; the engine takes 1..2"):
        list(engine.generate_stream(prompts, params, in_flight=3))
    with pytest.raises(RequestError, match="batch of 5 prompts"):
        engine.generate(prompts, params)


@pytest.mark.parametrize("lean", [True, False])
def test_rows_that_finish_apart_leave_the_rest_on_the_lowest_slots_with_their_caches(
    tiny_pair, lean, monkeypatch
):
    """When a row leaves from below others, the row on the highest slot moves into its place (rounds.Rounds.move),
    so the batch's caches stay consecutive (views, not a gather per layer). Each row's output is still the
    target's greedy continuation (its target cache moved), and a draft equal to the target accepts every token
    as without the moves (its draft cache moved too)."""
    from trtspec.engines.loop import GenerationLoop
    from trtspec.engines.speculative import TorchRounds

    moves = []
    move = TorchRounds.move
    monkeypatch.setattr(
        TorchRounds, "move", lambda self, row, slot: moves.append((row.slot, slot)) or move(self, row, slot)
    )
    target = tiny_pair[0]
    engine = SpeculativeEngine.from_pretrained(target, target, max_draft_len=4, max_seq_len=128, lean=lean)
    params = SamplingParams(max_new_tokens=MAX_NEW, num_draft_tokens=2, ignore_eos=True)
    budgets = [3, MAX_NEW, 12]

    def results():
        return list(engine.generate_stream(PROMPTS, params, max_new_tokens=budgets))[-1].results

    compacted = results()
    # the first row ends first and the third takes its slot; the third ends next and the second takes it
    assert moves == [(2, 0), (1, 0)]
    monkeypatch.setattr(GenerationLoop, "_compact", lambda self: None)
    in_place = results()
    for prompt, budget, result, alone in zip(PROMPTS, budgets, compacted, in_place, strict=True):
        assert result.token_ids == hf_greedy(target, prompt, budget)
        assert (result.stats.drafted, result.stats.accepted) == (alone.stats.drafted, alone.stats.accepted)
        assert result.stats.accepted == result.stats.drafted > 0


def test_num_draft_tokens_above_max_draft_len_is_refused(tiny_pair):
    engine = SpeculativeEngine.from_pretrained(*tiny_pair, max_draft_len=4)
    with pytest.raises(RequestError, match="num_draft_tokens=5 is larger than the engine's max_draft_len=4"):
        engine.generate([PROMPTS[0]], SamplingParams(num_draft_tokens=5))


def test_bad_requests_and_models_are_one_line_errors(tiny_pair, tmp_path):
    engine = SpeculativeEngine.from_pretrained(*tiny_pair, max_draft_len=4, max_seq_len=32)
    with pytest.raises(RequestError, match="max_seq_len 32"):
        engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=30))
    with pytest.raises(RequestError, match="empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(RequestError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ModelError, match="no config.json"):
        SpeculativeEngine.from_pretrained(tmp_path, None)


@pytest.mark.slow
def test_demo_pair_greedy_matches_hf_generate():
    target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    if not (target / "config.json").is_file() or not (draft / "config.json").is_file():
        pytest.skip("demo pair not trained yet (src/trtspec/assets/demo/{target,draft})")
    engine = SpeculativeEngine.from_pretrained(target, draft, max_draft_len=8)
    prompt = engine.tokenizer("def main(argv):\n    ")["input_ids"]
    (result,) = engine.generate([prompt], SamplingParams(max_new_tokens=64, num_draft_tokens=4))
    assert result.token_ids == hf_greedy(target, prompt, 64)
    assert result.stats.acceptance_rate > 0.3
