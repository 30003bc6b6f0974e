"""A real tritonserver (CPU, nvidia-pytriton's) on a torch-runtime repository of the tiny pair, one for the module:
gRPC and HTTP, streaming and not, greedy output equal to HF greedy of the target, both entry names (upstream's
`tensorrt_llm_bls` and `ensemble`), concurrency, bad requests."""

from __future__ import annotations

import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from triton_server import (
    MODEL,
    PROMPTS,
    batched_bursts,
    client_inputs,
    deploy_tiny_repo,
    grpc_stream,
    hf_greedy,
    http_generate,
    running_server,
    scrape,
)

from trtspec.triton_repo.models.triton_io import REQUESTS_REFUSED
from trtspec.triton_repo.server import Ports

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(tiny_pair):
    return hf_greedy(tiny_pair[0])


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    deploy_tiny_repo(tiny_pair, root / "repo")
    with running_server(root / "repo", root / "server.log") as srv:
        yield srv


def test_grpc_greedy_equals_hf_reference_streaming_and_not(server, reference):
    for prompt in PROMPTS[:2]:
        want, want_ids = reference(prompt, 12, with_ids=True)
        chunks = []
        pieces, _ = grpc_stream(server, prompt, chunks, stream=False)
        assert "".join(pieces) == want
        assert chunks == [want_ids]  # output_ids: the generated token ids, exactly
        chunks = []
        pieces, metrics = grpc_stream(
            server, prompt, chunks, stream=True, return_perf_metrics=True, num_draft_tokens=3
        )
        assert "".join(pieces) == want
        assert len([p for p in pieces if p]) > 1  # streamed in rounds, not in one piece
        # each streamed chunk carries its own round's ids; together they are the whole answer
        assert sum(chunks, []) == want_ids and len(chunks) == len(pieces)
        assert all(ids for ids, piece in zip(chunks, pieces, strict=True) if piece)
        assert metrics["total_draft_tokens"] > 0
        assert metrics["acceptance_rate"] == pytest.approx(
            metrics["total_accepted_draft_tokens"] / metrics["total_draft_tokens"]
        )


def test_seeded_sampling_gives_the_same_text_streamed_or_not(server):
    sampling = {"temperature": 1.0, "top_k": 20, "seed": 1234, "num_draft_tokens": 3}
    whole, _ = grpc_stream(server, PROMPTS[0], stream=False, **sampling)
    streamed, _ = grpc_stream(server, PROMPTS[0], stream=True, **sampling)
    other, _ = grpc_stream(server, PROMPTS[0], stream=False, **(sampling | {"seed": 99}))
    assert "".join(streamed) == "".join(whole) and "".join(whole)
    assert "".join(other) != "".join(whole)  # the seed matters, so the equality above is not vacuous


def test_http_generate_and_generate_stream(server, reference):
    want = reference(PROMPTS[2], 10)
    status, raw = http_generate(
        server, {"text_input": PROMPTS[2], "max_tokens": 10, "return_perf_metrics": True}
    )
    assert status == 200, raw
    body = json.loads(raw)
    assert body["text_output"] == want and "acceptance_rate" in body
    assert body["output_ids"] == reference(PROMPTS[2], 10, with_ids=True)[1]
    status, raw = http_generate(
        server, {"text_input": PROMPTS[2], "max_tokens": 10, "stream": True}, stream=True
    )
    assert status == 200, raw
    events = [json.loads(line[len("data: ") :]) for line in raw.splitlines() if line.startswith("data: ")]
    assert "".join(e.get("text_output", "") for e in events) == want


def test_eight_concurrent_clients_get_their_own_outputs(server, reference):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: "".join(grpc_stream(server, p, stream=True)[0]), prompts))
    assert got == [reference(p, 12) for p in prompts]


def _success_count(server) -> float:
    """The entry model's nv_inference_request_success from Triton's own /metrics."""
    values = [
        v
        for (_, labels), v in scrape(server, "nv_inference_request_success").items()
        if ("model", MODEL) in labels
    ]
    assert values, "no request counter for the entry model in /metrics"
    return values[0]


def test_eight_streams_joining_one_batch_equal_each_request_sent_alone(server):
    """In-flight batching: 8 streams with their own lengths, K and sampling settings join and leave one running
    batch; each one's text and ids equal the same request sent alone, and Triton counts each request."""
    requests = [
        dict(prompt=PROMPTS[i % 4], max_tokens=6 + 3 * i, num_draft_tokens=i % 5)
        | ({"temperature": 0.8, "top_k": 20, "seed": 7 + i} if i % 3 == 2 else {})
        for i in range(8)
    ]

    def run(r):
        ids = []
        pieces, _ = grpc_stream(
            server, r["prompt"], ids, stream=True, **{k: v for k, v in r.items() if k != "prompt"}
        )
        return "".join(pieces), sum(ids, [])

    alone = [run(r) for r in requests]
    before = _success_count(server)
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(run, requests))
    assert together == alone
    assert all(text for text, _ in alone) and len({text for text, _ in alone}) > 4
    deadline = time.monotonic() + 10  # Triton may count a request a moment after its last response
    while _success_count(server) < before + 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _success_count(server) == before + 8


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text_input": "", "max_tokens": 4}, "text_input is empty"),
        ({"text_input": "def " * 80, "max_tokens": 4}, "more than max_input_len 64"),
        ({"text_input": "def", "max_tokens": 0}, "max_tokens must be > 0"),
        ({"text_input": "def", "max_tokens": 4, "num_draft_tokens": 9}, "max_draft_len 4"),
        ({"text_input": "def", "max_tokens": 4, "top_p": 1.5}, "top_p must be in (0, 1]"),
        (
            {"text_input": "def", "max_tokens": 4, "temperature": -1.0},
            "temperature must be a finite number >= 0",
        ),
        (  # fields that name no input reach the model as request parameters, which it would ignore
            {"text_input": "def", "max_tokens": 4, "repetition_penalty": 1.2, "temprature": 0.5},
            "'repetition_penalty', 'temprature': not an input of this model, so it would be ignored",
        ),
    ],
)
def test_bad_requests_get_clear_client_errors_and_the_server_keeps_serving(server, body, message):
    refused = (REQUESTS_REFUSED, frozenset({("model", MODEL)}))
    before = scrape(server, REQUESTS_REFUSED)[refused]
    status, raw = http_generate(server, body)
    assert status == 400, raw
    assert message in raw and "Traceback" not in raw
    assert scrape(server, REQUESTS_REFUSED)[refused] == before + 1  # Triton counts it a success
    status, _ = http_generate(server, {"text_input": "def", "max_tokens": 2})
    assert status == 200


def test_a_setting_sent_as_a_request_parameter_is_refused_on_every_route(server):
    """gRPC clients can set request parameters beside the inputs, and `ensemble` passes a client's on to its
    step: the entry model refuses them by name there too. Triton's own settings still pass: a stream request's
    priority and timeout, and a generate body's request id."""
    status, raw = http_generate(
        server, {"text_input": "def", "max_tokens": 2, "min_p": 0.1}, model="ensemble"
    )
    assert status == 400 and "'min_p': not an input of this model" in raw
    status, raw = http_generate(server, {"id": "42", "text_input": "def", "max_tokens": 2})
    assert status == 200 and json.loads(raw)["id"] == "42"  # the generate extension's request id is Triton's
    import tritonclient.grpc as grpcclient

    request = client_inputs(grpcclient, "def", max_tokens=2)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.ports.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error))
        client.async_stream_infer(MODEL, request, parameters={"min_p": 0.1})
        refused = answers.get(timeout=60)
        client.async_stream_infer(MODEL, request, priority=1, timeout=10**7)
        served = answers.get(timeout=60)
        client.stop_stream()
    assert "'min_p': not an input of this model" in str(refused) and served is None


def test_wrong_dtype_is_rejected(server):
    import tritonclient.grpc as grpcclient

    # Triton checks dtypes before the model runs: the error comes back on the stream, the server keeps serving.
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"def"]], dtype=object))
    bad = grpcclient.InferInput("max_tokens", [1, 1], "FP32")
    bad.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    errors: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.ports.grpc_url) as client:
        client.start_stream(callback=lambda result, error: errors.put(error))
        client.async_stream_infer(MODEL, [text, bad])
        error = errors.get(timeout=60)
        client.stop_stream()
    assert error is not None and "FP32" in str(error) and "INT32" in str(error)
    assert http_generate(server, {"text_input": "def", "max_tokens": 2})[0] == 200


def test_clients_written_for_upstreams_ensemble_get_the_entry_models_answers(server, reference):
    """`ensemble`, the model upstream's clients call by default (end_to_end_grpc_client.py, the generate endpoint
    in its docs, genai-perf -m ensemble): the entry model's answers, streamed or not, ids and metrics included."""
    prompt, want_ids = PROMPTS[3], reference(PROMPTS[3], 12, with_ids=True)[1]
    for stream in (True, False):
        answers = {}
        for model in (MODEL, "ensemble"):
            ids = []
            pieces, metrics = grpc_stream(
                server, prompt, ids, model=model, stream=stream, return_perf_metrics=True, num_draft_tokens=3
            )
            answers[model] = (pieces, ids, metrics)
        assert answers["ensemble"] == answers[MODEL]
        pieces, ids, metrics = answers["ensemble"]
        assert "".join(pieces) == reference(prompt, 12) and sum(ids, []) == want_ids
        assert len([p for p in pieces if p]) > 1 if stream else len(pieces) == 1
        assert metrics["total_draft_tokens"] > 0
    # genai-perf's tensorrtllm request (text_input, max_tokens, stream) and the generate endpoints
    body = {"text_input": prompt, "max_tokens": 12, "stop_words": ""}
    status, raw = http_generate(server, body, model="ensemble")
    assert status == 200, raw
    assert json.loads(raw)["text_output"] == reference(prompt, 12)
    status, raw = http_generate(server, body | {"stream": True}, stream=True, model="ensemble")
    assert status == 200, raw
    events = [json.loads(line[len("data: ") :]) for line in raw.splitlines() if line.startswith("data: ")]
    assert "".join(e.get("text_output", "") for e in events) == reference(prompt, 12)
    status, raw = http_generate(server, {"text_input": "", "max_tokens": 4}, model="ensemble")
    assert status == 400 and "text_input is empty" in raw, raw


def upstream_end_to_end_client(server, prompt: str, streaming: bool, exclude_input_in_output: bool) -> tuple:
    """One request as tensorrtllm_backend's inflight_batcher_llm/client/end_to_end_grpc_client.py sends it to
    `ensemble` with its default flags (prepare_inputs: every input it always sends, beam_width 1 and
    exclude_input_in_output included; start_stream, async_stream_infer, stop_stream), and --temperature 0, which
    trtspec answers greedily. -> (the text as the client joins it, the ids of every response)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * 12,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[exclude_input_in_output]], dtype=bool),
    }
    tensors = []
    for name, value in inputs.items():
        tensors.append(grpcclient.InferInput(name, value.shape, np_to_triton_dtype(value.dtype)))
        tensors[-1].set_data_from_numpy(value)
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", "output_ids")]
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.ports.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        client.async_stream_infer("ensemble", tensors, outputs=outputs)
        client.stop_stream()  # waits for the server to close the stream
    text, ids = "", []
    while not results.empty():
        result = results.get()
        assert not isinstance(result, Exception), result
        # The client joins the pieces as here, but reads each as output[0]: upstream's text_output is [1], trtspec's
        # [1, 1] (docs/triton-models.md, "What an upstream client may send").
        text += result.as_numpy("text_output").reshape(-1)[0].decode()
        ids += result.as_numpy("output_ids").reshape(-1).tolist()
    return text, ids


def test_upstreams_end_to_end_client_and_readme_requests_are_served_with_the_prompt_where_asked(
    server, reference, tiny_pair
):
    """The inputs upstream's own clients send by default (end_to_end_grpc_client.py: beam_width 1,
    exclude_input_in_output false; the README's curl: "bad_words": "") are served, not refused by name. A whole
    answer with exclude_input_in_output false is the prompt as sent + the greedy text (ids: the prompt's + the
    generated ones); a streamed one, as TensorRT-LLM streams, never carries the prompt."""
    from transformers import AutoTokenizer

    prompt = PROMPTS[1]
    greedy, greedy_ids = upstream_end_to_end_client(server, prompt, False, exclude_input_in_output=True)
    assert (greedy, greedy_ids) == reference(prompt, 12, with_ids=True)
    prompt_ids = AutoTokenizer.from_pretrained(tiny_pair[0]).encode(prompt)
    got = upstream_end_to_end_client(server, prompt, False, exclude_input_in_output=False)
    assert got == (prompt + greedy, prompt_ids + greedy_ids)
    for exclude in (False, True):
        assert upstream_end_to_end_client(server, prompt, True, exclude) == (greedy, greedy_ids)
    readme = {"text_input": prompt, "max_tokens": 12, "bad_words": "", "stop_words": ""}
    status, raw = http_generate(server, readme, model="ensemble")
    assert status == 200 and json.loads(raw)["text_output"] == greedy, raw
    status, raw = http_generate(server, readme | {"exclude_input_in_output": False}, model="ensemble")
    assert status == 200 and json.loads(raw)["text_output"] == prompt + greedy, raw
    for refused, message in [
        ({"beam_width": 2}, "beam_width 2 is not supported"),
        ({"bad_words": ["awful"]}, "bad_words ['awful'] is not supported"),
        ({"min_length": 12}, "min_length 12 is not supported"),
    ]:
        status, raw = http_generate(server, readme | refused, model="ensemble")
        assert status == 400 and message in raw, raw


@pytest.mark.one_stack  # how a non-decoupled repository is served and asked: the same on either transformers
def test_a_non_decoupled_repository_batches_concurrent_requests_and_offers_what_it_serves(
    tiny_pair, tmp_path
):
    """triton.decoupled false: execute answers its whole batch before it returns, so without the dynamic batcher
    concurrent requests would run one after another. With it, requests that queue meanwhile reach one execute
    and share its rounds: fewer executions than requests, each answer the one it gets alone. `serve` then
    offers only whole answers, and tools/client.py's gRPC request is served."""
    import subprocess
    import sys
    from pathlib import Path

    from trtspec.triton_repo.serve import read_manifest, sample_requests

    repo = deploy_tiny_repo(tiny_pair, tmp_path / "repo", decoupled=False)
    offered = sample_requests(Ports(8000, 8001, 8002), decoupled=read_manifest(repo)["decoupled"])
    assert offered and not any("stream" in line for line in offered)
    client = Path(__file__).resolve().parents[1] / "tools" / "client.py"
    with running_server(repo, tmp_path / "server.log") as srv:
        bodies = [{"text_input": p, "max_tokens": 48} for p in PROMPTS]
        assert batched_bursts(srv, bodies), "no burst of concurrent requests shared an execution"
        url = srv.ports.grpc_url
        got = subprocess.run(
            [sys.executable, str(client), "--url", url, "--max-tokens", "4", "def add(a, b):"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert got.returncode == 0 and got.stdout.startswith("def add(a, b):"), got.stderr
