"""Client requests to the entry models: upstream tensor names -> a validated GenerationRequest.

Pure. The generation settings are parsed into the engines' one SamplingParams, whose own checks are the range
checks of temperature, top_k and top_p; this module checks what only a request has (the inputs' presence and shape,
max_tokens, K against the repository's max_draft_len, use_draft_logits against the deployment). Every expected
mistake raises RequestError with one line naming the input, its value and the limit, which the entry model returns
to the client as an INVALID_ARG error (no traceback). Upstream's inputs that speculative decoding here cannot honour
(beam_width, bad_words, min_length / min_tokens) are accepted only where they ask for nothing, so a request is
never half served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from trtspec.core.errors import RequestError
from trtspec.core.lookup import LookupSpec
from trtspec.core.token_rules import KEEP_END, request_stop_ids
from trtspec.engines.adaptive import KPolicy
from trtspec.engines.sampling import SamplingParams
from trtspec.triton_repo import interface as names


@dataclass(frozen=True)
class Limits:
    """The repository's limits on a request."""

    max_draft_len: int
    num_draft_tokens: int | None  # default per-request K; None = adaptive (parameter "adaptive")
    max_seq_len: int
    use_draft_logits: bool = False

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> Limits:
        """An entry model's limits from its config.pbtxt parameters (values.orchestrator_values,
        values.in_process_values)."""
        k = params["num_draft_tokens"]  # the default K of requests without one
        return cls(
            max_draft_len=int(params["max_draft_len"]),
            num_draft_tokens=None if k == names.ADAPTIVE else int(k),
            max_seq_len=int(params["max_seq_len"]),
            use_draft_logits=names.parameter_flag(params, "use_draft_logits"),
        )


def k_policy_from_parameters(params: Mapping[str, str]) -> KPolicy:
    """Adaptive K's settings from an entry model's config.pbtxt parameters (either runtime's: values.k_values);
    KPolicy's defaults where a repository rendered without them has none, so it still loads."""
    return KPolicy(
        draft_cost_ratio=float(params.get("draft_cost_ratio") or KPolicy.draft_cost_ratio),
        schedule=names.parse_schedule(params.get("k_schedule", "")),
    )


def lookup_from_parameters(params: Mapping[str, str]) -> tuple[str, LookupSpec]:
    """(the default proposer, prompt lookup's settings) from the torch entry model's config.pbtxt parameters
    (values.proposer_values); the draft model and LookupSpec's defaults where a repository rendered without them
    has none, so it still loads."""
    spec = LookupSpec(
        prompt_lookup_min=int(params.get("prompt_lookup_min") or LookupSpec.prompt_lookup_min),
        prompt_lookup_max=int(params.get("prompt_lookup_max") or LookupSpec.prompt_lookup_max),
    )
    return params.get("proposer") or "draft", spec


@dataclass(frozen=True)
class GenerationRequest:
    text: str
    params: SamplingParams  # max_new_tokens: the client's max_tokens (to_job caps it); num_draft_tokens None = adaptive
    stream: bool
    use_draft_logits: bool
    return_perf_metrics: bool
    end_id: int | None = None
    pad_id: int | None = None
    stop_words: tuple[str, ...] = field(default_factory=tuple)
    exclude_input_in_output: bool = True  # False: a whole answer starts with the prompt (whole_answer)


def _text(name: str, raw: bytes) -> str:
    """A STRING input's bytes as text; RequestError for bytes that are not UTF-8 (replacing them would serve a
    prompt or a stop word other than the one sent)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(
            f"input '{name}' is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); send it "
            "encoded as UTF-8"
        ) from None


def _scalar(inputs: Mapping, name: str, default=None):
    value = inputs.get(name)
    if value is None:
        return default
    arr = np.asarray(value)
    if arr.size != 1:
        raise RequestError(
            f"input '{name}' must hold one value per request, got shape {list(arr.shape)}; send one value of "
            f"'{name}' per request (one prompt per request)"
        )
    item = arr.reshape(-1)[0]
    return _text(name, item) if isinstance(item, bytes) else item.item() if hasattr(item, "item") else item


def _strings(inputs: Mapping, name: str) -> tuple[str, ...]:
    value = inputs.get(name)
    if value is None:
        return ()
    items = [_text(name, v) if isinstance(v, bytes) else str(v) for v in np.asarray(value).reshape(-1)]
    return tuple(s for s in items if s)


def _params(inputs: Mapping, max_tokens: int, num_draft_tokens: int | None) -> SamplingParams:
    """SamplingParams checks the values (a bad proposer too); a blank proposer is none, as a blank bad_words is.
    top_k and top_p as upstream's BLS passes them to TensorRT-LLM: 0 is unset, and a request with neither is
    greedy whatever its temperature (upstream's clients send a temperature by default and expect greedy text
    unless they ask for top-k or top-p sampling); SamplingParams' off values are top_k 0 and top_p 1."""
    seed = _scalar(inputs, "seed")
    proposer = str(_scalar(inputs, "proposer", "")).strip()
    top_k, top_p = int(_scalar(inputs, "top_k", 0)), float(_scalar(inputs, "top_p", 0.0))
    if top_k == 0 and top_p == 0:
        top_k = 1  # argmax: greedy
    return SamplingParams(
        max_new_tokens=max_tokens,
        num_draft_tokens=num_draft_tokens,
        temperature=float(_scalar(inputs, "temperature", 0.0)),
        top_k=top_k,
        top_p=1.0 if top_p == 0 else top_p,
        seed=None if seed is None else int(seed),
        proposer=proposer or None,
    )


def _refuse_what_is_not_served(inputs: Mapping) -> None:
    """RequestError for a value of upstream's inputs that asks for what speculative decoding here does not do."""
    beam_width = int(_scalar(inputs, "beam_width", 1))
    if beam_width != 1:
        raise RequestError(
            f"beam_width {beam_width} is not supported: speculative decoding runs one beam (as TensorRT-LLM's "
            "draft-target); send beam_width 1 or leave it out"
        )
    bad_words = _strings(inputs, "bad_words")
    if bad_words:
        raise RequestError(
            f"bad_words {list(bad_words)!r} is not supported: trtspec bans no words; send an empty bad_words "
            '("") or leave it out'
        )
    for name in ("min_length", "min_tokens"):
        least = int(_scalar(inputs, name, 0))
        if least < 0:
            raise RequestError(f"{name} must be >= 0, got {least}; send 0 or leave it out for no minimum")
        if least > 1:  # 1 is TensorRT-LLM's default, taken as no minimum (docs/triton-models.md)
            raise RequestError(
                f"{name} {least} is not supported: trtspec does not enforce a minimum length with speculative "
                f"decoding; for fixed-length outputs send end_id -1 (no end id then stops the request) with "
                f"max_tokens {least}"
            )


# What a generate endpoint passes on as a parameter although Triton uses it: the request id, echoed in the answer.
TRITON_USES = frozenset({"id"})


def _refuse_parameters(parameters: Mapping[str, object]) -> None:
    """RequestError for request parameters: no entry model reads any, so a setting sent as one (a generate body's
    field that names no input, such as repetition_penalty or a misspelt temperature, or a gRPC client's
    parameters) would be silently ignored."""
    ignored = sorted(set(parameters) - TRITON_USES)
    misplaced = [name for name in ignored if name in names.CLIENT_INPUTS]
    if misplaced:  # a gRPC client's parameter named after an input: the model reads only the input tensor
        name = misplaced[0]
        raise RequestError(
            f"{name!r} came as a request parameter ({parameters[name]!r}), which this model does not read; send it "
            f"as the input tensor {name} (a generate body's field of that name is one)"
        )
    if ignored:
        listed = ", ".join(repr(name) for name in ignored)
        raise RequestError(
            f"{listed}: not an input of this model, so it would be ignored (a request parameter: a generate "
            "body's field that names no input, or one a client set); leave it out or send one of the inputs in "
            "docs/triton-models.md"
        )


def parse_request(
    inputs: Mapping[str, object], limits: Limits, parameters: Mapping[str, object] | None = None
) -> GenerationRequest:
    """Validate one request's inputs (name -> numpy array or None when absent) and its ``parameters``
    (triton_io.read_parameters), which must be none."""
    _refuse_parameters(parameters or {})
    text = _scalar(inputs, "text_input")
    if text is None:
        raise RequestError("input 'text_input' is required")
    if not str(text).strip():
        raise RequestError("text_input is empty; send a non-empty prompt")
    if inputs.get("max_tokens") is None:  # required in config.pbtxt, but Triton lets a request leave it out
        raise RequestError("input 'max_tokens' is required: how many tokens to generate (> 0)")
    max_tokens = int(_scalar(inputs, "max_tokens"))
    if max_tokens <= 0:
        raise RequestError(f"max_tokens must be > 0, got {max_tokens}")
    k = _scalar(inputs, "num_draft_tokens", limits.num_draft_tokens)
    k = None if k is None else int(k)
    if k is not None and not 0 <= k <= limits.max_draft_len:
        raise RequestError(
            f"num_draft_tokens {k} is out of range: it must be between 0 and max_draft_len {limits.max_draft_len} "
            "(the engine limit)"
        )
    use_draft_logits = bool(_scalar(inputs, "use_draft_logits", limits.use_draft_logits))
    if use_draft_logits and not limits.use_draft_logits:
        raise RequestError(
            "use_draft_logits=true needs a repository deployed with speculative.use_draft_logits: true "
            "(its engines gather generation logits); leave it out or send false"
        )
    _refuse_what_is_not_served(inputs)
    end_id, pad_id = _scalar(inputs, "end_id"), _scalar(inputs, "pad_id")
    return GenerationRequest(
        text=str(text),
        params=_params(inputs, max_tokens, k),
        stream=bool(_scalar(inputs, "stream", False)),
        use_draft_logits=use_draft_logits,
        return_perf_metrics=bool(_scalar(inputs, "return_perf_metrics", False)),
        end_id=None if end_id is None else int(end_id),
        pad_id=None if pad_id is None else int(pad_id),
        stop_words=_strings(inputs, "stop_words"),
        exclude_input_in_output=bool(_scalar(inputs, "exclude_input_in_output", True)),
    )


def check_stream(req: GenerationRequest, decoupled: bool) -> None:
    """RequestError for stream=true to a model that sends one response per request (triton.decoupled false)."""
    if req.stream and not decoupled:
        raise RequestError(
            "stream=true needs a model deployed with triton.decoupled: true (this one sends one response per "
            "request); leave stream out or redeploy"
        )


def whole_answer(
    req: GenerationRequest, prompt: Sequence[int], text: str, ids: Sequence[int]
) -> tuple[str, list[int]]:
    """A request's whole (not streamed) text_output and output_ids from its generated ``text`` and ``ids``: with
    exclude_input_in_output false, the prompt as sent and its ``prompt`` ids come first, as upstream's
    tensorrt_llm model returns them. Streamed responses never carry the prompt, whatever the flag: TensorRT-LLM
    streams only new tokens (its excludeInputFromOutput applies to whole results)."""
    if req.exclude_input_in_output:
        return text, list(ids)
    return req.text + text, [*prompt, *ids]


def to_job(req: GenerationRequest, codec, limits: Limits) -> tuple[list[int], SamplingParams, dict]:
    """(prompt ids, SamplingParams, GenerationLoop.add options) of a parsed request, the one place both runtimes'
    entry models turn a request into the loop's terms; ``codec``: a text.TextCodec. RequestError for a prompt
    the codec refuses. max_tokens is capped to what max_seq_len leaves after the prompt (as TensorRT-LLM caps
    maxNewTokens); stop ids and the end token are core/token_rules.py's (a request's end_id replaces the model's
    end ids; the Triton interface returns neither)."""
    vocab = codec.vocab_size
    if req.end_id is not None and not -1 <= req.end_id < vocab:
        raise RequestError(
            f"end_id {req.end_id} is outside the vocabulary [0, {vocab}); send a token id of this model, -1 for "
            "no end id, or leave it out"
        )
    # Refused on both runtimes alike, though only TensorRT-LLM's engines use it: a request one runtime serves must
    # not fail on the other.
    if req.pad_id is not None and not 0 <= req.pad_id < vocab:
        raise RequestError(
            f"pad_id {req.pad_id} is outside the vocabulary [0, {vocab}); send a token id of this model or leave it out"
        )
    prompt = codec.encode(req.text)
    room = max(limits.max_seq_len - len(prompt), 1)
    params = req.params.with_(max_new_tokens=min(req.params.max_new_tokens, room))
    own = None if req.end_id is None else (req.end_id,)
    options = {
        "eos_ids": request_stop_ids(codec.end_ids, own=own),
        "keep_end": KEEP_END["triton"],
        "stop_sequences": codec.stop_ids(req.stop_words),
    }
    return prompt, params, options
