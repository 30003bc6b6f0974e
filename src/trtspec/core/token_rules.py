"""The token rules every runtime follows, each stated once (pure; torch only inside ``round_seeds``).

1. **The model's end ids** (``model_end_ids``): what Hugging Face generate stops on, the generation config's
   ``eos_token_id`` as transformers loads it (generation_config.json where the folder has one, else config.json;
   an int, or a list such as Llama-3-Instruct's [128001, 128008, 128009]), else the tokenizer's eos.
2. **A request's stop ids** (``request_stop_ids``): none with ignore_eos; the request's own ids when it gives any
   (``stop_token_ids`` in-process, ``end_id`` through Triton); else the model's end ids. Any of them ends it.
3. **What an engine call gets** (``engine_stops``): TensorRT-LLM takes ONE end_id, so one stop id is the end_id
   and every other is a one-token stop word. The end_id is the tokenizer's eos when it is a stop id (the token
   the chat template ends a turn with: Llama-3-Instruct's <|eot_id|>, Qwen2.5's <|im_end|>), else the first stop
   id; -1 (matches nothing) when there is none. pad_id: the one given (the caller's: the request's, else the
   tokenizer's pad), else end_id, or 0 when end_id is -1.
4. **The end token in results** (``KEEP_END``): the stop id that ended a request is the last returned token of
   the in-process APIs (``generate``, ``SpeculativeEngine``, the TensorRT-LLM runner: Hugging Face generate's
   convention) and is left out of the ids and the text of the Triton client interface (TensorRT-LLM's end_id
   convention, which clients of tensorrtllm_backend expect). Text is decoded without special tokens either way,
   so both give the same text. ``validate`` compares ids cut before the first stop id (``comparable_pair``), so
   the two conventions compare equal; what a cut would hide still differs there: a candidate that runs past its
   stop id, or that ends on another stop id than the reference (Llama 3's 128001 for 128009).
5. **Per-call seeds** (``round_seeds``): engines that take a seed per call (TensorRT-LLM, the Triton engine
   models) get one per call of a round (the target's, the draft's, and a draft drafting ahead for the next
   round), each a draw from the request's random generator: distinct per call and per round (no two calls replay
   one stream of draws; the acceptance test must not be correlated with the draft's sample), reproducible for a
   seeded request. A call's seed starts every request in it alike (TensorRT-LLM), so sampled rows holding the
   same tokens go in calls of their own; rows that differ share a call and its draws. Greedy calls get none.
   The request's generator is seeded through ``generator_seed``, so every bit of a 64-bit seed counts: torch's
   CPU generator (mt19937) keeps only the low 32 bits of its seed, and seeds s and s + 2**32 would otherwise
   give one stream.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

KEEP_END = {"in-process": True, "triton": False}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = tuple(value) if isinstance(value, list | tuple) else (value,)
    ids = tuple(_token_id(i) for i in values)
    if any(i is None for i in ids):
        raise ValueError(f"eos_token_id: must be a token id or a list of them (got {value!r})")
    return ids


def _token_id(value: Any) -> int | None:
    """``value`` as a token id (numpy's integers too), None where it is none (text, a float, null, a bool)."""
    if isinstance(value, bool):
        return None
    try:
        index = operator.index(value)
    except TypeError:
        return None
    return index if index >= 0 else None


def model_end_ids(generation_eos: Any, tokenizer_eos: int | None) -> tuple[int, ...]:
    """Rule 1: the generation config's eos_token_id (int or list), else the tokenizer's eos id. ValueError for an
    eos_token_id that is not token ids (a token's text, a null in the list)."""
    return _ids(generation_eos) or _ids(tokenizer_eos)


def request_stop_ids(
    model_ids: Sequence[int], *, ignore_eos: bool = False, own: Sequence[int] | None = None
) -> tuple[int, ...]:
    """Rule 2: the ids that end one request (``own``: the request's stop_token_ids or end_id, if given)."""
    if ignore_eos:
        return ()
    return tuple(own) if own is not None else tuple(model_ids)


@dataclass(frozen=True)
class EngineStops:
    """Rule 3: one engine call's end_id, pad_id and one-token stop words ([[id], ...], TensorRT-LLM's layout)."""

    end_id: int
    pad_id: int
    stop_words: tuple[tuple[int, ...], ...] = ()


def engine_stops(
    stop_ids: Sequence[int], tokenizer_eos: int | None, pad_id: int | None = None
) -> EngineStops:
    """Rule 3 for a request's stop ids."""
    stop_ids = tuple(stop_ids)
    end_id = (tokenizer_eos if tokenizer_eos in stop_ids else stop_ids[0]) if stop_ids else -1
    words = tuple((t,) for t in dict.fromkeys(stop_ids) if t != end_id)
    return EngineStops(end_id, pad_id if pad_id is not None else max(end_id, 0), words)


def comparable_pair(
    reference: Sequence[int], candidate: Sequence[int], stop_ids: Iterable[int]
) -> tuple[list[int], list[int]]:
    """Rule 4 for comparing a candidate with a reference: both cut before their first stop id, which either may
    leave out, except what the cut would hide: tokens the candidate returned past its stop id (it did not stop)
    stay on it, and two different stop ids both stay (a different last choice)."""
    stops = set(stop_ids)
    ref, ref_stop, _ = _at_stop(reference, stops)
    cut, stop, rest = _at_stop(candidate, stops)
    if None not in (ref_stop, stop) and ref_stop != stop:
        return ref + [ref_stop], cut + [stop] + rest
    return ref, cut + ([stop] + rest if rest else [])


def _at_stop(tokens: Sequence[int], stops: set[int]) -> tuple[list[int], int | None, list[int]]:
    """(the tokens before the first stop id, that stop id or None, the tokens after it)."""
    for index, token in enumerate(tokens):
        if token in stops:
            return list(tokens[:index]), token, list(tokens[index + 1 :])
    return list(tokens), None, []


_MASK64 = (1 << 64) - 1


def generator_seed(seed: int) -> int:
    """Rule 5: what a request's torch.Generator is seeded with for its seed in [0, 2**64): splitmix64's
    finalizer, a bijection on 64 bits whose low 32 bits each depend on all 64 bits of the seed."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def round_seeds(greedy: bool, generator, calls: int = 2) -> tuple[int | None, ...]:
    """Rule 5: one seed per engine call of a round (target, draft, ...) from the request's torch.Generator; Nones
    when greedy or without a generator."""
    if greedy or generator is None:
        return (None,) * calls
    import torch

    return tuple(torch.randint(0, 2**31 - 1, (calls,), generator=generator).tolist())
