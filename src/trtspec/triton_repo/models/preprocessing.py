"""Triton python model `preprocessing`: QUERY text -> INPUT_ID / REQUEST_INPUT_LEN (+ stop words, end/pad ids)."""

from __future__ import annotations

import numpy as np

from trtspec.core.errors import RequestError
from trtspec.triton_repo.interface import PREPROCESSING_INPUTS
from trtspec.triton_repo.models import text as tok
from trtspec.triton_repo.models import triton_io as io


class TritonPythonModel:
    def initialize(self, args):
        self.codec = tok.TextCodec.from_parameters(io.model_parameters(args))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(io.read_inputs(request, PREPROCESSING_INPUTS)))
            except RequestError as err:
                responses.append(io.error_response(str(err.message)))
        return responses

    def _one(self, inputs):
        queries = [q.decode("utf-8", "replace") for q in np.asarray(inputs["QUERY"]).reshape(-1)]
        codec = self.codec
        rows = [codec.encode(q) for q in queries]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), codec.pad_id, dtype=np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        words = []
        if inputs["STOP_WORDS_DICT"] is not None:
            raw = [w.decode("utf-8", "replace") for w in np.asarray(inputs["STOP_WORDS_DICT"]).reshape(-1)]
            words = codec.stop_ids(raw)
        stop = np.stack([tok.to_word_list(words)] * len(rows))
        end = inputs["END_ID"] if inputs["END_ID"] is not None else np.full((len(rows), 1), codec.end_id)
        pad = inputs["PAD_ID"] if inputs["PAD_ID"] is not None else np.full((len(rows), 1), codec.pad_id)
        return io.pb().InferenceResponse(
            output_tensors=[
                io.tensor("INPUT_ID", ids),
                io.tensor("REQUEST_INPUT_LEN", np.array([[len(r)] for r in rows], dtype=np.int32)),
                io.tensor("STOP_WORDS_IDS", stop.astype(np.int32)),
                io.tensor("OUT_END_ID", np.asarray(end, dtype=np.int32).reshape(len(rows), 1)),
                io.tensor("OUT_PAD_ID", np.asarray(pad, dtype=np.int32).reshape(len(rows), 1)),
            ]
        )
