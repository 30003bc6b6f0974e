"""A Ctrl-C (or a SIGTERM: `docker stop`, a supervisor) stops the command even where a library swallows it.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Inside a ``__del__`` or a
weakref callback (a tokenizer or a safetensors handle being freed during a conversion) it is printed as
"Exception ignored in ..." and lost, and the command would go on, rename its output into place and exit 0.
The handler here records every SIGINT before raising, so no output folder is renamed into place
(``outputs.replace_dir``) and the command exits 130 after one (``cli.main``). SIGTERM, whose default ends the
process at once, leaving its temp folders behind, takes the same path.
"""

from __future__ import annotations

import signal
import threading

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
