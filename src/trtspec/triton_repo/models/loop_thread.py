"""The torch runtime's generation loop on a thread of its own (the entry model, inflight.py, feeds it requests)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import torch

from trtspec.engines.loop import GenerationLoop, RowEvent
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo.models.cores import pin
from trtspec.triton_repo.models.triton_io import internal_error

Sink = Callable[[RowEvent], None]


class LoopThread:
    """A GenerationLoop stepped by a thread of its own while it has work; each request's events go to its sink
    (called on that thread, in order; the last one is finished), then ``on_step`` runs once for the step (a
    consumer that batches a step's work hands it on there). ``torch_threads`` sets the thread's intra-op threads
    (torch keeps that setting per thread); ``cores`` pins the thread (and the intra-op threads it starts) to
    those cores."""

    def __init__(
        self,
        loop: GenerationLoop,
        torch_threads: int | None = None,
        on_error: Callable[[str], None] | None = None,
        on_step: Callable[[], None] | None = None,
        cores: set[int] | None = None,
    ):
        self.loop, self.torch_threads, self.on_error = loop, torch_threads, on_error
        self.on_step, self.cores = on_step, cores
        self.sinks: dict[Hashable, Sink] = {}
        self.wake = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="generation-loop", daemon=True)
        self.thread.start()

    def submit(
        self, request_id: Hashable, prompt: list[int], params: SamplingParams, sink: Sink, **options
    ) -> None:
        """Queue a request (GenerationLoop.add's options); RequestError now if the loop cannot take it."""
        with self.wake:
            self.sinks[request_id] = sink
            try:
                self.loop.add(request_id, prompt, params, **options)
            except BaseException:
                del self.sinks[request_id]
                raise
            self.wake.notify()

    def cancel(self, request_id: Hashable) -> None:
        self.loop.cancel(request_id)

    def stop(self, timeout_s: float = 10.0) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout_s)

    def _run(self) -> None:
        if self.cores:
            pin(self.cores, self.on_error)
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        while True:
            with self.wake:
                while not self.loop.busy and not self.stopping:
                    self.wake.wait()
                if self.stopping:
                    return
            try:
                events = self.loop.step()
            except Exception as err:  # noqa: BLE001 - every request gets the one line; the server log the rest
                message = internal_error(err)
                if self.on_error is not None:
                    self.on_error(message)
                events = self.loop.fail_all(message)
            for event in events:
                self._guarded(self._deliver, event)
            if events and self.on_step is not None:
                self._guarded(self.on_step)

    def _guarded(self, call: Callable, *args) -> None:
        """``call(*args)``; a consumer's failure is logged and the loop serves on (the other requests' events too)."""
        try:
            call(*args)
        except Exception as err:  # noqa: BLE001 - a bug in a sink or on_step, not the loop's
            if self.on_error is not None:
                self.on_error(f"internal error delivering a round: {type(err).__name__}: {err}")

    def _deliver(self, event: RowEvent) -> None:
        with self.wake:
            sink = self.sinks.pop(event.request_id) if event.finished else self.sinks.get(event.request_id)
        if sink is not None:
            sink(event)
