"""Stand-in of tensorrt_llm/models: PretrainedConfig and MODEL_MAP (architecture -> model class)."""

from .modeling_utils import PretrainedConfig, PretrainedModel


class LLaMAForCausalLM(PretrainedModel):
    pass


class QWenForCausalLM(PretrainedModel):
    pass


MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
    "MistralForCausalLM": LLaMAForCausalLM,
    "Qwen2ForCausalLM": QWenForCausalLM,
    "Qwen3ForCausalLM": QWenForCausalLM,
}

__all__ = ["MODEL_MAP", "PretrainedConfig", "PretrainedModel"]
