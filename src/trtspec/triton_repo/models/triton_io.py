"""The only module that talks to triton_python_backend_utils: tensors in and out, BLS calls, errors."""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from trtspec.core.metrics import FINISH_REASONS
from trtspec.core.model_dir import error_line
from trtspec.triton_repo.interface import CLIENT_INPUTS, PROPOSER_SOURCES
from trtspec.triton_repo.models.request import parse_request


def pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class BlsError(Exception):
    """A model called through BLS answered with an error (the message is its own text) or without an output it
    must send (the message names it)."""


def log_warning(message: str) -> None:
    """A warning in the server log (pb_utils.Logger)."""
    pb().Logger.log_warn(message)


def log_error(message: str) -> None:
    """An error in the server log (pb_utils.Logger)."""
    pb().Logger.log_error(message)


def internal_error(err: BaseException) -> str:
    """The one line a client gets for a failure that is not its request's (the log keeps the rest)."""
    return f"internal error: {type(err).__name__}: {error_line(err)}"


def engine_error_response(err: BlsError):
    """An engine model's failure as the client sees it: its first line, as INTERNAL; TensorRT-LLM's errors carry
    a file, a line and a native stack after it, which go to the server log."""
    log_error(f"an engine model failed: {err}")
    return error_response(f"engine error: {error_line(err)}", False)


def internal_error_response(err: BaseException):
    """``internal_error`` as an INTERNAL response; the server log gets the traceback."""
    import traceback

    log_error("".join(traceback.format_exception(err)).rstrip())
    return error_response(internal_error(err), False)


def log_info(message: str) -> None:
    """An info line in the server log (pb_utils.Logger)."""
    pb().Logger.log_info(message)


def model_parameters(args: dict) -> dict[str, str]:
    """The string parameters of this model's config.pbtxt (initialize's args['model_config'])."""
    config = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def read_inputs(request, names) -> dict[str, np.ndarray | None]:
    out = {}
    for name in names:
        tensor = pb().get_input_tensor_by_name(request, name)
        out[name] = None if tensor is None else tensor.as_numpy()
    return out


def read_parameters(request) -> dict:
    """The request's parameters (pb_utils' JSON string): what a client set beside the inputs. Triton keeps its own
    (priority, timeout, sequence ids, triton_enable_empty_final_response) and passes the rest, among them every
    field of a generate-endpoint body that names no input."""
    return json.loads(request.parameters() or "{}")


def read_client_request(request, limits):
    """An entry model's request, its client inputs and parameters, as a validated request.GenerationRequest;
    RequestError for a bad one."""
    return parse_request(read_inputs(request, CLIENT_INPUTS), limits, read_parameters(request))


def tensor(name: str, array) -> object:
    return pb().Tensor(name, np.asarray(array))


def error(message: str, invalid_argument: bool = True):
    """A TritonError the client sees as INVALID_ARG (HTTP 400) for its own mistakes, INTERNAL otherwise."""
    utils = pb()
    code = getattr(utils.TritonError, "INVALID_ARG" if invalid_argument else "INTERNAL", None)
    return utils.TritonError(message, code) if code is not None else utils.TritonError(message)


def error_response(message: str, invalid_argument: bool = True):
    return pb().InferenceResponse(output_tensors=[], error=error(message, invalid_argument))


def refusal_response(err, metrics) -> object:
    """A RequestError as the client's INVALID_ARG response, counted in ``metrics`` (SpecDecodeMetrics)."""
    metrics.refuse()
    return error_response(err.message)


# An engine model may leave these out of an answer (TensorRT-LLM's generation_logits, where the engine gathers
# none); every other output asked for must be there.
OPTIONAL_OUTPUTS = ("generation_logits",)


def bls(model: str, inputs: dict[str, object], outputs: list[str]) -> dict[str, np.ndarray | None]:
    """One synchronous BLS request; raises BlsError with the callee's message if it failed, or naming the output
    it left out (an OPTIONAL_OUTPUTS one is None instead): an answer without an error but without its tensors is
    what a callee whose process died mid-call can leave."""
    utils = pb()
    tensors = [utils.Tensor(name, np.asarray(value)) for name, value in inputs.items() if value is not None]
    request = utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=tensors)
    response = request.exec()
    if response.has_error():
        raise BlsError(response.error().message())
    result = {}
    for name in outputs:
        out = utils.get_output_tensor_by_name(response, name)
        if out is None and name not in OPTIONAL_OUTPUTS:
            raise BlsError(f"{model} answered without its {name} output (the server log may say why)")
        result[name] = None if out is None else out.as_numpy()
    return result


CANCEL_POLL_S = 0.1  # how often a request asks Triton whether its client cancelled (an IPC each)


def cancel_check(source, poll_s: float = CANCEL_POLL_S):
    """() -> whether the client cancelled ``source`` (a request or a response sender), asking Triton at most
    every ``poll_s`` seconds; never, where the python backend has no ``is_cancelled``."""
    is_cancelled = getattr(source, "is_cancelled", None)
    if is_cancelled is None:
        return lambda: False
    last = [time.monotonic()]

    def cancelled() -> bool:
        now = time.monotonic()
        if now - last[0] < poll_s:
            return False
        last[0] = now
        return bool(is_cancelled())

    return cancelled


def metric_tensors(stats) -> list:
    """return_perf_metrics' outputs of an AcceptanceStats (validate.metrics: acceptance rate = accepted / drafted):
    the totals over every proposer, and the part prompt lookup proposed (stats.by_proposer)."""
    _, ngram_drafted, ngram_accepted = stats.by_proposer.get("ngram", (0, 0, 0))
    return [
        tensor("acceptance_rate", np.array([[stats.acceptance_rate]], dtype=np.float32)),
        tensor("total_accepted_draft_tokens", np.array([[stats.accepted]], dtype=np.int32)),
        tensor("total_draft_tokens", np.array([[stats.drafted]], dtype=np.int32)),
        tensor("ngram_draft_tokens", np.array([[ngram_drafted]], dtype=np.int32)),
        tensor("ngram_accepted_draft_tokens", np.array([[ngram_accepted]], dtype=np.int32)),
    ]


def text_response(text: str, ids: list[int], stats, with_metrics: bool):
    """The entry model's response: text_output, output_ids [1, n] and, when asked, the acceptance metrics."""
    tensors = [
        tensor("text_output", np.array([[text.encode()]], dtype=object)),
        tensor("output_ids", np.array([ids], dtype=np.int32).reshape(1, len(ids))),
    ]
    if with_metrics and stats is not None:
        tensors += metric_tensors(stats)
    return pb().InferenceResponse(output_tensors=tensors)


# Counter families of SpecDecodeCounts' fields (core.metrics), under vLLM's names with a trtspec_ prefix so that
# PromQL written for vllm:spec_decode_* carries over; Triton's Prometheus exporter does not add "_total" itself.
SPEC_DECODE_COUNTERS = {
    "num_drafts": "Speculative rounds that drafted at least one token",
    "num_draft_tokens": "Draft tokens proposed to the target",
    "num_accepted_tokens": "Draft tokens the target accepted",
    "num_accepted_tokens_per_pos": "Rounds whose draft token at 0-based position `position` was accepted",
    "num_rounds_without_speculation": "Target forwards that verified no draft token (prefill-only round, K=0)",
}
# The counters labelled with the ``proposer`` that gave the rounds' draft tokens (interface.PROPOSER_SOURCES); a
# sum without(proposer) is every proposer's together. Positions and rounds without speculation have no proposer.
BY_PROPOSER = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
SPEC_DECODE_PREFIX = "trtspec_spec_decode_"
DRAFT_LEN_GAUGE = "trtspec_spec_decode_draft_len"
REQUESTS_FINISHED = "trtspec_requests_finished_total"
REQUESTS_REFUSED = "trtspec_requests_refused_total"


# The python backend's Metric keeps the shared memory of its last update on its C++ object, with no lock, and
# increment releases the GIL while it sends: two threads incrementing one metric at once replace each other's
# block and tritonserver aborts (a boost lock_exception or SIGSEGV, seen on 2.51; docs/faults.md). Requests finish
# on threads of their own, so every update of a stub's custom metrics goes under this one lock.
METRICS_LOCK = threading.Lock()


class SpecDecodeMetrics:
    """The entry model's spec-decode metrics on Triton's /metrics (pb_utils custom metrics), labelled with the
    model name, and BY_PROPOSER's with the ``proposer`` too; ``add`` a finished request's SpecDecodeCounts, its
    AcceptanceStats.by_proposer and its finish reason (``trtspec_requests_finished_total``, labelled by
    core.metrics.FINISH_REASONS). Every position up to max_draft_len, every proposer and every finish reason
    exists from the start (at 0), so rate() over one has a series before its first increment."""

    def __init__(self, model: str, max_draft_len: int):
        family = pb().MetricFamily

        def made(name: str, description: str, kind):
            made_family = family(name=name, description=description, kind=kind)
            self.families.append(made_family)
            return made_family

        # A MetricFamily must outlive its Metrics: the metrics are attributes before the families, so they are
        # released first when this object is (attributes go in the order they were set).
        self.counters, self.per_pos, self.draft_len, self.finished, self.refused = {}, [], None, {}, None
        self.families = []
        for field, description in SPEC_DECODE_COUNTERS.items():
            fam = made(f"{SPEC_DECODE_PREFIX}{field}_total", description, family.COUNTER)
            if field == "num_accepted_tokens_per_pos":
                self.per_pos = [
                    fam.Metric(labels={"model": model, "position": str(i)}) for i in range(max_draft_len)
                ]
            elif field in BY_PROPOSER:
                for proposer in PROPOSER_SOURCES:
                    labels = {"model": model, "proposer": proposer}
                    self.counters[field, proposer] = fam.Metric(labels=labels)
            else:
                self.counters[field, None] = fam.Metric(labels={"model": model})
        gauge = made(
            DRAFT_LEN_GAUGE,
            "Mean draft tokens per drafting round (K) of the last finished request that drafted",
            family.GAUGE,
        )
        self.draft_len = gauge.Metric(labels={"model": model})
        finished = made(
            REQUESTS_FINISHED,
            "Requests that left the generation loop, by why they finished (`finish_reason`)",
            family.COUNTER,
        )
        for reason in FINISH_REASONS:
            self.finished[reason] = finished.Metric(labels={"model": model, "finish_reason": reason})
        # Triton counts a refusal the model sends as a successful request, so this is where refusals show
        refused = made(
            REQUESTS_REFUSED,
            "Requests refused with INVALID_ARG before they reached the generation loop",
            family.COUNTER,
        )
        self.refused = refused.Metric(labels={"model": model})

    def refuse(self) -> None:
        """Count one refused request; a failure is logged, never the request's."""
        try:
            with METRICS_LOCK:
                self.refused.increment(1)
        except Exception as err:  # noqa: BLE001 - metrics must never fail a request
            log_warning(f"refusal not counted: {type(err).__name__}: {err}")

    def add(self, counts, finish_reason: str, by_proposer: dict | None = None) -> None:
        """Add one finished request's counts (core.metrics.SpecDecodeCounts) and count it under ``finish_reason``
        (core.metrics.FINISH_REASONS); ``by_proposer``: its AcceptanceStats.by_proposer (what it lacks is the
        draft model's); a failure is logged, never the request's. Each update reaches the server on its own, so a
        scrape may show the request counted a moment before its rounds."""
        try:
            shares = proposer_shares(counts, by_proposer or {})
            with METRICS_LOCK:
                for (field, proposer), metric in self.counters.items():
                    value = shares[proposer][field] if proposer else getattr(counts, field)
                    if value:
                        metric.increment(value)
                per_pos = counts.num_accepted_tokens_per_pos or ()
                for metric, value in zip(self.per_pos, per_pos, strict=False):
                    if value:
                        metric.increment(value)
                if counts.num_drafts:
                    self.draft_len.set(counts.mean_draft_len)
                self.finished[finish_reason].increment(1)
        except Exception as err:  # noqa: BLE001 - metrics must never fail a request
            log_warning(f"spec-decode metrics not updated: {type(err).__name__}: {err}")


def proposer_shares(counts, by_proposer: dict) -> dict[str, dict[str, int]]:
    """{proposer: {BY_PROPOSER field: value}} of one request's counts: each proposer's rounds, drafted and accepted
    tokens from ``by_proposer`` (name -> [rounds, drafted, accepted]), the draft model's the rest, so the shares
    add up to the counts."""
    shares = {
        name: dict(zip(BY_PROPOSER, by_proposer.get(name, (0, 0, 0)), strict=True))
        for name in PROPOSER_SOURCES
        if name != "draft"
    }
    shares["draft"] = {
        field: (getattr(counts, field) or 0) - sum(share[field] for share in shares.values())
        for field in BY_PROPOSER
    }
    return shares


# Adaptive K's choices per batch size (engines/adaptive.py Decision): what a server chose at each load, and why.
ADAPTIVE_PREFIX = "trtspec_adaptive_"
ADAPTIVE_GAUGES = {
    "k": "Draft tokens per row adaptive K chose last for a batch of `batch` rows (0: target-only)",
    "acceptance": "Mean estimated acceptance of the rows it chose for",
    "round_cost": "The chosen K's round cost in target-only rounds of that batch size, as measured by the server",
    "expected_speedup": "Expected tokens per round over the round cost at the chosen K (1: target-only)",
    "measured": "1 where the costs were measured on this server, 0 where the policy's ratios stood in",
    "waited": "1 where the rows were judged as a group their clients wait for (by the row that ends it: the "
    "batches drained to empty before new requests joined), 0 by their mean acceptance",
}


class AdaptiveMetrics:
    """Adaptive K's decisions on Triton's /metrics: ``trtspec_adaptive_rounds_total{batch, k}`` counts the rounds
    each K ran at each batch size, and one gauge per Decision field says why (ADAPTIVE_GAUGES); labelled with the
    model name. ``update`` takes AdaptiveState.snapshot() (series appear as batch sizes and Ks first occur)."""

    def __init__(self, model: str):
        family = pb().MetricFamily
        self.model, self.metrics, self.counted = model, {}, {}
        self.rounds = family(
            name=f"{ADAPTIVE_PREFIX}rounds_total",
            description="Rounds adaptive K ran with `k` draft tokens for a batch of `batch` rows",
            kind=family.COUNTER,
        )
        self.gauges = {
            field: family(name=f"{ADAPTIVE_PREFIX}{field}", description=text, kind=family.GAUGE)
            for field, text in ADAPTIVE_GAUGES.items()
        }

    def _metric(self, family, **labels):
        key = (id(family), tuple(sorted(labels.items())))
        if key not in self.metrics:
            self.metrics[key] = family.Metric(labels={"model": self.model, **labels})
        return self.metrics[key]

    def update(self, snapshot) -> None:
        """Set the gauges and add the rounds since the last update; a failure is logged, never a request's."""
        decisions, rounds = snapshot
        try:
            with METRICS_LOCK:
                for (batch, k), total in rounds.items():
                    if delta := total - self.counted.get((batch, k), 0):
                        self._metric(self.rounds, batch=str(batch), k=str(k)).increment(delta)
                        self.counted[batch, k] = total
                for batch, decision in decisions.items():
                    for field, family in self.gauges.items():
                        self._metric(family, batch=str(batch)).set(float(getattr(decision, field)))
        except Exception as err:  # noqa: BLE001 - metrics must never fail a request
            log_warning(f"adaptive K metrics not updated: {type(err).__name__}: {err}")
