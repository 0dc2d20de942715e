"""Sweeps as tables and figures: results.csv at the sweep root, the plot grid, stored sweeps."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.plot_cli import main as plot_main
from fnsysid.results.sweep import declared_keys, find_sweep, read_sweep, results_table
from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["progress=false", "output.plot=false", "hydra.launcher.n_jobs=1"]


def run(*args: str, cwd: Path = ROOT):
    """The command line, in this process (the jobs one after another: n_jobs=1)."""
    res = cli_in_process(*args, cwd=cwd)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


@pytest.fixture(scope="module")
def two_key_sweep(tmp_path_factory) -> Path:
    """M x eps sweep, 2 x 2 jobs, 3 rounds, 2 repeats; constant overrides R, repeats, ..."""
    sweep = tmp_path_factory.mktemp("sweep")
    run("-m", "system=synthetic", "M=1,4", "eps=0,0.1", "R=3", "repeats=2", *QUIET,
        f"hydra.sweep.dir={sweep}")
    return sweep


@pytest.mark.slow
def test_multirun_one_job_per_value_and_the_script_wraps_the_command(two_key_sweep, capsys,
                                                                    monkeypatch):
    jobs = sorted(p.name for p in two_key_sweep.iterdir() if p.is_dir())
    assert jobs == [f"M={m},R=3,eps={e},repeats=2,system=synthetic"
                    for m in (1, 4) for e in ("0", "0.1")]
    script = ROOT / "scripts" / "plot_sweep.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(script), run_name="__main__")
    assert info.value.code == 0 and "usage: fnsysid-plot" in capsys.readouterr().out


def test_results_csv_one_row_per_job_and_round_one_column_per_swept_key(two_key_sweep):
    table = pd.read_csv(two_key_sweep / "results.csv")
    assert list(table.columns[:6]) == ["job", "M", "eps", "status", "repeats_diverged", "round"]
    assert (table["repeats_diverged"] == 0).all()
    for unswept in ("R", "repeats", "system", "progress", "output.plot"):
        assert unswept not in table.columns
    assert len(table) == 4 * 4                                   # 4 jobs x rounds 0..3
    assert sorted(set(zip(table["M"], table["eps"], strict=True))) == [
        (1, 0.0), (1, 0.1), (4, 0.0), (4, 0.1)]
    assert table["M"].dtype == np.int64 and table["eps"].dtype == np.float64
    assert table.groupby("job")["final"].sum().eq(1).all()
    assert (table.loc[table["final"], "round"] == 3).all()
    # each row is the mean (and spread) over repeats of that job's errors.csv
    row = table[(table["M"] == 4) & (table["eps"] == 0.1) & (table["round"] == 2)].iloc[0]
    errors = pd.read_csv(two_key_sweep / row["job"] / "errors.csv")
    at = errors[errors["round"] == 2]["e_max"]
    assert row["e_max"] == pytest.approx(at.mean(), rel=1e-5)
    assert row["e_max_lo"] == pytest.approx(at.min(), rel=1e-5)
    assert row["e_max_hi"] == pytest.approx(at.max(), rel=1e-5)
    assert row["e_max_se"] == pytest.approx(at.std(ddof=1) / np.sqrt(2), rel=1e-4)
    assert row["n_repeats"] == 2 and row["status"] == "ok"


def test_declared_keys_come_from_the_sweep_not_from_constant_overrides(two_key_sweep):
    assert declared_keys(two_key_sweep) == ["M", "eps"]
    table = results_table(two_key_sweep)
    assert table.equals(results_table(two_key_sweep))          # deterministic order
    assert table[["M", "eps"]].drop_duplicates().values.tolist() == [
        [1, 0.0], [1, 0.1], [4, 0.0], [4, 0.1]]


@pytest.mark.slow
def test_plot_grid_one_panel_per_value_curves_labelled_by_swept_keys_only(two_key_sweep,
                                                                           tmp_path, capsys):
    out = tmp_path / "grid.png"
    assert plot_main([str(two_key_sweep), "--out", str(out)]) == 0
    table = pd.read_csv(out.with_suffix(".csv"))
    assert table["panel"].tolist() == ["M=1", "M=1", "M=4", "M=4"]
    assert table["curve"].tolist() == ["eps=0", "eps=0.1"] * 2
    labels = " ".join(table["panel"].tolist() + table["curve"].tolist())
    for unswept in ("R=", "repeats=", "system=", "progress", "output.plot"):
        assert unswept not in labels
    assert out.exists() and out.with_suffix(".pdf").exists()
    assert plot_main([str(two_key_sweep), "--out", str(out), "--panels", "eps"]) == 0
    table = pd.read_csv(out.with_suffix(".csv"))
    assert table["panel"].tolist() == ["eps=0", "eps=0", "eps=0.1", "eps=0.1"]
    assert table["curve"].tolist() == ["M=1", "M=4"] * 2
    jobs = read_sweep(two_key_sweep)
    final = {(j["overrides"]["M"], j["overrides"]["eps"]): j["summary"]["final_e_max_mean"]
             for j in jobs}
    assert table["final_e_max_mean"].tolist() == pytest.approx(
        [final["1", "0"], final["4", "0"], final["1", "0.1"], final["4", "0.1"]])


@pytest.mark.slow
def test_heat_map_of_the_final_error(two_key_sweep, tmp_path, capsys):
    out = tmp_path / "heat.png"
    assert plot_main([str(two_key_sweep), "--out", str(out), "--heatmap"]) == 0
    table = pd.read_csv(out.with_suffix(".csv"))
    assert len(table) == 4 and out.exists()
    assert plot_main([str(two_key_sweep), "--panels", "K"]) == 2
    assert capsys.readouterr().err.strip() == ("fnsysid-plot: error: --panels K: not a swept "
                                               "key; allowed: M, eps")
    from fnsysid.results.plotting.sweep_plots import sweep_heatmap

    with pytest.raises(ValueError, match=r"^--heatmap needs exactly two swept keys; this "
                                         r"folder sweeps 1 \(M\); allowed: a sweep of two"):
        sweep_heatmap([], ["M"], [out])


@pytest.mark.slow
def test_stored_sweep_holds_only_its_own_jobs(tmp_path):
    """A rerun of a stored experiment, with or without extra overrides, gets its own folder."""
    run("experiment=synthetic_gd_M", "R=2", "repeats=1", *QUIET, cwd=tmp_path)
    run("experiment=synthetic_gd_M", "M=3", "R=2", "repeats=1", *QUIET, cwd=tmp_path)
    stored = tmp_path / "outputs" / "sweeps" / "synthetic_gd_M"
    first, second = sorted(p for p in stored.iterdir())
    assert sorted(j["overrides"]["M"] for j in read_sweep(first)) == ["1", "100", "2", "25", "5"]
    assert [j["overrides"]["M"] for j in read_sweep(second)] == ["3"]
    assert pd.read_csv(first / "results.csv")["M"].unique().tolist() == [1, 2, 5, 25, 100]
    assert "M" not in pd.read_csv(second / "results.csv").columns    # one job: nothing swept
    assert find_sweep(stored) == second                                 # newest is plotted


@pytest.mark.slow
def test_figure_panels_filter_jobs_share_one_legend_and_label_only_varying_keys(two_key_sweep,
                                                                                tmp_path):
    from fnsysid.results.plotting.paper_panels import figure

    panels = [{"dir": two_key_sweep, "where": {"eps": 0}, "title": "eps 0", "xmax": "auto"},
              {"dir": two_key_sweep, "where": {"eps": "0.1"}, "title": "eps 0.1"}]
    table = figure(panels, tmp_path / "fig", suptitle="two panels", ncols=1)
    assert table["panel"].tolist() == ["eps 0", "eps 0", "eps 0.1", "eps 0.1"]
    assert table["curve"].tolist() == ["M=1", "M=4"] * 2          # eps fixed by `where`
    assert table["M"].tolist() == [1, 4, 1, 4] and "eps" not in table.columns
    assert (table["n_repeats"] == 2).all() and (table["R"] == 3).all()
    assert (tmp_path / "fig.png").stat().st_size > 5000 and (tmp_path / "fig.pdf").exists()


def fake_sweep(root: Path, jobs: dict[str, tuple[int, int, list[str]]]) -> Path:
    """A sweep folder of finished jobs: name -> (repeats, rounds, error columns), swept M."""
    rng = np.random.default_rng(0)
    for i, (name, (repeats, rounds, metrics)) in enumerate(jobs.items()):
        job = root / name
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- M={i + 1}\n- R={rounds}\n")
        rows = [{"repeat": s, "round": r, **{m: rng.random() / 3 for m in metrics}}
                for s in range(repeats) for r in range(rounds + 1)]
        pd.DataFrame(rows).to_csv(job / "errors.csv", index=False)
        (job / "summary.json").write_text(
            f'{{"status": "ok", "rounds_completed": {rounds}, "repeats": {repeats}}}')
    return root


@pytest.mark.parametrize("jobs", [
    {"a": (2, 3, ["e_max", "e_mean"]), "b": (1, 3, ["e_max", "e_mean"]),
     "c": (3, 5, ["e_max", "e_mean"])},                          # one job without a spread
    {"a": (2, 3, ["e_max"]), "b": (2, 2, ["e_max", "nrmse"])},   # columns differ
])
def test_results_of_all_jobs_at_once_are_those_of_one_job_at_a_time(tmp_path, monkeypatch,
                                                                      jobs):
    import fnsysid.results.sweep as sweep

    root = fake_sweep(tmp_path, jobs)
    at_once = results_table(root)
    monkeypatch.setattr(sweep, "_rows_at_once", lambda jobs, heads: None)
    one_by_one = results_table(root)
    assert at_once.to_csv(float_format="%.6g") == one_by_one.to_csv(float_format="%.6g")
    assert at_once.equals(one_by_one) and list(at_once.dtypes) == list(one_by_one.dtypes)
    assert len(at_once) == sum(r + 1 for _, r, _ in jobs.values())
    b = at_once[at_once["job"] == "b"]
    assert b["final"].sum() == 1 and b["round"].max() == jobs["b"][1]
    if jobs["b"][0] == 1:
        assert b["e_max_se"].isna().all() and at_once.loc[at_once["job"] == "a",
                                                          "e_max_se"].notna().all()


@pytest.mark.slow
def test_each_view_has_its_own_default_file_and_overwrite_removes_them(two_key_sweep,
                                                                         tmp_path, capsys):
    import shutil

    from fnsysid.results.folder import earlier_items

    sweep = tmp_path / "copy"
    shutil.copytree(two_key_sweep, sweep)
    views = {"sweep": [], "sweep_heatmap": ["--heatmap"], "sweep_panels-eps": ["--panels", "eps"],
             "sweep_e_mean": ["--metric", "e_mean"]}
    for args in views.values():
        assert plot_main([str(sweep), *args]) == 0
    written = {p.name for p in sweep.iterdir() if p.is_file() and p.name.startswith("sweep")}
    assert written == {f"{v}{s}" for v in views for s in (".png", ".pdf", ".csv")}
    grid = pd.read_csv(sweep / "sweep.csv")                 # the first view, not overwritten
    assert grid["panel"].tolist() == ["M=1", "M=1", "M=4", "M=4"]
    assert pd.read_csv(sweep / "sweep_panels-eps.csv")["panel"].tolist() == [
        "eps=0", "eps=0", "eps=0.1", "eps=0.1"]
    assert "final_e_mean_mean" in pd.read_csv(sweep / "sweep_e_mean.csv").columns
    assert "wrote " + str(sweep / "sweep_e_mean.png") in capsys.readouterr().out
    removed = {p.name for p in earlier_items(sweep)}       # output.overwrite=true clears all
    assert written <= removed


@pytest.mark.slow
def test_a_sweep_without_ground_truth_draws_the_held_out_nrmse(two_key_sweep, tmp_path,
                                                                capsys):
    import shutil

    sweep = tmp_path / "no_truth"
    shutil.copytree(two_key_sweep, sweep)
    for f in sweep.glob("*/errors.csv"):                   # as data without a truth file
        pd.read_csv(f).assign(e_max=np.nan, e_mean=np.nan).to_csv(f, index=False)
    assert plot_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fnsysid-plot: no e_max (no ground truth): drawing nrmse_1step_mean "
                          "(--metric chooses)")
    table = pd.read_csv(sweep / "sweep.csv")
    assert table["final_nrmse_1step_mean_mean"].notna().all()
    assert plot_main([str(sweep), "--metric", "e_max"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fnsysid-plot: error: --metric e_max: no values in the sweep's errors.csv (e_* need "
        "ground truth: data.truth or simulated data); allowed: nrmse_1step_max, "
        "nrmse_1step_mean, nrmse_sim_max, nrmse_sim_mean")
    # the free run is evaluated at some rounds only: drawn at those, each marked
    assert plot_main([str(sweep), "--metric", "nrmse_sim_mean"]) == 0
    assert pd.read_csv(sweep / "sweep_nrmse_sim_mean.csv")[
        "final_nrmse_sim_mean_mean"].notna().all()


def test_a_job_whose_every_repeat_diverged_keeps_its_rows_in_the_table():
    """Every repeat diverged (repeat 0 at round 2, repeat 1 at round 3): its rows up to each
    one's divergence stay, its blank rows after go (the job disappeared from results.csv)."""
    from fnsysid.results.sweep import kept_errors, table_errors

    nan = np.nan
    err = pd.DataFrame({"repeat": [0, 0, 0, 0, 1, 1, 1, 1], "round": [0, 1, 2, 3] * 2,
                        "e_max": [0.5, 9.0, nan, nan, 0.5, 1.0, 4.0, nan],
                        "bytes_per_client": [0.0, 240.0, nan, nan, 0.0, 240.0, 240.0, nan]})
    job = {"summary": {"repeat_status": ["diverged", "diverged"]}, "errors": err}
    kept = table_errors(job)
    assert kept[["repeat", "round"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]]
    assert kept_errors(job).empty                                  # the figures draw nothing
    one = {"summary": {"repeat_status": ["diverged", "ok"]}, "errors": err}
    assert table_errors(one)["repeat"].unique().tolist() == [1]    # the diverged left out
