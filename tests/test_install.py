"""Installable as a package: a non-editable install into a fresh virtualenv runs from any folder."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_non_editable_install_runs_from_any_folder(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # a copy of the repository, so the install cannot lean on the checkout's conf/
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(ROOT), str(src)], check=True)
    for junk in (".venv", "outputs", "multirun"):
        subprocess.run(["rm", "-rf", str(src / junk)], check=True)
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(src)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    subprocess.run(["rm", "-rf", str(src)], check=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    bin_dir = env_dir / "bin"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run([str(bin_dir / "fnsysid"), "system=pendulum", "M=5", "R=5",
                          "progress=false", "hydra.run.dir=run"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "final e_R" in res.stdout and (work / "run" / "errors.csv").exists()
    sweep = subprocess.run([str(bin_dir / "fnsysid"), "-m", "system=pendulum", "M=2,3", "R=3",
                            "repeats=1", "progress=false", "hydra.sweep.dir=sweep"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stderr
    plot = subprocess.run([str(bin_dir / "fnsysid-plot"), "sweep", "--out", "sweep.png"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr
    assert (work / "sweep.png").stat().st_size > 10_000
    where = subprocess.run([str(py), "-c", "import fnsysid.config.groups as o; print(o.CONF_DIR)"],
                           cwd=work, env=env, capture_output=True, text=True)
    assert str(env_dir) in where.stdout and sys.prefix not in where.stdout
