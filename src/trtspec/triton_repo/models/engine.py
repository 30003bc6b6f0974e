"""Triton python model `tensorrt_llm` / `tensorrt_llm_draft` of the torch runtime: the PyTorch engine's step
primitives (trtspec.engines.speculative.propose / verify) behind the TensorRT-LLM backend's tensor interface.

- a draft request (no draft_input_ids, request_output_len = k): continue input_ids by k tokens -> output_ids
  (input + k draft tokens) and, if asked, generation_logits [1, 1, k, V];
- a target request with draft_input_ids (request_output_len = k + 1): verify them -> output_ids = input +
  accepted drafts + one recovered/bonus token (draft_logits switch acceptance to rejection sampling);
- a target request without drafts: plain continuation, one verification of zero drafts per token.

KV-cache reuse across calls: each cache slot remembers the tokens it holds; a request takes the slot sharing
the longest prefix with its input_ids (least recently used on ties) and feeds only the rest.
"""

from __future__ import annotations

import numpy as np

from trtspec.triton_repo.interface import ENGINE_INPUTS
from trtspec.triton_repo.models import triton_io as io


class SlotCache:
    """Which tokens each KV-cache slot holds; picks the slot with the longest reusable prefix. Pure."""

    def __init__(self, num_slots: int):
        self.tokens: list[list[int]] = [[] for _ in range(num_slots)]
        self.last_used = [0] * num_slots
        self.clock = 0

    def acquire(self, tokens: list[int]) -> tuple[int, int]:
        """(slot, cached length) for a sequence; at least one token is left to feed (it yields the logits)."""

        def common(held: list[int]) -> int:
            n = 0
            for a, b in zip(held, tokens, strict=False):
                if a != b:
                    break
                n += 1
            return n

        best = max(range(len(self.tokens)), key=lambda s: (common(self.tokens[s]), -self.last_used[s]))
        self.clock += 1
        self.last_used[best] = self.clock
        return best, min(common(self.tokens[best]), len(tokens) - 1)

    def hold(self, slot: int, tokens: list[int]) -> None:
        self.tokens[slot] = list(tokens)


def _scalar(inputs: dict, name: str, default):
    value = inputs.get(name)
    return default if value is None else np.asarray(value).reshape(-1)[0].item()


class TorchEngine:
    """One loaded model (target or draft) and its slots; ``run`` answers one request's tensors."""

    def __init__(self, model, role: str, num_slots: int):
        self.model, self.role, self.slots = model, role, SlotCache(num_slots)

    def _params(self, inputs: dict):
        from trtspec.engines.sampling import SamplingParams

        return SamplingParams(
            max_new_tokens=1,
            temperature=float(_scalar(inputs, "temperature", 0.0)),
            top_k=int(_scalar(inputs, "runtime_top_k", 0)),
            top_p=float(_scalar(inputs, "runtime_top_p", 1.0)),
            seed=None if inputs.get("seed") is None else int(_scalar(inputs, "seed", 0)),
        )

    def run(self, inputs: dict) -> tuple[list[int], np.ndarray | None]:
        """-> (output_ids: input + new tokens, generation_logits [new, V] or None)."""
        import torch

        params = self._params(inputs)
        generator = (
            None if params.seed is None else torch.Generator(self.model.device).manual_seed(params.seed)
        )
        length = int(_scalar(inputs, "input_lengths", 0))
        tokens = np.asarray(inputs["input_ids"]).reshape(-1)[:length].tolist()
        output_len = int(_scalar(inputs, "request_output_len", 1))
        draft = inputs.get("draft_input_ids")
        with torch.inference_mode():
            if self.role == "draft":
                return self._propose(
                    tokens,
                    output_len,
                    params,
                    generator,
                    bool(_scalar(inputs, "return_generation_logits", False)),
                )
            drafts = [] if draft is None else np.asarray(draft).reshape(-1).tolist()
            return self._verify(
                tokens, drafts, inputs.get("draft_logits"), output_len, params, generator
            ), None

    def _propose(self, tokens, k, params, generator, want_logits):
        from trtspec.engines.speculative import Row, propose

        slot, cached = self.slots.acquire(tokens)
        row = Row(tokens=list(tokens), slot=slot, draft_len=cached)
        draft_tokens, draft_logits, _ = propose(self.model, [row], [k], params, generator)
        new = draft_tokens[0].tolist()
        self.slots.hold(slot, (tokens + new)[: row.draft_len])
        logits = draft_logits[0].float().cpu().numpy() if want_logits and draft_logits is not None else None
        return tokens + new, logits

    def _verify(self, tokens, drafts, draft_logits, output_len, params, generator):
        import torch

        from trtspec.engines.sampling import logits_to_probs
        from trtspec.engines.speculative import Row, verify

        out = list(tokens)
        steps = 1 if drafts else max(output_len, 1)  # no drafts: plain continuation, one token per step
        for _ in range(steps):
            slot, cached = self.slots.acquire(out)
            row = Row(tokens=list(out), slot=slot, target_len=cached)
            d = torch.tensor([drafts], dtype=torch.long)
            probs = None
            if drafts and draft_logits is not None and not params.greedy:
                logits = torch.as_tensor(np.asarray(draft_logits, dtype=np.float32)).reshape(
                    1, len(drafts), -1
                )
                probs = logits_to_probs(logits.to(self.model.device), params)
            num_accepted, next_token = verify(self.model, [row], d, [len(drafts)], probs, params, generator)
            n = num_accepted[0]
            self.slots.hold(slot, out + drafts[:n])
            out += drafts[:n] + [next_token[0]]
        return out


class TritonPythonModel:
    def initialize(self, args):
        import json

        from trtspec.engines.models import load_causal_lm

        params = io.model_parameters(args)
        config = json.loads(args["model_config"])
        num_slots = max(int(config.get("max_batch_size") or 1), 1)
        max_seq_len = int(params["max_seq_len"]) + int(params["max_draft_len"]) + 1
        model = load_causal_lm(
            params["model_dir"],
            device=params["device"],
            dtype=params["dtype"],
            num_slots=num_slots,
            max_seq_len=max_seq_len,
            trust_remote_code=params.get("trust_remote_code", "False").lower() == "true",
            lean=None,
        )
        self.engine = TorchEngine(model, params["role"], num_slots)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                output_ids, logits = self.engine.run(io.read_inputs(request, ENGINE_INPUTS))
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
