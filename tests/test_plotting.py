"""Saving figures: the layout runs once and every file is rendered from it; figures are drawn
outside pyplot."""

import numpy as np
import pandas as pd
import pytest

from fnsysid.results.plotting.style import new_figure, save
from fnsysid.results.plotting.sweep_plots import plot_sweep
from tests.conftest import cli_in_process

#: sweeps run in this process, their jobs one after another (the launcher is not under test)
QUIET = ["output.plot=false", "progress=false", "hydra.launcher.n_jobs=1"]


def _figure():
    fig = new_figure(figsize=(6, 3), layout="constrained")
    axes = fig.subplots(1, 2)
    r = np.arange(50)
    for ax in axes:
        ax.plot(r, 0.9 ** r + 1e-3, label="a long legend entry")
        ax.set_yscale("log")
        ax.set_title("a title\nof two lines", fontsize=9)
        ax.set_xlabel("communication round $r$")
    fig.suptitle("a figure title")
    return fig


@pytest.mark.slow
def test_save_writes_the_png_savefig_writes_and_a_pdf_without_creation_date(tmp_path):
    ref = _figure()
    ref.savefig(tmp_path / "ref.png", dpi=110)
    fig = _figure()
    save(fig, [tmp_path / "fig.png", tmp_path / "fig.pdf"], dpi=110)
    assert (tmp_path / "fig.png").read_bytes() == (tmp_path / "ref.png").read_bytes()
    pdf = (tmp_path / "fig.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf


@pytest.mark.slow
def test_save_lays_the_figure_out_once(tmp_path, monkeypatch):
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    calls = []
    run = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute",
                        lambda self, fig: calls.append(fig) or run(self, fig))
    save(_figure(), [tmp_path / "a.png", tmp_path / "a.pdf"], dpi=110)
    assert len(calls) == 1
    ref = _figure()
    ref.savefig(tmp_path / "b.png", dpi=110)
    assert len(calls) == 2                              # savefig lays out for each file


@pytest.fixture(scope="module")
def lr_strategy_sweep(tmp_path_factory):
    """lr x strategy, 2 x 2 jobs; lr=0.05 diverges with either strategy."""
    sweep = tmp_path_factory.mktemp("lr_strategy") / "sweep"
    res = cli_in_process("-m", "system=synthetic", "M=2", "R=20", "repeats=1", "lr=0.002,0.05",
                         "strategy=fedavg,fedprox", *QUIET, f"hydra.sweep.dir={sweep}")
    assert res.returncode == 3, res.stderr
    return sweep


@pytest.mark.slow
def test_a_diverged_job_is_named_in_the_legend_and_the_table_not_drawn(tmp_path):
    """A figure of a sweep where one job diverged: curves, final error against the knob and
    the quadrotor-style parameter panel each list it (red x, 'diverged at r=..; not drawn')
    and draw only the finished jobs."""
    from fnsysid.results.plotting.paper_panels import figure

    sweep = tmp_path / "sweep"
    res = cli_in_process("-m", "system=synthetic", "M=2", "R=30", "repeats=1",
                         "lr=0.001,0.002,0.05", *QUIET, f"hydra.sweep.dir={sweep}")
    assert res.returncode == 3, res.stderr               # the sweep reports the diverged job
    panels = [{"dir": sweep, "title": "curves", "where": {}},
              {"dir": sweep, "title": "final", "x": "lr", "fit": False, "where": {}},
              {"dir": sweep, "title": "params", "x": "lr", "params": True, "where": {}}]
    captured = {}
    real_save = save

    def keep(fig, paths, dpi):
        captured["legends"] = [[t.get_text() for t in ax.get_legend().get_texts()]
                               for ax in fig.axes if ax.get_legend() is not None]
        captured["lines"] = [len([ln for ln in ax.get_lines() if len(ln.get_xdata())])
                             for ax in fig.axes]
        real_save(fig, paths, dpi)

    import fnsysid.results.plotting.paper_panels as plotting
    plotting.save, old = keep, plotting.save
    try:
        table = figure(panels, tmp_path / "fig")
    finally:
        plotting.save = old
    diverged = [t for legend in captured["legends"] for t in legend if "diverged" in t]
    assert len(diverged) == 3 and all(t.startswith("lr = 0.05 (diverged at r=") and t.endswith(
        "; not drawn)") for t in diverged)
    assert captured["lines"][0] == 2                     # two finished curves, none for 0.05
    assert set(table.loc[table["status"] == "diverged", "panel"]) == {"curves", "final",
                                                                      "params"}
    final = table[(table["panel"] == "final") & (table["status"] != "diverged")]
    assert sorted(final["lr"]) == [0.001, 0.002]


@pytest.mark.slow
def test_one_legend_for_several_panels_names_the_jobs_not_drawn_in_each(tmp_path,
                                                                       lr_strategy_sweep):
    """plot_sweep.py's grid (one panel per lr, one legend for the figure): a job that diverged
    in the second panel is named with its panel, beside the curves of the first."""
    import fnsysid.results.plotting.sweep_plots as plotting
    from fnsysid.results.sweep import read_sweep

    sweep = lr_strategy_sweep
    captured = {}
    real_save = plotting.save

    def keep(fig, paths, dpi):
        captured["labels"] = [t.get_text() for t in fig.legends[0].get_texts()]
        real_save(fig, paths, dpi)

    plotting.save, old = keep, plotting.save
    try:
        plotting.sweep_figure(read_sweep(sweep), ["lr", "strategy"], [tmp_path / "grid.png"],
                              panel_key="lr")
    finally:
        plotting.save = old
    labels = captured["labels"]
    assert labels[:2] == ["FedAvg", "FedProx"]
    gone = [t for t in labels if t.endswith("; not drawn)")]
    assert [t.split(" (")[0] for t in sorted(gone)] == ["lr = 0.05: FedAvg",
                                                       "lr = 0.05: FedProx"]
    assert all(" (diverged at r=" in t for t in gone)


@pytest.mark.slow
def test_heat_map_names_a_diverged_cell(tmp_path, lr_strategy_sweep):
    import fnsysid.results.plotting.sweep_plots as plotting
    from fnsysid.results.sweep import read_sweep

    sweep = lr_strategy_sweep
    captured = {}
    real_save = plotting.save

    def keep(fig, paths, dpi):
        captured["texts"] = [t.get_text() for t in fig.axes[0].texts]
        real_save(fig, paths, dpi)

    plotting.save, old = keep, plotting.save
    try:
        table = plotting.sweep_heatmap(read_sweep(sweep), ["lr", "strategy"],
                                       [tmp_path / "heat.png"])
    finally:
        plotting.save = old
    assert sum(t.startswith("diverged\nr=") for t in captured["texts"]) == 2
    assert len(captured["texts"]) == 4                  # two values, two diverged cells
    assert sorted(table.loc[table["status"] == "diverged", "strategy"]) == ["fedavg", "fedprox"]
    assert table.loc[table["status"] == "ok", "final_mean"].notna().all()


def _in_threads(n, target):
    """Run ``target(i)`` for i < n in n threads at once; the exceptions they raised."""
    import threading

    raised, start = [], threading.Barrier(n)

    def run(i):
        try:
            start.wait()
            target(i)
        except BaseException as exc:                    # noqa: BLE001 - reported below
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return raised


@pytest.mark.slow
def test_runs_in_threads_write_the_folders_a_sequential_run_writes(tmp_path):
    """fnsysid.run with plots in three threads at once: every folder complete, its tables and
    figures the bytes of the same run alone."""
    import fnsysid

    def overrides(i):
        return ["system=pendulum", "M=3", "R=10", "repeats=2", "progress=false", f"seed={i}"]

    files = ["clients.csv", "config.yaml", "equations.txt", "error.png", "errors.csv",
             "estimates.csv", "fit.png", "parameters.csv", "summary.json", "theory.csv"]
    raised = _in_threads(3, lambda i: fnsysid.run(overrides(i),
                                                  output_dir=tmp_path / f"thread{i}"))
    assert not raised, raised
    for i in range(3):
        alone, folder = tmp_path / f"alone{i}", tmp_path / f"thread{i}"
        fnsysid.run(overrides(i), output_dir=alone)
        assert sorted(p.name for p in folder.iterdir()) == files
        for name in ("errors.csv", "estimates.csv", "equations.txt", "error.png", "fit.png"):
            assert (folder / name).read_bytes() == (alone / name).read_bytes(), name


@pytest.mark.slow
def test_figures_drawn_in_threads_are_the_figures_drawn_alone(tmp_path):
    """plot_run (math text in the labels) from three threads, four figures each: the bytes of
    the same figure drawn alone. (make test-slow: in make test, the runs of
    test_runs_in_threads_write_the_folders_a_sequential_run_writes draw plot_run's figure,
    with math text in its label, in three threads and compare its bytes too.)"""
    from fnsysid.results.plotting.run_plots import plot_run

    rounds = np.arange(30)
    errors = pd.DataFrame({"repeat": np.repeat([0, 1], 30), "round": np.tile(rounds, 2),
                           "e_max": np.concatenate([0.9 ** rounds, 0.8 ** rounds]) + 1e-3,
                           "e_mean": np.concatenate([0.85 ** rounds, 0.7 ** rounds]) + 1e-3})
    plot_run(errors, tmp_path / "alone.png", title="$e_r$ in a title")
    raised = _in_threads(3, lambda i: [plot_run(errors, tmp_path / f"t{i}_{k}.png",
                                                title="$e_r$ in a title") for k in range(4)])
    assert not raised, raised
    alone = (tmp_path / "alone.png").read_bytes()
    assert all((tmp_path / f"t{i}_{k}.png").read_bytes() == alone
               for i in range(3) for k in range(4))


@pytest.mark.slow
def test_plotting_does_not_use_pyplot():
    """Drawing needs no pyplot (its figure registry and backend are process-wide state)."""
    import subprocess
    import sys

    code = ("import sys, tempfile, pathlib, pandas as pd\n"
            "from fnsysid.results.plotting.run_plots import plot_run\n"
            "e = pd.DataFrame({'repeat': [0, 0], 'round': [0, 1], 'e_max': [1.0, 0.5],"
            " 'e_mean': [1.0, 0.4]})\n"
            "plot_run(e, pathlib.Path(tempfile.mkdtemp()) / 'e.png', title='t')\n"
            "print('matplotlib.pyplot' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


@pytest.fixture(scope="module")
def method_sweeps(tmp_path_factory):
    """FedAvg and the one-shot LSE at M = 2 and 4 (R = 3), and FedAvg alone at R = 6."""
    root = tmp_path_factory.mktemp("methods")
    for name, args in (("a", ["strategy=fedavg,oneshot", "M=2,4", "R=3"]),
                       ("b", ["strategy=fedavg", "M=2", "R=6"])):
        res = cli_in_process("-m", "system=synthetic", "repeats=2", *args, *QUIET,
                             f"hydra.sweep.dir={root / name}")
        assert res.returncode == 0, res.stderr
    return root


def _drawn(panels, path, **kwargs):
    """figure() of ``panels``, returning (figure table, axes) as they were saved."""
    import fnsysid.results.plotting.paper_panels as plotting

    captured, real_save = {}, plotting.save

    def keep(fig, paths, dpi):
        captured["axes"] = [ax for ax in fig.axes if ax.get_visible()]
        captured["suptitle"] = fig.get_suptitle()
        real_save(fig, paths, dpi)

    plotting.save = keep
    try:
        table = plotting.figure(panels, path, **kwargs)
    finally:
        plotting.save = real_save
    return table, captured


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _colours(ax):
    """Colour of each labelled line of ``ax`` (proxy entries included), by label."""
    import matplotlib.colors as mcolors

    return {line.get_label(): mcolors.to_hex(line.get_color()) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


@pytest.mark.slow
def test_a_method_has_its_name_colour_and_style_in_every_figure(tmp_path, method_sweeps):
    """Curves over rounds and final errors against M (two figures): the legends name the
    methods (FedAvg, one-shot; not strategy=fedavg), FedAvg is blue and the one-shot LSE
    purple in both, the table keeps its labels (strategy=fedavg), no suptitle is drawn."""
    from fnsysid.results.plotting.style import METHODS

    sweep = method_sweeps / "a"
    curves, a = _drawn([{"dir": sweep, "title": "(a) curves", "where": {"M": "2"}}],
                       tmp_path / "curves")
    finals, b = _drawn([{"dir": sweep, "title": "(b) final", "x": "M", "where": {}}],
                       tmp_path / "finals")
    (ax_a,), (ax_b,) = a["axes"], b["axes"]
    assert _legend(ax_a) == ["FedAvg", "one-shot"]
    assert [t.split(" (slope")[0] for t in _legend(ax_b)] == ["FedAvg", "one-shot"]
    for colours in (_colours(ax_a), {k.split(" (slope")[0]: v
                                     for k, v in _colours(ax_b).items()}):
        assert colours["FedAvg"] == METHODS["fedavg"][1].lower() == "#0072b2"
        assert colours["one-shot"] == METHODS["oneshot"][1].lower()
    line = {ln.get_label(): ln for ln in ax_a.get_lines()}
    assert line["FedAvg"].get_linestyle() != line["one-shot"].get_linestyle()
    assert ax_a.get_title() == "(a) curves" and a["suptitle"] == ""
    assert sorted(curves["curve"]) == ["strategy=fedavg", "strategy=oneshot"]
    assert sorted(set(finals["series"])) == ["strategy=fedavg", "strategy=oneshot"]


@pytest.mark.slow
def test_panels_of_curves_share_the_round_axis(tmp_path, method_sweeps):
    """Two panels of curves run for R = 3 and R = 6: both drawn from round 0 to 6."""
    _, drawn = _drawn([{"dir": method_sweeps / "a", "title": "R=3", "where": {"M": "2"}},
                       {"dir": method_sweeps / "b", "title": "R=6", "where": {}}],
                      tmp_path / "shared")
    assert [ax.get_xlim() for ax in drawn["axes"]] == [(0.0, 6.0), (0.0, 6.0)]
    assert [ax.get_xscale() for ax in drawn["axes"]] == ["linear", "linear"]


@pytest.mark.slow
def test_the_bound_panel_names_what_it_plots(tmp_path, method_sweeps):
    """Theorem 1's panel: measured relative error and the two plug-in bounds, each named."""
    table, drawn = _drawn([{"dir": method_sweeps / "a", "title": "one-shot", "x": "M",
                            "bound": True, "where": {"strategy": "oneshot"}}],
                          tmp_path / "bound")
    (ax,) = drawn["axes"]
    labels = _legend(ax)
    assert labels[1:] == [r"measured $e_r = \max_i e_r^{(i)}$", "bound as stated (plug-in)",
                          "bound (corrected constants, plug-in)"]
    assert labels[0].startswith("final error") and ax.get_ylabel() == (
        "final relative error and bound")
    assert table["bound_proof_rel"].notna().all() and (table["bound_rel"] > 0).all()


@pytest.mark.slow
def test_error_png_draws_in_the_colour_of_the_run_s_method(tmp_path):
    import matplotlib.colors as mcolors

    import fnsysid.results.plotting.run_plots as plotting

    rounds = np.arange(5)
    errors = pd.DataFrame({"repeat": 0, "round": rounds, "e_max": 0.9 ** rounds,
                           "e_mean": 0.8 ** rounds})
    captured, real_save = {}, plotting.save

    def keep(fig, paths, dpi):
        captured["lines"] = {ln.get_label(): mcolors.to_hex(ln.get_color())
                             for ln in fig.axes[0].get_lines()}
        real_save(fig, paths, dpi)

    plotting.save = keep
    try:
        plotting.plot_run(errors, tmp_path / "e.png", title="t",
                          method=plotting.method_of({"_target_": "x.FedNova"}))
    finally:
        plotting.save = real_save
    assert captured["lines"] == {"FedNova: max over clients": "#d55e00",
                                 "FedNova: mean over clients": "#d55e00"}
    assert plotting.method_of({"_target_": "a.Centralized", "exact": True}) == (
        "centralized_exact")
    assert plotting.method_of({"_target_": "my.Strategy"}) is None


@pytest.mark.slow
def test_fit_png_of_a_short_held_out_trajectory_draws_a_long_one(tmp_path, monkeypatch):
    """T = 5 (6 held-out samples): fit.png draws 100 samples of the client's own system
    (one-step predictions of the fitted model follow them); errors.csv is that of a run
    without plots."""
    import fnsysid
    import fnsysid.results.plotting.run_plots as plotting

    drawn = {}
    monkeypatch.setattr(plotting, "plot_fit", lambda measured, step, sim, names, title, **kw:
                        drawn.update(measured=measured, step=step, title=title))
    base = {"system": "pendulum", "M": 3, "R": 5, "repeats": 1, "progress": False,
            "strategy": "centralized_exact"}
    res = fnsysid.run({**base, "output.plot": True}, output_dir=tmp_path / "run")
    assert drawn["measured"].shape == (100, 2) and drawn["step"].shape == (99, 2)
    assert drawn["title"] == ("client 0, held-out trajectory of 100 samples simulated for "
                              "this plot")
    err = drawn["step"] - drawn["measured"][1:]
    assert np.sqrt((err ** 2).mean(axis=0)).max() < 0.5 * drawn["measured"].std(axis=0).max()
    plain = fnsysid.run({**base, "output.plot": False}, output_dir=tmp_path / "plain")
    assert (tmp_path / "run" / "errors.csv").read_bytes() == (
        tmp_path / "plain" / "errors.csv").read_bytes()
    assert res.summary["status"] == plain.summary["status"] == "ok"


def _job(folder, strategy, status, e_max, est=None, repeat_status=None):
    """A finished job in memory: e_max (repeats, rounds) and, optionally, its final server
    models est (repeats, 2) written as estimates.csv."""
    folder.mkdir()
    S, R1 = e_max.shape
    errors = pd.DataFrame({"repeat": np.repeat(np.arange(S), R1),
                           "round": np.tile(np.arange(R1), S), "e_max": e_max.ravel()})
    if est is not None:
        pd.DataFrame({"repeat": np.repeat(np.arange(S), 2), "client": "server",
                      "parameter": np.tile(["a", "b"], S), "estimate": est.ravel()}
                     ).to_csv(folder / "estimates.csv", index=False)
    summary = {"status": status, "strategy": strategy, "diverged_round": 2,
               "repeat_status": repeat_status}
    return {"dir": folder, "overrides": {"strategy": strategy}, "summary": summary,
            "errors": errors}


def test_sweep_table_keeps_the_repeats_that_did_not_diverge_and_the_distance_to_pooled(
        tmp_path):
    pooled = _job(tmp_path / "p", "centralized_exact", "ok",
                  np.array([[1.0, 0.3, 0.3], [1.0, 0.2, 0.2], [1.0, 0.4, 0.4]]),
                  est=np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]))
    fedavg = _job(tmp_path / "a", "fedavg", "ok",
                  np.array([[1.0, 0.5, 0.35], [1.0, 0.5, 0.25], [1.0, 0.5, 0.45]]),
                  est=np.array([[3.0, 4.5], [1.1, 0.0], [0.0, 2.0]]))
    fedlin = _job(tmp_path / "l", "fedlin", "diverged",
                  np.array([[1.0, 9.0, np.nan], [1.0, 0.3, 0.2], [1.0, 0.5, 0.4]]),
                  repeat_status=["diverged", "ok", "ok"])
    ax = new_figure().subplots()
    rows = {r["strategy"]: r for r in plot_sweep([pooled, fedavg, fedlin], ax,
                                                 keys=["strategy"])}
    lin = rows["fedlin"]
    assert lin["status"] == "diverged" and lin["n_repeats"] == 2 and lin["repeats_diverged"] == 1
    assert lin["final_e_max_mean"] == pytest.approx(0.3)           # repeats 1 and 2 only
    assert lin["pooled_e_max_mean"] == pytest.approx(0.3)          # pooled on the same two
    assert "1 of 3 repeats diverged at r=2; not in the mean" in lin["curve"]
    assert "dist_to_pooled" not in lin                             # no final model written
    shown = "FedLin (1 of 3 repeats diverged at r=2; not in the mean)"   # the legend's name
    assert lin["curve"] == "strategy=fedlin" + shown[len("FedLin"):]         # the table's
    line = [ln for ln in ax.get_lines() if ln.get_label() == shown][0]
    np.testing.assert_allclose(line.get_ydata(), [1.0, 0.4, 0.3])  # the mean of the two
    avg = rows["fedavg"]
    assert avg["pooled_e_max_mean"] == pytest.approx(0.3) and avg["repeats_diverged"] == 0
    assert avg["dist_to_pooled"] == pytest.approx(np.mean([0.1, 0.1, 0.0]))   # 0.5/5, 0.1/1
    assert avg["dist_to_pooled_max"] == pytest.approx(0.1) and rows[
        "centralized_exact"]["dist_to_pooled"] == 0.0


def test_a_curve_of_a_metric_evaluated_at_some_rounds_is_drawn_at_those_with_markers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fnsysid.results.plotting.style import draw_curve

    rounds = np.arange(51)
    errors = pd.DataFrame({"repeat": 0, "round": rounds,
                           "nrmse_sim_mean": np.where(rounds % 25 == 0, 1.0 / (1 + rounds),
                                                      np.nan)})
    fig, ax = plt.subplots()
    line = draw_curve(ax, errors, "run", "nrmse_sim_mean")
    np.testing.assert_array_equal(line.get_xdata(), [0, 25, 50])
    assert line.get_marker() == "o"
    plt.close(fig)
