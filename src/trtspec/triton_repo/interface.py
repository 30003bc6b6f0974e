"""The tensor contract between the models of a trtspec repository: one place, read by the orchestrator (to
build its requests) and by the cross-model check (to verify every rendered config.pbtxt honours it).

Names and dtypes are upstream's (tensorrtllm_backend all_models/inflight_batcher_llm), so the orchestrator
talks to the TensorRT-LLM C++ backend and clients written for upstream's entry models talk to trtspec's.
"""

from __future__ import annotations


def parameter_flag(params, name: str, default: bool = False) -> bool:
    """A boolean config.pbtxt parameter (rendered as True/False); ``default`` where the parameter is absent."""
    return str(params.get(name, default)).strip().lower() == "true"


# Model names of the repository (upstream's, so upstream clients and docs apply).
TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
ORCHESTRATOR = "tensorrt_llm_bls"
ENTRY_POINT = ORCHESTRATOR  # the client-facing model: text in, text (+ acceptance metrics) out
# Upstream's other entry name (the default of its clients, docs and genai-perf examples): an ensemble of one step
# that passes the entry point's inputs and outputs through under the same names (docs/triton-models.md).
ENSEMBLE = "ensemble"

# Tensors the orchestrator may send to an engine model (target or draft) -> Triton dtype.
ENGINE_INPUTS = {
    "input_ids": "TYPE_INT32",
    "input_lengths": "TYPE_INT32",
    "request_output_len": "TYPE_INT32",
    "draft_input_ids": "TYPE_INT32",
    "draft_logits": "TYPE_FP32",
    "end_id": "TYPE_INT32",
    "pad_id": "TYPE_INT32",
    "stop_words_list": "TYPE_INT32",
    "temperature": "TYPE_FP32",
    "runtime_top_k": "TYPE_INT32",
    "runtime_top_p": "TYPE_FP32",
    "seed": "TYPE_UINT64",
    "return_generation_logits": "TYPE_BOOL",
    "streaming": "TYPE_BOOL",
}
# Tensors the orchestrator reads from an engine model's response.
ENGINE_OUTPUTS = {
    "output_ids": "TYPE_INT32",
    "sequence_length": "TYPE_INT32",
    "generation_logits": "TYPE_FP32",
}

# What the orchestrator calls (BLS): model -> (inputs it may send, outputs it reads).
ORCHESTRATOR_CALLS = {
    TARGET_MODEL: (ENGINE_INPUTS, ENGINE_OUTPUTS),
    DRAFT_MODEL: (ENGINE_INPUTS, ENGINE_OUTPUTS),
}

# The client-facing interface (upstream BLS/ensemble names) -> dtype.
CLIENT_INPUTS = {
    "text_input": "TYPE_STRING",
    "max_tokens": "TYPE_INT32",
    "num_draft_tokens": "TYPE_INT32",
    "use_draft_logits": "TYPE_BOOL",
    "stream": "TYPE_BOOL",
    "temperature": "TYPE_FP32",
    "top_k": "TYPE_INT32",
    "top_p": "TYPE_FP32",
    "seed": "TYPE_UINT64",
    "end_id": "TYPE_INT32",
    "pad_id": "TYPE_INT32",
    "stop_words": "TYPE_STRING",
    "return_perf_metrics": "TYPE_BOOL",
    # Who proposes this request's draft tokens (core/lookup.py PROPOSERS: draft, ngram, draft+ngram; "" or absent:
    # the deployment's speculative.proposer).
    "proposer": "TYPE_STRING",
    # Upstream's inputs that its own clients send by default (README curl: bad_words ""; end_to_end_grpc_client.py:
    # beam_width, exclude_input_in_output; genai-perf: min_length, which upstream renamed min_tokens), declared
    # so Triton does not refuse those requests by name. exclude_input_in_output is honoured; the others are
    # accepted at values that change nothing and refused otherwise (request.parse_request).
    "exclude_input_in_output": "TYPE_BOOL",
    "beam_width": "TYPE_INT32",
    "bad_words": "TYPE_STRING",
    "min_length": "TYPE_INT32",
    "min_tokens": "TYPE_INT32",
}
CLIENT_OUTPUTS = {
    "text_output": "TYPE_STRING",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    # The part of the two totals above that prompt lookup proposed (the draft model's: the rest).
    "ngram_draft_tokens": "TYPE_INT32",
    "ngram_accepted_draft_tokens": "TYPE_INT32",
    # The generated token ids of each response (a streamed chunk: that chunk's ids; otherwise all of them), so
    # clients compare tokens exactly instead of re-tokenising text. Clients that do not ask for it never see it.
    "output_ids": "TYPE_INT32",
}
METRIC_OUTPUTS = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "ngram_draft_tokens",
    "ngram_accepted_draft_tokens",
)
# The proposers that give a round's draft tokens (draft+ngram picks one of them per row and round): the values of
# the ``proposer`` label of the spec-decode counters on /metrics.
PROPOSER_SOURCES = ("draft", "ngram")

# Adaptive K in either runtime's entry-model parameters: num_draft_tokens "adaptive" (no pinned default K);
# k_schedule "1:8,4:4,16:0" (in-flight sequences -> largest K; "" = none), a form config.pbtxt needs no quoting for.
ADAPTIVE = "adaptive"


def format_schedule(schedule: dict[int, int] | None) -> str:
    return ",".join(f"{n}:{k}" for n, k in sorted((schedule or {}).items()))


def parse_schedule(text: str) -> dict[int, int] | None:
    pairs = [item.split(":") for item in text.split(",") if item]
    return {int(n): int(k) for n, k in pairs} or None
