"""The README's conventions ("Outputs", "Conventions"): what a perfect model scores, round 0
of the closed-form strategies, the held-out standard deviation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import engine

NOISELESS = {"system.disturbance.kind": "zero", "eps": 0.0, "M": 3, "R": 2, "repeats": 1,
             "progress": False}


@pytest.mark.parametrize("system", ["synthetic", "linear"])
def test_a_perfect_model_scores_rounding_one_step_and_zero_free_run(system):
    err = engine({**NOISELESS, "system": system, "strategy": "centralized_exact"}).errors
    last = err.iloc[-1]
    assert last["e_max"] < 1e-13
    assert last["nrmse_1step_max"] < 1e-12               # residuals' rounding, ~1e-15
    assert last["nrmse_sim_max"] < 1e-12                 # states compared directly
    start = engine({**NOISELESS, "system": system}).errors.iloc[0]   # fedavg, round 0
    assert start["nrmse_1step_max"] > 0.1 and start["nrmse_sim_max"] > 0.1


@pytest.mark.parametrize("strategy", ["oneshot", "centralized_exact"])
def test_round_0_of_the_closed_form_strategies_holds_their_solution(strategy):
    base = {"system": "synthetic", "M": 3, "R": 3, "repeats": 2, "progress": False}
    res = engine({**base, "strategy": strategy})
    fedavg = engine(base)
    err = res.errors
    for col in ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean"):
        per_repeat = err.groupby("repeat")[col]
        assert (per_repeat.max() == per_repeat.min()).all(), col        # a flat curve
    start = fedavg.errors[fedavg.errors["round"] == 0]["e_max"].to_numpy()
    assert (err[err["round"] == 0]["e_max"].to_numpy() < 0.5 * start).all()
    est = res.estimates
    np.testing.assert_array_equal(est["initial"], fedavg.estimates["initial"])   # the start
    assert not np.allclose(est["estimate"], est["initial"])


def test_the_held_out_spread_is_the_population_std_over_all_samples():
    from fnsysid.data.heldout import heldout_from_trajectories
    from tests.conftest import make

    _, model, *_ = make("system=linear")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 2, 6, model.system.n_x))    # 2 trajectories of 6 samples
    u = rng.standard_normal((1, 1, 2, 5, model.system.n_u))
    ho = heldout_from_trajectories(model, x, u, np.ones((1, 1, 2, 6), bool))
    np.testing.assert_allclose(ho.std[0, 0], x[0, 0].reshape(-1, x.shape[-1]).std(axis=0),
                               rtol=1e-12)
