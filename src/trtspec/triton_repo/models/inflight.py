"""Triton python model `tensorrt_llm_bls` of the `torch` runtime: the in-process speculative engine with in-flight
batching, behind the same client interface as the orchestrator (triton_repo/interface.py).

The draft and the target run in this one process (SpeculativeEngine's KV models): no BLS call, no second process
per round; where prompt lookup proposes alone (speculative.proposer ngram, no draft) it loads the target only.
One GenerationLoop (engines/loop.py) serves every request: ``execute`` parses a request
(request.parse_request), tokenises it (TextCodec) and queues it; the loop's thread admits queued requests into
free KV slots between rounds and runs one speculative round for all active ones, so concurrent requests share
forwards. After each round the loop's thread hands the round's events to one sending thread (``Outbox``), which
sends their responses (``Reply``: text decoded incrementally, ids, metrics; built on the loop's thread or its own,
Outbox says which) and then asks Triton, for every open request, whether its client cancelled or went away: a
cancelled request leaves the batch, and frees its KV slot, before the round after the one that followed its
cancellation (docs/faults.md). A request's first token
comes from the target's prefill alone (the loop's first_token_alone), streamed or not, so a seeded sampled request
gives the same text either way; a seeded request samples with a generator of its own, so its text does not
depend on the other requests in the batch.

Not decoupled (triton.decoupled false): ``execute`` queues its requests and waits for their answers.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtspec.core.errors import RequestError
from trtspec.core.metrics import SpecDecodeCounts
from trtspec.engines.loop import RowEvent
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.models import triton_io as io
from trtspec.triton_repo.models.cores import available_cores, cpu_threads, pin, split_cores
from trtspec.triton_repo.models.loop_thread import LoopThread
from trtspec.triton_repo.models.request import (
    GenerationRequest,
    Limits,
    check_stream,
    k_policy_from_parameters,
    lookup_from_parameters,
    to_job,
    whole_answer,
)
from trtspec.triton_repo.models.text import TextCodec


class Reply:
    """One request's answer from the loop's events, as (text, ids, final) responses (pure, no Triton calls).

    Streamed: one response per round that completes text (its ids: the tokens since the last response), then an
    empty final one. Not streamed: one final response with the whole text and every id (after the ``prompt``'s
    where the request asks: request.whole_answer)."""

    def __init__(self, req: GenerationRequest, codec: TextCodec, prompt: Sequence[int]):
        self.req, self.decode, self.prompt = req, codec.decode, prompt
        self.decoder = codec.stream_decoder() if req.stream else None
        self.ids: list[int] = []  # not streamed: every id; streamed: the ids not sent yet
        # A final response went out early (an error, a failed send): the request's later events send nothing.
        self.closed = False
        # The server could not build a response: the request ends as an error, not as cancelled.
        self.failed = False

    def update(self, event: RowEvent) -> list[tuple[str, list[int], bool]]:
        self.ids += event.new_tokens
        if self.decoder is None:
            if not event.finished:
                return []
            return [(*whole_answer(self.req, self.prompt, self.decode(self.ids), self.ids), True)]
        out = []
        piece = self.decoder.push(event.new_tokens, event.finished)
        if piece:
            out.append((piece, self.ids, False))
            self.ids = []
        if event.finished:
            out.append(("", self.ids, True))
        return out


def _always() -> bool:
    return True


def build_responses(request_id: Hashable, reply: Reply, event: RowEvent, cancel: Callable) -> list[tuple]:
    """``event``'s (response, send flags) pairs (see Outbox for the thread that builds them). A response that
    cannot be built (a tokenizer failing on an id) ends that request with one line and ``cancel``s it; the loop
    and the other requests go on."""
    final = io.pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if reply.closed:
        return []
    if event.error is not None:
        reply.closed = True
        return [(io.error_response(event.error, False), final)]
    try:
        return [
            (io.text_response(text, ids, event.stats, reply.req.return_perf_metrics), final if last else 0)
            for text, ids, last in reply.update(event)
        ]
    except Exception as err:  # noqa: BLE001 - one line to that client; the server log says which request
        message = io.internal_error(err)
        io.log_warning(f"request {request_id}: {message}")
        reply.closed = reply.failed = True
        if not event.finished:
            cancel(request_id)
        return [(io.error_response(message, False), final)]


@dataclass
class _Outgoing:
    """One event of a step on its way out; ``responses`` once built (build_responses)."""

    request_id: Hashable
    sender: object
    reply: Reply
    event: RowEvent
    responses: list[tuple] | None = None

    @property
    def finish_reason(self) -> str:
        """The request's ``finish_reason`` label (core.metrics.FINISH_REASONS); its event is a finished one."""
        if self.event.error is not None or self.reply.failed:
            return "error"
        return self.event.result.finish_reason


# Adaptive K's decisions reach /metrics when a request finishes, and at most this often while requests run (a long
# request's dashboard would stand still otherwise; each update is a few IPCs).
ADAPTIVE_PUBLISH_S = 1.0


class Outbox:
    """One thread that sends every request's responses in order, so the loop's thread never waits on a send's IPC;
    after each step it asks Triton whether the client of each open request cancelled or went away
    (``watch``), and a finished request's counts go to ``metrics``, and adaptive K's decisions so far
    (``adaptive()``: an AdaptiveState.snapshot) to ``adaptive_metrics``, also every ADAPTIVE_PUBLISH_S while
    requests run (here, not on the loop's thread: each update is an IPC).

    The loop's thread ``put``s each event of a step, then ``flush``es the step. Who builds the responses
    (``build_responses``: text, tensors) is a matter of the GIL: one or two are built here, beside the loop's next
    round, where they cost the loop less than building them first; ``loop_builds_from`` or more are built on the
    loop's thread before the step is handed over, because built here they take the GIL from the loop's round in
    many slices (docs/benchmarks.md, "Through Triton", has the measurements). Sending releases the GIL for the IPC.

    Asking after every step, queued requests included, is what keeps a cancelled request to at most one round
    after the one its cancellation arrived in: the loop retires it before the round after this step's next
    (docs/faults.md). An ask is one IPC of about 20 us that releases the GIL. While steps wait to be sent, a step
    made before the last ask began needs no ask of its own, so a sending thread that falls behind asks once per
    step the loop makes, not once per step it catches up on."""

    def __init__(
        self,
        cancel: Callable[[Hashable], None],
        metrics: io.SpecDecodeMetrics | None = None,
        cores: set[int] | None = None,
        loop_builds_from: int = 3,
        adaptive: Callable[[], tuple] | None = None,
        adaptive_metrics: io.AdaptiveMetrics | None = None,
    ):
        self.cancel, self.metrics, self.cores = cancel, metrics, cores  # cores: where this thread may run
        self.adaptive, self.adaptive_metrics = adaptive, adaptive_metrics
        self.loop_builds_from = loop_builds_from
        self.queue: queue.Queue = queue.Queue()
        self.pending: list[_Outgoing] = []  # this step's events, until flush (the loop's thread only)
        # Steps handed over unbuilt and not built yet: while there are any, the loop's thread builds none, so a
        # request's responses are always built in order (its Reply decodes incrementally).
        self.unbuilt, self.lock = 0, threading.Lock()
        self.asking = threading.Lock()  # held while the sending thread asks about the watched requests
        # request id -> () -> whether its client cancelled; from submission to its finished event
        self.watched: dict[Hashable, Callable[[], bool]] = {}
        self.asked_at = self.published_at = 0.0
        self.thread = threading.Thread(target=self._run, name="send", daemon=True)
        self.thread.start()

    def watch(self, request_id: Hashable, cancelled: Callable[[], bool]) -> None:
        """Ask ``cancelled()`` after every step until the request's finished event is sent (from any thread,
        before the request reaches the loop, so that a cancelled queued request never takes a slot)."""
        with self.lock:
            self.watched[request_id] = cancelled

    def forget(self, request_id: Hashable) -> None:
        """Stop asking about a request the loop did not take; returns once no ask is under way, so that the caller
        may send its final response: that frees the response factory (python_backend), which an ask that had
        already listed the request would then reach."""
        with self.asking, self.lock:
            self.watched.pop(request_id, None)

    def _closed_early(self, request_id: Hashable) -> None:
        """A request whose final response went out before its finished event (an error, a failed send) is cancelled
        at every ask until that event, without asking Triton: its response factory is freed with the final
        response (python_backend), and is_cancelled on it would reach freed memory."""
        with self.lock:
            if request_id in self.watched:
                self.watched[request_id] = _always

    def put(self, request_id: Hashable, sender, reply: Reply, event: RowEvent) -> None:
        """Add ``event`` (for ``sender``, answered through ``reply``) to this step's."""
        self.pending.append(_Outgoing(request_id, sender, reply, event))

    def flush(self) -> None:
        """Hand this step to the sending thread; with ``loop_builds_from`` events or more, built here first."""
        if not self.pending:
            return
        step, self.pending = self.pending, []
        with self.lock:
            build_here = len(step) >= self.loop_builds_from and not self.unbuilt
            self.unbuilt += 0 if build_here else 1
        if build_here:
            self._build(step)
        self.queue.put((step, build_here, time.monotonic()))

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)

    def _build(self, step: list[_Outgoing]) -> None:
        for item in step:
            item.responses = build_responses(item.request_id, item.reply, item.event, self.cancel)

    def _run(self) -> None:
        if self.cores:
            pin(self.cores, io.log_warning)
        while (handed := self.queue.get()) is not None:
            step, built, flushed_at = handed
            if not built:
                try:
                    self._build(step)
                finally:
                    with self.lock:
                        self.unbuilt -= 1
            for item in step:
                self._send(item)
            if self.asked_at < flushed_at:  # else an ask since this step was made covers it
                self._ask_cancelled()
            if time.monotonic() - self.published_at >= ADAPTIVE_PUBLISH_S:
                self._publish_adaptive()

    def _ask_cancelled(self) -> None:
        """Cancel every open request whose client cancelled or went away. A request stays watched until its
        finished event: the loop ignores a cancel that arrives before the request itself, so it is sent again
        (is_cancelled answers from its cache once true: no IPC)."""
        self.asked_at = time.monotonic()
        with self.asking:  # forget waits for this
            with self.lock:
                watched = list(self.watched.items())
            for request_id, cancelled in watched:
                try:
                    gone = cancelled()
                except Exception as err:  # noqa: BLE001 - a request Triton cannot answer for has no client left
                    io.log_warning(
                        f"request {request_id}: is_cancelled failed ({type(err).__name__}: {err}); cancelled"
                    )
                    gone = True
                if gone:
                    self.cancel(request_id)

    def _send(self, item: _Outgoing) -> None:
        event = item.event
        if event.finished:
            self.forget(item.request_id)
            self._count(item)
        ended = False
        try:
            for response, flags in item.responses:
                item.sender.send(response, flags=flags)
                ended = ended or bool(flags)  # build_responses' flags: the final flag or none
        except Exception as err:  # noqa: BLE001 - a client gone mid-stream: stop generating for it
            message = f"sending failed ({type(err).__name__}: {err}); cancelled"
            io.log_warning(f"request {item.request_id}: {message}")
            item.reply.closed = True  # its remaining rounds build nothing
            if not ended:  # the stream still ends, with that line, where the sender can still take it
                with contextlib.suppress(Exception):
                    final = io.pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    item.sender.send(io.error_response(message, False), flags=final)
            self.cancel(item.request_id)
        if item.reply.closed and not event.finished:
            self._closed_early(item.request_id)

    def _count(self, item: _Outgoing) -> None:
        """A finished request's counts (cancelled and failed requests ran their rounds too) and finish reason."""
        if self.metrics is not None:
            stats = item.event.stats
            self.metrics.add(SpecDecodeCounts.of(stats), item.finish_reason, stats.by_proposer)
        self._publish_adaptive()

    def _publish_adaptive(self) -> None:
        if self.adaptive_metrics is not None and self.adaptive is not None:
            self.published_at = time.monotonic()
            self.adaptive_metrics.update(self.adaptive())


def torch_threads(params: dict[str, str]) -> int | None:
    """The loop's torch intra-op threads on cpu (one process runs both models, one after the other: auto = all
    the cores); None on cuda."""
    return cpu_threads(params.get("cpu_threads", "auto")) if params["device"] == "cpu" else None


def load_loop(
    params: dict[str, str],
    tokenizer,
    num_slots: int,
    on_step: Callable[[], None],
    threads: int | None,
    cores: set[int] | None = None,
) -> LoopThread:
    """The engine (its models in this process: no draft where draft_model_dir is "", prompt lookup proposing
    alone; a draft with its own tokenizer where draft_tokenizer_dir names it, text.translator_from_parameters,
    translating to ``tokenizer``, the repository's: the codec's) and its loop's thread, from the config.pbtxt
    parameters; ``on_step``, ``threads`` (torch_threads) and ``cores``: LoopThread's."""
    import torch

    from trtspec.engines.engine import SpeculativeEngine, served_max_seq_len
    from trtspec.engines.models import load_causal_lm
    from trtspec.triton_repo.models.text import translator_from_parameters

    if threads is not None:
        torch.set_num_threads(threads)
    max_draft_len = int(params["max_draft_len"])
    max_seq_len = served_max_seq_len(int(params["max_seq_len"]), max_draft_len)
    opts = {
        "device": params["device"],
        "num_slots": num_slots,
        "max_seq_len": max_seq_len,
        "trust_remote_code": names.parameter_flag(params, "trust_remote_code"),
    }
    target = load_causal_lm(params["target_model_dir"], dtype=params["target_dtype"], **opts)
    draft_dir = params.get("draft_model_dir", "")
    draft = load_causal_lm(draft_dir, dtype=params["draft_dtype"], **opts) if draft_dir else None
    translator = None
    if draft is not None and params.get("draft_tokenizer_dir"):
        translator = translator_from_parameters(params, tokenizer)
    proposer, lookup = lookup_from_parameters(params)
    engine = SpeculativeEngine(
        target,
        draft,
        max_draft_len=max_draft_len,
        max_seq_len=max_seq_len,
        k_policy=k_policy_from_parameters(params),
        proposer=proposer,
        lookup=lookup,
        translator=translator,
    )
    return LoopThread(engine.new_loop(first_token_alone=True), threads, io.log_warning, on_step, cores)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = io.model_parameters(args)
        self.limits = Limits.from_parameters(params)
        self.codec = TextCodec.from_parameters(params)
        self.decoupled = io.pb().using_decoupled_model_transaction_policy(config)
        self.metrics = io.SpecDecodeMetrics(args["model_name"], self.limits.max_draft_len)
        threads = torch_threads(params)
        loop_cores, send_cores = (threads and split_cores(available_cores(), threads)) or (None, None)
        self.outbox = Outbox(
            lambda request_id: self.loop.cancel(request_id),
            self.metrics,
            send_cores,
            adaptive=lambda: self.loop.loop.adaptive.snapshot(),
            adaptive_metrics=io.AdaptiveMetrics(args["model_name"]),
        )
        num_slots = max(int(config.get("max_batch_size") or 1), 1)
        self.loop = load_loop(params, self.codec.tokenizer, num_slots, self.outbox.flush, threads, loop_cores)
        self.ids = itertools.count()
        import trtspec  # which install the stub imported (an editable one and a checkout can differ)

        io.log_info(f"{names.ORCHESTRATOR}: trtspec from {Path(trtspec.__file__).parent}")

    def finalize(self):
        self.loop.stop()
        self.outbox.stop()

    def _submit(self, request, sender) -> GenerationRequest:
        """Parse, tokenise and queue ``request``; its responses go to ``sender``. RequestError for a bad one."""
        req = io.read_client_request(request, self.limits)
        check_stream(req, self.decoupled)
        prompt, params, options = to_job(req, self.codec, self.limits)
        request_id, reply = next(self.ids), Reply(req, self.codec, prompt)

        def sink(event: RowEvent) -> None:  # on the loop's thread
            self.outbox.put(request_id, sender, reply, event)

        # asked once per step (Outbox), so no time limit of its own
        self.outbox.watch(request_id, io.cancel_check(sender if self.decoupled else request, poll_s=0))
        try:
            self.loop.submit(request_id, prompt, params, sink, **options)
        except BaseException:
            self.outbox.forget(request_id)
            raise
        return req

    def execute(self, requests):
        if not self.decoupled:
            return self._execute_once(requests)
        final = io.pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._submit(request, sender)
            except RequestError as err:
                sender.send(io.refusal_response(err, self.metrics), flags=final)
            except Exception as err:  # noqa: BLE001 - this request fails alone; the batch's others go on
                sender.send(io.internal_error_response(err), flags=final)
        return None

    def _execute_once(self, requests):
        """Non-decoupled: queue every request of the batch (they share rounds), then wait for each answer."""
        senders = [_Collector() for _ in requests]
        for request, sender in zip(requests, senders, strict=True):
            try:
                self._submit(request, sender)
            except RequestError as err:
                sender.send(io.refusal_response(err, self.metrics))
            except Exception as err:  # noqa: BLE001 - this request fails alone; the batch's others go on
                sender.send(io.internal_error_response(err))
        return [sender.wait() for sender in senders]


class _Collector:
    """A response sender for a non-decoupled request: keeps the one final response until ``wait`` takes it."""

    def __init__(self):
        self.done = threading.Event()
        self.response = None

    def send(self, response, flags: int = 0) -> None:
        self.response = response
        self.done.set()

    def wait(self):
        self.done.wait()
        return self.response
