"""A Ctrl-C (or a SIGTERM: `docker stop`, a supervisor) stops the command even where a library swallows it.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Inside a ``__del__`` or a
weakref callback (a tokenizer or a safetensors handle being freed during a conversion) it is printed as
"Exception ignored in ..." and lost, and the command would go on, rename its output into place and exit 0.
The handler here records every SIGINT before raising, so no output folder is renamed into place
(``outputs.replace_dir``) and the command exits 130 after one (``cli.main``). SIGTERM, whose default ends the
process at once, leaving its temp folders behind, takes the same path.

``stop_signals_held`` holds `trtspec serve`'s stop signals back for the instant a wait on a process takes, where a
KeyboardInterrupt would break the wait for good.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

_seen = threading.Event()


def _record_and_raise(signum, frame):
    _seen.set()
    raise KeyboardInterrupt


def record_interrupts() -> None:
    """Install the recording handler where Python's default one is (not where SIGINT is ignored, as in a
    background job of a non-interactive shell, nor where a caller installed its own), for SIGTERM where its
    default is. From the main thread."""
    _seen.clear()
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _record_and_raise)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _record_and_raise)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if a SIGINT arrived since ``record_interrupts``, whether or not its own KeyboardInterrupt
    reached anyone: call before committing an output."""
    if _seen.is_set():
        raise KeyboardInterrupt


# stop_signals_held's state; main thread only: where Python runs signal handlers
_hold = {"depth": 0, "pending": False}


def stop_or_hold(signum, frame):
    """`trtspec serve`'s handler for its stop signals (SIGINT, SIGTERM, SIGHUP): KeyboardInterrupt, or, inside
    stop_signals_held, as soon as the block is left."""
    if _hold["depth"]:
        _hold["pending"] = True
        return
    raise KeyboardInterrupt


@contextmanager
def stop_signals_held():
    """Hold the stop signals back for the block (their handler, stop_or_hold, raises KeyboardInterrupt when it is
    left). Raised inside Popen.poll or Popen.wait, that KeyboardInterrupt can leave Popen's waitpid lock held
    (CPython 3.11: about one in four interrupts that land in a loop of polls), and every later wait for the process
    then hangs, so a `trtspec serve` stopped while it polls could never finish stopping. No handler is swapped:
    ``signal.signal`` runs pending handlers itself, so swapping could raise halfway through."""
    if threading.current_thread() is not threading.main_thread():  # the handler never runs here
        yield
        return
    _hold["depth"] += 1
    try:
        yield
    finally:
        if _hold["depth"] == 1 and _hold["pending"]:
            _hold["pending"] = False
            _hold["depth"] = 0
            raise KeyboardInterrupt
        _hold["depth"] -= 1
