"""Result tables are written without pandas, byte for byte as pandas writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import execute, run_experiment
from fnsysid.results.tables import Table, _csv_field, make_summary
from tests.conftest import compose_cfg, make

ROOT = Path(__file__).resolve().parents[1]


def _same_csv(table: Table, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
    table.to_csv(ours, index=False)
    table.to_frame().to_csv(theirs, index=False)
    assert ours.read_bytes() == theirs.read_bytes()


def test_edge_values_are_written_as_pandas_writes_them(tmp_path):
    f = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-300, 1e16, 0.1 + 0.2, 123456789.125,
                  1e-5, 5e-324])
    n = len(f)
    table = Table({"repeat": np.arange(n), "x": f, "f32": f.astype(np.float32),
                   "label": ['a,b', 'say "hi"', "", "line\nbreak", "server", "mean", "0", "A",
                             "ü", "x y"],
                   "flag": np.arange(n) % 2 == 0, "delta": 0.05, "n_x": 2})
    assert table["delta"].shape == (n,) and table["n_x"].dtype.kind == "i"
    _same_csv(table, tmp_path)
    text = (tmp_path / "ours.csv").read_text()
    assert text.splitlines()[1].startswith("0,,") and '"a,b"' in text and "1e+16" in text
    numbers = Table({k: table[k] for k in ("repeat", "x", "f32", "flag", "delta")})
    _same_csv(numbers, tmp_path)                             # the unquoted fast path
    assert (tmp_path / "ours.csv").read_text().splitlines()[2] == "1,inf,inf,False,0.05"
    _same_csv(Table({"x": f}), tmp_path)                     # a lone empty field is quoted
    assert (tmp_path / "ours.csv").read_text().splitlines()[1] == '""'


def test_floats_are_written_in_numpys_shortest_form():
    bits = np.random.default_rng(0).integers(0, 2**63, size=200_000, dtype=np.int64)
    x = bits.view(np.float64)
    x = np.concatenate([x[np.isfinite(x)], np.random.default_rng(1).normal(size=1000) * 1e-7])
    assert _csv_field(x) == x.astype(str).tolist()


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
def test_every_table_of_a_run_is_written_as_pandas_writes_it(tmp_path, overrides):
    result = execute(compose_cfg(*overrides, "output.plot=false"), choices={})
    assert set(result.tables) >= {"errors", "theory"}
    for name in result.tables:
        table = result.tables.table(name)
        assert isinstance(table, Table)
        _same_csv(table, tmp_path)
        pd.testing.assert_frame_equal(result.tables[name], table.to_frame())
    errors = result.errors
    assert errors[["repeat", "round"]].equals(
        errors[["repeat", "round"]].sort_values(["repeat", "round"], ignore_index=True))


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
    monkeypatch.setattr(Table, "CHUNK", 7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    x[[3, 7, 8]] = np.nan
    _same_csv(Table({"round": np.arange(50), "error": x}), tmp_path)
    _same_csv(Table({"client": [f"c{i}" for i in range(50)], "error": x}), tmp_path)


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
        assert (tmp_path / "a" / csv).read_bytes() == (tmp_path / "b" / csv).read_bytes()


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


def test_counts_and_repeated_columns_are_written_as_pandas_writes_them(tmp_path):
    """Small counts (strings from a table), other integers, and float columns equal to an
    earlier one (strings reused) only where they are equal bit for bit (-0.0 is not 0.0)."""
    n = 200
    rng = np.random.default_rng(3)
    e = rng.normal(size=n)
    e[::7] = np.nan
    zeros = np.zeros(n)
    table = Table({"repeat": np.repeat(np.arange(2), n // 2), "round": np.arange(n) % 100,
                   "last": np.full(n, n - 1), "big": np.full(n, n), "neg": -np.arange(n),
                   "u": np.arange(n, dtype=np.uint8), "e_max": e, "e_mean": e.copy(),
                   "f32": e.astype(np.float32), "zero": zeros, "minus_zero": -zeros})
    _same_csv(table, tmp_path)
    lines = (tmp_path / "ours.csv").read_text().splitlines()
    assert lines[1].split(",")[:5] == ["0", "0", "199", "200", "0"]
    assert lines[-1].split(",")[:5] == ["1", "99", "199", "200", "-199"]
    assert lines[1].endswith(",0.0,-0.0")
    assert _csv_field(np.arange(n)[::-1]) == [str(i) for i in range(n)][::-1]


def test_config_yaml_is_the_text_omegaconf_writes():
    """Strings that read as another type stay quoted; unicode, long and multi-line strings,
    special floats, lists and nesting come out as OmegaConf.to_yaml writes them."""
    from omegaconf import OmegaConf

    from fnsysid.config.checks import check_run
    from fnsysid.results.files import config_yaml

    tricky = {
        "a": "yes", "b": "1e3", "c": "null", "d": "\u00fc \u2211 \u6f22\u5b57", "e": "x " * 60,
        "f": "line1\nline2", "g": "", "h": ":", "i": "- x", "j": [1, 2.5, None, True, "1"],
        "k": {"l": float("nan"), "m": float("inf"), "n": -0.0, "o": 1e-300},
        "p": "'quoted'", "q": "#c", "r": "a: b", "s": "  lead", "t": "trail ", "v": "~",
        "w": "0x1F", "x": "012", "y": "on", "z": {}}
    assert config_yaml(tricky) == OmegaConf.to_yaml(OmegaConf.create(tricky))
    assert "a: 'yes'" in config_yaml(tricky) and "x: '012'" in config_yaml(tricky)
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


def test_a_frame_as_a_table_writes_what_pandas_writes(tmp_path):
    """results.csv's way: a DataFrame's numbers, booleans, strings and mixed Python objects
    (quoted where the csv module quotes, missing values empty) and a float format, byte for
    byte as ``DataFrame.to_csv``; None for a column type a Table does not write."""
    n = 12
    f = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-300, 1e16, 0.1 + 0.2, 123456789.125,
                  1e-5, 5e-324, 2.5, 1.0])
    mixed = [1, 2.5, "a,b", None, 'say "hi"', "line\nbreak", np.float64(0.1), True, "",
             float("nan"), -3, "x"]
    frame = pd.DataFrame({
        "job": [f"M={i}" for i in range(n)], "M": np.arange(n) * 10, "f": f,
        "f32": f.astype(np.float32), "final": np.arange(n) % 3 == 0, "mixed": mixed,
        "status": pd.array(["ok", None] * (n // 2), dtype="str"), "lr": f[::-1].copy()})
    for fmt in (None, "%.6g", "%.3e"):
        ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
        Table.from_frame(frame).to_csv(ours, index=False, float_format=fmt)
        frame.to_csv(theirs, index=False, float_format=fmt)
        assert ours.read_bytes() == theirs.read_bytes(), fmt
    text = ours.read_text()
    assert text.splitlines()[1] == "M=0,0,,,True,1,ok,1.000e+00"
    assert '"a,b"' in text and '"say ""hi"""' in text and "1.000e-300" in text
    for single in (pd.DataFrame({"s": ["", "a"]}), frame.iloc[:0]):
        Table.from_frame(single).to_csv(ours, index=False)
        single.to_csv(theirs, index=False)
        assert ours.read_bytes() == theirs.read_bytes()
    assert Table.from_frame(pd.DataFrame({"t": pd.to_datetime(["2024-01-01"])})) is None
    assert Table.from_frame(pd.DataFrame({0: [1.0]})) is None


def test_repeated_values_are_formatted_once_and_written_as_pandas_writes_them(tmp_path):
    """Columns whose values repeat (a model that stopped changing, identical clients) take
    each distinct value's string once: the bytes stay pandas', -0.0 apart from 0.0."""
    rng = np.random.default_rng(5)
    pool = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-5, 0.1 + 0.2, 123456.789, 5e-324])
    a = pool[rng.integers(0, len(pool), 300)]
    frame = pd.DataFrame({"round": np.arange(300), "e": a, "e32": a.astype(np.float32),
                          "half": np.where(np.arange(300) < 150, a, rng.normal(size=300))})
    for fmt in (None, "%.6g"):
        ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
        Table.from_frame(frame).to_csv(ours, index=False, float_format=fmt)
        frame.to_csv(theirs, index=False, float_format=fmt)
        assert ours.read_bytes() == theirs.read_bytes(), fmt
    fields = _csv_field(a)
    assert {fields[i] for i in np.flatnonzero(np.signbit(a) & (a == 0))} == {"-0.0"}
    assert {fields[i] for i in np.flatnonzero(~np.signbit(a) & (a == 0))} == {"0.0"}
