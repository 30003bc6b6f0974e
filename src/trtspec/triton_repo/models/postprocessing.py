"""Triton python model `postprocessing`: TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH -> OUTPUT text."""

from __future__ import annotations

import numpy as np

from trtspec.builders.preflight import load_tokenizer
from trtspec.triton_repo.interface import POSTPROCESSING_INPUTS
from trtspec.triton_repo.models import triton_io as io


class TritonPythonModel:
    def initialize(self, args):
        params = io.model_parameters(args)
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        self.skip_special_tokens = params.get("skip_special_tokens", "True").lower() == "true"

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = io.read_inputs(request, POSTPROCESSING_INPUTS)
            tokens = np.asarray(inputs["TOKENS_BATCH"])
            lengths = np.asarray(inputs["SEQUENCE_LENGTH"]).reshape(tokens.shape[:-1])
            texts = [
                [
                    self.tokenizer.decode(
                        row[: int(n)].tolist(), skip_special_tokens=self.skip_special_tokens
                    ).encode()
                    for row, n in zip(beams, lens, strict=False)
                ]
                for beams, lens in zip(tokens, lengths, strict=False)
            ]
            out = np.array(texts, dtype=object)
            responses.append(io.pb().InferenceResponse(output_tensors=[io.tensor("OUTPUT", out)]))
        return responses
