"""A client of a trtspec (or upstream tensorrtllm_backend) Triton endpoint: one request, its pieces and metrics.

``TritonClient.generate`` sends one request to the entry model over gRPC streaming (tritonclient; works for
decoupled and non-decoupled models) or HTTP (the generate / generate_stream extension, server-sent events), and
records when each piece arrived. validate's ``TritonSystem`` (triton_system.py) and tools/ build on it. It speaks
both client interfaces a deployment can have (``INTERFACES``; found from the model's metadata unless given):
- ``trtspec``: tensorrt_llm_bls (torch and tensorrtllm runtimes): text_input, max_tokens, num_draft_tokens, stream,
  temperature, top_k, top_p, seed, return_perf_metrics, proposer (only where given) -> text_output, output_ids and
  the acceptance metrics (lookup's part of them too);
- ``llmapi``: upstream's LLM-API ``tensorrt_llm`` (trtllm-pytorch): the same fields as sampling_param_* and
  streaming -> text_output and the same metrics; K is fixed by model.yaml, so num_draft_tokens is not sent. Each
  streamed response's text_output is the whole text so far (upstream's model.py sends CompletionOutput.text, not
  its text_diff), so a piece is what it adds to the one before.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from trtspec.core.errors import RequestError, ServerError
from trtspec.triton_repo import llmapi
from trtspec.triton_repo.interface import CLIENT_INPUTS, ENTRY_POINT, METRIC_OUTPUTS

# Request field -> input name, per client interface (the trtspec.json "interface" of a repository); a field an
# interface lacks is not sent. The entry model each interface has by default comes with it.
INTERFACES = {
    "trtspec": {
        "model": ENTRY_POINT,
        "fields": {name: name for name in CLIENT_INPUTS},
        "fixed": {},
        "batched": True,  # max_batch_size > 0: tensors are [1, 1]
        "cumulative_text": False,  # a streamed text_output is that response's piece
    },
    "llmapi": {
        "model": llmapi.MODEL_NAME,
        "fields": {
            "text_input": "text_input",
            "stream": "streaming",
            **{
                name: f"sampling_param_{name}"
                for name in ("max_tokens", "temperature", "top_k", "top_p", "seed", "return_perf_metrics")
            },
        },
        # upstream's model echoes the prompt unless told not to; trtspec compares generated text only
        "fixed": {"sampling_param_exclude_input_from_output": True},
        "batched": False,  # upstream's max_batch_size: 0: tensors are [1]
        "cumulative_text": True,  # every text_output is the text so far (CompletionOutput.text)
    },
}
_GRPC_DTYPES = {
    name: dtype.removeprefix("TYPE_").replace("STRING", "BYTES")
    for name, dtype in (CLIENT_INPUTS | llmapi.LLMAPI_INPUTS).items()
}


@dataclass
class EndpointResponse:
    """One request's answer: text pieces with their arrival times (seconds after sending) and the metrics."""

    pieces: list[tuple[float, str]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # (arrival, token ids) per response that carried the entry model's output_ids; None: the server sends none.
    id_pieces: list[tuple[float, list[int]]] | None = None

    def add_ids(self, arrival: float, ids) -> None:
        """Record one response's ids: a numpy array (gRPC), a JSON list, or a bare number (HTTP, one token)."""
        import numpy as np

        if ids is None:
            return
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if self.id_pieces is None:
            self.id_pieces = []
        if ids:
            self.id_pieces.append((arrival, ids))

    def add_metric(self, name: str, value) -> None:
        """Record one metric output: a number (numpy's or JSON's), or its text. Upstream's LLM-API model sends
        them in text_output's dtype whatever its config.pbtxt declares (tensorrt_llm/1/model.py
        _create_response), so a gRPC client reads bytes and an HTTP one a string; text that is no number is left
        out."""
        if isinstance(value, bytes | str):
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    return
        self.metrics[name] = value.item() if hasattr(value, "item") else value

    def add_text(self, arrival: float, text: str, cumulative: bool = False) -> None:
        """Record one response's text_output: a piece, or (``cumulative``) the whole text so far, of which the
        piece is what it adds. Should the text so far rewrite its end (a detokeniser that replaced a partial
        character), the pieces are cut back to what the two share, so ``text`` is always the latest. A response
        without text (an empty final response) adds nothing."""
        if not text:
            return
        if cumulative:
            before = self.text
            shared = len(os.path.commonprefix([before, text]))
            if shared < len(before):
                self._cut_text(shared)
            text = text[shared:]
        if text:
            self.pieces.append((arrival, text))

    def _cut_text(self, length: int) -> None:
        kept, total = [], 0
        for arrival, piece in self.pieces:
            if total + len(piece) > length:
                piece = piece[: length - total]
            if piece:
                kept.append((arrival, piece))
            total += len(piece)
        self.pieces = kept

    @property
    def token_ids(self) -> list[int] | None:
        return None if self.id_pieces is None else [i for _, ids in self.id_pieces for i in ids]

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.pieces)


def split_url(url: str, protocol: str = "auto") -> tuple[str, str]:
    """``http://h:p`` -> ("http", "h:p"); ``grpc://h:p`` or ``h:p`` -> ("grpc", "h:p") unless ``protocol`` says.
    RequestError for anything else: another scheme (https: the clients here speak plain HTTP), no port, or a port
    Triton cannot listen on (tritonclient would wrap it)."""
    scheme, _, address = url.rpartition("://")
    address = address.rstrip("/")
    if scheme not in ("", "grpc", "http"):
        raise RequestError(f"--url {url!r}: scheme {scheme!r} is not http or grpc (Triton's plain endpoints)")
    if protocol == "auto":
        protocol = "http" if scheme == "http" else "grpc"
    if protocol not in ("grpc", "http"):
        raise RequestError(f"protocol {protocol!r} is not grpc or http")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise RequestError(
            f"--url {url!r} is not HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:8001 for gRPC, "
            "http://127.0.0.1:8000)"
        )
    return protocol, address


def request_fields(
    text: str,
    max_tokens: int,
    num_draft_tokens: int | None,
    stream: bool,
    interface: str = "trtspec",
    **sampling,
) -> dict:
    """The inputs of one request in ``interface``'s names (None values and fields the interface lacks are left
    out: the server's defaults apply)."""
    names = INTERFACES[interface]["fields"]
    fields = {
        "text_input": text,
        "max_tokens": max_tokens,
        "num_draft_tokens": num_draft_tokens,
        "stream": stream,
        "return_perf_metrics": True,
        **sampling,
    }
    unknown = sorted(set(fields) - set(CLIENT_INPUTS))
    if unknown:
        raise RequestError(f"unknown request field {unknown[0]!r}; use one of {', '.join(CLIENT_INPUTS)}")
    mapped = {names[k]: v for k, v in fields.items() if v is not None and k in names}
    return mapped | INTERFACES[interface]["fixed"]


@dataclass(frozen=True)
class ServedConfig:
    """What a server's model configs say about its entry model; None: not known (a server that hides its
    configs, or an ensemble step it would not describe)."""

    parameters: dict[str, str] | None  # config.pbtxt parameters (string values)
    decoupled: bool | None  # model_transaction_policy.decoupled: streams one response per round
    # the model whose parameters these are: the entry model, or the ensemble step that has them
    source: str | None = None


SPECULATION_PARAMETERS = frozenset({"max_draft_len", "num_draft_tokens", "proposer"})
STOP_POLL_S = 0.2  # how often a gRPC request's wait for its next response looks whether the run is stopping


def _parameters(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _decoupled(config: dict) -> bool:
    # gRPC's JSON leaves a false field out; HTTP's writes it
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


class TritonClient:
    """Requests to one model of a Triton server. ``url``: HOST:PORT (gRPC) or http://HOST:PORT.

    ``interface`` 'auto' (and no ``model``): the first of tensorrt_llm_bls and tensorrt_llm the server has,
    spoken in the interface its inputs show (``resolve``, on the first call that needs it)."""

    def __init__(
        self,
        url: str,
        protocol: str = "auto",
        model: str | None = None,
        timeout_s: float = 600.0,
        interface: str = "auto",
    ):
        if interface not in ("auto", *INTERFACES):
            raise RequestError(f"interface {interface!r} is not auto, {' or '.join(INTERFACES)}")
        self.protocol, self.address = split_url(url, protocol)
        self.url, self.timeout_s, self.interface = url, timeout_s, interface
        # One gRPC connection per calling thread, kept across requests as a serving client keeps its own (a
        # tritonclient stream serves one caller at a time): a request does not pay for connecting.
        self._connections = threading.local()
        self.model = model or (INTERFACES[interface]["model"] if interface != "auto" else None)
        # Set by ``stop``: a gRPC request waiting for its next response gives up within STOP_POLL_S (cancelled on
        # the server), so a run that stops (Ctrl-C, a failed request) does not wait for the others to finish.
        self.stopping = threading.Event()
        # The HTTP connections of requests in flight: ``stop`` shuts them, which ends a blocking read at once.
        self._http_open: set[http.client.HTTPConnection] = set()
        self._http_lock = threading.Lock()

    def stop(self) -> None:
        """Give up the requests in flight and later ones: a gRPC request within STOP_POLL_S (cancelled on the
        server), an HTTP one at once (its connection is shut, which ends its blocking read; Triton then drops
        the request's responses)."""
        self.stopping.set()
        with self._http_lock:
            open_now = list(self._http_open)
        for connection in open_now:
            with contextlib.suppress(OSError, AttributeError):
                connection.sock.shutdown(socket.SHUT_RDWR)

    def _given_up(self) -> ServerError:
        return ServerError(f"request to Triton at {self.url} given up: the run is stopping")

    def _input_names(self, model: str) -> set[str] | None:
        """The inputs of ``model`` from the server's metadata; None when it has no such model."""
        try:
            if self.protocol == "grpc":
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(self.address) as client:
                    return {i.name for i in client.get_model_metadata(model).inputs}
            url = f"http://{self.address}/v2/models/{model}"
            with urllib.request.urlopen(url, timeout=10) as response:
                return {i["name"] for i in json.loads(response.read()).get("inputs", [])}
        except Exception:  # noqa: BLE001 - unknown model, or unreachable (check_ready says which)
            return None

    def _model_config(self, model: str) -> dict | None:
        """``model``'s config as the server reports it (proto field names); None when it does not say."""
        try:
            if self.protocol == "grpc":
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(self.address) as client:
                    return client.get_model_config(model, as_json=True)["config"]
            url = f"http://{self.address}/v2/models/{model}/config"
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())
        except Exception:  # noqa: BLE001 - a server that hides its configs: nothing known
            return None

    def served_config(self) -> ServedConfig:
        """What the entry model's config says (``ServedConfig``). An ensemble (upstream's ``ensemble`` entry name)
        has no parameters of its own: they are those of the step that has them (trtspec's: tensorrt_llm_bls),
        and it streams where a step is decoupled."""
        self.resolve()
        config = self._model_config(self.model)
        if config is None:
            return ServedConfig(None, None)
        steps = [step.get("model_name") for step in config.get("ensemble_scheduling", {}).get("step", [])]
        if not steps:
            return ServedConfig(_parameters(config), _decoupled(config), self.model)
        configs = {name: self._model_config(name) for name in dict.fromkeys(steps)}
        if None in configs.values():
            return ServedConfig(None, None)
        # the step that carries speculation's parameters (upstream's preprocessing step has a tokenizer's)
        source = next(
            (name for name, step in configs.items() if SPECULATION_PARAMETERS & _parameters(step).keys()),
            None,
        )
        return ServedConfig(
            _parameters(configs[source]) if source else {},
            any(_decoupled(step) for step in configs.values()),
            source,
        )

    def resolve(self) -> None:
        """Fix the entry model and the interface (see the class docstring); ServerError when neither is served."""
        if self.model is not None and self.interface != "auto":
            return
        candidates = [self.model] if self.model else [spec["model"] for spec in INTERFACES.values()]
        for model in candidates:
            inputs = self._input_names(model)
            if inputs is not None:
                llm = INTERFACES["llmapi"]["fields"]["max_tokens"] in inputs
                self.model, self.interface = model, "llmapi" if llm else "trtspec"
                return
        self.check_ready_of(candidates[0])  # says whether the server is unreachable or lacks the model
        raise ServerError(f"Triton at {self.url} serves none of {', '.join(candidates)}; pass --model")

    def check_ready(self) -> None:
        """ServerError unless the server answers and the model is ready (one cheap call before any work)."""
        self.resolve()
        self.check_ready_of(self.model)

    def check_ready_of(self, model: str) -> None:
        try:
            if self.protocol == "grpc":
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(self.address) as client:
                    ready = client.is_model_ready(model)
            else:
                url = f"http://{self.address}/v2/models/{model}/ready"
                with urllib.request.urlopen(url, timeout=10) as response:
                    ready = response.status == 200
        except urllib.error.HTTPError:  # the server answered: the model is not there, or not ready
            ready = False
        except Exception as err:  # noqa: BLE001 - any transport failure means the same to the user
            raise ServerError(
                f"cannot reach Triton at {self.url} ({_first_line(err)}); "
                "start it with `trtspec serve REPO` or fix --url"
            ) from None
        if not ready:
            raise ServerError(
                f"Triton at {self.url} has no ready model {model!r}; pass --model or check the server log"
            )

    def generate(
        self, text: str, max_tokens: int, num_draft_tokens: int | None = None, stream: bool = True, **sampling
    ) -> EndpointResponse:
        try:
            self.resolve()
            fields = request_fields(text, max_tokens, num_draft_tokens, stream, self.interface, **sampling)
            if self.protocol == "grpc":
                return self._grpc(fields)
            return self._http(fields, stream)
        except (queue.Empty, TimeoutError):  # a gRPC stream's wait for its next response, an HTTP read
            raise ServerError(
                f"Triton at {self.url} sent nothing for {self.timeout_s:g} s; check the server's log for a stuck "
                "request"
            ) from None
        except (ConnectionError, urllib.error.URLError) as err:
            raise ServerError(
                f"cannot reach Triton at {self.url} ({getattr(err, 'reason', err)}); "
                "start it with `trtspec serve REPO` or fix --url"
            ) from None

    def _grpc(self, fields: dict) -> EndpointResponse:
        import numpy as np
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inputs = []
        batched = INTERFACES[self.interface]["batched"]
        for name, value in fields.items():
            item = value.encode() if isinstance(value, str) else value
            array = np.array(
                [[item]] if batched else [item], dtype=object if isinstance(value, str) else None
            )
            tensor = grpcclient.InferInput(name, list(array.shape), _GRPC_DTYPES[name])
            tensor.set_data_from_numpy(array.astype(_numpy_dtype(_GRPC_DTYPES[name])))
            inputs.append(tensor)
        results: queue.Queue = queue.Queue()
        out = EndpointResponse()
        client = getattr(self._connections, "client", None)
        if client is None:
            client = self._connections.client = grpcclient.InferenceServerClient(self.address)
        final = False
        try:
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            start = time.perf_counter()
            client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
            try:
                waited = 0.0
                while not final:
                    if self.stopping.is_set():
                        raise self._given_up()
                    wait = min(STOP_POLL_S, self.timeout_s - waited)
                    try:
                        item = results.get(timeout=wait)
                    except queue.Empty:
                        waited += wait
                        if waited >= self.timeout_s:
                            raise
                        continue
                    waited = 0.0
                    final = self._grpc_piece(item, out, start)
            finally:
                # Without the final response the request may still be running (a stuck server, a wait given up):
                # stop_stream's default waits for every request on the stream, so it is cancelled instead.
                client.stop_stream(cancel_requests=not final)
        except BaseException as err:
            # A failed request may leave the connection unusable: the next request opens a new one.
            self._connections.client = None
            client.close()
            if isinstance(err, InferenceServerException):
                message = err.message() if callable(getattr(err, "message", None)) else str(err)
                raise _server_error(self.url, message, refused=not (out.pieces or out.token_ids)) from None
            raise
        return out

    def _grpc_piece(self, item, out: EndpointResponse, start: float) -> bool:
        """Record one streamed response; True when it was the last one."""
        result, error = item
        if error is not None:
            raise error
        now = time.perf_counter() - start
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            piece = text.reshape(-1)[0]
            piece = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else str(piece)
            out.add_text(now, piece, INTERFACES[self.interface]["cumulative_text"])
        out.add_ids(now, result.as_numpy("output_ids"))
        for name in METRIC_OUTPUTS:
            value = result.as_numpy(name)
            if value is not None and value.size:
                out.add_metric(name, value.reshape(-1)[0])
        out.elapsed_s = now
        final = result.get_response().parameters.get("triton_final_response")
        return final is not None and final.bool_param

    def _http(self, fields: dict, stream: bool) -> EndpointResponse:
        if self.stopping.is_set():
            raise self._given_up()
        endpoint = "generate_stream" if stream else "generate"
        host, _, port = self.address.rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=self.timeout_s)
        with self._http_lock:
            self._http_open.add(connection)
        out = EndpointResponse()
        start = time.perf_counter()
        try:
            body = json.dumps(fields).encode()
            path = f"/v2/models/{self.model}/{endpoint}"
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status >= 400:
                raise _server_error(self.url, response.read().decode(errors="replace"))
            try:
                for raw in response if stream else [b"data: " + response.read()]:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        self._http_event(json.loads(line[5:]), out, time.perf_counter() - start)
            except (http.client.HTTPException, ConnectionError) as err:
                if self.stopping.is_set():
                    raise self._given_up() from None
                # The server went away while answering (a chunk cut short: IncompleteRead): it had begun to.
                what = f"the connection closed before the answer ended ({type(err).__name__})"
                raise _server_error(self.url, what, refused=False) from None
            if self.stopping.is_set():  # a shut connection may read as a clean end: the answer is cut short
                raise self._given_up()
        except OSError:
            if self.stopping.is_set():
                raise self._given_up() from None
            raise
        finally:
            with self._http_lock:
                self._http_open.discard(connection)
            connection.close()
        out.elapsed_s = time.perf_counter() - start
        return out

    def _http_event(self, event: dict, out: EndpointResponse, now: float) -> None:
        if "error" in event:
            raise _server_error(self.url, event["error"], refused=not (out.pieces or out.token_ids))
        if event.get("text_output"):
            out.add_text(now, event["text_output"], INTERFACES[self.interface]["cumulative_text"])
        out.add_ids(now, event.get("output_ids"))
        for name in METRIC_OUTPUTS:
            if name in event:
                out.add_metric(name, event[name])


def _first_line(err: BaseException) -> str:
    text = str(err.message() if callable(getattr(err, "message", None)) else err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _numpy_dtype(triton_dtype: str):
    import numpy as np

    return {"BYTES": object, "INT32": np.int32, "FP32": np.float32, "BOOL": bool, "UINT64": np.uint64}[
        triton_dtype
    ]


def _server_error(where: str, message: str, refused: bool = True) -> ServerError:
    """One line of a server's error: a request it refused, or one that failed after part of its answer."""
    body = message.strip().removeprefix("data:") if isinstance(message, str) else message
    # HTTP errors arrive as {"error": "..."}, streamed or not
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(body).get("error", message)
    what = "refused the request" if refused else "failed the request after part of its answer"
    return ServerError(f"Triton at {where} {what}: {str(message).strip().splitlines()[0]}")
