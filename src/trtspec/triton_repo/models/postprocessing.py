"""Triton python model `postprocessing`: TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH -> OUTPUT text."""

from __future__ import annotations

import numpy as np

from trtspec.triton_repo.interface import POSTPROCESSING_INPUTS
from trtspec.triton_repo.models import triton_io as io
from trtspec.triton_repo.models.text import TextCodec


class TritonPythonModel:
    def initialize(self, args):
        self.codec = TextCodec.from_parameters(io.model_parameters(args))

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = io.read_inputs(request, POSTPROCESSING_INPUTS)
            tokens = np.asarray(inputs["TOKENS_BATCH"])
            lengths = np.asarray(inputs["SEQUENCE_LENGTH"]).reshape(tokens.shape[:-1])
            texts = [
                [
                    self.codec.decode(row[: int(n)].tolist()).encode()
                    for row, n in zip(beams, lens, strict=False)
                ]
                for beams, lens in zip(tokens, lengths, strict=False)
            ]
            out = np.array(texts, dtype=object)
            responses.append(io.pb().InferenceResponse(output_tensors=[io.tensor("OUTPUT", out)]))
        return responses
