"""The Triton client side of validate and bench (validate/triton_client.py, triton_system.py) against stand-ins of
what a real server cannot be made to do on cue: a stream that never ends, a connection cut mid-answer, a server
that hides its configs. The gRPC stand-in replaces tritonclient's InferenceServerClient and answers with real
``InferResult`` objects; the HTTP one is a socket that writes what Triton's generate_stream writes."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trtspec.core.errors import ServerError, TrtspecError
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo.interface import CLIENT_INPUTS
from trtspec.triton_repo.llmapi import LLMAPI_INPUTS
from trtspec.validate.systems import Request
from trtspec.validate.triton_client import EndpointResponse, TritonClient
from trtspec.validate.triton_system import TritonSystem

BLS = "tensorrt_llm_bls"


def infer_result(outputs: dict, final: bool):
    """tritonclient's InferResult of one streamed response carrying ``outputs`` (name -> numpy array)."""
    from tritonclient.grpc import InferResult, service_pb2
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    response = service_pb2.ModelInferResponse(model_name=BLS)
    for name, array in outputs.items():
        text = array.dtype == object
        response.outputs.add(
            name=name, datatype="BYTES" if text else np_to_triton_dtype(array.dtype), shape=list(array.shape)
        )
        response.raw_output_contents.append(serialize_byte_tensor(array).item() if text else array.tobytes())
    response.parameters["triton_final_response"].bool_param = final
    return InferResult(response)


@pytest.fixture
def grpc_stand_in(monkeypatch):
    """tritonclient.grpc.InferenceServerClient as TritonClient drives it: ``answers`` are the responses of each
    request, (outputs, final) each, or None for a server that never answers; ``together``: a barrier each request
    waits at before it is answered (requests that must be in flight at once). As tritonclient's, stop_stream()
    without cancel_requests waits for every request still open on the stream: one that never ends, until the
    test ends."""
    import tritonclient.grpc as grpcclient

    released = threading.Event()

    class StandIn:
        answers: list | None = []
        made: list = []
        together: threading.Barrier | None = None

        def __init__(self, url, *args, **kwargs):
            self.url, self.callback, self.open = url, None, 0
            StandIn.made.append(self)

        def start_stream(self, callback, stream_timeout=None, headers=None, compression_algorithm=None):
            self.callback, self.open = callback, 0

        def async_stream_infer(self, model_name, inputs, **kwargs):
            if StandIn.answers is None:
                self.open += 1
                return
            if StandIn.together is not None:
                StandIn.together.wait(timeout=10)
            for outputs, final in StandIn.answers:
                self.callback(infer_result(outputs, final), None)

        def stop_stream(self, cancel_requests=False):
            if self.open and not cancel_requests:
                released.wait()
            self.open = 0

        def close(self):
            self.stop_stream()

    monkeypatch.setattr(grpcclient, "InferenceServerClient", StandIn)
    yield StandIn
    released.set()


def serve_model(monkeypatch, interface: str = "trtspec", configs: dict | None = None) -> None:
    """TritonClient's metadata, readiness and config calls answered as a server whose entry model speaks
    ``interface`` (under its default name, or any name a test passes as --model would) and whose model configs are
    ``configs`` (model -> config JSON; a model left out: one whose config the server will not give)."""
    inputs = set(CLIENT_INPUTS if interface == "trtspec" else LLMAPI_INPUTS)
    other = "tensorrt_llm" if interface == "trtspec" else BLS
    monkeypatch.setattr(TritonClient, "_input_names", lambda self, model: None if model == other else inputs)
    monkeypatch.setattr(TritonClient, "check_ready_of", lambda self, model: None)
    monkeypatch.setattr(TritonClient, "_model_config", lambda self, model: (configs or {}).get(model))


def bls_config(decoupled: bool = True, **parameters) -> dict:
    return {
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
        "model_transaction_policy": {"decoupled": decoupled},
    }


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=object)


def test_a_grpc_request_whose_stream_never_ends_gives_up_in_one_line(grpc_stand_in):
    """No response within the wait: the request is cancelled as the stream stops, so a stuck server is one line
    naming the wait, not a client that waits with it forever."""
    grpc_stand_in.answers = None
    client = TritonClient("127.0.0.1:1", "grpc", model=BLS, interface="trtspec", timeout_s=0.05)
    assert request_error(client) == (
        "Triton at 127.0.0.1:1 sent nothing for 0.05 s; check the server's log for a stuck request"
    )


def test_a_run_that_stops_gives_up_its_requests_in_flight_at_once(grpc_stand_in, monkeypatch):
    """Ctrl-C or a failed request closes the system: a request still waiting for its answer is cancelled on the
    server and ends within a poll, not when its answer would have (here: never; the wait is 600 s)."""
    serve_model(monkeypatch, configs={BLS: bls_config(num_draft_tokens="adaptive", max_draft_len="4")})
    grpc_stand_in.answers = None
    system = TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS)
    error = request_error(system.client, system.close)
    assert error == "request to Triton at 127.0.0.1:1 given up: the run is stopping"


def request_error(client: TritonClient, stop=None) -> str | None:
    """The error of one request, which must end within 10 s; ``stop``: called 0.3 s into it, which must end it
    within 2 s."""
    outcome: dict = {}

    def request() -> None:
        try:
            client.generate("def f(x):", 4)
        except ServerError as err:
            outcome["error"] = err.message

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    if stop is not None:
        time.sleep(0.3)
        started = time.monotonic()
        stop()
    thread.join(timeout=10)
    assert not thread.is_alive(), "generate waited for a request that never finishes"
    if stop is not None:
        assert time.monotonic() - started < 2
    return outcome.get("error")


def test_a_triton_system_keeps_its_connections_from_one_generate_to_the_next(grpc_stand_in, monkeypatch):
    """Each request thread keeps its gRPC connection; the threads outlive a group, so the second group connects
    nothing (no group's timing includes connecting)."""
    serve_model(monkeypatch, configs={BLS: bls_config(num_draft_tokens="adaptive", max_draft_len="4")})
    ids = np.array([[5, 6]], dtype=np.int32)
    grpc_stand_in.answers = [({"text_output": text("ab"), "output_ids": ids}, True)]
    grpc_stand_in.together = threading.Barrier(2)  # a group's two requests on two threads
    system = TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS)
    group = [Request("def f(x):", [1]), Request("class A:", [2])]
    params = SamplingParams(max_new_tokens=4, num_draft_tokens=2)
    first = system.generate(group, params)
    assert len(grpc_stand_in.made) == 2 and [g.token_ids for g in first] == [[5, 6], [5, 6]]
    system.generate(group, params)
    assert len(grpc_stand_in.made) == 2  # the same two connections
    system.close()


def test_llmapi_text_so_far_becomes_pieces_and_trtspec_pieces_stay_pieces(grpc_stand_in):
    """Upstream's LLM-API model sends the whole text so far on every response (CompletionOutput.text): a piece is
    what it adds. trtspec's entry models send each round's piece."""
    grpc_stand_in.answers = [
        ({"text_output": text(t)}, final) for t, final in (("a", False), ("ab", False), ("abc", True))
    ]
    upstream = TritonClient("127.0.0.1:1", "grpc", model="tensorrt_llm", interface="llmapi")
    response = upstream.generate("def f(x):", 4)
    assert response.text == "abc" and [piece for _, piece in response.pieces] == ["a", "b", "c"]
    grpc_stand_in.answers = [
        ({"text_output": text(t)}, final) for t, final in (("a", False), ("b", False), ("c", True))
    ]
    assert TritonClient("127.0.0.1:1", "grpc", model=BLS, interface="trtspec").generate("x", 4).text == "abc"


def test_text_so_far_that_rewrites_its_end_keeps_the_latest_text():
    response = EndpointResponse()
    for arrival, so_far in ((0.1, "ab"), (0.2, "abc\ufffd"), (0.3, "abcé"), (0.4, "abcé!")):
        response.add_text(arrival, so_far, cumulative=True)
    assert response.text == "abcé!"
    assert response.pieces == [(0.1, "ab"), (0.2, "c"), (0.3, "é"), (0.4, "!")]


def http_stand_in(
    events: list[dict], cut: bool, hold: threading.Event | None = None
) -> tuple[str, threading.Thread]:
    """A socket answering one generate_stream request as Triton does (chunked server-sent events), ``cut``: the
    connection closed in the middle of a chunk, as a server that dies while it answers; ``hold``: the answer
    goes on only once it is set (a request still generating)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += connection.recv(65536)
            out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            for event in events:
                chunk = f"data: {json.dumps(event)}\n\n".encode()
                out += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            if hold is not None:
                connection.sendall(out)
                out = b""
                hold.wait(30)
            out += b"40\r\ndata: {" if cut else b"0\r\n\r\n"
            with contextlib.suppress(OSError):  # a client that gave up has shut its end
                connection.sendall(out)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", thread


def test_an_http_answer_cut_short_is_one_line():
    url, server = http_stand_in([{"text_output": "a", "output_ids": [5]}], cut=True)
    client = TritonClient(url, model=BLS, interface="trtspec", timeout_s=5)
    with pytest.raises(ServerError) as caught:
        client.generate("def f(x):", 4)
    assert caught.value.message == (
        f"Triton at {url} failed the request after part of its answer: the connection closed before the answer "
        "ended (IncompleteRead)"
    )
    server.join(timeout=5)


def test_a_run_that_stops_gives_up_its_http_requests_in_flight_at_once():
    """As over gRPC: a request whose answer is still coming ends when the run stops (its connection is shut), not
    when the answer would have (here: after 30 s)."""
    hold = threading.Event()
    url, server = http_stand_in([{"text_output": "a", "output_ids": [5]}], cut=False, hold=hold)
    client = TritonClient(url, model=BLS, interface="trtspec", timeout_s=60)
    error = request_error(client, client.stop)
    assert error == f"request to Triton at {url} given up: the run is stopping"
    hold.set()
    server.join(timeout=5)


def test_llmapi_text_so_far_over_http():
    url, server = http_stand_in([{"text_output": t} for t in ("a", "ab", "abc")], cut=False)
    response = TritonClient(url, model="tensorrt_llm", interface="llmapi", timeout_s=5).generate("x", 4)
    assert response.text == "abc" and [piece for _, piece in response.pieces] == ["a", "b", "c"]
    server.join(timeout=5)


def test_an_ensemble_reads_the_parameters_and_streaming_of_the_step_that_has_them(monkeypatch):
    steps = [{"model_name": name} for name in ("preprocessing", BLS, "postprocessing")]
    ensemble = {"platform": "ensemble", "ensemble_scheduling": {"step": steps}}
    bls = bls_config(num_draft_tokens="adaptive", max_draft_len="6", proposer="ngram")
    # a step before it with parameters of its own (upstream's preprocessing: its tokenizer's)
    pre = {"parameters": {"tokenizer_dir": {"string_value": "/models/tokenizer"}}}
    serve_model(
        monkeypatch, configs={"ensemble": ensemble, BLS: bls, "preprocessing": pre, "postprocessing": {}}
    )
    system = TritonSystem("127.0.0.1:1", tokenizer=None, model="ensemble", max_draft_len=3, proposer="draft")
    assert system.client.served_config().source == BLS
    assert (system.adaptive, system.max_draft_len, system.proposer, system.stream) == (True, 6, "ngram", True)
    assert system.notes == []


def test_a_server_that_hides_its_configs_leaves_them_unknown_and_says_so(monkeypatch):
    serve_model(monkeypatch, configs={})
    system = TritonSystem(
        "127.0.0.1:1",
        tokenizer=None,
        model="ensemble",
        max_draft_len=3,
        proposer="draft+ngram",
        decoupled=False,
    )
    assert system.adaptive is None  # not "not adaptive": unknown, so bench does not measure it
    assert (system.max_draft_len, system.proposer, system.stream) == (3, "draft+ngram", False)
    notes = " ".join(system.notes)
    assert "its model configs could not be read" in notes and "adaptive K was not measured" not in notes
    from trtspec.validate.run_bench import BenchOptions, _sweep_notes

    options = BenchOptions(ks=(1,), concurrency=(1,))
    assert f"{system.name}: adaptive K was not measured." in _sweep_notes(system, 4, options)
    assert "the recipe's triton.decoupled (false) was taken" in notes


def test_a_model_that_is_not_decoupled_is_asked_for_whole_answers_with_no_latencies(monkeypatch):
    """A model deployed with triton.decoupled false refuses stream=true: the system asks for whole answers and
    reports time to first token and inter-token latency as unknown, not as the whole answer's arrival."""
    from trtspec.validate.bench import BenchPoint
    from trtspec.validate.bench_report import row_cells

    serve_model(monkeypatch, configs={BLS: bls_config(decoupled=False, num_draft_tokens="adaptive")})
    sent = []

    def generate(self, text, max_tokens, num_draft_tokens=None, stream=True, **sampling):
        sent.append(stream)
        metrics = {"total_draft_tokens": 4, "total_accepted_draft_tokens": 3}
        return EndpointResponse([(0.3, "ab")], metrics, 0.3, [(0.3, [5, 6])])

    monkeypatch.setattr(TritonClient, "generate", generate)
    system = TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS)
    generations = system.generate(
        [Request("def f(x):", [1])], SamplingParams(max_new_tokens=4, num_draft_tokens=2)
    )
    assert sent == [False] and generations[0].time_to_first_token_s is None
    assert any("is not decoupled" in note for note in system.notes)
    row = BenchPoint(2, 1, generations, 0.3).summary()
    assert row["ttft_p50_s"] is row["itl_p50_s"] is None
    row.update(speedup=None, analytic_bound=None, achieved_fraction=None)
    assert row_cells(row)[9:] == ["-", "-", "-", "-"]


def test_zero_draft_tokens_from_upstreams_llmapi_model_are_unreported_not_none_drafted(monkeypatch):
    """TensorRT-LLM 1.2.x's PyTorch flow returns its speculative-decoding counters zeroed: a request to the
    LLM-API model, which always drafts, that reports none leaves acceptance unknown, and the report says so."""
    serve_model(monkeypatch, "llmapi", configs={"tensorrt_llm": bls_config()})
    drafted = {"n": 0}

    def generate(self, text, max_tokens, num_draft_tokens=None, stream=True, **sampling):
        metrics = {
            "total_draft_tokens": drafted["n"],
            "total_accepted_draft_tokens": 0,
            "acceptance_rate": 0.0,
        }
        return EndpointResponse([(0.1, "ab")], metrics, 0.2)

    monkeypatch.setattr(TritonClient, "generate", generate)
    tokenizer = lambda text, add_special_tokens: SimpleNamespace(input_ids=[5, 6])  # noqa: E731
    request, params = [Request("def f(x):", [1])], SamplingParams(max_new_tokens=4)
    system = TritonSystem("127.0.0.1:1", tokenizer, llmapi_max_draft_len=4)
    one = SimpleNamespace(input_ids=[5])
    system.tokenizer = lambda text, add_special_tokens: one  # one token: the prefill's, no round drafted
    system.generate(request, params)
    assert not any("acceptance is unknown" in note for note in system.notes)
    system.tokenizer = tokenizer
    drafted["n"] = 3
    system.generate(request, params)
    assert not any("acceptance is unknown" in note for note in system.notes)
    drafted["n"] = 0
    (generation,) = system.generate(request, params)
    assert generation.stats.measured_acceptance is None
    assert any("acceptance is unknown here, not zero" in note for note in system.notes)


def test_the_k_range_and_limit_follow_what_the_server_publishes():
    """With --url the sweep's K range and the K limit are the server's (TritonSystem: its published max_draft_len,
    else the recipe's, noted); the recipe is not consulted for them."""
    from trtspec.validate.inputs import SystemOptions, check_num_draft_tokens
    from trtspec.validate.run_bench import BenchOptions, _sweep_grid

    served = SimpleNamespace(max_draft_len=10, max_draft_len_source="the server's max_draft_len")
    options = BenchOptions(system=SystemOptions(url="127.0.0.1:1"))
    assert _sweep_grid(options, None, [], served).ks == tuple(range(1, 11))
    check_num_draft_tokens([10], None, served)
    with pytest.raises(
        TrtspecError, match=r"^--num-draft-tokens 11 > the server's max_draft_len 10; use K <= 10$"
    ):
        check_num_draft_tokens([11], None, served)


def test_bench_against_a_server_refuses_in_process_options(runner):
    """--device and --dtype place what runs in-process; bench --url runs nothing here (validate's HF reference
    does run here, so validate keeps them)."""
    from trtspec.cli import cli
    from trtspec.validate.inputs import SystemOptions

    result = runner.invoke(cli, ["bench", "demo", "--url", "127.0.0.1:1", "--device", "cuda"])
    assert result.exit_code == 2, result.output
    assert (
        "--device is for a system run in-process; with --url nothing runs here, so drop it" in result.output
    )
    SystemOptions(url="127.0.0.1:1", dtype="float16").check(reference=True)
    with pytest.raises(TrtspecError, match="--dtype is for a system run in-process"):
        SystemOptions(url="127.0.0.1:1", dtype="float16").check(reference=False)


def test_write_recipe_against_a_server_is_checked_against_the_recipe_before_the_sweep():
    """--write-recipe saves a copy of the recipe: a K past the recipe's max_draft_len (the server's may be larger)
    or a draft proposer where the recipe has no draft would fail that copy after the whole sweep, so both are
    refused before it."""
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import SystemOptions
    from trtspec.validate.run_bench import BenchOptions, _check_sweep

    recipe = load_recipe("demo")
    served = SimpleNamespace(
        max_draft_len=12, max_draft_len_source="the server's max_draft_len", proposer="draft"
    )
    options = BenchOptions(
        system=SystemOptions(url="127.0.0.1:1"), ks=(2, 10), concurrency=(1,), write_recipe=Path("r.yaml")
    )
    _check_sweep(replace(options, write_recipe=None), recipe, served)  # the server takes K=10
    with pytest.raises(
        TrtspecError, match=r"^--num-draft-tokens 10 > the recipe's speculative.max_draft_len 8"
    ):
        _check_sweep(options, recipe, served)
    no_draft = recipe.model_copy(update={"draft": None})
    with pytest.raises(TrtspecError, match="--write-recipe: the server proposes with draft"):
        _check_sweep(replace(options, ks=(2,)), no_draft, served)


@pytest.mark.parametrize(
    ("default", "expected"),
    [("adaptive", None), ("3", 3), (None, 2)],  # None: configs the server will not give
)
def test_validate_against_a_server_measures_the_servers_default_k(monkeypatch, default, expected):
    """Without --num-draft-tokens, validate measures what a request without K gets from the server under test
    (adaptive K, or the K its entry model pins), not the local recipe's pinned K, which another deployment need
    not share; where the server does not say, the recipe's."""
    from trtspec.recipe import load_recipe
    from trtspec.validate.run_validate import validated_k

    configs = {} if default is None else {BLS: bls_config(num_draft_tokens=default, max_draft_len="6")}
    serve_model(monkeypatch, configs=configs)
    system = TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS, max_draft_len=6, proposer="draft")
    recipe = load_recipe("demo")  # pins K=2
    assert recipe.speculative.num_draft_tokens == 2
    assert validated_k(None, recipe, system) == expected
    assert validated_k(4, recipe, system) == 4
    assert validated_k(None, recipe) == 2  # in-process: as deploy would write it


def test_a_server_that_publishes_its_dtype_is_taken_at_its_word(grpc_stand_in, monkeypatch):
    """The torch runtime's entry model publishes target_dtype: the near-tie bound then counts the server's own
    dtype, not the recipe's runtime's (a repository deployed with another --runtime); others do not say."""
    serve_model(monkeypatch, configs={BLS: bls_config(max_draft_len="4", target_dtype="bfloat16")})
    assert TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS).dtype == "bfloat16"
    serve_model(monkeypatch, configs={BLS: bls_config(max_draft_len="4")})
    assert TritonSystem("127.0.0.1:1", tokenizer=None, model=BLS).dtype is None


def test_metrics_are_read_as_numbers_or_as_the_text_upstreams_llmapi_model_sends():
    """Upstream's LLM-API model sends its acceptance metrics in text_output's dtype (bytes over gRPC, a string in
    HTTP's JSON) whatever its config.pbtxt declares; the tensorrt_llm_bls models send numbers."""
    out = EndpointResponse()
    out.add_metric("total_draft_tokens", b"12")
    out.add_metric("acceptance_rate", "0.75")
    out.add_metric("total_accepted_draft_tokens", np.int32(9))
    out.add_metric("ngram_draft_tokens", b"n/a")
    assert out.metrics == {
        "total_draft_tokens": 12,
        "acceptance_rate": 0.75,
        "total_accepted_draft_tokens": 9,
    }
    assert type(out.metrics["total_accepted_draft_tokens"]) is int
