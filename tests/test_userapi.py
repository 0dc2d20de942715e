"""The user's path: equations on screen and in equations.txt, ``fnsysid show``,
``FederatedSysID.load``, the scikit-learn protocol, one client's arrays, and the hold-out of a
DataFrame from ``load_trajectories``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid import FederatedSysID
from fnsysid.app.cli import show
from fnsysid.results.equations import SHORT_LINES, short_form
from tests.conftest import cli_in_process

STATES, INPUTS = ["theta", "omega"], ["torque"]
DT, G, B = 0.01, 9.81, 2.0


def pendulum_logs(folder: Path, clients: int = 5, runs: int = 4, length: int = 60) -> Path:
    """A fleet's CSV logs in the user's own names (run_id, timestamp, theta, omega, torque):
    x+ = x + dt f(x, u) of a pendulum of length 1 + 0.05 c, without noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for c in range(clients):
        ell, rows = 1.0 + 0.05 * c, []
        for run in range(runs):
            th, om = rng.uniform(-1, 1, 2)
            for k in range(length):
                tq = rng.uniform(-1, 1)
                rows.append((f"run{run}", 1000 + k * DT, th, om, tq))
                th, om = th + DT * om, om + DT * (-(G / ell) * np.sin(th) + B * tq)
        pd.DataFrame(rows, columns=["run_id", "timestamp", *STATES, *INPUTS]).to_csv(
            folder / f"pend{c}.csv", index=False)
    return folder


QUICK = ["system=generic", "data=files", "data.states=[theta,omega]", "data.inputs=[torque]",
         "data.time=timestamp", "data.trajectory=run_id", "feature_map=combined",
         "strategy=centralized_exact"]


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    """The quickstart's command line on five pendulum logs, its folder and its output."""
    tmp = tmp_path_factory.mktemp("quick")
    logs = pendulum_logs(tmp / "logs")
    res = cli_in_process(*QUICK, f"data.path={logs}", f"hydra.run.dir={tmp / 'run'}")
    assert res.returncode == 0, res.stderr
    return tmp / "run", res, logs


def estimates_csv(folder: Path, column: str = "estimate") -> np.ndarray:
    """The values of a run's estimates.csv, parsed by Python's float (independent of pandas)."""
    with open(folder / "estimates.csv", newline="") as f:
        return np.array([float(r[column]) for r in csv.DictReader(f)])


@pytest.mark.slow
def test_a_run_prints_and_writes_its_equations_which_load_and_show_give_back(pendulum_run,
                                                                             capsys):
    run, res, _ = pendulum_run
    text = (run / "equations.txt").read_text().splitlines()
    assert [ln.split(" = ")[0] for ln in text] == ["theta+", "omega+"]
    # theta+ = theta + dt omega is exact for every client: least squares finds it
    assert text[0].startswith("theta+ = 1 theta + 0.01 omega")
    printed = res.stdout + res.stderr
    assert "identified model" in printed and text[0] in printed and text[1] in printed

    m = FederatedSysID.load(run)
    assert m.equations() == text
    assert np.array_equal(m.coefficients()["value"].to_numpy(), estimates_csv(run))  # diff 0
    assert m.summary_["status"] == "ok" and m.states_ == STATES and m.inputs_ == INPUTS
    assert m.nrmse(pd.read_csv(next((run.parent / "logs").iterdir())).assign(client="pend0"),
                   ) < 0.01   # the loaded model predicts the user's own columns

    assert show([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("status ok, 50 rounds; system=generic, feature_map=combined")
    assert f"nrmse_1step_mean {m.summary_['final_nrmse_1step_mean']:.4g}" in out[2]
    assert out[-2:] == [f"  {ln}" for ln in text]
    check = m.summary_["model_check"]
    untested = max(check["extrapolating_untested"])
    assert [ln for ln in out if ln.startswith("model check:")] == [
        (f"model check: {check['verdict']}" if check["verdict"] == "ok" else
         f"model check: {check['verdict']} (median free-run NRMSE of the clients' own fits "
         f"{check['nrmse_sim_median'][0]:.3g}; summary.json: model_check)")
        + (f"; {untested} client(s) untested: their held-out data lie beyond their training "
           "data's range" if untested else "")]


def test_show_prints_the_model_checks_verdict():
    """``fnsysid show`` prints the verdict beside the status, which the check does not
    change: a run can end ok with a model whose class the check rejects."""
    from fnsysid.results.equations import _check_line

    assert _check_line(None) is None
    assert _check_line({"verdict": None, "reason": "no client has 20 held-out transitions"}) \
        == "model check: none (no client has 20 held-out transitions)"
    assert _check_line({"verdict": "free run fails", "nrmse_sim_median": [1.758]}) == (
        "model check: free run fails (median free-run NRMSE of the clients' own fits 1.76; "
        "summary.json: model_check)")
    assert _check_line({"verdict": "ok", "nrmse_sim_median": [0.004],
                        "measurement_noise": ["angle+", "rate+"]}) == (
        "model check: ok; residuals as noise on the measured states makes them: angle+, rate+")


def test_show_names_faded_terms_and_settings_without_effect(tmp_path):
    import json

    from fnsysid.results.equations import show_text

    summary = {"status": "ok", "rounds_completed": 50, "unused_settings": ["K", "lr"],
               "sparsity": {"below_threshold": [{"parameter": "omega+:theta", "repeats": [0],
                                                 "estimate": 5e-13}]}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    lines = show_text(tmp_path)
    assert "sparsity: kept but below the threshold in the final model: omega+:theta" in lines
    assert "settings without effect: K, lr" in lines
    del summary["sparsity"], summary["unused_settings"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert not [ln for ln in show_text(tmp_path) if "threshold" in ln or "effect" in ln]


def test_a_free_run_that_blew_up_is_shown_and_ranked_last(tmp_path):
    """A free-run NRMSE of inf is written null (JSON has no Infinity) and named in
    null_values: show prints it and marks it, compare ranks the run last, not unranked."""
    import json

    from fnsysid.app.compare import compare
    from fnsysid.results.atomic import write_json
    from fnsysid.results.equations import show_text

    for name, sim in (("blown", float("inf")), ("fine", 0.2)):
        (tmp_path / name).mkdir()
        write_json(tmp_path / name / "summary.json",
                   {"status": "ok", "rounds_completed": 5, "final_nrmse_1step_mean": 0.01,
                    "final_nrmse_sim_mean": sim, "final_nrmse_sim_max": sim,
                    "heldout": {"fingerprint": "0123456789abcdef"}})     # the same data
    assert json.loads((tmp_path / "blown" / "summary.json").read_text())[
        "final_nrmse_sim_mean"] is None
    scores = [ln for ln in show_text(tmp_path / "blown") if ln.startswith("scores:")]
    assert scores == ["scores: nrmse_1step_mean 0.01, nrmse_sim_mean inf, nrmse_sim_max inf "
                      "(free run worse than the held-out mean: NRMSE above 1)"]
    rows = compare([str(tmp_path / "blown"), str(tmp_path / "fine")])
    assert [(r["rank"], r["free_run"]) for r in rows] == [(1, 0.2), (2, float("inf"))]
    # a run that diverged: its scores are of the last round kept, and say so
    (tmp_path / "gone").mkdir()
    write_json(tmp_path / "gone" / "summary.json",
               {"status": "diverged", "rounds_completed": 0, "final_nrmse_1step_mean": 3.5})
    assert [ln for ln in show_text(tmp_path / "gone") if ln.startswith("scores")] == [
        "scores (of round 0, the last kept: not a finished model's): nrmse_1step_mean 3.5"]
    # an ill-conditioned estimate: no correct digit, whatever its rounds (a closed-form
    # strategy has none to speak of)
    (tmp_path / "singular").mkdir()
    write_json(tmp_path / "singular" / "summary.json",
               {"status": "ill_conditioned", "rounds_completed": 50,
                "final_nrmse_1step_mean": 0.02})
    assert [ln for ln in show_text(tmp_path / "singular") if ln.startswith("scores")] == [
        "scores (of an estimate without a correct digit): nrmse_1step_mean 0.02"]
    from fnsysid.results.equations import not_final

    assert not_final({"status": "ill_conditioned", "rounds_completed": 50}) == (
        "the estimate keeps no correct digit (conditioning)")
    assert not_final({"status": "growing", "rounds_completed": 7}) == (
        "after round 7: not a converged model")


def test_show_and_load_refuse_a_folder_that_is_not_a_run_in_one_line(tmp_path, capsys):
    (tmp_path / "own.txt").write_text("x")
    assert show([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fnsysid: error: RUN_DIR={tmp_path} holds no finished run (no "
                   "summary.json); allowed: the folder of a finished run or sweep")
    assert show([]) == 2 and "usage: fnsysid show RUN_DIR" in capsys.readouterr().err
    for flag in ("--help", "-h"):                 # as compare and fnsysid-plot: exit 0
        assert show([flag]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("usage: fnsysid show RUN_DIR") and "Exit status" in out.out
        assert out.err == ""
    assert show(["--verbose"]) == 2 and "given: --verbose" in capsys.readouterr().err
    with pytest.raises(fnsysid.ConfigError, match=r"^run_dir=.* is not a folder"):
        FederatedSysID.load(tmp_path / "none")


@pytest.mark.slow
def test_show_of_a_sweep_gives_each_job_and_a_diverged_one_exits_3(tmp_path, capsys):
    res = cli_in_process("-m", "system=pendulum", "M=2", "repeats=1", "R=3", "lr=0.01,1e4",
                         "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path}")
    assert res.returncode == 3
    code = show([str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 3                                       # one job diverged
    assert out.startswith(f"sweep {tmp_path}: 2 job(s)")
    assert "status ok" in out and "status diverged" in out
    # the jobs in the sweep's order (lr=0.01 first), not by folder name ('lr=0.01' > 'lr=1e4'
    # would hold by name too: the job numbers are swapped to tell the two apart)
    jobs = sorted(p for p in tmp_path.iterdir() if (p / ".hydra").is_dir())
    assert out.index(f"{jobs[0].name}:") < out.index(f"{jobs[1].name}:")
    for job, num in zip(jobs, (1, 0), strict=True):
        conf = job / ".hydra" / "hydra.yaml"
        conf.write_text(conf.read_text().replace(f"num: {1 - num}", f"num: {num}", 1))
    assert show([str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert out.index(f"{jobs[1].name}:") < out.index(f"{jobs[0].name}:")
    assert out.count("d_omega = ") == 1                    # the diverged job has no model
    with pytest.raises(fnsysid.ConfigError, match="is a sweep; allowed: one of its job"):
        FederatedSysID.load(tmp_path)


def test_the_short_form_cuts_long_models_and_says_where_the_rest_is():
    lines = [f"x{k}+ = {k} x{k}" for k in range(SHORT_LINES + 3)]
    short = short_form(lines, "run/equations.txt")
    assert short[:-1] == lines[:SHORT_LINES]
    assert short[-1] == "... (3 more line(s); the full model in run/equations.txt)"
    assert short_form(lines[:2]) == lines[:2]
    long = ["y+ = " + " + ".join(f"{k} x{k}" for k in range(60))]
    cut = short_form(long)
    assert len(cut[0]) == 160 and cut[0].endswith(" ...") and "cut" in cut[1]


def test_sklearn_clone_get_params_and_set_params():
    base = pytest.importorskip("sklearn.base")
    m = FederatedSysID(R=5, config={"feature_map.degree": 2})
    params = base.clone(m).get_params()
    assert params["R"] == 5 and params["config"] == {"feature_map.degree": 2}
    assert params["strategy"] is None and set(params) == set(m.get_params())
    assert m.set_params(R=7, strategy="fedprox") is m and (m.R, m.strategy) == (7, "fedprox")
    with pytest.raises(ValueError, match="^Rounds is not a parameter of FederatedSysID"):
        m.set_params(Rounds=3)
    assert repr(FederatedSysID(R=5, strategy="local")) == \
        "FederatedSysID(strategy='local', R=5) (not fitted)"


#: check_estimator's checks that do not apply, and why: each fits numeric arrays X (and y);
#: FederatedSysID fits trajectories (a DataFrame with a client column and named state and
#: input columns, a mapping client -> DataFrame, or files) and refuses an array with its
#: one-line ConfigError, so the checks that want a message of their own about arrays (empty,
#: one sample, one feature, complex, sparse, NaN) or a fitted model of arrays fail on it
ARRAYS = "fits numeric arrays X (and y); fit takes trajectories with named columns"
NOT_APPLICABLE = dict.fromkeys((
    "check_fit_score_takes_y", "check_estimators_overwrite_params",
    "check_dont_overwrite_parameters", "check_estimators_fit_returns_self",
    "check_readonly_memmap_input", "check_n_features_in_after_fitting",
    "check_positive_only_tag_during_fit", "check_estimators_dtypes", "check_complex_data",
    "check_dtype_object", "check_estimators_empty_data_messages", "check_pipeline_consistency",
    "check_estimators_nan_inf", "check_estimator_sparse_tag", "check_estimator_sparse_array",
    "check_estimator_sparse_matrix", "check_estimators_pickle",
    "check_f_contiguous_array_estimator", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_fit2d_1sample", "check_fit2d_1feature",
    "check_dict_unchanged", "check_fit_idempotent", "check_fit_check_is_fitted",
    "check_n_features_in", "check_fit2d_predict1d"), ARRAYS)
NOT_APPLICABLE["check_estimators_unfitted"] = (
    "wants scikit-learn's own NotFittedError class; without depending on scikit-learn an "
    "unfitted estimator raises ValueError('... not fitted yet: call fit(data) first')")


@pytest.mark.slow
def test_the_applicable_check_estimator_checks_pass():
    checks = pytest.importorskip("sklearn.utils.estimator_checks")
    results = checks.check_estimator(FederatedSysID(R=5), on_fail=None)
    passed = {r["check_name"] for r in results if r["status"] == "passed"}
    failed = {r["check_name"] for r in results if r["status"] == "failed"}
    assert failed == set(NOT_APPLICABLE)        # every other check passes (or is skipped)
    assert {"check_estimator_cloneable", "check_estimator_repr", "check_set_params",
            "check_no_attributes_set_in_init", "check_get_params_invariance",
            "check_do_not_raise_errors_in_init_or_set_params", "check_mixin_order",
            "check_parameters_default_constructible", "check_valid_tag_types"} <= passed
    with pytest.raises(ValueError, match="not fitted yet"):
        FederatedSysID().predict(np.zeros((3, 2)))


def fleet(clients: int = 4, runs: int = 3, length: int = 30) -> pd.DataFrame:
    """A linear fleet x+ = A x + b u in memory (client, trajectory, t, x1, x2, u)."""
    rng = np.random.default_rng(3)
    rows = []
    for c in range(clients):
        for j in range(runs):
            x = rng.uniform(-1, 1, 2)
            for t in range(length):
                u = rng.uniform(-1, 1)
                rows.append((f"c{c}", j, t, *x, u))
                x = np.array([x[0] + 0.1 * x[1], 0.9 * x[1] - 0.1 * x[0] + 0.1 * u])
    return pd.DataFrame(rows, columns=["client", "trajectory", "t", "x1", "x2", "u"])


@pytest.mark.slow
def test_grid_search_over_R_picks_the_most_rounds_by_the_score(tmp_path):
    ms = pytest.importorskip("sklearn.model_selection")
    df = fleet()
    grid = ms.GridSearchCV(FederatedSysID(progress=False), {"R": [1, 40]},
                           cv=ms.GroupKFold(n_splits=2))
    grid.fit(df, groups=df["client"], states=["x1", "x2"], inputs=["u"])
    scores = grid.cv_results_["mean_test_score"]
    assert grid.best_params_ == {"R": 40} and scores[1] > scores[0]
    # score is minus the held-out NRMSE: higher is better
    best = grid.best_estimator_
    assert best.score(df) == -best.nrmse(df) and best.score(df) < 0


def test_fit_takes_the_column_names_of_load_trajectories(tmp_path):
    df = fleet(clients=3).rename(columns={"trajectory": "run_id", "t": "stamp"})
    df["note"] = "x"
    m = FederatedSysID(R=3, progress=False).fit(df, ["x1", "x2"], ["u"], trajectory="run_id",
                                                time="stamp", ignore=["note"])
    cfg = m.result_.settings.data
    assert (cfg.trajectory, cfg.time, list(cfg.ignore)) == ("run_id", "stamp", ["note"])
    with pytest.raises(fnsysid.ConfigError, match="^data.time: given to fit"):
        FederatedSysID(config={"data.time": "stamp"}).fit(df, ["x1", "x2"], ["u"],
                                                           time="stamp")


def test_predict_and_simulate_take_one_clients_arrays():
    df = fleet(clients=3)
    m = FederatedSysID(R=5, progress=False).fit(df, ["x1", "x2"], ["u"])
    one = df[(df["client"] == "c1") & (df["trajectory"] == 0)]
    x, u = one[["x1", "x2"]].to_numpy(), one[["u"]].to_numpy()
    for how in ("predict", "simulate"):
        want = getattr(m, how)(one)[["x1", "x2"]].to_numpy()
        got = getattr(m, how)(x, u=u)
        assert got.shape == x.shape
        np.testing.assert_array_equal(got, want)
    two = df[df["client"] == "c1"][["x1", "x2"]].to_numpy().reshape(3, 30, 2)
    us = df[df["client"] == "c1"][["u"]].to_numpy().reshape(3, 30, 1)
    got = m.predict(two, u=us)
    assert got.shape == (3, 30, 2) and np.isnan(got[:, 0]).all()
    np.testing.assert_array_equal(got[0], m.predict(x, u=u))
    with pytest.raises(fnsysid.DataError, match=r"^data: an array of shape \(30, 3\)"):
        m.predict(np.zeros((30, 3)), u=u)
    with pytest.raises(fnsysid.DataError, match="^u: missing"):
        m.simulate(x)


@pytest.mark.slow
def test_a_dataframe_of_load_trajectories_keeps_the_hold_out_of_its_files(tmp_path):
    logs = pendulum_logs(tmp_path / "logs", clients=3, runs=4, length=20)
    df = fnsysid.load_trajectories(logs, STATES, INPUTS, trajectory="run_id",
                                   time="timestamp")
    assert "split" not in df.columns            # the files have no split column
    kw = dict(feature_map="combined", strategy="centralized_exact", progress=False)
    from_df = FederatedSysID(**kw).fit(df, STATES, INPUTS)     # columns renamed by the reader
    from_files = FederatedSysID(**kw).fit(logs, STATES, INPUTS, trajectory="run_id",
                                          time="timestamp")
    # data.holdout (0.2 of 4 trajectories: 1 per client) is held out from both
    assert from_df.result_.dataset.heldout is not None
    for key in ("final_nrmse_1step_mean", "final_nrmse_sim_mean"):
        assert from_df.summary_[key] == from_files.summary_[key]
        assert np.isfinite(from_df.summary_[key])
    np.testing.assert_array_equal(from_df.result_.estimate, from_files.result_.estimate)
    # a model fitted on the files (their own names run_id, timestamp) scores, predicts and
    # simulates the DataFrame load_trajectories gives (renamed to trajectory, t) as it does
    # the files themselves, and its layout columns keep the DataFrame's names
    for kind in ("one_step", "free_run"):
        assert from_files.nrmse(df, kind=kind) == from_files.nrmse(logs, kind=kind)
    for how in ("predict", "simulate"):
        got = getattr(from_files, how)(df)
        assert list(got.columns[:4]) == ["repeat", "client", "trajectory", "t"]
        np.testing.assert_array_equal(got[STATES].to_numpy(),
                                      getattr(from_files, how)(logs)[STATES].to_numpy())
    with pytest.raises(fnsysid.DataError, match="column 'run_id' .* is missing"):
        from_files.nrmse(df.drop(columns="trajectory"))   # neither its names nor the layout's


def test_bad_arguments_of_equations_and_load_trajectories_are_one_line(tmp_path):
    """precision must be an integer >= 1; load_trajectories' column names must be strings:
    each refused with a ConfigError that names the argument and what is allowed."""
    logs = pendulum_logs(tmp_path / "logs", clients=2, runs=2, length=10)
    m = FederatedSysID(strategy="centralized_exact", progress=False).fit(
        logs, STATES, INPUTS, trajectory="run_id", time="timestamp")
    assert m.equations(precision=1)[0].startswith("theta+ = 1 theta + 0.01 omega")
    assert m.equations(precision=np.int64(3)) == m.equations(precision=3)
    for bad in (0, -1, 2.5, "x", True, None):
        with pytest.raises(fnsysid.ConfigError,
                           match=r"^precision=.* is not allowed; allowed: an integer >= 1"):
            m.equations(precision=bad)
    for kw, name in ((dict(time=5), "time"), (dict(trajectory=None), "trajectory"),
                     (dict(time=" "), "time"), (dict(ignore=[1]), "ignore")):
        with pytest.raises(fnsysid.ConfigError, match=f"^{name}=.* is not allowed; allowed: "):
            fnsysid.load_trajectories(logs, STATES, INPUTS, **kw)


@pytest.mark.slow
def test_plots_return_figures_that_render_without_a_path():
    import io

    from matplotlib.figure import Figure

    df = fleet(clients=3)
    m = FederatedSysID(R=20, progress=False).fit(df, ["x1", "x2"], ["u"])
    fig = m.result_.plot_fit()                 # the held-out trajectory, as fit.png
    assert isinstance(fig, Figure) and len([a for a in fig.axes if a.get_visible()]) == 2
    one = df[df["client"] == "c2"].rename(columns={"t": "t"})
    fig = m.plot_fit(one)                      # the DataFrame's first trajectory
    ax = fig.axes[0]
    first = one[one["trajectory"] == 0]
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), first["x1"].to_numpy())
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), first["t"].to_numpy())
    # the one-step line is the estimator's own prediction
    want = m.predict(first[["x1", "x2"]].to_numpy(), u=first[["u"]].to_numpy())[1:, 0]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), want, rtol=1e-12)
    assert ax.get_xlabel() == "t"
    buf = io.BytesIO()
    fig.savefig(buf, format="png")             # what Jupyter's inline display does
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _, axes = plt.subplots()
    assert m.plot_fit(one, ax=axes) is axes.figure and len(axes.lines) == 6   # 3 per state
    plt.close("all")
    err = m.result_.plot_errors()
    assert isinstance(err, Figure)
    np.testing.assert_array_equal(err.axes[0].lines[0].get_xdata(),
                                  m.history_["round"].unique())


def test_progress_bar_is_plain_tqdm_without_ipywidgets(monkeypatch):
    import importlib.util

    import tqdm.auto
    import tqdm.std

    from fnsysid.runtimes.inprocess import progress_bar

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert progress_bar() is tqdm.std.tqdm
    monkeypatch.undo()
    if importlib.util.find_spec("ipywidgets") is not None:
        assert progress_bar() is tqdm.auto.tqdm


def test_rounds_off_a_terminal_are_plain_without_the_text_bar(monkeypatch):
    """Off a terminal the text bar (``disable=None``) shows nothing: the rounds are a plain
    range and tqdm is not asked for; on a terminal they are tqdm's bar over the same rounds."""
    import importlib.util
    import io
    import sys

    import tqdm.std

    from fnsysid.runtimes import inprocess

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    asked = []
    monkeypatch.setattr(inprocess, "progress_bar", lambda: asked.append(1) or tqdm.std.tqdm)
    assert inprocess._rounds(3, True) == range(1, 4) and asked == []
    assert inprocess._rounds(3, False) == range(1, 4)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = inprocess._rounds(3, True)
    assert isinstance(bar, tqdm.std.tqdm) and list(bar) == [1, 2, 3] and asked == [1]


@pytest.mark.slow
def test_fit_png_names_the_time_column(tmp_path):
    from fnsysid.results.files import time_label

    logs = pendulum_logs(tmp_path / "logs", clients=2, runs=3, length=20)
    m = FederatedSysID(feature_map="combined", strategy="centralized_exact", progress=False,
                       output_dir=tmp_path / "run").fit(logs, STATES, INPUTS,
                                                        trajectory="run_id", time="timestamp")
    assert time_label(m.result_.settings) == "timestamp (sample index)"
    assert m.result_.plot_fit().axes[0].get_xlabel() == "timestamp (sample index)"
    assert (tmp_path / "run" / "fit.png").is_file()
    assert time_label(None) == "time step"


def test_version_prints_fnsysids_own():
    res = cli_in_process("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"fnsysid {fnsysid.__version__}"
    assert "Hydra" not in res.stdout


@pytest.mark.slow
def test_own_columns_without_system_hint_system_generic(tmp_path):
    logs = pendulum_logs(tmp_path / "logs", clients=2, runs=2, length=10)
    res = cli_in_process("data=files", f"data.path={logs}", f"hydra.run.dir={tmp_path / 'r'}")
    assert res.returncode == 2 and not (tmp_path / "r").exists()
    assert res.stderr.strip() == (
        f"fnsysid: error: {logs}/pend0.csv: column 'alpha' (data.states) is missing; columns: "
        "run_id, timestamp, theta, omega, torque; system=pendulum reads its own columns (alpha,"
        " omega, u); for your own columns give system=generic data.states=[...] "
        "data.inputs=[...]")
    given = cli_in_process("system=pendulum", "data=files", f"data.path={logs}",
                           f"hydra.run.dir={tmp_path / 'r'}")     # system given: no hint
    assert given.returncode == 2 and "system=generic" not in given.stderr


@pytest.mark.parametrize("value, message", [
    ("theta,omega", "data.states=theta,omega: data.states must be a list; a,b is a sweep of 2 "
                    "values, a list is written in brackets: data.states=[theta,omega]"),
    ("theta", "data.states=theta is not allowed: data.states must be a list of values, each a "
              "non-empty string, or null; a list is written in brackets: data.states=[theta]")])
def test_a_list_setting_given_without_brackets_shows_the_bracket_form(tmp_path, value, message):
    res = cli_in_process("system=generic", "data=files", f"data.path={tmp_path}",
                         f"data.states={value}", "data.inputs=[torque]")
    assert res.returncode == 2 and res.stderr.strip() == f"fnsysid: error: {message}"


@pytest.mark.slow
def test_an_old_target_path_is_refused_naming_the_new_one(tmp_path):
    conf = tmp_path / "conf" / "feature_map"
    conf.mkdir(parents=True)
    fourier = (Path(fnsysid.__file__).parent.parent / "conf" / "feature_map" /
               "fourier.yaml").read_text()
    assert "_target_: fnsysid.dynamics.features.Concat\n" in fourier
    (conf / "mine.yaml").write_text(fourier.replace("fnsysid.dynamics.features.",
                                                    "fnsysid.features."))
    res = cli_in_process("--config-dir", str(tmp_path / "conf"), "system=synthetic",
                         "feature_map=mine", f"hydra.run.dir={tmp_path / 'r'}")
    assert res.returncode == 2 and not (tmp_path / "r").exists()
    assert res.stderr.strip() == (
        "fnsysid: error: feature_map._target_=fnsysid.features.Concat: module "
        "fnsysid.features moved to fnsysid.dynamics.features (CHANGELOG.md, 0.1.0); allowed: "
        "_target_: fnsysid.dynamics.features.Concat")
    with pytest.raises(fnsysid.ConfigError, match=r"^system._target_=fnsysid.systems.Pendulum: "
                       r".*allowed: _target_: fnsysid.dynamics.systems.Pendulum$"):
        fnsysid.run({"system._target_": "fnsysid.systems.Pendulum", "R": 1, "M": 2})
    # the new path of the same file runs
    (conf / "mine.yaml").write_text(fourier)
    ok = fnsysid.run(["system=synthetic", "feature_map=mine", "R=1", "M=2", "repeats=1"],
                     config_dir=tmp_path / "conf")
    assert ok.summary["status"] in ("ok", "growing")
