"""Checks of file data beyond the layout: truth files (text client ids, duplicated rows,
fractional repeats), special files (FIFOs, links to devices, unreadable folders), duplicated
CSV columns, integer timestamps and values whose statistics overflow float64."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid import load_trajectories
from fnsysid.app.build import build
from fnsysid.app.experiment import run_experiment
from fnsysid.data.files import DataError, data_files, load_truth
from fnsysid.data.source import load_data
from tests.conftest import cli_in_process, compose_cfg, engine
from tests.test_data_files import GENERIC, linear_fleet, write_per_client

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def zero_padded_fleet(tmp_path, n_clients=3):
    """Per-client files ``00.csv, 01.csv, ...`` and a truth file naming the clients so."""
    df, theta = linear_fleet(n_clients=n_clients, n_traj=3, length=15)
    df["client"] = df["client"].str.replace("robot", "0")
    folder = write_per_client(df, tmp_path / "logs")
    truth = pd.DataFrame([{"client": f"0{c}", "parameter": f"{s}+:{f}", "value": theta[i, k]}
                          for c in range(n_clients) for i, s in enumerate(["x1", "x2"])
                          for k, f in enumerate(["x1", "x2", "u"])])
    return df, folder, truth


# --- truth files --------------------------------------------------------------------------------

def test_zero_padded_client_ids_are_text_in_data_and_truth(tmp_path):
    df, folder, truth = zero_padded_fleet(tmp_path)
    truth.to_csv(tmp_path / "truth.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={folder}", f"data.truth={tmp_path / 'truth.csv'}",
                      "R=2")
    model, optimizer, _ = build(cfg)
    ds = load_data(cfg, model, optimizer)
    assert ds.clients == ["00", "01", "02"] and ds.has_truth
    # one file with a client column: the ids stay text too
    df.to_csv(tmp_path / "all.csv", index=False)
    got = load_trajectories(tmp_path / "all.csv", ["x1", "x2"], ["u"])
    assert got["client"].unique().tolist() == ["00", "01", "02"]
    # a client column in a folder's file that agrees with the stem as text is accepted
    own = pd.read_csv(folder / "00.csv")
    own.insert(0, "client", "00")
    own.to_csv(folder / "00.csv", index=False)
    assert (folder / "00.csv").read_text().splitlines()[1].startswith("00,")
    assert load_trajectories(folder, ["x1", "x2"], ["u"])["client"].nunique() == 3


def test_labels_equal_as_numbers_but_not_as_text_are_two_clients(tmp_path):
    df, _ = linear_fleet(n_clients=3, n_traj=2, length=5)
    df["client"] = df["client"].map({"robot0": "1", "robot1": "01", "robot2": "10"})
    df.to_csv(tmp_path / "all.csv", index=False)
    got = load_trajectories(tmp_path / "all.csv", ["x1", "x2"], ["u"])
    # numeric order (1 = 01 < 10), ties by text
    assert got["client"].unique().tolist() == ["01", "1", "10"]


def test_a_second_truth_row_for_one_client_and_parameter_is_refused(tmp_path):
    _, folder, truth = zero_padded_fleet(tmp_path)
    dup = pd.concat([truth, truth.iloc[[4]].assign(value=5.0)], ignore_index=True)
    dup.to_csv(tmp_path / "truth.csv", index=False)
    with pytest.raises(DataError, match=r"truth.csv: row 19: client '00', parameter "
                                        r"'x2\+:x2' is given again \(first in row 5\); "
                                        "allowed: one row per client and parameter$"):
        load_truth(tmp_path / "truth.csv", ["00", "01", "02"],
                   ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"], 1)
    # with a repeat column the key holds the repeat: the same row in two repeats is fine
    two = pd.concat([truth.assign(repeat=0), truth.assign(repeat=1)], ignore_index=True)
    two.to_csv(tmp_path / "truth2.csv", index=False)
    theta = load_truth(tmp_path / "truth2.csv", ["00", "01", "02"],
                       ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"], 2)
    assert theta.shape == (2, 3, 6) and theta[1, 2, 4] == truth["value"].iloc[16]
    pd.concat([two, two.iloc[[20]]]).to_csv(tmp_path / "truth3.csv", index=False)
    with pytest.raises(DataError, match=r"row 37: repeat 1, client '00', parameter "):
        load_truth(tmp_path / "truth3.csv", ["00", "01", "02"],
                   ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"], 2)


@pytest.mark.slow
def test_a_fractional_truth_repeat_is_refused_on_the_command_line(tmp_path):
    _, folder, truth = zero_padded_fleet(tmp_path)
    rep = truth.assign(repeat=[0.7] + [0] * (len(truth) - 1))
    rep.to_csv(tmp_path / "truth.csv", index=False)
    res = cli_in_process(*GENERIC, f"data.path={folder}", f"data.truth={tmp_path / 'truth.csv'}",
                         f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"fnsysid: error: {tmp_path / 'truth.csv'}: row 1, column "
                                  "'repeat' is 0.7; allowed: integers >= 0")
    assert not (tmp_path / "run").exists()


# --- special files ------------------------------------------------------------------------------

def _fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("where", ["data.path", "in_folder", "data.truth", "data.val_path"])
def test_a_fifo_is_refused_before_a_folder_is_made(tmp_path, where):
    df, _ = linear_fleet(n_clients=3, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    fifo = _fifo(tmp_path / "pipe.csv")
    args = {"data.path": [f"data.path={fifo}"],
            "in_folder": [f"data.path={folder}"],
            "data.truth": [f"data.path={folder}", f"data.truth={fifo}"],
            "data.val_path": [f"data.path={folder}", f"data.val_path={fifo}"]}[where]
    if where == "in_folder":
        (folder / "robot2.csv").unlink()
        _fifo(folder / "robot2.csv")
        message = f"{folder / 'robot2.csv'} is a FIFO (named pipe), not a regular file; " \
                  "allowed: a .csv or .parquet file (remove it or move it out of the folder)"
    else:
        message = f"{where}={fifo} is a FIFO (named pipe), not a regular file; allowed: a " \
                  ".csv or .parquet file"
    res = cli_in_process(*GENERIC, *args, f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"fnsysid: error: {message}" +
                                               (", or a folder of them" if where in (
                                                   "data.path", "data.val_path") else "")]
    assert not (tmp_path / "run").exists()
    with pytest.raises(DataError, match="FIFO"):             # the Python API, the same check
        fnsysid.run([*GENERIC, *args, "R=1"], output_dir=tmp_path / "api")
    assert not (tmp_path / "api").exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_link_to_a_device_is_refused_in_a_folder_and_as_the_path(tmp_path):
    df, _ = linear_fleet(n_clients=4, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    (folder / "robot3.csv").unlink()
    (folder / "robot3.csv").symlink_to("/dev/zero")
    with pytest.raises(DataError, match=r"robot3.csv is a character device \(a link to "
                                        r"/dev/zero\), not a regular file"):
        data_files(folder)                                   # not M = 3
    (tmp_path / "zero.parquet").symlink_to("/dev/zero")
    with pytest.raises(DataError, match=r"^data.path=\S+zero.parquet is a character device"):
        data_files(tmp_path / "zero.parquet")
    # a link to a regular file is read as the file
    (folder / "robot3.csv").unlink()
    df[df["client"] == "robot0"].drop(columns="client").to_csv(tmp_path / "r.csv", index=False)
    (folder / "robot3.csv").symlink_to(tmp_path / "r.csv")
    assert [f.name for f in data_files(folder)] == [f"robot{i}.csv" for i in range(4)]


def test_a_folder_and_a_broken_link_with_a_data_suffix_are_refused(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    (folder / "old.csv").mkdir()
    with pytest.raises(DataError, match=r"old.csv is a folder, not a regular file"):
        data_files(folder)
    (folder / "old.csv").rmdir()
    (folder / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    with pytest.raises(DataError, match=r"gone.parquet is a broken symbolic link"):
        data_files(folder)


@pytest.mark.skipif(ROOT, reason="root reads any folder")
def test_an_unreadable_folder_or_file_is_refused(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    (folder / "robot1.csv").chmod(0)
    try:
        with pytest.raises(DataError, match=r"robot1.csv cannot be read \(permission denied\)"):
            data_files(folder)
        folder.chmod(0)
        with pytest.raises(DataError, match=r"^data.path=\S+logs: the folder cannot be read"):
            data_files(folder)
    finally:
        folder.chmod(0o755)
        (folder / "robot1.csv").chmod(0o644)


# --- duplicated columns, integer timestamps ------------------------------------------------------

def test_a_column_name_given_twice_in_a_csv_is_refused(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=5)
    folder = write_per_client(df, tmp_path / "logs")
    text = (folder / "robot1.csv").read_text().splitlines()
    assert text[0] == "trajectory,t,x1,x2,u"
    (folder / "robot1.csv").write_text("\n".join(["trajectory,t,x1,x2, x1"] + text[1:]) + "\n")
    with pytest.raises(DataError, match=r"robot1.csv: column 'x1' appears twice in the header; "
                                        "allowed: one column per name$"):
        load_trajectories(folder, ["x1", "x2"], ["u"])


def test_integer_nanosecond_timestamps_are_compared_exactly(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=6)
    start = 1_700_000_000_000_000_000                       # ns since 1970; float spacing 256
    df["t"] = start + 100 * df.groupby(["client", "trajectory"]).cumcount().astype("int64")
    for fmt in ("csv", "parquet"):
        path = tmp_path / f"all.{fmt}"
        df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
        got = load_trajectories(path, ["x1", "x2"], ["u"])
        assert got["t"].dtype == np.int64 and got["t"].iloc[:6].tolist() == [
            start + 100 * k for k in range(6)]
    # a Parquet timestamp column: its nanoseconds, exactly
    df.assign(t=pd.to_datetime(df["t"], unit="ns")).to_parquet(tmp_path / "stamps.parquet")
    got = load_trajectories(tmp_path / "stamps.parquet", ["x1", "x2"], ["u"])
    assert got["t"].iloc[:3].tolist() == [start, start + 100, start + 200]
    assert_swapped_stamps_refused(df.copy(), tmp_path, start)
    summary = run_experiment(compose_cfg(*GENERIC, f"data.path={tmp_path / 'all.csv'}", "R=2"),
                             tmp_path / "run")
    assert summary["status"] == "ok" and summary["M"] == 2


def assert_swapped_stamps_refused(df, folder, start: int) -> None:
    """Rows 4 and 5 of ``df`` (stamps ``start + 200``, ``start + 300`` of client robot0)
    swapped, written as CSV: refused naming both exact values."""
    df.loc[[2, 3], "t"] = df.loc[[3, 2], "t"].to_numpy()
    df.to_csv(folder / "swapped.csv", index=False)
    with pytest.raises(DataError, match=rf"row 4: t={start + 200} does not increase within "
                                        rf"client 'robot0', trajectory 0 \(previous "
                                        rf"t={start + 300}\)$"):
        load_trajectories(folder / "swapped.csv", ["x1", "x2"], ["u"])


def test_integer_stamps_stay_exact_beside_another_client_s_fractional_times(tmp_path, caplog):
    df, _ = linear_fleet(n_clients=2, n_traj=1, length=6)
    start = 1_700_000_000_000_000_000                       # float spacing 256: 100 ns equal
    k = df.groupby("client").cumcount()
    stamps = [str(start + 100 * i) for i in k[df["client"] == "robot0"]]
    seconds = [f"{0.5 + i}" for i in k[df["client"] == "robot1"]]
    df["t"] = stamps + seconds
    df.to_csv(tmp_path / "all.csv", index=False)
    caplog.set_level("WARNING", logger="fnsysid")
    got = load_trajectories(tmp_path / "all.csv", ["x1", "x2"], ["u"])
    assert got["t"].tolist() == [start + 100 * i for i in range(6)] + [0.5 + i for i in range(6)]
    # 100 ns is no step of 1 s in any unit: the rates were not compared, which is said
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(
        "time column 't': client(s) 'robot0' have integer times and the other 1 client(s) "
        "fractional: the integer times step by 100, the fractional by 1; read as seconds, "
        "milliseconds, microseconds or nanoseconds the integer step is 100, 0.1, 0.0001, "
        "1e-07 s, none of them 1, so the two sample rates were not compared")
    caplog.clear()
    same = df.assign(t=[str(start + 10 ** 9 * i) for i in k[df["client"] == "robot0"]]
                     + seconds)
    same.to_csv(tmp_path / "same.csv", index=False)
    load_trajectories(tmp_path / "same.csv", ["x1", "x2"], ["u"])
    assert not caplog.records                              # 1 s in nanoseconds: one rate
    seconds_too = df.assign(t=[str(7 + i) for i in k[df["client"] == "robot0"]] + seconds)
    seconds_too.to_csv(tmp_path / "unix.csv", index=False)
    load_trajectories(tmp_path / "unix.csv", ["x1", "x2"], ["u"])
    assert not caplog.records                              # integer seconds: one rate
    # a folder: one client's file of stamps, the other's of seconds
    folder = write_per_client(df, tmp_path / "logs")
    assert load_trajectories(folder, ["x1", "x2"], ["u"])["t"].tolist()[:2] == [start,
                                                                                start + 100]
    summary = run_experiment(compose_cfg(*GENERIC, f"data.path={folder}", "R=2"),
                             tmp_path / "run")
    assert summary["status"] == "ok" and summary["M"] == 2
    # stamps out of order are still found, by their exact values
    assert_swapped_stamps_refused(df, tmp_path, start)
    # fractional times out of order too
    df.loc[[2, 3], "t"] = df.loc[[3, 2], "t"].to_numpy()
    df.loc[[8, 9], "t"] = df.loc[[9, 8], "t"].to_numpy()
    df.to_csv(tmp_path / "swapped2.csv", index=False)
    with pytest.raises(DataError, match=r"row 10: t=2.5 does not increase within client "
                                        r"'robot1', trajectory 0 \(previous t=3.5\)$"):
        load_trajectories(tmp_path / "swapped2.csv", ["x1", "x2"], ["u"])
    # stamps beyond int64 (uint64) keep their values (they wrapped to negative numbers)
    big = 18_000_000_000_000_000_000
    df.assign(t=[str(big + 100 * i) for i in range(12)]).to_csv(tmp_path / "big.csv",
                                                                 index=False)
    got = load_trajectories(tmp_path / "big.csv", ["x1", "x2"], ["u"])["t"]
    assert got.tolist()[:2] == [big, big + 100] and got.dtype == np.uint64


# --- values that overflow float64 ---------------------------------------------------------------

@pytest.mark.parametrize("row, which", [(5, "training"), (28, "held-out")])
def test_a_value_whose_statistics_overflow_is_refused_naming_the_file_and_row(tmp_path, row,
                                                                              which):
    df, _ = linear_fleet(n_clients=3, n_traj=2, length=15)
    folder = write_per_client(df, tmp_path / "logs")
    one = pd.read_csv(folder / "robot1.csv")
    one.loc[row - 1, "x2"] = 1e308 if which == "training" else -1e200   # row 28: trajectory 1
    one.loc[14, "u"] = 1.7e308            # row 15: the last sample's input, not used: not named
    one.to_csv(folder / "robot1.csv", index=False)
    res = cli_in_process(*GENERIC, f"data.path={folder}", "optimizer.scale_features=whiten",
                         f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    value = "1e+308" if which == "training" else "-1e+200"
    assert res.stderr.strip().splitlines() == [
        f"fnsysid: error: {folder / 'robot1.csv'}: row {row}, column 'x2' is {value}: the "
        f"{which} statistics of client 'robot1' (its features squared and summed over its "
        "samples) overflow float64 (this is the client's largest |value|); allowed: values "
        "whose squared features sum to less than 1.8e+308 (rescale the column)"]
    assert not (tmp_path / "run").exists()


def test_true_parameters_whose_norm_overflows_are_refused(tmp_path):
    _, folder, truth = zero_padded_fleet(tmp_path)
    truth.loc[9, "value"] = -1e200                           # client 01
    truth.to_csv(tmp_path / "truth.csv", index=False)
    with pytest.raises(DataError, match=r"truth.csv: row 10, column 'value' is -1e\+200: the "
                                        "true parameters of client '01' have a squared norm "
                                        "that overflows float64"):
        load_truth(tmp_path / "truth.csv", ["00", "01", "02"],
                   ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"], 1)


def test_a_large_value_whose_statistics_stay_finite_is_read(tmp_path):
    df, _ = linear_fleet(n_clients=2, n_traj=2, length=10)
    df.loc[3, "x1"] = 1e150                                  # squared: 1e300, finite
    df.to_csv(tmp_path / "all.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'all.csv'}", "data.holdout=0")
    model, optimizer, _ = build(cfg)
    data = load_data(cfg, model, optimizer).train
    assert np.isfinite(data.H).all() and data.H[0, 0, 0, 0] == pytest.approx(1e300)


@pytest.mark.slow
def test_a_start_model_that_overflows_is_refused(tmp_path):
    res = cli_in_process("system=pendulum", "R=2", "output.plot=false", "system.init.scale=1e308",
                         f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "fnsysid: error: system.init.scale=1e+308: the start model (1e+308 x the nominal "
        "parameters, norm ") and "allowed: |system.init.scale| below " in lines[0]
    assert not (tmp_path / "run").exists()
    limit = float(lines[0].rsplit(" ", 1)[1])
    from fnsysid.learning.start import initial_model

    model = build(compose_cfg("system=pendulum"))[0]
    for scale, ok in ((0.99 * limit, True), (1.01 * limit, False)):
        init = type("Init", (), {"reference": "nominal", "scale": scale})
        if ok:
            assert np.isfinite(initial_model(model, None, init, repeats=1)).all()
        else:
            with pytest.raises(fnsysid.ConfigError, match="overflows float64"):
                initial_model(model, None, init, repeats=1)


def test_simulated_states_that_overflow_are_refused(tmp_path):
    with pytest.raises(fnsysid.ConfigError, match=r"^data=simulated: the training statistics of "
                                                  r"client 0 \(repeat 0\) overflow float64 .*"
                                                  r"system=linear grow too large\); allowed: "):
        fnsysid.run(["system=linear", "M=2", "R=1", "system.x0.scale=1e200",
                     "output.plot=false"], output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_statistics_that_overflow_only_summed_over_clients_are_refused(tmp_path):
    # each client's x1 squared is 8.1e307; two summed are finite, three are not
    df, _ = linear_fleet(n_clients=3, n_traj=2, length=15)
    df.loc[df.groupby("client").head(15).index[4::15], "x1"] = 9e153     # row 5 of each client
    df.to_parquet(tmp_path / "all.parquet", index=False)
    path = tmp_path / "all.parquet"
    for strategy in ("oneshot", "centralized_exact", "fedavg"):
        res = cli_in_process(*GENERIC, f"data.path={path}", f"strategy={strategy}", "R=2",
                             f"hydra.run.dir={tmp_path}/run")
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"fnsysid: error: data.path={path}: the training statistics of its 3 clients summed "
            "(the pooled data of strategy=centralized and of the theory table: features squared "
            "and summed over all clients' samples) overflow float64, though each client's are "
            f"finite; the largest |value| is 9e+153 ({path}: row 5, column 'x1', client "
            "'robot0'); allowed: values whose squared features summed over all clients stay "
            "below 1.8e+308 (rescale the column)"]
        assert not (tmp_path / "run").exists()
    # two clients sum to a finite value: read
    df[df["client"] != "robot2"].to_csv(tmp_path / "two.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'two.csv'}", "data.holdout=0")
    model, optimizer, _ = build(cfg)
    H = load_data(cfg, model, optimizer).train.H
    assert H.sum(axis=1)[0, 0, 0] == pytest.approx(2 * 8.1e307)


def test_simulated_statistics_that_overflow_summed_over_clients_are_refused(tmp_path):
    with pytest.raises(fnsysid.ConfigError, match=r"^data=simulated: the training statistics of "
                                                  r"the 50 clients \(repeat 0\) summed overflow "
                                                  "float64 "):
        fnsysid.run(["system=linear", "M=50", "R=1", "system.x0.scale=3e152",
                     "output.plot=false"], output_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("tiny", [0.0, 1e-160, 1e-170])
def test_true_parameters_of_norm_zero_are_refused_naming_the_client(tmp_path, tiny):
    _, folder, truth = zero_padded_fleet(tmp_path)
    truth.loc[6:11, "value"] = [tiny, -tiny, 0.0, 0.0, 0.0, 0.0]   # client 01: rows 7..12
    truth.to_csv(tmp_path / "truth.csv", index=False)
    res = cli_in_process(*GENERIC, f"data.path={folder}", f"data.truth={tmp_path / 'truth.csv'}",
                         "R=2", f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"fnsysid: error: {tmp_path / 'truth.csv'}: client '01': the true parameters have norm "
        "0 (all zero, or so small that their squares underflow: the largest |value| is "
        f"{tiny:g}, row 7) and e_r divides by their norm; allowed: per client, some |value| "
        "above about 1e-154"]
    assert not (tmp_path / "run").exists()
    truth.loc[6, "value"] = 1e-150                           # squared 1e-300: a norm above 0
    truth.to_csv(tmp_path / "truth.csv", index=False)
    theta = load_truth(tmp_path / "truth.csv", ["00", "01", "02"],
                       ["x1+:x1", "x1+:x2", "x1+:u", "x2+:x1", "x2+:x2", "x2+:u"], 1)
    assert theta[0, 1, 0] == 1e-150


@pytest.mark.slow
def test_truth_repeats_are_matched_by_the_data_s_repeat_labels(tmp_path):
    _, folder, truth = zero_padded_fleet(tmp_path)
    data = pd.concat([pd.read_csv(f, dtype={"client": str}).assign(client=f.stem)
                      for f in sorted(folder.glob("*.csv"))])
    both = pd.concat([data.assign(repeat=7), data.assign(repeat=3)], ignore_index=True)
    both.to_csv(tmp_path / "all.csv", index=False)
    two = pd.concat([truth.assign(repeat=3), truth.assign(repeat=7, value=truth["value"] + 1)],
                    ignore_index=True)
    two.to_csv(tmp_path / "truth.csv", index=False)
    cfg = compose_cfg(*GENERIC, f"data.path={tmp_path / 'all.csv'}",
                      f"data.truth={tmp_path / 'truth.csv'}", "R=2")
    model, optimizer, _ = build(cfg)
    ds = load_data(cfg, model, optimizer)
    # repeats 0, 1 of the run are the labels 3, 7 in their order; truth by label
    assert ds.repeats == [3, 7] and ds.settings["repeat_labels"] == [3, 7]
    assert load_trajectories(tmp_path / "all.csv", ["x1", "x2"], ["u"])["repeat"].unique(
        ).tolist() == [3, 7]
    assert ds.train.theta_true[0, 1, 0] == truth["value"].iloc[6]
    assert ds.train.theta_true[1, 1, 0] == truth["value"].iloc[6] + 1
    # labels absent from the data (0, 1: the positions) are refused naming them
    two.assign(repeat=two["repeat"].map({3: 0, 7: 1})).to_csv(tmp_path / "t01.csv", index=False)
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'all.csv'}",
                         f"data.truth={tmp_path / 't01.csv'}", f"hydra.run.dir={tmp_path}/run")
    assert res.returncode == 2
    assert res.stderr.strip() == (f"fnsysid: error: {tmp_path / 't01.csv'}: row 1: repeat 0 is "
                                  "not a repeat of the data; allowed: the data's repeat labels "
                                  "(3, 7)")
    assert not (tmp_path / "run").exists()
    # a boolean is not a repeat label (True is not 1)
    two.assign(repeat=two["repeat"] == 7).to_parquet(tmp_path / "tb.parquet", index=False)
    with pytest.raises(DataError, match=r"tb.parquet: row 1, column 'repeat' is False; "
                                        "allowed: integers >= 0$"):
        load_truth(tmp_path / "tb.parquet", ["00", "01", "02"], model.param_names, [0, 1])
    # held-out files need the same repeat labels
    both.assign(repeat=both["repeat"].map({3: 0, 7: 1})).to_csv(tmp_path / "val.csv",
                                                                 index=False)
    with pytest.raises(DataError, match=r"val.csv has repeats 0, 1, data.path 3, 7; allowed: "
                                        "the same repeat labels$"):
        load_data(compose_cfg(*GENERIC, f"data.path={tmp_path / 'all.csv'}",
                              f"data.val_path={tmp_path / 'val.csv'}"), model, optimizer)
    # the outputs number the repeats 0..S-1; summary.json gives their labels
    summary = run_experiment(cfg, tmp_path / "ok")
    assert summary["repeat_labels"] == [3, 7] and summary["status"] == "ok"
    assert pd.read_csv(tmp_path / "ok" / "errors.csv")["repeat"].unique().tolist() == [0, 1]


@pytest.mark.slow
def test_clients_and_estimates_of_file_data_name_the_clients_by_their_ids(tmp_path):
    _, folder, truth = zero_padded_fleet(tmp_path)
    (folder / "02.csv").rename(folder / "1.csv")        # ids 00, 01, 1: positions 0, 1, 2
    third = truth["client"] == "02"                      # its truth twice the data's: e ~ 0.5
    truth.loc[third, "value"] *= 2
    truth.loc[third, "client"] = "1"
    truth.to_csv(tmp_path / "truth.csv", index=False)
    summary = run_experiment(compose_cfg(*GENERIC, f"data.path={folder}", "strategy=local",
                                         f"data.truth={tmp_path / 'truth.csv'}", "R=2"),
                             tmp_path / "run")
    assert summary["clients"] == ["00", "01", "1"]
    clients = pd.read_csv(tmp_path / "run" / "clients.csv", dtype={"client": str})
    assert clients["client"].tolist()[:3] == ["00", "01", "1"] and len(clients) == 9
    estimates = pd.read_csv(tmp_path / "run" / "estimates.csv", dtype={"client": str})
    assert estimates["client"].unique().tolist() == ["00", "01", "1"]
    # the error of client '1' is that of the file 1.csv (the third client), not of position 1
    e = clients[clients["round"] == 2].set_index("client")["error"]
    assert e.index.tolist() == ["00", "01", "1"]
    assert e["1"] > 0.4 and e["00"] < 0.3 and e["01"] < 0.3
    # simulated clients keep their positions 0..M-1
    res = engine("system=linear", "M=3", "R=1", "strategy=local", "output.plot=false")
    assert res.clients["client"].tolist()[:3] == [0, 1, 2]
    assert res.estimates["client"].unique().tolist() == ["0", "1", "2"]


def test_fit_plot_shows_a_scored_client_not_one_of_all_zero_data(tmp_path, monkeypatch):
    import fnsysid.results.plotting.run_plots as plotting

    df, _ = linear_fleet(n_clients=3, n_traj=3, length=15)
    df.loc[df["client"] == "robot0", ["x1", "x2", "u"]] = 0.0    # the first client: zeros
    folder = write_per_client(df, tmp_path / "logs")
    drawn = {}
    monkeypatch.setattr(plotting, "plot_fit", lambda measured, step, sim, names, title, **kw:
                        drawn.update(measured=measured, title=title) or drawn)
    res = engine(*GENERIC, f"data.path={folder}", "strategy=oneshot", "R=1")
    assert res.summary["unscored_clients"] == ["robot0"]
    assert res.plot_fit() is drawn                                  # the figure drawn
    assert drawn["title"] == "client robot1, held-out trajectory 1"
    assert np.ptp(drawn["measured"], axis=0).min() > 0             # states that vary


@pytest.mark.parametrize("extra", [[], ["output.per_client=false"]])
def test_a_tiny_truth_is_not_taken_for_divergence(tmp_path, extra):
    # client 01's truth is 1e-150 (its data are the fleet's): every model of the fleet's
    # size has a relative error of about 1e150 for it, from round 1 on, without growing;
    # the divergence rule reads errors on the scale of the fleet's largest truth
    _, folder, truth = zero_padded_fleet(tmp_path)
    truth.loc[6:11, "value"] = [1e-150, -1e-150, 0.0, 0.0, 0.0, 0.0]
    truth.to_csv(tmp_path / "truth.csv", index=False)
    res = engine(*GENERIC, f"data.path={folder}", f"data.truth={tmp_path / 'truth.csv'}",
                 "R=20", *extra)
    assert res.summary["status"] == "ok" and res.summary["diverged_round"] is None
    # the errors stay as defined (paper eq. 9): client 01's is enormous
    assert res.summary["final_e_max_mean"] > 1e140
    # the same model with the divergence rule's own numbers: not grown on the fleet's scale
    est = res.estimates.pivot(index="repeat", columns="parameter",
                              values="estimate").to_numpy()
    assert np.isfinite(est).all() and np.abs(est).max() < 10


def _spaced(df: pd.DataFrame, client: str, factor: float) -> pd.DataFrame:
    """``df`` with ``client``'s time steps ``factor`` times the others' (0.1)."""
    df = df.copy()
    mask = df["client"] == client
    df.loc[mask, "t"] = df.loc[mask, "t"] * factor
    return df


@pytest.mark.slow
def test_a_dropped_row_or_a_client_at_another_rate_is_refused_jitter_is_not(tmp_path):
    """The model maps a sample to the next: a gap (a dropped row) or a client logged at
    another rate gives a model right for no client, so the reader refuses them in one line
    naming the row, the step and the client's or fleet's step; timing jitter passes."""
    df, _ = linear_fleet(n_clients=4, n_traj=2, length=20)
    gap = df.drop(index=25).reset_index(drop=True)          # robot0, trajectory 1, t=0.5
    gap.to_csv(tmp_path / "gap.csv", index=False)
    with pytest.raises(DataError, match=r"gap.csv: row 26: t steps by 0.2 from 0.4 to "
                       r"0.6000000000000001 in client 'robot0', trajectory 1, where the "
                       r"client's step is 0.1 \(a gap, or another sample rate\); allowed: "
                       r"uniformly sampled trajectories"):
        load_trajectories(tmp_path / "gap.csv", ["x1", "x2"], ["u"])
    _spaced(df, "robot2", 2.0).to_csv(tmp_path / "rate.csv", index=False)
    with pytest.raises(DataError, match=r"rate.csv: row 81: client 'robot2' is sampled every "
                       r"0.2 \(t, its mean step\), the fleet every 0.1; allowed: one sample "
                       r"rate, each client's within 2% of the fleet's"):
        load_trajectories(tmp_path / "rate.csv", ["x1", "x2"], ["u"])
    _spaced(df, "robot1", 1.05).to_csv(tmp_path / "five.csv", index=False)     # 5 % off
    with pytest.raises(DataError, match="client 'robot1' is sampled every 0.105"):
        load_trajectories(tmp_path / "five.csv", ["x1", "x2"], ["u"])
    one, _ = linear_fleet(n_clients=4, n_traj=3, length=20)  # robot3's trajectory 1 at 1.1x
    sel = (one["client"] == "robot3") & (one["trajectory"] == 1)
    one.loc[sel, "t"] = one.loc[sel, "t"] * 1.1
    one.to_csv(tmp_path / "traj.csv", index=False)
    with pytest.raises(DataError, match=r"client 'robot3', trajectory 1 is sampled every 0.11 "
                       r"\(t, its mean step\), the client every 0.1033;"):
        load_trajectories(tmp_path / "traj.csv", ["x1", "x2"], ["u"])
    rng = np.random.default_rng(1)      # jitter of up to 30 % of a step, rates equal
    jit = df.copy()
    jit["t"] = jit["t"] + rng.uniform(-0.015, 0.015, len(jit))
    jit.to_csv(tmp_path / "jitter.csv", index=False)
    assert len(load_trajectories(tmp_path / "jitter.csv", ["x1", "x2"], ["u"])) == len(df)
    # the command line: one line, exit 2, no folder; the time named in data.ignore instead
    out = tmp_path / "run"
    res = cli_in_process(*GENERIC, f"data.path={tmp_path / 'rate.csv'}", "R=2",
                         f"hydra.run.dir={out}")
    assert res.returncode == 2 and not out.exists()
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "client 'robot2' is sampled every 0.2" in err[0], err
    assert "data.ignore instead of data.time" in err[0]
    res = engine(*GENERIC, f"data.path={tmp_path / 'rate.csv'}", "data.ignore=[t]", "R=2")
    assert res.summary["status"] == "ok" and res.summary["M"] == 4


def test_a_semicolon_separated_file_is_refused_naming_the_separator(tmp_path):
    df, _ = linear_fleet(n_clients=1, n_traj=1, length=5)
    df.drop(columns="client").to_csv(tmp_path / "semi.csv", sep=";", decimal=",",
                                     index=False)
    with pytest.raises(DataError, match=r"semi.csv: column 'x1' \(data.states\) is missing; "
                       r"columns: trajectory;t;x1;x2;u; the header is one column holding "
                       r"';': allowed: comma-separated files"):
        load_trajectories(tmp_path / "semi.csv", ["x1", "x2"], ["u"])
