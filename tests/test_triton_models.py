"""The Triton python models' pure logic without a server: the orchestrator's rounds (in the one loop) replayed over
scripted draft / target outputs (tensorrtllm_backend's all_models/tests/test_decode.py style), request validation, stop words and
incremental detokenization, and the torch engine model's KV-slot choice."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from trtspec.core.errors import RequestError
from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo.models.decode import EngineRounds, one_after_the_other, speculate
from trtspec.triton_repo.models.engine import cpu_threads, split_cores
from trtspec.triton_repo.models.request import Limits, parse_request
from trtspec.triton_repo.models.text import (
    IncrementalDecoder,
    StreamDecoder,
    TextCodec,
    encode_prompt,
    from_word_list,
    stop_words_ids,
    to_word_list,
)

END = 2


class Script:
    """Replays scripted draft and target answers, one per round, and records how each was called."""

    def __init__(self, drafts: list[list[int]], targets: list[list[int]]):
        self.drafts, self.targets = drafts, targets
        self.draft_calls: list[tuple[list[int], int]] = []
        self.target_calls: list[tuple[list[int], list[int]]] = []

    def draft(self, tokens, k, round_index):
        self.draft_calls.append((list(tokens), k))
        return self.drafts[round_index], None

    def target(self, tokens, draft_tokens, draft_logits, round_index):
        self.target_calls.append((list(tokens), list(draft_tokens)))
        return self.targets[round_index]


def _speculate(
    prompt,
    draft,
    target,
    *,
    max_tokens=100,
    num_draft_tokens=3,
    max_seq_len=1000,
    end_ids=(END,),
    stop_ids=(),
    first_token_alone=False,
    draft_ahead=None,
    together=one_after_the_other,
):
    """One request through the orchestrator's rounds in the loop, as the orchestrator runs it (request.to_job's
    terms: max_tokens capped to max_seq_len, end ids left out); its events, one per round."""
    prompt = list(prompt)
    params = SamplingParams(
        max_new_tokens=max(min(max_tokens, max_seq_len - len(prompt)), 1), num_draft_tokens=num_draft_tokens
    )
    rounds = EngineRounds(
        draft, target, max_draft_len=4, max_seq_len=max_seq_len, draft_ahead=draft_ahead, together=together
    )
    options = {"eos_ids": set(end_ids), "keep_end": False, "stop_sequences": stop_ids}
    return list(speculate(prompt, params, rounds, first_token_alone=first_token_alone, **options))


def _run(script: Script, prompt=(10, 11), **kwargs):
    return _speculate(prompt, script.draft, script.target, **kwargs)


def test_rounds_emit_accepted_plus_one_and_count_accepted_and_bonus_tokens():
    # round 0: 2 of 3 accepted + recovered 9 (the target's surplus 99 is not this round's output);
    # round 1: all 3 accepted + bonus 8; round 2: 1 draft (budget), rejected, recovered 30; round 3: plain step
    script = Script(
        drafts=[[5, 6, 7], [20, 21, 22], [40, 41, 42]],
        targets=[[5, 6, 9, 99], [20, 21, 22, 8], [30, 99], [50]],
    )
    rounds = _run(script, max_tokens=9)
    stats = rounds[-1].stats
    assert [r.new_tokens for r in rounds] == [[5, 6, 9], [20, 21, 22, 8], [30], [50]]
    assert [(r.num_draft, r.num_accepted) for r in rounds] == [(3, 2), (3, 3), (1, 0), (0, 0)]
    assert [r.finished for r in rounds] == [False, False, False, True]
    assert rounds[-1].result.finish_reason == "length"
    # the target verifies the growing sequence; later rounds draft only what the budget leaves room for
    assert script.target_calls[1] == ([10, 11, 5, 6, 9], [20, 21, 22])
    assert script.draft_calls[2] == ([10, 11, 5, 6, 9, 20, 21, 22, 8], 1)
    assert len(script.draft_calls) == 3 and script.target_calls[3][1] == []
    assert (stats.drafted, stats.accepted, stats.bonus_tokens, stats.rounds) == (7, 5, 1, 3)
    assert stats.accepted_length_histogram == [1, 0, 1, 1]
    assert stats.generated_tokens == 9 and stats.target_forwards == 4
    assert stats.acceptance_rate == pytest.approx(5 / 7)


def test_end_id_stops_without_emitting_it():
    script = Script(drafts=[[5, 6, 7], [1, 1, 1]], targets=[[5, END, 7, 8], [1, 1, 1, 1]])
    rounds = _run(script)
    assert [r.new_tokens for r in rounds] == [[5]]
    assert rounds[-1].finished and rounds[-1].result.finish_reason == "stop"
    assert len(script.target_calls) == 1


def test_any_id_of_an_eos_list_stops():
    """Llama 3 Instruct ends at any of [128001, 128008, 128009]; TensorRT-LLM's engines take one end_id."""
    script = Script(drafts=[[5, 6, 7]], targets=[[5, 6, 42, 8]])
    rounds = _run(script, end_ids=(END, 42))
    assert [r.new_tokens for r in rounds] == [[5, 6]] and rounds[-1].result.finish_reason == "stop"


def test_the_codec_reads_an_eos_list_from_generation_config(tmp_path, shared_tokenizer_dir):
    import json
    import shutil

    tokenizer_dir = tmp_path / "tok"
    shutil.copytree(shared_tokenizer_dir, tokenizer_dir)
    codec = TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)})
    eos = codec.tokenizer.eos_token_id
    assert codec.end_ids == (eos,) and codec.end_id == eos
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, eos, 9]}))
    codec = TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)})
    assert codec.end_ids == (7, eos, 9) and codec.end_id == eos
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert TextCodec.from_parameters({"tokenizer_dir": str(tokenizer_dir)}).end_id == 7


def test_stop_sequence_across_rounds_is_emitted_and_stops():
    # stop word [6, 9]: its first token ends round 0, the second arrives in round 1
    script = Script(drafts=[[5, 1, 1], [9, 4, 4]], targets=[[5, 6], [9, 4, 4, 4]])
    rounds = _run(script, stop_ids=[[6, 9]])
    assert [r.new_tokens for r in rounds] == [[5, 6], [9]]
    assert rounds[-1].result.finish_reason == "stop"


def test_max_tokens_truncates_the_last_round_and_leaves_room_for_the_target_token():
    script = Script(drafts=[[5, 6, 7], [8]], targets=[[5, 6, 7, 4], [8, 3]])
    rounds = _run(script, max_tokens=5)
    assert sum(len(r.new_tokens) for r in rounds) == 5
    assert [r.new_tokens for r in rounds] == [[5, 6, 7, 4], [8]]
    assert len(script.draft_calls) == 1  # budget 1: no draft call at all
    assert script.target_calls[1][1] == []  # a plain target step
    assert rounds[-1].result.finish_reason == "length"


def test_max_seq_len_ends_generation():
    script = Script(drafts=[[5, 6]], targets=[[5, 6, 7]])
    rounds = _run(script, prompt=(1, 1, 1), max_seq_len=6)
    assert [r.new_tokens for r in rounds] == [[5, 6, 7]]
    assert script.draft_calls[0][1] == 2  # budget 3 leaves 2 draft tokens + the target's own
    assert rounds[-1].finished and rounds[-1].result.finish_reason == "length"


def test_target_without_new_tokens_ends_as_it_cannot_progress():
    rounds = _run(Script(drafts=[[5, 6, 7]], targets=[[]]))
    assert len(rounds) == 1 and rounds[0].result.finish_reason == "stop" and rounds[0].new_tokens == []


def test_surplus_draft_and_target_tokens_are_ignored():
    script = Script(drafts=[[5, 6, 7, 8, 9]], targets=[[5, 6, 7, 1, 77, 78]])
    rounds = _run(script, max_tokens=4)
    assert rounds[0].new_tokens == [5, 6, 7, 1] and rounds[0].num_draft == 3


def test_k_zero_is_plain_target_decoding():
    script = Script(drafts=[], targets=[[5], [6], [7]])
    rounds = _run(script, num_draft_tokens=0, max_tokens=3)
    assert [r.new_tokens for r in rounds] == [[5], [6], [7]] and script.draft_calls == []


def test_first_token_alone_takes_round_zero_from_the_target_prefill_then_drafts():
    script = Script(drafts=[[], [6, 7, 8]], targets=[[5], [6, 7, 9, 99]])  # indexed by round
    rounds = _run(script, max_tokens=4, first_token_alone=True)
    stats = rounds[-1].stats
    assert [r.new_tokens for r in rounds] == [[5], [6, 7, 9]] and rounds[-1].result.finish_reason == "length"
    assert script.target_calls[0] == ([10, 11], []) and script.draft_calls == [([10, 11, 5], 2)]
    # the prefill round counts as a target forward, not as a drafting round
    assert (stats.rounds, stats.target_forwards, stats.drafted, stats.accepted) == (1, 2, 2, 2)


def _toy_next(tokens: list[int]) -> int:
    """A deterministic 'model': the greedy next token of a sequence."""
    return (sum(tokens) * 7 + len(tokens)) % 50 + 3


def _toy_greedy(prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        out.append(_toy_next(out))
    return out[len(prompt) :]


def _toy_target(tokens, draft_tokens, draft_logits, round_index):
    """TensorRT-LLM's answer to a request with draft_input_ids: accepted prefix + one recovered / bonus token."""
    new, seq = [], list(tokens)
    for d in draft_tokens:
        want = _toy_next(seq)
        if d != want:
            break
        new.append(d)
        seq.append(d)
    return new + [_toy_next(seq)]


def _toy_draft(kind: str):
    def draft(tokens, k, round_index):
        if kind == "same_as_target":
            return _toy_greedy(tokens, k), None
        if kind == "every_third_wrong":  # right where the sequence length is not a multiple of 3
            out = list(tokens)
            for _ in range(k):
                out.append(_toy_next(out) if len(out) % 3 else 1)
            return out[len(tokens) :], None
        return [1] * k, None  # _toy_next never returns 1

    return draft


@pytest.mark.parametrize("draft_ahead", [False, True])
@pytest.mark.parametrize("first_token_alone", [False, True])
@pytest.mark.parametrize("draft_kind", ["same_as_target", "every_third_wrong", "always_wrong"])
def test_output_equals_plain_greedy_whatever_the_draft(draft_kind, first_token_alone, draft_ahead):
    prompt = [4, 9, 12]
    rounds = _speculate(
        prompt,
        _toy_draft(draft_kind),
        _toy_target,
        max_tokens=23,
        num_draft_tokens=4,
        first_token_alone=first_token_alone,
        draft_ahead=(lambda: True) if draft_ahead else None,
    )
    stats = rounds[-1].stats
    assert [t for r in rounds for t in r.new_tokens] == _toy_greedy(prompt, 23)
    expected_rate = {"same_as_target": 1.0, "always_wrong": 0.0}.get(draft_kind)
    if expected_rate is None:
        assert 0 < stats.acceptance_rate < 1
    else:
        assert stats.acceptance_rate == expected_rate
    if draft_kind == "same_as_target":  # 5 tokens per round, the last round trimmed to the budget
        assert [len(r.new_tokens) for r in rounds] == (
            [1, 5, 5, 5, 5, 2] if first_token_alone else [5] * 4 + [3]
        )


class Recorder:
    """The toy draft and target, recording each call; ``together`` records that both ran in one call."""

    def __init__(self, kind: str):
        self.kind_draft = _toy_draft(kind)
        self.draft_calls: list[tuple[int, int, int]] = []  # (context length, k, round index)
        self.target_calls = 0
        self.together_calls = 0

    def draft(self, tokens, k, round_index):
        self.draft_calls.append((len(tokens), k, round_index))
        return self.kind_draft(tokens, k, round_index)

    def target(self, tokens, draft_tokens, draft_logits, round_index):
        self.target_calls += 1
        return _toy_target(tokens, draft_tokens, draft_logits, round_index)

    def together(self, first, second):
        self.together_calls += 1
        return first(), second()


def _ahead_run(rec: Recorder, ahead=lambda: True, **kwargs):
    options = dict(max_tokens=12, num_draft_tokens=3, max_seq_len=1000, first_token_alone=True) | kwargs
    return _speculate([4, 9, 12], rec.draft, rec.target, draft_ahead=ahead, together=rec.together, **options)


def test_draft_ahead_replaces_the_next_draft_call_when_the_draft_and_its_bonus_guess_are_accepted():
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec)
    assert [t for r in rounds for t in r.new_tokens] == _toy_greedy([4, 9, 12], 12)
    # round 0 (the prefill) drafts nothing ahead (it would slow the first token); round 1 drafts K = 3 itself and
    # K + 1 = 4 ahead for round 2 (with round 2's seed), whose guess is right, and so on; the last round (budget 3)
    # has no room for a next one and drafts nothing ahead
    assert [len(r.new_tokens) for r in rounds] == [1, 4, 4, 3]
    assert rec.draft_calls == [(4, 3, 1), (8 - 1, 4, 2), (12 - 1, 4, 3)]
    assert rec.target_calls == 4 and rec.together_calls == 2


def test_draft_ahead_that_misses_falls_back_to_a_fresh_draft_from_the_verified_tokens():
    rec = Recorder("always_wrong")
    rounds = _ahead_run(rec)
    assert [t for r in rounds for t in r.new_tokens] == _toy_greedy([4, 9, 12], 12)
    ahead = [c for c in rec.draft_calls if c[1] == 4]
    fresh = [c for c in rec.draft_calls if c[1] < 4]
    # every round after the prefill drafts afresh from the verified sequence (one token longer each round)
    assert [length for length, _, _ in fresh] == list(range(4, 4 + len(fresh)))
    assert len(fresh) == sum(1 for r in rounds if r.num_draft)
    assert len(ahead) == rec.together_calls > 0


@pytest.mark.parametrize("ahead", [None, lambda: False])
def test_no_draft_ahead_when_off_or_while_other_requests_run(ahead):
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec, ahead=ahead)
    assert [t for r in rounds for t in r.new_tokens] == _toy_greedy([4, 9, 12], 12)
    assert rec.together_calls == 0 and all(k <= 3 for _, k, _ in rec.draft_calls)


@pytest.mark.parametrize("first_token_alone", [False, True])
@pytest.mark.parametrize("max_seq_len", range(9, 19))
def test_draft_ahead_stays_within_max_seq_len(max_seq_len, first_token_alone):
    rec = Recorder("same_as_target")
    rounds = _ahead_run(rec, max_seq_len=max_seq_len, max_tokens=100, first_token_alone=first_token_alone)
    assert all(length + k <= max_seq_len for length, k, _ in rec.draft_calls)
    assert rounds[-1].result.finish_reason == "length"
    assert 3 + sum(len(r.new_tokens) for r in rounds) == max_seq_len


def test_no_draft_ahead_without_drafts():
    rec = Recorder("same_as_target")
    _ahead_run(rec, num_draft_tokens=0)
    assert rec.draft_calls == [] and rec.together_calls == 0


def test_draft_ahead_passes_the_guess_logits_on_to_the_next_verification():
    vocab = 60
    verified_logits = []

    def draft(tokens, k, round_index):
        ids = _toy_greedy(tokens, k)
        logits = np.zeros((k, vocab), dtype=np.float32)
        logits[np.arange(k), ids] = 1.0  # one-hot rows, so each row names its token
        return ids, logits

    def target(tokens, draft_tokens, draft_logits, round_index):
        if draft_tokens:
            verified_logits.append((list(draft_tokens), draft_logits.argmax(-1).tolist()))
        return _toy_target(tokens, draft_tokens, draft_logits, round_index)

    _speculate(
        [4, 9, 12],
        draft,
        target,
        max_tokens=12,
        max_seq_len=100,
        first_token_alone=True,
        draft_ahead=lambda: True,
    )
    assert verified_logits and all(ids == rows for ids, rows in verified_logits)


# ------------------------------------------------------------------ request validation

LIMITS = Limits(max_draft_len=4, num_draft_tokens=3, max_seq_len=128)


def _inputs(**fields):
    return {
        name: np.array([[value.encode() if isinstance(value, str) else value]])
        for name, value in fields.items()
    }


def test_a_good_request_gets_the_repository_defaults():
    req = parse_request(_inputs(text_input="def f():", max_tokens=8), LIMITS)
    assert (req.text, req.params.max_new_tokens, req.params.num_draft_tokens, req.stream) == (
        "def f():",
        8,
        3,
        False,
    )
    assert req.params.greedy and req.params.seed is None and req.stop_words == ()
    req = parse_request(
        _inputs(text_input="x", max_tokens=2, num_draft_tokens=0, temperature=0.7, top_k=5, seed=3), LIMITS
    )
    assert req.params == SamplingParams(
        max_new_tokens=2, num_draft_tokens=0, temperature=0.7, top_k=5, seed=3
    )
    assert not req.params.greedy


def test_stop_words_are_read_as_strings_and_empty_ones_dropped():
    inputs = _inputs(text_input="x", max_tokens=2)
    inputs["stop_words"] = np.array([[b"\n\n", b"", b"END"]], dtype=object)
    assert parse_request(inputs, LIMITS).stop_words == ("\n\n", "END")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_tokens": 4}, "input 'text_input' is required"),
        ({"text_input": "  ", "max_tokens": 4}, "text_input is empty"),
        ({"text_input": "x"}, "input 'max_tokens' is required"),
        ({"text_input": "x", "max_tokens": -3}, "max_tokens must be > 0, got -3"),
        ({"text_input": "x", "max_tokens": 4, "num_draft_tokens": 5}, "num_draft_tokens 5 is out of range"),
        ({"text_input": "x", "max_tokens": 4, "num_draft_tokens": -1}, "max_draft_len 4"),
        ({"text_input": "x", "max_tokens": 4, "temperature": -0.5}, "temperature must be >= 0"),
        ({"text_input": "x", "max_tokens": 4, "temperature": float("nan")}, "temperature must be >= 0"),
        ({"text_input": "x", "max_tokens": 4, "temperature": float("inf")}, "temperature must be >= 0"),
        ({"text_input": "x", "max_tokens": 4, "top_k": -1}, "top_k must be >= 0"),
        ({"text_input": "x", "max_tokens": 4, "top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"text_input": "x", "max_tokens": 4, "top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ],
)
def test_bad_requests_raise_one_clear_line(fields, message):
    with pytest.raises(RequestError) as err:
        parse_request(_inputs(**fields), LIMITS)
    assert message in err.value.message and "\n" not in err.value.message


def test_draft_logits_are_refused_where_the_engines_do_not_gather_them():
    with pytest.raises(RequestError, match="use_draft_logits=true needs a repository deployed with"):
        parse_request(_inputs(text_input="x", max_tokens=2, use_draft_logits=True), LIMITS)
    assert not parse_request(
        _inputs(text_input="x", max_tokens=2, use_draft_logits=False), LIMITS
    ).use_draft_logits
    gathering = Limits(max_draft_len=4, num_draft_tokens=3, max_seq_len=128, use_draft_logits=True)
    assert parse_request(_inputs(text_input="x", max_tokens=2), gathering).use_draft_logits
    assert not parse_request(
        _inputs(text_input="x", max_tokens=2, use_draft_logits=False), gathering
    ).use_draft_logits


@pytest.mark.parametrize(
    "sampling, sent",
    [
        ({}, {"runtime_top_k": 1}),
        ({"temperature": 0.7, "top_k": 1}, {"runtime_top_k": 1}),
        ({"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.7, "runtime_top_k": 0, "runtime_top_p": 0.9}),
    ],
)
def test_engines_get_top_k_1_for_greedy_requests_and_the_sampling_values_otherwise(sampling, sent):
    """TensorRT-LLM divides logits by (temperature + 1e-6): greedy goes as top_k = 1, as upstream's clients send it."""
    from trtspec.triton_repo.models import orchestrator

    req = parse_request(_inputs(text_input="def", max_tokens=4, **sampling), LIMITS)
    inputs = orchestrator.EngineClient("t", "d", req, end_id=2, pad_id=3)._common([5, 6], 3, 0)
    knobs = {
        k: inputs[k].reshape(-1)[0].item()
        for k in ("temperature", "runtime_top_k", "runtime_top_p")
        if k in inputs
    }
    assert knobs == pytest.approx(sent)


def test_several_values_for_a_scalar_input_are_refused():
    inputs = _inputs(text_input="x")
    inputs["max_tokens"] = np.array([[4, 5]], dtype=np.int32)
    with pytest.raises(
        RequestError, match=r"'max_tokens' must hold one value per request, got shape \[1, 2\]"
    ):
        parse_request(inputs, LIMITS)


# ------------------------------------------------------------------ text: prompts, stop words, streaming


@pytest.fixture(scope="module")
def tokenizer(shared_tokenizer_dir):
    from trtspec.core.model_dir import load_tokenizer

    return load_tokenizer(str(shared_tokenizer_dir))


def test_encode_prompt_refuses_empty_and_too_long_prompts(tokenizer):
    assert encode_prompt(tokenizer, "def f():", add_special_tokens=False, max_input_len=64)
    with pytest.raises(RequestError, match="text_input is empty"):
        encode_prompt(tokenizer, " \n", add_special_tokens=False, max_input_len=64)
    n = len(tokenizer.encode("def " * 20, add_special_tokens=False))
    with pytest.raises(
        RequestError, match=f"the prompt has {n} tokens, more than max_input_len 8; shorten it"
    ):
        encode_prompt(tokenizer, "def " * 20, add_special_tokens=False, max_input_len=8)


def test_text_codec_reads_the_model_parameters_and_applies_them(shared_tokenizer_dir, tokenizer):
    params = {
        "tokenizer_dir": str(shared_tokenizer_dir),
        "add_special_tokens": "False",
        "skip_special_tokens": "True",
        "max_input_len": "8",
    }
    codec = TextCodec.from_parameters(params)
    assert codec.encode("def f():") == tokenizer.encode("def f():", add_special_tokens=False)
    with pytest.raises(RequestError, match="more than max_input_len 8"):
        codec.encode("def " * 20)
    assert codec.stop_ids(["", "return"]) == [tokenizer.encode("return", add_special_tokens=False)]
    ids = tokenizer.encode("x = 1", add_special_tokens=False)
    assert codec.decode([tokenizer.eos_token_id, *ids]) == tokenizer.decode(ids)  # special tokens skipped
    assert codec.end_id == tokenizer.eos_token_id
    assert codec.pad_id == (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else codec.end_id)
    keep = TextCodec.from_parameters(
        {"tokenizer_dir": str(shared_tokenizer_dir), "skip_special_tokens": "false"}
    )
    assert keep.max_input_len is None and tokenizer.eos_token in keep.decode([tokenizer.eos_token_id])


def test_cpu_threads_auto_shares_the_cores_among_the_model_processes_and_is_at_least_one():
    assert [cpu_threads("auto", n) for n in (1, 2, 3, 16)] == [1, 1, 1, 8]  # the harness: two engine models
    assert [cpu_threads("auto", n, models=1) for n in (1, 2, 16)] == [1, 2, 16]  # the torch runtime: one
    assert cpu_threads("3", 16) == 3 and cpu_threads(" AUTO ", 4) == 2
    assert cpu_threads("auto") >= 1


def test_the_loop_keeps_its_threads_cores_and_the_sending_thread_gets_the_rest():
    assert split_cores([0, 1], 1) == ({0}, {1})
    assert split_cores([2, 3, 5, 7], 2) == ({2, 3}, {5, 7})
    assert (
        split_cores([0, 1], 2) is None and split_cores([0], 1) is None
    )  # every core is the loop's: no pinning


ONE_CORE = len(os.sched_getaffinity(0)) < 2


@pytest.mark.skipif(ONE_CORE, reason="pinning to one of several cores needs two")
def test_the_sending_thread_builds_small_steps_the_loop_large_ones_and_each_request_stays_in_order(
    tokenizer, monkeypatch
):
    from trtspec.triton_repo.models import inflight, triton_io
    from trtspec.triton_repo.models.inflight import Outbox, Reply

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    builders, build = [], inflight.build_responses

    def recording_build(request_id, reply, event, cancel):
        builders.append((request_id, threading.current_thread().name))
        return build(request_id, reply, event, cancel)

    monkeypatch.setattr(inflight, "build_responses", recording_build)
    core = min(os.sched_getaffinity(0))
    sent, sent_on, done = {}, [], threading.Event()

    class Sender:
        def __init__(self, name):
            self.name = name

        def send(self, response, flags=0):
            sent.setdefault(self.name, []).append(response.tensors["text_output"][0, 0].decode())
            sent_on.append((threading.current_thread().name, os.sched_getaffinity(0)))
            if self.name == "c" and flags:
                done.set()

    fields = {"text_input": np.array([b"x"]), "max_tokens": np.array([64]), "stream": np.array([True])}
    replies = {name: Reply(parse_request(fields, LIMITS), TextCodec(tokenizer)) for name in "abc"}
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n" * 3, add_special_tokens=False)
    rounds = [ids[i : i + 3] for i in range(0, len(ids), 3)]
    outbox = Outbox(cancel=lambda request_id: None, cores={core}, loop_builds_from=3)
    try:
        for i, tokens in enumerate(rounds):
            names = "a" if i < 2 else "abc"  # one request, then three
            for name in names:
                event = _event(tokens if name == "a" else rounds[i - 2], finished=i == len(rounds) - 1)
                outbox.put(name, Sender(name), replies[name], lambda: False, event)
            if i == 0:
                time.sleep(0.05)
                assert sent == {}  # nothing goes out before a step is flushed
            outbox.flush()
            deadline = time.monotonic() + 10
            while outbox.unbuilt and time.monotonic() < deadline:  # a step built over there: the next may be
                time.sleep(0.001)  # built here (see below for one that is not)
        assert done.wait(10)
    finally:
        outbox.stop()
    assert "".join(sent["a"]) == tokenizer.decode(ids)
    assert "".join(sent["c"]) == tokenizer.decode([t for r in rounds[:-2] for t in r])
    assert all(cores == {core} for _, cores in sent_on)  # sent from the sending thread, on its cores
    main = threading.current_thread().name
    assert builders[:2] == [("a", "send"), ("a", "send")] and set(builders[2:]) == {(n, main) for n in "abc"}
    assert len(builders) == 2 + 3 * (len(rounds) - 2)


def test_the_loop_builds_no_step_while_an_earlier_one_waits_to_be_built_over_there():
    from trtspec.triton_repo.models.inflight import Outbox

    outbox = Outbox(cancel=lambda request_id: None, loop_builds_from=1)
    gate, builders = threading.Event(), []

    def slow_build(step):  # the sending thread is still building an earlier step of request a
        builders.append(threading.current_thread().name)
        gate.wait(10)
        for item in step:
            item.responses = []

    outbox._build = slow_build
    try:
        with outbox.lock:
            outbox.unbuilt = 1
        outbox.put("a", None, None, lambda: False, _event([5]))
        outbox.flush()  # one event reaches loop_builds_from, but building it here could overtake the earlier step
        assert outbox.unbuilt == 2
        gate.set()
        deadline = time.monotonic() + 10
        while outbox.unbuilt > 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        gate.set()
        outbox.stop()
    assert builders == ["send"] and outbox.unbuilt == 1


def test_word_lists_use_tensorrt_llm_layout_and_round_trip():
    words = [[5, 6], [7], [8, 9, 10]]
    array = to_word_list(words)
    assert array.tolist() == [[5, 6, 7, 8, 9, 10], [2, 3, 6, -1, -1, -1]]
    assert array.dtype == np.int32 and from_word_list(array) == words
    assert from_word_list(to_word_list([])) == []


def test_stop_words_are_tokenised_without_special_tokens(tokenizer):
    ids = stop_words_ids(tokenizer, ["\n\n", "", "return"])
    assert ids == [
        tokenizer.encode("\n\n", add_special_tokens=False),
        tokenizer.encode("return", add_special_tokens=False),
    ]


def _streamed(decoder: IncrementalDecoder, ids: list[int], step: int = 1) -> list[str]:
    chunks = [ids[i : i + step] for i in range(0, len(ids), step)]
    return [decoder.push(chunk, final=i == len(chunks) - 1) for i, chunk in enumerate(chunks)]


def test_incremental_text_holds_back_split_multibyte_characters(tokenizer):
    text = "a = '€ü漢'  # ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.encode("utf-8")) / 2  # byte-level: the characters span several tokens
    pieces = _streamed(IncrementalDecoder(tokenizer.decode), ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert any(piece == "" for piece in pieces[:-1])  # at least one partial character was held back


def test_incremental_text_decodes_a_window_not_the_whole_text(tokenizer):
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n" * 20, add_special_tokens=False)
    lengths = []

    def decode(part):
        lengths.append(len(part))
        return tokenizer.decode(part)

    pieces = _streamed(IncrementalDecoder(decode), ids, step=3)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert max(lengths[:-1]) <= 4 + 3  # context + one round's tokens; only the final check decodes it all


def _metaspace_tokenizer():
    """A SentencePiece-style tokenizer ('▁' for spaces): decoding a suffix drops its leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["▁the", "▁cat", "▁sat", "▁on", "▁mat", "s", "▁", "<unk>"]
    model = models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_incremental_text_keeps_the_spaces_a_suffix_decode_would_drop():
    tokenizer = _metaspace_tokenizer()
    ids = [0, 1, 2, 3, 0, 4, 5]  # "the cat sat on the mats"
    assert tokenizer.decode(ids[1:2]) == "cat"  # the leading space is gone when decoded alone
    for step in (1, 2, 3):
        pieces = _streamed(IncrementalDecoder(tokenizer.decode, context=2), ids, step)
        assert "".join(pieces) == tokenizer.decode(ids) == "the cat sat on the mats"
        assert sum(1 for p in pieces if p) > 1


def test_incremental_text_flushes_a_replacement_character_at_the_end():
    decoder = IncrementalDecoder(lambda ids: "".join("\ufffd" if i < 0 else chr(i) for i in ids))
    assert decoder.push([ord("a"), ord("b")]) == "ab"
    assert decoder.push([-1]) == ""
    assert decoder.push([], final=True) == "\ufffd"


@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_a_fast_tokenizers_stream_is_decodestream_and_adds_up_to_the_whole_decode(tokenizer, step):
    codec = TextCodec(tokenizer)
    assert isinstance(codec.stream_decoder(), StreamDecoder)
    text = "a = '€ü漢'  # ok\ndef add(a, b):\n    return a + b\n"
    ids = tokenizer.encode(text, add_special_tokens=True) + [tokenizer.eos_token_id]
    pieces = _streamed(codec.stream_decoder(), ids, step)
    assert (
        "".join(pieces) == codec.decode(ids) == text
    )  # special tokens skipped, as the whole decode skips them
    assert not any("\ufffd" in piece for piece in pieces) and sum(1 for p in pieces if p) > 1
    cut = tokenizer.encode("ok €", add_special_tokens=False)[:-1]  # ends inside the euro sign's bytes
    assert "".join(_streamed(codec.stream_decoder(), cut, step)) == tokenizer.decode(cut)  # flushed as U+FFFD


def test_stream_decoding_keeps_metaspace_spaces_and_falls_back_where_decode_cleans_up():
    tokenizer = _metaspace_tokenizer()
    ids = [0, 1, 2, 3, 0, 4, 5]
    for step in (1, 2, 3):
        assert (
            "".join(_streamed(TextCodec(tokenizer).stream_decoder(), ids, step)) == "the cat sat on the mats"
        )
    tokenizer.clean_up_tokenization_spaces = (
        True  # HF decode then rewrites " ." etc.: not DecodeStream's text
    )
    assert isinstance(TextCodec(tokenizer).stream_decoder(), IncrementalDecoder)


def test_a_stray_byte_that_changes_sent_text_does_not_end_the_stream():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "▁the", "▁cat", "<0xE2>", "<0x82>", "<0xAC>", "<0x98>"]  # Llama 2 style byte fallback
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    ids = [1, 3, 4, 5, 6, 2, 1]  # "the" + the euro sign's 3 bytes + a stray 4th byte + " cat the"
    assert (
        tokenizer.decode(ids) == "the\ufffd\ufffd\ufffd\ufffd cat the"
    )  # the stray byte spoils the euro sign
    pieces = _streamed(TextCodec(tokenizer).stream_decoder(), ids)
    assert pieces[:4] == ["the", "", "", "€"]  # sent before the stray byte arrived: it stays sent
    assert "".join(pieces[4:]) == "\ufffd cat the"  # the stream goes on after it, leading space included


def test_text_codec_names_a_repository_from_an_older_trtspec():
    from trtspec.core.errors import ServerError

    with pytest.raises(ServerError, match="no tokenizer_dir parameter .* redeploy it with `trtspec deploy`"):
        TextCodec.from_parameters({"max_input_len": "8"})


def test_orchestrator_runs_draft_ahead_beside_verification_and_only_for_a_lone_request(monkeypatch):

    from trtspec.triton_repo.models import orchestrator

    model = _orchestrator(draft_ahead=True)
    assert model._together(lambda: 1, lambda: 2) == (1, 2)
    done = []

    def slow():
        time.sleep(0.05)
        done.append(True)

    def failing():
        raise RuntimeError("target engine: failed")

    with pytest.raises(RuntimeError, match="target engine"):
        model._together(failing, slow)
    assert done == [True]  # the draft call had finished before the error reached the caller

    def failing_draft():
        raise orchestrator.io.BlsError("draft engine: out of slots")

    warnings = []
    monkeypatch.setattr(orchestrator.io, "log_warning", warnings.append)
    assert model._together(lambda: [5], failing_draft) == ([5], ([], None))  # a miss, not a failed request
    assert len(warnings) == 1 and "out of slots" in warnings[0]
    with model._counted():
        assert model._alone()
        with model._counted():
            assert not model._alone()
    assert model.active == 0
    model.draft_ahead = False
    with model._counted():
        assert not model._alone()


class _Sender:
    """A decoupled response sender: records what it sent; fails once or reports cancellation when told to."""

    def __init__(self, fail_at=None, cancel_after=None):
        self.sent, self.fail_at, self.cancel_after = [], fail_at, cancel_after

    def send(self, response, flags=0):
        time.sleep(0.002)  # slower than putting, so responses queue up behind each other
        if len(self.sent) == self.fail_at:
            self.fail_at = None  # only this send fails: a later one would go through if it were tried
            raise RuntimeError("client went away")
        self.sent.append(response)

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


def test_outbox_sends_streamed_responses_in_order_before_the_block_ends():
    from trtspec.triton_repo.models.orchestrator import Outbox

    sender = _Sender()
    with Outbox(sender) as outbox:
        for i in range(20):
            outbox.put(i)
    assert sender.sent == list(range(20))  # all sent, in order, when the final response may go

    sender = _Sender(cancel_after=3)
    with Outbox(sender) as outbox:
        outbox.put(0)
        for i in range(1, 100):
            if outbox.cancelled:
                break
            outbox.put(i)
            time.sleep(0.003)
    assert outbox.cancelled and len(sender.sent) == 3  # nothing is sent once the client has cancelled


def test_outbox_raises_a_failed_send_in_the_request_thread():
    from trtspec.triton_repo.models.orchestrator import Outbox

    sender = _Sender(fail_at=2)
    with pytest.raises(RuntimeError, match="client went away"), Outbox(sender) as outbox:
        for i in range(5):
            outbox.put(i)
    assert sender.sent == [0, 1]  # nothing is sent after the failure


class _Codec:
    """The orchestrator's TextCodec, reduced to what _generate uses: every prompt is [5, 6], one char per id."""

    end_id, pad_id, end_ids = 2, 3, (2,)

    def encode(self, text):
        return [5, 6]

    def stop_ids(self, words):
        return []

    def decode(self, ids):
        return "x" * len(ids)

    def stream_decoder(self):
        return IncrementalDecoder(self.decode)


@pytest.mark.parametrize(
    "sampling, ahead",
    [({}, True), ({"temperature": 0.8}, True), ({"seed": 7}, True), ({"temperature": 0.8, "seed": 7}, False)],
)
def test_seeded_sampled_requests_are_never_drafted_ahead(monkeypatch, sampling, ahead):
    """A seeded sampled request must give the same text whatever else the server does; draft-ahead would change
    its random draws depending on load. A lone request's draft-ahead shows as a draft call for K + 1 tokens."""
    from trtspec.triton_repo.models import orchestrator

    draft_lens = []

    def bls(model, inputs, outputs):
        """A draft that repeats the last token and a target that accepts whatever it is sent, plus one 7."""
        tokens = np.asarray(inputs["input_ids"]).reshape(-1).tolist()
        n = int(np.asarray(inputs["request_output_len"]).reshape(-1)[0])
        if model == "d":
            draft_lens.append(n)
            new = [tokens[-1]] * n
        else:
            drafts = inputs.get("draft_input_ids")
            new = ([] if drafts is None else np.asarray(drafts).reshape(-1).tolist()) + [7]
        ids = np.array([tokens + new], dtype=np.int32)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    model = _orchestrator(draft_ahead=True)
    fields = {"text_input": "def", "max_tokens": 12, "num_draft_tokens": 2} | sampling
    with model._counted():  # served alone
        model._whole(parse_request(_inputs(**fields), LIMITS))
    assert draft_lens and max(draft_lens) <= 3  # K = 2, or K + 1 ahead (the last round drafts what is left)
    assert (3 in draft_lens) == ahead


def test_draft_and_target_get_different_seeds_in_a_round_and_new_ones_each_round(monkeypatch):
    from trtspec.triton_repo.models import orchestrator

    calls = []

    def fake_bls(model, inputs, outputs):
        calls.append((model, int(inputs["seed"].reshape(-1)[0])))
        ids = np.asarray(inputs["input_ids"])
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", fake_bls)
    req = parse_request(_inputs(text_input="def", max_tokens=4, temperature=0.8, seed=7), LIMITS)
    engines = orchestrator.EngineClient("target", "draft", req, end_id=2, pad_id=3)
    for round_index in (0, 1):
        engines.draft_fn([5, 6], 2, round_index)
        engines.target_fn([5, 6], [7, 8], None, round_index)
    (_, d0), (_, t0), (_, d1), (_, t1) = calls
    assert [m for m, _ in calls] == ["draft", "target"] * 2
    assert len({d0, t0, d1, t1}) == 4 and t0 == 7 and t1 == 8


def _orchestrator(**settings):
    """The orchestrator's request handling over engine models "t" and "d" (BLS faked by each test)."""
    from trtspec.triton_repo.models.orchestrator import Orchestrator

    defaults = dict(
        limits=LIMITS,
        codec=_Codec(),
        target="t",
        draft="d",
        vocab_rows={},
        metrics=_Metrics(),
        k_policy=KPolicy(),
    )
    return Orchestrator(**(defaults | settings))


class _Metrics:
    """Stands in for triton_io.SpecDecodeMetrics (pb_utils metrics need a server): what the model added."""

    def __init__(self):
        self.added = []

    def add(self, counts) -> None:
        self.added.append(counts)


def test_a_cancelled_non_streamed_request_stops_generating(monkeypatch):
    """A client that cancels (or drops) a non-streamed request stops generating: the orchestrator asks Triton
    between rounds (at most every CANCEL_POLL_S) and the loop retires the request with what it generated."""

    from trtspec.triton_repo.models import orchestrator
    from trtspec.triton_repo.models.orchestrator import cancel_check

    produced = []

    def bls(model, inputs, outputs):
        """The draft continues nothing (every round is a plain target step); the target always adds a 7."""
        ids = np.asarray(inputs["input_ids"])
        if model == "t":
            produced.append(7)
            ids = np.concatenate([ids, np.array([[7]], dtype=ids.dtype)], axis=1)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    model = _orchestrator()
    req = parse_request(_inputs(text_input="def", max_tokens=20), LIMITS)
    answers = iter([False, False, True])
    text, ids, stats = model._whole(req, lambda: next(answers))
    assert ids == [7, 7, 7] and text == "xxx" and len(produced) == 3
    assert model.metrics.added == [SpecDecodeCounts.of(stats)]  # a cancelled request's rounds count, once

    class Request:
        asked = 0

        def is_cancelled(self):
            Request.asked += 1
            return True

    check = cancel_check(Request(), poll_s=0.05)
    assert not check() and Request.asked == 0  # not asked again within poll_s
    time.sleep(0.06)
    assert check() and Request.asked == 1
    assert not cancel_check(object())()  # no is_cancelled: never cancelled


def test_the_orchestrator_runs_an_adaptive_request_through_the_loop_with_greedy_output_unchanged(monkeypatch):
    """A repository whose default K is adaptive and a request without num_draft_tokens: the loop's adaptive K
    (a jumpy policy: a rejection switches drafting off, the next probe on again) picks each round's K, the engine
    calls draft that many, and the output is still the target's greedy output."""

    from trtspec.triton_repo.models import orchestrator

    draft_ks = []

    def bls(model, inputs, outputs):
        """The toy pair behind TensorRT-LLM's tensor interface: the draft continues by request_output_len tokens
        (wrong every third position), the target verifies draft_input_ids."""
        tokens = np.asarray(inputs["input_ids"]).reshape(-1).tolist()
        n = int(np.asarray(inputs["request_output_len"]).reshape(-1)[0])
        if model == "d":
            draft_ks.append(n)
            new, _ = _toy_draft("every_third_wrong")(tokens, n, 0)
        else:
            drafts = inputs.get("draft_input_ids")
            new = _toy_target(
                tokens, [] if drafts is None else np.asarray(drafts).reshape(-1).tolist(), None, 0
            )
        ids = np.array([tokens + new], dtype=np.int32)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    limits = Limits(max_draft_len=4, num_draft_tokens=None, max_seq_len=128)
    model = _orchestrator(
        limits=limits, k_policy=KPolicy(prior=0.99, smoothing=1.0, min_gain=0.0, probe_every=1)
    )
    req = parse_request(_inputs(text_input="def", max_tokens=30), limits)
    assert req.params.num_draft_tokens is None
    _, ids, stats = model._whole(req)
    assert ids == _toy_greedy([5, 6], 30)
    assert 0 < stats.acceptance_rate < 1 and stats.max_draft_len == 4
    assert len(set(draft_ks)) >= 2  # K changed from round to round
    assert len([k for k, n in enumerate(stats.num_draft_histogram) if n]) >= 2


def test_a_padded_vocab_drafts_logits_reach_the_target_model_padded(
    monkeypatch, tmp_path, shared_tokenizer_dir
):
    """Qwen2.5's pair behind the engine models' tensor interface: the draft model returns its own 336 rows; the
    target model (as TensorRT-LLM) takes only its own 352, so the orchestrator pads them with -inf."""
    from tiny_models import make_model

    from trtspec.engines.steps import StepModel
    from trtspec.triton_repo.models import orchestrator
    from trtspec.triton_repo.models.engine import TorchEngine

    opts = dict(
        tokenizer_dir=shared_tokenizer_dir, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    engines = {
        role: TorchEngine(
            StepModel.from_pretrained(make_model(tmp_path / role, "llama", vocab_size=rows, **opts)), role
        )
        for role, rows in (("target", 352), ("draft", 336))
    }

    def bls(model, inputs, outputs):
        ids, logits = engines[model].run(inputs)
        out = {"output_ids": np.array([[ids]]), "sequence_length": np.array([[len(ids)]])}
        return out | ({} if logits is None else {"generation_logits": logits[None, None]})

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    limits = Limits(max_draft_len=4, num_draft_tokens=3, max_seq_len=128, use_draft_logits=True)
    req = parse_request(_inputs(text_input="def", max_tokens=8, temperature=0.9, seed=1), limits)
    padded = orchestrator.EngineClient(
        "target", "draft", req, end_id=2, pad_id=3, vocab_rows={"target": 352, "draft": 336}
    )
    tokens, logits = padded.draft_fn([1, 40, 41], 3, 0)
    assert logits.shape == (3, 336)
    # A padding row the target sampled (340) reaches the draft as its own last row, which it can embed.
    assert len(padded.draft_fn([1, 40, 340, 41], 2, 1)[0]) == 2
    with pytest.raises(RequestError, match=r"outside the vocabulary \[0, 336\)"):
        unmapped = orchestrator.EngineClient("target", "draft", req, end_id=2, pad_id=3)
        unmapped.draft_fn([1, 40, 340, 41], 2, 1)
    new = padded.target_fn([1, 40, 41], tokens, logits, 0)
    assert 1 <= len(new) <= 4
    unpadded = orchestrator.EngineClient("target", "draft", req, end_id=2, pad_id=3)
    with pytest.raises(RequestError, match="draft_logits has 336 columns; the target has 352 vocab rows"):
        unpadded.target_fn([1, 40, 41], tokens, logits, 0)


# ---------------------------------------------------------------- the torch runtime's entry model (inflight.py)


def _event(tokens, finished=False):
    from trtspec.engines.loop import GenerationResult, RowEvent

    stats = AcceptanceStats()
    return RowEvent("r", list(tokens), stats, GenerationResult([], "stop", stats) if finished else None)


def test_a_streamed_reply_sends_each_completed_piece_with_its_ids_then_an_empty_final(tokenizer):
    from trtspec.triton_repo.models.inflight import Reply

    req = parse_request(
        {"text_input": np.array([b"x"]), "max_tokens": np.array([8]), "stream": np.array([True])}, LIMITS
    )
    ids = tokenizer.encode("a = '€ü' + b", add_special_tokens=False)
    reply, responses = Reply(req, TextCodec(tokenizer)), []
    rounds = [ids[i : i + 2] for i in range(0, len(ids), 2)]
    for i, tokens in enumerate(rounds):
        responses += reply.update(_event(tokens, finished=i == len(rounds) - 1))
    texts = [text for text, _, _ in responses]
    assert "".join(texts) == tokenizer.decode(ids) and len([t for t in texts if t]) > 1
    assert sum((list(chunk) for _, chunk, _ in responses), []) == ids
    assert [final for _, _, final in responses] == [False] * (len(responses) - 1) + [True]
    assert responses[-1][0] == ""


def test_a_reply_that_is_not_streamed_is_one_final_response(tokenizer):
    from trtspec.triton_repo.models.inflight import Reply

    req = parse_request({"text_input": np.array([b"x"]), "max_tokens": np.array([8])}, LIMITS)
    ids = tokenizer.encode("def f(x):", add_special_tokens=False)
    reply = Reply(req, TextCodec(tokenizer))
    assert reply.update(_event(ids[:2])) == []
    assert reply.update(_event(ids[2:], finished=True)) == [(tokenizer.decode(ids), ids, True)]


class _PbUtils:
    """The part of triton_python_backend_utils that build_responses uses (it exists only inside the stub)."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

        def __init__(self, message, code=None):
            self.message, self.code = message, code

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.tensors = {t.name: t.array for t in output_tensors}
            self.error = error

    class Logger:
        lines: list[str] = []

        @classmethod
        def log_warn(cls, message):
            cls.lines.append(message)


def test_responses_are_built_per_event_and_one_that_cannot_be_built_ends_only_its_request(
    tokenizer, monkeypatch
):
    from trtspec.triton_repo.models import triton_io
    from trtspec.triton_repo.models.inflight import Reply, build_responses

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    fields = {"text_input": np.array([b"x"]), "max_tokens": np.array([8]), "stream": np.array([True])}
    req = parse_request(fields, LIMITS)
    ids = tokenizer.encode("def f(x):", add_special_tokens=False)
    cancelled = []
    ok = build_responses("a", Reply(req, TextCodec(tokenizer)), _event(ids), cancelled.append)
    ((response, flags),) = ok
    assert response.tensors["text_output"][0, 0].decode() == tokenizer.decode(ids) and flags == 0
    assert response.tensors["output_ids"].tolist() == [ids] and response.error is None

    class BrokenCodec:
        def decode(self, _ids):
            raise ValueError("no such id")

        def stream_decoder(self):
            return IncrementalDecoder(self.decode)

    reply = Reply(req, BrokenCodec())
    ((response, flags),) = build_responses("b", reply, _event(ids), cancelled.append)
    assert (
        response.error.message == "internal error: ValueError: no such id"
        and response.error.code == "INTERNAL"
    )
    assert (
        flags == 1 and cancelled == ["b"] and reply.closed
    )  # the stream ends here, the loop drops the request
    assert build_responses("b", reply, _event([], finished=True), cancelled.append) == []  # its cancelled end


def test_a_request_becomes_loop_params_capped_at_max_seq_len_with_its_own_end_id(tokenizer):
    from trtspec.triton_repo.models.request import to_job

    codec = TextCodec(tokenizer, end_ids=(2, 7))
    fields = {"text_input": np.array([b"def f(x):"]), "max_tokens": np.array([500]), "top_k": np.array([1])}
    fields |= {"temperature": np.array([0.7]), "num_draft_tokens": np.array([2])}
    prompt, params, options = to_job(parse_request(fields, LIMITS), codec, LIMITS)
    assert prompt == codec.encode("def f(x):")
    assert params.max_new_tokens == LIMITS.max_seq_len - len(prompt) and params.num_draft_tokens == 2
    assert params.greedy and options["eos_ids"] == {2, 7} and options["keep_end"] is False
    fields |= {"end_id": np.array([9]), "stop_words": np.array([b"return"])}
    _, _, options = to_job(parse_request(fields, LIMITS), codec, LIMITS)
    assert options["eos_ids"] == {9} and options["stop_sequences"] == codec.stop_ids(["return"])


def test_a_repository_without_adaptive_k_parameters_gets_the_policy_defaults():
    """Entry models rendered before adaptive K's parameters existed still load, with KPolicy's defaults."""
    from trtspec.triton_repo.models.request import k_policy_from_parameters

    assert k_policy_from_parameters({}) == KPolicy()
    rendered = k_policy_from_parameters({"draft_cost_ratio": "0.35", "k_schedule": "1:4,8:0"})
    assert rendered.draft_cost_ratio == 0.35 and rendered != KPolicy()
