"""A PyTorch interpreter of the TensorRT-LLM checkpoint format, to verify conversions before a GPU hour is spent.

It reads only the checkpoint (``config.json`` + ``rank{N}.safetensors``), never the HF config, so a wrong
``rotary_base``, ``norm_epsilon``, ``head_size``, GQA head count or rope scaling in the exported config shows up
as wrong logits. Steps: load every rank -> dequantize each rank's linears -> reassemble tensor/pipeline-parallel
shards -> map the names back to a Hugging Face Llama/Qwen2/Qwen3 module built from the checkpoint's own config ->
run it in float32, with the quantized formats' activation quantization simulated by forward pre-hooks.

Layouts, as written by nvidia-modelopt 0.37 (``modelopt/torch/export``), weights [out, in]:
- ``attention.qkv`` = cat(q, k, v) per rank; ``mlp.fc`` = HF gate_proj, ``mlp.gate`` = HF up_proj (swapped names);
  ``attention.dense`` / ``mlp.proj`` are row-parallel (split on ``in``), the rest column-parallel (split on ``out``).
- FP8: float8_e4m3fn weight x per-tensor ``weights_scaling_factor``; W8A8_SQ_PER_CHANNEL: int8 x per-row scale;
  W4A16_AWQ / W4A8_AWQ: int4 packed two output rows per byte (row 2k low nibble, 2k+1 high), shape [out/2, in],
  group scales [out, in/group]. ``prequant_scaling_factor`` [in] multiplies the activation before the GEMM.
- Pipeline stages number their layers from 0; rank = pp_rank * tp_size + tp_rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.core.errors import CheckpointError
from trtspec.core.model_dir import out_of_memory

ROW_PARALLEL = ("attention.dense", "mlp.proj")
HF_LINEAR = {
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}
HF_LAYER_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_layernorm.weight": "post_attention_layernorm.weight",
    "attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj", "lm_head")
INT4_ALGOS = ("W4A16_AWQ", "W4A8_AWQ")
SUPPORTED_ALGOS = (None, "FP8", "W8A8_SQ_PER_CHANNEL", *INT4_ALGOS)
FP8_MAX = 448.0


@dataclass
class Linear:
    """One dequantized linear of one rank (or reassembled): weight [out, in] float32, input scales."""

    weight: Any
    bias: Any = None
    prequant: Any = None  # [in] activation multiplier (SmoothQuant / AWQ)
    act_scale: Any = None  # per-tensor activation scale, when activations are quantized


# ---------------------------------------------------------------- reading


def read_config(ckpt_dir: Path) -> dict:
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir}: no config.json; this is not a TensorRT-LLM checkpoint directory")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable ({err}); re-run trtspec convert") from None
    for key in ("architecture", "hidden_size", "num_hidden_layers", "num_attention_heads", "mapping"):
        if key not in config:
            raise CheckpointError(f"{path}: missing key '{key}'; re-run trtspec convert")
    return config


def read_ranks(ckpt_dir: Path, world_size: int) -> list[dict]:
    """Every rank{N}.safetensors of the checkpoint, as dicts of CPU tensors."""
    from safetensors.torch import load_file

    ranks = []
    for rank in range(world_size):
        path = Path(ckpt_dir) / f"rank{rank}.safetensors"
        if not path.is_file():
            raise CheckpointError(
                f"{path}: missing (mapping.world_size is {world_size}); re-run trtspec convert"
            )
        try:
            ranks.append(load_file(path))
        except Exception as err:  # safetensors raises its own error type for truncated/corrupt files
            raise out_of_memory(err, str(path)) or CheckpointError(
                f"{path}: corrupt safetensors ({err}); re-run trtspec convert"
            ) from None
    return ranks


# ---------------------------------------------------------------- dequantization (one rank)


def unpack_int4(packed):
    """[out/2, in] int8 (two signed int4 per byte, rows 2k / 2k+1 in the low / high nibble) -> [out, in] int8."""
    import torch

    byte = packed.view(torch.uint8).to(torch.int16)
    low, high = byte & 0x0F, byte >> 4
    both = torch.stack([low, high], dim=1).reshape(-1, packed.shape[-1])  # [out, in]
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


def dequantize_weight(weight, scale, algo: str | None):
    """Stored weight (+ its ``weights_scaling_factor``) -> float32 [out, in]."""
    import torch

    if algo is None or scale is None:
        return weight.float()
    if algo == "FP8":
        return weight.float() * scale.float()
    if algo == "W8A8_SQ_PER_CHANNEL":
        return weight.float() * scale.float().reshape(-1, 1)
    if algo in INT4_ALGOS:
        values = unpack_int4(weight).float()  # [out, in]
        group = values.shape[1] // scale.shape[1]
        return values * torch.repeat_interleave(scale.float(), group, dim=1)
    raise CheckpointError(f"quantization.quant_algo {algo!r} is not supported by the verifier")


def dequantize_rank(tensors: dict, algo: str | None) -> dict:
    """Group one rank's tensors: linears (prefix -> Linear) and plain tensors (name -> float32)."""
    out: dict[str, Any] = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and prefix.endswith(LINEARS):
            linear = Linear(dequantize_weight(tensor, tensors.get(f"{prefix}.weights_scaling_factor"), algo))
            linear.bias = _float(tensors.get(f"{prefix}.bias"))
            linear.prequant = _float(tensors.get(f"{prefix}.prequant_scaling_factor"))
            linear.act_scale = _float(tensors.get(f"{prefix}.activation_scaling_factor"))
            out[prefix] = linear
        elif leaf == "weight":
            out[name] = tensor.float()
    return out


def _float(tensor):
    return None if tensor is None else tensor.float()


# ---------------------------------------------------------------- reassembling tp / pp shards


def split_qkv(tensor, config: dict, tp_size: int):
    """One rank's fused qkv rows [(q + 2 kv) * head_size, ...] -> (q, k, v) rows of that rank."""
    head = config["head_size"]
    q_rows = config["num_attention_heads"] // tp_size * head
    kv_rows = max(1, config["num_key_value_heads"] // tp_size) * head
    if tensor.shape[0] != q_rows + 2 * kv_rows:
        raise CheckpointError(
            f"attention.qkv has {tensor.shape[0]} rows per rank but num_attention_heads="
            f"{config['num_attention_heads']}, num_key_value_heads={config['num_key_value_heads']}, "
            f"head_size={head}, tp_size={tp_size} give {q_rows + 2 * kv_rows}; the config.json does not match the weights"
        )
    return tensor[:q_rows], tensor[q_rows : q_rows + kv_rows], tensor[q_rows + kv_rows :]


def _merge_qkv(parts: list, config: dict, tp_size: int):
    import torch

    if parts[0] is None:
        return None
    q, k, v = zip(*(split_qkv(part, config, tp_size) for part in parts), strict=True)
    # Fewer kv heads than ranks: TensorRT-LLM repeats each kv head on tp/kv ranks; keep one copy.
    step = max(1, tp_size // config["num_key_value_heads"])
    return torch.cat([torch.cat(q), torch.cat(k[::step]), torch.cat(v[::step])])


def merge_linear(prefix: str, shards: list[Linear], config: dict) -> Linear:
    """tp shards of one linear -> one Linear (row-parallel: concatenated on ``in``, with their prequant slices)."""
    import torch

    tp = len(shards)
    if tp == 1:
        return shards[0]
    act = None if shards[0].act_scale is None else torch.stack([s.act_scale for s in shards]).amax(0)
    if prefix.endswith(ROW_PARALLEL):
        # Row-parallel: each rank owns a slice of the input (and of the prequant vector), full output.
        weight = torch.cat([s.weight for s in shards], dim=1)
        pre = None if shards[0].prequant is None else torch.cat([s.prequant for s in shards])
        return Linear(weight, shards[0].bias, pre, act)
    if prefix.endswith("attention.qkv"):
        weight = _merge_qkv([s.weight for s in shards], config, tp)
        bias = _merge_qkv([s.bias for s in shards], config, tp)
    else:
        weight = torch.cat([s.weight for s in shards])
        bias = None if shards[0].bias is None else torch.cat([s.bias for s in shards])
    return Linear(weight, bias, shards[0].prequant, act)


def merge_plain(name: str, shards: list, config: dict):
    """Embedding and norms: the embedding may be vocab- or hidden-sharded, norms are replicated."""
    import torch

    if (
        name == "transformer.vocab_embedding.weight"
        and config.get("use_parallel_embedding")
        and len(shards) > 1
    ):
        return torch.cat(shards, dim=int(config.get("embedding_sharding_dim", 0)))
    return shards[0]


def _global_name(name: str, offset: int) -> str:
    """Stage-local layer index -> global index (modelopt numbers each pipeline stage's layers from 0)."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "transformer" and parts[1] == "layers":
        parts[2] = str(int(parts[2]) + offset)
    return ".".join(parts)


def reassemble(config: dict, ranks: list[dict]) -> dict:
    """All ranks -> one dict: linear prefix -> Linear, plain tensor name -> float32 tensor."""
    mapping = config["mapping"]
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    algo = (config.get("quantization") or {}).get("quant_algo")
    if algo not in SUPPORTED_ALGOS:
        raise CheckpointError(
            f"quantization.quant_algo {algo!r} is not one the verifier knows: {SUPPORTED_ALGOS}"
        )
    merged: dict[str, Any] = {}
    offset = 0
    for stage in range(pp):
        shards = [dequantize_rank(ranks[stage * tp + t], algo) for t in range(tp)]
        local_layers = {int(n.split(".")[2]) for n in shards[0] if n.startswith("transformer.layers.")}
        for key in shards[0]:
            parts = [s[key] for s in shards]
            value = (
                merge_linear(key, parts, config)
                if isinstance(parts[0], Linear)
                else merge_plain(key, parts, config)
            )
            merged[_global_name(key, offset if min(local_layers, default=offset) == 0 else 0)] = value
        offset += len(local_layers)
    return merged


# ---------------------------------------------------------------- back to a Hugging Face module


def _check_family(config: dict) -> None:
    """The interpreter runs Llama-family decoders only: RMSNorm, full GPT-NeoX RoPE, gated SiLU MLP."""
    problems = []
    if config.get("position_embedding_type", "rope_gpt_neox") != "rope_gpt_neox":
        problems.append(f"position_embedding_type={config.get('position_embedding_type')}")
    if float(config.get("rotary_pct", 1.0)) != 1.0:
        problems.append(f"rotary_pct={config.get('rotary_pct')}")
    if not config.get("rmsnorm", True):
        problems.append("rmsnorm=false")
    if problems:
        raise CheckpointError(
            f"checkpoint config.json: {', '.join(problems)}; the verifier handles Llama-family decoders only "
            "(pass --no-verify to skip verification)"
        )


def hf_config_from_checkpoint(config: dict, merged: dict):
    """A transformers config built from the checkpoint's own config.json (never from the source model's)."""
    import transformers

    _check_family(config)
    layer0 = "transformer.layers.0."
    qkv, dense = merged.get(layer0 + "attention.qkv"), merged.get(layer0 + "attention.dense")
    lm_head = merged.get("lm_head")
    vocab = (lm_head.weight if lm_head else merged["transformer.vocab_embedding.weight"]).shape[0]
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        head_dim=config.get("head_size") or config["hidden_size"] // config["num_attention_heads"],
        rms_norm_eps=config["norm_epsilon"],
        hidden_act=config["hidden_act"],
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_theta=float(config.get("rotary_base", 10000.0)),
        rope_scaling=config.get("rotary_scaling"),
        tie_word_embeddings=lm_head is None,
    )
    has_qkv_bias = qkv is not None and qkv.bias is not None
    if layer0 + "attention.q_layernorm.weight" in merged:
        return transformers.Qwen3Config(attention_bias=has_qkv_bias, **kwargs)
    if has_qkv_bias and (dense is None or dense.bias is None):
        return transformers.Qwen2Config(use_sliding_window=False, **kwargs)
    mlp_bias = merged.get(layer0 + "mlp.fc") is not None and merged[layer0 + "mlp.fc"].bias is not None
    return transformers.LlamaConfig(attention_bias=has_qkv_bias, mlp_bias=mlp_bias, **kwargs)


def hf_state_dict(config: dict, merged: dict) -> tuple[dict, dict]:
    """Checkpoint names -> HF names. Returns (state_dict, HF linear module name -> Linear for input hooks)."""
    state: dict[str, Any] = {}
    linears: dict[str, Linear] = {}
    head = config.get("head_size") or config["hidden_size"] // config["num_attention_heads"]
    q_rows = config["num_attention_heads"] * head
    kv_rows = (config.get("num_key_value_heads") or config["num_attention_heads"]) * head
    for name, value in merged.items():
        if name == "transformer.vocab_embedding.weight":
            state["model.embed_tokens.weight"] = value
        elif name == "transformer.ln_f.weight":
            state["model.norm.weight"] = value
        elif name == "lm_head":
            state["lm_head.weight"], linears["lm_head"] = value.weight, value
        elif name.startswith("transformer.layers."):
            index, _, leaf = name.removeprefix("transformer.layers.").partition(".")
            base = f"model.layers.{index}."
            if leaf == "attention.qkv":
                bounds = {
                    "q_proj": (0, q_rows),
                    "k_proj": (q_rows, q_rows + kv_rows),
                    "v_proj": (q_rows + kv_rows, None),
                }
                for proj, (lo, hi) in bounds.items():
                    state[f"{base}self_attn.{proj}.weight"] = value.weight[lo:hi]
                    if value.bias is not None:
                        state[f"{base}self_attn.{proj}.bias"] = value.bias[lo:hi]
                    linears[f"{base}self_attn.{proj}"] = value
            elif leaf in HF_LINEAR:
                state[f"{base}{HF_LINEAR[leaf]}.weight"] = value.weight
                if value.bias is not None:
                    state[f"{base}{HF_LINEAR[leaf]}.bias"] = value.bias
                linears[base + HF_LINEAR[leaf]] = value
            elif leaf in HF_LAYER_NORMS:
                state[base + HF_LAYER_NORMS[leaf]] = value
            else:
                raise CheckpointError(f"checkpoint tensor {name} is not part of a Llama-family decoder")
        else:
            raise CheckpointError(f"checkpoint tensor {name} is not part of a Llama-family decoder")
    return state, linears


def fake_quantize_activation(x, scale, algo: str | None):
    """Round-trip an activation through the GEMM input format of ``algo`` (per-tensor static ``scale``)."""
    import torch

    if algo == "W8A8_SQ_PER_CHANNEL":
        return (x / scale).round().clamp(-128, 127) * scale
    if algo in ("FP8", "W4A8_AWQ"):
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale
    return x


def _input_hook(linear: Linear, algo: str | None):
    def hook(_module, args):
        x = args[0]
        if linear.prequant is not None:
            x = x * linear.prequant
        if linear.act_scale is not None:
            x = fake_quantize_activation(x, linear.act_scale, algo)
        return (x, *args[1:])

    return hook


def build_module(config: dict, merged: dict):
    """The float32 HF module that computes what the checkpoint computes."""
    import torch
    import transformers

    hf_config = hf_config_from_checkpoint(config, merged)
    state, linears = hf_state_dict(config, merged)
    model_cls = {
        "Qwen3Config": transformers.Qwen3ForCausalLM,
        "Qwen2Config": transformers.Qwen2ForCausalLM,
    }.get(type(hf_config).__name__, transformers.LlamaForCausalLM)
    model = model_cls(hf_config).float().eval()
    expected = model.state_dict()
    embed = state.get("model.embed_tokens.weight")
    if embed is not None and embed.shape[0] < hf_config.vocab_size:
        # The embedding may be padded less than the lm_head; padded ids are never looked up.
        state["model.embed_tokens.weight"] = torch.nn.functional.pad(
            embed, (0, 0, 0, hf_config.vocab_size - embed.shape[0])
        )
    for name, tensor in expected.items():
        if name not in state and name.endswith(".bias"):
            state[name] = torch.zeros_like(tensor)  # e.g. Qwen3's o_proj bias when only qkv has one
    if hf_config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise CheckpointError(
            f"checkpoint tensors do not match its config.json: missing {missing[:3]}, unexpected {unknown[:3]}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"checkpoint tensor for {name} has shape {tuple(tensor.shape)} but config.json implies "
                f"{tuple(expected[name].shape)}; the exported config does not match the weights"
            )
    model.load_state_dict(state, strict=True)
    algo = (config.get("quantization") or {}).get("quant_algo")
    modules = dict(model.named_modules())
    for name, linear in linears.items():
        if linear.prequant is not None or linear.act_scale is not None:
            modules[name].register_forward_pre_hook(_input_hook(linear, algo))
    return model


def load_checkpoint_module(ckpt_dir: Path):
    """Read, dequantize and reassemble a checkpoint directory into a runnable module; returns (config, module)."""
    config = read_config(ckpt_dir)
    world = int(config["mapping"].get("world_size", 1))
    merged = reassemble(config, read_ranks(ckpt_dir, world))
    return config, build_module(config, merged)


def module_logits(model, input_ids) -> Any:
    """input_ids [batch, seq] int64 -> logits [batch, seq, vocab] float32."""
    import torch

    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


# ---------------------------------------------------------------- comparison with the source HF model

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n",
    "The quick brown fox jumps over the lazy dog. The",
    "for key, value in sorted(items.items()):\n    print(key, value)\n",
)


@dataclass(frozen=True)
class Tolerance:
    """Pass when max |logit error| <= max_rel_error * max |reference logit| and top-1 agreement >= min_top1."""

    max_rel_error: float
    min_top1: float


# Keyed by the checkpoint's quantization.quant_algo (None = fp16/bf16). Set from tiny random models (hidden 128),
# which are far more sensitive to quantization than trained ones: measured there, correct exports reach about
# fp16 0.1% / 100% top-1, fp8 17% / 81%, int8_sq 55% / 62%, int4_awq 55% / 46%, w4a8_awq 61% / 42%, while
# conversion bugs (swapped fc/gate, wrong rotary_base or norm_epsilon, misordered qkv) reach relative errors
# above 100% and top-1 near chance. The quantized limits are therefore coarse: they catch layout and scale bugs,
# not small accuracy losses (measure those with `trtspec validate`).
TOLERANCES: dict[str | None, Tolerance] = {
    None: Tolerance(0.02, 0.95),
    "FP8": Tolerance(0.35, 0.65),
    "W8A8_SQ_PER_CHANNEL": Tolerance(0.80, 0.40),
    "W4A16_AWQ": Tolerance(0.85, 0.30),
    "W4A8_AWQ": Tolerance(0.90, 0.30),
}


def tokenize_prompts(tokenizer, prompts) -> list:
    """Prompts -> a list of [1, seq] int64 tensors (no padding, so no attention-mask differences)."""
    ids = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]
    return [t for t in ids if t.shape[1] > 0]


def compare_logits(checkpoint_logits: list, reference_logits: list, tolerance: Tolerance) -> dict:
    """Per-prompt logits [1, seq, vocab'] vs [1, seq, vocab] (the checkpoint's vocab may be padded) -> metrics."""

    errors, agree, total, scale = [], 0, 0, 0.0
    for ckpt, ref in zip(checkpoint_logits, reference_logits, strict=True):
        ckpt = ckpt[..., : ref.shape[-1]]
        errors.append((ckpt - ref).abs().max().item())
        agree += int((ckpt.argmax(-1) == ref.argmax(-1)).sum())
        total += ref.shape[1]
        scale = max(scale, ref.abs().max().item())
    max_err = max(errors)
    rel = max_err / max(scale, 1e-6)
    top1 = agree / max(total, 1)
    passed = rel <= tolerance.max_rel_error and top1 >= tolerance.min_top1
    return {
        "max_abs_logit_error": max_err,
        "max_rel_logit_error": rel,
        "top1_agreement": top1,
        "tokens": total,
        "tolerance": {"max_rel_error": tolerance.max_rel_error, "min_top1": tolerance.min_top1},
        "passed": passed,
    }


def reference_logits_for(model, input_ids: list) -> list:
    return [module_logits(model, ids) for ids in input_ids]


def verify_against(ckpt_dir: Path, input_ids: list, reference: list) -> dict:
    """Run the interpreter on ``ckpt_dir`` over ``input_ids`` and compare with precomputed ``reference`` logits."""
    config, model = load_checkpoint_module(ckpt_dir)
    algo = (config.get("quantization") or {}).get("quant_algo")
    result = compare_logits(reference_logits_for(model, input_ids), reference, TOLERANCES[algo])
    result["quant_algo"] = algo
    return result
