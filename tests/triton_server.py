"""Reusable test helper: a real tritonserver on a repository, on free loopback ports, stopped cleanly.

with running_server(repo, tmp_path / "server.log") as server:
    server.ports.grpc_url, server.ports.http_url
"""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from trtspec.core.errors import PortInUse
from trtspec.triton_repo.server import Ports, TritonServer, free_ports


@contextlib.contextmanager
def running_server(repo: Path, log_path: Path, timeout_s: float = 180.0, attempts: int = 3):
    """Start tritonserver on ``repo`` (127.0.0.1, free ports), yield the TritonServer, always kill it. The server
    binds its ports seconds after they were found free, and `make test` runs four test sessions side by side, so a
    port another session took meanwhile means another try on other ports."""
    for attempt in range(1, attempts + 1):
        server = TritonServer(repo, Ports(*free_ports(3)), log_path)
        try:
            server.start(timeout_s)  # stops the server itself when it fails
            break
        except PortInUse:
            if attempt == attempts:
                raise
    try:
        yield server
    except BaseException:
        # pytest prints a failed test's captured stderr: the server's own account of what went wrong (a stub that
        # died, an abort in the python backend) is there beside the assertion
        print(
            f"--- last lines of {log_path} ---",
            *server.log_text().splitlines()[-60:],
            sep="\n",
            file=sys.stderr,
        )
        raise
    finally:
        # Killed at once, as serve kills a server that outlives its grace (its stubs and shared memory go too):
        # a graceful stop waits out tritonserver's one-second shutdown polls, about 3 s a server, and is the
        # subject of the tests that stop a server the way a user does (test_serve_cli, test_faults_serving).
        server.stop(grace_s=0)


def tiny_recipe(tiny_pair: tuple[Path, Path], **triton):
    """The tiny pair (conftest) as a recipe, K <= 4, prompts <= 64 tokens; ``triton``: its triton section."""
    from trtspec.recipe import recipe_from_dict

    target, draft = tiny_pair
    return recipe_from_dict(
        {
            "name": "tiny",
            "target": {"model": str(target)},
            "draft": {"model": str(draft)},
            "speculative": {"max_draft_len": 4},
            "limits": {"max_input_len": 64, "max_seq_len": 128},
            "triton": triton,
        }
    )


def deploy_tiny_repo(tiny_pair: tuple[Path, Path], out: Path, **triton) -> Path:
    """tiny_recipe's torch-runtime repository at ``out``."""
    from trtspec.triton_repo.deploy import deploy

    deploy(tiny_recipe(tiny_pair, **triton), "torch", out)
    return out


def scrape(server, prefix: str = "") -> dict[tuple[str, frozenset], float]:
    """Triton's /metrics as {(name, frozenset of (label, value)): value}, only the names starting with ``prefix``."""
    import re
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if line.startswith("#") or not match or not match.group(1).startswith(prefix):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        out[(match.group(1), labels)] = float(match.group(3))
    return out


# ---------------------------------------------------------------- asking the server (gRPC) and the reference

MODEL = "tensorrt_llm_bls"  # the entry model of a trtspec repository
PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "import os\nimport sys\n"]


def hf_greedy(model_dir: Path):
    """``run(prompt, max_tokens, with_ids=False)``: HF greedy text (and ids) of the model at ``model_dir``, the
    PyTorch reference a served greedy answer must equal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

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


def client_inputs(client_mod, prompt, max_tokens=12, **extra):
    """``client_mod``'s InferInputs of one request: the prompt, max_tokens and ``extra`` inputs by name."""
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
        if isinstance(value, str):  # a STRING input, sent as bytes
            fields[key] = np.array([[value.encode()]], dtype=object)
        else:
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


def grpc_stream(
    server, prompt, chunk_ids: list | None = None, model: str = MODEL, **extra
) -> tuple[list[str], dict]:
    """Text pieces and metrics of one gRPC stream to ``model``; ``chunk_ids`` collects each response's
    output_ids."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    pieces, metrics = [], {}
    with grpcclient.InferenceServerClient(server.ports.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(
            model, client_inputs(grpcclient, prompt, **extra), enable_empty_final_response=True
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
                from trtspec.triton_repo.interface import METRIC_OUTPUTS

                metrics = {
                    k: result.as_numpy(k).reshape(-1)[0].item()
                    for k in METRIC_OUTPUTS
                    if result.as_numpy(k) is not None
                }
            if (
                response.parameters.get("triton_final_response")
                and response.parameters["triton_final_response"].bool_param
            ):
                break
        client.stop_stream()
    return pieces, metrics


SPEC = "trtspec_spec_decode_"


def spec_metrics(server) -> dict:
    """The entry model's trtspec_spec_decode_* values: {field: value} (every proposer's together), per_pos:
    [value by position], and {(field, proposer): value} for the counters labelled with a proposer."""
    values = scrape(server, SPEC)
    out, per_pos = {}, {}
    for (name, labels), value in values.items():
        labels = dict(labels)
        assert labels["model"] == MODEL, labels
        field = name[len(SPEC) :]
        if "position" in labels:
            per_pos[int(labels["position"])] = value
        else:
            out[field] = out.get(field, 0.0) + value
        if "proposer" in labels:
            out[field, labels["proposer"]] = value
    out["per_pos"] = [per_pos[i] for i in range(len(per_pos))]
    return out


def delta(after: dict, before: dict) -> dict:
    return {
        k: [a - b for a, b in zip(v, before[k], strict=True)] if k == "per_pos" else v - before.get(k, 0.0)
        for k, v in after.items()
        if k != "draft_len"
    }


def http_generate(server, body: dict, stream: bool = False, model: str = MODEL) -> tuple[int, str]:
    """(HTTP status, body) of one request to ``model``'s generate (or generate_stream) endpoint."""
    url = f"http://{server.ports.http_url}/v2/models/{model}/generate" + ("_stream" if stream else "")
    req = urllib.request.Request(url, data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read().decode()
            return resp.status, raw
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def at_once(server, bodies: list[dict], model: str = MODEL) -> list[tuple[int, str]]:
    """http_generate's answers to ``bodies``, each sent by a thread of its own, all released at one instant."""
    start = threading.Barrier(len(bodies))

    def together(body: dict):
        start.wait(timeout=60)
        return http_generate(server, body, model=model)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(together, bodies))


def batched_bursts(server, bodies: list[dict], tries: int = 3, model: str = MODEL) -> bool:
    """Whether concurrent requests to a repository that is not decoupled share an execute: each of up to
    ``tries`` bursts sends ``bodies`` at one instant over HTTP and must answer each as it is answered alone;
    True once a burst took fewer executions than requests (Triton's /metrics). On a loaded machine one request
    may finish before the next reaches Triton, so batching must show within a few bursts, not in each."""
    labels = frozenset({("model", model), ("version", "1")})
    alone = [http_generate(server, body, model=model) for body in bodies]
    assert all(status == 200 for status, _ in alone), alone
    done = len(bodies)

    def counted(total: int) -> dict:
        """/metrics once Triton has counted ``total`` inferences (it may report one a moment after the answer),
        or after 10 s."""
        deadline = time.monotonic() + 10
        while (metrics := scrape(server, "nv_inference_")).get(("nv_inference_count", labels), 0) < total:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return metrics

    for _ in range(tries):
        before = counted(done)
        assert at_once(server, bodies, model) == alone
        done += len(bodies)
        after = counted(done)
        requests, executions = (
            after[(name, labels)] - before[(name, labels)]
            for name in ("nv_inference_count", "nv_inference_exec_count")
        )
        assert requests == len(bodies)
        if executions < requests:
            return True
    return False
