"""Causal LMs with a KV cache the speculative loop controls: one call, ``forward``, and no hidden state but the cache.

Both classes below hold ``num_slots`` cache rows of ``max_seq_len`` positions. The caller (engines/speculative.py)
owns every sequence's cached length: ``forward(tokens, slots, starts, num_new, logit_index)`` writes the KV of row
b's ``num_new[b]`` new tokens at positions ``starts[b]..`` of slot ``slots[b]`` and attends to positions
``< starts[b] + i + 1``. Rolling back rejected draft tokens is therefore free: the caller just passes a smaller
``start`` next time and the stale entries are overwritten before they become visible. Rows of one batch may start
at different positions and bring different numbers of new tokens (the batch is padded at the end; padded tokens
write to a scratch column past ``max_seq_len`` and their outputs are never read).

- ``LeanCausalLM``: a functional forward of the Llama family (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with
  q/k norm) over the Hugging Face model's own weights and rotary table, with a preallocated cache and fused
  qkv / gate-up matmuls (the HF q/k/v and gate/up parameters become views into the fused tensors, so the
  weights exist once). It exists for speed: a Hugging Face decoder layer costs ~1 ms of per-call overhead on
  CPU whatever its width, which eats a 1-layer draft's advantage. Its ops mirror the HF modules (same RMSNorm
  casts, same rotary table) so fp32 greedy outputs match ``generate(do_sample=False)``.
- ``HFCausalLM``: the fallback for any other ``AutoModelForCausalLM``: the model's own forward with one
  ``DynamicCache`` per slot, cropped to ``start`` (so batches run row by row).

``load_causal_lm(model_dir, ...)`` picks the lean path when the architecture allows it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from trtspec.core.errors import ModelError
from trtspec.core.model_dir import load_hf_model, out_of_memory

LEAN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm, op for op (variance in fp32, weight applied in the input dtype). In fp32 the two casts
    are no-ops and are left out: at a draft's widths each op's dispatch costs more than its arithmetic."""
    if x.dtype == torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """The rotary sin table [..., D] with its first half negated: ``rotate``'s form of HF rotate_half."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by cos / signed_sin(sin) [B, 1, T, D]: HF's ``x * cos + rotate_half(x) * sin``
    bit for bit in two fewer ops, since rotate_half(x) = cat(-x2, x1) and (-a) * b rounds exactly as a * (-b)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv_weight: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_weight: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None


def _fuse(*linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate linears that read the same input into one weight [sum(out), in] (and bias [sum(out)]) and make
    each linear's parameters views into it: the HF module then computes the same values from the same memory, so
    the fused matmul costs no second copy of the weights (the originals are freed unless something else holds
    them). ``requires_grad`` is kept so the HF model behaves as before."""
    with torch.no_grad():
        weight = torch.cat([lin.weight.detach() for lin in linears])
        has_bias = linears[0].bias is not None
        bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start : start + rows], lin.weight.requires_grad)
        if has_bias:
            lin.bias = torch.nn.Parameter(bias[start : start + rows], lin.bias.requires_grad)
        start += rows
    return weight, bias


# cuDNN's attention builds an execution plan for every new shape of a call with several queries, about 0.13 s each
# on an H200 (torch 2.11), and such a call's mask is as long as the cache, which grows every round: every
# verification of K + 1 tokens stalled on it. The other kernels need no plan. Single-token steps did not stall
# under torch's own choice, and keep it. The flags are process-wide: two threads running forwards at once could
# see each other's choice (a speed matter only; here one thread runs both models).
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_for(queries: int):
    """The SDPA backends of a forward with ``queries`` tokens a row (the context to run it in)."""
    return sdpa_kernel(ATTENTION_BACKENDS) if queries > 1 else nullcontext()


# torch's CausalBias is a Tensor subclass built through the legacy constructor, so each one holds an uninitialised
# float32 host tensor of 2 x queries x keys it never reads: bounded here to 8 MiB of address space (a verification
# of 9 tokens over 100k cached ones is 0.9M cells; a long prompt keeps the tensor mask).
MAX_BIAS_CELLS = 1 << 20


def uses_causal_bias(device: torch.device, start: int, length: int) -> bool:
    """Whether single_row_mask gives torch's bottom-right causal bias instead of a tensor mask."""
    return device.type == "cuda" and length > 1 and length * (start + length) <= MAX_BIAS_CELLS


def single_row_mask(start: int, length: int, device: torch.device):
    """The attention mask of one row's ``length`` new tokens after ``start`` cached ones: query i sees keys
    ``<= start + i`` (None for one token, which sees everything). On CUDA it is torch's bottom-right causal bias
    (uses_causal_bias), which flash attention runs with grouped-query heads, where a tensor mask with such heads
    leaves only the math kernel (two batched matmuls, a softmax and the mask's own ops a layer, where flash takes
    one kernel): a batch-1 verification on a GPU is bound by launches, and its round ran 17-25% shorter on an H200
    (docs/benchmarks.md, "GPU"). On CPU the tensor mask stays: torch's CPU kernel takes it as it is, and would
    only get the bias materialized into the same mask, which cost time on the AMD EPYC."""
    if length == 1:
        return None
    end = start + length
    if uses_causal_bias(device, start, length):
        return causal_lower_right(length, end)
    positions = torch.arange(start, end, device=device)
    return torch.arange(end, device=device)[None, None, None, :] <= positions[None, None, :, None]


def _lean_layer(layer) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    qkv_weight, qkv_bias = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
    gate_up_weight, gate_up_bias = _fuse(mlp.gate_proj, mlp.up_proj)
    return _Layer(
        input_norm=layer.input_layernorm.weight.detach(),
        qkv_weight=qkv_weight,
        qkv_bias=qkv_bias,
        q_norm=attn.q_norm.weight.detach() if hasattr(attn, "q_norm") else None,
        k_norm=attn.k_norm.weight.detach() if hasattr(attn, "k_norm") else None,
        o_weight=attn.o_proj.weight.detach(),
        o_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
        post_norm=layer.post_attention_layernorm.weight.detach(),
        gate_up_weight=gate_up_weight,
        gate_up_bias=gate_up_bias,
        down_weight=mlp.down_proj.weight.detach(),
        down_bias=None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach(),
    )


def lean_unsupported_reason(config, max_seq_len: int) -> str | None:
    """Why the lean forward cannot reproduce this model exactly (None = it can)."""
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not in the Llama family"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return "non-standard MLP (hidden_act or pretraining_tp)"
    rope = getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope type {rope_type!r} depends on the sequence length"
    window = getattr(config, "sliding_window", None)
    windowed = config.model_type == "mistral" or getattr(config, "use_sliding_window", False)
    if windowed and window is not None and window < max_seq_len:
        return f"sliding window {window} < max_seq_len {max_seq_len}"
    return None


class LeanCausalLM:
    """Functional Llama-family forward with a preallocated KV cache (see the module docstring)."""

    def __init__(self, hf_model, *, num_slots: int, max_seq_len: int):
        config = hf_model.config
        weight = hf_model.lm_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.vocab_size = weight.shape[0]
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.max_seq_len = max_seq_len
        inner = hf_model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.lm_head = weight.detach()
        self.layers = [_lean_layer(layer) for layer in inner.layers]
        # Rotary table from the model's own module (so any static rope scaling matches HF); one scratch row.
        positions = torch.arange(max_seq_len + 1, device=self.device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1], positions)
        self.cos, self.sin = cos[0], signed_sin(sin[0])  # [S+1, D]
        shape = (len(self.layers), num_slots, self.num_kv_heads, max_seq_len + 1, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @property
    def num_slots(self) -> int:
        return self.k_cache.shape[1]

    @torch.inference_mode()
    def copy_prefix(self, source: int, slot: int, length: int) -> None:
        """Cache positions [0, length) of ``source`` into ``slot`` (a shared prompt prefix, reused by copying)."""
        self.k_cache[:, slot, :, :length] = self.k_cache[:, source, :, :length]
        self.v_cache[:, slot, :, :length] = self.v_cache[:, source, :, :length]

    def move(self, source: int, slot: int, length: int) -> None:
        """The sequence in ``source`` now lives in ``slot``: its cache positions [0, length) are copied there
        (``source`` is left to its next sequence, which overwrites it from position 0)."""
        self.copy_prefix(source, slot, length)

    @torch.inference_mode()
    def forward(self, tokens, slots, starts, num_new, logit_index) -> torch.Tensor:
        """tokens [B, T] int64 (row b's first num_new[b] are real); slots/starts/num_new: B ints;
        logit_index [B, J] int64 positions in T whose logits to return. Returns [B, J, V] float32."""
        batch, length = tokens.shape
        if batch == 1 and num_new[0] == length:
            ctx = self._single_row_ctx(slots[0], starts[0], length)
        else:
            ctx = self._batch_ctx(slots, starts, num_new, length)
        x = F.embedding(tokens, self.embed)
        with attention_for(length):
            for index, layer in enumerate(self.layers):
                x = self._layer(x, layer, index, ctx)
        rows = torch.arange(batch, device=self.device)[:, None]
        x = rms_norm(x[rows, logit_index], self.final_norm, self.eps)  # [B, J, hidden]: only rows we need
        return F.linear(x, self.lm_head).float()

    def _single_row_ctx(self, slot: int, start: int, length: int) -> _Ctx:
        """Batch 1 (the latency case): slices instead of index tensors, no mask for a 1-token step."""
        end = start + length
        mask = single_row_mask(start, length, self.device)
        cos, sin = self.cos[start:end][None, None], self.sin[start:end][None, None]  # [1, 1, T, D]
        return _Ctx([slot], True, None, end, cos, sin, mask, start=start)

    def _batch_ctx(self, slots, starts, num_new, length: int) -> _Ctx:
        offsets = torch.arange(length, device=self.device)
        start = torch.tensor(starts, device=self.device)
        positions = start[:, None] + offsets[None, :]  # [B, T] absolute positions
        valid = offsets[None, :] < torch.tensor(num_new, device=self.device)[:, None]  # [B, T]
        write_pos = torch.where(valid, positions, self.max_seq_len)  # padding -> scratch column
        span = max(s + n for s, n in zip(starts, num_new, strict=True))  # keys that any real query may see
        cos, sin = self.cos[write_pos][:, None], self.sin[write_pos][:, None]  # [B, 1, T, D]
        if length == 1 and len(set(starts)) == 1:
            mask = None  # one query per row at the end of an equal-length cache: everything is visible
        else:
            mask = torch.arange(span, device=self.device)[None, None, None, :] <= positions[:, None, :, None]
        contiguous = list(slots) == list(range(slots[0], slots[0] + len(slots)))
        return _Ctx(list(slots), contiguous, write_pos, span, cos, sin, mask)

    def _layer(self, x, layer: _Layer, index: int, ctx: _Ctx) -> torch.Tensor:
        batch, length, _ = x.shape
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        h = rms_norm(x, layer.input_norm, self.eps)
        qk, v = F.linear(h, layer.qkv_weight, layer.qkv_bias).split([q_size + kv_size, kv_size], dim=-1)
        qk = qk.view(batch, length, -1, self.head_dim)  # [B, T, Hq + Hkv, D]
        if layer.q_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=2)
            qk = torch.cat((rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)), dim=2)
        # q and k rotated in one go: the same arithmetic per element, half the ops.
        q, k = rotate(qk.transpose(1, 2), ctx.cos, ctx.sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(batch, length, -1, self.head_dim).transpose(1, 2)
        keys, values = self._cache_update(index, k, v, ctx)  # [B, Hkv, span, D]
        attn = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=ctx.mask,
            scale=self.head_dim**-0.5,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        x = x + F.linear(attn.transpose(1, 2).reshape(batch, length, q_size), layer.o_weight, layer.o_bias)
        gate, up = F.linear(
            rms_norm(x, layer.post_norm, self.eps), layer.gate_up_weight, layer.gate_up_bias
        ).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, layer.down_weight, layer.down_bias)

    def _cache_update(self, index: int, k, v, ctx: _Ctx):
        """Write k/v [B, H, T, D] at ctx.write_pos; return the slots' keys/values [B, H, span, D]."""
        k_cache, v_cache = self.k_cache[index], self.v_cache[index]  # [slots, H, S+1, D]
        batch = k.shape[0]
        if ctx.start is not None:  # one row: plain slice writes
            slot, end = ctx.slots[0], ctx.span
            k_cache[slot, :, ctx.start : end] = k[0]
            v_cache[slot, :, ctx.start : end] = v[0]
            return k_cache[slot : slot + 1, :, :end], v_cache[slot : slot + 1, :, :end]
        if ctx.contiguous:  # views, no copies (the generate loop's case)
            k_cache = k_cache[ctx.slots[0] : ctx.slots[0] + batch]
            v_cache = v_cache[ctx.slots[0] : ctx.slots[0] + batch]
            rows = torch.arange(batch, device=self.device)[:, None]
        else:
            rows = torch.tensor(list(ctx.slots), device=self.device)[:, None]
        # Advanced indices around a slice put the indexed dims first: values are [B, T, H, D].
        k_cache[rows, :, ctx.write_pos] = k.transpose(1, 2)
        v_cache[rows, :, ctx.write_pos] = v.transpose(1, 2)
        if ctx.contiguous:
            return k_cache[:, :, : ctx.span], v_cache[:, :, : ctx.span]
        return k_cache[rows[:, 0], :, : ctx.span], v_cache[rows[:, 0], :, : ctx.span]


@dataclass
class _Ctx:
    """Per-forward values shared by every layer."""

    slots: list[int]
    contiguous: bool
    write_pos: torch.Tensor | None  # [B, T]; None for the single-row path
    span: int
    cos: torch.Tensor  # [B, 1, T, D]
    sin: torch.Tensor  # signed_sin's form
    mask: torch.Tensor | None  # [B, 1, T, span] bool, True = may attend (or single_row_mask's bias)
    start: int | None = None  # single-row path: the row's first new position


class HFCausalLM:
    """Fallback: any HF causal LM through its own forward, one DynamicCache per slot (rows run one by one)."""

    def __init__(self, hf_model, *, num_slots: int, max_seq_len: int):
        self.model = hf_model
        self.device = hf_model.lm_head.weight.device if hasattr(hf_model, "lm_head") else hf_model.device
        self.vocab_size = hf_model.get_output_embeddings().weight.shape[0]
        self.max_seq_len = max_seq_len
        self.caches: list = [None] * num_slots

    @property
    def num_slots(self) -> int:
        return len(self.caches)

    def copy_prefix(self, source: int, slot: int, length: int) -> None:
        """Same contract as LeanCausalLM.copy_prefix."""
        import copy

        if self.caches[source] is None:
            raise ValueError(f"cache slot {source} holds nothing to copy")
        self.caches[slot] = copy.deepcopy(self.caches[source])
        truncate_cache(self.caches[slot], length)

    def move(self, source: int, slot: int, length: int) -> None:
        """Same contract as LeanCausalLM.move: the slot's cache object changes hands, nothing is copied."""
        self.caches[slot], self.caches[source] = self.caches[source], None

    @torch.inference_mode()
    def forward(self, tokens, slots, starts, num_new, logit_index) -> torch.Tensor:
        """Same contract as LeanCausalLM.forward."""
        from transformers import DynamicCache

        out = torch.zeros(*logit_index.shape, self.vocab_size, device=self.device)
        for b, (slot, start, count) in enumerate(zip(slots, starts, num_new, strict=True)):
            if count == 0:
                continue
            cache = self.caches[slot]
            if start == 0 or cache is None:
                cache = self.caches[slot] = DynamicCache()
            truncate_cache(cache, start)
            positions = torch.arange(start, start + count, device=self.device)
            with attention_for(count):
                logits = self.model(
                    input_ids=tokens[b : b + 1, :count],
                    past_key_values=cache,
                    position_ids=positions[None],  # the cache positions follow from its length (= start)
                    use_cache=True,
                ).logits[0]  # [count, V]
            out[b] = logits[logit_index[b].clamp(max=count - 1)].float()
        return out


def truncate_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of a DynamicCache. ``crop`` takes a negative count of positions to drop
    on every transformers version (4.x also reads a positive argument as the length to keep, 5.x refuses it), and
    ``crop(0)`` empties a 4.x cache, so it is called only when there is something to drop."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def load_causal_lm(
    model_dir: Path | str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    num_slots: int = 8,
    max_seq_len: int = 2048,
    trust_remote_code: bool = False,
    lean: bool | None = None,
):
    """Load a HF causal LM into a KV model. lean None = the lean forward when the architecture allows it."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ModelError(f"{model_dir}: no config.json; pass a Hugging Face model directory")
    hf_model = load_hf_model(model_dir, dtype, trust_remote_code)
    try:
        hf_model = hf_model.to(device).eval()
    except (RuntimeError, MemoryError) as err:  # a GPU too small for it: named, as a load's own refusal is
        too_large = out_of_memory(err, f"{model_dir}: the model")
        if too_large is None:
            raise
        raise too_large from None
    reason = lean_unsupported_reason(hf_model.config, max_seq_len)
    use_lean = reason is None if lean is None else lean
    if use_lean and reason is not None:
        raise ModelError(f"{model_dir}: the lean forward cannot run this model ({reason})")
    cls = LeanCausalLM if use_lean else HFCausalLM
    kv_model = cls(hf_model, num_slots=num_slots, max_seq_len=max_seq_len)
    kv_model.config = hf_model.config
    kv_model.generation_config = getattr(hf_model, "generation_config", None)
    kv_model.hf_model = hf_model
    return kv_model
