"""A results folder belongs to one run (or one sweep with its jobs) at a time: a second run
into it is refused in one line and changes nothing there; the lock ends with its process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import fnsysid
from fnsysid.results.folder import LOCK, FolderInUse, lock_folder
from tests.conftest import ROOT, cli_in_process

QUIET = ["progress=false", "output.plot=false", "repeats=1", "R=2"]
SMALL = {"system": "synthetic", "M": 3, "R": 2, "repeats": 1, "progress": False}

#: a process that takes the lock of the folder argv[1], says so and waits
HOLD = ("import sys; from pathlib import Path; from fnsysid.results.folder import lock_folder; "
        "lock = lock_folder(Path(sys.argv[1]), 'x'); print('locked', flush=True); "
        "sys.stdin.read()")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def earlier_run(folder: Path) -> None:
    """The files of a run at work in ``folder`` (as Hydra and the run write them)."""
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text("M: 50\n")
    (folder / "run.log").write_text("[INFO] round 17\n")
    (folder / "errors.csv").write_text("repeat,round,e_max\n0,0,1.0\n")


def in_use(key: str, folder: Path, pid: int) -> str:
    return (f"fnsysid: error: {key}={folder}: in use by another run (pid {pid}); wait for it "
            "to end, or choose another folder\n")


def test_a_run_into_a_folder_another_process_holds_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "x"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == "locked\n"
        earlier_run(out)
        before = snapshot(out)
        res = cli_in_process("M=5", *QUIET, f"hydra.run.dir={out}", "output.overwrite=true")
        assert (res.returncode, res.stderr) == (2, in_use("hydra.run.dir", out, holder.pid))
        assert snapshot(out) == before                  # not a byte of the first run changed
    finally:
        holder.kill()               # SIGKILL: the system gives the lock up with the process
        holder.wait()
    res = cli_in_process("M=5", *QUIET, f"hydra.run.dir={out}", "output.overwrite=true")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "summary.json").read_text())["M"] == 5
    assert not (out / LOCK).exists()                    # given up when the run ended


def test_a_run_into_a_folder_this_process_holds_is_refused(tmp_path):
    """The lock is per call, not per process: a held lock refuses the command line run in the
    same process too; once given up, the folder takes a run (no earlier results: no
    output.overwrite needed, the lock file does not count as a run)."""
    out = tmp_path / "runs" / "x"
    with lock_folder(out, "x"):
        assert (out / LOCK).read_text() == f"{os.getpid()}\n"
        res = cli_in_process("M=5", *QUIET, f"hydra.run.dir={out}")
        assert (res.returncode, res.stderr) == (2, in_use("hydra.run.dir", out, os.getpid()))
        assert sorted(p.name for p in out.iterdir()) == [LOCK]
    assert not (tmp_path / "runs").exists()      # the folders the lock made, given back
    res = cli_in_process("M=5", *QUIET, f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr


def test_a_sweep_into_a_sweep_folder_in_use_is_refused_and_its_jobs_write_under_the_lock(
        tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "M=1,2", *QUIET, "hydra/launcher=basic", f"hydra.sweep.dir={sweep}"]
    with lock_folder(sweep, "x"):
        earlier_run(sweep / "M=1")
        before = snapshot(sweep)
        for more in ("output.overwrite=true", "output.resume=true"):
            res = cli_in_process(*args, more)
            assert (res.returncode, res.stderr) == (2, in_use("hydra.sweep.dir", sweep,
                                                              os.getpid()))
            assert snapshot(sweep) == before            # no multirun.yaml, no job touched
    shutil.rmtree(sweep / "M=1")
    res = cli_in_process(*args, "output.overwrite=true")    # the sweep holds the lock, and
    assert res.returncode == 0, res.stderr                  # its jobs write their folders
    assert pd.read_csv(sweep / "results.csv").groupby("M").size().to_dict() == {1: 3, 2: 3}
    assert not (sweep / LOCK).exists()


def test_python_api_refuses_an_output_dir_in_use_and_leaves_no_folder_it_made(tmp_path):
    out = tmp_path / "out"
    with lock_folder(out, "x"):
        earlier_run(out)
        before = snapshot(out)
        with pytest.raises(fnsysid.ConfigError) as info:
            fnsysid.run({**SMALL, "output.overwrite": True}, output_dir=out)
        assert str(info.value) == (f"output_dir={out}: in use by another run (pid "
                                   f"{os.getpid()}); wait for it to end, or choose another "
                                   "folder")
        assert snapshot(out) == before
    res = fnsysid.run({**SMALL, "output.overwrite": True}, output_dir=out)
    assert json.loads((out / "summary.json").read_text())["final_e_max_mean"] == \
        pytest.approx(res.summary["final_e_max_mean"])
    assert not (out / LOCK).exists()
    # refused inside the run (bad data, found when it is read): the folder made for it is gone
    new = tmp_path / "new" / "out"
    with pytest.raises(fnsysid.DataError):
        fnsysid.run({"system": "generic", "data": "files", "data.path": str(tmp_path / "none"),
                     "data.states": ["x1"]}, output_dir=new)
    assert not (tmp_path / "new").exists()


def test_lock_folder_refuses_a_second_holder_until_the_first_gives_up(tmp_path):
    first = lock_folder(tmp_path, "hydra.run.dir=here")
    with pytest.raises(FolderInUse, match=rf"^hydra.run.dir=here: in use by another run \(pid "
                                          rf"{os.getpid()}\)"):
        lock_folder(tmp_path, "hydra.run.dir=here")
    assert (tmp_path / LOCK).exists()           # the refused call leaves the holder's file
    first.release()
    first.release()                             # once only
    assert list(tmp_path.iterdir()) == []       # an existing folder stays, without the lock
    with lock_folder(tmp_path, "again"):
        pass


@pytest.mark.slow
def test_sweep_jobs_in_worker_processes_write_under_their_sweeps_lock(tmp_path):
    """joblib's workers are other processes; they write their job folders while the command
    that started them holds the sweep folder, and a second command is refused meanwhile."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", "M=1,2", *QUIET,
           "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(sweep / "results.csv")) == 6 and not (sweep / LOCK).exists()
