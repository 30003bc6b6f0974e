"""What the scripts under tools/ share at their command line: an expected error as one line instead of a
traceback, comma-separated list options read by argparse, the CPU model that every printed figure names, and
`trtspec serve`'s Ctrl-C handler for a tool that starts a server.

A tool imports it as its neighbour (``from cli_common import ...``: a script's own folder is on sys.path). It
imports nothing from trtspec at import time, so a tool that runs where trtspec is not installed (train_demo_pair.py's training)
can use it too.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def run_main(main: Callable[[], int | None]) -> None:
    """Exit with ``main()``'s status; a trtspec domain error (TrtspecError: a bad recipe, a missing model folder)
    prints ``Error: <message>`` and exits with the error's own status, as the trtspec commands do."""
    try:
        status = main()
    except Exception as err:
        # A TrtspecError can only come from trtspec.core.errors once something imported it.
        errors = sys.modules.get("trtspec.core.errors")
        if errors is None or not isinstance(err, errors.TrtspecError):
            raise
        print(f"Error: {err.message}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(status or 0)


def stop_like_serve() -> None:
    """Ctrl-C through `trtspec serve`'s handler (trtspec.core.interrupts.stop_or_hold), for a tool that starts a
    tritonserver: a KeyboardInterrupt raised inside a wait for that process can leave the wait hung for good, and
    the handler holds it back for the instant of each poll. Elsewhere it raises KeyboardInterrupt as Python's
    own does. From the main thread."""
    from trtspec.core.interrupts import stop_or_hold

    signal.signal(signal.SIGINT, stop_or_hold)


def comma_list(item: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """An argparse ``type``: a comma-separated list, each item read by ``item`` (which raises ValueError for a bad
    one); a bad item is one usage line naming it and ``what`` an item must be."""

    def parse(text: str) -> list[T]:
        values = []
        for piece in text.split(","):
            try:
                values.append(item(piece.strip()))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{piece.strip()!r} in {text!r} is not {what}") from None
        return values

    return parse


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number of ``minimum`` or more (ValueError otherwise): an item reader for ``comma_list``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value

    return parse


def threads_or_auto(text: str) -> int | str:
    """--cpu-threads: a whole number of 1 or more, or ``auto`` (triton.cpu_threads' values)."""
    if text == "auto":
        return text
    try:
        return at_least(1)(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of 1 or more nor auto") from None


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), which every benchmark figure names: the same run on another CPU kind
    gives other ratios."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"
