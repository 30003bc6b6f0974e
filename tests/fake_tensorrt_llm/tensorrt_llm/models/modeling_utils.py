"""Stand-in of tensorrt_llm/models/modeling_utils.py: SpeculativeDecodingMode, PretrainedConfig, PretrainedModel."""

import copy
import json
import os
from enum import IntFlag, auto

from ..mapping import Mapping


class SpeculativeDecodingMode(IntFlag):
    NONE = auto()
    DRAFT_TOKENS_EXTERNAL = auto()
    MEDUSA = auto()
    LOOKAHEAD_DECODING = auto()
    EXPLICIT_DRAFT_TOKENS = auto()
    EAGLE = auto()
    NGRAM = auto()
    USER_PROVIDED = auto()
    SAVE_HIDDEN_STATES = auto()
    AUTO = auto()

    @staticmethod
    def from_arguments(args):
        names = {
            None: "NONE",
            "draft_tokens_external": "DRAFT_TOKENS_EXTERNAL",
            "medusa": "MEDUSA",
            "lookahead_decoding": "LOOKAHEAD_DECODING",
            "explicit_draft_tokens": "EXPLICIT_DRAFT_TOKENS",
            "eagle": "EAGLE",
            "ngram": "NGRAM",
            "user_provided": "USER_PROVIDED",
            "auto": "AUTO",
            "save_hidden_states": "SAVE_HIDDEN_STATES",
        }
        if args.speculative_decoding_mode not in names:
            raise AssertionError(f"Unknown speculative_decoding_mode {args.speculative_decoding_mode}")
        return SpeculativeDecodingMode[names[args.speculative_decoding_mode]]


class PretrainedConfig:
    # upstream: keyword-only architecture, dtype, hidden_size, num_hidden_layers and num_attention_heads, all
    # required; vocab_size optional
    def __init__(
        self,
        *,
        architecture,
        dtype,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        vocab_size=None,
        mapping=None,
        **kwargs,
    ):
        self.architecture, self.dtype, self.vocab_size = architecture, dtype, vocab_size
        self.hidden_size, self.num_hidden_layers = hidden_size, num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.mapping = Mapping(**(mapping or {}))
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_dict(cls, config):
        return cls(**copy.deepcopy(config))

    @classmethod
    def from_json_file(cls, config_file):
        with open(config_file) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self):
        out = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k != "mapping"}
        out["mapping"] = self.mapping.to_dict()
        return out

    def set_rank(self, rank):
        self.mapping.rank = rank


class PretrainedModel:
    def __init__(self, config):
        self.config = config

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        if config is None:
            config = PretrainedConfig.from_json_file(os.path.join(ckpt_dir, "config.json"))
        if rank is not None:
            config.set_rank(rank)
        weights = os.path.join(ckpt_dir, f"rank{config.mapping.rank}.safetensors")
        if not os.path.isfile(weights):
            raise FileNotFoundError(weights)
        return cls(config)
