"""Heterogeneous local work: K as a list or a distribution, FedNova against closed forms."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from numpy.linalg import matrix_power, norm, solve

from fnsysid.app.experiment import run_experiment
from fnsysid.config.checks import ConfigError
from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import generate
from fnsysid.learning.local_work import local_steps
from fnsysid.learning.optim import GD
from fnsysid.learning.strategies import FedAvg, FedNova, Scaffold
from tests.conftest import compose_cfg, make

K_I = np.array([1, 2, 5, 20])


def _run(strategy, model, data, K, lr, R, optimizer=None):
    strategy.setup(np.zeros((data.shape[0], model.p)), data, model,
                   optimizer or GD(reduction="mean"), K, lr, seed=0)
    for r in range(1, R + 1):
        strategy.round(r)
    return strategy.server


def test_fednova_and_fedavg_reach_their_closed_form_fixed_points_with_heterogeneous_k():
    """At eps > 0 with K_i = 1, 2, 5, 20: FedNova's fixed point solves
    sum_i (I - P_i) theta / s_i = sum_i q_i / s_i and lies near the minimizer of the clients'
    mean loss; FedAvg's solves theta = mean_i (P_i theta + q_i) and lies near the minimizer of
    the K_i-weighted loss instead (Wang et al. 2020, objective inconsistency)."""
    _, model, *_ = make("system=synthetic")
    d = generate(model, M=4, N=5, T=5, eps=0.3, repeats=2, seed=0)
    lr, S, eye = 0.01, 2, np.eye(model.p)
    K = np.broadcast_to(K_I, (S, 4))
    nova = _run(FedNova(), model, d, K, lr, R=5000)
    avg = _run(FedAvg(), model, d, K, lr, R=5000)
    for s in range(S):
        A = d.H[s] / d.n[s, :, None, None]                       # mean-reduction Hessians
        b = d.b[s] / d.n[s, :, None]
        P = [matrix_power(eye - lr * A[i], K_I[i]) for i in range(4)]
        q = [sum(matrix_power(eye - lr * A[i], k) @ (lr * b[i]) for k in range(K_I[i]))
             for i in range(4)]
        s_i = lr * K_I
        nova_fixed = solve(sum((eye - P[i]) / s_i[i] for i in range(4)),
                           sum(q[i] / s_i[i] for i in range(4)))
        avg_fixed = solve(eye - np.mean(P, axis=0), np.mean(q, axis=0))
        np.testing.assert_allclose(nova[s], nova_fixed, atol=1e-9)
        np.testing.assert_allclose(avg[s], avg_fixed, atol=1e-9)
        mean_loss = solve(A.mean(axis=0), b.mean(axis=0))
        k_weighted = solve((K_I[:, None, None] * A).mean(axis=0), (K_I[:, None] * b).mean(axis=0))
        bias = norm(avg_fixed - mean_loss)
        assert bias > 0.1                                   # heterogeneous K_i move FedAvg
        assert norm(nova_fixed - mean_loss) < 0.1 * bias    # FedNova stays near the objective
        assert norm(avg_fixed - k_weighted) < 0.1 * bias    # FedAvg minimizes sum K_i F_i


def test_fednova_with_equal_k_is_fedavg_and_exchanges_equal_the_affine_round():
    _, model, *_ = make("system=synthetic")
    d = generate(model, M=5, N=3, T=5, eps=0.2, repeats=2, seed=1)
    a = _run(FedNova(), model, d, 4, 0.02, R=30)
    b = _run(FedAvg(), model, d, 4, 0.02, R=30)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    K = np.array([[1, 4, 2, 7, 3], [5, 1, 1, 2, 6]])
    for weighting in ("uniform", "samples"):
        fast = _run(FedNova(weighting=weighting), model, d, K, 0.02, R=30)
        slow = _run(FedNova(weighting=weighting), model, d, K, 0.02, R=30,
                    optimizer=GD(reduction="mean", affine=False))
        np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-11)


def test_scaffold_with_per_client_k_matches_its_step_by_step_path():
    _, model, *_ = make("system=synthetic")
    d = generate(model, M=4, N=3, T=5, eps=0.2, repeats=2, seed=2)
    K = np.array([[1, 3, 2, 6], [4, 1, 1, 2]])
    fast = _run(Scaffold(), model, d, K, 0.02, R=40)
    slow = _run(Scaffold(), model, d, K, 0.02, R=40, optimizer=GD(reduction="mean", affine=False))
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=1e-11)


def test_k_list_and_distribution_per_client():
    assert local_steps(7, 3, 2, seed=0) == 7
    np.testing.assert_array_equal(local_steps([1, 5, 2], 3, 2, 0), [[1, 5, 2], [1, 5, 2]])
    dist = {"kind": "uniform_int", "low": 1, "high": 20}
    k = local_steps(dist, 3000, 2, seed=4)
    assert k.shape == (2, 3000) and k.min() == 1 and k.max() == 20
    assert abs(k.mean() - 10.5) < 0.3 and not (k[0] == k[1]).all()     # repeats differ
    small = local_steps(dist, 5, 2, seed=4)
    np.testing.assert_array_equal(small, k[:, :5])                    # K_i unchanged as M grows
    np.testing.assert_array_equal(local_steps(dist, 3000, 2, 4, clients=[rnd.BLOCK + 3, 2]),
                                  k[:, [rnd.BLOCK + 3, 2]])            # a node draws its own
    assert not (local_steps(dist, 5, 2, seed=5) == small).all()       # the seed matters


@pytest.mark.parametrize("K, message", [
    ("[1,2]", "K has 2 entries but M=3"),
    ("{kind:uniform_int,low:5,high:2}", "K="),
    ("{kind:normal,low:1,high:2}", "K="),
    ("[1,0,2]", "K="),
])
def test_bad_k_is_refused_in_one_line(tmp_path, K, message):
    with pytest.raises(ConfigError, match=message):
        run_experiment(compose_cfg("system=synthetic", "M=3", f"K={K}"), tmp_path)


def test_run_with_k_distribution_writes_it_to_the_summary(tmp_path):
    cfg = compose_cfg("system=synthetic", "M=6", "R=30", "repeats=2", "lr=5e-4",
                      "strategy=fednova", "K={kind:uniform_int,low:1,high:20}",
                      "output.plot=false")
    summary = run_experiment(cfg, tmp_path)
    assert summary["status"] == "ok"
    assert summary["K"] == {"kind": "uniform_int", "low": 1, "high": 20}
    errors = pd.read_csv(tmp_path / "errors.csv")
    first, last = errors[errors["round"] == 0], errors[errors["round"] == 30]
    assert (last["e_max"].to_numpy() < first["e_max"].to_numpy()).all()
    k = pd.read_csv(tmp_path / "k_clients.csv")                    # the K_i as they ran
    assert list(k.columns) == ["repeat", "client", "K"] and len(k) == 12
    want = local_steps({"kind": "uniform_int", "low": 1, "high": 20}, 6, 2, seed=0)
    np.testing.assert_array_equal(k["K"].to_numpy().reshape(2, 6), want)
    assert not (want[0] == want[1]).all()
    run_experiment(compose_cfg("system=synthetic", "M=3", "R=2", "output.plot=false"),
                   tmp_path / "equal")
    assert not (tmp_path / "equal" / "k_clients.csv").exists()     # one K for every client
    with pytest.raises(ConfigError, match="centralized"):
        run_experiment(compose_cfg("system=synthetic", "M=3", "K=[1,2,3]",
                                   "strategy=centralized"), tmp_path / "c")
