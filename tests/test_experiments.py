"""Experiment files (paper figures and studies) compose; the slow test runs them all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fnsysid.app.build import build
from fnsysid.config.checks import check_run
from fnsysid.config.groups import CONF_DIR, options
from fnsysid.dynamics.model import centred_stats, generate
from tests.conftest import make

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = options("experiment")
REGISTRY = yaml.safe_load((ROOT / "scripts" / "figures.yaml").read_text())


def _first_job(params) -> list[str]:
    """The overrides of a sweep's first job: the first value of every swept setting."""
    return [f"{k}={str(v).split(',')[0]}" for k, v in params.items()]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_as_a_multirun_sweep(name):
    """The experiment's first job composed once, with Hydra's node: the sweep settings, then
    the run config (the node dropped, as compose does without return_hydra_config)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict, read_write

    spec = yaml.safe_load((CONF_DIR / "experiment" / f"{name}.yaml").read_text())
    first = _first_job(spec["hydra"]["sweeper"]["params"])
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["progress=false", f"experiment={name}", *first],
                      return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    # a stored sweep gets its own timestamped folder: a rerun never adds jobs to an older sweep
    assert re.fullmatch(rf"outputs/sweeps/{name}/\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d-\d{{6}}",
                        cfg.hydra.sweep.dir)
    params = cfg.hydra.sweeper.params
    assert params and all("," in str(v) for v in params.values())
    assert _first_job(params) == first              # the composed sweep's first job
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    check_run(cfg)
    build(cfg)


def test_every_experiment_is_drawn_and_every_panel_names_an_experiment():
    used = {p["experiment"] for fig in REGISTRY.values() for p in fig["panels"]}
    assert used == set(EXPERIMENTS)


def test_centred_stats_equal_statistics_of_centred_samples():
    _, model, *_ = make("system=pendulum", "system.x0.scale=[0.3,0.3]")
    d = generate(model, M=2, N=[3, 6], T=5, eps=0.1, repeats=1, seed=0, keep_samples=True)
    H, b = centred_stats(d, model.structure)
    m = d.mask[0, 0] > 0
    Phi = d.Phi[0, 0][m] - d.Phi[0, 0][m].mean(axis=0)
    Y = d.Y[0, 0][m] - d.Y[0, 0][m].mean(axis=0)
    np.testing.assert_allclose(H[0, 0], Phi.T @ Phi, rtol=1e-10, atol=1e-18)
    np.testing.assert_allclose(b[0, 0], Phi.T @ Y[:, 0], rtol=1e-10, atol=1e-18)


@pytest.mark.slow
def test_every_figure_builds_from_a_short_run_of_every_experiment(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_figure.py"), "--all",
                          "--sweeps", str(tmp_path / "sweeps"), "--out", str(tmp_path / "figs"),
                          "--override", "R=2", "--override", "repeats=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    import pandas as pd

    for name, spec in REGISTRY.items():
        for suffix in (".png", ".pdf"):
            assert (tmp_path / "figs" / f"{name}{suffix}").stat().st_size > 5000
        table = pd.read_csv(tmp_path / "figs" / f"{name}.csv")
        assert set(table["panel"]) == {p.get("panel", p["title"]) for p in spec["panels"]}


@pytest.mark.slow
def test_make_figure_runs_experiments_and_draws_each_figure_when_its_runs_are_done(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_figure
    finally:
        sys.path.pop(0)
    out, sweeps = tmp_path / "figs", tmp_path / "sweeps"
    args = ["error_vs_k", "--out", str(out), "--sweeps", str(sweeps), "--override", "R=2",
            "--override", "repeats=1", "--override", "hydra.sweeper.params.K='1,50'",
            "--jobs", "2"]                             # two experiments of two jobs each
    assert make_figure.main(args) == 0
    for suffix in (".png", ".pdf"):
        assert (out / f"error_vs_k{suffix}").stat().st_size > 5000
    import pandas as pd

    table = pd.read_csv(out / "error_vs_k.csv")
    assert table.groupby("panel")["K"].apply(sorted).tolist() == [[1, 50]] * 2
    for e in ("k_synthetic", "k_pendulum"):
        assert len(list((sweeps / e).glob("*/summary.json"))) == 2
        assert pd.read_csv(sweeps / e / "results.csv")["round"].max() == 2
    redrawn = tmp_path / "again"
    assert make_figure.main(["error_vs_k", "--out", str(redrawn), "--sweeps", str(sweeps),
                             "--plot-only", "--jobs", "1"]) == 0
    for suffix in (".png", ".pdf", ".csv"):
        assert (redrawn / f"error_vs_k{suffix}").read_bytes() == \
            (out / f"error_vs_k{suffix}").read_bytes()
    assert make_figure.main(["rate", "--plot-only", "--sweeps", str(sweeps),
                             "--out", str(redrawn)]) == 2                 # no rate sweeps
