"""Client ids that would do harm in the result tables are refused in one line: ids that a
spreadsheet runs as formulas (OWASP CSV injection), and ids of two types that are one as text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.config.errors import DataError
from tests.conftest import cli_in_process


def fleet(ids, n: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [(c, 0, t, *rng.normal(size=3)) for c in ids for t in range(n)]
    return pd.DataFrame(rows, columns=["client", "trajectory", "t", "x1", "x2", "u"])


def write_folder(folder, names):
    folder.mkdir()
    for name in names:
        one = fleet([name]).drop(columns=["client", "trajectory"])
        one.to_csv(folder / f"{name}.csv", index=False)


@pytest.mark.parametrize("bad", ["=SUM(A1)", "+cmd", "-x", "@sum", "\tx"])
def test_a_formula_id_from_a_file_name_is_refused(tmp_path, bad):
    write_folder(tmp_path / "logs", [bad, "b"])
    res = cli_in_process("system=generic", "data=files", f"data.path={tmp_path / 'logs'}",
                         "data.states=[x1,x2]", "data.inputs=[u]", "R=2", "output.plot=false",
                         f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 2
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("fnsysid:")]
    assert len(err) == 1 and "run as a formula" in err[0] and repr(bad) in err[0]
    assert not (tmp_path / "run").exists()


def test_a_formula_id_in_a_client_column_is_refused_and_numbers_pass(tmp_path):
    with pytest.raises(DataError, match="'=1\\+1' starts with '='"):
        fnsysid.FederatedSysID(R=2, progress=False).fit(fleet(["=1+1", "b"]),
                                                         states=["x1", "x2"], inputs=["u"])
    path = tmp_path / "fleet.csv"
    fleet(["-1", "-2", "+3"]).to_csv(path, index=False)
    df = fnsysid.load_trajectories(path, states=["x1", "x2"], inputs=["u"])
    assert sorted(df["client"].unique()) == ["+3", "-1", "-2"]


def test_ids_of_two_types_that_are_one_as_text_are_refused():
    with pytest.raises(DataError, match=r"holds 0 \(int\) and '0' \(str\), which are one "
                                        r"client id as text"):
        fnsysid.FederatedSysID(R=2, progress=False).fit(fleet([0, "0", 1]),
                                                         states=["x1", "x2"], inputs=["u"])
    m = fnsysid.FederatedSysID(R=2, progress=False).fit(fleet([0, 1]), states=["x1", "x2"],
                                                         inputs=["u"])
    assert m.clients_ == ["0", "1"]
