"""A disk that fills up while `build`, `deploy` or `align` writes its output: no partial output is left, an earlier
output stays as it was, and the error is one line naming the output, the space left and the space the step needs.

The disk is filled by a write wrapper: writes into the output's temp folder (outputs.temp_sibling's
``.NAME.tmp-``) fail with ENOSPC after the first few, as on a real full disk; every other write goes through. The
engine build runs in a child process, so there the tensorrt_llm stand-in fills the disk (FAKE_TRTLLM_NO_SPACE).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from test_build import converted, workdir  # noqa: F401 - fixtures: one real conversion, copied per test

from trtspec.cli import cli
from trtspec.outputs import EDIT_RECORD, folder_bytes, format_bytes

# "<path>: the disk is full (<free> free there, this step needs about <need>); nothing was written: ..."
NO_SPACE = re.compile(
    r"^Error: (?P<path>.+): the disk is full \((?P<free>[\d.]+ \w+) free there, this step needs (?P<need>about [\d.]+ \w+|more than [\d.]+ \w+)\); nothing was written"
)


@pytest.fixture
def disk_fills(monkeypatch):
    """``arm(out, writes)``: the first ``writes`` writes into ``out``'s temp folder succeed, the next fail with
    ENOSPC (Path.write_text / write_bytes and shutil.copy2, which the writers use)."""

    def arm(out: Path, writes: int) -> None:
        left = [writes]

        def guard(path) -> None:
            if f".{out.name}.tmp-" in str(path):
                if left[0] <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                left[0] -= 1

        for name in ("write_text", "write_bytes"):
            real = getattr(Path, name)

            def wrapper(self, *args, _real=real, **kwargs):
                guard(self)
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(Path, name, wrapper)
        real_copy = shutil.copy2

        def copy2(src, dst, *args, **kwargs):
            guard(Path(dst) / Path(src).name if Path(dst).is_dir() else dst)
            return real_copy(src, dst, *args, **kwargs)

        monkeypatch.setattr(shutil, "copy2", copy2)

    return arm


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def no_space_line(result, path: Path, need: str) -> dict:
    """The command's one error line (after any progress lines), parsed; it names ``path`` and ``need`` ("about
    1.2 MiB" / "more than ...")."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    match = NO_SPACE.match(lines[0])
    assert match and match["path"] == str(path) and match["need"].startswith(need), lines[0]
    return match.groupdict()


def test_the_message_names_the_path_the_free_space_and_the_need(tmp_path, monkeypatch):
    """The one place: outputs.atomic_dir removes its temp folder before it measures the space left."""
    from trtspec.core.errors import NoSpaceError
    from trtspec.outputs import atomic_dir

    out = tmp_path / "out"
    with pytest.raises(NoSpaceError) as err, atomic_dir(out, need_bytes=3 * 2**20) as tmp:
        (tmp / "half").write_bytes(b"x" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    # the free space is whatever the disk has now (other work may change it): its format, not its value
    assert re.match(
        rf"{re.escape(str(out))}: the disk is full \([\d.]+ [KMGT]?i?B free there, this step needs about 3\.0 MiB\)",
        err.value.message,
    ), err.value.message
    assert list(tmp_path.iterdir()) == []
    # a writer in Rust (safetensors) keeps only the system's text; without an estimate, what was written is the floor
    with pytest.raises(NoSpaceError, match=r"this step needs more than 1000 B\)"), atomic_dir(out) as tmp:
        (tmp / "half").write_bytes(b"x" * 1000)
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- deploy


def write_recipe(path: Path, target: Path, draft: Path) -> Path:
    path.write_text(
        yaml.safe_dump({"name": "tiny", "target": {"model": str(target)}, "draft": {"model": str(draft)}})
    )
    return path


def test_deploy_on_a_full_disk_keeps_the_earlier_repository(runner, tmp_path, tiny_pair, disk_fills):
    recipe = write_recipe(tmp_path / "tiny.yaml", *tiny_pair)
    out = tmp_path / "repo"
    assert runner.invoke(cli, ["deploy", str(recipe), "--out", str(out)]).exit_code == 0
    before = tree_digest(out)
    disk_fills(out, writes=1)  # the first config.pbtxt is written, the next file fills the disk
    result = runner.invoke(cli, ["deploy", str(recipe), "--out", str(out)])
    files = (
        folder_bytes(out) - (out / EDIT_RECORD).stat().st_size
    )  # the estimate is of the repository's own files
    assert no_space_line(result, out, "about")["need"] == f"about {format_bytes(files)}"
    assert tree_digest(out) == before and leftovers(tmp_path) == []


# ---------------------------------------------------------------- align


@pytest.mark.slow
def test_align_on_a_full_disk_writes_no_draft_and_keeps_its_work(runner, tmp_path, disk_fills):
    from test_align import write_prompts
    from test_align import write_recipe as align_recipe

    from trtspec.builders.align import MARKER
    from trtspec.recipe import DEMO_DIR

    recipe = align_recipe(tmp_path / "r.yaml", DEMO_DIR / "draft")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / MARKER).write_text("{}")  # an earlier aligned draft, which a finished run would replace
    disk_fills(out, writes=0)  # the weights are written (by safetensors), the first other file fills the disk
    args = ["align", str(recipe), "--prompts", str(write_prompts(tmp_path / "p.jsonl", 8)), "--out", str(out),
            "--work-dir", str(work), "--epochs", "1", "--max-new-tokens", "8", "--samples", "0",
            "--no-on-policy", "--held-out", "0.25", "--validation", "0"]  # fmt: skip
    result = runner.invoke(cli, args)
    line = no_space_line(result, out, "about")
    assert line["need"] == f"about {format_bytes(folder_bytes(DEMO_DIR / 'draft'))}"
    assert [p.name for p in out.iterdir()] == [MARKER] and leftovers(tmp_path) == []
    assert (work / "state.json").is_file()  # freeing space and re-running resumes from it


# ---------------------------------------------------------------- build


@pytest.fixture
def build_pair(tmp_path, tiny_pair):
    from test_build import write_recipe as build_recipe

    target, draft = (Path(shutil.copytree(p, tmp_path / "models" / p.name)) for p in tiny_pair)
    return build_recipe(tmp_path / "tiny.yaml", target, draft)


def test_build_on_a_full_disk_leaves_no_checkpoint(runner, tmp_path, build_pair, disk_fills, monkeypatch):
    """The convert stage: its export stands in for ModelOpt's (any stack), writing the checkpoint's files one by
    one into the stage's temp folder until the disk is full."""
    from trtspec.builders import build as B
    from trtspec.builders import environment
    from trtspec.builders.export_pipeline import export_bytes
    from trtspec.recipe import load_recipe

    def export(spec, out_dir, recipe, console):
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        (out_dir / "rank0.safetensors").write_bytes(b"\0" * 4096)
        pytest.fail("the disk should have filled up")

    monkeypatch.setattr(environment, "require_conversion_stack", lambda: None)
    monkeypatch.setattr(B, "_export", export)
    engines = tmp_path / "engines"
    checkpoint = engines / "tiny" / "target" / "checkpoint"
    disk_fills(checkpoint, writes=1)
    result = runner.invoke(cli, ["build", str(build_pair), "--engines-dir", str(engines)])
    need = format_bytes(export_bytes(load_recipe(build_pair).target))  # float16: 2 bytes per parameter
    assert no_space_line(result, checkpoint, "about")["need"] == f"about {need}"
    assert not checkpoint.exists() and leftovers(engines) == []


@pytest.mark.slow
@pytest.mark.conversion
def test_an_engine_build_on_a_full_disk_keeps_the_checkpoints(runner, fake_trtllm, workdir):  # noqa: F811
    """The engine build runs in a child process: the stand-in fills the disk there after part of an engine."""
    recipe, engines = workdir / "recipes" / "tiny.yaml", workdir / "engines"
    out = engines / "tiny"
    checkpoints = {role: tree_digest(out / role / "checkpoint") for role in ("target", "draft")}
    fake_trtllm.setenv("FAKE_TRTLLM_NO_SPACE", "1")
    result = runner.invoke(cli, ["build", str(recipe), "--engines-dir", str(engines), "--engines-only"])
    need = sum(folder_bytes(out / role / "checkpoint") for role in ("target", "draft"))
    assert no_space_line(result, out, "about")["need"] == f"about {format_bytes(need)}"
    assert not (out / "target" / "engine").exists() and not (out / "draft" / "engine").exists()
    assert leftovers(out) == []
    assert {role: tree_digest(out / role / "checkpoint") for role in ("target", "draft")} == checkpoints
