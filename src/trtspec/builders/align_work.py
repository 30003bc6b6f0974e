"""The work folder of ``trtspec align``: what the run has done, kept on disk so an interrupted run resumes there.

It belongs to one set of inputs and settings (``align.run_key``); the data stage (align.py) fills its shards and
held-out sets, the training (align_train.py) checkpoints into it, and ``Clock`` charges both to one budget across
interruptions.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trtspec.core.errors import OutputError
from trtspec.outputs import write_file_atomic

# How far a stage is: on_progress(stage, description, completed, total), stage "data" (prompts) or "train"
# (budget seconds). The CLI draws it (views.stage_bars); builders print nothing.
StageProgress = Callable[[str, str, float, float], None]


def no_progress(stage: str, description: str, completed: float, total: float) -> None:
    """The ``StageProgress`` of a caller that shows nothing."""


class WorkDir:
    """state.json (what is done), data/shard-*.pt (training examples), held_out.pt, validation.pt,
    checkpoint.pt."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self.state = {"key": key, "prompts_done": 0, "shards": [], "data_done": False, "seconds": 0.0}
        state_file = self.path / "state.json"
        if state_file.is_file():
            saved = json.loads(state_file.read_text())
            if saved.get("key") != key:
                raise OutputError(
                    f"--work-dir {self.path} holds an align run of other inputs or settings (the recipe, "
                    "the prompt file, a setting or a model folder's files changed); remove it to start again, or "
                    "pass another --work-dir"
                )
            self.state = saved
        elif self.path.exists() and any(self.path.iterdir()):
            raise OutputError(
                f"--work-dir {self.path} exists and is not an align work folder; choose another"
            )

    @property
    def resumed(self) -> bool:
        return self.state["prompts_done"] > 0 or bool(self.state["shards"])

    def save_state(self) -> None:
        write_file_atomic(self.path / "state.json", json.dumps(self.state, indent=2))

    def save_torch(self, name: str, payload) -> None:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        write_file_atomic(self.path / name, buffer.getvalue())

    def load_torch(self, name: str):
        path = self.path / name
        return torch.load(path, weights_only=False) if path.is_file() else None


class Clock:
    """Seconds spent on the run, across interruptions (the work state's ``seconds`` plus this process's)."""

    def __init__(self, work: WorkDir, budget_s: float):
        self.work, self.budget_s = work, budget_s
        self.base, self.began = work.state["seconds"], time.perf_counter()

    def spent(self) -> float:
        return self.base + time.perf_counter() - self.began

    def left(self) -> float:
        return self.budget_s - self.spent()

    def record(self) -> None:
        self.work.state["seconds"] = self.spent()
