"""Output folders (trtspec.outputs): replaced only when they are an earlier output of the same kind."""

from __future__ import annotations

import os

import pytest

from trtspec.core.errors import OutputError
from trtspec.outputs import EDIT_RECORD, check_output_dir, write_output_dir


def _fill(tmp):
    (tmp / "report.json").write_text("{}")
    (tmp / "sub").mkdir()
    (tmp / "sub" / "config.txt").write_text("written")


def _write(out, fill=_fill, force=False):
    return write_output_dir(out, "report.json", "a report", "--out", fill, force=force)


def test_writes_a_new_folder_and_replaces_an_earlier_one_whole(tmp_path):
    out = tmp_path / "a" / "b"
    assert _write(out) == out.absolute()
    (out / "sub" / "__pycache__").mkdir()  # what a served model.py leaves: not the user's
    (out / "sub" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    (out / "report.json").unlink()  # a file the user removed is not lost by a rerun
    (out / "report.json").write_text("{}")
    _write(out, lambda tmp: (tmp / "report.json").write_text('{"new": 1}'))
    assert sorted(p.name for p in out.iterdir()) == [EDIT_RECORD, "report.json"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]  # no temp or old folder left


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ("change", "sub/config.txt was changed since trtspec wrote it; "),
        ("add", "notes.md was added since trtspec wrote it; "),
        ("both", "notes.md was added since trtspec wrote it (1 more file changed or added); "),
        ("record", f"{EDIT_RECORD}, trtspec's record of the files it wrote there, cannot be read; "),
        ("file link", "linked.txt was added since trtspec wrote it; "),
        ("folder link", "sub/elsewhere was added since trtspec wrote it; "),
    ],
)
def test_a_rerun_keeps_files_edited_or_added_since_and_names_them_unless_forced(tmp_path, edit, says):
    """A tuned config or an overlay's patch in an earlier output is never lost to a rerun without --force."""
    out = tmp_path / "out"
    _write(out)
    if edit in ("change", "both"):
        (out / "sub" / "config.txt").write_text("tuned by hand")
    if edit in ("add", "both"):
        (out / "notes.md").write_text("mine")
    if edit == "record":
        (out / EDIT_RECORD).write_text("[not what trtspec wrote")
    if edit == "file link":  # a link the rerun would remove, even to a file of the same bytes
        (out / "linked.txt").symlink_to(out / "report.json")
    if edit == "folder link":  # never followed: a linked folder's files are not the output's
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "weights.bin").write_bytes(b"w")
        (out / "sub" / "elsewhere").symlink_to(tmp_path / "data", target_is_directory=True)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(OutputError) as err:
        _write(out)
    assert (
        str(err.value)
        == f"--out {out}: {says}move what you want to keep out of the folder, or pass --force to replace it"
    )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["data", "out"] if edit == "folder link" else ["out"]
    )
    _write(out, force=True)
    assert (out / "sub" / "config.txt").read_text() == "written" and not (out / "notes.md").exists()
    assert not (out / "linked.txt").is_symlink() and not (out / "sub" / "elsewhere").is_symlink()
    _write(out)  # as written again: a plain rerun replaces it


def test_a_removed_file_is_no_edit_and_an_unreadable_one_is_named(tmp_path, monkeypatch):
    """Writing a removed file again loses nothing; a file that cannot be read cannot be vouched for (as root,
    file modes do not stop a read, so the read itself fails here)."""
    from trtspec import outputs

    out = tmp_path / "out"
    _write(out)
    (out / "sub" / "config.txt").unlink()
    _write(out)
    assert (out / "sub" / "config.txt").read_text() == "written"
    real = outputs._digest

    def digest(path):
        if path.name == "config.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(outputs, "_digest", digest)
    with pytest.raises(OutputError, match=r"out: sub/config.txt cannot be read; move what you want"):
        _write(out)
    monkeypatch.undo()
    _write(out, force=True)


def test_an_earlier_output_without_an_edit_record_is_replaced_as_it_is(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("{}")
    (out / "stale.txt").write_text("from a run that kept no record")
    _write(out)
    assert sorted(p.name for p in out.iterdir()) == [EDIT_RECORD, "report.json", "sub"]


def test_a_failed_move_into_place_brings_the_previous_output_back(tmp_path, monkeypatch):
    """Between replace_dir's two renames the previous output sits under a hidden name: an interrupt or a failed
    rename there restores it."""
    out = tmp_path / "out"
    _write(out)
    real = type(out).rename

    def rename(self, target):
        if self.name.startswith(".out.tmp-"):
            raise KeyboardInterrupt
        return real(self, target)

    monkeypatch.setattr(type(out), "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        _write(out, fill=lambda tmp: (tmp / "report.json").write_text('{"new": 1}'))
    assert (out / "report.json").read_text() == "{}" and (out / "sub" / "config.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


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
def test_refuses_the_current_folder_and_its_parents_even_if_they_look_like_outputs(
    tmp_path, monkeypatch, where
):
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
    assert sorted(os.listdir(out)) == [EDIT_RECORD, "report.json", "sub"]


def test_a_failed_write_removes_the_folders_it_made_for_its_output_and_only_those(tmp_path):
    from trtspec.outputs import atomic_dir

    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "kept" / "new" / "deeper" / "out") as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not any((tmp_path / "kept").iterdir())


def test_a_finished_folder_gets_plain_modes_and_keeps_an_executable(tmp_path):
    from trtspec.outputs import atomic_dir

    umask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            for name, mode in (("weights.safetensors", 0o600), ("run.sh", 0o755), ("sub/deep.bin", 0o600)):
                (tmp / name).parent.mkdir(exist_ok=True)
                (tmp / name).write_bytes(b"x")
                (tmp / name).chmod(mode)
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert modes == {"weights.safetensors": 0o644, "run.sh": 0o755, "deep.bin": 0o644}


def test_a_report_file_is_checked_before_any_work(tmp_path):
    from trtspec.outputs import check_output_file

    check_output_file(tmp_path / "new" / "deeper" / "report.md", "--report")  # folders are created later
    (tmp_path / "plain").write_text("")
    with pytest.raises(OutputError, match=r"--report .*plain is a file, not a folder"):
        check_output_file(tmp_path / "plain" / "report.md", "--report")
    with pytest.raises(OutputError, match="is a folder; pass a file path"):
        check_output_file(tmp_path, "--report")


def test_an_output_file_that_is_one_of_the_runs_inputs_is_refused(tmp_path):
    """validate --report and bench --write-recipe must not write over the prompts or the recipe they read."""
    from trtspec.outputs import check_output_file

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    inputs = {"RECIPE": "demo", "--prompts": prompts}
    with pytest.raises(OutputError, match=r"--report .*p.jsonl is the --prompts file this run reads"):
        check_output_file(tmp_path / "sub" / ".." / "p.jsonl", "--report", inputs)
    check_output_file(tmp_path / "report.md", "--report", inputs)
    check_output_file(tmp_path / "report.md", "--report", {"--prompts": None})


def test_an_output_folder_below_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "plain").write_text("")
    with pytest.raises(OutputError, match=r"plain is a file, not a folder"):
        check_output_dir(tmp_path / "plain" / "out", "report.json", "a report", "--out")


@pytest.mark.one_stack  # the command line's own error path, in a subprocess: the same on either transformers
def test_the_command_line_reports_a_refused_path_in_one_line(tiny_pair, tmp_path):
    """A path the system refuses while the output is written reaches the user as one line naming it and exit 2,
    not a traceback; here the folder check is disabled so that the system refuses the path itself."""
    import subprocess
    import sys

    from test_validate import write_recipe

    recipe = write_recipe(tmp_path / "tiny.yaml", *tiny_pair)
    (tmp_path / "plain").write_text("")
    argv = ["deploy", str(recipe), "--runtime", "torch", "--out", str(tmp_path / "plain" / "repo")]
    script = (
        "import sys, trtspec.outputs as o; o._check_parent = lambda *a: None\n"
        f"from trtspec.cli import main; sys.argv = ['trtspec']; main({argv!r})"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "plain") in lines[0] and lines[0].startswith("Error: ")
    assert (
        str(tmp_path / "plain" / "repo") in lines[0] and ".tmp-" not in lines[0]
    )  # the user's path, not ours


def test_a_path_refused_at_write_time_is_named_as_the_user_gave_it(tmp_path):
    """Where the up-front check cannot see it (root passes os.access everywhere, and /proc refuses only at write
    time; here a file where a folder is needed), the error names the output, not the hidden temp path beside it."""
    from trtspec.outputs import atomic_dir, write_file_atomic

    (tmp_path / "plain").write_text("")
    with pytest.raises(
        OutputError, match=r"plain/r.md: cannot be written there \(.*plain is a file, not a folder\)"
    ) as err:
        write_file_atomic(tmp_path / "plain" / "r.md", "x")
    assert ".tmp-" not in str(err.value)
    with (
        pytest.raises(OutputError, match=r"plain/out: cannot be written there") as err,
        atomic_dir(tmp_path / "plain" / "out"),
    ):
        pass
    assert ".tmp-" not in str(err.value) and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_write_file_atomic_sets_the_mode_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    import stat

    from trtspec.core.errors import NoSpaceError
    from trtspec.outputs import write_file_atomic

    script = write_file_atomic(tmp_path / "run.sh", "#!/bin/sh\n", mode=0o755)
    assert script.read_text() == "#!/bin/sh\n" and stat.S_IMODE(script.stat().st_mode) == 0o755
    report = tmp_path / "report.md"
    report.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(
        NoSpaceError, match=rf"^{report}: the disk is full \(.* free there, this step needs about 3 B\)"
    ):
        write_file_atomic(report, "new")
    assert report.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "run.sh"]


def test_main_turns_an_os_error_with_a_path_into_one_line(monkeypatch, capsys):
    """The last net (trtspec.cli.main) for a path the system refused outside the output writers."""
    from trtspec import cli as cli_module

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/srv/models/t")

    monkeypatch.setattr(cli_module.cli, "main", refuse)
    with pytest.raises(SystemExit) as exit_:
        cli_module.main(["check", "demo"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["Error: /srv/models/t: Permission denied; check the path and its permissions"]


def run_as_from_a_terminal(script: str):
    """``python -c script`` with Python's own SIGINT handler, as a command typed at a terminal has it: a test
    session started in the background of a non-interactive shell ignores SIGINT, its children inherit that, and
    Python leaves an ignored SIGINT ignored (so the interrupt these tests send would never arrive). The script
    sets the handler itself, before trtspec is imported (no preexec_fn in a process with threads)."""
    import subprocess
    import sys

    terminal = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return subprocess.run(
        [sys.executable, "-c", terminal + script], capture_output=True, text=True, timeout=300
    )


# The command line's own handling of an interrupt, in subprocesses: the same on either transformers release, so
# on the pinned stack only (one_stack).
@pytest.mark.one_stack
@pytest.mark.parametrize(("swallowed", "signum"), [(True, "SIGINT"), (False, "SIGINT"), (True, "SIGTERM")])
def test_a_ctrl_c_a_library_swallows_still_stops_the_command(tiny_pair, tmp_path, swallowed, signum):
    """A SIGINT that lands in a ``__del__`` is printed as "Exception ignored" and lost to the command; the
    command must still exit 130 without renaming its output into place (here deploy's repository, whose last
    step before the rename frees such an object). Without the swallow the same run writes the repository.
    SIGTERM (`docker stop`, a supervisor) takes the same path, where its default would end the process at once."""

    from test_validate import write_recipe

    recipe = write_recipe(tmp_path / "tiny.yaml", *tiny_pair)
    out = tmp_path / "repo"
    argv = ["deploy", str(recipe), "--runtime", "torch", "--out", str(out)]
    script = (
        "import os, signal, sys, time, trtspec.outputs as o\n"
        "class Handle:\n"
        "    def __del__(self):\n"
        f"        os.kill(os.getpid(), signal.{signum}); time.sleep(0.5)\n"
        "real = o.plain_modes\n"
        "def plain_modes(folder):\n"
        f"    if {swallowed}: Handle()\n"
        "    real(folder)\n"
        "o.plain_modes = plain_modes\n"
        f"from trtspec.cli import main; sys.argv = ['trtspec']; main({argv!r})"
    )
    proc = run_as_from_a_terminal(script)
    if not swallowed:
        assert proc.returncode == 0, proc.stderr
        assert (out / "trtspec.json").is_file()
        return
    assert "Exception ignored" in proc.stderr and "KeyboardInterrupt" in proc.stderr  # the library lost it
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.rstrip().endswith("Interrupted.")
    assert not out.exists()
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".repo.")
    ]  # no temp folder left either


@pytest.mark.one_stack
def test_a_ctrl_c_a_library_swallows_ends_a_command_that_writes_nothing_as_an_interrupt(tiny_pair, tmp_path):
    """`check` commits no output and leaves through its own sys.exit, so only main's own check, after whatever
    the command returned or raised, turns the lost interrupt into exit 130 (it exited with check's status)."""

    from test_validate import write_recipe

    recipe = write_recipe(tmp_path / "tiny.yaml", *tiny_pair)
    script = (
        "import os, signal, sys, time, trtspec.core.model_dir as m\n"
        "class Handle:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT); time.sleep(0.5)\n"
        "real, calls = m.read_hf_config, []\n"
        "def read_hf_config(path):\n"
        "    if not calls: calls.append(Handle())\n"
        "    calls[:] = [None]\n"
        "    return real(path)\n"
        "m.read_hf_config = read_hf_config\n"
        f"from trtspec.cli import main; sys.argv = ['trtspec']; main(['check', {str(recipe)!r}])"
    )
    proc = run_as_from_a_terminal(script)
    assert "Exception ignored" in proc.stderr and "KeyboardInterrupt" in proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.rstrip().endswith("Interrupted.")
