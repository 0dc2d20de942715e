"""The Flower runtime against the in-process engine, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import run_experiment
from fnsysid.config.checks import ConfigError
from fnsysid.runtimes import check as runtime
from tests.conftest import compose_cfg

needs_flower = pytest.mark.skipif(
    not runtime.flower_installed(),
    reason="Flower is not installed (extra: pip install -e '.[flower]' or make install-flower)")

#: heterogeneous clients, N_i, K_i and sample weights, so that all of them cross the network
SMALL = ["system=synthetic", "M=4", "R=5", "repeats=2", "eps=0.3", "N=[3,5,2,4]", "K=[2,5,1,4]",
         "lr=2e-3", "output.plot=false"]


@needs_flower
@pytest.mark.parametrize("strategy, fraction", [
    ("fedavg", 1.0), ("fedprox", 1.0), ("fedlin", 1.0), ("scaffold", 1.0), ("fednova", 1.0),
    ("scaffold", 0.5), ("fednova", 0.5)])
def test_flower_runtime_matches_inprocess_round_by_round(strategy, fraction, tmp_path):
    extra = [f"strategy={strategy}", "strategy.weighting=samples",
             f"strategy.fraction={fraction}"]
    a = run_experiment(compose_cfg(*SMALL, *extra), tmp_path / "a")
    b = run_experiment(compose_cfg(*SMALL, *extra, "runtime=flower"), tmp_path / "b")
    assert (a["runtime"], b["runtime"]) == ("inprocess", "flower")
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(ea) == len(eb) == 2 * 6
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(eb["e_mean"], ea["e_mean"], rtol=0, atol=1e-10)
    assert (ea["e_max"].iloc[5] < ea["e_max"].iloc[0] - 0.05)       # the rounds did something
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
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert ea["round"].max() == eb["round"].max() == 3
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)


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
