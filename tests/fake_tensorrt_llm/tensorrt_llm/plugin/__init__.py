"""Stand-in of tensorrt_llm/plugin/plugin.py ``PluginConfig`` (pydantic, extra keys ignored, enable/disable strings)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

DefaultPluginDtype = Literal["auto", "float16", "float32", "bfloat16", "int32", None]


class PluginConfig(BaseModel):
    model_config = ConfigDict(validate_assignment=True, extra="ignore")

    dtype: str = "float16"
    gpt_attention_plugin: DefaultPluginDtype | None = "auto"
    gemm_plugin: Literal["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", None] | None = (
        None
    )
    context_fmha: bool = True
    paged_kv_cache: bool | None = None
    remove_input_padding: bool = True
    tokens_per_block: int = 32
    use_paged_context_fmha: bool = True
    streamingllm: bool = False
    lora_plugin: DefaultPluginDtype | None = None
    pp_reduce_scatter: bool = False

    @field_validator("*", mode="before")
    @classmethod
    def convert_enable_disable(cls, value, info):
        if value == "enable":
            return True
        if value == "disable":
            return False if cls.model_fields[info.field_name].annotation is bool else None
        return value
