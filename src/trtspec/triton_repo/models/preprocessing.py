"""Triton python model `preprocessing`: QUERY text -> INPUT_ID / REQUEST_INPUT_LEN (+ stop words, end/pad ids)."""

from __future__ import annotations

import numpy as np

from trtspec.builders.preflight import load_tokenizer
from trtspec.errors import RequestError
from trtspec.triton_repo.interface import PREPROCESSING_INPUTS
from trtspec.triton_repo.models import text as tok
from trtspec.triton_repo.models import triton_io as io


class TritonPythonModel:
    def initialize(self, args):
        params = io.model_parameters(args)
        self.tokenizer = load_tokenizer(params["tokenizer_dir"])
        self.add_special_tokens = params.get("add_special_tokens", "True").lower() == "true"
        self.max_input_len = int(params["max_input_len"])
        self.end_id = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.end_id

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
        rows = [
            tok.encode_prompt(
                self.tokenizer,
                q,
                add_special_tokens=self.add_special_tokens,
                max_input_len=self.max_input_len,
            )
            for q in queries
        ]
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        words = []
        if inputs["STOP_WORDS_DICT"] is not None:
            raw = [w.decode("utf-8", "replace") for w in np.asarray(inputs["STOP_WORDS_DICT"]).reshape(-1)]
            words = tok.stop_words_ids(self.tokenizer, raw)
        stop = np.stack([tok.to_word_list(words)] * len(rows))
        end = inputs["END_ID"] if inputs["END_ID"] is not None else np.full((len(rows), 1), self.end_id)
        pad = inputs["PAD_ID"] if inputs["PAD_ID"] is not None else np.full((len(rows), 1), self.pad_id)
        return io.pb().InferenceResponse(
            output_tensors=[
                io.tensor("INPUT_ID", ids),
                io.tensor("REQUEST_INPUT_LEN", np.array([[len(r)] for r in rows], dtype=np.int32)),
                io.tensor("STOP_WORDS_IDS", stop.astype(np.int32)),
                io.tensor("OUT_END_ID", np.asarray(end, dtype=np.int32).reshape(len(rows), 1)),
                io.tensor("OUT_PAD_ID", np.asarray(pad, dtype=np.int32).reshape(len(rows), 1)),
            ]
        )
