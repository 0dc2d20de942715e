"""Bytes sent up and down (summary.json ``communication``, errors.csv ``bytes_per_client``)
against hand counts, and against the Flower runtime's messages."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fnsysid.app.experiment import execute, run_experiment
from fnsysid.learning import communication as comm
from fnsysid.learning.strategies import FedAvg
from tests.conftest import compose_cfg, needs_flower

#: synthetic system (p = 15 parameters: 3 states, 5 features each), M = 5 clients, R = 4
BASE = ["system=synthetic", "M=5", "R=4", "repeats=2", "N=4", "output.plot=false",
        "progress=false"]
P, M, R = 15, 5, 4


def run(*extra):
    return execute(compose_cfg(*BASE, *extra), choices={})


# (up per client and round, down per client and round, up once, down once) in numbers
HAND = {
    "fedavg": (P, P, 0, 0),
    "fedprox": (P, P, 0, 0),
    "fednova": (P + 1, P, 0, 0),                    # d_i and its total step size s_i
    "scaffold": (2 * P, 2 * P, 0, 0),               # theta_i, dc_i up; theta, c down
    "fedlin": (2 * P, 3 * P, 0, 0),                 # g_i, theta_i up; theta, then theta, g
    "cyclic": (P, P, 0, 0),
    "oneshot": (0, 0, P, 0),                        # its own estimate, once
    "centralized_exact": (0, 0, P * P + P, 0),      # H_i and b_i, once
    "centralized": (0, 0, P * P + P, 0),
    "local": (0, 0, 0, 0),
}


@pytest.mark.parametrize("strategy", sorted(HAND))
def test_bytes_of_each_strategy_are_the_hand_count(strategy):
    res = run(f"strategy={strategy}")
    assert len(res.model.param_names) == P
    c = res.summary["communication"]
    up, down, up1, down1 = (8 * v for v in HAND[strategy])
    assert (c["up_bytes_per_client_round"], c["down_bytes_per_client_round"]) == (up, down)
    assert (c["up_bytes_per_client_once"], c["down_bytes_per_client_once"]) == (up1, down1)
    assert c["rounds"] == R and c["client_rounds"] == M * R
    assert c["up_total"] == M * (R * up + up1)
    assert c["down_total"] == M * (R * down + down1)
    assert c["per_client_total"] == R * (up + down) + up1 + down1
    e = res.tables["errors"]
    for s in (0, 1):                # cumulative per client: the once part, then each round
        got = e.loc[e["repeat"] == s].sort_values("round")["bytes_per_client"].to_numpy()
        np.testing.assert_array_equal(got, up1 + down1 + np.arange(R + 1) * (up + down))


def test_fedavg_counts_only_the_clients_taking_part():
    # fraction 0.4 of 5 clients: 2 a round; per-client means over all 5
    c = run("strategy=fedavg", "strategy.fraction=0.4").summary["communication"]
    assert c["client_rounds"] == 2 * R
    assert c["up_total"] == c["down_total"] == 2 * R * 8 * P
    assert c["per_client_total"] == pytest.approx(2 * R * 2 * 8 * P / M)
    assert c["messages"] == 2 * 2 * R


def test_sparsity_adds_the_statistics_and_the_support():
    res = run("strategy=scaffold", "sparsity=stlsq")
    c = res.summary["communication"]
    n_y = 3
    assert c["up_bytes_per_client_once"] == 8 * (P * P + P + n_y)      # H, b, yy
    assert c["down_bytes_per_client_once"] == 0         # the support comes with each message
    assert c["down_bytes_per_client_round"] == 8 * 3 * P                # theta, c, support
    assert c["up_bytes_per_client_round"] == 8 * 2 * P
    # a strategy without rounds of messages gets the support once
    c = run("strategy=oneshot", "sparsity=stlsq").summary["communication"]
    assert c["up_bytes_per_client_once"] == 8 * (P * P + P + n_y + P)  # H, b, yy; theta_i
    assert c["down_bytes_per_client_once"] == 8 * P
    assert c["down_bytes_per_client_round"] == 0


def test_personalize_auto_adds_its_two_exchanges_after_the_rounds():
    res = run("strategy=fedavg", "personalize=auto")
    c = res.summary["communication"]
    g = 3                               # synthetic: each state its own noise group
    assert c["up_bytes_per_client_once"] == 8 * (P * P + P + 2 * g + 1)
    assert c["down_bytes_per_client_once"] == 8 * (P + 3 * P * P + g + P)     # + its scale
    assert c["per_client_total"] == R * 2 * 8 * P + 8 * (3 * P + 4 * P * P + 3 * g + 1)
    # errors.csv stops at the last round: the personalization comes after it
    assert res.tables["errors"]["bytes_per_client"].max() == R * 2 * 8 * P


def test_a_subclass_that_changes_what_is_sent_without_declaring_it_is_not_counted():
    class Doubled(FedAvg):
        def message(self, exchange):
            return {"theta": self.server, "extra": self.server}

    plan = comm.plan_of(Doubled(), P)
    assert plan.note is not None and "Doubled" in plan.note
    out = comm.account(plan, np.full((1, R), M), M)
    assert out == {"declared": False, "note": plan.note}

    class Declared(Doubled):
        def payload(self, p):
            return comm.Plan(round=comm.exchange(down=[("theta", (p,)), ("extra", (p,))],
                                                 up=[("theta", (p,))]))

    out = comm.account(comm.plan_of(Declared(), P), np.full((1, R), M), M)
    assert (out["down_bytes_per_client_round"], out["up_bytes_per_client_round"]) == \
        (16 * P, 8 * P)


def test_summary_json_and_errors_csv_carry_the_counts(tmp_path):
    run_experiment(compose_cfg(*BASE, "strategy=fedavg"), tmp_path)
    c = json.loads((tmp_path / "summary.json").read_text())["communication"]
    assert c["dtype"] == "float64" and c["what"] == ["per round, up: theta (15)",
                                                     "per round, down: theta (15)"]
    e = pd.read_csv(tmp_path / "errors.csv")
    assert e["bytes_per_client"].max() == c["per_client_total"] == R * 2 * 8 * P


#: the Flower comparison: a small synthetic run, one repeat and two (a message carries both)
FLOWER = ["system=synthetic", "M=3", "R=3", "N=3", "output.plot=false", "progress=false"]


@pytest.mark.flower
@needs_flower
@pytest.mark.parametrize("strategy, extra", [
    ("fedavg", ["repeats=1"]), ("scaffold", ["repeats=2"]),
    ("fedlin", ["repeats=1", "sparsity=stlsq"]),
    ("fednova", ["repeats=1", "strategy.fraction=0.67", "personalize=auto"]),
    ("fedavg", ["repeats=2", "sparsity=stlsq", "personalize=auto"]),
    ("fedavg", ["repeats=2", "sparsity=stlsq", "sparsity.threshold=auto"])])
def test_flower_messages_carry_what_is_declared(strategy, extra, tmp_path):
    s = run_experiment(compose_cfg(*FLOWER, f"strategy={strategy}", *extra,
                                   "runtime=flower"), tmp_path)
    c = s["communication"]
    m = c["measured"]
    for key in ("up_total", "down_total", "per_client_total"):
        assert m[key] == pytest.approx(c[key], rel=0.10), key
        assert m[key] > 0
    # the arrays are those declared, so the numbers agree exactly (measured so, 4 cases)
    assert (m["up_total"], m["down_total"]) == (c["up_total"], c["down_total"])
    # the scores the clients send of each model are counted apart, not in the totals
    assert m["evaluation_up"] > 0
    assert m["serialized_up_total"] > m["up_total"]


def test_curves_against_bytes_put_each_round_at_its_cumulative_bytes():
    from fnsysid.results.plotting.style import draw_curve, new_figure

    errors = pd.DataFrame({"repeat": [0, 0, 0, 1, 1, 1], "round": [0, 1, 2] * 2,
                           "e_max": [1.0, 0.5, 0.25, 3.0, 1.5, 0.75],
                           "bytes_per_client": [16.0, 48.0, 80.0] * 2})
    ax = new_figure().subplots()
    line = draw_curve(ax, errors, "fedavg", against="bytes_per_client")
    np.testing.assert_array_equal(line.get_xdata(), [16.0, 48.0, 80.0])
    np.testing.assert_array_equal(line.get_ydata(), [2.0, 1.0, 0.5])     # mean over repeats
    final = ax.get_lines()[-1]                                            # the final dot
    assert (final.get_xdata()[0], final.get_ydata()[0]) == (80.0, 0.5)


def test_a_diverged_repeat_counts_the_rounds_before_its_divergence():
    # FedLin on the pendulum (p = 2; 2p up and 3p down a round): repeat 0
    # diverges at r = 22 (tests/test_cli.py), the others run to R = 30
    res = execute(compose_cfg(
        "system=pendulum", "M=20", "N=2", "eps=2", "K=20", "lr=0.05", "R=30", "repeats=5",
        "optimizer.reduction=mean", "optimizer.scale_features=diagonal", "strategy=fedlin",
        "output.plot=false", "progress=false"), choices={})
    assert res.summary["repeat_diverged_round"] == [22, None, None, None, None]
    per_round = 8 * (2 * 2 + 3 * 2)
    e = res.tables["errors"]
    b = {s: e.loc[e["repeat"] == s].sort_values("round")["bytes_per_client"].to_numpy()
         for s in (0, 1)}
    np.testing.assert_array_equal(b[0][:22], np.arange(22) * per_round)
    assert np.isnan(b[0][22:]).all()                        # as its errors
    np.testing.assert_array_equal(b[1], np.arange(31) * per_round)
    c = res.summary["communication"]
    assert c["client_rounds"] == 20 * (21 + 4 * 30) / 5      # mean over the repeats
    assert c["per_client_total"] == per_round * (21 + 4 * 30) / 5


@pytest.mark.slow
def test_poisson_sampling_counts_each_rounds_draw():
    """Under privacy each client takes part with probability fraction: the counts are those
    of the strategy's own draws (the independent count here from the same streams)."""
    from fnsysid.dynamics import random as rnd

    res = run("strategy=fedavg", "strategy.fraction=0.4", "privacy=central",
              "privacy.epsilon=8", "privacy.clip=0.5", "R=6")
    seed = res.settings.seed
    taken = np.array([[(rnd.stream(seed, rnd.PARTICIPATION, s, r).random(M) < 0.4).sum()
                       for r in range(1, 7)] for s in range(2)])
    c = res.summary["communication"]
    assert c["client_rounds"] == pytest.approx(taken.sum(axis=1).mean())
    assert c["up_total"] == pytest.approx(8 * P * taken.sum(axis=1).mean())
    e = res.tables["errors"]
    for s in (0, 1):
        got = e.loc[e["repeat"] == s].sort_values("round")["bytes_per_client"].to_numpy()
        want = np.concatenate([[0], np.cumsum(taken[s])]) * 2 * 8 * P / M
        np.testing.assert_allclose(got, want, rtol=1e-12)
