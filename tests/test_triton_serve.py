"""A real tritonserver (CPU, nvidia-pytriton's) on a torch-runtime repository of the tiny pair: gRPC and HTTP,
streaming and not, greedy output equal to HF greedy of the target, concurrency, bad requests, metrics."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from triton_server import deploy_tiny_repo, running_server, scrape

pytestmark = [pytest.mark.server, pytest.mark.slow]
MODEL = "tensorrt_llm_bls"
PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "import os\nimport sys\n"]


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    deploy_tiny_repo(tiny_pair, root / "repo")
    with running_server(root / "repo", root / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(tiny_pair):
    """HF greedy text of the target, the PyTorch reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0]).eval()

    def run(prompt: str, max_tokens: int, with_ids: bool = False):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        new = out[0, ids.shape[1] :].tolist()
        if tok.eos_token_id in new:  # the server stops at end_id without emitting it
            new = new[: new.index(tok.eos_token_id)]
        text = tok.decode(new, skip_special_tokens=True)
        return (text, new) if with_ids else text

    return run


def _inputs(client_mod, prompt, max_tokens=12, **extra):
    fields = {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
    }
    dtypes = {
        "num_draft_tokens": np.int32,
        "top_k": np.int32,
        "temperature": np.float32,
        "top_p": np.float32,
        "stream": bool,
        "return_perf_metrics": bool,
        "seed": np.uint64,
    }
    for key, value in extra.items():
        fields[key] = np.array([[value]], dtype=dtypes.get(key, type(value)))
    tensors = []
    for name, arr in fields.items():
        t = client_mod.InferInput(
            name,
            arr.shape,
            "BYTES"
            if arr.dtype == object
            else {
                np.dtype(np.int32): "INT32",
                np.dtype(np.float32): "FP32",
                np.dtype(bool): "BOOL",
                np.dtype(np.uint64): "UINT64",
            }[arr.dtype],
        )
        t.set_data_from_numpy(arr)
        tensors.append(t)
    return tensors


def grpc_stream(server, prompt, chunk_ids: list | None = None, **extra) -> tuple[list[str], dict]:
    """Text pieces and metrics of one gRPC stream; ``chunk_ids`` collects each response's output_ids."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    pieces, metrics = [], {}
    with grpcclient.InferenceServerClient(server.ports.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(
            MODEL, _inputs(grpcclient, prompt, **extra), enable_empty_final_response=True
        )
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                client.stop_stream()
                raise error
            response = result.get_response()
            out = result.as_numpy("text_output")
            if out is not None:
                pieces.append(out.reshape(-1)[0].decode())
            ids = result.as_numpy("output_ids")
            if chunk_ids is not None and ids is not None:
                chunk_ids.append(ids.reshape(-1).tolist())
            if result.as_numpy("acceptance_rate") is not None:
                metrics = {
                    k: result.as_numpy(k).reshape(-1)[0].item()
                    for k in ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
                }
            if (
                response.parameters.get("triton_final_response")
                and response.parameters["triton_final_response"].bool_param
            ):
                break
        client.stop_stream()
    return pieces, metrics


def http_generate(server, body: dict, stream: bool = False):
    url = f"http://{server.ports.http_url}/v2/models/{MODEL}/generate" + ("_stream" if stream else "")
    req = urllib.request.Request(url, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read().decode()
            return resp.status, raw
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


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
    assert _success_count(server) == before + 8


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text_input": "", "max_tokens": 4}, "text_input is empty"),
        ({"text_input": "def " * 80, "max_tokens": 4}, "more than max_input_len 64"),
        ({"text_input": "def", "max_tokens": 0}, "max_tokens must be > 0"),
        ({"text_input": "def", "max_tokens": 4, "num_draft_tokens": 9}, "max_draft_len 4"),
        ({"text_input": "def", "max_tokens": 4, "top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"text_input": "def", "max_tokens": 4, "temperature": -1.0}, "temperature must be >= 0"),
    ],
)
def test_bad_requests_get_clear_client_errors_and_the_server_keeps_serving(server, body, message):
    status, raw = http_generate(server, body)
    assert status == 400, raw
    assert message in raw and "Traceback" not in raw
    status, _ = http_generate(server, {"text_input": "def", "max_tokens": 2})
    assert status == 200


def test_wrong_dtype_is_rejected(server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    # Triton checks dtypes before any model runs; plain HTTP infer reaches the non-decoupled preprocessing.
    bad = httpclient.InferInput("END_ID", [1, 1], "FP32")
    bad.set_data_from_numpy(np.array([[4.0]], dtype=np.float32))
    text = httpclient.InferInput("QUERY", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"def"]], dtype=object))
    with (
        httpclient.InferenceServerClient(server.ports.http_url) as client,
        pytest.raises(InferenceServerException) as err,
    ):
        client.infer("preprocessing", [text, bad])
    assert "FP32" in str(err.value) and "INT32" in str(err.value)


SPEC = "trtspec_spec_decode_"


def spec_metrics(server) -> dict:
    """The entry model's trtspec_spec_decode_* values: {field: value}, per_pos: [value by position]."""
    values = scrape(server, SPEC)
    out, per_pos = {}, {}
    for (name, labels), value in values.items():
        labels = dict(labels)
        assert labels["model"] == MODEL, labels
        if "position" in labels:
            per_pos[int(labels["position"])] = value
        else:
            out[name[len(SPEC) :]] = value
    out["per_pos"] = [per_pos[i] for i in range(len(per_pos))]
    return out


def delta(after: dict, before: dict) -> dict:
    return {
        k: [a - b for a, b in zip(v, before[k], strict=True)] if k == "per_pos" else v - before[k]
        for k, v in after.items()
        if k != "draft_len"
    }


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The shipped demo pair (acceptance about 0.6, so some rounds accept part of their draft), torch runtime."""
    from trtspec.recipe import DEMO_DIR

    root = tmp_path_factory.mktemp("demo-serve")
    deploy_tiny_repo((DEMO_DIR / "target", DEMO_DIR / "draft"), root / "repo")
    with running_server(root / "repo", root / "server.log") as srv:
        yield srv


def test_metrics_count_what_the_responses_report(demo_server):
    """/metrics' counters grow by exactly the return_perf_metrics of the requests sent (streamed, not streamed,
    sampled); positions add up to the accepted tokens; the K gauge follows the last request."""
    server = demo_server
    requests = [
        dict(prompt=PROMPTS[0], stream=True, num_draft_tokens=3, max_tokens=16),
        dict(prompt=PROMPTS[1], stream=False, num_draft_tokens=4, max_tokens=12),
        dict(
            prompt=PROMPTS[2],
            stream=True,
            num_draft_tokens=2,
            max_tokens=10,
            temperature=0.9,
            top_k=20,
            seed=5,
        ),
    ]
    before = spec_metrics(server)
    assert len(before["per_pos"]) == 4  # every position up to max_draft_len exists before it counts anything
    reported = []
    for r in requests:
        _, metrics = grpc_stream(server, r.pop("prompt"), return_perf_metrics=True, **r)
        reported.append(metrics)
    got = delta(spec_metrics(server), before)
    assert got["num_draft_tokens_total"] == sum(m["total_draft_tokens"] for m in reported) > 0
    assert got["num_accepted_tokens_total"] == sum(m["total_accepted_draft_tokens"] for m in reported) > 0
    per_pos = got["per_pos"]
    assert sum(per_pos) == got["num_accepted_tokens_total"] and per_pos[0] > per_pos[-1]
    # a round accepts position i only after accepting 0..i-1, and accepts at most one token per position
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert per_pos[0] <= got["num_drafts_total"] <= got["num_draft_tokens_total"]
    assert got["num_draft_tokens_total"] <= 4 * got["num_drafts_total"]
    # each request's first round is the target's prefill alone
    assert got["num_rounds_without_speculation_total"] >= len(requests)
    # the gauge: the last request's mean K (K=2, less only where max_tokens left less room)
    assert 1.0 <= spec_metrics(server)["draft_len"] <= 2.0

    before = spec_metrics(server)
    ids: list = []
    _, metrics = grpc_stream(server, PROMPTS[3], ids, stream=False, num_draft_tokens=0, max_tokens=6)
    got = delta(spec_metrics(server), before)
    assert got["num_drafts_total"] == got["num_draft_tokens_total"] == 0 and not any(got["per_pos"])
    # K=0: one target forward per token (and one more for an end_id it does not emit)
    assert got["num_rounds_without_speculation_total"] in (len(sum(ids, [])), len(sum(ids, [])) + 1)


def test_draft_ahead_with_a_draft_that_is_always_right_keeps_the_target_greedy_output(
    tiny_pair, reference, tmp_path
):
    """The orchestrator harness (the tensorrtllm runtime's path over torch engine models); the target as its own
    draft: every round accepts the whole draft and the bonus guess, so each round after
    the prefill verifies a draft made ahead (K + 1 = max_draft_len + 1 tokens asked of the draft engine model)."""
    target = tiny_pair[0]
    deploy_tiny_repo((target, target), tmp_path / "repo", harness=True)
    with running_server(tmp_path / "repo", tmp_path / "server.log") as srv:
        drafted = 0
        for stream in (True, False):
            pieces, metrics = grpc_stream(
                srv, PROMPTS[1], stream=stream, max_tokens=16, num_draft_tokens=4, return_perf_metrics=True
            )
            assert "".join(pieces) == reference(PROMPTS[1], 16)
            assert metrics["acceptance_rate"] == 1.0 and metrics["total_draft_tokens"] > 0
            drafted += metrics["total_draft_tokens"]
        # the tensorrtllm runtime's entry model exports the same metrics: here every draft token is accepted
        got = spec_metrics(srv)
        assert got["num_draft_tokens_total"] == got["num_accepted_tokens_total"] == drafted
        assert got["per_pos"][0] == got["num_drafts_total"] and sum(got["per_pos"]) == drafted
        assert got["draft_len"] > 0
