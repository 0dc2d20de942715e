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


@pytest.mark.slow
def test_import_changes_no_environment_and_lists_the_public_api():
    """``import fnsysid`` sets no variable and loads nothing heavy; every name of
    ``__all__`` resolves and ``dir()`` shows them."""
    code = (
        "import json, os, sys\n"
        "before = dict(os.environ)\n"
        "import fnsysid\n"
        "out = {'env_same': dict(os.environ) == before,\n"
        "       'heavy': sorted(m for m in ('numpy', 'pandas', 'hydra', 'omegaconf',\n"
        "                                   'matplotlib') if m in sys.modules),\n"
        "       'dir': dir(fnsysid), 'all': fnsysid.__all__,\n"
        "       'resolved': [getattr(fnsysid, n).__name__ for n in fnsysid.__all__\n"
        "                    if n != '__version__']}\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    import json

    out = json.loads(res.stdout)
    assert out["env_same"] and out["heavy"] == []
    assert set(out["all"]) == {"run", "load_trajectories", "Result", "ConfigError",
                               "DataError", "FederatedSysID", "__version__"}
    assert set(out["all"]) <= set(out["dir"])
    assert out["resolved"] == ["run", "load_trajectories", "Result", "ConfigError", "DataError",
                               "FederatedSysID"]
