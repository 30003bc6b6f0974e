"""Output folders written whole: built in a temp folder beside the destination, then renamed into place.

The one owner of the swap every folder writer uses (``replace_dir``, ``atomic_dir``: build stages, checkpoints,
HF exports, deploy's repository, bench's report): the old folder is moved aside first and removed only after the
rename. Single files are written whole the same way (``write_file_atomic``: a temp file beside, then a rename).
For folders a user names with an option (``write_output_dir``): an existing destination is replaced only if it is
an earlier output of the same kind (it holds ``marker``), never the current folder or one containing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from trtspec.core.errors import OutputError


def check_output_dir(out: Path, marker: str, what: str, option: str) -> Path:
    """``out`` as an absolute path, or OutputError if writing ``what`` there would replace something else."""
    target = Path(out).absolute()
    here, resolved = Path.cwd().resolve(), target.resolve()
    if resolved == here or resolved in here.parents:
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


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished folder into place; the previous one (if any) is removed only after the rename."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def temp_sibling(final: Path) -> Path:
    """A hidden, unique path beside ``final`` (``.NAME.tmp-PID-XXXXXXXX``; a killed build's are swept by
    ``builders.stage_cache.clean_stale``)."""
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_dir(out_dir: Path, create: bool = True) -> Iterator[Path]:
    """Yield a temp folder beside ``out_dir`` (``create`` False: a path not yet made, for a tool that creates its
    own output folder); on success it replaces ``out_dir``, on any failure (an interrupt included) it is removed,
    so a half-written folder never exists under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(out_dir)
    if create:
        tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_file_atomic(path: Path | str, data: str | bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` through a temp file beside it and a rename: never a half-written file.
    ``mode``: permissions to set (default: the umask's, like any new file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_output_dir(out: Path, marker: str, what: str, option: str, fill: Callable[[Path], None]) -> Path:
    """``fill(tmp)`` writes the folder's files into a temp folder that then replaces ``out``; nothing of it is
    left behind if ``fill`` or the swap fails."""
    target = check_output_dir(out, marker, what, option)
    with atomic_dir(target) as tmp:
        fill(tmp)
    return target
