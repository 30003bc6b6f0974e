"""Domain errors: expected failures print one line (what, where, what to do) and exit non-zero.

Every error a user can cause is one of these. They are plain exceptions so that every layer (the Triton python
models included) can raise them without Click; the CLI turns them into Click errors (``Error: <message>``, no
traceback, ``exit_code``), and ``-v`` adds the underlying cause (``detail``).
"""

from __future__ import annotations

# Exit statuses shared by every command.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # a check/verification/threshold failed: the input was fine, the result was not
EXIT_USAGE = 2  # bad input: usage, recipe, missing or malformed files
EXIT_NEEDS_TENSORRT_LLM = 3  # work done up to the point that needs TensorRT-LLM (the NGC image)


class TrtspecError(Exception):
    """Base of all expected errors: a one-line ``message``, the ``exit_code`` of the command that meets it, and
    ``detail`` (the underlying cause), shown only with ``-v``."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message


class RecipeError(TrtspecError):
    """A recipe file that cannot be read, or a field with a bad value."""

    def __init__(self, path, field: str | None, message: str, detail: str | None = None):
        where = f"{path}" + (f": {field}" if field else "")
        super().__init__(f"{where}: {message}", detail)
        self.path, self.field = path, field


class ModelError(TrtspecError):
    """A model or tokenizer directory that is missing, malformed or unsupported."""


class CheckpointError(TrtspecError):
    """A TensorRT-LLM checkpoint or engine directory that is missing or malformed."""


class RequestError(TrtspecError):
    """A generation request out of the engine's contract (e.g. num_draft_tokens > max_draft_len)."""


class PromptSetError(TrtspecError):
    """A prompt file (validate / bench) that cannot be read or has a malformed line."""


class OutputError(TrtspecError):
    """An output path that cannot be written, or whose writing would replace something that is not ours."""


class EditedOutput(OutputError):
    """An earlier output holds files a user edited or added since trtspec wrote it; a rerun would lose them."""


class NoSpaceError(OutputError):
    """The disk filled up while an output was written; the partial output is gone. ``need_bytes``: what the step
    needs in all, when it can tell (outputs.no_space_error)."""

    def __init__(self, message: str, need_bytes: int | None = None, detail: str | None = None):
        super().__init__(message, detail)
        self.need_bytes = need_bytes


class CheckFailed(TrtspecError):
    """A pre-flight check, a verification or a threshold failed."""

    exit_code = EXIT_CHECK_FAILED


class OutOfMemory(TrtspecError):
    """A model or a batch that does not fit the memory of the device it runs on: the input was fine, the machine
    too small for it."""

    exit_code = EXIT_CHECK_FAILED


class NeedsTensorRTLLM(TrtspecError):
    """The step needs the tensorrt_llm package, which only the NGC image has."""

    exit_code = EXIT_NEEDS_TENSORRT_LLM
    manifest: dict | None = None  # what a build did before it stopped here (build --json prints it)


class NeedsConversionStack(TrtspecError):
    """The step runs nvidia-modelopt, which needs the conversion stack TensorRT-LLM 1.2.x pins (the `convert`
    extra); nothing was done."""


class ServerError(TrtspecError):
    """tritonserver could not be found, started, or did not load the repository."""


class PortInUse(ServerError):
    """A port tritonserver should listen on is taken (before it starts, or as it binds)."""
