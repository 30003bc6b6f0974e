"""Stand-in for upstream's LLM-API Triton model (TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1),
which needs tensorrt_llm and a GPU. It mirrors what trtspec depends on: loaded by trtspec's launcher from
TRTSPEC_LLMAPI_MODEL_DIR (model.py importing its sibling helpers.py), reads 1/model.yaml like upstream (LLM()
arguments + triton_config; only triton_config is popped, and unknown keys are refused like LlmArgs'
extra="forbid"; speculative_config is validated as 1.2.x's DraftTargetDecodingConfig or NGramDecodingConfig,
llm_args.py here), drafts the K of each request's iteration by 1.2.x's rules (one request at a time here, so the
schedule's batch size is 1) with its acceptance gate, and answers upstream's tensors: text_input, streaming,
sampling_param_* -> text_output and, with sampling_param_return_perf_metrics, acceptance_rate /
total_accepted_draft_tokens / total_draft_tokens. As upstream's model.py (read at NVIDIA/TensorRT-LLM
044a90d209e380c95e23e8ae42f3583fa05ada78): every response's text_output is CompletionOutput.text, the whole text so
far, not its text_diff; streaming to a model that is not decoupled fails the request ("Error generating request:
Streaming is only supported in decoupled mode."); and, as 1.2.x's PyTorch flow, the three acceptance outputs are
zeros (TorchSampler never fills RequestPerfMetrics.speculativeDecoding; FAKE_LLMAPI_FILLED_METRICS=1 in the
server's environment: the counts, as after NVIDIA/TensorRT-LLM#17082). Generation is
trtspec's PyTorch engine over model.yaml's model and speculative_config.speculative_model_dir (NGram: prompt lookup,
no draft), standing in for LLM(**args).generate_async.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import yaml
from helpers import scalar, tensor
from llm_args import DraftTargetDecodingConfig, NGramDecodingConfig, SpeculationGate, iteration_draft_len

LLM_ARGS = {
    "model", "tokenizer", "backend", "tensor_parallel_size", "pipeline_parallel_size", "dtype",
    "trust_remote_code", "max_batch_size", "max_input_len", "max_seq_len", "kv_cache_config", "speculative_config",
}  # fmt: skip


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils

        from trtspec.core.lookup import LookupSpec
        from trtspec.engines.engine import SpeculativeEngine, served_max_seq_len

        config = yaml.safe_load(
            (Path(args["model_repository"]) / args["model_version"] / "model.yaml").read_text()
        )
        triton = config.pop("triton_config")
        unknown = sorted(set(config) - LLM_ARGS)
        if unknown:
            raise ValueError(f"LlmArgs: extra fields not permitted: {unknown}")
        spec = dict(config["speculative_config"])
        decoding = spec.pop("decoding_type")
        configs = {"DraftTarget": DraftTargetDecodingConfig, "NGram": NGramDecodingConfig}
        if decoding not in configs:
            raise ValueError(f"Invalid decoding type: {decoding}")
        self.spec = configs[decoding](**spec)
        # NGram: prompt lookup over the request's own tokens, suffixes of max_matching_ngram_size down to one
        ngram = decoding == "NGram"
        draft_dir = None if ngram else str(self.spec.speculative_model)
        lookup = LookupSpec(1, self.spec.max_matching_ngram_size) if ngram else LookupSpec()
        self.gate = SpeculationGate(self.spec.acceptance_window, self.spec.acceptance_length_threshold)
        self.max_batch_size = config["max_batch_size"]
        self.engine = SpeculativeEngine.from_pretrained(
            config["model"], draft_dir, max_draft_len=self.spec.max_draft_len,
            max_seq_len=served_max_seq_len(config["max_seq_len"], self.spec.max_draft_len),
            proposer="ngram" if ngram else "draft", lookup=lookup,
        )  # fmt: skip
        self.decoupled = bool(triton["decoupled"])
        model_config = json.loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(model_config) == self.decoupled
        self.lock = threading.Lock()
        self.filled_metrics = os.environ.get("FAKE_LLMAPI_FILLED_METRICS") == "1"

    def execute(self, requests):
        if not self.decoupled:
            return [self._respond_whole(r) for r in requests]
        for request in requests:
            self._respond(request, sender=request.get_response_sender())
        return None

    def _respond_whole(self, request):
        """Not decoupled: one response, or upstream's error for a streamed request (its text_output "N/A")."""
        import triton_python_backend_utils as pb_utils

        if bool(scalar(request, "streaming", False)):
            return pb_utils.InferenceResponse(
                output_tensors=[tensor("text_output", b"N/A", object)],
                error=pb_utils.TritonError(
                    "Error generating request: Streaming is only supported in decoupled mode."
                ),
            )
        return self._respond(request, sender=None)

    def _respond(self, request, sender):
        import triton_python_backend_utils as pb_utils

        from trtspec.engines.sampling import SamplingParams

        prompt = scalar(request, "text_input")
        params = SamplingParams(
            max_new_tokens=int(scalar(request, "sampling_param_max_tokens", 32)),  # SamplingParams.max_tokens
            num_draft_tokens=iteration_draft_len(self.spec, 1, self.max_batch_size, self.gate.disabled),
            temperature=float(scalar(request, "sampling_param_temperature", 0.0)),
            top_k=int(scalar(request, "sampling_param_top_k", 0)),
            top_p=float(scalar(request, "sampling_param_top_p", 1.0)),
            seed=scalar(request, "sampling_param_seed"),
        )
        streaming = bool(scalar(request, "streaming", False))
        metrics = bool(scalar(request, "sampling_param_return_perf_metrics", False))
        exclude = bool(scalar(request, "sampling_param_exclude_input_from_output", False))
        tokenizer = self.engine.tokenizer
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        streamed = sender is not None and streaming
        head = "" if exclude else prompt
        generated, sent = [], head
        if streamed and head:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[tensor("text_output", head.encode(), object)])
            )
        with self.lock:  # one LLM; upstream batches in flight, the stand-in serialises
            for event in self.engine.generate_stream([tokenizer(prompt)["input_ids"]], params):
                generated += event.new_tokens[0]
                result = event.results[0] if event.results else None
                if streamed and result is None:  # upstream sends output.text: the whole text so far
                    text = head + tokenizer.decode(generated, skip_special_tokens=True)
                    if text != sent and not text.endswith("\ufffd"):
                        sender.send(
                            pb_utils.InferenceResponse(
                                output_tensors=[tensor("text_output", text.encode(), object)]
                            )
                        )
                        sent = text
        stats = result.stats
        self.gate.record(stats.generated_tokens / max(stats.target_forwards, 1))
        text = head + tokenizer.decode(result.token_ids, skip_special_tokens=True)
        outputs = [tensor("text_output", text.encode(), object)]
        if metrics:  # 1.2.x's PyTorch flow: zeroed, whatever was drafted
            filled = self.filled_metrics
            # upstream sends them in text_output's dtype (np.object_), whatever config.pbtxt declares
            outputs += [
                tensor("acceptance_rate", str(stats.acceptance_rate if filled else 0.0).encode(), object),
                tensor("total_accepted_draft_tokens", str(stats.accepted if filled else 0).encode(), object),
                tensor("total_draft_tokens", str(stats.drafted if filled else 0).encode(), object),
            ]
        if sender is None:
            return pb_utils.InferenceResponse(output_tensors=outputs)
        sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=final)
        return None
