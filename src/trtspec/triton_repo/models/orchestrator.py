"""Triton python model `tensorrt_llm_bls`: the speculative orchestrator and the client-facing entry point.

Per request: prompt -> ids, the one generation loop (engines/loop.py, one loop per request on the request's own
thread) whose rounds are a draft call (K tokens) and one target verification through the engine models'
TensorRT-LLM tensor interface (decode.EngineRounds), ids -> text. Beyond upstream's BLS: decoupled streaming of
each verified round, concurrent requests (one thread each, bounded), per-request num_draft_tokens (adaptive K for
requests without one where the repository's default is "adaptive"), sampling, stop words and return_perf_metrics.

Speed: a round costs two BLS calls (draft, target) and nothing else. With draft_ahead (the default), a request
served alone also drafts the next round while the target verifies this one (decode.EngineRounds): when the target
accepts the whole draft and the draft guessed its bonus token, the next round skips its draft call. Under
concurrent requests the other requests keep the engines busy, so draft-ahead is off and nothing is drafted twice.
A streamed round's response is sent by a thread of its own (Outbox), so the next round's calls do not wait
for it. Text goes through the same TextCodec as the preprocessing and postprocessing models, in-process (no
BLS hop per request or per streamed round), and a request's first token comes from the target's prefill alone
(the loop's first_token_alone), streamed or not, so that a seeded sampled request gives the same text either way.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

import numpy as np

from trtspec.builders.support import draft_input_ids
from trtspec.core.errors import RequestError
from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts
from trtspec.engines.adaptive import KPolicy
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.models import triton_io as io
from trtspec.triton_repo.models.decode import EngineRounds, speculate
from trtspec.triton_repo.models.request import (
    GenerationRequest,
    Limits,
    k_policy_from_parameters,
    parse_request,
    to_job,
)
from trtspec.triton_repo.models.text import TextCodec
from trtspec.triton_repo.models.triton_io import CANCEL_POLL_S, cancel_check  # noqa: F401 - used and re-exported

_SEED_MASK = (1 << 63) - 1
_DRAFT_SEED_SALT = 0x1E3779B97F4A7C15


class EngineClient:
    """The draft and target engine models behind upstream's tensor interface (either runtime)."""

    def __init__(
        self,
        target: str,
        draft: str,
        req: GenerationRequest,
        end_id: int,
        pad_id: int,
        vocab_rows: dict[str, int] | None = None,
    ):
        self.target, self.draft, self.req = target, draft, req
        self.end_id, self.pad_id = end_id, pad_id
        # Each engine's logit rows: a padded-vocabulary pair's draft logits are padded to the target's, and ids
        # the draft lacks are mapped for it (builders.support.draft_input_ids).
        self.vocab_rows = vocab_rows or {}

    def _common(self, tokens: list[int], output_len: int, round_index: int, salt: int = 0) -> dict:
        s = self.req.params
        inputs = {
            "input_ids": np.array([tokens], dtype=np.int32),
            "input_lengths": np.array([[len(tokens)]], dtype=np.int32),
            "request_output_len": np.array([[output_len]], dtype=np.int32),
            "end_id": np.array([[self.end_id]], dtype=np.int32),
            "pad_id": np.array([[self.pad_id]], dtype=np.int32),
            "streaming": np.array([[False]]),
        }
        if s.greedy:  # top_k = 1 is TensorRT-LLM's argmax; a temperature of 0 it would divide by (0 + 1e-6)
            inputs["runtime_top_k"] = np.array([[1]], dtype=np.int32)
        else:
            inputs["temperature"] = np.array([[s.temperature]], dtype=np.float32)
            inputs["runtime_top_k"] = np.array([[s.top_k]], dtype=np.int32)
            inputs["runtime_top_p"] = np.array([[s.top_p]], dtype=np.float32)
        if s.seed is not None:  # a distinct seed per round and per model, reproducible per request
            inputs["seed"] = np.array([[((s.seed + round_index) ^ salt) & _SEED_MASK]], dtype=np.uint64)
        return inputs

    @staticmethod
    def _new_tokens(out: dict, prompt_len: int) -> list[int]:
        ids = np.asarray(out["output_ids"]).reshape(-1)
        length = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
        return ids[prompt_len:length].tolist()

    def draft_fn(self, tokens: list[int], k: int, round_index: int):
        # The draft's seed differs from the target's in the same round: with one seed both engines would draw the
        # same random numbers, and the target's acceptance test would be correlated with the draft's sample.
        if "draft" in self.vocab_rows:
            tokens = draft_input_ids(tokens, self.vocab_rows["draft"])
        inputs = self._common(tokens, k, round_index, salt=_DRAFT_SEED_SALT)
        want_logits = self.req.use_draft_logits
        inputs["return_generation_logits"] = np.array([[want_logits]])
        outputs = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
        out = io.bls(self.draft, inputs, outputs)
        logits = None
        if want_logits and out.get("generation_logits") is not None:
            logits = np.asarray(out["generation_logits"], dtype=np.float32).reshape(
                -1, *out["generation_logits"].shape[-1:]
            )
        return self._new_tokens(out, len(tokens)), logits

    def target_fn(self, tokens: list[int], draft_tokens: list[int], draft_logits, round_index: int):
        inputs = self._common(tokens, len(draft_tokens) + 1, round_index)
        if draft_tokens:
            inputs["draft_input_ids"] = np.array([draft_tokens], dtype=np.int32)
            if draft_logits is not None:
                logits = np.asarray(draft_logits, dtype=np.float32)[None, : len(draft_tokens)]
                inputs["draft_logits"] = to_rows(logits, self.vocab_rows.get("target"))
        out = io.bls(self.target, inputs, ["output_ids", "sequence_length"])
        return self._new_tokens(out, len(tokens))


def to_rows(logits: np.ndarray, rows: int | None) -> np.ndarray:
    """[..., V_draft] draft logits -> [..., rows], padded with -inf: TensorRT-LLM copies draft logits into a
    buffer of the target's rows and softmaxes them, so a padded-vocabulary draft's missing rows become probability
    0 (builders.support.vocab_pair_problem)."""
    extra = 0 if rows is None else rows - logits.shape[-1]
    if extra <= 0:
        return logits
    return np.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, extra)], constant_values=-np.inf)


class Outbox:
    """A streamed request's responses, sent in order by a thread of their own so that the next round's engine
    calls do not wait for the send; that thread also asks whether the client cancelled. Leaving the ``with``
    block waits until everything put is sent (the final response goes after it) and raises a failed send."""

    def __init__(self, sender):
        self.sender = sender
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="send")
        self.cancelled = False
        self.error: BaseException | None = None

    def _send(self, response) -> None:
        if self.error is not None or self.cancelled:
            return
        try:
            self.sender.send(response)
            self.cancelled = self.cancelled or getattr(self.sender, "is_cancelled", lambda: False)()
        except BaseException as err:  # noqa: BLE001 - raised in the request's thread by put / __exit__
            self.error = err

    def put(self, response) -> None:
        if self.error is not None:
            raise self.error
        self.pool.submit(self._send, response)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(wait=True)
        if self.error is not None and exc[0] is None:
            raise self.error


class TritonPythonModel:
    """What Triton loads: an Orchestrator built from the model's parameters."""

    def initialize(self, args):
        self.orchestrator = Orchestrator.from_args(args)

    def execute(self, requests):
        return self.orchestrator.execute(requests)

    def finalize(self):
        self.orchestrator.finalize()


class Orchestrator:
    """The entry model's request handling. ``target``/``draft``: the engine models' names; ``vocab_rows``: their
    logits' rows by role (draft logits are padded to the target's); ``metrics``: where finished requests' counts
    go (triton_io.SpecDecodeMetrics); ``max_concurrency``: requests generated at once (decoupled)."""

    def __init__(
        self,
        *,
        limits: Limits,
        codec: TextCodec,
        target: str,
        draft: str,
        vocab_rows: dict[str, int],
        metrics,
        k_policy: KPolicy,
        draft_ahead: bool = False,
        max_concurrency: int = 8,
        decoupled: bool = True,
    ):
        self.limits, self.codec, self.target, self.draft = limits, codec, target, draft
        self.vocab_rows, self.metrics, self.k_policy = vocab_rows, metrics, k_policy
        self.draft_ahead, self.decoupled = draft_ahead, decoupled
        self.slots = threading.BoundedSemaphore(max_concurrency)
        self.threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        self.active = 0  # requests being generated
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="draft-ahead")

    @classmethod
    def from_args(cls, args: dict) -> Orchestrator:
        """From Triton's ``initialize`` args: the rendered parameters and the model config."""
        import json

        params = io.model_parameters(args)
        limits = Limits.from_parameters(params)
        return cls(
            limits=limits,
            codec=TextCodec.from_parameters(params),
            target=params["tensorrt_llm_model_name"],
            draft=params["tensorrt_llm_draft_model_name"],
            vocab_rows={role: int(params[f"{role}_vocab_rows"]) for role in ("target", "draft")},
            metrics=io.SpecDecodeMetrics(args["model_name"], limits.max_draft_len),
            k_policy=k_policy_from_parameters(params),
            draft_ahead=params.get("draft_ahead", "False").lower() == "true",
            max_concurrency=int(params.get("max_concurrency") or 8),
            decoupled=io.pb().using_decoupled_model_transaction_policy(json.loads(args["model_config"])),
        )

    # ------------------------------------------------------------------ request handling

    def execute(self, requests):
        if not self.decoupled:
            return [self._respond_once(r) for r in requests]
        for request in requests:
            thread = threading.Thread(target=self._serve_decoupled, args=(request,), daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
        return None

    def finalize(self):
        for thread in list(self.threads):
            thread.join(timeout=10)
        self.pool.shutdown(wait=False)

    @contextmanager
    def _counted(self):
        with self.lock:
            self.active += 1
        try:
            yield
        finally:
            with self.lock:
                self.active -= 1

    def _alone(self) -> bool:
        """Draft ahead for this round: on, and no other request is being generated."""
        return self.draft_ahead and self.active == 1

    def _together(self, verify, draft_ahead):
        """(verify(), draft_ahead()) with draft_ahead() on a pool thread (BLS calls release the GIL); both are
        finished before this returns or raises. The guess is optional: a failed draft-ahead call is logged and
        answered as a miss ([], None), not as a failed request."""
        future = self.pool.submit(draft_ahead)
        try:
            result = verify()
        except BaseException:
            wait([future])
            raise
        try:
            return result, future.result()
        except io.BlsError as err:
            io.log_warning(f"draft-ahead call failed; the next round drafts as usual: {err}")
            return result, ([], None)

    def _respond_once(self, request):
        try:
            req = parse_request(io.read_inputs(request, names.CLIENT_INPUTS), self.limits)
            if req.stream:
                raise RequestError(
                    "stream=true needs a decoupled orchestrator; deploy with triton.decoupled: true"
                )
            with self._counted():
                text, ids, stats = self._whole(req, cancel_check(request))
            return self._response(text, ids, stats, req.return_perf_metrics)
        except RequestError as err:
            return io.error_response(err.message)
        except io.BlsError as err:  # an engine's failure, not the client's: INTERNAL
            return io.error_response(str(err), False)

    def _serve_decoupled(self, request):
        final = io.pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        try:
            with self.slots, self._counted():
                req = parse_request(io.read_inputs(request, names.CLIENT_INPUTS), self.limits)
                self._stream(req, sender, final)
        except RequestError as err:
            sender.send(io.error_response(err.message), flags=final)
        except io.BlsError as err:  # an engine's failure, not the client's: INTERNAL
            sender.send(io.error_response(str(err), False), flags=final)
        except Exception as err:  # noqa: BLE001 - the client gets one line; the server log keeps the rest
            sender.send(io.error_response(f"internal error: {type(err).__name__}: {err}", False), flags=final)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _stream(self, req: GenerationRequest, sender, final_flag) -> None:
        if not req.stream:  # a cancelled one stops within CANCEL_POLL_S and frees its slot
            text, ids, stats = self._whole(req, cancel_check(sender))
            sender.send(self._response(text, ids, stats, req.return_perf_metrics), flags=final_flag)
            return
        stats, pending = None, []  # ids of rounds whose text is held back (an unfinished character)
        with Outbox(sender) as outbox:
            for piece, ids, stats, _ in self._generate(req, incremental=True):
                pending += ids
                if piece:
                    outbox.put(self._response(piece, pending, stats, req.return_perf_metrics))
                    pending = []
                if outbox.cancelled:
                    break
        sender.send(self._response("", pending, stats, req.return_perf_metrics), flags=final_flag)

    def _whole(
        self, req: GenerationRequest, cancelled=lambda: False
    ) -> tuple[str, list[int], AcceptanceStats]:
        """The complete answer of a non-streaming request: (text, generated ids, stats); what was generated when
        ``cancelled()`` turned true, if it did."""
        ((text, ids, stats, _),) = self._generate(req, incremental=False, cancelled=cancelled)
        return text, ids, stats

    def _response(self, text: str, ids: list[int], stats: AcceptanceStats | None, with_metrics: bool):
        return io.text_response(text, ids, stats, with_metrics)

    # ------------------------------------------------------------------ generation

    def _engine_ids(self, req: GenerationRequest) -> tuple[int, int]:
        """(end_id, pad_id) the engine models get: the request's own, else the repository's."""
        end_id = self.codec.end_id if req.end_id is None else req.end_id
        pad_id = self.codec.pad_id if req.pad_id is None else req.pad_id
        return end_id, pad_id

    def _generate(self, req: GenerationRequest, incremental: bool, cancelled=lambda: False):
        """Yield (text piece, the round's token ids, stats so far, finished) per verified round; not incremental:
        one (text, all ids, stats, True) at the end (early if ``cancelled()``)."""
        prompt, params, options = to_job(req, self.codec, self.limits)
        engines = EngineClient(self.target, self.draft, req, *self._engine_ids(req), self.vocab_rows)
        rounds = EngineRounds(
            engines.draft_fn,
            engines.target_fn,
            max_draft_len=self.limits.max_draft_len,
            max_seq_len=self.limits.max_seq_len,
            # A seeded sampled request must give the same text whatever else the server is doing: no draft-ahead.
            draft_ahead=None if req.params.seeded else self._alone,
            together=self._together,
        )
        events = speculate(
            prompt,
            params,
            rounds,
            first_token_alone=True,
            k_policy=self.k_policy,
            cancelled=(lambda: False) if incremental else cancelled,
            **options,
        )
        stats, generated, text = None, [], self.codec.stream_decoder()
        try:
            for event in events:
                stats = event.stats
                generated += event.new_tokens
                if incremental and (event.new_tokens or event.finished):
                    piece = text.push(event.new_tokens, event.finished)
                    yield piece, list(event.new_tokens), stats, event.finished
        finally:  # finished, cancelled or failed: the rounds that ran are counted
            if stats is not None:
                self.metrics.add(SpecDecodeCounts.of(stats))
        if not incremental:
            yield self.codec.decode(generated), generated, stats, True
