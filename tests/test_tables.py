"""Result tables are written without pandas (csv module); read back, they are the numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import execute, run_experiment
from fnsysid.results.tables import Table, make_summary
from tests.conftest import compose_cfg, make

ROOT = Path(__file__).resolve().parents[1]


def _read_back(table: Table, path: Path) -> pd.DataFrame:
    """``table`` written to ``path`` and read with pandas (strings as strings)."""
    table.to_csv(path, index=False)
    strings = [k for k, a in table.columns.items() if a.dtype.kind in "OU"]
    return pd.read_csv(path, dtype=dict.fromkeys(strings, str))


def test_values_round_trip_through_the_csv(tmp_path):
    """Floats exactly (shortest repr: -0.0, subnormals, 0.1 + 0.2), NaN and None as empty
    fields that read back as missing, ints as ints, booleans, and strings with commas,
    quotes and line breaks quoted so that they read back unchanged."""
    f = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-300, 1e16, 0.1 + 0.2, 123456789.125,
                  1e-5, 5e-324])
    n = len(f)
    labels = ['a,b', 'say "hi"', None, "line\nbreak", "server", "mean", "0", "A", "\u00fc",
              "x y"]
    table = Table({"repeat": np.arange(n), "x": f, "f32": f.astype(np.float32),
                   "label": np.array(labels, dtype=object), "flag": np.arange(n) % 2 == 0,
                   "delta": 0.05, "n_x": 2})
    assert table["delta"].shape == (n,) and table["n_x"].dtype.kind == "i"
    back = _read_back(table, tmp_path / "t.csv")
    assert list(back.columns) == list(table.columns)
    for k in ("repeat", "n_x"):
        assert back[k].dtype == np.int64 and back[k].tolist() == table[k].tolist()
    assert back["flag"].dtype == bool and back["flag"].tolist() == table["flag"].tolist()
    for k in ("x", "f32", "delta"):
        np.testing.assert_array_equal(back[k].to_numpy(), table[k].astype(float))
    assert np.signbit(back["x"][3]) and back["x"][9] == 5e-324 and back["x"][6] == 0.1 + 0.2
    assert back["x"].isna().tolist() == [True] + [False] * (n - 1)
    assert [None if pd.isna(v) else v for v in back["label"]] == labels
    text = (tmp_path / "t.csv").read_text()
    lines = text.split("\n")
    assert lines[0] == "repeat,x,f32,label,flag,delta,n_x"
    assert lines[1] == '0,,,"a,b",True,0.05,2'                   # NaN: an empty field
    assert lines[2] == '1,inf,inf,"say ""hi""",False,0.05,2'
    assert lines[3].startswith("2,-inf,-inf,,True,")                 # None: an empty field
    assert "0.30000000000000004" in text and ",5e-324," in text and ",1e+16," in text
    assert text.endswith("\n") and "\r" not in text


def test_a_large_table_written_by_pyarrow_reads_back_as_the_csv_module_one(tmp_path,
                                                                          monkeypatch):
    """From Table.ARROW_ROWS rows a table is written by pyarrow: read with pandas, the file
    is the csv module's (the values of the round-trip test above, and a client_estimates
    table of a run with personalize=auto: the same columns, types and values, NaN where
    NaN); an object column pyarrow cannot take as one type falls back to the csv module."""
    f = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-300, 1e16, 0.1 + 0.2, 123456789.125,
                  1e-5, 5e-324, 1.0, 100.0])
    n = len(f)
    labels = ['a,b', 'say "hi"', None, "line\nbreak", "server", "mean", "0", "A", "\u00fc",
              "x y", "007", "1.5"]
    tables = {"values": Table({"repeat": np.arange(n), "x": f, "f32": f.astype(np.float32),
                               "label": np.array(labels, dtype=object),
                               "flag": np.arange(n) % 2 == 0, "delta": 0.05, "n_x": 2})}
    r = execute(compose_cfg("system=synthetic", "personalize=auto", "strategy=oneshot", "R=1",
                            "repeats=2", "M=6", "output.plot=false"), choices={},
                given=frozenset())
    tables["client_estimates"] = r.tables.table("client_estimates")
    for name, table in tables.items():
        monkeypatch.setattr(Table, "ARROW_ROWS", 10 ** 9)
        old = _read_back(table, tmp_path / f"{name}_csv.csv")
        monkeypatch.setattr(Table, "ARROW_ROWS", 0)
        new = _read_back(table, tmp_path / f"{name}_arrow.csv")
        assert (tmp_path / f"{name}_arrow.csv").read_text().startswith('"')   # pyarrow's
        pd.testing.assert_frame_equal(new, old)
        for k in old.columns:
            if old[k].dtype.kind == "f":                 # bit for bit, -0.0 included
                np.testing.assert_array_equal(np.signbit(new[k]), np.signbit(old[k]))
    assert tables["client_estimates"]["local_se"].dtype.kind == "f"
    mixed = Table({"client": np.array([1, "a"], dtype=object), "x": [0.5, 1.5]})
    mixed.to_csv(tmp_path / "mixed.csv")                  # ARROW_ROWS is 0: the fallback
    assert (tmp_path / "mixed.csv").read_text() == "client,x\n1,0.5\na,1.5\n"


def test_pyarrow_slices_formatted_on_threads_write_the_file_of_one_slice(tmp_path,
                                                                          monkeypatch):
    """A large table is formatted by pyarrow in slices of Table.ARROW_CHUNK rows on threads:
    the file is byte for byte the one written as one slice (one header, rows in order), for
    slices that divide the rows and slices that do not, more slices than one batch of
    threads, and one thread or two."""
    n = 23
    table = Table({"row": np.arange(n), "x": np.linspace(-1, 1, n) ** 3,
                   "name": np.array([f"c{i % 4}" for i in range(n)], dtype=object)})
    monkeypatch.setattr(Table, "ARROW_ROWS", 0)
    whole = tmp_path / "whole.csv"
    table.to_csv(whole)
    assert whole.read_text().count("row") == 1 and len(whole.read_text().splitlines()) == n + 1
    for chunk in (1, 5, 23, 100):
        for threads in ("1", "2"):
            monkeypatch.setattr(Table, "ARROW_CHUNK", chunk)
            monkeypatch.setenv("FNSYSID_THREADS", threads)
            part = tmp_path / f"chunk{chunk}_{threads}.csv"
            table.to_csv(part)
            assert part.read_bytes() == whole.read_bytes(), (chunk, threads)


def test_rows_and_unequal_columns():
    t = Table({"round": [0, 1, 2, 2], "e": [1.0, 0.5, 0.2, 0.3]})
    last = t[t["round"] == t["round"].max()]
    assert len(last) == 2 and last["e"].tolist() == [0.2, 0.3]
    with pytest.raises(ValueError, match="unequal length"):
        Table({"a": [1, 2], "b": [1, 2, 3]})


@pytest.mark.parametrize("overrides", [
    ("M=6", "R=4", "repeats=2", "output.per_client=true"),
    ("strategy=local", "M=3", "R=3", "output.per_client=true"),
    ("M=4", "R=6", "lr=10"),                               # diverges: NaN in the tables
])
def test_every_table_of_a_run_reads_back_as_its_frame(tmp_path, overrides):
    """Each CSV of a run read with pandas is the run's DataFrame (same columns, types and
    values, NaN where NaN), and the same config writes the same bytes again."""
    from fnsysid.results.files import write_run

    cfg = compose_cfg(*overrides, "output.plot=false")
    result = execute(cfg, choices={})
    assert set(result.tables) >= {"errors", "theory"}
    for name in result.tables:
        table = result.tables.table(name)
        assert isinstance(table, Table)
        pd.testing.assert_frame_equal(_read_back(table, tmp_path / f"{name}.csv"),
                                      result.tables[name])
    if "lr=10" in overrides:
        assert result.errors["nrmse_sim_max"].isna().any()
    errors = result.errors
    assert errors[["repeat", "round"]].equals(
        errors[["repeat", "round"]].sort_values(["repeat", "round"], ignore_index=True))
    write_run(tmp_path / "a", cfg, result.tables, None)
    write_run(tmp_path / "b", cfg, execute(cfg, choices={}).tables, None)
    for name in result.tables:
        csv = f"{name}.csv"
        assert (tmp_path / "a" / csv).read_bytes() == (tmp_path / "b" / csv).read_bytes()


@pytest.mark.slow
def test_a_run_does_not_import_pandas(tmp_path):
    """pandas costs ~0.3 s of start-up; a run writes its tables without it."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "run.py"), "M=3", "R=2",
         "output.plot=false", "progress=false", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "errors.csv").exists()
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "numpy" in imported and "pandas" not in imported and "tqdm" not in imported


def test_a_long_table_is_written_in_chunks_with_the_same_bytes(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    x[[3, 7, 8]] = np.nan
    tables = [Table({"round": np.arange(50), "error": x}),
              Table({"client": [f"c,{i}" for i in range(50)], "error": x})]
    whole = []
    for i, table in enumerate(tables):
        table.to_csv(tmp_path / f"{i}.csv")
        whole.append((tmp_path / f"{i}.csv").read_bytes())
    monkeypatch.setattr(Table, "CHUNK", 7)
    for i, table in enumerate(tables):
        table.to_csv(tmp_path / f"{i}.csv")
        assert (tmp_path / f"{i}.csv").read_bytes() == whole[i]
        assert len(pd.read_csv(tmp_path / f"{i}.csv")) == 50


def test_result_takes_dataframes_and_tables_alike(tmp_path):
    """``Result.tables`` reads as DataFrames; a Result built or replaced with DataFrames, as
    before tables were written without pandas, works the same."""
    import dataclasses

    from fnsysid.results.files import write_run

    result = execute(compose_cfg("M=3", "R=2", "output.plot=false"), choices={})
    assert isinstance(result.tables["errors"], pd.DataFrame)
    assert "errors" in repr(result.tables) and "rows" in repr(result.tables.table("errors"))
    frames = {name: result.tables[name] for name in result.tables}
    again = dataclasses.replace(result, tables=frames)
    assert again.errors is frames["errors"] and again.theory is frames["theory"]
    write_run(tmp_path / "a", result.settings.resolved, result.tables, None)
    write_run(tmp_path / "b", result.settings.resolved, again.tables, None)
    for name in frames:
        csv = f"{name}.csv"
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / csv),
                                      pd.read_csv(tmp_path / "b" / csv))


def test_theorem1_of_the_summary_is_null_when_a_repeat_has_none():
    """The summary's Theorem 1 terms are means over the repeats: a repeat where a term is
    undefined (e.g. a singular Gram matrix) makes the mean null, not the other repeats' mean."""
    cfg, model, *_ = make("M=3", "repeats=2")
    errors = Table({"repeat": [0, 1], "round": [0, 0],
                    **{k: [1.0, 1.0] for k in ("e_max", "e_mean", "nrmse_1step_max",
                                               "nrmse_1step_mean", "nrmse_sim_max",
                                               "nrmse_sim_mean")}})
    keys = ("bound_rel", "bound", "bound_proof_rel", "bound_proof", "noise_term", "sigma_w",
            "s_phi2", "b_phi", "eps", "N_tot")
    theory = Table({k: [2.0, 4.0] for k in keys})
    theory.columns["bound"] = np.array([0.5, np.nan])
    summary = make_summary(cfg, model, None, errors, theory, runtime={}, choices={})
    assert summary["theorem1"]["bound"] != summary["theorem1"]["bound"]      # NaN: null
    assert summary["theorem1"]["bound_rel"] == 3.0


def test_config_yaml_is_the_text_omegaconf_writes():
    """Strings that read as another type stay quoted; unicode, long and multi-line strings,
    special floats, lists and nesting come out as OmegaConf.to_yaml writes them, from the
    config or from its resolved settings alike."""
    from omegaconf import OmegaConf

    from fnsysid.config.checks import check_run
    from fnsysid.results.files import config_yaml

    tricky = {
        "a": "yes", "b": "1e3", "c": "null", "d": "\u00fc \u2211 \u6f22\u5b57", "e": "x " * 60,
        "f": "line1\nline2", "g": "", "h": ":", "i": "- x", "j": [1, 2.5, None, True, "1"],
        "k": {"l": float("nan"), "m": float("inf"), "n": -0.0, "o": 1e-300},
        "p": "'quoted'", "q": "#c", "r": "a: b", "s": "  lead", "t": "trail ", "v": "~",
        "w": "0x1F", "x": "012", "y": "on", "z": {}, "esc": "\\${a}",
        "path": "/tmp/dat_\U0001F600_" + "longsegment" * 8, "tab": "a\tb " * 30,
        "nel": "x\x85y"}
    assert config_yaml(tricky) == OmegaConf.to_yaml(OmegaConf.create(tricky))
    assert "a: 'yes'" in config_yaml(tricky) and "x: '012'" in config_yaml(tricky)
    assert OmegaConf.create(config_yaml(tricky))["esc"] == "${a}"     # escaped, not resolved
    for cfg in (compose_cfg("M=3"), compose_cfg("system=quadrotor", "strategy=fedprox")):
        assert config_yaml(check_run(cfg).resolved) == OmegaConf.to_yaml(cfg, resolve=True)


def test_the_checked_settings_serve_the_build_the_data_key_and_config_yaml(tmp_path):
    """The settings check_run returns hold what each reader converted for itself before:
    ``to_container(cfg, resolve=True)`` (interpolations resolved) gives the same group
    objects, simulation key and config.yaml; the settings are read-only, and a run leaves
    them unchanged."""
    import copy
    import pickle

    from omegaconf import OmegaConf
    from pydantic import ValidationError

    from fnsysid.app.build import build
    from fnsysid.config.checks import check_run
    from fnsysid.config.schema import settings_from
    from fnsysid.data.source import _simulation_key
    from fnsysid.results.files import config_yaml

    def state(objs):
        return [(type(o), pickle.dumps(vars(o))) for o in objs]

    for overrides in (("M=3", "R=2", "lr=0.02"), ("system=quadrotor", "strategy=fedprox"),
                      ("system=linear", "feature_map=polynomial", "optimizer=sgd")):
        cfg = compose_cfg(*overrides)
        settings = check_run(cfg)
        plain = OmegaConf.to_container(cfg, resolve=True)
        assert settings.resolved == plain
        assert settings.optimizer.reduction == cfg.system.solver.reduction   # resolved
        kept = copy.deepcopy(settings.resolved)
        built = build(settings)
        assert state(built) == state(build(cfg))
        again = settings_from(plain)
        assert _simulation_key(settings, built[1]) == _simulation_key(again, built[1])
        assert config_yaml(settings.resolved) == OmegaConf.to_yaml(cfg, resolve=True)
        assert settings.resolved == kept                        # read, not changed
        with pytest.raises(ValidationError):
            settings.M = 4                                      # read-only

    cfg = compose_cfg("M=3", "R=2", "output.plot=false")
    result = execute(cfg, choices={})
    assert result.settings.resolved == OmegaConf.to_container(cfg, resolve=True)
    run_experiment(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "config.yaml").read_text() == OmegaConf.to_yaml(cfg, resolve=True)
