"""The Triton python models' pure logic without a server: the orchestrator's engine calls and request handling,
request validation, stop words and incremental detokenization, and the torch entry model's threads. The round
itself is tests/test_engine_calls.py's."""

from __future__ import annotations

import os
import threading
import time
import types

import numpy as np
import pytest
from harness.engine_model import from_word_list
from toy_engines import toy_draft, toy_greedy, toy_target

from trtspec.core.errors import RequestError
from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts
from trtspec.core.token_rules import EngineStops
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.engine_calls import Call
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo.models.cores import cpu_threads, split_cores
from trtspec.triton_repo.models.request import Limits, parse_request, to_job
from trtspec.triton_repo.models.text import (
    IncrementalDecoder,
    StreamDecoder,
    TextCodec,
    encode_prompt,
    stop_words_ids,
    to_word_list,
)

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
        (
            {"text_input": "x", "max_tokens": 4, "temperature": -0.5},
            "temperature must be a finite number >= 0",
        ),
        (
            {"text_input": "x", "max_tokens": 4, "temperature": float("nan")},
            "temperature must be a finite number >= 0",
        ),
        (
            {"text_input": "x", "max_tokens": 4, "temperature": float("inf")},
            "temperature must be a finite number >= 0",
        ),
        ({"text_input": "x", "max_tokens": 4, "top_k": -1}, "top_k must be >= 0"),
        ({"text_input": "x", "max_tokens": 4, "top_p": -0.1}, "top_p must be in (0, 1], got -0.1"),
        ({"text_input": "x", "max_tokens": 4, "top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ],
)
def test_bad_requests_raise_one_clear_line(fields, message):
    with pytest.raises(RequestError) as err:
        parse_request(_inputs(**fields), LIMITS)
    assert message in err.value.message and "\n" not in err.value.message


@pytest.mark.parametrize(
    "fields",
    [
        {"beam_width": 1, "bad_words": "", "min_length": 1, "min_tokens": 0},
        {"exclude_input_in_output": True},
        {"min_length": 0, "exclude_input_in_output": False},
    ],
)
def test_upstreams_inputs_that_ask_for_nothing_are_accepted(fields):
    """What upstream's clients send by default: end_to_end_grpc_client.py's beam_width 1 and
    exclude_input_in_output, the README's "bad_words": "", genai-perf's min_length."""
    req = parse_request(_inputs(text_input="x", max_tokens=4, **fields), LIMITS)
    assert req.params == parse_request(_inputs(text_input="x", max_tokens=4), LIMITS).params
    assert req.exclude_input_in_output is fields.get("exclude_input_in_output", True)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"beam_width": 4}, "beam_width 4 is not supported: speculative decoding runs one beam"),
        ({"beam_width": 0}, "send beam_width 1 or leave it out"),
        ({"bad_words": "awful"}, "bad_words ['awful'] is not supported: trtspec bans no words"),
        ({"min_length": 64}, "min_length 64 is not supported: trtspec does not enforce a minimum length"),
        ({"min_tokens": 8}, "send end_id -1 (no end id then stops the request) with max_tokens 8"),
        ({"min_length": -3}, "min_length must be >= 0, got -3; send 0 or leave it out for no minimum"),
    ],
)
def test_upstreams_inputs_that_ask_for_what_is_not_served_are_refused_in_one_line(fields, message):
    with pytest.raises(RequestError) as err:
        parse_request(_inputs(text_input="x", max_tokens=4, **fields), LIMITS)
    assert message in err.value.message and "\n" not in err.value.message


def test_a_whole_answer_starts_with_the_prompt_only_where_the_request_asks():
    from trtspec.triton_repo.models.request import whole_answer

    inputs = _inputs(text_input="def f():", max_tokens=4)
    assert whole_answer(parse_request(inputs, LIMITS), [1, 5], " pass", [7, 8]) == (" pass", [7, 8])
    inputs["exclude_input_in_output"] = np.array([[False]])
    got = whole_answer(parse_request(inputs, LIMITS), [1, 5], " pass", [7, 8])
    assert got == ("def f(): pass", [1, 5, 7, 8])


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


def test_the_torch_runtime_takes_use_draft_logits_either_way_as_it_always_accepts_by_probabilities(tiny_pair):
    """The PyTorch engine holds the draft's probabilities and accepts sampled drafts by them, whatever the recipe
    says: its repository takes a request's use_draft_logits true, where the tensorrtllm repository of the same
    recipe refuses it (its engines would have to gather logits), as does a torch repository whose draft has its
    own tokenizer (its tokens are accepted as point masses)."""
    from trtspec.recipe import recipe_from_dict
    from trtspec.triton_repo.values import in_process_values, orchestrator_values

    target, draft = tiny_pair
    recipe = recipe_from_dict({"name": "t", "target": {"model": str(target)}, "draft": {"model": str(draft)}})
    assert not recipe.speculative.use_draft_logits
    as_text = lambda values: {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}  # noqa: E731
    torch_limits = Limits.from_parameters(as_text(in_process_values(recipe)))
    engines = orchestrator_values(recipe, "tensorrtllm", {"target": 0, "draft": 0})
    engine_limits = Limits.from_parameters(as_text(engines))
    sent = _inputs(text_input="x", max_tokens=2, use_draft_logits=True)
    assert parse_request(sent, torch_limits).use_draft_logits
    with pytest.raises(RequestError, match="use_draft_logits=true needs a repository deployed with"):
        parse_request(sent, engine_limits)
    # a draft with its own tokenizer: its translated tokens are accepted as point masses, so not there
    own = Limits.from_parameters(as_text(in_process_values(recipe, draft_tokenizer_dir=draft)))
    with pytest.raises(RequestError, match="use_draft_logits=true needs a repository deployed with"):
        parse_request(sent, own)


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

    params = parse_request(_inputs(text_input="def", max_tokens=4, **sampling), LIMITS).params
    call = Call(params.greedy, params.temperature, params.top_k, params.top_p, None, EngineStops(2, 3))
    inputs = orchestrator.BlsCalls._inputs([5, 6], 3, call)
    knobs = {
        k: inputs[k].reshape(-1)[0].item()
        for k in ("temperature", "runtime_top_k", "runtime_top_p")
        if k in inputs
    }
    assert knobs == pytest.approx(sent)


def test_request_parameters_are_refused_by_name_since_no_entry_model_reads_them():
    fields = _inputs(text_input="def", max_tokens=4)
    assert parse_request(fields, LIMITS, {}).params.max_new_tokens == 4
    assert parse_request(fields, LIMITS, {"id": "42"}).params.max_new_tokens == 4  # Triton's request id
    with pytest.raises(RequestError) as err:
        parse_request(fields, LIMITS, {"temprature": 0.5, "repetition_penalty": 1.2, "id": "42"})
    assert err.value.message == (
        "'repetition_penalty', 'temprature': not an input of this model, so it would be ignored (a request "
        "parameter: a generate body's field that names no input, or one a client set); leave it out or send one "
        "of the inputs in docs/triton-models.md"
    )
    # a gRPC client's parameter named after an input is an input sent the wrong way, not an unknown setting
    with pytest.raises(RequestError) as err:
        parse_request(fields, LIMITS, {"stream": True, "min_p": 0.1})
    assert err.value.message == (
        "'stream' came as a request parameter (True), which this model does not read; send it as the input "
        "tensor stream (a generate body's field of that name is one)"
    )


@pytest.mark.parametrize(
    "name, raw, offset",
    [("text_input", b"def f(\xe9):", 6), ("stop_words", b"caf\xe9", 3), ("proposer", b"\xff\xfe", 0)],
)
def test_text_that_is_not_utf8_is_refused_not_replaced(name, raw, offset):
    """Decoding with replacement would serve a prompt, stop word or proposer other than the one sent."""
    inputs = _inputs(text_input="def", max_tokens=4)
    inputs[name] = np.array([[raw]], dtype=object)
    with pytest.raises(RequestError) as err:
        parse_request(inputs, LIMITS)
    assert err.value.message == (
        f"input '{name}' is not UTF-8 text (byte 0x{raw[offset]:02x} at offset {offset}); send it encoded as UTF-8"
    )


def test_a_stream_to_a_model_that_answers_once_is_refused_naming_the_setting():
    from trtspec.triton_repo.models.request import check_stream

    req = parse_request(_inputs(text_input="def", max_tokens=4, stream=True), LIMITS)
    check_stream(req, decoupled=True)
    with pytest.raises(RequestError) as err:
        check_stream(req, decoupled=False)
    assert err.value.message == (
        "stream=true needs a model deployed with triton.decoupled: true (this one sends one response per "
        "request); leave stream out or redeploy"
    )
    check_stream(parse_request(_inputs(text_input="def", max_tokens=4), LIMITS), decoupled=False)


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
    assert (codec.eos_id, codec.pad_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    keep = TextCodec.from_parameters(
        {"tokenizer_dir": str(shared_tokenizer_dir), "skip_special_tokens": "false"}
    )
    assert keep.max_input_len is None and tokenizer.eos_token in keep.decode([tokenizer.eos_token_id])


def test_cpu_threads_auto_takes_every_core_and_is_at_least_one():
    # one process runs the draft and the target one after the other
    assert [cpu_threads("auto", n) for n in (0, 1, 2, 16)] == [1, 1, 2, 16]
    assert cpu_threads("3", 16) == 3 and cpu_threads(" AUTO ", 4) == 4 and cpu_threads("0") == 1
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
    replies = {
        name: Reply(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=()), [1]) for name in "abc"
    }
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n" * 3, add_special_tokens=False)
    rounds = [ids[i : i + 3] for i in range(0, len(ids), 3)]
    outbox = Outbox(cancel=lambda request_id: None, cores={core}, loop_builds_from=3)
    try:
        for i, tokens in enumerate(rounds):
            names = "a" if i < 2 else "abc"  # one request, then three
            for name in names:
                event = _event(tokens if name == "a" else rounds[i - 2], finished=i == len(rounds) - 1)
                outbox.put(name, Sender(name), replies[name], event)
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
        outbox.put("a", None, None, _event([5]))
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


def test_adaptive_decisions_reach_the_metrics_while_a_request_runs(monkeypatch):
    """Sent while requests run, not only when one finishes: a long request's K panel follows its rounds."""
    from trtspec.triton_repo.models import inflight

    published = []
    monkeypatch.setattr(inflight, "build_responses", lambda rid, reply, event, cancel: [])
    outbox = inflight.Outbox(
        cancel=lambda request_id: None,
        adaptive=lambda: ("decisions", len(published)),
        adaptive_metrics=types.SimpleNamespace(update=published.append),
    )
    try:
        reply = types.SimpleNamespace(closed=False)
        outbox.put("a", None, reply, _event([5]))  # a round of a request that goes on
        outbox.flush()
        deadline = time.monotonic() + 10
        while not published and time.monotonic() < deadline:
            time.sleep(0.005)
        assert published == [("decisions", 0)]
        outbox.put("a", None, reply, _event([6]))
        outbox.flush()  # within ADAPTIVE_PUBLISH_S of the last: not sent again
        time.sleep(0.1)
        assert len(published) == 1
    finally:
        outbox.stop()


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
    codec = TextCodec(tokenizer, end_ids=())
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
            "".join(_streamed(TextCodec(tokenizer, end_ids=()).stream_decoder(), ids, step))
            == "the cat sat on the mats"
        )
    tokenizer.clean_up_tokenization_spaces = (
        True  # HF decode then rewrites " ." etc.: not DecodeStream's text
    )
    assert isinstance(TextCodec(tokenizer, end_ids=()).stream_decoder(), IncrementalDecoder)


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
    pieces = _streamed(TextCodec(tokenizer, end_ids=()).stream_decoder(), ids)
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
    assert model._together(lambda: [5], failing_draft) == ([5], [])  # a miss, not a failed request
    assert len(warnings) == 1 and "out of slots" in warnings[0]
    with model._counted():
        assert model._alone()
        with model._counted():
            assert not model._alone()
    assert model.active == 0
    model.draft_ahead = False
    with model._counted():
        assert not model._alone()


@pytest.mark.parametrize(
    "sampling, greedy, top_k, top_p",
    [
        ({"temperature": 1.0}, True, 1, 1.0),  # upstream's end_to_end client's default: greedy text upstream
        ({"temperature": 1.0, "top_k": 0, "top_p": 0.0}, True, 1, 1.0),  # 0 is unset for both
        ({"temperature": 1.0, "top_p": 0.9}, False, 0, 0.9),
        ({"temperature": 1.0, "top_k": 40}, False, 40, 1.0),
        ({"temperature": 1.0, "top_p": 1.0}, False, 0, 1.0),  # the whole distribution
    ],
)
def test_a_temperature_samples_only_with_top_k_or_top_p_as_upstream(sampling, greedy, top_k, top_p):
    _, params, _ = to_job(
        parse_request(_inputs(text_input="def", max_tokens=4, **sampling), LIMITS), _Codec(), LIMITS
    )
    assert (params.greedy, params.top_k, params.top_p) == (greedy, top_k, top_p)


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

    eos_id, pad_id, end_ids, vocab_size = 2, 3, (2,), 32

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
    [
        ({}, True),
        ({"temperature": 0.8, "top_p": 1.0}, True),
        ({"seed": 7}, True),
        ({"temperature": 0.8, "top_p": 1.0, "seed": 7}, False),
    ],
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
    model._whole(parse_request(_inputs(**fields), LIMITS))  # served alone
    assert draft_lens and max(draft_lens) <= 3  # K = 2, or K + 1 ahead (the last round drafts what is left)
    assert (3 in draft_lens) == ahead


@pytest.mark.parametrize("default, asked", [("draft", "ngram"), ("ngram", ""), ("draft+ngram", "")])
def test_fast_logits_refuses_a_request_that_would_propose_by_lookup(monkeypatch, default, asked):
    from trtspec.triton_repo.models import orchestrator

    monkeypatch.setattr(orchestrator.io, "bls", lambda *a: pytest.fail("no engine is called"))
    model = _orchestrator(fast_logits=True, proposer=default)
    fields = {"text_input": "def", "max_tokens": 4} | ({"proposer": asked} if asked else {})
    with pytest.raises(RequestError, match="cannot run where draft logits go from rank to rank"):
        model._whole(parse_request(_inputs(**fields), LIMITS))


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
        self.added, self.finish_reasons, self.refused = [], [], 0

    def add(self, counts, finish_reason: str, by_proposer: dict | None = None) -> None:
        self.added.append(counts)
        self.finish_reasons.append(finish_reason)

    def refuse(self) -> None:
        self.refused += 1


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

    check = cancel_check(Request(), poll_s=0.5)  # long enough that a loaded machine's pause does not pass it
    assert not check() and Request.asked == 0  # not asked again within poll_s
    time.sleep(0.55)
    assert check() and Request.asked == 1
    assert not cancel_check(object())()  # no is_cancelled: never cancelled


def test_the_orchestrators_whole_answer_starts_with_the_prompt_where_the_request_asks(monkeypatch):
    from trtspec.triton_repo.models import orchestrator

    def bls(model, inputs, outputs):
        """No draft; the target adds a 7 per round."""
        ids = np.asarray(inputs["input_ids"])
        if model == "t":
            ids = np.concatenate([ids, np.array([[7]], dtype=ids.dtype)], axis=1)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    fields = {"text_input": "def", "max_tokens": 3}
    answer = _orchestrator()._whole(parse_request(_inputs(**fields), LIMITS))[:2]
    assert answer == ("xxx", [7, 7, 7])
    fields["exclude_input_in_output"] = False
    answer = _orchestrator()._whole(parse_request(_inputs(**fields), LIMITS))[:2]
    assert answer == ("defxxx", [5, 6, 7, 7, 7])  # _Codec's prompt ids are [5, 6]


def test_the_orchestrator_refuses_a_sampled_top_k_that_tensorrt_llm_would_clip(monkeypatch):
    """TensorRT-LLM's top-k sampling keeps at most 1024 tokens and clips a larger top_k with a log warning, so the
    request would be sampled otherwise than it asked: refused before any engine call. Greedy ignores top_k."""
    from trtspec.triton_repo.models import orchestrator

    calls = []

    def bls(model, inputs, outputs):
        calls.append(model)
        ids = np.concatenate([np.asarray(inputs["input_ids"]), np.array([[7]], dtype=np.int32)], axis=1)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    sampled = {"text_input": "def", "max_tokens": 2, "temperature": 0.8, "num_draft_tokens": 0}
    with pytest.raises(RequestError) as err:
        _orchestrator()._whole(parse_request(_inputs(**sampled, top_k=1025), LIMITS))
    assert err.value.message == (
        "top_k 1025 is above the engine's limit 1024 (it would sample from 1024 tokens); send top_k <= 1024, "
        "or 0 for no top-k"
    )
    assert calls == []
    assert _orchestrator()._whole(parse_request(_inputs(**sampled, top_k=1024), LIMITS))[1] == [7, 7]
    greedy = sampled | {"temperature": 0.0, "top_k": 5000}
    assert _orchestrator()._whole(parse_request(_inputs(**greedy), LIMITS))[1] == [7, 7]


def test_a_batch_not_decoupled_generates_its_requests_at_once_and_answers_them_in_order(monkeypatch):
    """Not decoupled, one execute holds the requests the dynamic batcher gathered: they must reach the engines
    together (the C++ in-flight batcher batches what arrives at once), not one after another. Each request's first
    target call waits at a barrier of three, which requests served in turn never pass."""
    from trtspec.triton_repo.models import orchestrator, triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    barrier, first = threading.Barrier(3, timeout=10), set()

    def bls(model, inputs, outputs):
        ids = np.asarray(inputs["input_ids"])
        if threading.get_ident() not in first:
            first.add(threading.get_ident())
            barrier.wait()  # BrokenBarrierError (an internal error response) if the three do not meet
        if model == "t":
            ids = np.concatenate([ids, np.array([[7]], dtype=ids.dtype)], axis=1)
        return {"output_ids": ids, "sequence_length": np.array([[ids.shape[1]]])}

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    requests = [object(), object(), object()]
    # max_tokens 3, 2, 1: the last request ends first, and its answer must still come last
    asked = {id(request): n for request, n in zip(requests, (3, 2, 1), strict=True)}

    def fields(request, names):
        return _inputs(text_input="def", max_tokens=asked[id(request)], num_draft_tokens=0)

    monkeypatch.setattr(orchestrator.io, "read_inputs", fields)
    monkeypatch.setattr(orchestrator.io, "read_parameters", lambda request: {})
    model = _orchestrator(max_concurrency=3, decoupled=False)
    responses = model.execute(requests)
    assert [r.error for r in responses] == [None] * 3, [r.error.message for r in responses if r.error]
    assert [r.tensors["output_ids"].tolist() for r in responses] == [[[7] * n] for n in (3, 2, 1)]
    assert len(first) == 3 and model.active == 0


def _served_while_every_slot_is_busy(monkeypatch, fields: dict, sender, **settings):
    """A decoupled orchestrator with one slot, held by a long request, serves a request of ``fields`` to
    ``sender`` without calling an engine; returns the orchestrator once that request's thread has ended."""
    from trtspec.triton_repo.models import orchestrator, triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    monkeypatch.setattr(orchestrator.io, "bls", lambda *a: pytest.fail("no engine call for this request"))
    monkeypatch.setattr(orchestrator.io, "read_inputs", lambda request, names: fields)
    model = _orchestrator(max_concurrency=1, **settings)
    request = types.SimpleNamespace(get_response_sender=lambda: sender, parameters=lambda: "{}")
    assert model.slots.acquire(timeout=1)  # the one slot is serving a long request
    served = threading.Thread(target=model._serve_decoupled, args=(request,), daemon=True)
    served.start()
    served.join(timeout=10)
    assert not served.is_alive()
    return model


@pytest.mark.parametrize("stream", [False, True])
def test_a_decoupled_request_the_loop_refuses_is_answered_while_every_slot_is_busy(monkeypatch, stream):
    """The decoupled orchestrator serves max_concurrency requests at once; a request it refuses (here a prompt
    longer than max_seq_len, which only the loop checks) is answered at once, not after a slot frees."""
    sender = _Sender()
    fields = _inputs(text_input="def", max_tokens=2, stream=stream)
    limits = Limits(max_draft_len=4, num_draft_tokens=3, max_seq_len=2)
    model = _served_while_every_slot_is_busy(monkeypatch, fields, sender, limits=limits)
    ((response,),) = [sender.sent]
    assert "the prompt" in response.error.message and response.error.code == "INVALID_ARG"
    assert model.active == 0 and model.metrics.refused == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_decoupled_request_cancelled_while_it_waits_for_a_slot_never_takes_one(monkeypatch, stream):
    """Its client gave up while every slot was busy: it ends "cancelled" with nothing generated, no engine call,
    and the slot it never took stays with the request that holds it."""
    sender = _Sender(cancel_after=0)  # the client has cancelled
    fields = _inputs(text_input="def", max_tokens=8, stream=stream)
    from trtspec.triton_repo.models.orchestrator import Orchestrator

    counted, real = [], Orchestrator._counted

    def counting(self):
        counted.append(1)
        return real(self)

    monkeypatch.setattr(Orchestrator, "_counted", counting)
    model = _served_while_every_slot_is_busy(monkeypatch, fields, sender)
    assert counted == []  # never active: the request that holds the slot may still draft ahead alone
    ((response,),) = [sender.sent]  # its final response, empty
    assert response.error is None and list(response.tensors["output_ids"].reshape(-1)) == []
    assert model.metrics.finish_reasons == ["cancelled"] and model.active == 0
    assert not model.slots.acquire(blocking=False)  # still the long request's
    model.slots.release()
    assert model.slots.acquire(blocking=False)


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
            new, _ = toy_draft("every_third_wrong")(tokens, n, 0)
        else:
            drafts = inputs.get("draft_input_ids")
            new = toy_target(
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
    assert ids == toy_greedy([5, 6], 30)
    assert 0 < stats.acceptance_rate < 1 and stats.max_draft_len == 4
    assert len(set(draft_ks)) >= 2  # K changed from round to round
    assert len([k for k, n in enumerate(stats.num_draft_histogram) if n]) >= 2


def test_engine_calls_speak_the_tensorrt_llm_tensor_interface(monkeypatch):
    """BlsCalls: a draft call asks for request_output_len = K (and generation logits [1, 1, K, V], read back as
    [K, V]); a verification sends draft_input_ids and draft_logits [1, K, V]; both send end_id, pad_id, the stop
    words in TensorRT-LLM's [1, 2, N] layout and the call's seed; ids beyond sequence_length are padding."""
    from trtspec.triton_repo.models import orchestrator

    sent = []

    def bls(model, inputs, outputs):
        sent.append((model, inputs, outputs))
        tokens = np.asarray(inputs["input_ids"]).reshape(-1).tolist()
        n = int(np.asarray(inputs["request_output_len"]).reshape(-1)[0])
        ids = np.array([tokens + [9] * n + [2, 2]], dtype=np.int32)  # padded past sequence_length
        out = {"output_ids": ids, "sequence_length": np.array([[len(tokens) + n]])}
        return out | ({"generation_logits": np.ones((1, 1, n, 6), np.float32)} if model == "d" else {})

    monkeypatch.setattr(orchestrator.io, "bls", bls)
    calls = orchestrator.BlsCalls("t", "d", {"target": 8, "draft": 6})
    call = Call(False, 0.5, 0, 1.0, 11, EngineStops(2, 3, ((4,), (5,))))
    (draft,) = calls.propose([[1, 7]], 3, call, True)
    assert draft.tokens == [9, 9, 9] and tuple(draft.logits.shape) == (3, 6)
    assert calls.verify([[1, 7]], [[9, 9]], [np.zeros((2, 8))], 3, call) == [[9, 9, 9]]
    (_, d_in, d_out), (_, t_in, t_out) = sent
    assert d_out == ["output_ids", "sequence_length", "generation_logits"] and bool(
        d_in["return_generation_logits"]
    )
    assert t_in["draft_input_ids"].tolist() == [[9, 9]] and t_in["draft_logits"].shape == (1, 2, 8)
    for inputs in (d_in, t_in):
        assert (int(inputs["end_id"]), int(inputs["pad_id"]), int(inputs["seed"])) == (2, 3, 11)
        assert inputs["stop_words_list"].tolist() == [[[4, 5], [1, 2]]]


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
    reply, responses = Reply(req, TextCodec(tokenizer, end_ids=()), [1]), []
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

    fields = {"text_input": np.array([b"x"]), "max_tokens": np.array([8])}
    ids = tokenizer.encode("def f(x):", add_special_tokens=False)
    reply = Reply(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=()), [1, 87])
    assert reply.update(_event(ids[:2])) == []
    assert reply.update(_event(ids[2:], finished=True)) == [(tokenizer.decode(ids), ids, True)]
    # exclude_input_in_output false: the prompt as sent and its ids first
    fields["exclude_input_in_output"] = np.array([False])
    reply = Reply(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=()), [1, 87])
    assert reply.update(_event(ids, finished=True)) == [("x" + tokenizer.decode(ids), [1, 87, *ids], True)]


def test_a_streamed_reply_never_carries_the_prompt_as_tensorrt_llm_streams_only_new_tokens(tokenizer):
    from trtspec.triton_repo.models.inflight import Reply

    fields = {"text_input": np.array([b"x"]), "max_tokens": np.array([8]), "stream": np.array([True])}
    ids = tokenizer.encode("def f(x):", add_special_tokens=False)
    answers = []
    for exclude in (True, False):
        fields["exclude_input_in_output"] = np.array([exclude])
        reply = Reply(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=()), [1, 87])
        answers.append(reply.update(_event(ids, finished=True)))
    assert answers[0] == answers[1] and sum((chunk for _, chunk, _ in answers[0]), []) == ids


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

        log_error = log_warn


class _MetricsPb(_PbUtils):
    """_PbUtils with triton_python_backend_utils' custom metrics: MetricFamily(name, description, kind), its
    Metric(labels) and a Metric's increment / set, each a round trip to the server that takes a moment. An update
    that finds another thread inside the same Metric is what aborts a real tritonserver (triton_io.METRICS_LOCK):
    counted in ``overlaps``."""

    overlaps = 0

    class MetricFamily:
        COUNTER, GAUGE = "counter", "gauge"

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels=None):  # noqa: N802 - pb_utils' name
            return _MetricsPb.Metric()

    class Metric:
        def __init__(self):
            self.value, self.inside = 0.0, threading.Lock()

        def _update(self, new):
            if not self.inside.acquire(blocking=False):
                _MetricsPb.overlaps += 1
                return
            try:
                time.sleep(0.0005)
                self.value = new(self.value)
            finally:
                self.inside.release()

        def increment(self, value):
            self._update(lambda old: old + value)

        def set(self, value):
            self._update(lambda old: value)


def test_requests_that_finish_at_once_never_update_one_metric_together(monkeypatch):
    """The orchestrator's requests finish on threads of their own and each adds its counts to the entry model's
    metrics (a refused one counts too): no two threads are inside one metric at once, and every count lands."""
    from trtspec.triton_repo.models import triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _MetricsPb)
    monkeypatch.setattr(_MetricsPb, "overlaps", 0)
    metrics = triton_io.SpecDecodeMetrics("m", 2)
    counts = SpecDecodeCounts(4, 3, 2, (2, 1), 1)
    threads, each = 6, 10
    start = threading.Barrier(threads)

    def finish():
        start.wait(timeout=30)
        for _ in range(each):
            metrics.add(counts, "length")
            metrics.refuse()

    workers = [threading.Thread(target=finish) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert _MetricsPb.overlaps == 0
    total = threads * each
    assert metrics.finished["length"].value == metrics.refused.value == total
    assert metrics.counters["num_rounds_without_speculation", None].value == total
    assert [m.value for m in metrics.per_pos] == [2 * total, total]


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
    ok = build_responses(
        "a", Reply(req, TextCodec(tokenizer, end_ids=()), [1]), _event(ids), cancelled.append
    )
    ((response, flags),) = ok
    assert response.tensors["text_output"][0, 0].decode() == tokenizer.decode(ids) and flags == 0
    assert response.tensors["output_ids"].tolist() == [ids] and response.error is None

    class BrokenCodec:
        def decode(self, _ids):
            raise ValueError("no such id")

        def stream_decoder(self):
            return IncrementalDecoder(self.decode)

    reply = Reply(req, BrokenCodec(), [1])
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

    codec = TextCodec(tokenizer, end_ids=(2, 7))
    fields = {"text_input": np.array([b"def f(x):"]), "max_tokens": np.array([500]), "top_k": np.array([1])}
    fields |= {"temperature": np.array([0.7]), "num_draft_tokens": np.array([2])}
    prompt, params, options = to_job(parse_request(fields, LIMITS), codec, LIMITS)
    assert prompt == codec.encode("def f(x):")
    assert params.max_new_tokens == LIMITS.max_seq_len - len(prompt) and params.num_draft_tokens == 2
    assert params.greedy and options["eos_ids"] == (2, 7) and options["keep_end"] is False
    fields |= {"end_id": np.array([9]), "stop_words": np.array([b"return"])}
    _, _, options = to_job(parse_request(fields, LIMITS), codec, LIMITS)
    assert options["eos_ids"] == (9,) and options["stop_sequences"] == codec.stop_ids(["return"])


@pytest.mark.parametrize(
    ("name", "value", "remedy"),
    [
        ("end_id", -5, "send a token id of this model, -1 for no end id, or leave it out"),
        ("end_id", 10**6, "send a token id of this model, -1 for no end id, or leave it out"),
        ("pad_id", -1, "send a token id of this model or leave it out"),
        ("pad_id", 10**6, "send a token id of this model or leave it out"),
    ],
)
def test_an_end_or_pad_id_outside_the_vocabulary_is_refused_in_one_line(tokenizer, name, value, remedy):
    """An end id the model can never emit would drop its own end ids on the torch runtime, and TensorRT-LLM would
    refuse it as an engine failure in its own words. TensorRT-LLM pads its output buffers with pad_id; the torch
    runtime refuses the same values, so a request one runtime serves does not fail on the other."""

    fields = {"text_input": np.array([b"def"]), "max_tokens": np.array([8]), name: np.array([value])}
    with pytest.raises(RequestError) as err:
        to_job(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=(2,)), LIMITS)
    assert err.value.message == f"{name} {value} is outside the vocabulary [0, {len(tokenizer)}); {remedy}"
    fields[name] = np.array([0])
    assert to_job(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=(2,)), LIMITS)[0]


@pytest.mark.parametrize("decoupled", [False, True])
def test_an_unexpected_failure_fails_only_its_request_of_the_batch(monkeypatch, decoupled):
    """The torch runtime's entry model: a request whose submission fails for a reason not its own gets one
    INTERNAL line, the server log the traceback, and the batch's other requests are served."""
    from trtspec.triton_repo.models import inflight, triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    _PbUtils.Logger.lines.clear()
    sent: dict[str, list] = {}

    class Request:
        def __init__(self, name):
            self.name = name

        def get_response_sender(self):
            return types.SimpleNamespace(send=lambda r, flags=0: sent.setdefault(self.name, []).append(r))

    def submit(self, request, sender):
        if request.name == "bad":
            raise KeyError("slot 3")
        sender.send(triton_io.error_response("fine", True))

    model = inflight.TritonPythonModel()
    model.decoupled = decoupled
    monkeypatch.setattr(inflight.TritonPythonModel, "_submit", submit)
    out = model.execute([Request("bad"), Request("good")])
    responses = sent if decoupled else dict(zip(("bad", "good"), ([r] for r in out), strict=True))
    ((bad,),) = [responses["bad"]]
    assert bad.error.message == "internal error: KeyError: 'slot 3'" and bad.error.code == "INTERNAL"
    assert responses["good"][0].error.message == "fine"
    assert "Traceback" in _PbUtils.Logger.lines[-1] and "KeyError: 'slot 3'" in _PbUtils.Logger.lines[-1]


def test_end_id_minus_one_the_fixed_length_advice_of_the_min_length_refusal_stops_on_no_token(tokenizer):

    fields = {"text_input": np.array([b"def"]), "max_tokens": np.array([8]), "end_id": np.array([-1])}
    _, _, options = to_job(parse_request(fields, LIMITS), TextCodec(tokenizer, end_ids=(2,)), LIMITS)
    assert options["eos_ids"] == (-1,)


def test_a_repository_without_adaptive_k_parameters_gets_the_policy_defaults():
    """Entry models rendered before adaptive K's parameters existed still load, with KPolicy's defaults."""
    from trtspec.triton_repo.models.request import k_policy_from_parameters

    assert k_policy_from_parameters({}) == KPolicy()
    rendered = k_policy_from_parameters({"draft_cost_ratio": "0.35", "k_schedule": "1:4,8:0"})
    assert rendered.draft_cost_ratio == 0.35 and rendered != KPolicy()


def test_an_engine_models_error_reaches_the_client_as_its_first_line(monkeypatch):
    """TensorRT-LLM's errors carry a file, a line and a native stack after their first line: the client gets the
    first line (cut as any library's error is), the server log the whole text."""
    from trtspec.triton_repo.models import triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    logged = []
    monkeypatch.setattr(triton_io, "log_error", logged.append)
    first = "[TensorRT-LLM][ERROR] Assertion failed: prompt length (70) exceeds max_input_len (64)"
    err = triton_io.BlsError(
        f"{first}\n1  0x7f3a tensorrt_llm::common::throwRuntimeError(char const*)\n2  0x7f3b"
    )
    response = triton_io.engine_error_response(err)
    assert response.error.message == f"engine error: {first}" and response.error.code == "INTERNAL"
    assert "throwRuntimeError" in logged[0]
    assert triton_io.internal_error(RuntimeError("kernel failed\n  at frame 1")) == (
        "internal error: RuntimeError: kernel failed"
    )


class _BlsPb(_PbUtils):
    """_PbUtils with BLS as pb_utils has it: InferenceRequest(...).exec() gives a response whose has_error() and
    error() tell a failure, and get_output_tensor_by_name gives None for an output it lacks."""

    answer: dict = {}

    class InferenceRequest:
        def __init__(self, model_name, requested_output_names, inputs):
            self.outputs = requested_output_names

        def exec(self):
            tensors = [_PbUtils.Tensor(n, v) for n, v in _BlsPb.answer.items() if n in self.outputs]
            return _BlsResponse(tensors)

    @staticmethod
    def get_output_tensor_by_name(response, name):
        array = response.tensors.get(name)
        return None if array is None else _BlsTensor(array)


class _BlsResponse(_PbUtils.InferenceResponse):
    def has_error(self):
        return self.error is not None


class _BlsTensor:
    def __init__(self, array):
        self.array = array

    def as_numpy(self):
        return self.array


def test_an_engine_answer_without_its_tokens_is_an_error_naming_the_output(monkeypatch):
    """A response with no error and no tensors (what a callee whose stub died can leave) is a BlsError naming the
    model and the missing output, never a TypeError from reading it; an optional output is None."""
    from trtspec.triton_repo.models import triton_io

    monkeypatch.setattr(triton_io, "pb", lambda: _BlsPb)
    ids = np.array([[1, 2, 3]], dtype=np.int32)
    monkeypatch.setattr(_BlsPb, "answer", {})
    with pytest.raises(triton_io.BlsError, match="^tensorrt_llm answered without its output_ids output"):
        triton_io.bls("tensorrt_llm", {"input_ids": ids}, ["output_ids", "sequence_length"])
    monkeypatch.setattr(_BlsPb, "answer", {"output_ids": ids})
    with pytest.raises(triton_io.BlsError, match="^tensorrt_llm answered without its sequence_length output"):
        triton_io.bls("tensorrt_llm", {"input_ids": ids}, ["output_ids", "sequence_length"])
    monkeypatch.setattr(_BlsPb, "answer", {"output_ids": ids, "sequence_length": np.array([[3]])})
    out = triton_io.bls(
        "tensorrt_llm_draft", {"input_ids": ids}, ["output_ids", "sequence_length", "generation_logits"]
    )
    assert out["generation_logits"] is None and out["output_ids"] is ids


class _StrictSender:
    """python_backend's ResponseSender as it behaves: the final flag closes it ("Response sender has been
    closed" after), and is_cancelled after that reaches a freed response factory: recorded here as a violation."""

    def __init__(self, fail_first=False):
        self.sent, self.closed, self.asked_after_close, self.fail_first = [], False, 0, fail_first

    def send(self, response, flags=0):
        if self.closed:
            raise RuntimeError("Response sender has been closed")
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("Failed to increase the shared memory pool size")
        self.sent.append((response, flags))
        self.closed = bool(flags & _PbUtils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self):
        self.asked_after_close += self.closed
        return False


def test_a_request_the_loop_refuses_is_answered_only_once_no_ask_about_it_is_under_way(monkeypatch):
    """execute watches a request before the loop takes it, and answers a refusal with the final response once it
    forgot it; the sending thread may have listed it for an ask just before. forget waits for that ask, so
    is_cancelled never reaches the response factory the final response freed."""
    from trtspec.triton_repo.models import triton_io
    from trtspec.triton_repo.models.inflight import Outbox

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    inside, resume = threading.Event(), threading.Event()

    def slow_ask() -> bool:  # an earlier request's ask, under way when the refusal comes
        inside.set()
        resume.wait(timeout=30)
        return False

    refused = _StrictSender()
    outbox = Outbox(cancel=lambda request_id: None)
    try:
        outbox.watch("earlier", slow_ask)
        outbox.watch("refused", refused.is_cancelled)
        asking = threading.Thread(target=outbox._ask_cancelled)
        asking.start()
        assert inside.wait(timeout=30)

        def refuse():  # execute's path when loop.submit raises RequestError
            outbox.forget("refused")
            refused.send("refusal", flags=_PbUtils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        answering = threading.Thread(target=refuse)
        answering.start()
        answering.join(timeout=0.5)
        assert answering.is_alive()  # waiting for the ask that listed the request
        resume.set()
        asking.join(timeout=30)
        answering.join(timeout=30)
    finally:
        resume.set()
        outbox.stop()
    assert refused.closed and refused.asked_after_close == 0


@pytest.mark.parametrize("failure", ["send", "build"])
def test_a_request_whose_reply_fails_still_ends_its_stream_and_is_never_asked_about_again(
    tokenizer, monkeypatch, failure
):
    """A failed send (a client gone, a full shared-memory pool) or a response that cannot be built: the stream
    still ends with one final response, the request is cancelled, and the sending thread keeps cancelling it
    until its finished event without asking Triton again."""
    from trtspec.triton_repo.models import triton_io
    from trtspec.triton_repo.models.inflight import Outbox, Reply

    monkeypatch.setattr(triton_io, "pb", lambda: _PbUtils)
    fields = {"text_input": np.array([b"x"]), "max_tokens": np.array([8]), "stream": np.array([True])}
    codec = TextCodec(tokenizer, end_ids=())
    if failure == "build":
        monkeypatch.setattr(codec, "stream_decoder", lambda: IncrementalDecoder(lambda ids: 1 / 0))
    reply = Reply(parse_request(fields, LIMITS), codec, [1])
    sender, cancelled = _StrictSender(fail_first=failure == "send"), []
    outbox = Outbox(cancel=cancelled.append, loop_builds_from=99)
    ids = tokenizer.encode("def f(x):", add_special_tokens=False)
    try:
        outbox.watch("a", sender.is_cancelled)
        for _ in range(3):  # the loop's rounds go on until its cancel takes effect
            outbox.put("a", sender, reply, _event(ids))
            outbox.flush()
        outbox.put("a", sender, reply, _event([], finished=True))
        outbox.flush()
        deadline = time.monotonic() + 10
        while "a" in outbox.watched and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        outbox.stop()
    ((response, flags),) = sender.sent
    assert flags == _PbUtils.TRITONSERVER_RESPONSE_COMPLETE_FINAL and response.error is not None
    assert sender.asked_after_close == 0 and "a" not in outbox.watched
    assert cancelled and set(cancelled) == {"a"} and reply.closed
