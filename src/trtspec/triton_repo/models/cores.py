"""CPU cores and torch threads of the torch runtime's entry model (pure, no Triton).

One process runs the draft and the target one after the other, so ``cpu_threads: auto`` gives it every core the
server may use; a smaller number leaves cores for the thread that sends responses (``split_cores``).
"""

from __future__ import annotations

import os
from collections.abc import Callable


def available_cores() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_threads(value: str, available: int | None = None) -> int:
    """The cpu_threads parameter as a thread count: a number, or auto = ``available`` (default: the cores this
    process may run on), at least 1."""
    if value.strip().lower() != "auto":
        return max(int(value), 1)
    if available is None:
        available = len(available_cores())
    return max(available, 1)


def split_cores(available: list[int], threads: int) -> tuple[set[int], set[int]] | None:
    """(the generation loop's cores, the sending thread's cores) where the loop's ``threads`` leave some free:
    Linux wakes a thread on its waker's core, so the sending thread, woken by the loop after every round, would
    take the loop's core from it. None where the loop uses every core (or the platform cannot pin threads)."""
    if threads >= len(available) or not hasattr(os, "sched_setaffinity"):
        return None
    return set(available[:threads]), set(available[threads:])


def pin(cores: set[int], on_error: Callable[[str], None] | None = None) -> None:
    """Run the calling thread on ``cores`` only; a refusal (the process's cpuset changed) is reported, not raised:
    the thread then runs where the process may."""
    try:
        os.sched_setaffinity(0, cores)  # 0: the calling thread
    except OSError as err:
        if on_error is not None:
            on_error(f"cannot pin a thread to cores {sorted(cores)} ({err}); it runs on any core")
