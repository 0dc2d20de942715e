"""A system and a strategy of your own outside the repository: examples/duffing and
examples/fedavgm through --config-dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.runtimes import check as runtime_check
from tests.conftest import engine

ROOT = Path(__file__).resolve().parent.parent
DUFFING = ROOT / "examples" / "duffing"
CONF = DUFFING / "conf"


def cli(*args, conf=CONF, cwd=None, path=DUFFING):
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), "--config-dir", str(conf),
                           *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=cwd or ROOT)


@pytest.fixture
def duffing_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(DUFFING))


@pytest.mark.slow
def test_duffing_through_config_dir_identifies_the_fleet(tmp_path):
    res = cli("system=duffing", "M=10", "repeats=2", "progress=false", "output.plot=false",
              f"hydra.run.dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["system"] == "duffing" and s["parameters"] == ["delta", "alpha", "beta", "b"]
    # eps = 0.2 spreads alpha and beta; FedAvg lands on the fleet's centre, within ~0.1
    assert 0.01 < s["final_e_max_mean"] < 0.15
    assert s["final_nrmse_1step_mean"] < 0.05


@pytest.mark.slow
def test_the_check_lists_the_users_options_and_names_missing_keys(tmp_path,
                                                                   duffing_importable):
    from fnsysid.app.preflight import preflight
    from fnsysid.config.checks import ConfigError

    def message(*args, conf=CONF) -> str:
        with pytest.raises(ConfigError) as exc:
            preflight(["--config-dir", str(conf), *args])
        assert "\n" not in str(exc.value)
        return str(exc.value)

    assert message("system=dufing") == ("system=dufing is not an option; allowed: duffing, "
                                        "generic, linear, pendulum, quadrotor, synthetic")
    bad = tmp_path / "conf" / "system"
    bad.mkdir(parents=True)
    text = (CONF / "system" / "duffing.yaml").read_text()
    (bad / "duffing.yaml").write_text(text.replace("knobs: {N: 10, ", "knobs: {"))
    assert message("system=duffing", conf=tmp_path / "conf").startswith(
        "system.knobs.N is missing")
    (bad / "duffing.yaml").write_text(text.replace("reduction: mean", "reduction: 3"))
    assert message("system=duffing", conf=tmp_path / "conf").startswith(
        "system.solver.reduction=3 is not allowed")
    (bad / "duffing.yaml").write_text(text.replace("delta: 0.3", "delta: abc"))
    assert message("system=duffing", conf=tmp_path / "conf") == (
        "system: duffing: delta=abc; allowed: a finite number")


def test_noiseless_duffing_data_give_each_clients_parameters(duffing_importable):
    from fnsysid.dynamics.model import generate, least_squares

    res = fnsysid.run({"system": "duffing", "system.disturbance.kind": "zero", "M": 3,
                       "R": 1, "repeats": 1, "progress": False}, config_dir=CONF)
    model = res.model
    data = generate(model, M=3, N=2, T=30, eps=0.5, repeats=1, seed=4)
    np.testing.assert_allclose(least_squares(data.H, data.b), data.theta_true, rtol=1e-8)
    assert np.ptp(data.theta_true[0, :, 1]) > 1e-2       # the clients do differ in alpha


def test_a_config_dir_whose_path_has_commas_and_quotes_is_found(tmp_path, duffing_importable):
    """--config-dir reaches the check before the run as a quoted search path entry."""
    import shutil

    from fnsysid.app.preflight import preflight

    conf = tmp_path / "own,dir's [conf]"
    shutil.copytree(CONF, conf)
    _, cfg = preflight(["--config-dir", str(conf), "system=duffing", "M=3",
                        f"hydra.run.dir={tmp_path / 'run'}"])
    assert cfg.hydra.runtime.choices.system == "duffing"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_feature_map_of_ones_own_is_named_and_listed_among_those_that_fit(tmp_path):
    from fnsysid.app.preflight import preflight
    from fnsysid.config.checks import ConfigError

    own = tmp_path / "conf" / "feature_map"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("_target_: fnsysid.dynamics.features.Polynomial\n"
                                   "degree: 1\nvariables: xu\nbias: false\n")
    (own / "sines.yaml").write_text(
        "_target_: fnsysid.dynamics.features.Concat\nlibraries:\n"
        "  - {_target_: fnsysid.dynamics.features.Fourier, variables: x, n_frequencies: 1}\n"
        "  - {_target_: fnsysid.dynamics.features.Identity, variables: u, bias: false}\n")
    with pytest.raises(ConfigError) as info:
        preflight(["--config-dir", str(tmp_path / "conf"), "system=synthetic",
                   "feature_map=mine", f"hydra.run.dir={tmp_path / 'run'}"])
    assert str(info.value).startswith("feature_map=mine does not fit system=synthetic")
    assert str(info.value).endswith("options that fit: combined, default, fourier, sines")


FEDAVGM = ROOT / "examples" / "fedavgm"


@pytest.mark.slow
def test_the_fedavgm_example_runs_its_own_server_update(tmp_path):
    """docs/EXTENDING.md's worked strategy: under the default optimizer.affine=true its server
    update runs (not FedAvg's precomputed map), the log says so, and beta=0 is FedAvg."""
    args = ("M=5", "R=15", "repeats=2", "progress=false", "output.plot=false")
    res = cli("strategy=fedavgm", *args, f"hydra.run.dir={tmp_path / 'm'}",
              conf=FEDAVGM / "conf", path=FEDAVGM)
    assert res.returncode == 0, res.stderr
    assert ("strategy fedavgm.FedAvgM overrides server_update of FedAvg: its rounds run as "
            "message exchanges") in res.stdout + res.stderr
    momentum = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert momentum["strategy"] == "fedavgm" and momentum["status"] == "ok"

    sys.path.insert(0, str(FEDAVGM))
    try:
        base = {"M": 5, "R": 15, "repeats": 2, "progress": False}
        fedavg = engine(base).errors
        zero = fnsysid.run({**base, "strategy": "fedavgm", "strategy.beta": 0.0},
                           config_dir=FEDAVGM / "conf").errors
    finally:
        sys.path.remove(str(FEDAVGM))
    np.testing.assert_allclose(zero["e_max"], fedavg["e_max"], rtol=1e-10)
    final = fedavg[fedavg["round"] == 15]["e_max"].mean()
    assert abs(momentum["final_e_max_mean"] - final) > 1e-2          # not FedAvg's numbers


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.skipif(not runtime_check.flower_installed(), reason="Flower is not installed")
def test_the_fedavgm_example_runs_on_flower_as_in_process(tmp_path):
    """Its server update runs in the ServerApp, FedAvg's client update in each ClientApp."""
    args = ("strategy=fedavgm", "M=3", "R=5", "repeats=2", "progress=false", "output.plot=false")
    for name, extra in (("a", ()), ("b", ("runtime=flower",))):
        res = cli(*args, *extra, f"hydra.run.dir={tmp_path / name}", conf=FEDAVGM / "conf",
                  path=FEDAVGM)
        assert res.returncode == 0, res.stderr[-2000:]
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    np.testing.assert_allclose(eb["e_max"], ea["e_max"], rtol=0, atol=1e-10)
    assert ea["e_max"].iloc[-1] < ea["e_max"].iloc[0] - 0.05          # the rounds did something
