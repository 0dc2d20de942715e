"""The pooled Gram's condition number: computed on the kept terms, and a
status that is not ``ok`` (with a warning) when it leaves the estimate no correct digit."""

from __future__ import annotations

import numpy as np
import pandas as pd

import fnsysid
from fnsysid.results.metrics import COND_LIMIT, gram_condition


def test_gram_condition_equals_numpy_on_the_kept_terms():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2, 3, 50, 4)) * np.array([1.0, 1e3, 1e-3, 0.0])   # one zero column
    H = np.einsum("smti,smtj->smij", X, X)
    keep = np.array([[True, True, True, True], [True, False, True, True]])
    cond = gram_condition(H, keep)
    for s in range(2):
        use = keep[s] & (np.arange(4) < 3)
        Z = X[s].reshape(-1, 4)[:, use]
        np.testing.assert_allclose(cond[s], np.linalg.cond(Z) ** 2, rtol=1e-6)
    assert cond[0] > 1e11 and cond[1] < 1e7       # (1e3 / 1e-3)^2 with the third column


def fleet(path, escape: bool):
    """Four clients of x+ = 0.9 x + 0.5 u (one state); with ``escape`` one trajectory of
    client c0 runs x+ = 2 x + u from 1, to about 1e14 after 47 steps."""
    rng = np.random.default_rng(0)
    rows = []
    for c in range(4):
        for j in range(3):
            T = 48
            x, u = np.empty(T), rng.normal(size=T)
            x[0] = rng.normal()
            grow = escape and c == 0 and j == 0
            if grow:
                x[0] = 1.0
            for t in range(T - 1):
                x[t + 1] = 2 * x[t] + u[t] if grow else 0.9 * x[t] + 0.5 * u[t] + \
                    0.01 * rng.normal()
            rows.append(pd.DataFrame({"client": f"c{c}", "trajectory": j, "x": x, "u": u,
                                      "split": "train" if j < 2 else "val"}))
    file = path / "fleet.csv"
    pd.concat(rows).to_csv(file, index=False)
    return file


def run(file):
    return fnsysid.run(["system=generic", "data=files", f"data.path={file}", "data.states=[x]",
                        "data.inputs=[u]", "feature_map=polynomial", "feature_map.degree=3",
                        "strategy=centralized_exact", "output.plot=false", "progress=false"])


def test_an_escaping_trajectory_makes_the_status_ill_conditioned(tmp_path, caplog):
    caplog.set_level("WARNING", logger="fnsysid")
    good = run(fleet(tmp_path, escape=False))
    assert good.summary["status"] == "ok"
    assert good.summary["conditioning"]["cond"][0] < 1e6
    assert not [r for r in caplog.records if "condition number" in r.getMessage()]
    bad = run(fleet(tmp_path, escape=True))
    c = bad.summary["conditioning"]
    assert bad.summary["status"] == "ill_conditioned" and c["repeats"] == [0]
    assert c["cond"][0] >= COND_LIMIT and c["limit"] == COND_LIMIT
    said = [r.getMessage() for r in caplog.records if "condition number" in r.getMessage()]
    assert len(said) == 1 and "status: ill_conditioned" in said[0]


def test_the_command_line_exits_3_on_an_ill_conditioned_pooled_fit(tmp_path):
    """The issue's case from the command line: a pooled fit whose Gram is singular to working
    precision (one trajectory escaped to ~1e14) is not printed as ok: exit code 3, the
    summary's status and an error line naming it."""
    import json

    from tests.conftest import cli_in_process

    file = fleet(tmp_path, escape=True)
    out = tmp_path / "run"
    res = cli_in_process("system=generic", "data=files", f"data.path={file}",
                         "data.states=[x]", "data.inputs=[u]", "feature_map=polynomial",
                         "feature_map.degree=3", "strategy=centralized_exact",
                         "output.plot=false", "progress=false", f"hydra.run.dir={out}")
    assert res.returncode == 3
    assert "status: ill_conditioned" in res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ill_conditioned"
    assert summary["conditioning"]["repeats"] == [0]
