"""``scripts/flower_deploy.py --compare``: two finished runs compared without a deployment
(the check of a manual deployment against the in-process run, docs/FEDERATED.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import fnsysid

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "flower_deploy.py"


def _deploy():
    spec = importlib.util.spec_from_file_location("flower_deploy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_compare_two_runs_passes_equal_ones_and_refuses_others(tmp_path, capsys):
    run = ["system=synthetic", "M=4", "R=3", "repeats=2", "output.plot=false",
           "progress=false"]
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        fnsysid.run([*run, f"seed={seed}"], tmp_path / name)
    deploy = _deploy()
    report = deploy.main(["--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert report == {"max_abs_diff": 0.0, "max_abs_diff_estimates": 0.0}
    assert capsys.readouterr().out.strip() == (
        "max |difference| of the errors and held-out NRMSE per round: 0.00e+00; of the "
        "estimates: 0.00e+00")
    with pytest.raises(SystemExit, match="differ by more than 1e-10"):
        deploy.main(["--compare", str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(SystemExit, match="is not a run folder"):
        deploy.main(["--compare", str(tmp_path / "a"), str(tmp_path)])
