"""Sweeps through Hydra's submitit launcher (extra `cluster`): SLURM config, local jobs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
needs_submitit = pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
    reason="hydra-submitit-launcher is not installed (extra: pip install -e '.[cluster]' or "
           "make install-cluster)")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@needs_submitit
def test_slurm_launcher_composes_with_our_settings(tmp_path):
    res = cli("hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug",
              "hydra.launcher.timeout_min=30", "hydra.launcher.cpus_per_task=2",
              "--cfg", "hydra", "-p", "hydra.launcher", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "submitit_launcher.SlurmLauncher" in res.stdout
    for line in ("partition: debug", "timeout_min: 30", "cpus_per_task: 2"):
        assert line in res.stdout


@needs_submitit
@pytest.mark.slow
def test_two_job_sweep_with_submitit_local_equals_joblib(tmp_path):
    sweep = ["-m", "system=synthetic", "M=3,6", "R=15", "repeats=2", "output.plot=false"]
    for launcher in ("joblib", "submitit_local"):
        res = cli(*sweep, f"hydra/launcher={launcher}", f"hydra.sweep.dir={tmp_path / launcher}",
                  cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    jobs = sorted(p.name for p in (tmp_path / "joblib").iterdir() if p.is_dir())
    assert jobs == sorted(p.name for p in (tmp_path / "submitit_local").iterdir()
                          if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2
    for job in jobs:
        a = pd.read_csv(tmp_path / "joblib" / job / "errors.csv")
        b = pd.read_csv(tmp_path / "submitit_local" / job / "errors.csv")
        pd.testing.assert_frame_equal(a, b)
        assert a["e_max"].iloc[-1] < a["e_max"].iloc[0]
    ta = pd.read_csv(tmp_path / "joblib" / "results.csv")
    tb = pd.read_csv(tmp_path / "submitit_local" / "results.csv")
    assert len(ta) == len(tb) == 2 * 16                  # one row per job and round
    pd.testing.assert_frame_equal(ta, tb)
    assert (tmp_path / "submitit_local" / ".submitit").is_dir()    # the jobs ran through it
