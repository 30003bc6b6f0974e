"""One TensorRT engine in-process: TensorRT-LLM's C++ runner behind plain token lists (NGC image only).

``load_engine_runner(engine_dir)`` loads one engine into ``tensorrt_llm.runtime.ModelRunnerCpp`` (the class comes
from core/trtllm.py, the only module that imports tensorrt_llm) and returns an ``EngineRunner`` whose ``generate``
takes and returns plain token lists; no tensorrt_llm type leaks out. engines/trtllm_runner.py builds the
draft-target loop on two of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.core import trtllm
from trtspec.core.engine_config import read_engine_config

# TensorRT-LLM 1.x ``tensorrt_llm/runtime/model_runner_cpp.py`` (a 1.x version of NVIDIA/TensorRT-LLM: its executor
# is ``self.session``, and ``from_dir`` also takes ``fail_fast_on_attention_window_too_large``):
# ``ModelRunnerCpp.from_dir(engine_dir, *, rank=0, max_batch_size=None, max_input_len=None, max_output_len=None,
# max_beam_width=None, kv_cache_free_gpu_memory_fraction=None, kv_cache_enable_block_reuse=False, device_ids=None,
# is_orchestrator_mode=False, gather_generation_logits=False, ...)`` and ``generate(batch_input_ids: list[Tensor],
# *, sampling_config=None, streaming=False, max_new_tokens=1, end_id=None, pad_id=None, stop_words_list=None,
# return_dict=False, output_sequence_lengths=False, output_generation_logits=False, **kwargs)``; ``kwargs`` carry
# the sampling knobs (temperature, top_k, top_p, num_beams, random_seed, ...) and the draft-target inputs
# ``draft_tokens_list`` (+ ``draft_logits_list``), which become one ``ExternalDraftTokensConfig`` per request.
# With return_dict=True it returns ``output_ids`` [B, beams, max_seq_len] int32 (prompt included, padded with
# end_id), ``sequence_lengths`` [B, beams] (prompt included) and, when the engine gathers them,
# ``generation_logits``: a tensor [B, beams, max_out_len, V] for plain requests, but a list in *response order*
# for draft-target requests (so trtspec reads logits only from plain requests: the draft's).


@dataclass
class RunnerOutput:
    """One request's result of one ``EngineRunner.generate`` call.

    token_ids: the new tokens (prompt excluded, a stop token included); logits: their generation logits
    [len(token_ids), vocab] (a torch tensor on the runner's device) when asked for, else None.
    """

    token_ids: list[int]
    logits: Any = None


def sampling_kwargs(
    temperature: float, top_k: int, top_p: float, seed: int | None, num_beams: int = 1
) -> dict[str, Any]:
    """trtspec's sampling settings (temperature 0 = greedy; top_k 0 / top_p 1 = off) as generate() kwargs.

    TensorRT-LLM's greedy is top_k=1 (examples/run.py defaults: top_k 1, top_p 0, temperature 1).
    """
    if temperature == 0:
        out: dict[str, Any] = {"temperature": 1.0, "top_k": 1, "top_p": 0.0}
    else:
        out = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
    out["num_beams"] = num_beams
    if seed is not None:
        out["random_seed"] = int(seed)
    return out


class EngineRunner:
    """One engine loaded in a ``ModelRunnerCpp``, behind plain-list calls (no tensorrt_llm types leak out)."""

    def __init__(self, runner: Any, engine_dir: Path, facts: dict[str, Any]):
        self.runner, self.engine_dir, self.facts = runner, Path(engine_dir), facts
        self.max_batch_size = int(runner.max_batch_size)
        self.max_seq_len = int(runner.max_seq_len)
        self.max_draft_len = int(facts["max_draft_len"])
        self.vocab_size = facts["vocab_size"]
        self.gather_generation_logits = bool(runner.gather_generation_logits)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        sampling: dict[str, Any],
        end_id: int,
        pad_id: int,
        stop_words: list[list[int]] | None = None,
        draft_tokens: list[list[int]] | None = None,
        draft_logits: list[Any] | None = None,
        return_logits: bool = False,
    ) -> list[RunnerOutput]:
        """One non-streaming ``generate`` over ``prompts``; returns one RunnerOutput per prompt, in order.

        draft_tokens (one list per prompt, each 1..max_draft_len tokens) makes it a verification call; draft_logits
        ([n_b, V] per prompt) asks the engine to accept by probabilities. Logits are returned only for calls without
        draft tokens (see the comment on ModelRunnerCpp above).
        """
        import torch

        if return_logits and draft_tokens is not None:
            raise ValueError("generation logits are read only from calls without draft tokens")
        kwargs: dict[str, Any] = dict(sampling)
        if draft_tokens is not None:
            kwargs["draft_tokens_list"] = draft_tokens
            kwargs["draft_logits_list"] = draft_logits
        out = self.runner.generate(
            [torch.tensor(p, dtype=torch.int32) for p in prompts],
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=pad_id,
            stop_words_list=[stop_words] * len(prompts) if stop_words else None,
            streaming=False,
            return_dict=True,
            output_sequence_lengths=True,
            output_generation_logits=return_logits,
            **kwargs,
        )
        lengths = out["sequence_lengths"][:, 0].tolist()  # [B], prompt included
        results = []
        for b, prompt in enumerate(prompts):
            tokens = out["output_ids"][b, 0, len(prompt) : lengths[b]].tolist()
            logits = out["generation_logits"][b, 0, : len(tokens)] if return_logits else None  # [n, V]
            results.append(RunnerOutput(tokens, logits))
        return results

    def close(self) -> None:
        """Shut the executor down (its worker processes and GPU memory) now rather than at garbage collection."""
        # ModelRunnerCpp keeps its trtllm.Executor as ``session`` (1.x releases that take
        # fail_fast_on_attention_window_too_large) or ``executor`` (others)
        executor = getattr(self.runner, "session", None) or getattr(self.runner, "executor", None)
        if executor is not None:
            executor.shutdown()
        self.runner = None


def load_engine_runner(
    engine_dir: str | Path,
    *,
    device_ids: list[int] | None = None,
    max_batch_size: int | None = None,
    kv_cache_free_gpu_memory_fraction: float | None = None,
    kv_cache_enable_block_reuse: bool = True,
    gather_generation_logits: bool = False,
) -> EngineRunner:
    """Load one engine directory into TensorRT-LLM's C++ runner, as examples/run.py's draft-target path does.

    Orchestrator mode with explicit ``device_ids`` (upstream ``run_dtm_pld``): draft and target executors run as
    separate workers, each on its own GPUs. The runtime max_input_len is the engine's max_seq_len because every
    round resubmits the growing prefix as a new context; KV-cache block reuse is what keeps that cheap.
    Raises CheckpointError (no engine config), NeedsTensorRTLLM (not installed / wrong version).
    """
    facts = read_engine_config(engine_dir)
    runner_cls = trtllm.runner_class("running TensorRT engines")
    world = facts["tp_size"] * facts["pp_size"]
    runner = runner_cls.from_dir(
        str(engine_dir),
        rank=0,
        max_batch_size=max_batch_size,
        max_input_len=facts["max_seq_len"],
        max_beam_width=1,
        kv_cache_free_gpu_memory_fraction=kv_cache_free_gpu_memory_fraction,
        kv_cache_enable_block_reuse=kv_cache_enable_block_reuse,
        device_ids=list(device_ids) if device_ids is not None else list(range(world)),
        is_orchestrator_mode=True,
        gather_generation_logits=gather_generation_logits,
    )
    return EngineRunner(runner, Path(engine_dir), facts)
