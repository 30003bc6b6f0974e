"""The Hugging Face PyTorch reference: the target alone, greedy, ``generate(do_sample=False)``.

One prompt at a time (batch 1), so no padding enters the computation. Plain greedy: the model's generation config
is replaced by one that holds its end ids and pad id alone, so nothing else a checkpoint's generation_config.json
may set (repetition_penalty, no_repeat_ngram_size, min_new_tokens, suppress_tokens, bad_words_ids) reshapes the
logits: trtspec's engines apply none of them, and a reference that did would diverge from every correct system.
(Passing a clean config to ``generate`` is not enough: transformers fills the fields a passed config leaves at
their defaults from the model's own.)
"""

from __future__ import annotations

from pathlib import Path

from trtspec.core.model_dir import load_tokenizer, loaded_end_ids


def reference_device_map(device: str, gpus: int) -> str | None:
    """from_pretrained's placement of the reference: None on CPU; on CUDA straight onto the GPU (no host copy of
    the weights), and its layers spread over every visible GPU where there are several, since a target served
    with tensor parallelism rarely fits one. The spread leaves the first GPU lightest, where an in-process
    engine under test already sits. Layers on several GPUs run the same kernels in turn, so the greedy output is
    the one a single GPU would give; what fits no GPU stays in host memory (slow, still exact)."""
    if not device.startswith("cuda"):
        return None
    return "balanced_low_0" if device == "cuda" and gpus > 1 else device


class HFReference:
    """The target model under transformers; ``generate`` returns generated ids (prompt excluded, EOS kept)."""

    def __init__(self, model, tokenizer):
        from transformers import GenerationConfig

        self.model, self.tokenizer = model, tokenizer
        self.end_ids = loaded_end_ids(model, tokenizer)  # read before the config that holds them is replaced
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        if pad is None:
            pad = self.end_ids[0] if self.end_ids else None
        model.generation_config = GenerationConfig(eos_token_id=list(self.end_ids) or None, pad_token_id=pad)

    @classmethod
    def from_pretrained(
        cls,
        model_dir: Path | str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        trust_remote_code: bool = False,
    ) -> HFReference:
        import torch

        from trtspec.core.model_dir import load_hf_model, require_device

        require_device(device)
        tokenizer = load_tokenizer(model_dir, trust_remote_code)
        gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
        placement = reference_device_map(device, gpus)
        model = load_hf_model(model_dir, dtype, trust_remote_code, "the reference model", placement)
        return cls((model if placement else model.to(device)).eval(), tokenizer)

    def stop_token_ids(self) -> set[int]:
        """The ids that end its greedy generation (core/token_rules.py rule 1, as generate applies it)."""
        return set(self.end_ids)

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of one prompt: at most ``max_new_tokens`` ids (prompt excluded)."""
        output = self._generate(prompt_ids, max_new_tokens)  # [1, T + new]
        return output[0, len(prompt_ids) :].tolist()

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    def margin(self, prompt_ids: list[int], index: int) -> float:
        """The reference's top-1 minus top-2 logit at its generated token ``index``: how near a tie its greedy
        choice there was. The logits are those of the same ``generate`` run, which no processor changes (see the
        module docstring), so the margin is the one it acted on."""
        output = self._generate(prompt_ids, index + 1, output_logits=True, return_dict_in_generate=True)
        top = output.logits[index][0].float().topk(2).values  # logits: one [1, vocab] per generated token
        return float(top[0] - top[1])

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, **extra):
        import torch

        input_ids = torch.tensor([prompt_ids], device=self.model.device)  # [1, T]
        with torch.inference_mode():
            return self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                num_beams=1,
                max_new_tokens=max_new_tokens,
                **extra,
            )
