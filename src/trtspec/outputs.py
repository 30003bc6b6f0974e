"""Output folders written whole: built in a temp folder beside the destination, then renamed into place.

The one owner of the swap every folder writer uses (``replace_dir``, ``atomic_dir``: build stages, checkpoints,
HF exports, deploy's repository, bench's report): the old folder is moved aside first and removed only after the
rename. Single files are written whole the same way (``write_file_atomic``: a temp file beside, then a rename).
For folders a user names with an option (``write_output_dir``): an existing destination is replaced only if it is
an earlier output of the same kind (it holds ``marker``), never the current folder or one containing it, and only
if every file in it is as trtspec wrote it (``EDIT_RECORD``: path -> sha256, written with the folder). A file a
user edited or added there (an overlay's patch, a tuned config.pbtxt) is not lost to a rerun: the rerun stops and
names it, unless the command was told to replace it (``force``).

A Ctrl-C that a library swallowed while a folder was written still stops its rename (core/interrupts.py): a
``__del__`` it cut short may not have flushed its file. Single files are left to commit: they are whole, and
an interrupted training run writes its resume point with them.

A disk that fills up while an output is written is one NoSpaceError naming the output, the space left and the
space the step needs (``need_bytes``, the writer's estimate), after the partial output is removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from trtspec.core.errors import EditedOutput, NoSpaceError, OutputError
from trtspec.core.interrupts import raise_if_interrupted

# A full disk or a full quota. Writers in C++ or Rust (safetensors) raise their own types and keep only the
# system's message, so it is matched as text too.
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXTS = ("No space left on device", "Disk quota exceeded")

EDIT_RECORD = ".trtspec-files.json"
UNREADABLE = "unreadable"


def check_output_dir(out: Path, marker: str, what: str, option: str, force: bool = False) -> Path:
    """``out`` as an absolute path, or OutputError if writing ``what`` there would replace something else:
    another kind of folder, or (unless ``force``) files edited or added since trtspec wrote it (EditedOutput)."""
    target = Path(out).absolute()
    here, resolved = Path.cwd().resolve(), target.resolve()
    if resolved == here or resolved in here.parents:
        raise OutputError(
            f"{option} {out} is the current folder or contains it; choose a new folder for {what}"
        )
    # the folder is replaced by a rename, which would replace the link, not its folder
    if target.is_symlink():
        raise OutputError(f"{option} {out} is a symbolic link; pass the folder it points to, {resolved}")
    if target.exists() and not target.is_dir():
        raise OutputError(f"{option} {out} exists and is not a folder; choose another {option}")
    if target.is_dir() and any(target.iterdir()) and not (target / marker).is_file():
        raise OutputError(f"{option} {out} exists and is not {what} (no {marker}); choose another {option}")
    edits = [] if force or not target.is_dir() else edited_files(target)
    if edits:
        (path, how), more = edits[0], len(edits) - 1
        others = f" ({more} more file{'s' if more > 1 else ''} changed or added)" if more else ""
        raise EditedOutput(
            f"{option} {out}: {_edit_text(path, how)}{others}; move what you want to keep out of the folder, "
            "or pass --force to replace it"
        )
    _check_parent(target, out, option)
    return target


def _edit_text(path: str, how: str) -> str:
    if path == EDIT_RECORD:
        return f"{EDIT_RECORD}, trtspec's record of the files it wrote there, cannot be read"
    return f"{path} cannot be read" if how == UNREADABLE else f"{path} was {how} since trtspec wrote it"


def _entries(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """What an output folder holds, by path inside it: every file and every symbolic link (to a file or a
    folder; not followed), leaving out the edit record and Python's bytecode caches (Triton's python backend
    writes them beside a served model.py); and the folders that could not be listed."""
    entries, unlisted = {}, []

    def unreadable(err: OSError) -> None:
        unlisted.append(Path(err.filename).relative_to(folder).as_posix())

    for top, dirs, files in os.walk(folder, onerror=unreadable):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = Path(top, name)
            entries[path.relative_to(folder).as_posix()] = path
    entries.pop(EDIT_RECORD, None)
    return entries, unlisted


def hash_file(digest, path: Path | str):
    """``digest`` (a hashlib object) updated with the bytes of the file at ``path``, read in chunks (weights and
    prompt files may be large); returns ``digest``."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest


def _digest(path: Path) -> str:
    """A link's target, or the sha256 of a file's bytes."""
    if path.is_symlink():
        return f"link:{os.readlink(path)}"
    return hash_file(hashlib.sha256(), path).hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """The edit record of a folder trtspec has just written: each entry (``_entries``) -> its digest."""
    return {name: _digest(path) for name, path in sorted(_entries(Path(folder))[0].items())}


def edited_files(folder: Path) -> list[tuple[str, str]]:
    """The entries of an earlier output that are not as trtspec wrote them, in path order: (path, "changed",
    "added" or UNREADABLE). A folder with no edit record (written before trtspec kept one) has none; an unreadable
    record is itself one. A removed file is not: nothing of the user's is lost by writing it again."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / EDIT_RECORD).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return [(EDIT_RECORD, UNREADABLE)]
    if not isinstance(recorded, dict):
        return [(EDIT_RECORD, UNREADABLE)]
    entries, unlisted = _entries(folder)
    edits = [(name, UNREADABLE) for name in unlisted]
    for name, path in sorted(entries.items()):
        if name not in recorded:
            edits.append((name, "added"))  # no need to read it
            continue
        try:
            same = _digest(path) == recorded[name]
        except OSError:
            edits.append((name, UNREADABLE))
            continue
        if not same:
            edits.append((name, "changed"))
    return sorted(edits)


def check_output_file(path: Path, option: str, inputs: Mapping[str, Path | str | None] | None = None) -> None:
    """OutputError now, before any work, if a file cannot be written at ``path`` (a file where a folder is
    needed, a folder where the file should be, a folder this user may not write, or one of the run's ``inputs``:
    the option or argument that names it -> its path)."""
    target = Path(path).absolute()
    if target.is_dir():
        raise OutputError(f"{option} {path} is a folder; pass a file path")
    for name, source in (inputs or {}).items():
        if source is not None and Path(source).is_file() and Path(source).resolve() == target.resolve():
            raise OutputError(f"{option} {path} is the {name} file this run reads; choose another {option}")
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
    raise_if_interrupted()
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
    try:
        tmp.rename(final)
    except BaseException:  # an interrupt or a failed rename between the two: the previous folder comes back
        if old is not None:
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def temp_sibling(final: Path) -> Path:
    """A hidden, unique path beside ``final`` (``.NAME.tmp-PID-XXXXXXXX``; a killed build's are swept by
    ``builders.stage_cache.clean_stale``)."""
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_dir(out_dir: Path, create: bool = True, need_bytes: int | None = None) -> Iterator[Path]:
    """Yield a temp folder beside ``out_dir`` (``create`` False: a path not yet made, for a tool that creates its
    own output folder); on success it replaces ``out_dir``, on any failure (an interrupt included) it is removed,
    so a half-written folder never exists under ``out_dir``. A full disk is a NoSpaceError naming ``out_dir`` and
    ``need_bytes``, the writer's estimate of the whole output."""
    out_dir = Path(out_dir)
    tmp = temp_sibling(out_dir)
    made = _missing_parents(out_dir)
    done = False
    try:
        try:
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            if create:
                tmp.mkdir()
        except OSError as err:
            raise _unwritable(out_dir, err, need_bytes) from None
        try:
            yield tmp
            plain_modes(tmp)
            replace_dir(tmp, out_dir)
            done = True
        except Exception as err:
            if not is_disk_full(err):
                raise
            written = folder_bytes(tmp)
            # before measuring: its space is free again for the next try
            shutil.rmtree(tmp, ignore_errors=True)
            raise no_space_error(
                out_dir, need_bytes or getattr(err, "need_bytes", None), written, err
            ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            for folder in made:  # the folders made for it, innermost first, while nothing else is in them
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, innermost first."""
    missing, folder = [], path.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def plain_modes(folder: Path) -> None:
    """Files under ``folder`` left with a temp file's private mode (0600: safetensors and ModelOpt write through
    temp files) get the mode of any new file under this umask, so a server running as another user can read
    them; other modes (an executable script's) are kept."""
    umask = os.umask(0)
    os.umask(umask)
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600:
            # a file of another owner keeps its mode; the output still lands
            with contextlib.suppress(OSError):
                path.chmod(0o666 & ~umask)


def write_file_atomic(path: Path | str, data: str | bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` through a temp file beside it and a rename: never a half-written file.
    ``mode``: permissions to set (default: the umask's, like any new file)."""
    path = Path(path)
    tmp = temp_sibling(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(payload)
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):  # there may be no folder to hold it
            tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise no_space_error(path, len(payload), 0, err) from None
        if isinstance(err, OSError):
            raise _unwritable(path, err, len(payload)) from None
        raise
    return path


def _unwritable(path: Path, err: OSError, need_bytes: int | None) -> OutputError:
    """The user's path, not the hidden temp one beside it that the system named (a full disk has its own)."""
    if is_disk_full(err):
        return no_space_error(path, need_bytes, 0, err)
    missing = _missing_parents(path)
    folder = (missing[-1] if missing else path).parent  # the nearest folder that exists
    why = f"{folder} is a file, not a folder" if folder.is_file() else err.strerror or str(err)
    return OutputError(f"{path}: cannot be written there ({why}); choose another path", detail=f"{err!r}")


def write_output_dir(
    out: Path,
    marker: str,
    what: str,
    option: str,
    fill: Callable[[Path], None],
    need_bytes: int | None = None,
    force: bool = False,
) -> Path:
    """``fill(tmp)`` writes the folder's files into a temp folder that then replaces ``out``; nothing of it is
    left behind if ``fill`` or the swap fails. ``need_bytes``: the folder's estimated size, for a full disk's
    error. ``force``: replace files a user edited or added in an earlier output (check_output_dir)."""
    target = check_output_dir(out, marker, what, option, force)
    with atomic_dir(target, need_bytes=need_bytes) as tmp:
        fill(tmp)
        (tmp / EDIT_RECORD).write_text(json.dumps(file_digests(tmp), indent=1, sort_keys=True) + "\n")
    return target


# ---------------------------------------------------------------- a full disk


def is_disk_full(err: BaseException | None) -> bool:
    """Whether ``err``, or an error it was raised from, is a full disk or quota."""
    for _ in range(8):  # the chain of causes is short; a bound keeps a cycle from looping
        if err is None:
            return False
        if isinstance(err, NoSpaceError) or (isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS):
            return True
        if any(text in str(err) for text in NO_SPACE_TEXTS):
            return True
        err = err.__cause__ or err.__context__
    return False


def no_space_error(
    path: Path, need_bytes: int | None, written_bytes: int = 0, cause: BaseException | None = None
) -> NoSpaceError:
    """The one line for a full disk while writing ``path``: the space left there now and what the step needs
    (``need_bytes``, else at least what it had written when the disk filled)."""
    free = shutil.disk_usage(_nearest_folder(Path(path))).free
    need = f"about {format_bytes(need_bytes)}" if need_bytes else f"more than {format_bytes(written_bytes)}"
    return NoSpaceError(
        f"{path}: the disk is full ({format_bytes(free)} free there, this step needs {need}); nothing was "
        "written: free some space or choose another folder",
        need_bytes,
        detail=None if cause is None else f"{type(cause).__name__}: {cause}",
    )


def folder_bytes(path: Path | str) -> int:
    """The size of the files under ``path`` (of ``path`` itself for a file); 0 when it does not exist."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def format_bytes(size: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while size >= 1024 and power < len(units) - 1:
        size, power = size / 1024, power + 1
    return f"{size:.0f} B" if power == 0 else f"{size:.1f} {units[power]}"


def _nearest_folder(path: Path) -> Path:
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder
