"""fnsysid.FederatedSysID: fits a fleet held in memory through the command line's engine (same
numbers as the command line on the same files), predicts, simulates, scores, prints."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.app.estimator import FederatedSysID
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent
STATES, INPUTS = ["x1", "x2"], ["u"]


def fleet(n_clients: int = 4, n_traj: int = 4, length: int = 30, seed: int = 0) -> pd.DataFrame:
    """A fleet of damped oscillators, one row per sample; the last trajectory of each client is
    held out (``split=val``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_clients):
        k, g = 1.0 + 0.1 * rng.random(), 0.5 + 0.05 * rng.random()
        for j in range(n_traj):
            x = rng.uniform(-1.0, 1.0, 2)
            for t in range(length):
                u = rng.uniform(-1.0, 1.0)
                rows.append((f"r{c}", j, 0.1 * t, x[0], x[1], u,
                             "val" if j == n_traj - 1 else "train"))
                x = np.array([x[0] + 0.1 * x[1], x[1] + 0.1 * (-k * x[0] - 0.2 * x[1] + g * u)])
                x += 0.002 * rng.standard_normal(2)
    return pd.DataFrame(rows, columns=["client", "trajectory", "t", *STATES, *INPUTS, "split"])


SETTINGS = dict(strategy="fedavg", R=20, progress=False,
                config={"feature_map.degree": 2, "optimizer.scale_features": "whiten"})


@pytest.fixture(scope="module")
def fitted():
    df = fleet()
    return FederatedSysID(feature_map="polynomial", **SETTINGS).fit(df, STATES, INPUTS), df


@pytest.mark.slow
def test_a_fleet_in_memory_writes_nothing_and_gives_the_command_lines_numbers(tmp_path,
                                                                              monkeypatch):
    df = fleet()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    m = FederatedSysID(feature_map="polynomial", **SETTINGS)
    assert m.fit(df, states=STATES, inputs=INPUTS) is m                 # fit returns self
    assert list(here.iterdir()) == []                                   # nothing written
    # the same data in a file, through the command line
    df.to_parquet(tmp_path / "fleet.parquet")
    out = tmp_path / "cli"
    proc = cli_in_process("system=generic", "data=files", f"data.path={tmp_path}/fleet.parquet",
                          "data.states=[x1,x2]", "data.inputs=[u]", "feature_map=polynomial",
                          "feature_map.degree=2", "optimizer.scale_features=whiten",
                          "strategy=fedavg", "R=20", "progress=false", "output.plot=false",
                          f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr
    cli = pd.read_csv(out / "estimates.csv")
    coef = m.coefficients()
    assert list(coef.columns) == ["parameter", "value"]
    assert list(coef["parameter"]) == list(cli["parameter"])
    np.testing.assert_allclose(coef["value"], cli["estimate"], rtol=1e-12, atol=1e-15)
    summary = json.loads((out / "summary.json").read_text())
    val = df[df["split"] == "val"]
    for kind, col in (("one_step", "nrmse_1step_mean"), ("free_run", "nrmse_sim_mean")):
        assert m.summary_[f"final_{col}"] == pytest.approx(summary[f"final_{col}"], rel=1e-9)
        assert m.nrmse(val, kind=kind) == pytest.approx(summary[f"final_{col}"], rel=1e-9)
    errors = pd.read_csv(out / "errors.csv")
    np.testing.assert_allclose(m.history_["nrmse_1step_mean"], errors["nrmse_1step_mean"],
                               rtol=1e-9)
    # a mapping client -> DataFrame and the path of the file give the same fit
    parts = {c: g.drop(columns="client") for c, g in df.groupby("client")}
    by_client = FederatedSysID(feature_map="polynomial", **SETTINGS).fit(parts, STATES, INPUTS)
    by_path = FederatedSysID(feature_map="polynomial", **SETTINGS).fit(
        tmp_path / "fleet.parquet", STATES, INPUTS)
    for other in (by_client, by_path):
        np.testing.assert_allclose(other.coefficients()["value"], coef["value"], rtol=1e-12)
    assert list(here.iterdir()) == []


@pytest.mark.slow
def test_predict_and_simulate_give_one_row_per_row_from_the_identified_model(fitted):
    m, df = fitted
    val = df[df["split"] == "val"].sort_values("client", ascending=False, kind="stable")
    pred, sim = m.predict(val), m.simulate(val)
    for out in (pred, sim):
        assert len(out) == len(val) and out.index.equals(val.index)
        assert list(out[["client", "trajectory", "t"]].itertuples(index=False)) == \
            list(val[["client", "trajectory", "t"]].itertuples(index=False))
    # by hand: x+ = Theta phi(x, u), phi = [1, x1, x2, u, x1^2, x1 x2, x1 u, x2^2, x2 u, u^2]
    theta = m.coefficients().set_index("parameter")["value"]
    feats = ["1", "x1", "x2", "u", "x1^2", "x1*x2", "x1*u", "x2^2", "x2*u", "u^2"]
    Th = np.array([[theta[f"{s}+:{f}"] for f in feats] for s in STATES])

    def step(x, u):
        x1, x2 = x
        return Th @ np.array([1, x1, x2, u, x1 * x1, x1 * x2, x1 * u, x2 * x2, x2 * u, u * u])

    one = df[(df["client"] == "r2") & (df["split"] == "val")]
    X, U = one[STATES].to_numpy(), one["u"].to_numpy()
    p = pred.loc[one.index, STATES].to_numpy()
    assert np.isnan(p[0]).all()                              # no previous row
    np.testing.assert_allclose(p[1:], [step(X[t], U[t]) for t in range(len(X) - 1)],
                               rtol=1e-12)
    s = sim.loc[one.index, STATES].to_numpy()
    run = [X[0]]
    for t in range(len(X) - 1):
        run.append(step(run[-1], U[t]))
    np.testing.assert_allclose(s, run, rtol=1e-10)
    assert not np.allclose(s[5:], X[5:], rtol=1e-3)          # a free run, not the data
    # the score is the NRMSE of these predictions (one client: RMSE / std, mean over states)
    nrmse = np.mean([np.sqrt(np.mean((p[1:, k] - X[1:, k]) ** 2)) / X[:, k].std()
                     for k in range(2)])
    assert m.nrmse(one) == pytest.approx(nrmse, rel=1e-9)
    assert m.nrmse(one, kind="free_run") == pytest.approx(np.mean(
        [np.sqrt(np.mean((s[1:, k] - X[1:, k]) ** 2)) / X[:, k].std() for k in range(2)]),
        rel=1e-9)


@pytest.mark.slow
def test_equations_one_string_per_state_and_print_shows_them(fitted):
    m, _ = fitted
    eqs = m.equations()
    assert len(eqs) == 2 and eqs[0].startswith("x1+ = ") and eqs[1].startswith("x2+ = ")
    theta = m.coefficients().set_index("parameter")["value"]
    assert f"{theta['x1+:x2']:.4g} x2" in eqs[0] and f"{abs(theta['x2+:u']):.4g} u" in eqs[1]
    text = str(m)
    assert eqs[0] in text and eqs[1] in text
    lines = repr(m).splitlines()
    assert len(lines) == 2
    assert lines[0] == ("FederatedSysID(system=generic, feature_map=polynomial, strategy=fedavg,"
                        " M=4, R=20)")
    assert f"one-step {m.summary_['final_nrmse_1step_mean']:.4g}" in lines[1]
    assert "status ok" in lines[1]
    assert repr(FederatedSysID(R=5)) == "FederatedSysID(R=5) (not fitted)"
    assert "FederatedSysID" in dir(fnsysid) and fnsysid.FederatedSysID is FederatedSysID


def test_exact_zeros_are_left_out_and_uncertainty_columns_pass_through(fitted):
    m, _ = fitted
    res = m.result_
    est = res.estimate.copy()
    names = res.model.param_names
    est[0, 0, names.index("x1+:x1^2")] = 0.0
    est[0, 0, names.index("x1+:1")] = 0.0
    table = res.estimates.assign(se=0.01, ci_lo=lambda t: t["estimate"] - 0.02,
                                 ci_hi=lambda t: t["estimate"] + 0.02)
    other = FederatedSysID()
    other.result_ = dataclasses.replace(res, estimate=est, tables={**res.tables,
                                                                   "estimates": table})
    other.clients_, other.states_, other.inputs_ = m.clients_, STATES, INPUTS
    eq = other.equations()[0]
    assert " x1^2" not in eq and eq.startswith(f"x1+ = {est[0, 0, names.index('x1+:x1')]:.4g} x1 ")
    coef = other.coefficients()
    assert list(coef.columns) == ["parameter", "value", "se", "ci_lo", "ci_hi"]
    np.testing.assert_allclose(coef["ci_hi"], table["estimate"] + 0.02)


@pytest.mark.slow
def test_a_bad_row_names_the_client_and_the_row_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df = fleet(n_clients=2, n_traj=2, length=5)
    df.loc[7, "x2"] = np.nan                  # client r0, its 8th row
    m = FederatedSysID(R=2, output_dir=tmp_path / "out")
    with pytest.raises(fnsysid.ConfigError) as exc:
        m.fit(df, STATES, INPUTS)
    assert str(exc.value) == ("data, client 'r0': row 8 (index 7), column 'x2' is empty or NaN; "
                              "allowed: finite numbers (data.missing=split leaves such rows "
                              "out of a fit and splits their trajectory there)")
    bad = df.copy()
    bad["x2"] = bad["x2"].astype(object)
    bad.loc[13, "x2"] = "abc"                  # client r1, its 4th row
    with pytest.raises(fnsysid.DataError, match=r"^data, client 'r1': row 4 \(index 13\), "
                                                r"column 'x2': 'abc' is not a number; allowed: "
                                                r"finite numbers$"):
        m.fit(bad, STATES, INPUTS)
    with pytest.raises(fnsysid.DataError, match=r"^data: row 3 \(index 2\), column 'client' "
                                                "is empty"):
        m.fit(df.assign(client=df["client"].where(df.index != 2)), STATES, INPUTS)
    with pytest.raises(fnsysid.DataError, match="^data, client 'r1': column 'u' "
                                                r"\(data.inputs\) is missing"):
        m.fit({"r0": df[df.client == "r0"], "r1": df[df.client == "r1"].drop(columns="u")},
              STATES, INPUTS)
    clean = fleet(n_clients=2, n_traj=2, length=5)
    r1 = clean[clean.client == "r1"].drop(columns="client").set_axis(list("abcdefghij"))
    r1.loc["c", "t"] = 0.0                                 # t goes back in its 3rd row
    with pytest.raises(fnsysid.DataError, match=r"^data, client 'r1': row 3 \(index 'c'\): "
                                                "t=0 does not increase within client 'r1'"):
        m.fit({"r0": clean[clean.client == "r0"].drop(columns="client"), "r1": r1}, STATES,
              INPUTS)
    with pytest.raises(fnsysid.ConfigError, match="^data: a value of type ndarray is not "
                                                  "trajectory data"):
        m.fit(df[STATES].to_numpy(), STATES)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_settings_are_refused_as_the_command_line_refuses_them(tmp_path):
    df = fleet(n_clients=2, n_traj=2, length=5)
    cases = [(FederatedSysID(strategy="nope"), "strategy=nope is not an option; allowed:"),
             (FederatedSysID(N=5), "N=5 does not apply with data=files"),
             (FederatedSysID(config=["data.path=x.csv"]), "data.path: fit() was given data"),
             (FederatedSysID(runtime="flower"), "runtime=flower: each Flower client reads"),
             (FederatedSysID(M=3), "M=3 does not match data.path=<DataFrame>, which holds 2 "
                                   "clients")]
    for m, message in cases:
        with pytest.raises(fnsysid.ConfigError) as exc:
            m.fit(df, STATES, INPUTS)
        assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    with pytest.raises(fnsysid.ConfigError, match=r"^states: fit\(data\) identifies "
                                                  "system=generic from named columns"):
        FederatedSysID().fit(df)
    with pytest.raises(fnsysid.ConfigError, match=r"^config: item 2 \(the int 3\) is not an "
                                                  "override string"):
        FederatedSysID(config=["R=2", 3]).fit(df, STATES, INPUTS)
    m = FederatedSysID(config=["R=2", "progress=false"]).fit(df, STATES, INPUTS)
    assert m.summary_["R"] == 2 and len(m.history_) == 3
    with pytest.raises(fnsysid.ConfigError, match="^client=r0: strategy=fedavg gives one server "
                                                  r"model, no model of each client; allowed: "
                                                  r"client=None, or a fit that gives one per "
                                                  r"client \(strategy=local"):
        m.predict(df, client="r0")
    with pytest.raises(fnsysid.ConfigError, match="^kind=sim is not allowed; allowed: "
                                                  "one_step, free_run$"):
        m.nrmse(df, kind="sim")
    with pytest.raises(ValueError, match="not fitted yet"):
        FederatedSysID().predict(df)


@pytest.mark.slow
def test_strategy_local_gives_each_client_its_own_model(fitted):
    _, df = fitted
    m = FederatedSysID(strategy="local", R=20, progress=False).fit(df, STATES, INPUTS)
    coef = m.coefficients()
    assert list(coef.columns) == ["client", "parameter", "value"] and len(coef) == 4 * 6
    assert list(m.coefficients(client="r1")["value"]) == \
        list(coef[coef["client"] == "r1"]["value"])
    val = df[df["split"] == "val"]
    # each client's rows by its own model: the run's score
    assert m.nrmse(val) == pytest.approx(m.summary_["final_nrmse_1step_mean"], rel=1e-9)
    one = val[val["client"] == "r3"]
    own = m.predict(one)
    np.testing.assert_array_equal(own[STATES], m.predict(one, client="r3")[STATES])
    assert not np.allclose(m.predict(one, client="r0")[STATES].iloc[1:], own[STATES].iloc[1:])
    assert m.equations(client="r1") != m.equations(client="r2")
    with pytest.raises(fnsysid.ConfigError, match="^client=None: strategy=local gives a model "
                                                  "of each client"):
        m.equations()
    with pytest.raises(fnsysid.DataError, match="client 'r9' has no model of its own"):
        m.predict(one.assign(client="r9"))


@pytest.mark.slow
def test_output_dir_writes_the_run_and_a_simulation_needs_no_data(tmp_path):
    df = fleet(n_clients=2, n_traj=3, length=10)
    m = FederatedSysID(R=3, progress=False, output_dir=tmp_path / "out",
                       config={"output.plot": False}).fit(df, STATES, INPUTS)
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"errors.csv", "estimates.csv", "summary.json", "config.yaml"} <= files
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["final_nrmse_1step_mean"] == pytest.approx(m.summary_["final_nrmse_1step_mean"])
    sim = FederatedSysID(system="pendulum", M=3, R=5, repeats=1, progress=False).fit()
    assert sim.equations()[0].startswith("d_omega = ")
    assert len(sim.coefficients()) == 2


@pytest.mark.slow
def test_the_notebook_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["notebook.py", str(tmp_path)])
    ns = runpy.run_path(str(ROOT / "examples" / "notebook.py"), run_name="__main__")
    m = ns["model"]
    assert m.summary_["status"] == "ok" and len(m.equations()) == 2
    assert (tmp_path / "notebook_fit.png").stat().st_size > 0
    assert os.listdir(tmp_path) == ["notebook_fit.png"]


def test_a_fit_that_diverges_says_so_and_its_model_is_not_used():
    m = FederatedSysID(system="pendulum", M=3, R=100, lr=1.9, repeats=1, progress=False)
    with pytest.warns(UserWarning, match="^fnsysid: the fit ended with status 'diverged'"):
        m.fit()
    assert m.summary_["status"] == "diverged"
    assert "status diverged" in repr(m).splitlines()[1]
    with pytest.raises(ValueError, match="^the fit diverged at round 67"):
        m.coefficients()


def test_a_result_prints_in_one_line_and_a_dataframe_setting_points_to_the_estimator():
    res = fnsysid.run({"system": "synthetic", "M": 3, "R": 2, "repeats": 1, "progress": False})
    text = repr(res)
    assert "\n" not in text and "array" not in text
    assert text.startswith("Result(status=ok, system=synthetic, strategy=fedavg, M=3, rounds=2, "
                           f"e_max_mean={res.summary['final_e_max_mean']:.4g}, ")
    assert text.endswith("; tables: errors, clients, estimates, theory, parameters)")
    with pytest.raises(fnsysid.ConfigError) as exc:
        fnsysid.run({"system": "generic", "data": "files", "data.path": fleet(2, 2, 3)})
    assert str(exc.value).startswith("data.path: a value of type DataFrame is not a setting "
                                     "value (trajectories in a DataFrame: fnsysid."
                                     "FederatedSysID().fit(df) takes them); allowed:")


def test_client_picks_a_personalized_model_where_the_result_holds_them(fitted):
    m, df = fitted
    res = copy.copy(m.result_)
    own = np.stack([res.estimate[:, 0] * (1 + 0.1 * c) for c in range(4)], axis=1)  # (1, 4, p)
    res.client_models = own
    other = FederatedSysID()
    other.result_ = res
    other.clients_, other.states_, other.inputs_ = m.clients_, STATES, INPUTS
    coef = other.coefficients(client="r2")
    assert list(coef.columns) == ["client", "parameter", "value"] and set(coef["client"]) == {"r2"}
    np.testing.assert_array_equal(coef["value"], own[0, 2])
    one = df[(df["client"] == "r0") & (df["split"] == "val")]
    by_r2 = other.predict(one, client="r2")
    x, u = one[STATES].to_numpy()[0], one["u"].to_numpy()[0]
    np.testing.assert_allclose(by_r2[STATES].to_numpy()[1],
                               res.model.predict(x, np.array([u]), own[0, 2]), rtol=1e-12)
    np.testing.assert_array_equal(other.predict(one)[STATES], m.predict(one)[STATES])  # server


@pytest.mark.slow
def test_pooled_intervals_and_personalized_models_of_a_real_fit():
    df = fleet()
    m = FederatedSysID(feature_map="polynomial", strategy="centralized_exact", R=2,
                       personalize="auto", progress=False,
                       config={"feature_map.degree": 1}).fit(df, STATES, INPUTS)
    coef = m.coefficients()
    assert list(coef.columns) == ["parameter", "value", "se", "ci_lo", "ci_hi"]
    assert (coef["se"] > 0).all()
    assert ((coef["ci_lo"] < coef["value"]) & (coef["value"] < coef["ci_hi"])).all()
    res = m.result_
    own = m.coefficients(client="r1")
    assert set(own["client"]) == {"r1"} and {"se", "ci_lo", "ci_hi"} <= set(own.columns)
    np.testing.assert_array_equal(own["value"], res.client_models[0, 1])
    assert not np.allclose(own["value"], coef["value"])                  # its own, not the pool
    # the default of a fit without intervals (FedAvg far from a fixed point): no such columns
    plain = FederatedSysID(feature_map="polynomial", **SETTINGS).fit(df, STATES, INPUTS)
    assert list(plain.coefficients().columns) == ["parameter", "value"]


def test_an_empty_dataframe_is_refused_in_one_line():
    df = fleet(n_clients=1, n_traj=2, length=5)
    with pytest.raises(fnsysid.DataError, match=r"^data: no rows; allowed: a DataFrame with one "
                                                r"row per sample$"):
        FederatedSysID(R=5).fit(df.iloc[:0], states=STATES, inputs=INPUTS)


def test_score_takes_the_val_rows_of_a_split_column(fitted):
    m, df = fitted
    val = df[df["split"] == "val"]
    both = m.nrmse(df)
    assert both == pytest.approx(m.nrmse(val), rel=1e-12)
    assert both != pytest.approx(m.nrmse(df.drop(columns="split")), rel=1e-6)   # all rows
    # no row marked val (e.g. fnsysid.load_trajectories of a file without a split column):
    # every row given is scored
    train = df[df["split"] == "train"]
    assert m.nrmse(train) == pytest.approx(m.nrmse(train.drop(columns="split")), rel=1e-12)
    assert m.nrmse(train) != pytest.approx(both, rel=1e-6)


def test_predict_returns_the_datas_own_column_names(tmp_path):
    df = fleet(n_clients=2, n_traj=3, length=8).rename(columns={"trajectory": "run_id",
                                                                 "t": "time"})
    m = FederatedSysID(R=3, progress=False, config={"data.trajectory": "run_id",
                                                    "data.time": "time"})
    m.fit(df, STATES, INPUTS)
    val = df[df["split"] == "val"]
    for out in (m.predict(val), m.simulate(val)):
        assert list(out.columns) == ["client", "run_id", "time", "split", *STATES]
        assert out["run_id"].tolist() == val["run_id"].tolist()
    folder = tmp_path / "files"
    folder.mkdir()
    for c, g in val.groupby("client"):
        g.drop(columns="client").to_csv(folder / f"{c}.csv", index=False)
    out = m.predict(folder)
    assert list(out.columns) == ["repeat", "client", "run_id", "time", "split", *STATES]


@pytest.fixture(scope="module")
def repeats():
    """A fit of two repeats labelled 3 and 7 (the second one's data differ)."""
    df = pd.concat([fleet(n_clients=2, n_traj=3, length=20, seed=s).assign(repeat=r)
                    for s, r in ((0, 3), (5, 7))], ignore_index=True)
    return FederatedSysID(R=5, progress=False).fit(df, STATES, INPUTS), df


@pytest.mark.slow
def test_several_repeats_need_the_datas_labels_or_repeat(repeats):
    m, df = repeats
    coef = m.coefficients()
    assert sorted(coef["repeat"].unique()) == [3, 7]
    est = m.result_.estimate
    np.testing.assert_array_equal(coef.loc[coef["repeat"] == 7, "value"], est[1, 0])
    seven = df[(df["repeat"] == 7) & (df["split"] == "val")]
    bare = seven.drop(columns="repeat")
    for call in (m.predict, m.simulate, m.score):
        with pytest.raises(fnsysid.ConfigError, match=r"^repeat=None: the fit has 2 repeats and "
                                                      r"data has no repeat column; allowed: "
                                                      r"repeat= one of 3, 7, or a repeat column$"):
            call(bare)
    pd.testing.assert_frame_equal(m.predict(bare, repeat=7)[STATES], m.predict(seven)[STATES])
    assert m.nrmse(bare, repeat=7) == pytest.approx(m.nrmse(seven), rel=1e-12)
    assert m.nrmse(bare, repeat=3) != pytest.approx(m.nrmse(seven), rel=1e-6)   # 3's model
    with pytest.raises(fnsysid.ConfigError, match=r"^repeat=0 is not a repeat of the fit; "
                                                  r"allowed: 3, 7$"):
        m.predict(bare, repeat=0)
    with pytest.raises(fnsysid.ConfigError, match="^repeat=7: data has a repeat column"):
        m.predict(seven, repeat=7)
    with pytest.raises(fnsysid.ConfigError, match="^repeat=None: the fit has 2 repeats"):
        m.equations()
    assert m.equations(repeat=7) != m.equations(repeat=3)
    text = str(m).splitlines()
    assert text[2] == "  repeat 3 (of 2: 3, 7):"
    assert text[3:] == [f"  {e}" for e in m.equations(repeat=3)]


def test_equations_show_small_terms_and_bracket_a_signed_feature(fitted):
    m, _ = fitted
    res = m.result_
    est = res.estimate.copy()
    names = res.model.param_names
    est[0, 0, names.index("x1+:x1^2")] = 1.234e-5
    est[0, 0, names.index("x1+:u")] = -2.5e-4
    other = FederatedSysID()
    other.result_ = dataclasses.replace(res, estimate=est)
    other.clients_, other.states_, other.inputs_ = m.clients_, STATES, INPUTS
    eq = other.equations()[0]
    assert "+ 1.234e-05 x1^2" in eq and "- 0.00025 u " in eq and "0.000 " not in eq
    pend = FederatedSysID(system="pendulum", R=2, M=2, repeats=1, progress=False).fit()
    (line,) = pend.equations()
    assert line.startswith("d_omega = ") and " (-g*sin(alpha)*dt) + " in line


def test_a_fitted_estimator_pickles(fitted):
    """A fitted FederatedSysID holds its checked settings, a model built at run time that
    pickle could not find by name (``joblib.dump`` raised PicklingError)."""
    import pickle

    m, df = fitted
    val = df[df["split"] == "val"]
    back = pickle.loads(pickle.dumps(m))
    assert type(back.result_.settings).__name__ == "CheckedSettings"
    pd.testing.assert_frame_equal(back.predict(val), m.predict(val))


@pytest.mark.slow
def test_an_estimator_of_libraries_side_by_side_pickles():
    """The README's ``combined`` and ``fourier`` (a Concat) nest a checked model of their
    own, which pickle could not find either (PicklingError: not the same object as
    fnsysid.config.schema.Combined)."""
    import pickle

    for fm, system in (("combined", "linear"), ("fourier", "synthetic")):
        est = FederatedSysID(system=system, feature_map=fm, R=2, M=2, repeats=1,
                             progress=False).fit()
        back = pickle.loads(pickle.dumps(est))
        assert type(back.result_.settings.feature_map).__name__ == (
            "CheckedCombined" if fm == "combined" else "CheckedConcat")
        np.testing.assert_array_equal(back.coefficients()["value"],
                                      est.coefficients()["value"])


@pytest.mark.slow
def test_a_fitted_estimator_loads_and_predicts_the_same_in_a_new_process(fitted, tmp_path):
    """Saved, loaded in a fresh interpreter (where the checked model is built when pickle
    asks for it by name), it predicts what it predicted."""
    import pickle
    import subprocess
    import sys

    m, df = fitted
    val = df[df["split"] == "val"]
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(m))
    val.to_pickle(tmp_path / "val.pkl")
    code = ("import pickle, sys, pandas as pd; m = pickle.load(open(sys.argv[1], 'rb')); "
            "m.predict(pd.read_pickle(sys.argv[2])).to_pickle(sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "val.pkl"),
                    str(tmp_path / "pred.pkl")], check=True, capture_output=True)
    pd.testing.assert_frame_equal(pd.read_pickle(tmp_path / "pred.pkl"), m.predict(val))


def test_a_setting_given_to_the_constructor_and_in_config_is_refused():
    """config={"R": 2} beside R=50 ran R = 2 while get_params said 50, so GridSearchCV over R
    fitted the same model at every value: refused in one line, naming the setting."""
    from fnsysid.config.errors import ConfigError

    for est in (fnsysid.FederatedSysID(R=50, config={"R": 2}),
                fnsysid.FederatedSysID(R=50, config=["R=2"])):
        with pytest.raises(ConfigError, match=r"^R: given to the constructor and in config; "
                                              r"allowed: each setting once"):
            est.fit()
    with pytest.raises(ConfigError, match=r"^feature_map: given to the constructor"):
        fnsysid.FederatedSysID(feature_map="combined",
                               config={"feature_map": "polynomial"}).fit()


def test_states_and_inputs_take_any_sequence_of_names_and_refuse_data():
    """fit(df, y) put an array into ``states`` (a 20000-character line); a generator was
    read twice (the second time empty); a DataFrame of targets gave its column names."""
    from fnsysid.app.estimator import FederatedSysID as F
    from fnsysid.config.errors import ConfigError

    m = F()
    got = m._overrides(None, (c for c in ["x1", "x2"]), iter(["u"]))
    assert "data.states=['x1','x2']" in got and "data.inputs=['u']" in got
    assert "data.states=['x1','x2']" in m._overrides(None, pd.Index(["x1", "x2"]), None)
    for bad in (np.zeros(5), pd.DataFrame({"x1": [0.0]})):
        with pytest.raises(ConfigError, match=r"^states: got a (ndarray|DataFrame), not column "
                                              r"names; allowed: a str or a list of str"):
            m._overrides(None, bad, None)
