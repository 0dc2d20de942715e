"""The Flower runtime against the in-process engine, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import run_experiment
from fnsysid.config.checks import ConfigError
from fnsysid.runtimes import check as runtime
from tests.conftest import FLOWER_REQUIRED, compose_cfg, needs_flower

pytestmark = pytest.mark.flower

#: heterogeneous clients, N_i, K_i and sample weights, so that all of them cross the network
SMALL = ["system=synthetic", "M=4", "R=5", "repeats=2", "eps=0.3", "N=[3,5,2,4]", "K=[2,5,1,4]",
         "lr=2e-3", "output.plot=false"]


#: the held-out NRMSE columns of errors.csv
NRMSE = ["nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max", "nrmse_sim_mean"]


@needs_flower
@pytest.mark.parametrize("strategy, fraction", [
    ("fedavg", 1.0), ("scaffold", 0.5),         # each Flower simulation starts Ray: the rest slow
    *[pytest.param(s, f, marks=pytest.mark.slow) for s, f in [
        ("fedprox", 1.0), ("fedlin", 1.0), ("scaffold", 1.0), ("fednova", 1.0),
        ("fednova", 0.5)]]])
def test_flower_runtime_matches_inprocess_round_by_round(strategy, fraction, tmp_path):
    extra = [f"strategy={strategy}", "strategy.weighting=samples",
             f"strategy.fraction={fraction}"]
    a = run_experiment(compose_cfg(*SMALL, *extra), tmp_path / "a")
    b = run_experiment(compose_cfg(*SMALL, *extra, "runtime=flower"), tmp_path / "b")
    assert (a["runtime"], b["runtime"]) == ("inprocess", "flower")
    assert a["heldout"] == b["heldout"]     # the nodes' marks: the same held-out data
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(ea) == len(eb) == 2 * 6
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(eb["e_mean"], ea["e_mean"], rtol=0, atol=1e-10)
    assert (ea["e_max"].iloc[5] < ea["e_max"].iloc[0] - 0.05)       # the rounds did something
    for c in NRMSE:                     # each client scored its own held-out trajectory
        assert ea[c].iloc[[0, 5]].notna().all()
        np.testing.assert_allclose(eb[c], ea[c], rtol=0, atol=1e-10)
        assert (eb[c].isna() == ea[c].isna()).all()
    ca, cb = (pd.read_csv(tmp_path / d / "clients.csv") for d in "ab")
    np.testing.assert_allclose(cb["error"], ca["error"], rtol=0, atol=1e-10)
    sa, sb = (pd.read_csv(tmp_path / d / "estimates.csv") for d in "ab")
    np.testing.assert_allclose(sb["estimate"], sa["estimate"], rtol=0, atol=1e-10)
    assert sb["true_mean"].isna().all()               # the server never sees the truth
    assert not (tmp_path / "b" / "theory.csv").exists()
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["theorem1"] is None


@needs_flower
def test_flower_runtime_detects_finite_growth_as_in_process(tmp_path):
    # lr 0.1 makes the errors grow past 1000 times their start, still finite, at round 4
    args = [*SMALL[:2], *SMALL[3:7], "lr=0.1", "R=6", "output.plot=false"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert (a["status"], a["diverged_round"]) == ("diverged", 4)
    assert (b["status"], b["diverged_round"]) == ("diverged", 4)
    assert b["repeat_status"] == a["repeat_status"]
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    # the repeat that did not diverge runs on to R under both runtimes; the other's rows
    # from round 4 on are empty
    gone = [s for s, st in enumerate(a["repeat_status"]) if st == "diverged"]
    assert len(gone) == 1 and ea["round"].max() == eb["round"].max() == 6
    assert len(ea) == len(eb)
    late = (ea["round"] >= 4) & (ea["repeat"] == gone[0])
    assert ea.loc[late, "e_max"].isna().all() and eb.loc[late, "e_max"].isna().all()
    assert ea.loc[~late, "e_max"].notna().all()
    for c in ("e_max", "e_mean", *NRMSE):
        # the free run of the surviving repeat's growing model (NRMSE ~1e3 at R) amplifies
        # the last bits of the model (measured: 1e-7 relative): relative agreement there
        np.testing.assert_allclose(eb[c], ea[c], rtol=1e-5 if "sim" in c else 0, atol=1e-10)
        assert (eb[c].isna() == ea[c].isna()).all()
    assert _children_left() == []      # Ray shut down: none of its processes outlives the run


def _children_left(wait: float = 15.0) -> list[str]:
    """Processes started by this one that still run ``wait`` seconds after it asked for
    them to end (Ray's processes end within moments of ray.shutdown)."""
    import time

    import psutil

    t0 = time.monotonic()
    while True:
        left = [p for p in psutil.Process().children(recursive=True) if _alive(p)]
        if not left or time.monotonic() - t0 > wait:
            return [f"pid {p.pid}" for p in left]
        time.sleep(0.5)


def test_flower_runtime_without_the_extra_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "flower_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[flower\]'"):
        run_experiment(compose_cfg(*SMALL, "runtime=flower"), tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("setting, match", [
    ("strategy=local", "runs only with runtime=inprocess"),
    ("strategy=cyclic", "runs only with runtime=inprocess"),
    ("optimizer=sgd K=2", "optimizer=sgd runs only"),
])
def test_flower_runtime_refuses_what_it_cannot_run(monkeypatch, tmp_path, setting, match):
    monkeypatch.setattr(runtime, "flower_installed", lambda: True)
    with pytest.raises(ConfigError, match=match):
        run_experiment(compose_cfg(*SMALL, "runtime=flower", *setting.split()), tmp_path)


@needs_flower
@pytest.mark.slow
def test_loopback_deployment_matches_inprocess(tmp_path):
    """SuperLink and three SuperNodes on 127.0.0.1, each reading its own trajectory file."""
    import importlib.util
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    report = deploy.main(["--out", str(tmp_path), "--clients", "3", "system=synthetic", "R=2",
                          "repeats=2", "strategy=scaffold"])
    assert report["runtime"] == "flower" and report["clients"] == 3
    assert report["max_abs_diff"] <= 1e-10
    flower = pd.read_csv(tmp_path / "flower" / "errors.csv")
    assert len(flower) == 2 * 3 and flower["e_max"].iloc[2] < flower["e_max"].iloc[0]
    home = f"FLWR_HOME={tmp_path / 'flwr-home'}".encode()
    for _ in range(20):                         # helpers stop within seconds of their parents
        if not _processes_with(home):
            break
        time.sleep(1)
    assert not _processes_with(home), "Flower processes of the deployment still run"


def _processes_with(env_entry: bytes) -> list[int]:
    """Processes whose environment holds ``env_entry``."""
    from pathlib import Path

    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if env_entry in (proc / "environ").read_bytes().split(b"\0"):
                    out.append(int(proc.name))
            except OSError:
                pass
    return out


@pytest.mark.slow
def test_deployment_data_are_read_with_the_default_overrides(tmp_path):
    """The files flower_deploy writes for its default experiment (which sets eps) are read by
    an in-process run with the overrides it returns (no Flower needed): the simulation knobs
    N, T, eps shaped the files and are not passed on."""
    import importlib.util
    from pathlib import Path

    import fnsysid

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    assert "eps=0.2" in deploy.DEFAULT
    reading = deploy.make_data(tmp_path, 3, [*deploy.DEFAULT, "T=4", "data.val_N=2",
                                             "data.shared_noise=true"])
    assert not [o for o in reading if o.split("=")[0] in ("eps", "T", "N", "data.val_N",
                                                            "data.shared_noise")]
    summary = fnsysid.run([*reading, "output.plot=false"], tmp_path / "run").summary
    assert summary["status"] == "ok" and summary["M"] == 3, summary


def test_deployment_finds_its_leftover_processes_by_command_line():
    """flower_deploy.leftover: the Flower processes (``flower-``/``flwr-`` on the command line)
    that name one of the deployment's marks, and no other process."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    mark, other = (f"127.0.0.1:{port}" for port in deploy.free_ports(2))
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    node = subprocess.Popen([*sleep, "flower-" + "supernode", "--port", mark])
    plain = subprocess.Popen([*sleep, "--port", mark])                 # not a Flower process
    try:
        assert [p.pid for p in deploy.leftover([mark])] == [node.pid]
        assert deploy.leftover([other]) == []
    finally:
        for proc in (node, plain):
            proc.kill()
            proc.wait()


def _alive(proc) -> bool:
    """True if ``proc`` (a psutil.Process) runs and is not a zombie (ended, not yet reaped)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _session(sid: int) -> list:
    """The processes of session ``sid`` (a command started with ``start_new_session``: it
    and everything it started, Ray's processes included, wherever they were reparented)."""
    import os

    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                out.append(proc)
        except (ProcessLookupError, PermissionError):
            pass
    return out


@needs_flower
@pytest.mark.slow
@pytest.mark.parametrize("sig, code, group", [("SIGINT", 130, True), ("SIGTERM", 143, False)])
def test_flower_run_stops_at_end_of_round_on_a_signal_and_leaves_no_process(
        tmp_path, sig, code, group):
    """Ctrl-C (SIGINT to the terminal's process group, Ray's processes included) or SIGTERM
    (to the command) after the first round: exit 130/143, the rounds so far written with status
    interrupted (the same numbers as in process), and no process of the run left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import fnsysid

    root = Path(__file__).resolve().parent.parent
    out, log = tmp_path / "run", tmp_path / "console.txt"
    args = ["runtime=flower", "system=synthetic", "M=2", "repeats=2", "eps=0.3",
            "output.plot=false"]
    with open(log, "w") as console:
        proc = subprocess.Popen([sys.executable, str(root / "run.py"), *args, "R=100000",
                                 f"hydra.run.dir={out}"], cwd=root, stdout=console,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.monotonic()
        while "round 1 of 100000 done" not in log.read_text():
            assert proc.poll() is None and time.monotonic() - t0 < 300, log.read_text()
            time.sleep(0.2)
        started = _session(proc.pid)
        assert any("ray" in " ".join(p.cmdline()) for p in started)   # Ray runs
        (os.killpg if group else os.kill)(proc.pid, getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fnsysid: interrupted by {sig}"), err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig
    r = summary["rounds_completed"]
    assert 1 <= r < 100000 and f"after round {r} of 100000" in lines[0]
    errors = pd.read_csv(out / "errors.csv")
    assert len(errors) == 2 * (r + 1) and errors["round"].max() == r
    inprocess = fnsysid.run([*args, f"R={r}"]).errors
    np.testing.assert_allclose(errors["e_max"], inprocess["e_max"], rtol=0, atol=1e-10)
    for _ in range(30):                 # Ray's processes end within moments of ray.shutdown
        if not any(_alive(p) for p in started):
            break
        time.sleep(0.5)
    assert not [p for p in _session(proc.pid) if _alive(p)], "processes left"


def _client_folder(tmp_path, M: int = 3, sim=("eps=0.3",)):
    """A simulated run's data as a folder of one CSV per client without a ``client`` column
    (README's layout), its truth file, and the overrides that read them; ``sim``: overrides
    of the simulation."""
    import fnsysid
    from fnsysid.data.files import write_client_files

    fnsysid.run(["system=synthetic", f"M={M}", "repeats=2", "R=1", *sim,
                 "output.trajectories=true", "output.plot=false"], tmp_path / "sim")
    sim = tmp_path / "sim"
    folder = tmp_path / "clients"
    write_client_files(pd.read_parquet(sim / "trajectories.parquet"), folder, "robot{client}")
    truth = pd.read_csv(sim / "truth.csv")
    truth["client"] = "robot" + truth["client"].astype(str)
    truth.to_csv(tmp_path / "truth.csv", index=False, float_format="%.17g")
    return folder, ["system=synthetic", "data=files", f"data.path={folder}",
                    f"data.truth={tmp_path / 'truth.csv'}", "R=3", "output.plot=false"]


@needs_flower
def test_flower_reads_a_folder_of_client_files_as_in_process(tmp_path):
    """README's layout (one CSV per client, no ``client`` column): each ClientApp reads its
    own file as a folder's file, and the run gives the in-process errors and estimates."""
    folder, args = _client_folder(tmp_path)
    assert "client" not in pd.read_csv(folder / "robot0.csv").columns
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert a["status"] == b["status"] == "ok" and b["M"] == 3
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(eb) == 2 * 4 and eb["e_max"].notna().all()
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)
    ca, cb = (pd.read_csv(tmp_path / d / "clients.csv") for d in "ab")
    assert cb["client"].tolist() == ca["client"].tolist() and cb["client"].nunique() == 3
    np.testing.assert_allclose(cb["error"], ca["error"], rtol=0, atol=1e-10)
    sa, sb = (pd.read_csv(tmp_path / d / "estimates.csv") for d in "ab")
    np.testing.assert_allclose(sb["estimate"], sa["estimate"], rtol=0, atol=1e-10)


@needs_flower
@pytest.mark.slow
def test_flower_scores_held_out_trajectories_of_a_folder_without_truth_as_in_process(
        tmp_path, caplog):
    """Federated evaluation: a folder of client files without ground truth (the normal case
    of real logs). Each ClientApp scores the server model on its own held-out trajectories
    (the last of its file, data.holdout) and sends only the scores: the NRMSE columns and the
    summary's final NRMSE equal the in-process ones, free runs at the same rounds; one log
    line a round with the clients that answered and the mean one-step NRMSE."""
    import logging

    folder, args = _client_folder(tmp_path)
    args = [a for a in args if not a.startswith("data.truth=")] + ["R=4",
                                                                   "output.eval_every=3"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    with caplog.at_level(logging.INFO, logger="fnsysid"):
        b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert a["status"] == b["status"] == "ok"
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(eb) == 2 * 5 and eb["e_max"].isna().all()
    assert eb["nrmse_sim_max"].notna().tolist() == [True, False, False, True, True] * 2
    for c in NRMSE:
        np.testing.assert_allclose(eb[c], ea[c], rtol=0, atol=1e-10)
        assert (eb[c].isna() == ea[c].isna()).all()
    for k in ("final_nrmse_1step_max", "final_nrmse_1step_mean", "final_nrmse_sim_max",
              "final_nrmse_sim_mean"):
        assert abs(b[k] - a[k]) <= 1e-10, k
    lines = [r.getMessage() for r in caplog.records if "clients answered" in r.getMessage()]
    assert [ln.split(":")[0] for ln in lines] == [f"round {r} of 4 done" for r in range(1, 5)]
    mean = float(ea[ea["round"] == 4]["nrmse_1step_mean"].mean())
    assert lines[-1] == (f"round 4 of 4 done: 3 of 3 clients answered, held-out NRMSE "
                         f"{mean:.6g} (one step, mean over clients)")


@needs_flower
def test_flower_scores_a_perfect_model_on_client_files_as_in_process(tmp_path):
    """Noiseless identical clients and a start at their true model: the held-out one-step
    NRMSE of that perfect model is rounding (below 1e-12, from the residuals; the expanded
    sums of squares gave ~1e-8, which differed between the runtimes by up to 1e-8), and each
    ClientApp's score of its own file equals the in-process one to 1e-10."""
    folder, args = _client_folder(tmp_path, sim=("eps=0", "system.disturbance.kind=zero"))
    args = [a for a in args if not a.startswith("data.truth=")]
    args += ["system.init.scale=1", "R=2", "output.eval_every=1"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert a["status"] == b["status"] == "ok"
    # the same held-out data in both runtimes: fnsysid compare ranks them together
    assert a["heldout"] == b["heldout"] and len(a["heldout"]["fingerprint"]) == 16
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(ea) == len(eb) == 2 * 3
    for c in NRMSE:
        assert ea[c].notna().all() and eb[c].notna().all()
        assert (ea[c] < 1e-12).all() and (eb[c] < 1e-12).all(), c
        np.testing.assert_allclose(eb[c], ea[c], rtol=0, atol=1e-10)


def test_flower_refuses_a_separate_held_out_path(monkeypatch, tmp_path):
    """data.val_path is read only in process: under runtime=flower each ClientApp scores the
    held-out rows of its own file; refused in one line rather than a run without scores."""
    monkeypatch.setattr(runtime, "flower_installed", lambda: True)
    folder = tmp_path / "clients"
    folder.mkdir()
    pd.DataFrame({"trajectory": [0, 0], "t": [0, 1], "theta": [0.1, 0.2], "omega": [0.0, 0.1],
                  "u": [0.0, 0.0]}).to_csv(folder / "a.csv", index=False)
    with pytest.raises(ConfigError, match=r"data\.val_path runs only with runtime=inprocess"):
        run_experiment(compose_cfg("data=files", f"data.path={folder}",
                                   f"data.val_path={folder}", "runtime=flower"),
                       tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_flower
@pytest.mark.parametrize("damage, message", [
    (lambda df: df.assign(x1=["oops", *df["x1"].iloc[1:]]),
     r"robot1\.csv: row 1, column 'x1': 'oops' is not a number"),
    (lambda df: df.drop(columns="x2"), r"robot1\.csv: column 'x2' \(data\.states\) is missing"),
], ids=["text", "missing-column"])
def test_flower_refuses_a_bad_client_file_in_one_line_before_starting(tmp_path, damage,
                                                                      message):
    """A bad client file under runtime=flower: the in-process message (file, row or column),
    exit 2, no traceback, no folder, and Flower never started (the check comes first)."""
    import re

    from tests.conftest import cli_in_process

    folder, args = _client_folder(tmp_path)
    bad = folder / "robot1.csv"
    damage(pd.read_csv(bad)).to_csv(bad, index=False)
    out = tmp_path / "run"
    res = cli_in_process(*args, "runtime=flower", f"hydra.run.dir={out}")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fnsysid: error: "), res.stderr
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in res.stderr + res.stdout and "ray" not in res.stdout.lower()
    assert not out.exists()


@needs_flower
@pytest.mark.slow
def test_deployment_with_a_supernode_that_dies_names_it_and_keeps_the_rounds(tmp_path):
    """A SuperNode killed during a deployment: the command names the node, its client and
    the round; the rounds every client evaluated are written with status interrupted (the
    in-process numbers), and no Flower process is left."""
    import importlib.util
    import re
    import threading
    import time
    from pathlib import Path

    import psutil

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    victim = str(tmp_path / "data" / "1.parquet")

    def kill_node_1() -> None:          # after its second train reply (round 2)
        log, t0 = tmp_path / "supernode1.log", time.monotonic()
        while time.monotonic() - t0 < 900:
            if log.exists() and log.read_text().count("Sending: train message") >= 2:
                for proc in psutil.process_iter(["cmdline"]):
                    cmd = " ".join(proc.info["cmdline"] or ())
                    if "flower-supernode" in cmd and victim in cmd:
                        proc.kill()
                return
            time.sleep(0.2)

    threading.Thread(target=kill_node_1, daemon=True).start()
    with pytest.raises(SystemExit) as stop:
        deploy.main(["--out", str(tmp_path), "--clients", "3", "system=synthetic", "R=300",
                     "repeats=2"])
    msg = str(stop.value)
    assert msg.startswith("the deployment stopped: round "), msg
    failed = int(re.match(r"the deployment stopped: round (\d+): SuperNode \d+ \(client 1\) "
                          r"failed on (train|evaluate): ", msg).group(1))
    assert "supernode1 (" in msg and "1.parquet, exit -9)" in msg      # the process that died
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert (summary["status"], summary["interrupted_by"]) == ("interrupted", "node failure")
    assert summary["error"] in msg
    r = summary["rounds_completed"]
    assert f"rounds 0 to {r} written to" in msg and 0 <= r < failed <= 300
    flower = pd.read_csv(tmp_path / "flower" / "errors.csv")
    inprocess = pd.read_csv(tmp_path / "inprocess" / "errors.csv")
    assert len(flower) == 2 * (r + 1) and flower["round"].max() == r
    expected = inprocess[inprocess["round"] <= r].reset_index(drop=True)
    np.testing.assert_allclose(flower["e_max"], expected["e_max"], rtol=0, atol=1e-10)
    assert not (tmp_path / "flower" / "estimates.csv").exists()
    home = f"FLWR_HOME={tmp_path / 'flwr-home'}".encode()
    for _ in range(20):
        if not _processes_with(home):
            break
        time.sleep(1)
    assert not _processes_with(home), "Flower processes of the deployment still run"


@needs_flower
def test_exchange_gives_up_waiting_once_told_to_stop_at_once(monkeypatch):
    """A second signal (interrupt.aborted) ends the server's wait for replies that never come
    (the engine shut down under it); before it, the server keeps waiting."""
    from fnsysid.runtimes import flower, interrupt

    class Silent:                       # a grid whose nodes never answer
        polls = 0

        def push_messages(self, messages):
            return [f"m{i}" for i, _ in enumerate(messages)]

        def pull_messages(self, ids):
            assert set(ids) == {"m0", "m1"}
            self.polls += 1
            assert self.polls < 10, "kept waiting after the abort"
            if self.polls == 3:
                interrupt._state["abort"] = True
            return []

    monkeypatch.setitem(interrupt._state, "abort", False)
    monkeypatch.setattr(flower, "PULL_INTERVAL", 0.0)
    # outside a Flower run a Message cannot be made (no run id): a stand-in carries the fields
    monkeypatch.setattr(flower, "Message", lambda content, **meta: (content, meta))
    grid = Silent()
    with pytest.raises(flower.Aborted):
        flower.exchange(grid, [(7, "train", {"theta": np.zeros((1, 2))}, {"round": 1}),
                               (8, "evaluate", {"theta": np.zeros((1, 2))}, None)])
    assert grid.polls == 3


@needs_flower
def test_exchange_stops_waiting_after_the_reply_timeout_naming_the_missing_nodes(monkeypatch):
    """A node that neither answers nor is reported failed by the SuperLink (a hung
    SuperNode): the server waits runtime.reply_timeout seconds, then one line names the
    nodes (and their clients) whose replies are missing; a node that answered is not named."""
    from types import SimpleNamespace

    from fnsysid.runtimes import flower, interrupt

    class HalfSilent:                   # node 7 answers at once, node 8 never
        polls = 0

        def push_messages(self, messages):
            return ["m0", "m1"][:len(messages)]

        def pull_messages(self, ids):
            self.polls += 1
            if "m0" not in ids:
                return []
            meta = SimpleNamespace(reply_to_message_id="m0", src_node_id=7,
                                   message_type="train")
            return [SimpleNamespace(metadata=meta, has_error=lambda: False, content={})]

    monkeypatch.setitem(interrupt._state, "abort", False)
    monkeypatch.setattr(flower, "PULL_INTERVAL", 0.01)
    monkeypatch.setattr(flower, "Message", lambda content, **meta: (content, meta))
    grid = HalfSilent()
    sends = [(7, "train", {"theta": np.zeros((1, 2))}, {"round": 1}),
             (8, "train", {"theta": np.zeros((1, 2))}, {"round": 1})]
    with pytest.raises(flower.FlowerError) as err:
        flower.exchange(grid, sends, {7: "robot0", 8: "robot1"}, timeout=0.2)
    assert str(err.value) == ("no reply within 0.2 s (runtime.reply_timeout) from SuperNode 8 "
                              "(client robot1)")
    assert grid.polls >= 2                      # it looked again before giving up
    assert flower.exchange(grid, sends[:1], timeout=0.2) == [{}]


def test_reply_timeout_is_a_typed_flower_setting(tmp_path):
    """runtime.reply_timeout: seconds, default 600; not a number or not positive is refused
    in one line naming the setting."""
    from fnsysid.config.checks import check_run

    assert check_run(compose_cfg("runtime=flower")).runtime.reply_timeout == 600.0
    assert check_run(compose_cfg("runtime=flower",
                                 "runtime.reply_timeout=30")).runtime.reply_timeout == 30.0
    for bad in ("0", "-5", "abc"):
        with pytest.raises(ConfigError, match=r"runtime\.reply_timeout"):
            check_run(compose_cfg("runtime=flower", f"runtime.reply_timeout={bad}"))


def _script(name: str):
    """A module of scripts/ loaded from its file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_certificates_chain_to_the_ca_name_the_hosts_and_node_keys_load(tmp_path):
    """scripts/flower_certs.py: the SuperLink's certificate is signed by the CA and names
    every --host (DNS name or IP address); each SuperNode key is an EC key in the OpenSSH
    format Flower reads; private keys are readable by their owner only; a second call into
    the same folder refuses and writes nothing."""
    if not FLOWER_REQUIRED:
        pytest.importorskip("cryptography", reason="cryptography comes with the extra")
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    certs = _script("flower_certs")
    out = tmp_path / "certs"
    certs.main(["--out", str(out), "--host", "server.example.org", "--host", "10.0.0.5",
                "--nodes", "2"])
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["server.example.org"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    for i in range(2):
        key = load_ssh_private_key((out / f"node{i}").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert load_ssh_public_key((out / f"node{i}.pub").read_bytes()) == key.public_key()
    for secret in ("ca.key", "server.key", "node0", "node1"):
        assert (out / secret).stat().st_mode & 0o077 == 0, secret
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit, match="holds ca.crt, ca.key"):
        certs.main(["--out", str(out), "--host", "other"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@needs_flower
@pytest.mark.slow
def test_loopback_deployment_with_tls_and_node_authentication_matches_inprocess(tmp_path):
    """The loopback deployment over TLS (certificates of scripts/flower_certs.py given to
    the SuperLink, the SuperNodes and flwr) with node authentication (each SuperNode's key
    registered with flwr supernode register): the same errors and held-out NRMSE as in
    process."""
    deploy = _script("flower_deploy")
    report = deploy.main(["--out", str(tmp_path), "--tls", "--clients", "3",
                          "system=synthetic", "R=2", "repeats=2"])
    assert report["tls"] is True and report["clients"] == 3
    assert report["max_abs_diff"] <= 1e-10
    link = (tmp_path / "superlink.log").read_text()
    assert "running on https://127.0.0.1:" in link            # the SuperLink serves TLS only
    assert link.count("register-node HTTP/1.1\" 200") == 3   # every SuperNode registered
    assert "insecure" not in (tmp_path / "flwr-home" / "config.toml").read_text()
    flower = pd.read_csv(tmp_path / "flower" / "errors.csv")
    assert len(flower) == 2 * 3 and flower["nrmse_1step_mean"].notna().all()


@needs_flower
@pytest.mark.slow
def test_deployment_with_a_hung_clientapp_stops_after_the_reply_timeout(tmp_path):
    """A SuperNode that stays connected (heartbeats go on) but whose ClientApp hangs
    (stopped with SIGSTOP after round 2): the server waits runtime.reply_timeout seconds,
    then one line names the round and the missing SuperNode and its client; the rounds
    every client evaluated are written with status interrupted (the in-process numbers)."""
    import re
    import signal
    import threading
    import time

    import psutil

    deploy = _script("flower_deploy")
    victim = str(tmp_path / "data" / "1.parquet")
    stopped: list[psutil.Process] = []
    done = threading.Event()

    def hang_node_1() -> None:          # every ClientApp of SuperNode 1 after round 2
        log = tmp_path / "supernode1.log"
        while not done.is_set():
            if log.exists() and log.read_text().count("Sending: train message") >= 2:
                for node in psutil.process_iter(["cmdline"]):
                    if victim in " ".join(node.info["cmdline"] or ()) and \
                            "flower-supernode" in " ".join(node.info["cmdline"] or ()):
                        for child in node.children(recursive=True):
                            if child not in stopped:
                                child.send_signal(signal.SIGSTOP)
                                stopped.append(child)
            time.sleep(0.1)

    watcher = threading.Thread(target=hang_node_1, daemon=True)
    watcher.start()
    try:
        with pytest.raises(SystemExit) as stop:
            deploy.main(["--out", str(tmp_path), "--clients", "3", "system=synthetic",
                         "R=300", "repeats=2", "runtime=flower", "runtime.reply_timeout=90"])
    finally:
        done.set()
        watcher.join()
        for proc in stopped:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    msg = str(stop.value)
    # the server's reply timeout names the node; on a loaded machine Flower's own session
    # for the frozen node's reply can expire first, and then its failure names the node
    hit = re.match(r"the deployment stopped: round (\d+): (no reply within 90 s "
                   r"\(runtime\.reply_timeout\) from SuperNode \d+ \(client 1\)|SuperNode "
                   r"\d+ \(client 1\) failed on train: [^;]*); ", msg)
    assert hit, msg
    failed = int(hit.group(1))
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert (summary["status"], summary["interrupted_by"]) == ("interrupted", "node failure")
    r = summary["rounds_completed"]
    assert 0 <= r < failed <= 300 and f"rounds 0 to {r} written to" in msg
    flower = pd.read_csv(tmp_path / "flower" / "errors.csv")
    inprocess = pd.read_csv(tmp_path / "inprocess" / "errors.csv")
    expected = inprocess[inprocess["round"] <= r].reset_index(drop=True)
    np.testing.assert_allclose(flower["e_max"], expected["e_max"], rtol=0, atol=1e-10)


@needs_flower
def test_a_deployed_server_needs_no_data_path_and_takes_typed_app_keys():
    """The deployed ServerApp's config: with data=files and no data.path the data are on the
    SuperNodes (a placeholder, no path checked on the server); the keys of
    [tool.flwr.app.config] other than overrides/outdir are typed run.py settings; a setting
    given both ways and a missing M are refused in one line."""
    from types import SimpleNamespace

    from fnsysid.app import flower_apps
    from fnsysid.runtimes.flower import ON_NODES, deployed_overrides

    given, on_nodes = deployed_overrides({"overrides": "system=pendulum data=files M=12",
                                          "outdir": "/srv/x"})
    assert on_nodes and given[:3] == ["system=pendulum", "data=files", "M=12"]
    settings = flower_apps.deployed_config(SimpleNamespace(run_config={
        "overrides": "system=pendulum data=files", "outdir": "/srv/x", "M": 12, "R": 50,
        "strategy": "scaffold", "lr": 0.002, "output.plot": False}))
    assert settings.data.path == ON_NODES and settings.M == 12 and settings.R == 50
    assert settings.lr == 0.002 and settings.output.plot is False
    assert settings.resolved["strategy"]["_target_"].endswith("Scaffold")
    assert settings.runtime.name == "flower"
    # a folder given on the server is still checked there (a path that does not exist)
    with pytest.raises(ConfigError, match=r"data\.path=/nonexistent does not exist"):
        flower_apps.deployed_config(SimpleNamespace(run_config={
            "overrides": "data=files data.path=/nonexistent M=3"}))
    with pytest.raises(ConfigError, match=r"^M is given twice: in overrides and as a key"):
        deployed_overrides({"overrides": "M=3", "M": 4})
    with pytest.raises(ConfigError, match=r"^M is missing: a deployed run with data=files"):
        flower_apps.deployed_config(SimpleNamespace(run_config={"overrides": "data=files"}))


@needs_flower
def test_a_failing_deployed_serverapp_says_why_in_one_line(caplog):
    """Any failure of the deployed ServerApp is logged as one line and is the one-line
    message of the exception Flower records as the run's details."""
    from types import SimpleNamespace

    from fnsysid.app import flower_apps

    bad = SimpleNamespace(run_config={"overrides": "data=files R=2", "outdir": "x"})
    with caplog.at_level("ERROR", logger="fnsysid"):
        with pytest.raises(flower_apps.ServerAppError) as err:
            flower_apps.deployed_main(None, bad)
    line = str(err.value)
    assert "\n" not in line and line.startswith("M is missing"), line
    assert err.value.__cause__ is None
    assert [r.getMessage() for r in caplog.records] == [f"fnsysid: error: {line}"]
    with pytest.raises(flower_apps.ServerAppError, match=r"^strategy=nosuch|nosuch"):
        flower_apps.deployed_main(None, SimpleNamespace(run_config={
            "overrides": "strategy=nosuch"}))


@needs_flower
def test_a_node_without_its_file_says_so():
    """A SuperNode of a run whose data are on the nodes, started without data-path: one
    line saying how to give it (the server shows it as the node's failure)."""
    import json
    import shlex

    from fnsysid.app.build import client_node, compose_json
    from fnsysid.runtimes.flower import deployed_overrides

    given, _ = deployed_overrides({"overrides": "system=synthetic data=files M=2"})
    text = compose_json(shlex.join(given))
    assert json.loads(text)["data"]["path"] == "<on the SuperNodes>"
    with pytest.raises(ValueError, match=r"no trajectory file: start it with --node-config "
                                         r"\"data-path="):
        client_node(text, None, None, None)


def _fake_flwr(tmp_path, status: str, details: str):
    """A stand-in for the flwr command: ``run`` prints what flwr run --stream prints (with
    a traceback of Flower's), ``ls`` the run's status as JSON."""
    import sys

    fake = tmp_path / "flwr"
    fake.write_text(f"""#!{sys.executable}
import json, sys
if sys.argv[1] == "run":
    print("Loading project configuration...")
    print("Successfully started run 4242")
    print("[INFO] round 1 of 2 done: 3 of 3 clients answered")
    print("ERROR :      ServerApp raised an exception")
    print("Traceback (most recent call last):")
    print('  File "x.py", line 1, in <module>')
elif sys.argv[1] == "ls":
    assert sys.argv[sys.argv.index("--run-id") + 1] == "4242"
    print(json.dumps({{"success": True, "runs": [{{"run-id": "4242", "status": {status!r},
                      "status-details": {details!r}}}]}}))
""")
    fake.chmod(0o755)
    return str(fake)


@needs_flower
@pytest.mark.parametrize("status, details, code", [
    ("finished:completed", "", 0),
    ("finished:failed", "ServerApp failed with exception: M is missing: a deployed run", 1)])
def test_flower_run_wrapper_exits_with_the_run_status(tmp_path, monkeypatch, capsys, status,
                                                      details, code):
    """fnsysid-flower-run: fnsysid's lines of the stream, then the status flwr ls gives:
    exit 0 when the run completed, else 1 and one line with the ServerApp's cause (Flower's
    traceback only in --log)."""
    from fnsysid.app import flower_run

    monkeypatch.setattr(flower_run, "flwr", lambda: _fake_flwr(tmp_path, status, details))
    log = tmp_path / "flwr.log"
    assert flower_run.main(["fleet", "--run-config", "overrides='M=3'", "--log",
                            str(log)]) == code
    out, err = capsys.readouterr()
    assert out.splitlines() == ["fnsysid: run 4242 started",
                                "[INFO] round 1 of 2 done: 3 of 3 clients answered"]
    assert "Traceback" in log.read_text() and "Traceback" not in out + err
    if code:
        assert err.splitlines() == ["fnsysid: error: run 4242 finished:failed: M is missing: "
                                    "a deployed run"]
    else:
        assert err == ""


@needs_flower
def test_a_reply_timeout_in_the_simulation_writes_the_finished_rounds_as_interrupted(
        tmp_path, monkeypatch):
    """runtime=flower: when the server stops waiting for a reply (runtime.reply_timeout) in
    round 3, the rounds every client scored (0 and 1) are written with status interrupted and
    the line in error, the in-process numbers; the command says so in one line, exit 1."""
    from fnsysid.runtimes import flower
    from tests.conftest import cli_in_process

    real, calls = flower.exchange, []

    def late(grid, sends, names=None, timeout=None):   # the 4th exchange: round 3's train
        calls.append(sends[0][1])
        if len(calls) == 4:
            raise flower.FlowerError("no reply within 0.5 s (runtime.reply_timeout) from "
                                     "SuperNode 9 (client 1)")
        return real(grid, sends, names, timeout)

    monkeypatch.setattr(flower, "exchange", late)
    args = ["system=synthetic", "M=2", "R=5", "repeats=2", "eps=0.3", "output.plot=false"]
    out = tmp_path / "run"
    res = cli_in_process(*args, "runtime=flower", f"hydra.run.dir={out}")
    assert calls == ["query", "train", "train", "train"]
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "fnsysid: interrupted by node failure (round 3: no reply within 0.5 s "
        "(runtime.reply_timeout) from SuperNode 9 (client 1)) after round 1 of 5"), res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["interrupted_by"]) == ("interrupted", "node failure")
    assert summary["rounds_completed"] == 1 and summary["error"].startswith("round 3: ")
    errors = pd.read_csv(out / "errors.csv")
    inprocess = run_experiment(compose_cfg(*args[:-1], "R=1"), tmp_path / "a")
    del inprocess
    expected = pd.read_csv(tmp_path / "a" / "errors.csv")
    assert len(errors) == len(expected) == 2 * 2
    np.testing.assert_allclose(errors["e_max"], expected["e_max"], rtol=0, atol=1e-10)
    assert not (out / "estimates.csv").exists()


@needs_flower
def test_flower_personalizes_from_the_clients_messages_as_in_process(tmp_path):
    """personalize=auto under runtime=flower: each ClientApp sends its own statistics and
    residual sums (from its own QR factors), the server the fleet's mean and heterogeneity,
    each client its posterior: client_estimates.csv equals the in-process one to 1e-10."""
    folder, args = _client_folder(tmp_path, M=4, sim=("eps=1",))
    args = [*args, "personalize=auto"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert a["status"] == b["status"] == "ok"
    ca, cb = (pd.read_csv(tmp_path / d / "client_estimates.csv") for d in "ab")
    assert len(cb) == len(ca) > 0 and ca["se"].notna().all()
    for col in ("estimate", "se", "local", "local_se", "local_lo", "local_hi"):
        np.testing.assert_allclose(cb[col], ca[col], rtol=0, atol=1e-10, err_msg=col)


@needs_flower
def test_flower_personalizes_on_the_sparse_support_as_in_process(tmp_path):
    """sparsity=stlsq with personalize=auto under runtime=flower (group sparsity): the
    server sends the support with its requests, each ClientApp sends the statistics of the
    kept terms alone (0 for the pruned ones) and computes its model on them:
    client_estimates.csv equals the in-process one to 1e-10, the pruned terms 0 with no
    interval."""
    folder, args = _client_folder(tmp_path, M=4, sim=("eps=1",))
    args = [*args, "sparsity=stlsq", "personalize=auto"]
    a = run_experiment(compose_cfg(*args), tmp_path / "a")
    b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    assert a["status"] == b["status"] == "ok"
    ca, cb = (pd.read_csv(tmp_path / d / "client_estimates.csv") for d in "ab")
    pruned = ca["estimate"] == 0
    assert len(cb) == len(ca) > 0 and pruned.any() and (~pruned).any()
    assert ca.loc[pruned, "se"].isna().all() and cb.loc[pruned, "se"].isna().all()
    assert ca.loc[~pruned, "se"].notna().all()
    for col in ("estimate", "se", "local", "local_se", "local_lo", "local_hi"):
        np.testing.assert_allclose(cb[col], ca[col], rtol=0, atol=1e-10, err_msg=col)
    assert b["personalize_reml"] == a["personalize_reml"]


@needs_flower
def test_flower_runs_the_model_check_from_the_clients_statistics_as_in_process(tmp_path,
                                                                              caplog):
    """output.model_check under runtime=flower: after the last round each ClientApp sends
    the check's statistics of its own fit on its own data (no trajectory), the server
    combines them; summary.json's model_check equals the in-process one (numbers to 1e-10,
    the same verdict), on a folder whose shorter client is padded in process, with sparsity's
    support sent to the clients."""
    from tests.conftest import ragged_client_folder
    from tests.test_modelcheck import _same

    folder, args = ragged_client_folder(tmp_path)
    args = [*args, "sparsity=stlsq"]
    run_experiment(compose_cfg(*args), tmp_path / "a")
    run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / "b")
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["status"] == b["status"] == "ok" and b["runtime"] == "flower"
    ca, cb = a["model_check"], b["model_check"]
    assert ca["support"] == "sparsity" and ca["tests"] > 0 and ca["clients_checked"] == 4
    assert ca["free_run_clients"] == [4] and ca["verdict"] is not None
    assert ca["worst"]["client"].startswith("robot")
    _same(cb, ca)


@needs_flower
def test_flower_clients_report_the_round_off_of_their_own_fits(tmp_path, caplog):
    """Tanks about 1000 with a degree-2 library (tests/test_conditioning.py): the server of
    a Flower run holds no H_i to perturb the pooled sums with, so each client measures the
    round-off of its own least squares against its targets' spread and sends it with the
    model check's statistics. Before, this run was `ok` under Flower with one-step NRMSE 6.6;
    now ill_conditioned as in process, cause offset, and the model check gives no verdict.
    About 0 the same fleet is ok in both runtimes."""
    from tests.test_sparsity import offset_tanks

    caplog.set_level("WARNING", logger="fnsysid")
    for offset in (1000.0, 0.0):
        file, _, _ = offset_tanks(tmp_path, offset, M=4)
        folder = tmp_path / f"clients{offset:g}"
        folder.mkdir()
        for c, g in pd.read_csv(file).groupby("client"):
            g.drop(columns="client").to_csv(folder / f"{c}.csv", index=False)
        args = ["system=generic", "data=files", f"data.path={folder}", "data.states=[x1]",
                "data.inputs=[u]", "feature_map=polynomial", "feature_map.degree=2", "R=5",
                "output.plot=false", "progress=false"]
        a = run_experiment(compose_cfg(*args), tmp_path / f"a{offset:g}")
        b = run_experiment(compose_cfg(*args, "runtime=flower"), tmp_path / f"b{offset:g}")
        if not offset:
            assert a["status"] == b["status"] == "ok"
            assert "roundoff" not in a["conditioning"] and "conditioning" not in b
            continue
        assert a["status"] == b["status"] == "ill_conditioned" and b["runtime"] == "flower"
        assert a["conditioning"]["roundoff"]["of"] == "pooled sums"
        r = b["conditioning"]["roundoff"]
        assert r["of"] == "own fits" and r["cause"] == "offset" and r["worst_ratio"] > 1
        assert b["model_check"]["verdict"] is None and a["model_check"]["verdict"] is None
        assert b["final_nrmse_1step_mean"] > 1
    said = [m.getMessage() for m in caplog.records if "their own least squares" in m.getMessage()]
    assert len(said) == 1 and "subtract an operating point" in said[0]


@needs_flower
@pytest.mark.slow
def test_a_sigkilled_flower_run_leaves_no_ray_process(tmp_path):
    """SIGKILL (which no handler sees) of a runtime=flower run after its first round: within
    5 seconds no process of its session is left (Ray's gcs_server, raylet, agents and
    ClientApp actors; they outlived the run by about a minute before the watchdog of
    fnsysid.runtimes.reaper), and the watchdog itself has ended."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    root = Path(__file__).resolve().parent.parent
    out, log = tmp_path / "run", tmp_path / "console.txt"
    with open(log, "w") as console:
        proc = subprocess.Popen([sys.executable, str(root / "run.py"), "runtime=flower",
                                 "system=synthetic", "M=2", "R=100000", "output.plot=false",
                                 f"hydra.run.dir={out}"], cwd=root, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while "round 1 of 100000 done" not in log.read_text():
            assert proc.poll() is None and time.monotonic() - t0 < 300, log.read_text()
            time.sleep(0.2)
        started = [p for p in _session(proc.pid) if p.pid != proc.pid]
        names = {p.name() for p in started}
        assert {"raylet", "gcs_server"} <= names, names           # Ray runs in the session
        watchdogs = [p for p in psutil.process_iter(["cmdline"])
                     if "FNSYSID_RUN_TOKEN" in " ".join(p.info["cmdline"] or [])
                     and str(proc.pid) in (p.info["cmdline"] or [])]
        assert len(watchdogs) == 1
        proc.kill()
        proc.wait()
        t1 = time.monotonic()
        while time.monotonic() - t1 < 5 and any(_alive(p) for p in [*started, *watchdogs]):
            time.sleep(0.1)
        left = [f"{p.pid} {p.name()}" for p in [*_session(proc.pid), *watchdogs] if _alive(p)]
        assert left == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@needs_flower
def test_node_sources_cross_to_a_node_as_a_small_equal_copy():
    """Flower's simulation engine pickles the ClientApp (and the run's NodeSources) with every
    message: a copy is a few hundred bytes whatever M, equal to the others (so a node's cache
    of its ClientNode hits), and gives each client its file and truth rows."""
    import pickle

    from fnsysid.app.build import client_node
    from fnsysid.runtimes.flower import NodeSources

    sizes = []
    for M in (10, 1000):
        files = [f"/data/c{i:05d}.csv" for i in range(M)]
        truth = np.arange(2 * M * 3, dtype=float).reshape(2, M, 3)
        src = NodeSources(files, [f"c{i:05d}" for i in range(M)][::-1], truth)
        wire = pickle.dumps(src)
        a, b = pickle.loads(wire), pickle.loads(pickle.dumps(src))
        assert a is not b and a == b and hash(a) == hash(b) and a == src
        path, rows = a.of(3)
        assert path == "/data/c00003.csv"
        np.testing.assert_array_equal(rows, truth[:, M - 1 - 3:M - 3])    # its truth rows
        sizes.append(len(wire))
    assert sizes[1] < 500 and sizes[1] - sizes[0] < 10, sizes
    assert client_node.cache_info().maxsize >= 1000         # one ClientNode per client


@needs_flower
def test_the_server_uses_exactly_m_supernodes_and_names_them_when_it_cannot():
    """A deployment's server waits for M SuperNodes: more connected than M is refused in one
    line naming them (each connected node is one client; it crashed on an array of the wrong
    shape), fewer after runtime.node_timeout names those connected."""
    from fnsysid.runtimes.flower import FlowerError, wait_for_nodes

    class Grid:
        def __init__(self, ids):
            self.ids = ids

        def get_node_ids(self):
            return list(self.ids)

    assert wait_for_nodes(Grid([9, 4, 7]), 3, timeout=1) == [4, 7, 9]
    with pytest.raises(FlowerError, match=r"^3 SuperNodes are connected \(4, 7, 9\) but M=2; "
                       r"allowed: M equal to the number of connected SuperNodes"):
        wait_for_nodes(Grid([9, 4, 7]), 2, timeout=1)
    with pytest.raises(FlowerError, match=r"^only 2 of M=3 SuperNodes connected after 0.3 s "
                       r"\(runtime.node_timeout\): 4, 9$"):
        wait_for_nodes(Grid([9, 4]), 3, timeout=0.3)


def test_each_flower_deploy_call_gets_a_new_folder_and_a_used_one_is_refused(
        tmp_path, monkeypatch, capsys):
    """make flower-deploy ran once per clone: its second call stopped with a traceback, as
    its runs refused the first call's folders. Each call now gets a new
    outputs/flower-deploy/<date>_<time>; an --out that holds anything is refused in one
    line, exit 2."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"
    spec = importlib.util.spec_from_file_location("flower_deploy", script)
    deploy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deploy)
    monkeypatch.chdir(tmp_path)
    first, second = deploy.deploy_folder(None), deploy.deploy_folder(None)
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent == second.parent == tmp_path / "outputs" / "flower-deploy"
    assert second.name.startswith(first.name[:19])
    (first / "comparison.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        deploy.deploy_folder(str(first))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"flower_deploy: error: --out {first} is not an empty folder; allowed: a "
                   "new or empty folder (default: a new outputs/flower-deploy/<date>_<time>)"]
    assert deploy.deploy_folder(str(tmp_path / "new" / "dir")).is_dir()
