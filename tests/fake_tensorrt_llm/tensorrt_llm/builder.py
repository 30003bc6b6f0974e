"""Stand-in of tensorrt_llm/builder.py: BuildConfig, EngineConfig, Engine (save), build."""

import copy
import json
import os
from dataclasses import dataclass, field

from . import __version__
from .models.modeling_utils import SpeculativeDecodingMode
from .plugin import PluginConfig


class ConfigEncoder(json.JSONEncoder):
    def default(self, obj):
        if hasattr(obj, "model_dump"):
            return obj.model_dump(mode="json")
        return super().default(obj)


@dataclass
class BuildConfig:
    max_input_len: int = 1024
    max_seq_len: int = None
    opt_batch_size: int = 8
    max_batch_size: int = 2048
    max_beam_width: int = 1
    max_num_tokens: int = 8192
    opt_num_tokens: int | None = None
    max_prompt_embedding_table_size: int = 0
    kv_cache_type: str = None
    gather_context_logits: int = False
    gather_generation_logits: int = False
    strongly_typed: bool = True
    force_num_profiles: int | None = None
    profiling_verbosity: str = "layer_names_only"
    enable_debug_output: bool = False
    max_draft_len: int = 0
    speculative_decoding_mode: SpeculativeDecodingMode = SpeculativeDecodingMode.NONE
    use_refit: bool = False
    input_timing_cache: str = None
    output_timing_cache: str = "model.cache"
    weight_sparsity: bool = False
    weight_streaming: bool = False
    plugin_config: PluginConfig = field(default_factory=PluginConfig)
    use_strip_plan: bool = False
    max_encoder_input_len: int = 1024
    dry_run: bool = False
    visualize_network: str = None
    monitor_memory: bool = False
    use_mrope: bool = False

    def to_dict(self):
        output = copy.deepcopy(self.__dict__)
        output["plugin_config"] = output["plugin_config"].model_dump()
        return output


class EngineConfig:
    def __init__(self, pretrained_config, build_config, version):
        self.pretrained_config, self.build_config, self.version = pretrained_config, build_config, version

    def to_dict(self):
        build_config = self.build_config.to_dict()
        build_config.pop("dry_run", None)
        build_config.pop("visualize_network", None)
        return {
            "version": self.version,
            "pretrained_config": self.pretrained_config.to_dict(),
            "build_config": build_config,
        }


class Engine:
    def __init__(self, config, engine, managed_weights={}):  # noqa: B006 - mirrors the real signature
        self.config, self.engine, self.managed_weights = config, engine, managed_weights

    def save(self, engine_dir):
        os.makedirs(engine_dir, exist_ok=True)
        rank = self.config.pretrained_config.mapping.rank
        if rank == 0:
            with open(os.path.join(engine_dir, "config.json"), "w", encoding="utf-8") as f:
                json.dump(self.config.to_dict(), f, indent=4, cls=ConfigEncoder)
        if self.engine is not None:
            with open(os.path.join(engine_dir, f"rank{rank}.engine"), "wb") as f:
                f.write(self.engine)


def build(model, build_config):
    build_config = copy.deepcopy(build_config)
    build_config.plugin_config.dtype = model.config.dtype
    if build_config.max_seq_len is None:
        build_config.max_seq_len = getattr(model.config, "max_position_embeddings", 2048)
    if os.environ.get("FAKE_TRTLLM_DROP_SPECULATIVE") == "1":
        build_config.speculative_decoding_mode = SpeculativeDecodingMode.NONE
        build_config.max_draft_len = 0
    # _init_max_seq_len -> check_max_num_tokens: never more tokens than max_seq_len x max_batch_size, before
    # max_seq_len grows by K; then a speculative build holds at least max_batch_size x (K + 1)
    build_config.max_num_tokens = min(
        build_config.max_num_tokens, build_config.max_seq_len * build_config.max_batch_size
    )
    if build_config.speculative_decoding_mode != SpeculativeDecodingMode.NONE:
        build_config.max_seq_len += build_config.max_draft_len
        build_config.max_num_tokens = max(
            build_config.max_num_tokens, build_config.max_batch_size * (build_config.max_draft_len + 1)
        )
    config = EngineConfig(copy.deepcopy(model.config), build_config, __version__)
    return Engine(config, b"FAKE-TRT-ENGINE rank %d" % model.config.mapping.rank)
