"""Output folders (trtspec.outputs): replaced only when they are an earlier output of the same kind."""

from __future__ import annotations

import os

import pytest

from trtspec.errors import OutputError
from trtspec.outputs import check_output_dir, write_output_dir


def _fill(tmp):
    (tmp / "report.json").write_text("{}")


def _write(out):
    return write_output_dir(out, "report.json", "a report", "--out", _fill)


def test_writes_a_new_folder_and_replaces_an_earlier_one_whole(tmp_path):
    out = tmp_path / "a" / "b"
    assert _write(out) == out.absolute()
    (out / "stale.txt").write_text("from the earlier run")
    _write(out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]  # no temp or old folder left


def test_an_empty_existing_folder_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "empty")
    assert (tmp_path / "empty" / "report.json").is_file()


@pytest.mark.parametrize("kind", ["foreign folder", "file"])
def test_refuses_to_replace_what_is_not_an_earlier_output(tmp_path, kind):
    out = tmp_path / "mine"
    if kind == "file":
        out.write_text("keep me")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match=r"--out .*mine exists and is not"):
        _write(out)
    kept = out if kind == "file" else out / "notes.txt"
    assert kept.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@pytest.mark.parametrize("where", [".", ".."])
def test_refuses_the_current_folder_and_its_parents_even_if_they_look_like_outputs(tmp_path, monkeypatch, where):
    here = tmp_path / "work"
    here.mkdir()
    (here / "report.json").write_text("{}")
    (tmp_path / "report.json").write_text("{}")
    monkeypatch.chdir(here)
    with pytest.raises(OutputError, match="is the current folder or contains it"):
        check_output_dir(where, "report.json", "a report", "--out")
    assert (here / "report.json").is_file() and (tmp_path / "report.json").is_file()


def test_a_failing_fill_leaves_nothing_behind_and_keeps_the_earlier_output(tmp_path):
    out = tmp_path / "out"
    _write(out)

    def broken(tmp):
        (tmp / "half.json").write_text("{")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_output_dir(out, "report.json", "a report", "--out", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(os.listdir(out)) == ["report.json"]
