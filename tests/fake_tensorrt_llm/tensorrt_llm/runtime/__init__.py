"""Stand-in of tensorrt_llm/runtime: ``ModelRunnerCpp`` (see model_runner_cpp.py)."""

from .model_runner_cpp import ModelRunnerCpp

__all__ = ["ModelRunnerCpp"]
