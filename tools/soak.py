#!/usr/bin/env python
"""A soak of the torch runtime through a real tritonserver: many streaming clients for a long time (not a test; its
short form runs in tests/test_faults_serving.py, and docs/benchmarks.md records the 10-minute run).

A recipe (default: the shipped demo pair) is deployed with the torch runtime and adaptive K into a temporary
repository and served on free loopback ports. Each of --clients threads sends streaming requests one after another
for --duration seconds: the shipped raw prompts, max_tokens from --lengths, half greedy and half sampled (seeded),
half with a pinned K (1..max_draft_len) and half adaptive. --cancel-share of the clients cancel every request after
a few responses, by cancelling the gRPC stream or by dropping an HTTP generate_stream connection, in turn. No
request stops early: end_id -1, so each one generates exactly max_tokens.

Phases: a sequential run of every greedy (prompt, length) on its own (the reference), a warm-up under the full load
(--warmup), the soak (--duration), each load phase drained before the next. The checks (exit status 1 when one
fails):
  - lost: every request that was not cancelled ended with a final response, no error and max_tokens tokens; the
    server finished each request once (trtspec_requests_finished_total: length + cancelled = requests, 0 errors);
  - mixed up: every response carried its own request's id, and every greedy text equals the sequential run's;
  - memory: the resident memory of tritonserver and its python stubs (/proc), idle after the soak, has grown by
    no more than --rss-tolerance over its idle level after the warm-up;
  - speed: generated tokens/s over the soak's last window (a minute, or half of a soak under two minutes) has fallen by
    no more than --tps-tolerance below its first.
A soak looks for leaks and slowdowns, so only growth and loss count: a last window faster than the first (the
machine was busy at the start) is not a fault.

    .venv/bin/python tools/soak.py                                   # the demo pair, 32 clients, 10 minutes
    .venv/bin/python tools/soak.py --recipe my.yaml --duration 60 --clients 16
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import queue
import random
import re
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cli_common import at_least, comma_list, run_main, stop_like_serve

MODEL = "tensorrt_llm_bls"
REQUEST_TIMEOUT_S = 300.0  # one request's responses; a request that waits longer is lost
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}


@dataclass(frozen=True)
class Job:
    """One request of one client. ``k``: a pinned K, or None for adaptive; ``seed``: None for greedy;
    ``cancel_after``: responses read before the client cancels (None: read to the end); ``way``: how it cancels."""

    prompt: str
    max_tokens: int
    k: int | None
    seed: int | None
    cancel_after: int | None = None
    way: str = "grpc"

    def fields(self) -> dict:
        """The request's inputs (trtspec.validate.triton_client.request_fields' names)."""
        fields = {"text_input": self.prompt, "max_tokens": self.max_tokens, "stream": True, "end_id": -1}
        if self.k is not None:
            fields["num_draft_tokens"] = self.k
        if self.seed is not None:
            fields |= SAMPLING | {"seed": self.seed}
        return fields


@dataclass
class Outcome:
    """What a client got for one Job: token ids, text, and (seconds since the load started, tokens) per response."""

    job: Job
    ids: list[int] = field(default_factory=list)
    text: str = ""
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    final: bool = False
    cancelled: bool = False
    mixed: bool = False  # a response carried another request's id
    error: str | None = None

    def add(self, at: float, ids, text: str) -> None:
        ids = [int(i) for i in ids]
        self.ids += ids
        self.text += text
        if ids:
            self.arrivals.append((at, len(ids)))

    @property
    def lost(self) -> bool:
        if self.cancelled:
            return False
        return self.error is not None or not self.final or len(self.ids) != self.job.max_tokens


def jobs(
    client: int, rng: random.Random, prompts: list[str], lengths: list[int], max_draft_len: int, cancels: bool
):
    """Client ``client``'s requests, endlessly: a mix of lengths, greedy / sampled and pinned / adaptive K; a
    cancelling client cancels each one after 1..max_tokens/2 responses, by gRPC and by HTTP in turn."""
    for n in itertools.count():
        max_tokens = rng.choice(lengths)
        yield Job(
            prompt=rng.choice(prompts),
            max_tokens=max_tokens,
            k=rng.randint(1, max_draft_len) if rng.random() < 0.5 else None,
            seed=rng.randrange(2**31) if rng.random() < 0.5 else None,
            cancel_after=rng.randint(1, max(max_tokens // 2, 1)) if cancels else None,
            way=("grpc", "http")[(client + n) % 2] if cancels else "grpc",
        )


# ---------------------------------------------------------------- the two clients


class GrpcClient:
    """One client's gRPC connection; a stream per request (tritonclient)."""

    def __init__(self, address: str):
        import tritonclient.grpc as grpcclient

        self.grpc, self.address = grpcclient, address
        self.conn = grpcclient.InferenceServerClient(address)

    def run(self, job: Job, request_id: str, start: float) -> Outcome:
        results: queue.Queue = queue.Queue()
        out = Outcome(job)
        self.conn.start_stream(callback=lambda result, error: results.put((result, error)))
        self.conn.async_stream_infer(
            MODEL, self._inputs(job), request_id=request_id, enable_empty_final_response=True
        )
        try:
            while not out.final:
                result, error = results.get(timeout=REQUEST_TIMEOUT_S)
                if error is not None:
                    out.error = str(error)
                    break
                self._record(result, out, request_id, start)
                if job.cancel_after is not None and len(out.arrivals) >= job.cancel_after and not out.final:
                    out.cancelled = True
                    break
        except queue.Empty:
            out.error = f"no response in {REQUEST_TIMEOUT_S:.0f} s"
        if out.cancelled or out.error:
            self.conn.stop_stream(cancel_requests=True)
            self.conn.close()  # a cancelled stream's connection is not reused
            self.conn = self.grpc.InferenceServerClient(self.address)
        else:
            self.conn.stop_stream()
        return out

    def _inputs(self, job: Job) -> list:
        import numpy as np
        from tritonclient.utils import triton_to_np_dtype

        from trtspec.triton_repo.interface import CLIENT_INPUTS

        tensors = []
        for name, value in job.fields().items():
            dtype = CLIENT_INPUTS[name].removeprefix("TYPE_").replace("STRING", "BYTES")
            array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)
            tensor = self.grpc.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array.astype(triton_to_np_dtype(dtype)))
            tensors.append(tensor)
        return tensors

    @staticmethod
    def _record(result, out: Outcome, request_id: str, start: float) -> None:
        response = result.get_response()
        out.mixed |= response.id != request_id
        text, ids = result.as_numpy("text_output"), result.as_numpy("output_ids")
        piece = text.reshape(-1)[0].decode("utf-8", "replace") if text is not None and text.size else ""
        out.add(time.monotonic() - start, [] if ids is None else ids.reshape(-1), piece)
        final = response.parameters.get("triton_final_response")
        out.final = final is not None and final.bool_param

    def close(self) -> None:
        self.conn.close()


def http_cancelled(address: str, job: Job, request_id: str, start: float) -> Outcome:
    """A generate_stream request whose client drops the connection after ``job.cancel_after`` events. A refusal
    (a status other than 200, whose body is no event stream) is an error, not a cancellation; a stream that ends
    before ``cancel_after`` events is a finished request, judged by its tokens like any other."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
    out = Outcome(job)
    try:
        conn.request(
            "POST", f"/v2/models/{MODEL}/generate_stream", json.dumps({"id": request_id, **job.fields()})
        )
        response = conn.getresponse()
        if response.status != 200:
            body = response.read(500).decode("utf-8", "replace").strip()
            out.error = f"HTTP {response.status} {response.reason}: {body}"
            return out
        while len(out.arrivals) < job.cancel_after and (line := response.readline()):
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                out.error = event["error"]
                break
            out.mixed |= event.get("id") != request_id
            ids = event.get("output_ids", [])
            out.add(
                time.monotonic() - start,
                ids if isinstance(ids, list) else [ids],
                event.get("text_output", ""),
            )
        if out.error is None:
            out.cancelled = len(out.arrivals) >= job.cancel_after
            out.final = not out.cancelled  # the server ended the stream: the request is done
    except (OSError, http.client.HTTPException, ValueError) as err:
        out.error = f"{type(err).__name__}: {err}"
    finally:
        conn.close()  # the drop: the server sees the connection go
    return out


# ---------------------------------------------------------------- the load


@dataclass
class Load:
    """The clients and what they send (see the module docstring)."""

    grpc_address: str
    http_address: str
    clients: int
    cancelling: set[int]
    prompts: list[str]
    lengths: list[int]
    max_draft_len: int
    seed: int
    ids: itertools.count = field(default_factory=itertools.count)  # request ids, unique over every phase
    phases: int = 0

    def run(self, seconds: float) -> list[Outcome]:
        """Every client sends requests until ``seconds`` have passed and its last one has ended; arrival times
        are seconds after this call."""
        start, self.phases = time.monotonic(), self.phases + 1
        with ThreadPoolExecutor(self.clients, thread_name_prefix="client") as pool:
            futures = [pool.submit(self._client, i, start, start + seconds) for i in range(self.clients)]
            return [o for f in futures for o in f.result()]

    def _client(self, client: int, start: float, deadline: float) -> list[Outcome]:
        rng = random.Random(f"{self.seed}/{self.phases}/{client}")  # the same requests for the same seed
        plan = jobs(client, rng, self.prompts, self.lengths, self.max_draft_len, client in self.cancelling)
        grpc, outcomes = GrpcClient(self.grpc_address), []
        try:
            for job in plan:
                if time.monotonic() >= deadline:
                    break
                request_id = f"c{client}-{next(self.ids)}"
                if job.way == "http":
                    outcomes.append(http_cancelled(self.http_address, job, request_id, start))
                else:
                    outcomes.append(grpc.run(job, request_id, start))
        finally:
            grpc.close()
        return outcomes


def sequential_greedy(load: Load) -> dict[tuple[str, int], Outcome]:
    """Every greedy (prompt, length) the load may send, alone, one after another: the texts to compare with."""
    grpc, start, out = GrpcClient(load.grpc_address), time.monotonic(), {}
    try:
        for prompt in load.prompts:
            for length in load.lengths:
                out[prompt, length] = grpc.run(Job(prompt, length, None, None), f"ref-{len(out)}", start)
    finally:
        grpc.close()
    return out


# ---------------------------------------------------------------- what the server shows


def server_rss_mib(sid: int) -> float:
    """Resident memory of tritonserver and every process of its session (the python stubs), MiB (Linux /proc)."""
    from trtspec.triton_repo.server import session_processes

    total_kib = 0
    for pid in session_processes(sid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total_kib += int(match.group(1)) if match else 0
    return total_kib / 1024


def idle_rss_mib(sid: int, settle_s: float = 3.0) -> float:
    """The server's resident memory once a drained load has settled: the median of a few samples."""
    time.sleep(settle_s)
    samples = []
    for _ in range(5):
        samples.append(server_rss_mib(sid))
        time.sleep(0.2)
    return statistics.median(samples)


def finished_counts(metrics_url: str) -> dict[str, float]:
    """trtspec_requests_finished_total of the entry model, by finish_reason."""
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    pattern = r"^trtspec_requests_finished_total\{([^}]*)\} (\S+)$"
    counts = {}
    for labels, value in re.findall(pattern, text, re.M):
        reason = re.search(r'finish_reason="([^"]*)"', labels)
        if reason and f'model="{MODEL}"' in labels:
            counts[reason.group(1)] = float(value)
    return counts


# ---------------------------------------------------------------- the checks


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def tokens_per_s(outcomes: list[Outcome], begin: float, end: float) -> float:
    """Generated tokens the clients received between ``begin`` and ``end`` (seconds into the load), per second."""
    tokens = sum(n for o in outcomes for at, n in o.arrivals if begin <= at < end)
    return tokens / (end - begin)


def check_all(soak, reference, served, rss, speeds, tolerances) -> list[Check]:
    """The soak's checks (module docstring); ``served``: the server's finished counts over the soak."""
    done = [o for o in soak if not o.cancelled]
    lost = [o for o in soak if o.lost]
    mixed = [o for o in soak if o.mixed]
    greedy = [o for o in done if o.job.seed is None and not o.lost]
    differ = [o for o in greedy if o.ids != reference[o.job.prompt, o.job.max_tokens].ids]
    cancelled = len(soak) - len(done)
    once = served.get("length", 0) + served.get("cancelled", 0) == len(soak) and not served.get("error", 0)
    rss_warm, rss_end = rss
    first, last = speeds
    return [
        Check("lost", not lost, f"{len(lost)} of {len(done)} completed requests lost"),
        Check(
            "finished once",
            once,
            f"server: {served.get('length', 0):.0f} length + {served.get('cancelled', 0):.0f} cancelled "
            f"+ {served.get('error', 0):.0f} error, for {len(soak)} requests ({cancelled} cancelled by clients)",
        ),
        Check("mixed up", not mixed, f"{len(mixed)} requests got another request's response"),
        Check("greedy = sequential", not differ, f"{len(differ)} of {len(greedy)} greedy texts differ"),
        Check(
            "memory",
            rss_end / rss_warm - 1 <= tolerances[0],
            f"RSS {rss_warm:.0f} MiB after warm-up, {rss_end:.0f} MiB after the soak "
            f"({(rss_end / rss_warm - 1) * 100:+.1f}%, tolerance {tolerances[0] * 100:.0f}%)",
        ),
        Check(
            "speed",
            first > 0 and 1 - last / first <= tolerances[1],
            f"{first:.1f} tokens/s in the first window, {last:.1f} in the last "
            f"({(last / first - 1) * 100 if first else 0:+.1f}%, tolerance {tolerances[1] * 100:.0f}%)",
        ),
    ]


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="demo", help="recipe file or 'demo' (the shipped pair)")
    parser.add_argument(
        "--duration", type=float, default=600.0, help="seconds of the soak (after the warm-up)"
    )
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds of full load first [duration/10, 10..60]"
    )
    parser.add_argument("--clients", type=int, default=32, help="concurrent streaming clients")
    parser.add_argument("--cancel-share", type=float, default=0.1, help="share of the clients that cancel")
    parser.add_argument(
        "--lengths",
        type=comma_list(at_least(1), "a max_tokens (1 or more)"),
        default=[16, 32, 64, 128],
        help="max_tokens of the requests, comma-separated",
    )
    parser.add_argument(
        "--rss-tolerance", type=float, default=0.05, help="memory check: most relative growth"
    )
    parser.add_argument("--tps-tolerance", type=float, default=0.10, help="speed check: most relative loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-timeout", type=float, default=600.0, help="seconds for the server to load")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 256 or not 10 <= args.duration <= 24 * 3600:
        parser.error("--clients must be 1..256 and --duration 10..86400 s")
    return args


def serve(args, tmp: Path):
    """The recipe (adaptive K by default) deployed with the torch runtime and served on loopback: the server."""
    from trtspec.recipe import load_recipe
    from trtspec.triton_repo.deploy import deploy
    from trtspec.triton_repo.server import Ports, TritonServer, free_ports

    recipe = load_recipe(args.recipe)
    speculative = recipe.speculative.model_copy(update={"num_draft_tokens": None})
    recipe = recipe.model_copy(update={"speculative": speculative})
    repo = deploy(recipe, "torch", tmp / "repo").repo
    stop_like_serve()
    server = TritonServer(repo, Ports(*free_ports(3)), tmp / "server.log")
    server.start(args.load_timeout)
    return recipe, server


def report(checks: list[Check], soak: list[Outcome], seconds: float, window: float) -> bool:
    kinds = {
        "greedy": sum(o.job.seed is None for o in soak),
        "pinned K": sum(o.job.k is not None for o in soak),
        "cancelled": sum(o.cancelled for o in soak),
        "by HTTP drop": sum(o.cancelled and o.job.way == "http" for o in soak),
    }
    print(
        f"soak: {len(soak)} requests in {seconds:.0f} s; " + ", ".join(f"{k} {v}" for k, v in kinds.items())
    )
    starts = [i * window for i in range(int(seconds // window))]
    speeds = [f"{tokens_per_s(soak, t, t + window):.0f}" for t in starts]
    print(f"tokens/s by {window:.0f} s window: {' '.join(speeds)}")
    for check in checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'} {check.name:<20} {check.detail}")
    return all(c.ok for c in checks)


def main(argv=None) -> int:
    args = parse_args(argv)
    from trtspec.validate.prompts import load_prompts

    warmup = args.warmup if args.warmup is not None else min(max(args.duration / 10, 10.0), 60.0)
    window = min(60.0, args.duration / 2)
    with tempfile.TemporaryDirectory(prefix="trtspec-soak-") as tmp:
        recipe, server = serve(args, Path(tmp))
        try:
            cancelling = max(round(args.clients * args.cancel_share), 1 if args.cancel_share > 0 else 0)
            load = Load(
                grpc_address=server.ports.grpc_url,
                http_address=server.ports.http_url,
                clients=args.clients,
                cancelling=set(range(args.clients - cancelling, args.clients)),
                prompts=[p.text for p in load_prompts(chat_set=False)],
                lengths=args.lengths,
                max_draft_len=recipe.speculative.max_draft_len,
                seed=args.seed,
            )
            metrics_url = server.metrics_url
            sid = server.proc.pid
            print(
                f"recipe {recipe.name}: {args.clients} clients ({cancelling} cancelling), warm-up {warmup:.0f} s, "
                f"soak {args.duration:.0f} s, windows {window:.0f} s"
            )
            reference = sequential_greedy(load)
            print(f"sequential run: {len(reference)} greedy requests")
            load.run(warmup)
            rss_warm = idle_rss_mib(sid)
            before = finished_counts(metrics_url)
            soak = load.run(args.duration)
            rss_end = idle_rss_mib(sid)
            after = finished_counts(metrics_url)
        finally:
            server.stop()
    served = {reason: after.get(reason, 0) - before.get(reason, 0) for reason in after}
    speeds = tokens_per_s(soak, 0, window), tokens_per_s(soak, args.duration - window, args.duration)
    tolerances = args.rss_tolerance, args.tps_tolerance
    checks = check_all(soak, reference, served, (rss_warm, rss_end), speeds, tolerances)
    reference_lost = [key for key, o in reference.items() if o.lost]
    checks.insert(
        0, Check("sequential run", not reference_lost, f"{len(reference_lost)} reference requests lost")
    )
    return 0 if report(checks, soak, args.duration, window) else 1


if __name__ == "__main__":
    run_main(main)
