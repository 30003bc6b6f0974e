"""The stage cache of ``trtspec build``: stamps, hashes, and running a stage only when it is out of date.

Every stage writes into a hidden temporary sibling directory and is renamed into place on success, with a stamp
file (``.trtspec-stage.json``: fingerprint of its inputs, hash of its outputs, timing). A stage is skipped when
its stamp's fingerprint equals the current one and its outputs still hash to the stamp's value. An interrupted
build leaves no half-written stage; a killed one leaves only hidden ``.*.tmp-*`` directories, removed by the next
run. Hashes: files up to ``CONTENT_HASH_LIMIT`` are hashed by content, larger ones (weights, engines) by name,
size and modification time, so that checking a 100 GB model stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.core.errors import CheckpointError
from trtspec.outputs import atomic_dir, hash_file, write_file_atomic

STAMP = ".trtspec-stage.json"
CONTENT_HASH_LIMIT = 64 * 1024 * 1024  # bytes


def digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tree_hash(root: Path) -> str:
    """Hash of a directory's files (names, and content or size+mtime for large files); the stamp is excluded."""
    h = hashlib.sha256()
    root = Path(root)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != STAMP):
        stat = path.stat()
        h.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0".encode())
        if stat.st_size <= CONTENT_HASH_LIMIT:
            hash_file(h, path)
        else:
            h.update(str(stat.st_mtime_ns).encode())
    return h.hexdigest()[:16]


def read_stamp(stage_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(stage_dir) / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def up_to_date(stage_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The stage's stamp if it was made from ``fingerprint`` and its outputs are unchanged, else None."""
    stamp = read_stamp(stage_dir)
    if stamp and stamp.get("fingerprint") == fingerprint and stamp.get("output_hash") == tree_hash(stage_dir):
        return stamp
    return None


def write_json_atomic(path: Path, payload: Any, mode: int | None = None) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=str) + "\n"
    write_file_atomic(path, text, mode)


def write_stamp(stage_dir: Path, name: str, fingerprint: str, seconds: float, info: dict) -> dict[str, Any]:
    """Stamp a finished stage's directory (its outputs' hash taken now) and return the stamp."""
    stamp = {
        "stage": name,
        "fingerprint": fingerprint,
        "output_hash": tree_hash(stage_dir),
        "seconds": seconds,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "info": info,
    }
    write_json_atomic(stage_dir / STAMP, stamp)
    return stamp


def clean_stale(out_dir: Path) -> list[Path]:
    """Remove hidden temporaries left by a killed build (``.X.tmp-*`` / ``.X.old-*``)."""
    removed = []
    for pattern in (".*.tmp-*", "*/.*.tmp-*", ".*.old-*", "*/.*.old-*"):
        for path in out_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def run_stage(
    name: str,
    final: Path,
    fingerprint: str,
    work: Callable[[Path], dict],
    force: bool = False,
    need_bytes: int | None = None,
) -> dict[str, Any]:
    """Run ``work(tmp_dir) -> info`` unless ``final`` is up to date; returns the stamp (+ ``skipped``).
    ``need_bytes``: about what the stage writes, for a full disk's error."""
    stamp = None if force else up_to_date(final, fingerprint)
    if stamp is not None:
        return stamp | {"skipped": True}
    with atomic_dir(final, create=False, need_bytes=need_bytes) as tmp:
        start = time.perf_counter()
        info = work(tmp)
        if not tmp.is_dir():
            raise CheckpointError(f"stage {name} produced no output directory {tmp}")
        stamp = write_stamp(tmp, name, fingerprint, round(time.perf_counter() - start, 3), info)
    return stamp | {"skipped": False}
