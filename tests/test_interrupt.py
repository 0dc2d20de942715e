"""Interruption and stale files: signals, orphans, unique sweep folders, resume, overwrite."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import cli_in_process
from tests.test_cli import ROOT

LONG = ["system=pendulum", "M=500", "R=1000000", "repeats=1", "output.plot=false"]


def start(*args: str, cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_at_end_of_round_and_writes_rows_so_far(tmp_path, sig, code):
    out = tmp_path / "run"
    proc = start(*LONG, f"hydra.run.dir={out}")
    wait_for(out / ".hydra" / "overrides.yaml")
    time.sleep(1.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fnsysid: interrupted by {sig.name}")
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig.name
    errors = pd.read_csv(out / "errors.csv")
    r = summary["rounds_completed"]
    assert errors["round"].max() == r < 1_000_000 and len(errors) == r + 1
    assert f"after round {r} of 1000000" in lines[0]
    assert not (out / "error.png").exists()                # no plot of a partial run
    assert not list(out.glob(".*.tmp*"))


@pytest.mark.slow
def test_earlier_run_folder_refused_then_overwritten_cleanly(tmp_path):
    from fnsysid.app.experiment import run_experiment
    from fnsysid.app.preflight import preflight
    from fnsysid.config.checks import ConfigError
    from tests.conftest import compose_cfg

    run = tmp_path / "run"
    run_experiment(compose_cfg("system=pendulum", "M=3", "R=2", "repeats=1",
                               "output.plot=true"), run)
    assert (run / "clients.csv").exists() and (run / "error.png").exists()
    with pytest.raises(ConfigError, match="holds an earlier run: .* output.overwrite=true"):
        preflight(["system=pendulum", "M=3", f"hydra.run.dir={run}"])
    # M=21 writes no clients.csv and output.plot=false no error.png: the old ones must go
    new = cli_in_process("system=pendulum", "M=21", "R=2", "repeats=1", "output.plot=false",
                         "output.overwrite=true", f"hydra.run.dir={run}")
    assert new.returncode == 0, new.stderr
    assert not (run / "clients.csv").exists() and not (run / "error.png").exists()
    assert json.loads((run / "summary.json").read_text())["M"] == 21


SWEEP = ["R=3", "repeats=1", "progress=false", "output.plot=false", "hydra/launcher=basic"]


def jobs_of(sweep: Path) -> list[str]:
    """The job folders of a sweep folder (those with Hydra's record)."""
    return sorted(p.parent.relative_to(sweep).as_posix() for p in sweep.glob("**/.hydra"))


@pytest.mark.slow
def test_overwrite_removes_the_earlier_sweep_or_run_whole_and_nothing_else(tmp_path):
    """output.overwrite=true replaces what is there: an earlier sweep's job folders,
    multirun.yaml and results.csv, or an earlier run's files, .hydra and run.log, whichever
    of the two comes next; a file of the user's stays."""
    folder = tmp_path / "s4"
    sweep = ["-m", *SWEEP, f"hydra.sweep.dir={folder}"]
    assert cli_in_process(*sweep, "M=7,8").returncode == 0
    (folder / "notes.txt").write_text("mine\n")
    res = cli_in_process(*sweep, "M=1,2", "output.overwrite=true")
    assert res.returncode == 0, res.stderr
    assert jobs_of(folder) == ["M=1,R=3,repeats=1", "M=2,R=3,repeats=1"]
    assert sorted(pd.read_csv(folder / "results.csv")["M"].unique()) == [1, 2]
    # a single run into the sweep's folder: no job folder, no multirun.yaml, no results.csv
    run = [*SWEEP[:-1], f"hydra.run.dir={folder}"]
    res = cli_in_process(*run, "M=5", "output.overwrite=true")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [".hydra"]
    assert not (folder / "multirun.yaml").exists() and not (folder / "results.csv").exists()
    # run.log holds this run's lines only (Hydra appends to the file it finds)
    assert cli_in_process(*run, "M=6", "output.overwrite=true").returncode == 0
    log = (folder / "run.log").read_text()
    assert log.count("final e_R at R=3") == 1 and f"results: {folder}" in log
    assert json.loads((folder / "summary.json").read_text())["M"] == 6
    # a sweep into the run's folder: the run's files go, no job "." in results.csv
    res = cli_in_process(*sweep, "M=1,2", "output.overwrite=true")
    assert res.returncode == 0, res.stderr
    assert jobs_of(folder) == ["M=1,R=3,repeats=1", "M=2,R=3,repeats=1"]
    assert not (folder / "summary.json").exists() and not (folder / "run.log").exists()
    assert sorted(pd.read_csv(folder / "results.csv")["job"].unique()) == jobs_of(folder)
    assert (folder / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_overwrite_removes_only_what_an_earlier_run_wrote(tmp_path):
    """output.overwrite=true never removes a user's files: not in a folder that holds no run
    (data files beside the results), not the new run's input files even where an earlier run
    wrote them, not runs in folders below that are not the folder's own sweep."""
    run = [*SWEEP[:-1], "M=2", "output.overwrite=true"]
    sim = tmp_path / "proj" / "runs" / "a"
    assert cli_in_process(*run, "output.trajectories=true", f"hydra.run.dir={sim}"
                          ).returncode == 0
    # a folder of the user's with other runs further below: not a results folder, refused
    # even with overwrite, nothing of theirs touched
    (tmp_path / "proj" / "readme.txt").write_text("mine\n")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "proj").rglob("*")}
    res = cli_in_process(*run, f"hydra.run.dir={tmp_path / 'proj'}")
    assert (res.returncode, res.stderr) == (
        2, f"fnsysid: error: hydra.run.dir={tmp_path / 'proj'} is not empty and holds no "
           "earlier run (readme.txt, runs); allowed: a new or empty folder, or an earlier run's\n")
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "proj").rglob("*")} == before
    # the earlier run's own trajectories, the new run's input: kept, read, then replaced
    data = ["system=pendulum", "data=files", f"data.path={sim / 'trajectories.parquet'}",
            f"data.truth={sim / 'truth.csv'}", "R=2", "output.plot=false"]
    res = cli_in_process(*data, "output.overwrite=true", f"hydra.run.dir={sim}")
    assert res.returncode == 0, res.stderr
    assert (sim / "trajectories.parquet").exists() and (sim / "truth.csv").exists()
    assert json.loads((sim / "summary.json").read_text())["data"] == "files"


@pytest.mark.slow
def test_resume_into_a_single_runs_folder_is_refused(tmp_path):
    folder = tmp_path / "single"
    assert cli_in_process(*SWEEP[:-1], "M=2", f"hydra.run.dir={folder}").returncode == 0
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    res = cli_in_process("-m", *SWEEP, "M=1,2", f"hydra.sweep.dir={folder}",
                         "output.resume=true")
    assert (res.returncode, res.stderr) == (
        2, f"fnsysid: error: hydra.sweep.dir={folder} holds a single run, not a sweep (no "
           "multirun.yaml): output.resume=true finishes a sweep in its own folder; choose a new "
           "folder, or add output.overwrite=true (without output.resume) to replace its "
           "results\n")
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before


@pytest.mark.slow
def test_resume_skips_finished_jobs_and_reruns_the_rest(tmp_path):
    from fnsysid.app.experiment import run_experiment
    from tests.conftest import compose_cfg

    sweep = tmp_path / "sweep"
    done, todo = (sweep / f"M={m},R=3,repeats=1,system=pendulum" for m in (1, 2))
    run_experiment(compose_cfg("system=pendulum", "M=1", "R=3", "repeats=1", "output.plot=false"),
                   done)
    run_experiment(compose_cfg("system=pendulum", "M=2", "R=3", "repeats=1", "seed=5",
                               "output.plot=false"), todo)
    (todo / "summary.json").unlink()                       # as if killed before the end
    stamp = (done / "errors.csv").stat().st_mtime_ns
    res = cli_in_process("-m", "system=pendulum", "M=1,2", "R=3", "repeats=1",
                         "hydra/launcher=basic", "output.plot=false",
                         f"hydra.sweep.dir={sweep}", "output.resume=true")
    assert res.returncode == 0, res.stderr
    assert "already done" in res.stdout and "skipped" in res.stdout
    assert (done / "errors.csv").stat().st_mtime_ns == stamp   # not run again
    summary = json.loads((todo / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["seed"] == 0   # run again, clean


@pytest.mark.slow
def test_resume_reruns_a_finished_job_whose_errors_csv_is_corrupt(tmp_path):
    from omegaconf import OmegaConf

    from fnsysid.app.experiment import run_experiment
    from fnsysid.results.folder import finished_ok
    from tests.conftest import compose_cfg

    sweep = tmp_path / "sweep"
    jobs = [sweep / f"M={m},R=3,repeats=2,system=pendulum" for m in (1, 2)]
    cfgs = [compose_cfg("system=pendulum", f"M={m}", "R=3", "repeats=2", "output.plot=false")
            for m in (1, 2)]
    for cfg, job in zip(cfgs, jobs, strict=True):
        run_experiment(cfg, job)
    resolved = OmegaConf.to_container(cfgs[0], resolve=True)
    assert finished_ok(jobs[0], resolved)
    assert not finished_ok(jobs[0], {**resolved, "seed": 1})   # other settings
    (jobs[0] / "errors.csv").write_text("1,2\n")          # summary ok, table gone
    assert not finished_ok(jobs[0], resolved)
    stamp = (jobs[1] / "errors.csv").stat().st_mtime_ns
    res = cli_in_process("-m", "system=pendulum", "M=1,2", "R=3", "repeats=2",
                         "hydra/launcher=basic", "output.plot=false", f"hydra.sweep.dir={sweep}",
                         "output.resume=true")
    assert res.returncode == 0, res.stderr
    assert f"skipped: {jobs[1]}" in res.stdout and f"skipped: {jobs[0]}" not in res.stdout
    assert (jobs[1] / "errors.csv").stat().st_mtime_ns == stamp
    errors = pd.read_csv(jobs[0] / "errors.csv")
    assert errors[["repeat", "round"]].values.tolist() == [[s, r] for s in (0, 1)
                                                           for r in range(4)]
    table = pd.read_csv(sweep / "results.csv")
    assert table.groupby("M")["round"].max().to_dict() == {1: 3, 2: 3}


@pytest.mark.parametrize("text, problem", [
    ("1,2\n", "errors.csv starts with '1,2', not repeat,round,e_max"),
    ("lost", "errors.csv has 3 rows, not one per repeat and round 0..1 of summary.json"),
    ("swap", "errors.csv: line 2 is not the row of repeat 0, round 0 with 9 fields"),
    ("text", "errors.csv holds 'x', not a number"),
])
def test_sweep_with_a_corrupt_finished_job_names_it_and_exits_3(tmp_path, capsys, text,
                                                                 problem):
    """A job's errors.csv corrupted after it finished: no results.csv, one line, exit 3."""
    from omegaconf import OmegaConf

    from fnsysid.app.callbacks import SweepStatus, SweepTable, sweep_exit
    from fnsysid.app.experiment import run_experiment
    from fnsysid.results.folder import errors_problem
    from fnsysid.results.sweep import RESULTS
    from tests.conftest import compose_cfg

    job = tmp_path / "M=1"
    run_experiment(compose_cfg("M=1", "R=1", "repeats=2", "output.plot=false"), job)
    (job / ".hydra").mkdir()
    (job / ".hydra" / "overrides.yaml").write_text("- M=1\n")
    (tmp_path / RESULTS).write_text("stale")
    summary = json.loads((job / "summary.json").read_text())
    assert errors_problem(job, summary) is None
    lines = (job / "errors.csv").read_text().splitlines()
    fields = lines[2].split(",")
    corrupt = {"lost": lines[:-1], "swap": [lines[0], lines[2], lines[1], *lines[3:]],
               "text": [*lines[:2], ",".join([*fields[:2], "x", *fields[3:]]), *lines[3:]]}
    if text in corrupt:
        text = "\n".join(corrupt[text]) + "\n"
    (job / "errors.csv").write_text(text)
    assert errors_problem(job, summary) == problem
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    SweepStatus().on_multirun_end(cfg)
    SweepTable().on_multirun_end(cfg)
    assert not (tmp_path / RESULTS).exists()
    with pytest.raises(SystemExit) as info:
        sweep_exit()
    assert info.value.code == 3
    assert capsys.readouterr().err == (f"fnsysid: sweep {tmp_path} has jobs that are not ok "
                                       "(bad errors.csv: M=1); see their summary.json and "
                                       "run.log\n")


@pytest.mark.slow
def test_three_sweeps_in_the_same_second_get_three_folders(tmp_path):
    procs = [start("-m", "system=pendulum", "M=1", "R=2", "repeats=1", "hydra/launcher=basic",
                   f"seed={i}", cwd=tmp_path) for i in range(3)]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    sweeps = sorted((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 3
    seeds = sorted(json.loads(next(s.glob("*/summary.json")).read_text())["seed"]
                   for s in sweeps)
    assert seeds == [0, 1, 2]


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(p)
    return alive


def test_a_watched_parent_is_dead_once_it_exited_even_unreaped():
    """A worker watches its parent with interrupt._alive: alive while it runs; dead once it
    exited, as a zombie not yet reaped and after."""
    import os

    from fnsysid.runtimes.interrupt import _alive as parent_alive

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert parent_alive(os.getpid()) and parent_alive(proc.pid)
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)     # exited, not reaped
        assert Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        assert not parent_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not parent_alive(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_joblib_worker_outlives_a_killed_sweep(tmp_path, sig):
    proc = start("-m", *LONG, "seed=1,2,3", f"hydra.sweep.dir={tmp_path / 's'}")
    t0 = time.monotonic()
    while len(list((tmp_path / "s").glob("*/run.log"))) < 2 and time.monotonic() - t0 < 60:
        time.sleep(0.2)                                    # two jobs running
    time.sleep(1)
    kids = _children(proc.pid)
    assert len(kids) >= 3                                  # loky workers and trackers
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 143)
    t0 = time.monotonic()
    while _alive(kids) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert _alive(kids) == []
    # the jobs that were stopped have no summary.json: known incomplete
    assert not list((tmp_path / "s").glob("*/summary.json"))


@pytest.mark.slow
def test_sweep_job_refused_in_the_job_is_marked_and_exits_2(tmp_path, monkeypatch):
    """A combination past the preflight's limit that turns out bad marks its job 'refused'."""
    import fnsysid.app.preflight as preflight_mod

    monkeypatch.setattr(preflight_mod, "MAX_CHECKED", 1)
    res = cli_in_process(
        "-m", "optimizer=sgd", "optimizer.batch_size=30", "T=5", "N=10,5", "R=1",
        "repeats=1", "M=1", "output.plot=false", "progress=false", "hydra/launcher=basic",
        f"hydra.sweep.dir={tmp_path}")
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "refused: " in err[0] and "N=5" in err[0]
    statuses = {p.parent.name: json.loads(p.read_text())["status"]
                for p in tmp_path.glob("*/summary.json")}
    assert sorted(statuses.values()) == ["ok", "refused"]


@pytest.mark.slow
def test_resume_refuses_a_sweep_started_with_other_settings(tmp_path):
    """output.resume=true finishes only the sweep it was started as: a constant setting, a
    group option or the swept keys that differ are named with both values, and nothing is
    written; other values of the swept keys and the settings that change no number
    (progress) may differ."""
    sweep = tmp_path / "sweep"
    base = ["-m", "M=1,2", "repeats=1", "hydra/launcher=basic", "output.plot=false",
            f"hydra.sweep.dir={sweep}"]
    assert cli_in_process(*base, "R=3").returncode == 0
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("*")}
    for args, message in [
        (["R=5"], "R=5 differs from R=3 of the sweep"),
        (["R=3", "system=synthetic"], "system=synthetic differs from system=pendulum of the "
                                      "sweep"),
        (["R=3", "eps=0.01,0.1"], "this command sweeps M, eps, the sweep in "
                                  f"{sweep} swept M;"),
        # the values in effect, but given: Hydra would name every job folder anew
        (["R=3", "seed=0"], f"seed=0 is not on the command line of the sweep in {sweep} "),
        (["R=3", "system=pendulum"], "system=pendulum is not on the command line of the "),
    ]:
        res = cli_in_process(*base, *args, "output.resume=true")
        assert res.returncode == 2
        assert res.stderr.startswith(f"fnsysid: error: output.resume=true: {message}"), \
            res.stderr
        assert res.stderr.count("\n") == 1
        assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*")} == before
    res = cli_in_process(*base[:1], "M=1,2,3", *base[2:], "R=3", "progress=false",
                         "output.resume=true")
    assert res.returncode == 0, res.stderr
    table = pd.read_csv(sweep / "results.csv")
    assert table.groupby("M").size().to_dict() == {1: 4, 2: 4, 3: 4}     # R=3: rounds 0..3


@pytest.mark.slow
def test_resume_of_a_group_sweep_compares_the_settings_given_inside_the_group(tmp_path):
    """With strategy swept, the composed sweep config holds the default strategy: a setting
    given inside the group (strategy.weighting=samples) is compared as the command gave it,
    and one the sweep's command did not give is refused even at its default value
    (strategy.fraction=1.0 would name every job folder anew)."""
    sweep = tmp_path / "sweep"
    base = ["-m", "system=synthetic", "strategy=fedavg,fedprox", "R=2", "repeats=1",
            "hydra/launcher=basic", "output.plot=false", f"hydra.sweep.dir={sweep}"]
    assert cli_in_process(*base, "strategy.weighting=samples").returncode == 0
    for given, problem in [
        (["strategy.weighting=uniform"], "strategy.weighting=uniform differs from "
                                         "strategy.weighting=samples on the command line"),
        ([], "strategy.weighting is not given, but the sweep in "
             f"{sweep} was started with strategy.weighting=samples"),
        (["strategy.weighting=samples", "strategy.fraction=1.0"],
         f"strategy.fraction=1.0 is not on the command line of the sweep in {sweep}"),
    ]:
        res = cli_in_process(*base, *given, "output.resume=true")
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"fnsysid: error: output.resume=true: {problem}"), \
            res.stderr


def _pid_alive(pid: int) -> bool:
    """True if process ``pid`` runs (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone_within(pids, seconds: float) -> list[int]:
    """The processes of ``pids`` still running after ``seconds``."""
    t0 = time.monotonic()
    while (left := [p for p in pids if _pid_alive(p)]) and time.monotonic() - t0 < seconds:
        time.sleep(0.1)
    return left


#: a run's stand-in: opens a Reaper, starts two processes (one of them a shell with a child of
#: its own), prints their pids, then waits to be killed
_HOLDER = """
import subprocess, sys, time
from fnsysid.runtimes.reaper import Reaper
with Reaper():
    a = subprocess.Popen(["sleep", "600"])
    b = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
    print(a.pid, b.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the watchdog reads /proc (Linux)")
def test_a_killed_runs_processes_end_with_it_and_no_other():
    """SIGKILL of the process that opened a Reaper: the processes it started (and their
    children, reparented when their parent ends) end within seconds; a process that is not
    its descendant runs on."""
    import os

    other = subprocess.Popen(["sleep", "600"])
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    a, b = map(int, proc.stdout.readline().split())
    mine = [a, b]
    try:
        t0, grandchildren = time.monotonic(), []
        while not grandchildren and time.monotonic() - t0 < 10:  # b's shell starts its sleep
            grandchildren = [int(p) for p in Path(f"/proc/{b}/task/{b}/children").read_text()
                             .split()]
            time.sleep(0.02)
        assert len(grandchildren) == 1
        mine += grandchildren
        assert all(_pid_alive(p) for p in [*mine, other.pid])
        proc.kill()
        proc.wait()
        assert _gone_within(mine, 5.0) == []
        assert _pid_alive(other.pid)
    finally:
        other.kill()
        other.wait()
        for p in mine:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the watchdog reads /proc (Linux)")
def test_a_reaper_closed_by_its_run_ends_nothing_and_restores_the_environment():
    """A run that ends normally (Ray shut down) closes its reaper: the watchdog ends without
    killing what the run started, and the token leaves the environment."""
    import os

    from fnsysid.runtimes.reaper import ENV, Reaper

    before = os.environ.get(ENV)
    with Reaper() as r:
        assert os.environ[ENV] == r.token
        child = subprocess.Popen(["sleep", "600"])
    try:
        assert os.environ.get(ENV) == before
        assert r.proc.returncode == 0                 # the watchdog itself ended
        time.sleep(0.5)
        assert child.poll() is None                   # and left the child alone
    finally:
        child.kill()
        child.wait()
