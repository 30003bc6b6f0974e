"""The TensorRT-LLM draft-target runner against the stand-in ModelRunnerCpp (tests/fake_tensorrt_llm).

The stand-in runs the tiny HF models named in the fake engine configs and verifies draft tokens as the executor
does, so these tests check the loop's outputs (== HF greedy), its acceptance stats and its contract checks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

from trtspec.builders.trtllm_build import build_engines
from trtspec.core.errors import CheckpointError, ModelError, NeedsTensorRTLLM, RequestError
from trtspec.core.trtllm import tensorrt_llm_location
from trtspec.engines.sampling import SamplingParams
from trtspec.engines.trtllm_engine import sampling_kwargs
from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner

PROMPTS = [(1, 40, 41, 42, 43), (1, 50, 60)]


@pytest.fixture
def fake_trtllm(fake_trtllm):
    """The shared stand-in, with one torch thread meanwhile: tiny models' forwards are dominated by thread
    start-up, and on a loaded 2-core machine multi-threaded tiny matmuls are ~20x slower than single-threaded ones.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield fake_trtllm
    torch.set_num_threads(threads)


def write_engine(
    out: Path,
    hf_dir: Path,
    *,
    max_draft_len: int = 0,
    gather_logits: bool = False,
    max_seq_len: int = 96,
    max_num_tokens: int = 8192,
) -> Path:
    """An engine directory in the TensorRT-LLM 1.2.x layout; ``fake_hf_model_dir`` is read only by the stand-in."""
    out.mkdir(parents=True)
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    config = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": vocab,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        },
        "build_config": {
            "max_batch_size": 4,
            "max_input_len": 64,
            "max_seq_len": max_seq_len + max_draft_len,  # trtllm-build adds max_draft_len
            "max_num_tokens": max_num_tokens,
            "max_beam_width": 1,
            "max_draft_len": max_draft_len,
            "speculative_decoding_mode": 2 if max_draft_len else 1,
            "gather_context_logits": False,
            "gather_generation_logits": gather_logits,
            "plugin_config": {"gemm_plugin": "float16", "use_paged_context_fmha": True},
        },
        "fake_hf_model_dir": str(hf_dir),
    }
    (out / "config.json").write_text(json.dumps(config))
    (out / "rank0.engine").write_bytes(b"FAKE")
    return out


@pytest.fixture
def engines(tmp_path, tiny_pair):
    target_hf, draft_hf = tiny_pair
    return {
        "target": write_engine(tmp_path / "target", target_hf, max_draft_len=4, gather_logits=True),
        "draft": write_engine(tmp_path / "draft", draft_hf, gather_logits=True),
        "target_as_draft": write_engine(tmp_path / "target_as_draft", target_hf, gather_logits=True),
        "hf_target": target_hf,
    }


@functools.cache
def hf_greedy(model_dir: Path, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """The oracle: Hugging Face greedy decoding of the target, EOS ignored."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def runner_for(engines, draft="draft", **kwargs) -> TrtllmSpeculativeRunner:
    return TrtllmSpeculativeRunner.from_engine_dirs(
        engines["target"], engines[draft] if draft else None, tokenizer_dir=engines["hf_target"], **kwargs
    )


def test_greedy_output_equals_hf_target_greedy_and_stats_add_up(fake_trtllm, engines):
    runner = runner_for(engines)
    params = SamplingParams(max_new_tokens=14, num_draft_tokens=3, ignore_eos=True)
    results = runner.generate(PROMPTS, params)
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == hf_greedy(engines["hf_target"], prompt, 14)
        s = result.stats
        assert (result.finish_reason, s.generated_tokens, s.max_draft_len) == ("length", 14, 3)
        assert 0 <= s.accepted <= s.drafted <= 3 * s.rounds
        assert sum(s.accepted_length_histogram) == s.rounds
        assert s.accepted == sum(n * c for n, c in enumerate(s.accepted_length_histogram))
        # Every round (verification or plain target step) emits accepted + 1 tokens; nothing was cut.
        assert s.generated_tokens == s.accepted + s.target_forwards
        assert s.draft_forwards == s.drafted
    # The verification calls carried the draft tokens, and never more than the engine's max_draft_len.
    from tensorrt_llm.runtime import ModelRunnerCpp

    verify = [
        kw for d, kw in ModelRunnerCpp.calls if d == str(engines["target"]) and kw.get("draft_tokens_list")
    ]
    assert verify and all(1 <= len(t) <= 3 for kw in verify for t in kw["draft_tokens_list"])
    assert all(kw["max_new_tokens"] <= 4 for kw in verify)


def test_an_adaptive_request_varies_k_through_the_loop_and_keeps_the_greedy_output(fake_trtllm, engines):
    """No num_draft_tokens: the loop's adaptive K picks each round's K (a jumpy policy: every rejection switches
    drafting off, every probe back on), the runner drafts that many, and greedy output is still HF greedy."""
    from trtspec.engines.adaptive import KPolicy

    jumpy = KPolicy(prior=0.99, smoothing=1.0, min_gain=0.0, probe_every=1)
    runner = runner_for(engines, k_policy=jumpy)
    results = runner.generate(PROMPTS, SamplingParams(max_new_tokens=14, ignore_eos=True))
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == hf_greedy(engines["hf_target"], prompt, 14)
        s = result.stats
        assert s.max_draft_len == 4 and s.drafted > 0
        assert len([k for k, n in enumerate(s.num_draft_histogram) if n]) >= 2  # K changed between rounds
        assert s.generated_tokens == s.accepted + s.target_forwards


def test_draft_equal_to_target_accepts_everything(fake_trtllm, engines):
    runner = runner_for(engines, draft="target_as_draft")
    results = runner.generate(PROMPTS, SamplingParams(max_new_tokens=12, num_draft_tokens=3, ignore_eos=True))
    for prompt, result in zip(PROMPTS, results, strict=True):
        s = result.stats
        assert (s.rounds, s.drafted, s.accepted, s.bonus_tokens) == (3, 9, 9, 3)
        assert s.accepted_length_histogram == [0, 0, 0, 3] and s.acceptance_rate == 1.0
        assert (s.tokens_per_round, s.target_forwards) == (4.0, 3)
        assert result.token_ids == hf_greedy(engines["hf_target"], prompt, 12)


def test_target_only_mode_is_one_plain_call_equal_to_greedy(fake_trtllm, engines):
    runner = runner_for(engines)
    [result] = runner.generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=10, num_draft_tokens=0, ignore_eos=True)
    )
    assert result.token_ids == hf_greedy(engines["hf_target"], PROMPTS[0], 10)
    s = result.stats
    assert (s.drafted, s.rounds, s.target_forwards, s.draft_forwards, s.tokens_per_round) == (
        0,
        0,
        10,
        0,
        1.0,
    )
    no_draft = TrtllmSpeculativeRunner.from_engine_dirs(engines["target"])
    assert no_draft.max_draft_len == 0
    assert no_draft.generate(PROMPTS[:1], SamplingParams(max_new_tokens=10, ignore_eos=True))[
        0
    ].token_ids == (result.token_ids)


def test_stop_token_ends_the_request_and_is_kept(fake_trtllm, engines):
    runner = runner_for(engines)
    greedy = hf_greedy(engines["hf_target"], PROMPTS[0], 8)
    stop = greedy[4]
    cut = greedy[: greedy.index(stop) + 1]
    [result] = runner.generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=8, num_draft_tokens=4, stop_token_ids=(stop,))
    )
    assert (result.token_ids, result.finish_reason) == (cut, "stop")


def test_more_draft_tokens_than_the_engine_allows_is_refused(fake_trtllm, engines):
    runner = runner_for(engines)
    assert runner.max_draft_len == 4
    with pytest.raises(RequestError, match="num_draft_tokens=5 is larger than the engine's max_draft_len=4"):
        runner.generate(PROMPTS, SamplingParams(max_new_tokens=4, num_draft_tokens=5))
    with pytest.raises(RequestError, match="max_seq_len 96"):
        runner.generate([[1] * 90], SamplingParams(max_new_tokens=10))


def test_sampling_with_draft_logits_passes_logits_and_is_seeded(fake_trtllm, engines):
    runner = runner_for(engines, draft="target_as_draft", use_draft_logits=True)
    params = SamplingParams(
        max_new_tokens=8, num_draft_tokens=3, temperature=0.8, top_k=50, seed=7, ignore_eos=True
    )
    first = runner.generate(PROMPTS, params)
    again = runner.generate(PROMPTS, params)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    # Same model as draft and target: target_probs == draft_probs, so rejection sampling accepts everything.
    assert all(r.stats.acceptance_rate == 1.0 and r.stats.generated_tokens == 8 for r in first)
    from tensorrt_llm.runtime import ModelRunnerCpp

    verify = [kw for _, kw in ModelRunnerCpp.calls if kw.get("draft_tokens_list")]
    logits = verify[-1]["draft_logits_list"]
    assert [tuple(x.shape) for x in logits] == [
        (len(t), runner.target.vocab_size) for t in verify[-1]["draft_tokens_list"]
    ]
    assert verify[-1]["temperature"] == 0.8 and verify[-1]["top_k"] == 50 and "random_seed" in verify[-1]
    # the request's seed reaches the engines: another seed, other calls' seeds and other tokens
    seeds = {kw["random_seed"] for _, kw in ModelRunnerCpp.calls}
    ModelRunnerCpp.calls.clear()
    other = runner.generate(PROMPTS, dataclasses.replace(params, seed=8))
    assert not seeds & {kw["random_seed"] for _, kw in ModelRunnerCpp.calls}
    assert [r.token_ids for r in other] != [r.token_ids for r in first]


def test_sampled_rows_of_one_batch_draw_their_own_random_numbers(fake_trtllm, engines):
    """ModelRunnerCpp takes one seed per generate call and TensorRT-LLM seeds each request's random state from
    it, so rows sent in one call draw the same numbers: the same prompt four times would sample one text four
    times. Rows holding the same tokens go in calls of their own; rows that differ share a call."""
    runner = runner_for(engines)
    prompt = list(PROMPTS[0])
    for seed in (None, 11):
        params = SamplingParams(
            max_new_tokens=12, num_draft_tokens=2, temperature=1.0, seed=seed, ignore_eos=True
        )
        texts = [tuple(r.token_ids) for r in runner.generate([prompt] * 4, params)]
        assert len(set(texts)) > 1, texts
    from tensorrt_llm.runtime import ModelRunnerCpp

    ModelRunnerCpp.calls.clear()
    params = SamplingParams(max_new_tokens=4, num_draft_tokens=0, temperature=1.0, seed=5, ignore_eos=True)
    runner.generate([prompt, prompt, list(PROMPTS[1])], params)
    assert sorted(len(kw["prompts"]) for _, kw in ModelRunnerCpp.calls) == [1, 2]


def test_padded_vocab_draft_logits_reach_the_target_padded_with_minus_inf(fake_trtllm, tmp_path, tiny_pair):
    """A draft with fewer vocab rows (Qwen2.5's pair): its logits are padded to the target's rows, which the
    runtime's buffer copy needs (the stand-in refuses another size as BufferManager::copy does)."""
    from tiny_models import make_model

    target_hf = tiny_pair[0]
    narrow = make_model(
        tmp_path / "narrow_hf", "llama", tokenizer_dir=target_hf, vocab_size=336, hidden_size=32, seed=5
    )
    wide = make_model(tmp_path / "wide_hf", "llama", tokenizer_dir=target_hf, vocab_size=352, seed=6)
    target = write_engine(tmp_path / "t", wide, max_draft_len=4, gather_logits=True)
    draft = write_engine(tmp_path / "d", narrow, gather_logits=True)
    runner = TrtllmSpeculativeRunner.from_engine_dirs(
        target, draft, tokenizer_dir=wide, use_draft_logits=True
    )
    params = SamplingParams(max_new_tokens=8, num_draft_tokens=3, temperature=0.8, seed=3, ignore_eos=True)
    [result] = runner.generate([list(PROMPTS[0])], params)
    assert result.stats.drafted > 0 and len(result.token_ids) == 8
    from tensorrt_llm.runtime import ModelRunnerCpp

    logits = [kw for _, kw in ModelRunnerCpp.calls if kw.get("draft_tokens_list")][-1]["draft_logits_list"][0]
    assert (
        logits.shape[-1] == 352
        and torch.isinf(logits[:, 336:]).all()
        and torch.isfinite(logits[:, :336]).all()
    )
    narrow_target = write_engine(tmp_path / "nt", narrow, max_draft_len=4)
    wide_draft = write_engine(tmp_path / "wd", wide)
    with pytest.raises(CheckpointError, match="the draft has 352 vocab rows and the target 336"):
        TrtllmSpeculativeRunner.from_engine_dirs(narrow_target, wide_draft, tokenizer_dir=wide)


def test_a_tokenizer_that_does_not_load_is_named_not_dropped(fake_trtllm, engines, tmp_path):
    """As the torch engine: a folder without tokenizer files serves ids only, a broken tokenizer is a ModelError,
    and a draft with a tokenizer of its own needs the target's to reach it as text."""
    import shutil

    broken = shutil.copytree(engines["hf_target"], tmp_path / "broken_tok")
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="broken_tok/tokenizer.json: not valid JSON"):
        TrtllmSpeculativeRunner.from_engine_dirs(engines["target"], engines["draft"], tokenizer_dir=broken)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(engines["hf_target"] / "config.json", bare / "config.json")
    assert TrtllmSpeculativeRunner.from_engine_dirs(engines["target"], tokenizer_dir=bare).tokenizer is None
    with pytest.raises(ModelError, match="give the target's tokenizer"):
        TrtllmSpeculativeRunner.from_engine_dirs(
            engines["target"], engines["draft"], tokenizer_dir=bare, draft_tokenizer_dir=engines["hf_target"]
        )


def test_pair_checks_happen_before_loading(fake_trtllm, tmp_path, tiny_pair):
    target_hf, draft_hf = tiny_pair
    plain_target = write_engine(tmp_path / "t", target_hf, gather_logits=True)
    draft = write_engine(tmp_path / "d", draft_hf)
    with pytest.raises(CheckpointError, match="built without draft support .*'none', max_draft_len 0"):
        TrtllmSpeculativeRunner.from_engine_dirs(plain_target, draft)
    target = write_engine(tmp_path / "t4", target_hf, max_draft_len=4, gather_logits=True)
    with pytest.raises(
        CheckpointError, match="draft engine lacks --gather_generation_logits, which use_draft_logits needs"
    ):
        TrtllmSpeculativeRunner.from_engine_dirs(target, draft, use_draft_logits=True)
    with pytest.raises(CheckpointError, match="cannot read the engine config"):
        TrtllmSpeculativeRunner.from_engine_dirs(target, tmp_path / "missing")
    # without chunked context a sequence longer than max_num_tokens fails part-way: refused before loading
    short = write_engine(tmp_path / "t5", target_hf, max_draft_len=4, max_num_tokens=64)
    with pytest.raises(CheckpointError, match="target engine max_num_tokens 64 < limits.max_seq_len 96 - 1"):
        TrtllmSpeculativeRunner.from_engine_dirs(short, draft)


def test_without_tensorrt_llm_it_says_so(engines):
    assert tensorrt_llm_location() is None
    with pytest.raises(
        NeedsTensorRTLLM, match="^running TensorRT engines needs tensorrt_llm .*run inside nvcr"
    ) as err:
        runner_for(engines)
    assert err.value.exit_code == 3


def test_wrong_tensorrt_llm_version_is_refused(fake_trtllm, engines):
    fake_trtllm.setenv("FAKE_TRTLLM_VERSION", "1.3.0rc20")
    with pytest.raises(NeedsTensorRTLLM, match="1.3.0rc20 is installed"):
        runner_for(engines)


def test_engine_system_drives_the_runner(fake_trtllm, engines):
    from trtspec.validate.systems import EngineSystem, Request

    system = EngineSystem(runner_for(engines), name="TensorRT-LLM engines")
    [gen] = system.generate([Request("x", PROMPTS[0])], SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert gen.token_ids == hf_greedy(engines["hf_target"], PROMPTS[0], 6)
    assert gen.stats.rounds >= 1 and sum(n for _, n in gen.chunks) == 6


def test_engines_from_the_build_run_through_from_recipe(fake_trtllm, tmp_path, tiny_pair):
    """checkpoint -> build_engines (the fake trtllm-build, in a child) -> from_recipe -> generate."""
    from trtspec.builders import plan as P
    from trtspec.recipe import recipe_from_dict

    target_hf, draft_hf = tiny_pair
    recipe = recipe_from_dict(
        {
            "name": "pair",
            "target": {"model": str(target_hf)},
            "draft": {"model": str(draft_hf)},
            "speculative": {"max_draft_len": 3},
            "limits": {"max_batch_size": 2, "max_input_len": 32, "max_seq_len": 48},
        },
        check_paths=False,
    )
    root = tmp_path / "engines" / "pair"
    facts = {}
    for role, hf in (("target", target_hf), ("draft", draft_hf)):
        ckpt = root / role / "checkpoint"
        ckpt.mkdir(parents=True)
        vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
        config = {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": vocab,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": None},
            "fake_hf_model_dir": str(hf),
        }
        (ckpt / "config.json").write_text(json.dumps(config))
        (ckpt / "rank0.safetensors").write_bytes(b"\0" * 8)
        facts[role] = (ckpt, P.read_checkpoint_config(ckpt))
    plan = P.make_build_plan(recipe, facts, {r: root / r / "engine" for r in P.ROLES})
    build_engines(list(plan.engines()), tmp_path / "build.log")

    runner = TrtllmSpeculativeRunner.from_recipe(recipe, tmp_path / "engines")
    assert (runner.max_draft_len, runner.max_seq_len, runner.max_batch_size) == (3, 48, 2)
    [result] = runner.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert result.token_ids == hf_greedy(target_hf, PROMPTS[0], 8)
    assert result.stats.max_draft_len == 3 and result.stats.rounds >= 2
    sessions = [r.runner.session for r in (runner.draft, runner.target)]
    runner.close()
    assert all(s.is_shut_down for s in sessions)


@pytest.mark.parametrize("attribute", ["session", "executor"])
def test_close_shuts_the_executor_down_under_either_name_the_runner_keeps_it(attribute, tmp_path):
    """ModelRunnerCpp keeps its trtllm.Executor as ``session`` in some 1.x releases and ``executor`` in others."""
    from types import SimpleNamespace

    from trtspec.engines.trtllm_engine import EngineRunner

    shut = []
    executor = SimpleNamespace(shutdown=lambda: shut.append(1))
    limits = dict(max_batch_size=2, max_seq_len=64, gather_generation_logits=False)
    facts = {"max_draft_len": 3, "vocab_size": 320}
    runner = EngineRunner(SimpleNamespace(**limits, **{attribute: executor}), tmp_path, facts)
    runner.close()
    assert shut == [1] and runner.runner is None


def test_sampling_kwargs():
    assert sampling_kwargs(0.0, 50, 0.9, 3) == {
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 0.0,
        "num_beams": 1,
        "random_seed": 3,
    }
    assert sampling_kwargs(0.7, 0, 1.0, None) == {
        "temperature": 0.7,
        "top_k": 0,
        "top_p": 1.0,
        "num_beams": 1,
    }
