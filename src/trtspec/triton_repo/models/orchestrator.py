"""Triton python model `tensorrt_llm_bls`: the speculative orchestrator and the client-facing entry point.

Per request: prompt -> ids, the one generation loop (engines/loop.py, one loop per request on the request's own
thread) whose rounds are a draft call (K tokens) and one target verification through the engine models'
TensorRT-LLM tensor interface (engines/engine_calls.py's one round over ``BlsCalls``), ids -> text. Beyond
upstream's BLS: decoupled streaming of each verified round, concurrent requests (one thread each, bounded; not
decoupled, an execute's whole batch at once), per-request num_draft_tokens (adaptive K for requests without one
where the repository's default is "adaptive"), sampling, stop words and return_perf_metrics.

Speed: a round costs two BLS calls (draft, target) and nothing else. With draft_ahead (the default), a request
served alone also drafts the next round while the target verifies this one (engine_calls.py): when the target
accepts the whole draft and the draft guessed its bonus token, the next round skips its draft call. Under
concurrent requests the other requests keep the engines busy, so draft-ahead is off and nothing is drafted twice.
A streamed round's response is sent by a thread of its own (Outbox), so the next round's calls do not wait
for it. Text goes through the repository's TextCodec in-process (no BLS hop per request or per streamed round),
and a request's first token comes from the target's prefill alone
(the loop's first_token_alone), streamed or not, so that a seeded sampled request gives the same text either way.

Proposers (core/lookup.py): the loop proposes by prompt lookup for the repository's ``proposer`` (ngram,
draft+ngram) or a request's own, and a looked-up proposal goes to the target without a draft call. A repository
deployed without a draft (prompt lookup alone) names no draft engine model: its rounds have no draft
(EngineCallRounds has_draft False), and a request that asks for the draft model is refused.

A draft with its own tokenizer (the repository's draft_tokenizer_dir, core/translate.py): the draft engine is
called in its own token ids, with its own end id, and its continuation reaches the target as target tokens
(EngineCallRounds' translator); such a draft never drafts ahead.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import closing, contextmanager, nullcontext

import numpy as np

from trtspec.core.errors import RequestError
from trtspec.core.lookup import LookupSpec, uses_lookup
from trtspec.core.metrics import AcceptanceStats, SpecDecodeCounts
from trtspec.engines.adaptive import AdaptiveState, KPolicy
from trtspec.engines.engine_calls import Call, Draft, EngineCallRounds
from trtspec.engines.loop import GenerationLoop
from trtspec.triton_repo.interface import parameter_flag
from trtspec.triton_repo.models import triton_io as io
from trtspec.triton_repo.models.request import (
    GenerationRequest,
    Limits,
    check_stream,
    k_policy_from_parameters,
    lookup_from_parameters,
    to_job,
    whole_answer,
)
from trtspec.triton_repo.models.text import TextCodec, to_word_list, translator_from_parameters
from trtspec.triton_repo.models.triton_io import CANCEL_POLL_S, cancel_check  # noqa: F401 - used and re-exported


class BlsCalls:
    """engine_calls.EngineCalls over the engine models' TensorRT-LLM tensor interface (one BLS request per
    sequence; either runtime's engine models). ``vocab_rows``: each engine's logit rows by role (a
    padded-vocabulary pair's draft logits are padded to the target's, and ids the draft lacks are mapped for it).
    ``draft`` None: no draft engine model (prompt lookup alone), and ``propose`` is never called."""

    def __init__(self, target: str, draft: str | None, vocab_rows: dict[str, int]):
        self.target, self.draft = target, draft
        self.draft_vocab = vocab_rows.get("draft", 0)
        self.target_logit_rows = vocab_rows.get("target", 0)

    @staticmethod
    def _inputs(tokens: list[int], output_len: int, call: Call) -> dict:
        inputs = {
            "input_ids": np.array([tokens], dtype=np.int32),
            "input_lengths": np.array([[len(tokens)]], dtype=np.int32),
            "request_output_len": np.array([[output_len]], dtype=np.int32),
            "end_id": np.array([[call.stops.end_id]], dtype=np.int32),
            "pad_id": np.array([[call.stops.pad_id]], dtype=np.int32),
            "streaming": np.array([[False]]),
        }
        if call.stops.stop_words:
            inputs["stop_words_list"] = to_word_list(call.stops.stop_words)[None]
        if (
            call.greedy
        ):  # top_k = 1 is TensorRT-LLM's argmax; a temperature of 0 it would divide by (0 + 1e-6)
            inputs["runtime_top_k"] = np.array([[1]], dtype=np.int32)
        else:
            inputs["temperature"] = np.array([[call.temperature]], dtype=np.float32)
            inputs["runtime_top_k"] = np.array([[call.top_k]], dtype=np.int32)
            inputs["runtime_top_p"] = np.array([[call.top_p]], dtype=np.float32)
        if call.seed is not None:
            inputs["seed"] = np.array([[call.seed]], dtype=np.uint64)
        return inputs

    @staticmethod
    def _new_tokens(out: dict, prompt_len: int) -> list[int]:
        ids = np.asarray(out["output_ids"]).reshape(-1)
        length = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
        return ids[prompt_len:length].tolist()

    def propose(
        self, prefixes: list[list[int]], num_tokens: int, call: Call, want_logits: bool
    ) -> list[Draft]:
        import torch

        drafts = []
        for tokens in prefixes:
            inputs = self._inputs(tokens, num_tokens, call)
            inputs["return_generation_logits"] = np.array([[want_logits]])
            outputs = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
            out = io.bls(self.draft, inputs, outputs)
            logits = out.get("generation_logits") if want_logits else None
            if logits is not None:  # [1, 1, k, V] -> [k, V]
                logits = torch.from_numpy(np.asarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1]))
            drafts.append(Draft(self._new_tokens(out, len(tokens)), logits))
        return drafts

    def verify(self, prefixes, drafts, draft_logits, max_new_tokens: int, call: Call) -> list[list[int]]:
        outs = []
        for b, tokens in enumerate(prefixes):
            inputs = self._inputs(tokens, max_new_tokens, call)
            if drafts is not None:
                inputs["draft_input_ids"] = np.array([drafts[b]], dtype=np.int32)
                if draft_logits is not None:
                    inputs["draft_logits"] = np.asarray(draft_logits[b], dtype=np.float32)[None]
            out = io.bls(self.target, inputs, ["output_ids", "sequence_length"])
            outs.append(self._new_tokens(out, len(tokens)))
        return outs


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
    """The entry model's request handling. ``target``/``draft``: the engine models' names (``draft`` None: none,
    prompt lookup proposes alone); ``vocab_rows``: their logits' rows by role (draft logits are padded to the
    target's); ``metrics``: where finished requests' counts go (triton_io.SpecDecodeMetrics); ``max_concurrency``:
    requests generated at once; ``proposer``/``lookup``: who proposes for requests that do not say,
    and prompt lookup's n-gram sizes; ``translator``: core.translate.Translator for a draft with its own
    tokenizer (None: one tokenizer); ``fast_logits``: draft logits go from rank to rank (the target reads a
    request's draft_logits as where to fetch them), so no request may propose by lookup, whose proposals have
    none (their point-mass logits would be read as a rank to fetch from)."""

    def __init__(
        self,
        *,
        limits: Limits,
        codec: TextCodec,
        target: str,
        draft: str | None,
        vocab_rows: dict[str, int],
        metrics,
        k_policy: KPolicy,
        draft_ahead: bool = False,
        max_concurrency: int = 8,
        decoupled: bool = True,
        proposer: str = "draft",
        lookup: LookupSpec = LookupSpec(),
        translator=None,
        fast_logits: bool = False,
    ):
        self.limits, self.codec, self.target, self.draft = limits, codec, target, draft
        self.proposer, self.lookup, self.fast_logits = proposer, lookup, fast_logits
        self.translator = translator
        self.vocab_rows, self.metrics, self.k_policy = vocab_rows, metrics, k_policy
        self.draft_ahead, self.decoupled = draft_ahead, decoupled
        self.slots = threading.BoundedSemaphore(max_concurrency)
        self.threads: set[threading.Thread] = set()
        self.lock = threading.Lock()
        self.active = 0  # requests being generated
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="draft-ahead")
        # Not decoupled: the requests of one execute generate at once, as decoupled ones do, at most max_concurrency
        # (the pool's size; a batch is at most max_batch_size requests, which is what max_concurrency is rendered from).
        # A pool of its own: a request waiting on a draft-ahead future must not hold that pool's thread.
        self.batch_pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="request")

    @classmethod
    def from_args(cls, args: dict) -> Orchestrator:
        """From Triton's ``initialize`` args: the rendered parameters and the model config."""
        import json

        params = io.model_parameters(args)
        limits = Limits.from_parameters(params)
        proposer, lookup = lookup_from_parameters(params)
        codec = TextCodec.from_parameters(params)
        return cls(
            limits=limits,
            codec=codec,
            target=params["tensorrt_llm_model_name"],
            draft=params["tensorrt_llm_draft_model_name"] or None,  # "": prompt lookup alone
            vocab_rows={role: int(params.get(f"{role}_vocab_rows") or 0) for role in ("target", "draft")},
            metrics=io.SpecDecodeMetrics(args["model_name"], limits.max_draft_len),
            k_policy=k_policy_from_parameters(params),
            draft_ahead=parameter_flag(params, "draft_ahead"),
            max_concurrency=int(params.get("max_concurrency") or 8),
            decoupled=io.pb().using_decoupled_model_transaction_policy(json.loads(args["model_config"])),
            proposer=proposer,
            lookup=lookup,
            translator=translator_from_parameters(params, codec.tokenizer),
            fast_logits=parameter_flag(params, "fast_logits"),
        )

    # ------------------------------------------------------------------ request handling

    def execute(self, requests):
        if not self.decoupled:
            return list(self.batch_pool.map(self._respond_once, requests))
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
        self.batch_pool.shutdown(wait=False)

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
        answered as a miss (no draft), not as a failed request."""
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
            return result, []

    def _respond_once(self, request):
        try:
            req = io.read_client_request(request, self.limits)
            check_stream(req, self.decoupled)
            text, ids, stats = self._whole(req, cancel_check(request))
            return self._response(text, ids, stats, req.return_perf_metrics)
        except RequestError as err:
            return io.refusal_response(err, self.metrics)
        except io.BlsError as err:  # an engine's failure, not the client's: INTERNAL
            return io.engine_error_response(err)
        except Exception as err:  # noqa: BLE001 - this request fails alone; the batch's others go on
            return io.internal_error_response(err)

    def _serve_decoupled(self, request):
        final = io.pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        try:
            req = io.read_client_request(request, self.limits)
            self._stream(req, sender, final)
        except RequestError as err:
            sender.send(io.refusal_response(err, self.metrics), flags=final)
        except io.BlsError as err:  # an engine's failure, not the client's: INTERNAL
            sender.send(io.engine_error_response(err), flags=final)
        except Exception as err:  # noqa: BLE001 - the client gets one line; the server log keeps the rest
            sender.send(io.internal_error_response(err), flags=final)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _stream(self, req: GenerationRequest, sender, final_flag) -> None:
        if not req.stream:  # a cancelled one stops within CANCEL_POLL_S and frees its slot
            text, ids, stats = self._whole(req, cancel_check(sender), self.slots)
            sender.send(self._response(text, ids, stats, req.return_perf_metrics), flags=final_flag)
            return
        stats, pending = None, []  # ids of rounds whose text is held back (an unfinished character)
        # closed on leaving, however it is left, so the request's slot is freed then
        rounds = closing(
            self._generate(req, incremental=True, cancelled=cancel_check(sender), slot=self.slots)
        )
        with Outbox(sender) as outbox, rounds as generated:
            for piece, ids, stats, _ in generated:
                pending += ids
                if piece:
                    outbox.put(self._response(piece, pending, stats, req.return_perf_metrics))
                    pending = []
                if outbox.cancelled:
                    break
        sender.send(self._response("", pending, stats, req.return_perf_metrics), flags=final_flag)

    def _whole(
        self, req: GenerationRequest, cancelled=lambda: False, slot: threading.Semaphore | None = None
    ) -> tuple[str, list[int], AcceptanceStats]:
        """The complete answer of a non-streaming request: (text, ids, stats), the prompt's first where the request
        asks (request.whole_answer); what was generated when ``cancelled()`` turned true, if it did."""
        ((text, ids, stats, _),) = self._generate(req, incremental=False, cancelled=cancelled, slot=slot)
        return text, ids, stats

    def _response(self, text: str, ids: list[int], stats: AcceptanceStats | None, with_metrics: bool):
        return io.text_response(text, ids, stats, with_metrics)

    # ------------------------------------------------------------------ generation

    def _rounds(self, req: GenerationRequest) -> EngineCallRounds:
        """One request's rounds through the engine models (one slot: each request runs its own loop)."""
        return EngineCallRounds(
            BlsCalls(self.target, self.draft, self.vocab_rows),
            max_draft_len=self.limits.max_draft_len,
            num_slots=1,
            max_seq_len=self.limits.max_seq_len,
            use_draft_logits=req.use_draft_logits,
            tokenizer_eos=self.codec.eos_id,
            pad_id=self.codec.pad_id if req.pad_id is None else req.pad_id,
            target_only_in_one_call=False,  # a pinned target-only request streams token by token
            # A seeded sampled request must give the same text whatever else the server is doing: no draft-ahead.
            draft_ahead=None if req.params.seeded or self.draft is None else self._alone,
            together=self._together,
            has_draft=self.draft is not None,
            translator=self.translator,
        )

    def _generate(
        self,
        req: GenerationRequest,
        incremental: bool,
        cancelled=lambda: False,
        slot: threading.Semaphore | None = None,
    ):
        """Yield (text piece, the round's token ids, stats so far, finished) per verified round; not incremental:
        one (whole_answer's text and ids, stats, True) at the end (early if ``cancelled()``). ``slot`` is held
        while the request generates (the decoupled model's limit on requests at once): one the loop refuses is
        answered without waiting for it, and one whose client cancels while it waits never takes it (it ends
        "cancelled", with nothing generated). A streamed request's ``cancelled`` is asked only while it waits:
        once it runs, _stream notices a cancellation when it sends."""
        prompt, params, options = to_job(req, self.codec, self.limits)
        proposer = params.proposer or self.proposer
        if self.fast_logits and uses_lookup(proposer):
            raise RequestError(
                f"proposer {proposer} cannot run where draft logits go from rank to rank (triton.fast_logits): "
                "looked-up proposals have no draft logits; send proposer draft"
            )
        rounds = self._rounds(req)
        # The loop lives for this one request: it prices K by the policy's ratios (measure=False), as it would
        # measure too few rounds to price K, and a unit round would only slow the request.
        adaptive = AdaptiveState(self.k_policy, measure=False)
        loop = GenerationLoop(
            rounds,
            max_seq_len=rounds.max_seq_len,
            first_token_alone=True,
            k_policy=self.k_policy,
            adaptive=adaptive,
            proposer=self.proposer,
            lookup=self.lookup,
        )
        loop.add(0, prompt, params, **options)
        events = _events(loop, (lambda: False) if incremental else cancelled)
        stats, generated, text = None, [], self.codec.stream_decoder()
        reason = None  # the loop's finish reason; none: a failed engine call ended the request
        taken = False
        try:
            taken = take_slot(slot, cancelled)
            if not taken:
                reason, events = "cancelled", ()
            # active while generating: a request cancelled as it waited never was
            with self._counted() if taken else nullcontext():
                for event in events:
                    stats = event.stats
                    generated += event.new_tokens
                    if event.result is not None:
                        reason = event.result.finish_reason
                    if incremental and (event.new_tokens or event.finished):
                        piece = text.push(event.new_tokens, event.finished)
                        yield piece, list(event.new_tokens), stats, event.finished
        except GeneratorExit:  # a streamed request whose client cancelled (_stream stops reading)
            reason = reason or "cancelled"
            raise
        finally:  # finished, cancelled or failed: the request and the rounds that ran are counted
            if taken and slot is not None:
                slot.release()
            counts = SpecDecodeCounts.of(stats) if stats is not None else SpecDecodeCounts()
            self.metrics.add(counts, reason or "error", stats.by_proposer if stats is not None else None)
        if not incremental:
            yield *whole_answer(req, prompt, self.codec.decode(generated), generated), stats, True


def take_slot(slot: threading.Semaphore | None, cancelled) -> bool:
    """Wait for ``slot`` (None: no limit), asking ``cancelled()`` every CANCEL_POLL_S; False, holding nothing, when
    the client cancelled first."""
    if slot is None:
        return True
    while not slot.acquire(timeout=CANCEL_POLL_S):
        if cancelled():
            return False
    return True


def _events(loop: GenerationLoop, cancelled):
    """One request's loop stepped to the end, one event per round; ``cancelled()`` is asked after each round."""
    while loop.busy:
        yield from loop.step()
        if loop.busy and cancelled():
            loop.cancel(0)
