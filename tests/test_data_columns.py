"""File data: the column mapping (data.trajectory, data.time, data.ignore), the export round trip
with any data.val_N, truth files that give a subset of the parameters, parameters.csv."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid import load_trajectories
from fnsysid.app.estimator import FederatedSysID
from fnsysid.app.experiment import run_experiment
from fnsysid.data.files import DataError, check_columns, load_truth
from fnsysid.results.metrics import ParameterErrors
from tests.conftest import cli_in_process, compose_cfg
from tests.test_data_files import GENERIC, linear_fleet, write_per_client


def renamed_fleet(tmp_path):
    """The same fleet twice: default column names, and run_id/time with a battery column."""
    df, theta = linear_fleet(n_clients=3, n_traj=5, length=12, noise=0.05, seed=4)
    write_per_client(df, tmp_path / "plain")
    own = df.rename(columns={"trajectory": "run_id", "t": "time"}).assign(battery=12.5)
    write_per_client(own, tmp_path / "own")
    return theta


MAPPED = ["data.trajectory=run_id", "data.time=time", "data.ignore=[battery]"]


@pytest.mark.slow
def test_mapped_columns_give_the_same_errors_as_the_default_names(tmp_path):
    renamed_fleet(tmp_path)
    for name, extra in (("plain", []), ("own", MAPPED)):
        res = cli_in_process(*GENERIC, "R=6", f"data.path={tmp_path / name}", *extra,
                             f"hydra.run.dir={tmp_path / ('out_' + name)}")
        assert res.returncode == 0, res.stderr
    a, b = (pd.read_csv(tmp_path / f"out_{n}" / "errors.csv") for n in ("plain", "own"))
    assert a["nrmse_1step_max"].notna().all()          # 5 runs a client: one is held out
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    # the Python reader takes the same mapping
    x = load_trajectories(tmp_path / "plain", ["x1", "x2"], ["u"])
    y = load_trajectories(tmp_path / "own", ["x1", "x2"], ["u"], trajectory="run_id",
                          time="time", ignore=["battery"])
    pd.testing.assert_frame_equal(x, y)
    assert x["trajectory"].nunique() == 5


@pytest.mark.slow
def test_an_unknown_column_is_one_line_exit_2_and_no_folder(tmp_path):
    renamed_fleet(tmp_path)
    out = tmp_path / "out"
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'own'}", "data.trajectory=run_id",
                         "data.time=time", f"hydra.run.dir={out}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == [f"fnsysid: error: {tmp_path / 'own' / 'robot0.csv'}: column 'battery' is "
                     "neither a state, an input, the trajectory ('run_id'), the time ('time') "
                     "nor client, repeat or split; allowed: name it in data.states, data.inputs, "
                     "data.trajectory, data.time or data.ignore (to leave it out: "
                     "data.ignore=[battery])"]
    assert not out.exists()
    # unmapped: the runs are not glued into one trajectory, the columns are refused
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'own'}", f"hydra.run.dir={out}")
    assert res.returncode == 2 and not out.exists()
    assert "column 'run_id' (and 2 more: time, battery) is neither" in res.stderr


def test_a_mapped_column_that_is_missing_names_the_setting(tmp_path):
    renamed_fleet(tmp_path)
    with pytest.raises(DataError, match=r"column 'runid' \(data.trajectory=runid\) is missing; "
                                        r"columns: run_id, time, x1, x2, u, battery; did you "
                                        r"mean 'run_id'\?"):
        load_trajectories(tmp_path / "own", ["x1", "x2"], ["u"], trajectory="runid",
                          time="time", ignore=["battery"])
    # the default names are optional: without them a client's rows are one trajectory in the
    # row order
    df = load_trajectories(tmp_path / "plain", ["x1", "x2"], ["u"], ignore=["trajectory", "t"])
    assert df["trajectory"].nunique() == 1 and len(df) == 3 * 5 * 12
    assert df["t"].tolist()[:3] == [0.0, 1.0, 2.0]


def test_time_errors_name_the_mapped_column(tmp_path):
    renamed_fleet(tmp_path)
    f = tmp_path / "own" / "robot1.csv"
    df = pd.read_csv(f)
    df.loc[3, "time"] = df.loc[2, "time"]
    df.to_csv(f, index=False)
    with pytest.raises(DataError, match=r"robot1.csv: row 4: time=0.2 does not increase "
                                        r"within client 'robot1', trajectory 0 \(previous "
                                        r"time=0.2\)"):
        load_trajectories(tmp_path / "own", ["x1", "x2"], ["u"], trajectory="run_id",
                          time="time", ignore=["battery"])


def test_check_columns_works_on_a_dataframe():
    df = pd.DataFrame({"run": [0, 0], "stamp": [0.0, 1.0], "x": [1.0, 2.0], "note": ["a", "b"]})
    from fnsysid.data.files import ColumnMap

    cols = ColumnMap(trajectory="run", time="stamp", ignore=("note",))
    out = check_columns(df, "frame", ["x"], [], cols)
    assert list(out.columns) == ["trajectory", "t", "x"]
    with pytest.raises(DataError, match="^frame: column 'note' is neither"):
        check_columns(df, "frame", ["x"], [], ColumnMap(trajectory="run", time="stamp"))
    with pytest.raises(DataError, match=r"^data.time: column 'x' is also data.states; allowed: "
                                        "one use per column"):
        check_columns(df, "frame", ["x"], [], ColumnMap(trajectory="run", time="x",
                                                        ignore=("note", "stamp")))
    for label in ("repeat", "client"):        # split may be ignored, these two may not
        with pytest.raises(DataError, match=rf"^data.ignore: column '{label}' cannot be ignored "
                                            r"\(client and repeat are labels the reader uses\); "
                                            r"allowed: other columns, and split \(then "
                                            r"data.holdout applies\)$"):
            check_columns(df, "frame", ["x"], [], ColumnMap("run", "stamp", ("note", label)))


@pytest.mark.slow
def test_an_ignored_name_no_file_has_is_refused_where_a_model_is_fitted(tmp_path):
    renamed_fleet(tmp_path)
    own = ["x1", "x2"], ["u"]
    msg = ("data.ignore: column 'batery' is in no file of the data; allowed: its columns "
           "(run_id, time, x1, x2, u, battery); did you mean 'battery'?")
    with pytest.raises(DataError, match=f"^{re.escape(msg)}$"):
        load_trajectories(tmp_path / "own", *own, trajectory="run_id", time="time",
                          ignore=["battery", "batery"])
    out = tmp_path / "out"
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'own'}", "data.trajectory=run_id",
                         "data.time=time", "data.ignore=[battery,batery]",
                         f"hydra.run.dir={out}")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [f"fnsysid: error: {msg}"]
    assert not out.exists()
    # in memory: the estimator's fit refuses it too; a validation file or new data to score
    # may lack a column of the training files
    df = load_trajectories(tmp_path / "own", *own, trajectory="run_id", time="time",
                           ignore=["battery"])
    with pytest.raises(DataError, match="^data.ignore: column 'battery' is in no file"):
        FederatedSysID(R=2, progress=False).fit(df, *own, ignore=["battery"])
    m = FederatedSysID(R=2, progress=False).fit(pd.read_csv(tmp_path / "own" / "robot0.csv")
                                                 .assign(client="robot0"), *own,
                                                 trajectory="run_id", time="time",
                                                 ignore=["battery"])
    assert len(m.predict(df)) == len(df)
    (tmp_path / "val").mkdir()
    for f in (tmp_path / "own").glob("*.csv"):
        pd.read_csv(f).drop(columns="battery").to_csv(tmp_path / "val" / f.name, index=False)
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'own'}", "data.trajectory=run_id",
                         "data.time=time", "data.ignore=[battery]", "R=2",
                         f"data.val_path={tmp_path / 'val'}", f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr
    # the other way round: only the validation files hold it
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'val'}", "data.trajectory=run_id",
                         "data.time=time", "data.ignore=[battery]", "R=2",
                         f"data.val_path={tmp_path / 'own'}", f"hydra.run.dir={out}_2")
    assert res.returncode == 0, res.stderr
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'val'}", "data.trajectory=run_id",
                         "data.time=time", "data.ignore=[battery,batery]", "R=2",
                         f"data.val_path={tmp_path / 'own'}", f"hydra.run.dir={out}_3")
    assert res.returncode == 2 and "column 'batery' is in no file of the data" in res.stderr


def test_ignore_and_mapping_are_typed_settings(tmp_path):
    res = cli_in_process(*GENERIC, f"data.path={tmp_path}", "data.ignore=battery",
                         f"hydra.run.dir={tmp_path / 'out'}")
    assert res.returncode == 2 and "data.ignore" in res.stderr
    assert not (tmp_path / "out").exists()


# --- export round trip ---------------------------------------------------------------------------

@pytest.mark.parametrize("val_n", [0, 1])
def test_round_trip_with_any_val_n(tmp_path, val_n, caplog):
    run = ["system=pendulum", "R=8", "output.plot=false"]
    sim = ["M=3", "N=3", "repeats=1", "system.x0.scale=[0.3,0.3]", f"data.val_N={val_n}"]
    with caplog.at_level("WARNING", logger="fnsysid"):
        run_experiment(compose_cfg(*run, *sim, "output.trajectories=true"), tmp_path / "a")
        run_experiment(compose_cfg(*run, "data=files",
                                   f"data.path={tmp_path / 'a' / 'trajectories.parquet'}",
                                   f"data.truth={tmp_path / 'a' / 'truth.csv'}"), tmp_path / "b")
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert len(ea) == len(eb) == 9
    np.testing.assert_allclose(eb.to_numpy(float), ea.to_numpy(float), rtol=0, atol=1e-9)
    assert ea["nrmse_1step_max"].isna().all() == (val_n == 0)
    if val_n == 0:
        assert "data.val_N=0: no held-out trajectories" in caplog.text
        assert "its split column marks no row val" in caplog.text
        # data.ignore=[split]: data.holdout holds out one of each client's 3 trajectories
        run_experiment(compose_cfg(*run, "data=files", "data.ignore=[split]",
                                   f"data.path={tmp_path / 'a' / 'trajectories.parquet'}",
                                   f"data.truth={tmp_path / 'a' / 'truth.csv'}"), tmp_path / "c")
        ec = pd.read_csv(tmp_path / "c" / "errors.csv")
        assert ec["nrmse_1step_max"].notna().all()
        assert abs(ec["e_max"].iloc[-1] - ea["e_max"].iloc[-1]) > 1e-6


# --- truth files with a subset of the parameters, parameters.csv --------------------------------

def test_a_truth_file_may_leave_parameters_out(tmp_path, caplog):
    df, theta = linear_fleet(n_clients=2, n_traj=3, length=10)
    write_per_client(df, tmp_path / "logs")
    names = ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"]
    keep = [1, 3, 5]                                    # x1+:x2, x2+:x1, x2+:u
    rows = [{"client": c, "parameter": names[k], "value": theta.ravel()[k]}
            for c in ("robot0", "robot1") for k in keep]
    pd.DataFrame(rows).to_csv(tmp_path / "truth.csv", index=False)
    with caplog.at_level("WARNING", logger="fnsysid"):
        summary = run_experiment(compose_cfg(*GENERIC, "R=3", f"data.path={tmp_path / 'logs'}",
                                             f"data.truth={tmp_path / 'truth.csv'}"),
                                 tmp_path / "out")
    assert "gives 3 of the 6 parameters: e_r is taken over those, 3 left out (not scored): " \
        "x1+:x1, x1+:u, x2+:x2" in caplog.text
    assert summary["truth_parameters"] == 3 and summary["status"] == "ok"
    err = pd.read_csv(tmp_path / "out" / "errors.csv")
    # round 0 starts from zero: the error over the scored parameters is 1 exactly
    assert err["e_max"].iloc[0] == pytest.approx(1.0, abs=1e-12)
    est = pd.read_csv(tmp_path / "out" / "estimates.csv").set_index("parameter")
    t = theta.ravel()
    want = np.linalg.norm(est.loc[[names[k] for k in keep], "estimate"] - t[keep]) \
        / np.linalg.norm(t[keep])
    assert err["e_max"].iloc[-1] == pytest.approx(want, rel=1e-9)
    assert est.loc["x1+:x1", "true_mean"] != est.loc["x1+:x1", "true_mean"]   # NaN: unknown
    params = pd.read_csv(tmp_path / "out" / "parameters.csv")
    assert params["parameter"].tolist() == names and params["index"].tolist() == list(range(6))
    assert params["scored"].tolist() == [False, True, False, True, False, True]
    assert params["target"].tolist()[:2] == ["x1+", "x1+"] and params["feature"][2] == "u"


def test_a_parameter_given_for_some_clients_only_is_refused(tmp_path):
    df, theta = linear_fleet(n_clients=2, n_traj=2, length=5)
    pd.DataFrame({"client": ["robot0", "robot0", "robot1"],
                  "parameter": ["x1+:x1", "x2+:u", "x1+:x1"],
                  "value": [0.9, 0.5, 0.9]}).to_csv(tmp_path / "truth.csv", index=False)
    names = ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"]
    with pytest.raises(DataError, match=r"no value for repeat 0, client 'robot1', parameter "
                                        r"'x2\+:u' \(given for other clients\)"):
        load_truth(tmp_path / "truth.csv", ["robot0", "robot1"], names, 1)


def test_parameter_errors_over_the_known_coordinates():
    truth = np.array([[[3.0, np.nan, 4.0], [0.0, np.nan, 2.0]]])
    err = ParameterErrors(truth)(np.array([[[0.0, 100.0, 0.0]]]))
    np.testing.assert_allclose(err, [[1.0, 1.0]])
    err = ParameterErrors(truth)(np.array([[[3.0, -7.0, 0.0]]]))
    np.testing.assert_allclose(err, [[4.0 / 5.0, np.sqrt(9 + 4) / 2]])


def test_a_column_name_with_brackets_unquoted_is_refused_saying_how_to_quote(tmp_path):
    """A header with units (`pos [m]`) given unquoted breaks Hydra's override grammar: the
    refusal names the override and shows the quoting, in one line, exit 2, nothing
    written; quoted, the name is read."""
    rows = [{"pos [m]": 0.1 * k, "vel [m/s]": 0.01 * k * k, "u": 1.0} for k in range(30)]
    (tmp_path / "logs").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "logs" / "a.csv", index=False)
    out = tmp_path / "run"
    res = cli_in_process("system=generic", "data=files", f"data.path={tmp_path / 'logs'}",
                         "data.states=[pos [m],vel [m/s]]", "data.inputs=[u]",
                         f"hydra.run.dir={out}")
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and not out.exists()
    assert len(err) == 1 and err[0].startswith(
        "fnsysid: error: data.states=[pos [m],vel [m/s]]: no viable alternative at input"), err
    assert err[0].endswith("""e.g. 'data.states=["pos [m]","vel [m/s]"]' (the single quotes """
                           "for the shell)")
    res = cli_in_process("system=generic", "data=files", f"data.path={tmp_path / 'logs'}",
                         'data.states=["pos [m]","vel [m/s]"]', "data.inputs=[u]", "R=2",
                         "output.plot=false", f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr
    assert "pos [m]+ = " in (out / "equations.txt").read_text()


@pytest.mark.slow
def test_an_empty_input_list_means_no_inputs(tmp_path):
    renamed_fleet(tmp_path)
    (tmp_path / "free").mkdir()
    for f in (tmp_path / "own").glob("*.csv"):
        pd.read_csv(f).drop(columns=["u", "battery"]).to_csv(tmp_path / "free" / f.name,
                                                             index=False)
    res = fnsysid.run(["system=generic", "data=files", f"data.path={tmp_path / 'free'}",
                       "data.states=[x1,x2]", "data.inputs=[]", "data.trajectory=run_id",
                       "data.time=time", "R=2", "progress=false"])
    assert res.summary["status"] == "ok"
    assert list(res.estimates["parameter"].unique()) == ["x1+:x1", "x1+:x2", "x2+:x1",
                                                         "x2+:x2"]
    with pytest.raises(fnsysid.ConfigError, match=r"data.inputs=\[\]: system=pendulum has 2 "
                                                  r"states \(alpha, omega\) and 1 inputs"):
        fnsysid.run(["system=pendulum", "data=files", f"data.path={tmp_path / 'free'}",
                     "data.states=[x1,x2]", "data.inputs=[]", "data.trajectory=run_id",
                     "data.time=time", "R=2", "progress=false"])


@pytest.mark.slow
def test_missing_split_leaves_the_rows_out_and_splits_their_trajectories(tmp_path, caplog):
    df, _ = linear_fleet(n_clients=3, n_traj=4, length=12, noise=0.05, seed=5)
    write_per_client(df, tmp_path / "full")
    holes = df.copy()
    c0 = holes["client"] == holes["client"].iloc[0]
    rows = holes.index[c0 & (holes["trajectory"] == 1)]
    holes.loc[rows[5], "x2"] = np.nan              # trajectory 1: parts of 5 and 6 rows
    holes.loc[rows[7], "u"] = np.nan               #   and of 1 (left out) and 4 rows
    holes.loc[rows[-1], "u"] = np.nan              # a last row's input is not used: kept
    first = holes.index[c0 & (holes["trajectory"] == 2)]
    holes.loc[first[0], "x1"] = np.nan             # trajectory 2: its first row only
    write_per_client(holes, tmp_path / "holes")
    with pytest.raises(DataError, match=r"column 'x1' is empty or NaN; allowed: finite numbers "
                                        r"\(data.missing=split leaves such rows out"):
        load_trajectories(tmp_path / "holes", ["x1", "x2"], ["u"])
    got = load_trajectories(tmp_path / "holes", ["x1", "x2"], ["u"], missing="split")
    # the same rows written by hand as trajectories of their own
    by_hand = holes.drop(index=[rows[5], rows[6], rows[7], first[0]]).astype({"trajectory": str})
    by_hand.loc[rows[:5], "trajectory"] = "1#1"
    by_hand.loc[rows[8:], "trajectory"] = "1#2"
    by_hand.loc[first[1:], "trajectory"] = "2#1"
    write_per_client(by_hand, tmp_path / "by_hand")
    want = load_trajectories(tmp_path / "by_hand", ["x1", "x2"], ["u"])
    pd.testing.assert_frame_equal(got, want)
    assert len(got) == len(df) - 4 and np.isnan(got["u"]).sum() == 0
    # a run on the holes equals the run on the hand-split files, and says what it left out
    caplog.set_level("WARNING", logger="fnsysid")
    run = [*GENERIC, "R=3", "strategy=centralized_exact", "progress=false"]
    a = fnsysid.run([*run, f"data.path={tmp_path / 'holes'}", "data.missing=split"])
    b = fnsysid.run([*run, f"data.path={tmp_path / 'by_hand'}"])
    pd.testing.assert_frame_equal(a.estimates, b.estimates)
    said = [r.getMessage() for r in caplog.records if "data.missing=split" in r.getMessage()]
    assert said == ["data.missing=split: data.path: 3 row(s) with an empty value left out; "
                    "the 2 trajectories that had them are now 3 trajectories, and 1 row(s) "
                    "left alone between them (a part of one row has no transition)"]
    # a client left without a transition is refused, not dropped
    empty = holes.copy()
    empty.loc[empty["client"] == empty["client"].iloc[-1], "x1"] = np.nan
    write_per_client(empty, tmp_path / "empty")
    with pytest.raises(DataError, match=r"robot2.csv: data.missing=split leaves client "
                                        r"'robot2' no two consecutive rows"):
        load_trajectories(tmp_path / "empty", ["x1", "x2"], ["u"], missing="split")
    # the estimator's fit takes it as the settings do; predict refuses such rows
    holes_df = load_trajectories(tmp_path / "holes", ["x1", "x2"], ["u"], missing="split")
    m = FederatedSysID(R=3, strategy="centralized_exact", progress=False).fit(
        holes.astype({"trajectory": str}), ["x1", "x2"], ["u"], missing="split")
    np.testing.assert_array_equal(m.result_.estimates["estimate"], a.estimates["estimate"])
    assert len(m.predict(holes_df)) == len(holes_df)
    with pytest.raises(DataError, match="is empty or NaN"):
        m.predict(holes.astype({"trajectory": str}))


def test_a_split_column_in_some_files_names_the_clients_left_without_held_out_data(
        tmp_path, caplog):
    df, _ = linear_fleet(n_clients=3, n_traj=4, length=12, noise=0.05, seed=6)
    write_per_client(df, tmp_path / "fleet")
    first = sorted((tmp_path / "fleet").glob("*.csv"))[0]
    one = pd.read_csv(first)
    one["split"] = np.where(one["trajectory"] == one["trajectory"].max(), "val", "train")
    one.to_csv(first, index=False)
    caplog.set_level("WARNING", logger="fnsysid")
    res = fnsysid.run([*GENERIC, f"data.path={tmp_path / 'fleet'}", "R=2", "progress=false"])
    said = [r.getMessage() for r in caplog.records if "split column" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        f"data.path={tmp_path / 'fleet'}: the split column marks no row val for 2 of 3 clients "
        "(robot1, robot2): the held-out NRMSE")
    assert res.summary["status"] == "ok"
