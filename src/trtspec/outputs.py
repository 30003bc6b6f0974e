"""Output folders written whole: built in a temp folder beside the destination, then renamed into place.

One owner for the rule every writer of a folder follows (deploy's repository, bench's report): an existing
destination is replaced only if it is an earlier output of the same kind (it holds ``marker``); never the current
folder or one containing it; the old folder is moved aside first and removed only after the swap.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from trtspec.errors import OutputError


def check_output_dir(out: Path, marker: str, what: str, option: str) -> Path:
    """``out`` as an absolute path, or OutputError if writing ``what`` there would replace something else."""
    target = Path(out).absolute()
    here = Path.cwd().resolve()
    if target.resolve() == here or target.resolve() in here.parents:
        raise OutputError(
            f"{option} {out} is the current folder or contains it; choose a new folder for {what}"
        )
    if target.exists() and not target.is_dir():
        raise OutputError(f"{option} {out} exists and is not a folder; choose another {option}")
    if target.is_dir() and any(target.iterdir()) and not (target / marker).is_file():
        raise OutputError(f"{option} {out} exists and is not {what} (no {marker}); choose another {option}")
    _check_parent(target, out, option)
    return target


def check_output_file(path: Path, option: str) -> None:
    """OutputError now, before any work, if a file cannot be written at ``path`` (a file where a folder is
    needed, a folder where the file should be, or a folder this user may not write)."""
    target = Path(path).absolute()
    if target.is_dir():
        raise OutputError(f"{option} {path} is a folder; pass a file path")
    _check_parent(target, path, option)


def _check_parent(target: Path, path, option: str) -> None:
    """The nearest existing folder above ``target`` is a folder this user may write."""
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: {folder} is a file, not a folder; choose another {option}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: {folder} is not writable; choose another {option}")


def write_output_dir(out: Path, marker: str, what: str, option: str, fill: Callable[[Path], None]) -> Path:
    """``fill(tmp)`` writes the folder's files into a temp folder that then replaces ``out``; nothing of it is
    left behind if ``fill`` or the swap fails."""
    target = check_output_dir(out, marker, what, option)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
