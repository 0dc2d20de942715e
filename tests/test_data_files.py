"""Trajectories from files: the layout, every bad-data case, the export round trip, held-out
NRMSE against known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid import load_trajectories
from fnsysid.app.experiment import run_experiment
from fnsysid.data.files import DataError
from tests.conftest import cli_in_process, compose_cfg
from tests.test_cli import cli


def linear_fleet(n_clients=3, n_traj=4, length=30, noise=0.0, seed=0, A=None, B=None):
    """Long-format samples of x+ = A x + B u + noise for a few clients (A, B shared)."""
    rng = np.random.default_rng(seed)
    A = np.array([[0.9, 0.2], [-0.1, 0.8]]) if A is None else A
    B = np.array([[0.0], [0.5]]) if B is None else B
    rows = []
    for c in range(n_clients):
        for j in range(n_traj):
            x = rng.standard_normal(2)
            for t in range(length):
                u = rng.standard_normal(1)
                rows.append({"client": f"robot{c}", "trajectory": j, "t": 0.1 * t,
                             "x1": x[0], "x2": x[1], "u": u[0]})
                x = A @ x + B @ u + noise * rng.standard_normal(2)
    return pd.DataFrame(rows), np.concatenate([A, B], axis=1)


def write_per_client(df: pd.DataFrame, folder, fmt="csv"):
    folder.mkdir(parents=True, exist_ok=True)
    for c, g in df.groupby("client"):
        g = g.drop(columns="client")
        if fmt == "csv":
            g.to_csv(folder / f"{c}.csv", index=False)
        else:
            g.to_parquet(folder / f"{c}.parquet", index=False)
    return folder


GENERIC = ["system=generic", "data=files", "data.states=[x1,x2]", "data.inputs=[u]",
           "output.plot=false"]


def test_folder_and_single_file_give_the_same_data(tmp_path):
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "csv")
    write_per_client(df, tmp_path / "pq", fmt="parquet")
    df.to_csv(tmp_path / "all.csv", index=False)
    a = load_trajectories(tmp_path / "csv", ["x1", "x2"], ["u"])
    b = load_trajectories(tmp_path / "pq", ["x1", "x2"], ["u"])
    c = load_trajectories(tmp_path / "all.csv", ["x1", "x2"], ["u"])
    cols = ["repeat", "client", "trajectory", "t", "x1", "x2", "u"]      # no split column
    pd.testing.assert_frame_equal(a[cols], b[cols], check_dtype=False)
    pd.testing.assert_frame_equal(a[cols], c[cols], check_dtype=False)
    assert a["client"].unique().tolist() == ["robot0", "robot1", "robot2"]
    assert len(a) == 3 * 4 * 30


@pytest.mark.slow
def test_generic_system_recovers_a_noiseless_linear_fleet(tmp_path):
    df, theta = linear_fleet(noise=0.0)
    write_per_client(df, tmp_path / "logs")
    truth = pd.DataFrame([{"client": f"robot{c}", "parameter": f"{s}+:{f}",
                           "value": theta[i, k]}
                          for c in range(3) for i, s in enumerate(["x1", "x2"])
                          for k, f in enumerate(["x1", "x2", "u"])])
    truth.to_csv(tmp_path / "truth.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'logs'}", "R=30",
                      f"data.truth={tmp_path / 'truth.csv'}", "strategy=fedavg")
    summary = run_experiment(cfg, tmp_path / "run")
    # identical clients, whitened GD with lr 0.5, K 5: the error shrinks by 2^-5 a round
    assert summary["status"] == "ok" and summary["final_e_max_mean"] < 1e-8
    assert summary["M"] == 3 and summary["N"] == 3          # 4 trajectories, 1 held out
    # a model fitted exactly predicts the held-out data exactly (no noise): NRMSE ~ 0
    assert summary["final_nrmse_1step_max"] < 1e-6 and summary["final_nrmse_sim_max"] < 1e-6
    est = pd.read_csv(tmp_path / "run" / "estimates.csv")
    assert est["parameter"].tolist() == ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2",
                                         "x2+:u"]
    np.testing.assert_allclose(est["estimate"], theta.ravel(), atol=1e-8)


@pytest.mark.slow
def test_without_truth_the_run_is_judged_by_prediction(tmp_path):
    noise = 0.1
    df, theta = linear_fleet(noise=noise, n_traj=10, length=100, seed=3)
    write_per_client(df, tmp_path / "logs")
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'logs'}", "R=20", "output.eval_every=10")
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "ok" and summary["final_e_max_mean"] is None
    errors = pd.read_csv(tmp_path / "run" / "errors.csv")
    assert errors["e_max"].isna().all() and errors["e_mean"].isna().all()
    # round 0 is the zero model: its one-step NRMSE is ||x+|| / std(x), about 1
    first = errors[errors["round"] == 0].iloc[0]
    assert 0.8 < first["nrmse_1step_mean"] < 1.3
    # the fitted model's one-step residual is the noise: NRMSE ~ noise / std(x)
    held = df[df["trajectory"] >= 8]
    level = np.mean([noise / held[s].std(ddof=0) for s in ("x1", "x2")])
    last = errors[errors["round"] == 20].iloc[0]
    assert last["nrmse_1step_mean"] == pytest.approx(level, rel=0.15)
    assert last["nrmse_sim_mean"] < 1.0 and np.isfinite(last["nrmse_sim_max"])
    # free run only at round 0, every eval_every rounds and at the last
    assert errors["nrmse_sim_max"].notna().tolist() == [r % 10 == 0 or r == 20
                                                         for r in errors["round"]]


def test_one_step_nrmse_from_statistics_equals_the_direct_computation(tmp_path):
    from fnsysid.app.build import build
    from fnsysid.data.source import load_data
    from fnsysid.results.metrics import nrmse_one_step, one_step

    df, _ = linear_fleet(noise=0.3, seed=5)
    write_per_client(df, tmp_path / "logs")
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'logs'}", "data.holdout=0.5")
    model, optimizer, _ = build(cfg)
    ds = load_data(cfg, model, optimizer)
    theta = np.random.default_rng(0).standard_normal((1, 3, model.p))   # one model per client
    ho = ds.heldout
    got = nrmse_one_step(model, theta, ho)
    pred = one_step(model, theta, ho.x, ho.u)                          # (1, 3, J, L-1, 2)
    err = pred - ho.x[..., 1:, :]
    rmse = np.sqrt((err ** 2).mean(axis=(2, 3)))
    want = (rmse / ho.std).mean(axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    # the same model for every client takes the matrix-product path
    np.testing.assert_allclose(nrmse_one_step(model, theta[:, :1], ho),
                               nrmse_one_step(model, np.repeat(theta[:, :1], 3, 1), ho),
                               rtol=1e-12)


def test_a_rollout_that_blows_up_is_inf_not_a_crash(tmp_path):
    from fnsysid.app.build import build
    from fnsysid.data.source import load_data
    from fnsysid.results.metrics import nrmse_free_run

    df, _ = linear_fleet(length=200)
    write_per_client(df, tmp_path / "logs")
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'logs'}")
    model, optimizer, _ = build(cfg)
    ho = load_data(cfg, model, optimizer).heldout
    unstable = np.tile([1e3, 0, 0, 0, 1e3, 0], (1, 1, 1))                 # x+ = 1000 x
    assert np.isinf(nrmse_free_run(model, unstable, ho)).all()


@pytest.mark.slow
def test_round_trip_export_then_import_gives_the_same_errors(tmp_path):
    run = ["system=pendulum", "R=15", "output.plot=false"]
    sim = ["M=4", "N=[3,5,4,2]", "repeats=2", "system.x0.scale=[0.3,0.3]", "data.val_N=2"]
    run_experiment(compose_cfg(*run, *sim, "output.trajectories=true"), tmp_path / "a")
    a = tmp_path / "a"
    assert (a / "trajectories.parquet").exists() and (a / "truth.csv").exists()
    traj = pd.read_parquet(a / "trajectories.parquet")
    assert list(traj.columns) == ["repeat", "client", "trajectory", "t", "split", "alpha",
                                  "omega", "u"]
    run_experiment(compose_cfg(*run, "data=files", f"data.path={a / 'trajectories.parquet'}",
                               f"data.truth={a / 'truth.csv'}"), tmp_path / "b")
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    assert list(ea.columns) == list(eb.columns) and len(ea) == len(eb) == 2 * 16
    assert ea["nrmse_sim_max"].notna().any()
    np.testing.assert_allclose(eb.to_numpy(float), ea.to_numpy(float), rtol=0, atol=1e-9)


def test_simulated_holdout_does_not_change_the_training_data(tmp_path):
    base = ["system=synthetic", "M=3", "R=5", "output.plot=false"]
    run_experiment(compose_cfg(*base, "data.val_N=0"), tmp_path / "a")
    run_experiment(compose_cfg(*base, "data.val_N=3"), tmp_path / "b")
    ea, eb = (pd.read_csv(tmp_path / d / "errors.csv") for d in "ab")
    pd.testing.assert_frame_equal(ea[["e_max", "e_mean"]], eb[["e_max", "e_mean"]])
    assert ea["nrmse_1step_max"].isna().all() and eb["nrmse_1step_max"].notna().all()


# --- bad data: one line naming the file and row or column, exit 2, no folder ------------------

def _bad_cases(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    cases = {}

    def case(name, frame, message, extra=()):
        folder = tmp_path / name
        write_per_client(frame, folder)
        cases[name] = ([f"data.path={folder}", *extra], message)

    case("missing_column", df.drop(columns="x2"), "robot0.csv: column 'x2' (data.states) is "
         "missing")
    case("misspelt_column", df.rename(columns={"x2": "x_2"}), "did you mean 'x_2'?")
    nan = df.copy()
    nan.loc[3, "x1"] = np.nan
    case("nan", nan, "robot0.csv: row 4, column 'x1' is empty or NaN")
    inf = df.copy()
    inf.loc[12, "u"] = np.inf
    case("inf", inf, "robot1.csv: row 3, column 'u' is inf")
    text = df.astype({"x2": object})
    text.loc[2, "x2"] = "abc"
    case("text", text, "robot0.csv: row 3, column 'x2': 'abc' is not a number")
    t = df.copy()
    t.loc[2, "t"] = 0.0
    case("t_not_increasing", t, "robot0.csv: row 3: t=0 does not increase within client "
         "'robot0', trajectory 0")
    short = df[~((df["client"] == "robot1") & (df["trajectory"] == 1) & (df["t"] > 0))]
    case("short_trajectory", short, "robot1.csv: row 6: client 'robot1', trajectory 1 has 1 "
         "sample")
    case("feature_map", df, "feature_map=polynomial does not fit system=pendulum",
         extra=["system=pendulum", "feature_map=polynomial"])
    (tmp_path / "empty").mkdir()
    cases["empty_dir"] = ([f"data.path={tmp_path / 'empty'}"], "holds no .csv or .parquet")
    cases["no_path"] = ([f"data.path={tmp_path / 'nowhere'}"], "nowhere does not exist")
    one = tmp_path / "one.csv"
    df.drop(columns="client").to_csv(one, index=False)
    cases["no_client_column"] = ([f"data.path={one}"], "one.csv: column 'client'")
    case("misspelt_case", df.rename(columns={"x2": "X2"}), "did you mean 'X2'?")
    rep = df.assign(repeat=0.0)
    rep.loc[3, "repeat"] = np.nan
    case("empty_repeat", rep, "robot0.csv: row 4, column 'repeat' is empty; allowed: integers")
    case("fractional_repeat", df.assign(repeat=0.5), "robot0.csv: row 1, column 'repeat' is "
         "0.5; allowed: integers >= 0")
    both = write_per_client(df, tmp_path / "csv_and_parquet")
    df[df["client"] == "robot0"].drop(columns="client").to_parquet(both / "robot0.parquet")
    cases["same_client_twice"] = ([f"data.path={both}"], "robot0.csv and robot0.parquet both "
                                  "give client 'robot0'")
    with_col = tmp_path / "client_column"
    with_col.mkdir()
    for c, g in df.groupby("client"):
        g.assign(client="robot0").to_csv(with_col / f"{c}.csv", index=False)
    cases["client_column_in_folder"] = ([f"data.path={with_col}"], "robot1.csv: row 1, "
                                        "column 'client' is 'robot0' but in a folder the file "
                                        "name gives the client ('robot1')")
    held = df.assign(split=np.where(df["client"] == "robot1", "val", "train"))
    case("all_held_out", held, "client 'robot1' (repeat 0) has no training trajectory")
    good = write_per_client(df, tmp_path / "good")
    cases["no_val_path"] = ([f"data.path={good}", "data.val_path=" +
                             str(tmp_path / "nowhere")], "data.val_path=")
    case("split_and_val_path", held, "marks held-out rows (split=val) and data.val_path=",
         extra=[f"data.val_path={good}"])
    return cases


@pytest.fixture(scope="module")
def bad_cases(tmp_path_factory):
    """Every bad-data case, written once for the module (the tests only read them)."""
    return _bad_cases(tmp_path_factory.mktemp("bad_data"))


CASES = ["missing_column", "misspelt_column", "nan", "inf", "text", "t_not_increasing",
         "short_trajectory", "feature_map", "empty_dir", "no_path", "no_client_column",
         "misspelt_case", "empty_repeat", "fractional_repeat", "same_client_twice",
         "client_column_in_folder", "all_held_out", "no_val_path", "split_and_val_path"]


@pytest.mark.parametrize("name", CASES)
def test_bad_data_is_one_line_and_raises_before_writing(tmp_path, bad_cases, name):
    args, message = bad_cases[name]
    args = [a for a in args if not a.startswith("system=")] + (
        [a for a in args if a.startswith("system=")] or ["system=generic"])
    overrides = [o for o in GENERIC if not o.startswith("system=")] + args
    if "system=pendulum" in args:
        overrides = [o for o in overrides if not o.startswith("data.states")
                     and not o.startswith("data.inputs")]
    with pytest.raises(DataError if name != "feature_map" else Exception) as exc:
        run_experiment(compose_cfg(*overrides), tmp_path / "out")
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_no_val_path_names_the_setting(tmp_path, bad_cases):
    args, _ = bad_cases["no_val_path"]
    with pytest.raises(DataError, match=r"^data\.val_path=\S*nowhere does not exist$"):
        run_experiment(compose_cfg(*GENERIC, *args), tmp_path / "out")


def test_file_suffixes_in_any_case_are_read(tmp_path):
    df, _ = linear_fleet(n_clients=3, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    (folder / "robot1.csv").rename(folder / "robot1.CSV")
    out = load_trajectories(folder, "x1", "u", ignore="x2")   # one name may be a string
    assert out["client"].unique().tolist() == ["robot0", "robot1", "robot2"]
    assert list(out.columns[-2:]) == ["x1", "u"]


def test_client0_start_without_truth_is_refused(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    cfg = compose_cfg(*GENERIC, f"data.path={folder}", "system.init.reference=client0")
    with pytest.raises(fnsysid.ConfigError, match="system.init.reference=client0 starts from "
                                                  "client 0's true parameters"):
        run_experiment(cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("run", [cli_in_process, pytest.param(cli, marks=pytest.mark.slow)],
                         ids=["in_process", "fresh_interpreter"])
def test_bad_data_on_the_command_line_exits_2_without_a_folder(tmp_path, bad_cases, run):
    """The data are refused inside the job: in this process; through a fresh interpreter
    (``python run.py``) too in make test-slow."""
    args, message = bad_cases["nan"]
    res = run(*GENERIC, *args, f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fnsysid: error: ") and message in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_sweep_over_bad_data_is_refused_before_any_job_in_one_line(tmp_path, bad_cases,
                                                                      monkeypatch):
    """A multirun whose jobs all read a bad file is refused by the pre-run check (the job's
    own message), exit 2, no sweep folder; good files are read once by the check for its two
    jobs (then once by each job)."""
    import fnsysid.data.files as files

    args, message = bad_cases["nan"]
    res = cli_in_process("-m", *GENERIC, *args, "strategy=centralized_exact,oneshot",
                         "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path}/sweep")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fnsysid: error: ") and message in lines[0]
    assert not (tmp_path / "sweep").exists()
    folder = tmp_path / "good"
    write_per_client(linear_fleet(n_clients=2, n_traj=3, length=10, noise=0.1, seed=1)[0],
                     folder)
    calls = []
    read = files.read_trajectories

    def counted(*a, **k):
        calls.append(a[0])
        return read(*a, **k)

    monkeypatch.setattr(files, "read_trajectories", counted)   # imported where it is used
    good = [a for a in args if not a.startswith("data.path=")]
    res = cli_in_process("-m", *GENERIC, *good, f"data.path={folder}", "R=2",
                         "strategy=centralized_exact,oneshot", "hydra/launcher=basic",
                         f"hydra.sweep.dir={tmp_path}/ok")
    assert res.returncode == 0, res.stderr
    assert len(calls) == 1 + 2 and all(str(c) == str(folder) for c in calls)


def test_split_column_val_path_and_holdout_choose_the_same_held_out_data(tmp_path, caplog):
    from fnsysid.app.build import build
    from fnsysid.data.source import load_data

    df, _ = linear_fleet(n_clients=2, n_traj=4, length=10, noise=0.1, seed=2)
    df["client"] = df["client"].str.replace("robot", "")           # numeric ids 0, 1
    val = df["trajectory"] == 3
    df.assign(split=np.where(val, "val", "train")).to_csv(tmp_path / "split.csv", index=False)
    df[~val].to_csv(tmp_path / "train.csv", index=False)
    df[val].to_csv(tmp_path / "val.csv", index=False)
    df.to_csv(tmp_path / "all.csv", index=False)
    runs = {"split": [f"data.path={tmp_path / 'split.csv'}"],
            "val_path": [f"data.path={tmp_path / 'train.csv'}",
                         f"data.val_path={tmp_path / 'val.csv'}"],
            "holdout": [f"data.path={tmp_path / 'all.csv'}", "data.holdout=0.25"]}
    got = {}
    for name, extra in runs.items():
        cfg = compose_cfg(*GENERIC, *extra)
        model, optimizer, _ = build(cfg)
        ds = load_data(cfg, model, optimizer)
        got[name] = ds
        assert ds.clients == ["0", "1"] and ds.train.n.tolist() == [[27, 27]]
    for name in ("val_path", "holdout"):
        for field in ("gram", "cross", "yy", "n", "std", "x"):
            np.testing.assert_allclose(getattr(got[name].heldout, field),
                                       getattr(got["split"].heldout, field), rtol=1e-12)
    # a client with one trajectory trains on it and is left out of the validation
    one = df[(df["client"] == "1") | (df["trajectory"] == 0)]
    one.to_csv(tmp_path / "one.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'one.csv'}", "data.holdout=0.25")
    model, optimizer, _ = build(cfg)
    with caplog.at_level("WARNING", logger="fnsysid"):
        ds = load_data(cfg, model, optimizer)
    assert ds.heldout.valid.tolist() == [[False, True]] and ds.train.n[0, 0] == 9
    assert "left out of the validation: 0" in caplog.text


def test_bad_truth_and_unreadable_parquet_are_one_line(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    write_per_client(df, tmp_path / "logs")
    truth = pd.DataFrame({"client": ["robot0", "robot1"], "parameter": ["x1+:x1", "x1+:x9"],
                          "value": [1.0, 2.0]})
    truth.to_csv(tmp_path / "truth.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'logs'}",
                      f"data.truth={tmp_path / 'truth.csv'}")
    with pytest.raises(DataError, match=r"truth.csv: row 2: parameter 'x1\+:x9' is not in"):
        run_experiment(cfg, tmp_path / "out")
    truth.iloc[:1].to_csv(tmp_path / "truth.csv", index=False)
    with pytest.raises(DataError, match="no value for repeat 0, client 'robot1', parameter "
                                        "'x1\\+:x1' \\(given for other clients\\)"):
        run_experiment(cfg, tmp_path / "out")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "robot0.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(DataError, match="robot0.parquet: cannot be read as parquet: .*; "
                                        "allowed: a parquet file with a header row"):
        load_trajectories(tmp_path / "bad", ["x1", "x2"], ["u"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "robot0.csv").write_text("")
    with pytest.raises(DataError, match=r"robot0.csv: cannot be read as csv: No columns to "
                                        r"parse from file; allowed: a csv file with a header "
                                        r"row of column names and one row per sample$"):
        load_trajectories(tmp_path / "empty", ["x1", "x2"], ["u"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bad_data_leaves_no_folder_behind_and_keeps_a_users_files(tmp_path, bad_cases):
    args, _ = bad_cases["nan"]
    work = tmp_path / "work"
    work.mkdir()
    res = cli_in_process(*GENERIC, *args, cwd=work)          # default outputs/runs/<time>
    assert res.returncode == 2 and res.stderr.startswith("fnsysid: error: ")
    assert list(work.iterdir()) == []                         # not even an empty outputs/
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    res = cli_in_process(*GENERIC, *args, f"hydra.run.dir={mine}", "output.overwrite=true")
    assert res.returncode == 2
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("knob", ["N=[1,2]", "N=3", "T=7", "eps=0.5"])
def test_knobs_of_simulated_data_are_refused_with_files(tmp_path, knob):
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "logs")
    args = [*GENERIC, f"data.path={tmp_path / 'logs'}", "R=2", knob]
    with pytest.raises(fnsysid.ConfigError, match=rf"^{knob.split('=')[0]}=.* does not apply "
                                                  "with data=files"):
        fnsysid.run(args, output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_knobs_of_simulated_data_left_at_their_defaults_do_not_stop_a_run_with_files(tmp_path):
    """The knobs refused above, left at their defaults (one run for all of them)."""
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "logs")
    result = fnsysid.run([*GENERIC, f"data.path={tmp_path / 'logs'}", "R=2"])
    assert result.summary["status"] == "ok" and result.summary["M"] == 3


@pytest.mark.parametrize("knob, message", [
    ("M=5", "M=5 does not match data.path=.* which holds 3 clients: drop M"),
    ("repeats=2", "repeats=2 does not match data.path=.* which holds 1 repeats: drop repeats"),
])
@pytest.mark.slow
def test_m_and_repeats_must_match_the_files(tmp_path, knob, message):
    """The files give the clients and repeats; a value that differs is refused, one that
    matches (as a Flower deployment gives M) is accepted (next test)."""
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "logs")
    args = [*GENERIC, f"data.path={tmp_path / 'logs'}", "R=2"]
    with pytest.raises(fnsysid.ConfigError, match=message):
        fnsysid.run([*args, knob], output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    res = cli_in_process(*args, knob, f"hydra.run.dir={tmp_path}/cli")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "cli").exists()


@pytest.mark.slow
def test_m_and_repeats_that_match_the_files_are_accepted(tmp_path):
    """Left out, or given as the files have them (one check for both knobs above)."""
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "logs")
    args = [*GENERIC, f"data.path={tmp_path / 'logs'}", "R=2"]
    for ok in ([], ["M=3", "repeats=1"]):
        summary = fnsysid.run([*args, *ok]).summary
        assert summary["status"] == "ok" and summary["M"] == 3 and summary["repeats"] == 1


def test_m_null_is_only_for_files():
    with pytest.raises(fnsysid.ConfigError, match=r"^M=null is not allowed: M \(number of "
                                                  r"clients\) must be an integer >= 1"):
        fnsysid.run(["system=pendulum", "M=null", "R=1"])
    from fnsysid.config.checks import check_run
    cfg = compose_cfg("system=pendulum")
    cfg.repeats = None                    # e.g. from a config file of one's own
    with pytest.raises(fnsysid.ConfigError, match=r"^repeats=null is not allowed: .* \(null "
                                                  "only with data=files"):
        check_run(cfg)


@pytest.mark.slow
def test_own_data_option_without_m_runs_and_given_m_is_checked(tmp_path):
    """A data option of one's own that reads files (package data, no M: null) takes the
    clients from the files; only an M given explicitly is compared with them; M=null is the
    files' own default."""
    df, _ = linear_fleet()
    write_per_client(df, tmp_path / "logs")
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "mylab.yaml").write_text(
        f"source: files\npath: {tmp_path / 'logs'}\nstates: [x1, x2]\ninputs: [u]\n"
        "truth: null\nholdout: 0.2\nval_path: null\n")
    args = ["system=generic", "data=mylab", "R=2", "output.plot=false"]
    summary = fnsysid.run(args, config_dir=tmp_path / "conf").summary
    assert summary["status"] == "ok" and summary["M"] == 3
    with pytest.raises(fnsysid.ConfigError, match="M=5 does not match data.path="):
        fnsysid.run([*args, "M=5"], config_dir=tmp_path / "conf")
    res = cli_in_process("--config-dir", str(tmp_path / "conf"), *args,
                         f"hydra.run.dir={tmp_path}/a")
    assert res.returncode == 0, res.stderr
    files = [*GENERIC, f"data.path={tmp_path / 'logs'}", "R=2"]
    assert fnsysid.run([*files, "M=null", "repeats=null"]).summary["M"] == 3


def _runs(folder, ids, t=False, length=6):
    """One client's file with one run per id in ``ids`` (written as given: ``01`` stays
    ``01``), optionally with a t column restarting at 0 for each run."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = ["trajectory," + ("t," if t else "") + "x1,x2,u"]
    for k in ids:
        for i in range(length):
            x1, x2, u = rng.standard_normal(3)
            lines.append(f"{k}," + (f"{i}," if t else "") + f"{x1},{x2},{u}")
    (folder / "dev0.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("with_t", [False, True])
def test_trajectory_ids_are_text_so_01_and_1_are_two_runs(tmp_path, with_t):
    rows = load_trajectories(_runs(tmp_path / "d", ["01", "1", "2"], t=with_t),
                             ["x1", "x2"], ["u"])
    sizes = rows.groupby("trajectory", sort=False).size()
    assert sizes.to_dict() == {"01": 6, "1": 6, "2": 6}          # not 12 samples glued in '1'
    assert rows["trajectory"].tolist() == ["01"] * 6 + ["1"] * 6 + ["2"] * 6


def test_trajectory_ids_as_text_in_a_dataframe_too():
    from fnsysid.data.files import check_tables

    rng = np.random.default_rng(1)
    df = pd.DataFrame({"trajectory": ["01"] * 4 + ["1"] * 4, "t": list(range(4)) * 2,
                       "x1": rng.standard_normal(8), "x2": rng.standard_normal(8),
                       "u": rng.standard_normal(8)})

    class Name(str):
        stem = "dev0"

    rows = check_tables([(Name("frame"), df)], ["x1", "x2"], ["u"])
    assert rows["_trajectory"].tolist() == [0] * 4 + [1] * 4      # two runs, t restarts: fine


def test_numeric_trajectory_ids_keep_their_order_and_held_out_selection(tmp_path):
    from fnsysid.data.files import read_trajectories
    from fnsysid.data.source import _hold_out

    ids = [5, 12, 0, 10, 2, 1, 11, 3, 9, 4, 8, 7, 6]               # 0..12, written shuffled
    for fmt in ("csv", "parquet"):
        rng = np.random.default_rng(2)
        df = pd.DataFrame({"client": "c0", "trajectory": np.repeat(ids, 3),
                           "t": np.tile(np.arange(3), 13), "x1": rng.standard_normal(39),
                           "x2": rng.standard_normal(39), "u": rng.standard_normal(39)})
        folder = write_per_client(df, tmp_path / fmt, fmt)
        rows = read_trajectories(folder, ["x1", "x2"], ["u"])
        order = rows.drop_duplicates("_trajectory")["trajectory"].tolist()
        assert order == [str(k) for k in range(13)]                 # 2 before 10, as numbers
        assert rows["_trajectory"].tolist() == list(np.repeat(np.arange(13), 3))
        split = _hold_out(rows, 0.15, str(folder))                  # round(0.15 * 13) = 2
        held = sorted(split.loc[split["split"] == "val", "trajectory"].unique(), key=int)
        assert held == ["11", "12"]


@pytest.mark.slow
def test_a_truth_file_without_rows_or_with_an_unknown_column_is_refused(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=6)
    write_per_client(df, tmp_path / "logs")
    (tmp_path / "empty.csv").write_text("client,parameter,value\n")
    (tmp_path / "extra.csv").write_text("client,parameter,value,source\n"
                                        "robot0,x1+:x1,0.9,sim\n")
    for name, msg in (("empty", "no rows; allowed: one row per client and parameter (repeat, "
                                "client, parameter, value)"),
                      ("extra", "column 'source' is not a column of a truth file; allowed: "
                                "repeat (optional), client, parameter, value")):
        out = tmp_path / f"out_{name}"
        res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'logs'}",
                             f"data.truth={tmp_path / name}.csv", "progress=false",
                             f"hydra.run.dir={out}")
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert res.stderr.strip() == f"fnsysid: error: {tmp_path / name}.csv: {msg}"
        assert not out.exists()


def test_write_client_files_writes_one_exact_csv_per_client(tmp_path):
    from fnsysid.data.files import write_client_files

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"client": np.repeat([3, 1, 2], 4), "t": np.tile(np.arange(4), 3),
                       "x1": rng.normal(size=12) * 1e-7, "u": rng.normal(size=12)})
    paths = write_client_files(df, tmp_path / "new" / "fleet", "robot{client:02d}")
    assert [p.name for p in paths] == ["robot01.csv", "robot02.csv", "robot03.csv"]
    for c, p in zip([1, 2, 3], paths, strict=True):
        back = pd.read_csv(p)
        want = df[df["client"] == c].drop(columns="client").reset_index(drop=True)
        assert list(back.columns) == ["t", "x1", "u"]
        assert back.equals(want)                      # %.17g: every float reads back exactly


def test_a_folder_named_like_a_number_is_refused_with_how_to_quote_it():
    """``data.path=nan`` reaches the schema as a float: the one line says so and how to quote
    the name."""
    from fnsysid.config.messages import not_allowed

    assert not_allowed("data.path", float("nan"), "a non-empty string").endswith(
        "must be a non-empty string; nan was read as a number: quote a name that spells one "
        "(data.path='nan' on the command line)")
    assert not_allowed("data.path", True, "a non-empty string").endswith(
        "true was read as a boolean: quote a name that spells one (data.path='true' on the "
        "command line)")
    assert not_allowed("M", 0, "an integer >= 1") == \
        "M=0 is not allowed: M must be an integer >= 1"
