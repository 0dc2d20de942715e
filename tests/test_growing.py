"""A finished run whose error ends far above its start is ``growing``, not ``ok``: the rule on
made-up tables, a run at the edge of stability (exit 3, a warning, its plot marked), a sweep
with such a job (exit 3, named; not drawn in the sweep's figure)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fnsysid.results.history import GROWTH_FACTOR, growth
from tests.conftest import cli_in_process

#: pendulum at lr 1.9 (stable up to about 1.7 for these draws): the error grows without
#: reaching the divergence limit (1000 times its start) within 20 rounds
EDGE = ["system=pendulum", "lr=1.9", "M=2", "repeats=1", "R=20", "progress=false"]


def _errors(e_max, nrmse=None, repeats=1):
    """errors.csv of ``repeats`` repeats with the rounds' e_max (a list per repeat)."""
    rows = []
    for s in range(repeats):
        e = e_max[s] if repeats > 1 else e_max
        n = nrmse[s] if nrmse is not None and repeats > 1 else nrmse
        for r, v in enumerate(e):
            rows.append({"repeat": s, "round": r, "e_max": v,
                         "nrmse_1step_max": np.nan if n is None else n[r]})
    return pd.DataFrame(rows)


def test_rule_compares_the_last_round_with_the_largest_start():
    assert GROWTH_FACTOR == 10
    assert growth(_errors([1.0, 0.5, 9.99])) is None
    g = growth(_errors([1.0, 0.5, 10.01]))
    assert g["metric"] == "e_max" and g["final"] == 10.01 and g["ratio"] == pytest.approx(10.01)
    # a start below 1 counts as 1: 0.01 -> 5 is not growing, 0.01 -> 11 is
    assert growth(_errors([0.01, 5.0])) is None
    assert growth(_errors([0.01, 11.0]))["ratio"] == pytest.approx(11.0)
    # the largest start over repeats; the repeat that grew most is named
    g = growth(_errors([[2.0, 1.0, 25.0], [1.0, 3.0, 30.0]], repeats=2))
    assert (g["start"], g["final"], g["repeat"]) == (2.0, 30.0, 1)
    assert growth(_errors([[2.0, 1.0, 19.0], [1.0, 3.0, 20.0]], repeats=2)) is None
    # a dip below the start and back is not growth (the running minimum is not the reference)
    assert growth(_errors([1.0, 0.001, 0.5])) is None


def test_an_error_still_rising_at_a_steady_rate_above_its_start_is_growing():
    # 1.32 -> 9.6 in 40 rounds, 1.05 times a round (FedAvg at lr 2.01 on a mass-spring
    # fleet): below 10 times its start, but on its way up
    nan = np.nan
    up = list(1.32 * 1.05 ** np.arange(41))
    g = growth(_errors([nan] * 41, nrmse=up))
    assert g["rule"] == "rising" and g["rate"] == pytest.approx(1.05)
    assert g["rounds"] == 9 and g["final"] == pytest.approx(up[-1])
    assert g["ratio"] == pytest.approx(up[-1] / 1.32)
    # settling at a level above the start (each rise smaller), rising too little in all,
    # below max(1, start), or one round down at the end: not growing
    assert growth(_errors(list(3 - 2.5 * 0.9 ** np.arange(41)))) is None
    assert growth(_errors(list(1.5 * 1.002 ** np.arange(41)))) is None
    assert growth(_errors(list(0.2 * 1.05 ** np.arange(30)))) is None       # ends at 0.82
    assert growth(_errors(up[:-1] + [up[-2] * 0.99])) is None
    # fallen far below its start and back up 1.08 times a round for 60 rounds (to 0.94,
    # below the start): 94 times its best round, and rising
    dip = list(np.linspace(1.0, 0.01, 20)) + list(0.01 * 1.08 ** np.arange(1, 61))
    assert growth(_errors(dip))["rule"] == "rising"
    assert growth(_errors(list(np.linspace(1.0, 0.01, 20)) + [0.011, 0.012, 0.013])) is None
    # the repeat that rose most is named, every one that rose listed; the limit rule still
    # comes first
    g = growth(_errors([list(np.full(41, 2.0)), up], repeats=2))
    assert g["repeat"] == 1 and g["rule"] == "rising" and g["repeats"] == [1]
    g = growth(_errors([[1.0] + [1.0] * 39 + [14.0], up], repeats=2))
    assert (g["rule"], g["repeat"], g["repeats"]) == ("limit", 0, [0, 1])
    # 1.1 times a round whose rounds zigzag (later half 0.87 of the earlier's per round:
    # a run at lr 0.026 went 0.52 -> 3.96 in 25 rounds beside "not growing")
    zig = np.exp(np.cumsum([0.1] * 19 + [0.12, 0.10, 0.10, 0.09, 0.095, 0.095]))
    g = growth(_errors(list(0.52 * np.concatenate([[1.0], zig]))))
    assert g["rule"] == "rising" and g["rounds"] == 6
    # strategy=local on compare_synthetic at R = 15 (repeat 0): 3 % a round, slowing down
    # toward the clients' own fits' error (1.5-1.9 at R = 300): not growing (the rule on the
    # slowdown alone called it growing and advised a smaller lr)
    local = [0.641, 0.634, 0.755, 0.863, 0.954, 1.02, 1.066, 1.099, 1.13, 1.167, 1.199, 1.238,
             1.289, 1.335, 1.376, 1.413]
    assert growth(_errors(local)) is None
    # slowing down too, but toward 20: on its way past the limit
    assert growth(_errors(list(20 - 19.5 * 0.97 ** np.arange(16))))["rule"] == "rising"
    assert growth(_errors([1.0, 0.5, 10.01]))["rule"] == "limit"


def test_a_run_that_ends_above_its_start_without_growing_is_warned_of():
    """``strategy=local`` on the stored compare_synthetic settings (R = 60 here): each
    client's own fit of 10 samples, e_max 0.65 -> 1.89 and one-step NRMSE 1.73 -> 2.89,
    neither above 10 times its start nor rising steadily: status ok, which it stays, and
    said nowhere. A warning now says the model is worse than where it began and that more
    rounds do not mend it. A parameter error that rises while the predictions improve is
    a hump on the way (the pendulum at lr 1.9: e_max 1.0 -> 3.5 at round 50 while the
    one-step NRMSE falls 2.0 -> 0.5): no warning. The rule on made-up tables: the last round
    above max(1, start) on every metric the run has."""
    from fnsysid.results.history import above_start, above_start_line

    assert above_start(_errors([1.0, 3.0, 2.3])) == {
        "metric": "e_max", "start": 1.0, "final": 2.3, "repeat": 0, "rounds": 2,
        "before": 1.0, "falling": False}
    assert above_start(_errors([1.0, 3.0, 0.9])) is None
    assert above_start(_errors([0.01, 0.5, 0.9])) is None      # below 1: the noise's floor
    assert above_start(_errors([[2.0, 1.0, 2.5], [1.0, 0.5, 1.9]], repeats=2))["repeat"] == 0
    # the predictions improved: a hump of the parameter error, not a poor model
    assert above_start(_errors([1.0, 3.0, 2.3], nrmse=[2.0, 1.0, 0.5])) is None
    assert above_start(_errors([1.0, 3.0, 2.3], nrmse=[1.5, 2.0, 2.5]))["metric"] == "e_max"
    # still coming down over the last rounds, or heading up to a level
    down = above_start(_errors([1.0] + list(np.linspace(5.0, 2.0, 40))))
    assert down["falling"] and down["rounds"] == 8 and down["before"] == pytest.approx(
        5.0 - 3.0 * 31 / 39)
    assert "still coming down" in above_start_line(down, 40)
    up = above_start(_errors(list(3.6 - 3.0 * 0.98 ** np.arange(301))))
    assert not up["falling"] and "more of them do not mend" in above_start_line(up, 300)
    # two rounds that rose 8 times (lr 0.03): too few rounds for the steady rule, and rising,
    # which more rounds would take further (it said "which more of them do not mend")
    short = above_start(_errors([0.52, 1.18, 4.35]))
    line = above_start_line(short, 2)
    assert ("in too few rounds (2) to tell a steady growth, and rising (0.52 2 rounds "
            "before): more rounds would take it further; a smaller lr") in line
    assert "do not mend" not in line and "privacy" not in line
    assert "else privacy's noise (privacy.moved), then the data" in above_start_line(
        short, 2, privacy=True)


@pytest.mark.slow
def test_a_run_that_ends_above_its_start_is_warned_of_and_a_hump_is_not(caplog):
    """The two runs of the test above: strategy=local on compare_synthetic's settings, and
    the pendulum at lr 1.9."""
    from tests.conftest import engine

    caplog.set_level("WARNING", logger="fnsysid")
    local = engine("system=synthetic", "M=25", "N=2", "eps=0.5", "K=20", "lr=0.05", "R=60",
                   "optimizer.reduction=mean", "optimizer.scale_features=diagonal",
                   "strategy=local", "output.plot=false", "progress=false").summary
    assert local["status"] == "ok" and "growth" not in local
    a = local["above_start"]
    assert a["metric"] == "e_max" and a["start"] < 1 and a["final"] > 1.5
    said = [r.getMessage() for r in caplog.records if "worse than where it began" in
            r.getMessage()]
    assert len(said) == 1 and said[0].startswith("the run ends with e_max ")
    assert "more of them do not mend" in said[0]
    caplog.clear()
    hump = engine("system=pendulum", "lr=1.9", "repeats=2", "output.plot=false",
                  "progress=false").summary
    assert hump["final_e_max_mean"] > 2 and "above_start" not in hump
    assert not [r for r in caplog.records if "worse than where it began" in r.getMessage()]


def test_rule_reads_the_one_step_nrmse_without_a_ground_truth():
    nan = np.nan
    g = growth(_errors([nan, nan, nan], nrmse=[1.5, 1.0, 16.0]))
    assert g["metric"] == "nrmse_1step_max" and g["ratio"] == pytest.approx(16.0 / 1.5)
    assert growth(_errors([nan, nan, nan], nrmse=[1.5, 1.0, 14.0])) is None
    assert growth(_errors([nan, nan], nrmse=None)) is None       # nothing to judge by


@pytest.mark.slow
def test_run_at_the_edge_of_stability_is_growing_exit_3(tmp_path):
    res = cli_in_process(*EDGE, f"hydra.run.dir={tmp_path}")
    assert res.returncode == 3, res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    errors = pd.read_csv(tmp_path / "errors.csv")
    final = float(errors["e_max"].iloc[-1])
    assert summary["status"] == "growing" and summary["diverged_round"] is None
    assert summary["rounds_completed"] == 20 and len(errors) == 21       # every row kept
    assert final > GROWTH_FACTOR * errors["e_max"].iloc[0]
    assert summary["growth"] == {"metric": "e_max", "start": 1.0, "final": final,
                                 "repeat": 0, "ratio": final, "factor": GROWTH_FACTOR,
                                 "rule": "limit", "repeats": [0]}
    assert summary["repeat_status"] == ["growing"]
    out = res.stdout + res.stderr
    warning = [ln for ln in out.splitlines() if "run growing" in ln]
    assert len(warning) == 1 and "[WARNING]" in warning[0] and f"{final:.4g}" in warning[0]
    assert "smaller lr than 1.9" in warning[0]
    assert "run growing" in (tmp_path / "run.log").read_text()
    assert (tmp_path / "error.png").stat().st_size > 0                  # drawn, title marked
    assert (tmp_path / "estimates.csv").exists()
    # the same settings with a smaller step: ok, exit 0
    ok = cli_in_process(*EDGE, "lr=0.5", f"hydra.run.dir={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["status"] == "ok"


@pytest.mark.slow
def test_growing_run_plot_says_so(tmp_path, monkeypatch):
    import fnsysid
    import fnsysid.results.plotting.run_plots as plotting

    titles = []
    real = plotting.save

    def keep(fig, paths, dpi):
        titles.extend(ax.get_title() for ax in fig.axes)
        real(fig, paths, dpi)

    monkeypatch.setattr(plotting, "save", keep)
    res = fnsysid.run(EDGE, output_dir=tmp_path)
    assert res.summary["status"] == "growing"
    assert any("status: growing" in t for t in titles)
    assert (tmp_path / "error.png").exists() and (tmp_path / "fit.png").exists()


@pytest.mark.slow
def test_sweep_with_a_growing_job_names_it_exits_3_and_does_not_draw_it(tmp_path):
    from fnsysid.results.plotting.paper_panels import figure

    sweep = tmp_path / "sweep"
    res = cli_in_process("-m", *EDGE, "lr=0.5,1.9", "output.plot=false",
                         "hydra/launcher=basic", f"hydra.sweep.dir={sweep}")
    assert res.returncode == 3, res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("fnsysid: sweep")]
    assert len(line) == 1 and "(growing: M=2,R=20,lr=1.9,repeats=1,system=pendulum)" in line[0]
    results = pd.read_csv(sweep / "results.csv")
    assert set(results.loc[results["lr"] == 1.9, "status"]) == {"growing"}
    table = figure([{"dir": sweep, "title": "curves"}], tmp_path / "fig")
    row = table[table["status"] == "growing"]
    assert list(row["curve"]) == ["lr=1.9 (growing; not drawn)"]
    assert table.loc[table["status"] == "ok", "lr"].tolist() == [0.5]


@pytest.mark.slow
def test_fnsysid_plot_of_a_sweep_without_an_ok_job_draws_nothing_and_exits_3(tmp_path, capsys):
    """An empty figure is not a result: fnsysid-plot names the jobs and their status."""
    from fnsysid.app.plot_cli import main

    sweep = tmp_path / "sweep"
    res = cli_in_process("-m", *EDGE, "lr=1.9", "output.plot=false", "hydra/launcher=basic",
                         f"hydra.sweep.dir={sweep}")
    assert res.returncode == 3, res.stderr
    assert main([str(sweep)]) == 3
    assert capsys.readouterr().err == (
        f"fnsysid-plot: error: nothing to draw under {sweep}: no job ended ok: "
        "M=2,R=20,lr=1.9,repeats=1,system=pendulum (growing)\n")
    assert not list(sweep.glob("sweep.*"))


@pytest.mark.slow
def test_a_diverged_run_marks_its_repeats_that_grew(tmp_path):
    """The pendulum at lr 1.9, R = 100: repeat 2 diverges, repeats 3 and 4 end at e_max 135
    and 406 still rising every round; repeat_status said ok for them (growth is not judged
    once the run is diverged)."""
    from fnsysid.app.experiment import run_experiment
    from tests.conftest import compose_cfg

    summary = run_experiment(compose_cfg("system=pendulum", "lr=1.9", "R=100", "repeats=5",
                                         "output.plot=false", "progress=false"), tmp_path)
    assert summary["status"] == "diverged" and "growth" not in summary
    assert summary["repeat_status"] == ["ok", "ok", "diverged", "growing", "growing"]
    e = pd.read_csv(tmp_path / "errors.csv")
    last = e[e["round"] == 100].set_index("repeat")["e_max"]
    assert last[3] > 100 and last[4] > 100 and last[0] < 10 and last[1] < 10
