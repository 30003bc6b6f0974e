"""The stand-in engine models `tensorrt_llm` / `tensorrt_llm_draft` (the test harness): a Triton python model that
answers the tensorrtllm runtime's orchestrator with the PyTorch engine (harness.steps.StepModel) behind the
TensorRT-LLM backend's tensor interface, so the orchestrator runs in a real tritonserver without TensorRT-LLM.

- a draft request (no draft_input_ids, request_output_len = k): continue input_ids by k tokens -> output_ids
  (input + k draft tokens) and, if asked, generation_logits [1, 1, k, V];
- a target request with draft_input_ids (request_output_len = k + 1): verify them -> output_ids = input +
  accepted drafts + one recovered/bonus token (draft_logits switch acceptance to rejection sampling);
- a target request without drafts: plain continuation by request_output_len tokens (stops at end_id).

As the TensorRT-LLM backend, every answer leaves the end token out (its kernels count it in no sequence length) and
keeps a stop word that ended it.

KV-cache reuse across calls (TensorRT-LLM's enable_kv_cache_reuse) is StepModel's slot pool: a request takes the
slot that holds its own sequence (steps.SlotPool.acquire) and only the rest is computed.

On cpu each engine model takes half the cores it may use (cpu_threads auto): the draft and the target run one
after the other in two processes, and a model whose OpenMP threads still spin after its call must not take the
cores of the other.
"""

from __future__ import annotations

import numpy as np

from harness.steps import StepModel, StepRequest
from trtspec.core.errors import RequestError
from trtspec.engines.engine import served_max_seq_len
from trtspec.triton_repo.interface import ENGINE_INPUTS
from trtspec.triton_repo.models import triton_io as io
from trtspec.triton_repo.models.cores import cpu_threads


def _scalar(inputs: dict, name: str, default):
    value = inputs.get(name)
    return default if value is None else np.asarray(value).reshape(-1)[0].item()


def engine_threads(value: str) -> int:
    """Torch threads of one engine model: auto = half the cores (the draft's and the target's processes take
    turns); a number as given."""
    if value.strip().lower() == "auto":
        return max(cpu_threads(value) // 2, 1)
    return cpu_threads(value)


class TorchEngine:
    """One StepModel (target or draft); ``run`` answers one request's tensors."""

    def __init__(self, step_model, role: str):
        self.model, self.role = step_model, role

    def _params(self, inputs: dict):
        from trtspec.engines.sampling import SamplingParams

        return SamplingParams(
            max_new_tokens=1,
            temperature=float(_scalar(inputs, "temperature", 0.0)),
            top_k=int(_scalar(inputs, "runtime_top_k", 0)),
            top_p=float(_scalar(inputs, "runtime_top_p", 1.0)),
            seed=None if inputs.get("seed") is None else int(_scalar(inputs, "seed", 0)),
        )

    def check_input_ids(self, inputs: dict) -> list[int]:
        """input_ids[:input_lengths] of a one-sequence request; RequestError for what the backend would refuse."""
        if inputs.get("input_ids") is None:
            raise RequestError("input 'input_ids' is required")
        ids = np.asarray(inputs["input_ids"])
        rows = ids.reshape(-1, ids.shape[-1]) if ids.ndim else ids.reshape(1, 1)
        if rows.shape[0] != 1:
            raise RequestError(f"input_ids holds {rows.shape[0]} sequences; send one request per sequence")
        length = int(_scalar(inputs, "input_lengths", rows.shape[1]))
        if not 1 <= length <= rows.shape[1]:
            raise RequestError(
                f"input_lengths {length} is outside 1..{rows.shape[1]} (the length of input_ids)"
            )
        tokens = rows[0, :length].tolist()
        vocab = self.model.model.vocab_size
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise RequestError(f"input_ids hold ids outside the vocabulary [0, {vocab})")
        return tokens

    def run(self, inputs: dict) -> tuple[list[int], np.ndarray | None]:
        """-> (output_ids: input + new tokens, generation_logits [new, V] or None)."""
        import torch

        params = self._params(inputs)
        tokens = self.check_input_ids(inputs)
        output_len = max(int(_scalar(inputs, "request_output_len", 1)), 1)
        raw_drafts = inputs.get("draft_input_ids")
        drafts = [] if raw_drafts is None else np.asarray(raw_drafts).reshape(-1).tolist()
        with torch.inference_mode():
            if self.role == "draft":
                (result,) = self.model.draft([StepRequest(tokens, num_tokens=output_len, params=params)])
                new = engine_output(result.tokens, inputs)
                want_logits = bool(_scalar(inputs, "return_generation_logits", False))
                return tokens + new, result.logits[: len(new)].numpy() if want_logits else None
            if drafts:
                raw = inputs.get("draft_logits")
                logits = None if raw is None else np.asarray(raw, dtype=np.float32).reshape(len(drafts), -1)
                request = StepRequest(tokens, draft_ids=drafts, draft_logits=logits, params=params)
                (result,) = self.model.verify([request])
            else:
                request = StepRequest(tokens, num_tokens=output_len, params=params, end_ids=end_ids(inputs))
                (result,) = self.model.continue_([request])
        return tokens + engine_output(result.tokens, inputs), None


def engine_output(tokens: list[int], inputs: dict) -> list[int]:
    """New tokens as TensorRT-LLM returns them: up to its end_id, left out (its sampling and acceptance kernels
    count the end token in no sequence length), or up to and including a one-token stop word."""
    end = None if inputs.get("end_id") is None else int(_scalar(inputs, "end_id", 0))
    words = set(end_ids(inputs)) - {end}
    for i, token in enumerate(tokens):
        if token == end:
            return tokens[:i]
        if token in words:
            return tokens[: i + 1]
    return tokens


def end_ids(inputs: dict) -> tuple[int, ...]:
    """What ends a plain continuation, as TensorRT-LLM: end_id, and a one-token stop word ([1, 2, N] layout)."""
    ids = [] if inputs.get("end_id") is None else [int(_scalar(inputs, "end_id", 0))]
    words = inputs.get("stop_words_list")
    if words is not None:
        ids += [w[0] for w in from_word_list(np.asarray(words).reshape(2, -1)) if len(w) == 1]
    return tuple(ids)


def from_word_list(array: np.ndarray) -> list[list[int]]:
    """Inverse of to_word_list: the token sequences of a [2, N] array."""
    ids, offsets = array[0].tolist(), [o for o in array[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        words.append(ids[start:end])
        start = end
    return [w for w in words if w]


class TritonPythonModel:
    def initialize(self, args):
        import json

        import torch

        params = io.model_parameters(args)
        if params["device"] == "cpu":
            torch.set_num_threads(engine_threads(params.get("cpu_threads", "auto")))
        config = json.loads(args["model_config"])
        max_draft_len = int(params["max_draft_len"])
        # The orchestrator's draft-ahead asks the draft for K + 1 tokens (a TensorRT-LLM draft engine has no draft
        # length limit of its own); the target verifies at most max_draft_len.
        request_limit = max_draft_len + 1 if params["role"] == "draft" else max_draft_len
        step_model = StepModel.from_pretrained(
            params["model_dir"],
            device=params["device"],
            dtype=params["dtype"],
            num_slots=max(int(config.get("max_batch_size") or 1), 1),
            max_seq_len=served_max_seq_len(int(params["max_seq_len"]), max_draft_len),
            max_draft_len=request_limit,
            trust_remote_code=params.get("trust_remote_code", "False").lower() == "true",
        )
        self.engine = TorchEngine(step_model, params["role"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                output_ids, logits = self.engine.run(io.read_inputs(request, ENGINE_INPUTS))
            except RequestError as err:  # the caller's mistake (a client calling this model directly)
                responses.append(io.error_response(f"{self.engine.role} engine: {err.message}"))
                continue
            except Exception as err:  # noqa: BLE001 - one line to the caller (the orchestrator)
                responses.append(
                    io.error_response(f"{self.engine.role} engine: {type(err).__name__}: {err}", False)
                )
                continue
            tensors = [
                io.tensor("output_ids", np.array([[output_ids]], dtype=np.int32)),
                io.tensor("sequence_length", np.array([[len(output_ids)]], dtype=np.int32)),
            ]
            if logits is not None:
                tensors.append(io.tensor("generation_logits", logits[None, None].astype(np.float32)))
            responses.append(io.pb().InferenceResponse(output_tensors=tensors))
        return responses
