"""The Python API: fnsysid.run and fnsysid.load_trajectories, and the own-data example."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fnsysid
from fnsysid.app.experiment import run_experiment
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"system": "synthetic", "M": 3, "R": 8, "repeats": 2, "progress": False}


def test_run_returns_the_tables_of_the_command_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = fnsysid.run(SMALL)
    assert list(tmp_path.iterdir()) == []                        # nothing written
    run_experiment(compose_cfg(*[f"{k}={v}" for k, v in SMALL.items()], "output.plot=false"),
                   tmp_path / "cli")
    for name in ("errors", "clients", "estimates", "theory"):
        pd.testing.assert_frame_equal(getattr(res, name),
                                      pd.read_csv(tmp_path / "cli" / f"{name}.csv"),
                                      check_dtype=False, rtol=1e-12)
    assert res.summary["system"] == "synthetic" and res.summary["strategy"] == "fedavg"
    assert res.summary["data"] == "simulated" and res.summary["feature_map"] == "default"


@pytest.mark.slow
def test_list_and_dict_overrides_agree_and_output_dir_writes_the_run(tmp_path):
    a = fnsysid.run([f"{k}={v}" for k, v in SMALL.items()], output_dir=tmp_path / "out")
    b = fnsysid.run(SMALL)
    pd.testing.assert_frame_equal(a.errors, b.errors)
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"errors.csv", "summary.json", "config.yaml", "error.png", "fit.png"} <= files


def test_dict_overrides_take_nested_values_and_keep_strings_strings():
    # a mapping value (a K distribution) reaches the run as the command line's {k:v} form
    res = fnsysid.run({"system": "synthetic", "M": 3, "R": 2, "output.plot": False,
                       "K": {"kind": "uniform_int", "low": 1, "high": 3}})
    assert res.summary["status"] == "ok"
    assert res.summary["K"] == {"kind": "uniform_int", "low": 1, "high": 3}
    # a string is a string: 'false' is not the boolean false
    with pytest.raises(fnsysid.ConfigError, match="data.shared_noise='false' is not allowed"):
        fnsysid.run({"data.shared_noise": "false", "M": 2, "R": 1})


@pytest.mark.slow
def test_numpy_scalars_are_the_python_numbers_they_are():
    """Values straight from numpy (np.int64, np.float64, np.bool_, np.logspace's items)
    reach the run as the int, float and bool they are, nested ones too."""
    lrs = np.logspace(-4, -2, 3)
    res = fnsysid.run({"system": "synthetic", "M": np.int64(3), "eps": np.float64(0.1),
                       "R": np.int32(2), "lr": lrs[1], "repeats": 1, "progress": np.bool_(False),
                       "K": {"kind": "uniform_int", "low": np.int64(1), "high": np.int16(3)}})
    s = res.settings
    assert (s.M, s.eps, s.R, s.lr, s.progress) == (3, 0.1, 2, 1e-3, False)
    assert type(s.M) is int and type(s.lr) is float
    assert res.summary["K"] == {"kind": "uniform_int", "low": 1, "high": 3}
    same = fnsysid.run({"system": "synthetic", "M": 3, "eps": 0.1, "R": 2, "lr": 1e-3,
                        "repeats": 1, "progress": False,
                        "K": {"kind": "uniform_int", "low": 1, "high": 3}})
    assert res.errors.equals(same.errors)
    with pytest.raises(fnsysid.ConfigError, match=r"^M=3.0 is not allowed"):
        fnsysid.run({"M": np.float64(3.0)})           # a float is not an integer setting


@pytest.mark.parametrize("overrides, message", [
    ({5: 1}, "overrides: the key 5 (int) is not a setting name; keys are strings such as 'M'"),
    ({("M",): 1}, "overrides: the key ('M',) (tuple) is not a setting name"),
    ({"N": np.array([5, 10])}, "N: a value of type ndarray is not a setting value (a numpy "
                               "array: give value.tolist()); allowed: str, int, float, bool, "
                               "None (numpy scalars too), and lists and dicts of them"),
    ({"M": object()}, "M: a value of type object is not a setting value; allowed:"),
    ({"N": [5, b"10"]}, "N: a value of type bytes is not a setting value"),
    ({"K": {1: 2}}, "K: the key 1 (int) is not a setting name; keys are strings"),
    ({"K": {"kind": "uniform_int", "low": np.datetime64("2020-01-01")}},
     "K.low: a value of type datetime64 is not a setting value"),
])
def test_other_objects_and_keys_are_refused_naming_the_key(tmp_path, overrides, message):
    with pytest.raises(fnsysid.ConfigError) as exc:
        fnsysid.run(overrides, output_dir=tmp_path / "out")
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, message", [
    (["M=3", 2], "overrides: item 2 (the int 2) is not an override string; allowed: "
                 "'key=value' strings such as 'M=20' (or a dict {'M': 20})"),
    (("M=3", None), "overrides: item 2 (the NoneType None) is not an override string"),
    (5, "overrides: a value of type int is not a list of 'key=value' strings or a dict"),
])
def test_overrides_that_are_not_strings_are_named(tmp_path, overrides, message):
    with pytest.raises(fnsysid.ConfigError) as exc:
        fnsysid.run(overrides, output_dir=tmp_path / "out")
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_output_dir_or_data_path_with_a_name_too_long_is_a_config_error(tmp_path):
    long = tmp_path / ("a" * 256) / "out"
    with pytest.raises(fnsysid.ConfigError) as exc:
        fnsysid.run({"M": 3}, output_dir=long)
    assert str(exc.value) == (f"output_dir={long}: File name too long; a path whose every part "
                              "has at most 255 bytes")
    missing = tmp_path / "new" / ("a" * 256)       # below a missing folder: nothing made
    with pytest.raises(fnsysid.ConfigError, match=f"^output_dir={missing}: File name too long;"):
        fnsysid.run({"M": 3}, output_dir=missing)
    assert not (tmp_path / "new").exists()
    with pytest.raises(fnsysid.ConfigError, match=f"^config_dir={long}: File name too long;"):
        fnsysid.run({"M": 3}, config_dir=long)
    for key in ("path", "val_path"):
        paths = {"path": str(tmp_path / "data.csv"), key: str(long)}
        with pytest.raises(fnsysid.ConfigError) as exc:
            fnsysid.run({"system": "generic", "data": "files", "data.states": ["x1"],
                         **{f"data.{k}": v for k, v in paths.items()}})
        assert str(exc.value).startswith(f"data.{key}={long}: File name too long;")


@pytest.mark.parametrize("value, problem", [
    ("inf", "is not allowed"), ("1e400", "is not allowed"), ("-5e9", "is not allowed"),
    ("0", "is not allowed"), ("nan", "is not a number"), ("4 GB", "is not a number")])
def test_a_memory_limit_that_is_not_a_positive_finite_number_is_refused(monkeypatch, value,
                                                                         problem):
    from fnsysid.app.resources import memory_limit

    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", value)
    with pytest.raises(fnsysid.ConfigError) as exc:
        memory_limit()
    assert str(exc.value) == (f"FNSYSID_MEMORY_LIMIT={value} {problem}; allowed: a positive "
                              "finite number of bytes, e.g. 4e9 (unset: the available memory)")
    with pytest.raises(fnsysid.ConfigError, match="^FNSYSID_MEMORY_LIMIT="):
        fnsysid.run({"M": 3, "R": 2, "repeats": 1})
    monkeypatch.setenv("FNSYSID_MEMORY_LIMIT", "1.5e6")
    assert memory_limit() == (1_500_000, "FNSYSID_MEMORY_LIMIT=1.5e6")


@pytest.mark.parametrize("overrides, message", [
    (["M=0"], "M=0 is not allowed"),
    ({"system": "foo"}, "system=foo is not an option; allowed: generic,"),
    (["M=1,2"], "the Python API (fnsysid.run, FederatedSysID) runs one job"),
    ({"system": "generic"}, "system=generic"),
])
def test_bad_settings_raise_the_one_line_message(tmp_path, overrides, message):
    with pytest.raises(fnsysid.ConfigError) as exc:
        fnsysid.run(overrides, output_dir=tmp_path / "out")
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_load_trajectories_returns_the_checked_table(tmp_path):
    df = pd.DataFrame({"client": ["b", "b", "a", "a", "a"], "x": [1.0, 2, 3, 4, 5],
                       "u": [0.0, 0, 1, 1, np.nan]})
    df.to_csv(tmp_path / "all.csv", index=False)
    out = fnsysid.load_trajectories(tmp_path / "all.csv", ["x"], ["u"])
    assert list(out.columns) == ["repeat", "client", "trajectory", "t", "x", "u"]   # no split
    assert out["client"].tolist() == ["a", "a", "a", "b", "b"]     # sorted clients
    assert out["x"].tolist() == [3, 4, 5, 1, 2] and out["u"].iloc[2] == 0.0


@pytest.mark.slow
def test_own_data_example_runs_and_fits(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["own_data.py", str(tmp_path)])
    runpy.run_path(str(ROOT / "examples" / "own_data.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "5 robots" in out and (tmp_path / "fit.png").stat().st_size > 10_000
    nrmse = float(out.split("one-step ")[1].split(",")[0])
    assert 0 < nrmse < 0.05       # process noise 0.002 per step, states of size ~0.5


@pytest.mark.slow
def test_output_dir_is_checked_before_the_run_like_the_command_lines_folder(tmp_path):
    small = {**SMALL, "R": 2, "output.plot": False}          # no figure read here
    fnsysid.run(small, output_dir=tmp_path / "out")
    first = (tmp_path / "out" / "errors.csv").read_text()
    with pytest.raises(fnsysid.ConfigError, match=r"output_dir=\S*out holds an earlier run"):
        fnsysid.run({**small, "seed": 1}, output_dir=tmp_path / "out")
    assert (tmp_path / "out" / "errors.csv").read_text() == first      # left as it was
    fnsysid.run({**small, "seed": 1, "output.overwrite": True}, output_dir=tmp_path / "out")
    assert (tmp_path / "out" / "errors.csv").read_text() != first
    (tmp_path / "file").write_text("x")
    with pytest.raises(fnsysid.ConfigError, match=r"output_dir=\S*file is a file, not a folder"):
        fnsysid.run(small, output_dir=tmp_path / "file")


@pytest.mark.slow
def test_run_without_output_dir_does_not_check_hydras_folder(tmp_path, monkeypatch):
    """fnsysid.run writes nothing without output_dir, so a working folder where Hydra's
    results folder could not be made (here `outputs` is a file) does not stop it."""
    (tmp_path / "outputs").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    res = fnsysid.run({"M": 3, "R": 2, "repeats": 1, "progress": False})
    assert res.summary["status"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


@pytest.mark.slow
def test_overwrite_removes_every_file_an_earlier_run_wrote(tmp_path):
    """Each file a run writes is one output.overwrite removes: a run with personalized models
    (client_estimates.csv) overwritten by one without leaves none of its files behind."""
    from fnsysid.results.folder import RESULT_FILES

    out = tmp_path / "out"
    fnsysid.run({**SMALL, "R": 2, "personalize": "auto"}, output_dir=out)
    written = {p.name for p in out.iterdir() if p.is_file()}
    assert {"client_estimates.csv", "parameters.csv", "estimates.csv"} <= written
    assert written - {"run.log"} <= set(RESULT_FILES)
    fnsysid.run({**SMALL, "R": 2, "output.overwrite": True}, output_dir=out)
    assert not (out / "client_estimates.csv").exists()
    assert (out / "estimates.csv").exists()


@pytest.mark.parametrize("extra, unused, words", [
    ({"strategy": "centralized_exact", "K": 7, "lr": 0.5}, ["K", "lr"],
     "K, lr: strategy=centralized_exact is solved in closed form, without local steps"),
    ({"strategy": "oneshot", "optimizer.scale_features": "none"},
     ["optimizer.scale_features"], "strategy=oneshot is solved in closed form"),
    ({"sparsity": "stlsq", "sparsity.unbias": False}, ["sparsity.unbias"],
     "sparsity.unbias: sparsity.alpha=0 fits the kept terms without a ridge"),
    ({"strategy": "fedavg", "K": 7, "sparsity": "stlsq", "sparsity.alpha": 0.1,
      "sparsity.unbias": False}, None, None),
    ({"sparsity": "stlsq", "sparsity.margin": 0.0}, ["sparsity.margin"],
     "sparsity.margin: only sparsity.threshold=auto chooses between candidates"),
    ({"strategy": "fedavg", "output.ci_level": 0.5}, ["output.ci_level"],
     "effect on this run (summary.json: unused_settings): output.ci_level: strategy=fedavg "
     "gives no intervals"),
])
@pytest.mark.slow
def test_settings_that_do_nothing_are_named(extra, unused, words, caplog):
    caplog.set_level("WARNING", logger="fnsysid")
    res = fnsysid.run({**SMALL, "R": 3, "repeats": 1, **extra})
    assert res.summary.get("unused_settings") == unused
    said = [r.getMessage() for r in caplog.records if "have no effect" in r.getMessage()]
    assert len(said) == (0 if words is None else 1)
    if words:
        assert said[0].startswith("settings given that have no effect on this run "
                                  "(summary.json: unused_settings): ") and words in said[0]
    # named or not, as they change the run or not
    plain = {k: v for k, v in extra.items() if k not in (unused or ["K"])}
    other = fnsysid.run({**SMALL, "R": 3, "repeats": 1, **plain})
    same = np.array_equal(other.estimates["estimate"], res.estimates["estimate"])
    assert same == (unused is not None)


def test_an_experiment_that_sweeps_is_refused_unless_each_swept_setting_is_given():
    """experiment=synthetic_gd_M sweeps M over 1, 2, 5, 25, 100: fnsysid.run ran one job at
    M = 20, a value outside the sweep, without a word. It is refused naming M; given M, the
    experiment's other settings compose into one job."""
    from fnsysid.app.api import compose
    from fnsysid.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^M: the settings sweep it \(hydra.sweeper.params: "
                                          r"M=1,2,5,25,100, an experiment's sweep\)"):
        compose({"experiment": "synthetic_gd_M", "R": 2})
    cfg, _ = compose({"experiment": "synthetic_gd_M", "R": 2, "M": 5})
    assert (cfg.M, cfg.R, cfg.N, cfg.lr) == (5, 2, 10, 1e-4)


@pytest.mark.parametrize(("overrides", "message"), [
    (["-m"], r"^'-m' is not a setting \(the Python API runs one job: -m and other flags are "
             r"the command line's\); allowed: key=value strings, e.g. 'M=20'$"),
    (["R 5"], r"^'R 5' is not a setting \(no spaces around the key or the =\)"),
    (["M=[1,2"], r"^'M=\[1,2' is not a setting \(no viable alternative at input '\[1,2'\)"),
    (["M=5", "hydra.run.dir=x"], r"^hydra.run.dir=x: the Python API does not take Hydra's "
                                 r"folders; allowed: output_dir \(fnsysid.run, FederatedSysID\)"),
])
def test_what_the_api_cannot_take_is_named_in_one_line(overrides, message):
    """A flag or a malformed override gave Hydra's lexer error (LexerNoViableAltException
    ... See https://hydra.cc/...); hydra.run.dir was ignored without a word."""
    from fnsysid.app.api import compose
    from fnsysid.config.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        compose(overrides)
