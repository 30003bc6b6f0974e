"""Stand-in for what upstream's LLM-API model reaches in tensorrt_llm 1.2.x about draft-target (tensorrt_llm cannot
run here): DraftTargetDecodingConfig's and NGramDecodingConfig's fields and validation (tensorrt_llm/llmapi/llm_args.py, DecodingBaseConfig:
strict, unknown keys refused), the drafter's K for an iteration (_torch/speculative/drafter.py) and the acceptance
gate (_torch/speculative/speculation_gate.py). Written from those sources' behaviour, independently of trtspec's
builders/support.py, so that a test comparing the two can fail.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator


class DecodingBaseConfig(BaseModel):
    """The fields and checks every speculative_config shares (upstream's DecodingBaseConfig)."""

    model_config = ConfigDict(extra="forbid")

    max_draft_len: int | None = None
    max_total_draft_tokens: int | None = None
    # 1.2.0 names it speculative_model_dir; the later rename to speculative_model (PR #10099) keeps that as an
    # alias, and whether 1.2.1 has it was not confirmed: both are accepted.
    speculative_model: str | Path | None = Field(
        None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir")
    )
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    acceptance_window: int | None = None
    acceptance_length_threshold: float | None = None
    allow_advanced_sampling: bool = False

    @field_validator("acceptance_window")
    @classmethod
    def _window(cls, value):
        if value is not None and value < 0:
            raise ValueError(f"acceptance_window must be >= 0 (0 disables), got {value}")
        return value

    @field_validator("acceptance_length_threshold")
    @classmethod
    def _threshold(cls, value):
        if value is not None and value < 0:
            raise ValueError(f"acceptance_length_threshold must be >= 0, got {value}")
        return value

    @field_validator("draft_len_schedule")
    @classmethod
    def _schedule(cls, value, info):
        if value is None:
            return value
        if any(batch < 1 for batch in value) or any(k < 0 for k in value.values()):
            raise ValueError("draft_len_schedule: batch sizes must be >= 1 and draft lengths >= 0")
        if 1 not in value:
            raise ValueError("draft_len_schedule must include batch_size=1")
        limit = info.data.get("max_draft_len")
        if limit is not None and value[1] != limit:
            raise ValueError("draft_len_schedule[1] must equal max_draft_len")
        if limit is not None and max(value.values()) > limit:
            raise ValueError("draft_len_schedule: all draft lengths must be <= max_draft_len")
        return dict(sorted(value.items()))


class DraftTargetDecodingConfig(DecodingBaseConfig):
    """speculative_config of decoding_type DraftTarget (from_dict pops decoding_type before constructing it)."""

    @model_validator(mode="after")
    def _draft_target(self):
        if not self.max_draft_len or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("speculative_model must be specified for DraftTarget")
        return self


class NGramDecodingConfig(DecodingBaseConfig):
    """speculative_config of decoding_type NGram (prompt lookup; PyTorch backend only): the base fields (the draft
    model's unused) and NGram's own, max_matching_ngram_size a positive int (default 2), is_keep_all,
    is_use_oldest and is_public_pool (each default True); max_draft_len > 0 required."""

    max_matching_ngram_size: int = Field(2, gt=0)
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def _ngram(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        self.max_total_draft_tokens = self.max_draft_len  # a linear tree
        return self


def draft_len_for(schedule: dict[int, int], batch_size: int) -> int:
    """The K of the largest schedule key <= batch_size (0 below the smallest)."""
    keys = sorted(schedule)
    index = bisect_right(keys, batch_size)
    return schedule[keys[index - 1]] if index else 0


def iteration_draft_len(
    config: DraftTargetDecodingConfig, active: int, max_batch_size: int, gate_disabled: bool = False
) -> int:
    """K of an iteration with ``active`` requests: the schedule's (0 turns speculation off), then off when the gate
    tripped or when more than max_concurrency requests are active (max_num_tokens' cap left out: not reached
    here)."""
    k = config.max_draft_len
    if config.draft_len_schedule is not None:
        k = draft_len_for(config.draft_len_schedule, active)
        if k == 0:
            return 0
    if gate_disabled:
        return 0
    if config.max_concurrency is not None and min(active, max_batch_size) > config.max_concurrency:
        return 0
    return k


class SpeculationGate:
    """Off for good once ``window`` requests finished and the mean of their last ``window`` (decoded tokens per
    iteration - 1) is below ``threshold``; inactive without both settings."""

    def __init__(self, window: int | None, threshold: float | None):
        self.window, self.threshold = window, threshold
        self.history: deque[float] = deque()
        self.finished = 0
        self.disabled = False

    def record(self, avg_decoded_tokens_per_iter: float) -> None:
        if self.disabled or not self.window or self.threshold is None:
            return
        self.history.append(max(0.0, avg_decoded_tokens_per_iter - 1.0))
        if len(self.history) > self.window:
            self.history.popleft()
        self.finished += 1
        if self.finished >= self.window and sum(self.history) / len(self.history) < self.threshold:
            self.disabled = True
