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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def inside(key: str, folder: Path, held: Path, pid: int) -> str:
    """The refusal of ``folder`` because a run holds ``held`` above or below it."""
    where = f"{held} inside it" if folder in held.parents else str(held)
    return (f"fnsysid: error: {key}={folder}: in use by another run (pid {pid}, which writes "
            f"into {where}); wait for it to end, or choose another folder\n")


@pytest.mark.slow
def test_a_folder_inside_or_around_a_folder_in_use_is_refused(tmp_path):
    """A sweep's folder holds its job folders: a run into a job folder or any other folder
    below it, a sweep into a sub-folder, a sweep into a folder around it and a Python call
    into a job folder are refused, in one line naming the folder in use; nothing is
    written."""
    sweep = tmp_path / "s3"
    job = sweep / "M=20000,R=10000"
    with lock_folder(sweep, "x"):
        earlier_run(job)
        before = snapshot(tmp_path)
        for args, key, folder in [
            ([f"hydra.run.dir='{job}'", "output.overwrite=true"], "hydra.run.dir", job),
            ([f"hydra.run.dir={sweep}/extra"], "hydra.run.dir", sweep / "extra"),
            (["-m", "M=1,2", f"hydra.sweep.dir={sweep}/sub"], "hydra.sweep.dir", sweep / "sub"),
            (["-m", "M=1,2", f"hydra.sweep.dir={tmp_path}", "output.overwrite=true"],
             "hydra.sweep.dir", tmp_path),
        ]:
            res = cli_in_process("M=1", *QUIET, "hydra/launcher=basic", *args)
            assert (res.returncode, res.stderr) == (2, inside(key, folder, sweep, os.getpid()))
            assert snapshot(tmp_path) == before
        with pytest.raises(FolderInUse) as info:
            fnsysid.run({**SMALL, "output.overwrite": True}, output_dir=job)
        assert f"{info.value}\n" == inside("output_dir", job, sweep, os.getpid())[16:]
        assert snapshot(tmp_path) == before
    # the lock itself (taken after the pre-run check): a folder below or above one in use
    with lock_folder(job, "x"):
        with pytest.raises(FolderInUse, match=rf"^y: in use by another run \(pid {os.getpid()}, "
                                              rf"which writes into {job} inside it\)"):
            lock_folder(sweep, "y")
        assert not (sweep / LOCK).exists() and (job / LOCK).exists()
    with lock_folder(sweep, "x"):
        with pytest.raises(FolderInUse, match=r"which writes into .*s3\)"):
            lock_folder(sweep / "new" / "deeper", "y")
        assert not (sweep / "new").exists()             # the folders it made, given back
    with lock_folder(job, "x"):                         # a lock given up counts no more
        pass


@pytest.mark.slow
def test_a_second_run_into_a_folder_in_use_is_told_it_is_in_use_not_that_it_holds_a_run(
        tmp_path):
    """The lock is looked at first: the advice to add output.overwrite=true (which would
    then be refused as in use) is not given while a run holds the folder."""
    run, sweep = tmp_path / "x", tmp_path / "s"
    with lock_folder(run, "x"), lock_folder(sweep, "x"):
        earlier_run(run)
        earlier_run(sweep / "M=1")
        before = snapshot(tmp_path)
        for args, key, folder in [([f"hydra.run.dir={run}"], "hydra.run.dir", run),
                                  ([f"hydra.run.dir={run}", "output.resume=true"],
                                   "hydra.run.dir", run),
                                  (["-m", "M=5,6", f"hydra.sweep.dir={sweep}"],
                                   "hydra.sweep.dir", sweep)]:
            res = cli_in_process("M=5", *QUIET, "hydra/launcher=basic", *args)
            assert (res.returncode, res.stderr) == (2, in_use(key, folder, os.getpid()))
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo"])
def test_a_lock_file_that_is_not_one_is_refused_and_left_alone(tmp_path, kind):
    """A .fnsysid.lock that is a link (to a file the pid would replace) or not a regular file:
    the run is refused in one line and the file it names keeps its bytes."""
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("keep me\n")
    if kind == "symlink":
        (out / LOCK).symlink_to(target)
        what = "is a symbolic link, not a lock file of fnsysid; remove the link"
    elif kind == "hard link":
        os.link(target, out / LOCK)
        what = "is a file with 2 names (a hard link), not a lock file of fnsysid; remove it"
    else:
        os.mkfifo(out / LOCK)
        what = "is not a regular file, not a lock file of fnsysid; remove it"
    res = cli_in_process("M=5", *QUIET, f"hydra.run.dir={out}", "output.overwrite=true")
    assert (res.returncode, res.stderr) == (
        2, f"fnsysid: error: hydra.run.dir={out}: {LOCK} {what}, or choose another folder\n")
    with pytest.raises(fnsysid.ConfigError) as info:
        fnsysid.run(SMALL, output_dir=out)
    assert str(info.value) == f"output_dir={out}: {LOCK} {what}, or choose another folder"
    assert target.read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == [LOCK] and \
        (out / LOCK).is_symlink() == (kind == "symlink")


def test_a_results_folder_with_a_name_too_long_is_refused_in_one_line(tmp_path):
    long = tmp_path / ("a" * 256)
    missing = tmp_path / "new" / ("a" * 256)      # a missing parent is not made on the way
    for args, key, folder in [([f"hydra.run.dir={long}"], "hydra.run.dir", long),
                              ([f"hydra.run.dir={missing}"], "hydra.run.dir", missing),
                              (["-m", "M=1,2", f"hydra.sweep.dir={long}/b"], "hydra.sweep.dir",
                               long / "b")]:
        res = cli_in_process("M=1", *QUIET, *args)
        assert (res.returncode, res.stderr) == (
            2, f"fnsysid: error: {key}={folder}: File name too long; a path whose every part "
               "has at most 255 bytes\n")
    res = cli_in_process("--config-path", str(long), "M=1")
    assert (res.returncode, res.stderr) == (
        2, f"fnsysid: error: --config-path={long}: File name too long; a path whose every part "
           "has at most 255 bytes\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("subdir, says", [
    ("same", "gives every job of the sweep the same folder"),
    (".", "gives every job of the sweep the same folder"),
    ("../busy/j${hydra.job.num}", "puts job folders outside hydra.sweep.dir"),
    ("/tmp/elsewhere/a${hydra.job.num}", "puts job folders outside hydra.sweep.dir"),
])
def test_job_folders_of_a_sweep_are_its_own_and_inside_it(tmp_path, subdir, says):
    """Two jobs in one folder lose one's results; a job folder outside the sweep folder
    escapes its lock (it wrote into a running run's folder) and its results.csv."""
    from tests.conftest import cli_in_process

    res = cli_in_process("-m", "M=2", "R=2", "lr=0.1,0.2", "output.plot=false",
                         f"hydra.sweep.dir={tmp_path}/s", f"hydra.sweep.subdir={subdir}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fnsysid: error: hydra.sweep.subdir={subdir} {says}; allowed: "), res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_job_folders_of_their_own_inside_the_sweep_are_accepted(tmp_path):
    """The accepted form of the refusals above (one sweep for the four of them)."""
    from tests.conftest import cli_in_process

    ok = cli_in_process("-m", "M=2", "R=2", "lr=0.1,0.2", "output.plot=false",
                        f"hydra.sweep.dir={tmp_path}/t", "hydra.sweep.subdir=job_${hydra.job.num}")
    assert ok.returncode == 0 and sorted(p.name for p in (tmp_path / "t").glob("job_*")) == [
        "job_0", "job_1"]


@pytest.mark.slow
def test_a_value_with_dotdot_names_a_job_folder_inside_the_sweep(tmp_path):
    """Job folders are named after their overrides; a '/' in a value is written %2F, so
    data.path=../../../logs names one folder inside the sweep instead of a path beside it,
    and the sweep's results.csv holds both jobs."""
    from tests.test_data_files import GENERIC, linear_fleet, write_per_client

    df, _ = linear_fleet(n_clients=2, n_traj=3, length=10)
    write_per_client(df, tmp_path / "logs")
    write_per_client(df[df["client"] == "robot0"], tmp_path / "logs2")
    here = tmp_path / "a" / "b" / "c"
    here.mkdir(parents=True)
    res = cli_in_process("-m", *GENERIC, "data.path=../../../logs,../../../logs2", "R=2",
                         "M=null", "progress=false", "hydra.sweep.dir=sw",
                         "hydra.launcher.n_jobs=1", cwd=here)
    assert res.returncode == 0, res.stderr
    made = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("summary.json"))
    given = "M=null,R=2,data.inputs=[u],data.path=..%2F..%2F..%2F{},data.states=[x1,x2]," \
        "data=files,system=generic"
    assert made == [f"a/b/c/sw/{given.format(name)}/summary.json" for name in ("logs", "logs2")]
    results = pd.read_csv(here / "sw" / "results.csv")
    # one row per job and round (rounds 0..2); the jobs have 2 and 1 clients
    assert sorted(results["data.path"].unique()) == ["../../../logs", "../../../logs2"]
    assert len(results) == 2 * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "logs", "logs2"]
    assert sorted(p.name for p in (here).iterdir()) == ["sw"]
