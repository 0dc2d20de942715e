"""Local solvers and FedAvg against closed forms and centralized gradient descent."""

import numpy as np
import pytest

from fnsysid.dynamics.model import generate
from fnsysid.learning.optim import GD, SGD, gd_steps, preconditioner, step_sizes
from fnsysid.learning.strategies import FedAvg, aggregate
from fnsysid.results.metrics import client_errors
from tests.conftest import make


def _data(system="synthetic", M=4, N=5, eps=0.2, keep=False, repeats=2, **kw):
    cfg, model, *_ = make(f"system={system}", *kw.pop("overrides", []))
    return model, generate(model, M=M, N=N, T=5, eps=eps, repeats=repeats, seed=0,
                           keep_samples=keep)


def _fedavg(data, model, optimizer, theta0, K, lr, R):
    strat = FedAvg()
    strat.setup(theta0, data, model, optimizer, K, lr, seed=0)
    for r in range(1, R + 1):
        strat.round(r)
    return strat.server


def _pooled_gd(Phi, Y, mask, model, theta, lr, steps, mean=True):
    """Centralized GD written from the raw pooled samples (not the statistics)."""
    for _ in range(steps):
        Theta = model.theta_matrix(theta)
        resid = (Y - np.einsum("snk,sjk->snj", Phi, Theta)) * mask[..., None]
        grad = -np.einsum("jkp,sjk->sp", model.structure, np.einsum("snj,snk->sjk", resid, Phi))
        if mean:
            grad = grad / mask.sum(axis=-1, keepdims=True)
        theta = theta - lr * grad
    return theta


def test_gd_step_matches_hand_computation():
    H = np.array([[2.0, 1.0], [1.0, 3.0]])
    b = np.array([1.0, 2.0])
    th = gd_steps(np.array([1.0, -1.0]), H, b, n=4, lrs=[0.1], reduction="mean")
    # grad = (H th - b) / 4 = ([1, -2] - [1, 2]) / 4 = [0, -1]
    np.testing.assert_allclose(th, [1.0, -0.9])
    np.testing.assert_allclose(step_sizes(0.6, 3, "inverse_k"), [0.6, 0.3, 0.2])


def test_gd_converges_to_least_squares_per_client():
    model, d = _data()
    theta = gd_steps(np.zeros_like(d.b), d.H, d.b, d.n, step_sizes(0.05, 3000),
                     reduction="mean")
    np.testing.assert_allclose(theta, np.linalg.solve(d.H, d.b[..., None])[..., 0], atol=1e-6)


def test_fedavg_with_one_client_equals_centralized_gd():
    model, d = _data(M=1, keep=True)
    theta0 = np.zeros((2, model.p))
    fed = _fedavg(d, model, GD(reduction="mean"), theta0, K=3, lr=0.05, R=20)
    cen = _pooled_gd(d.Phi[:, 0], d.Y[:, 0], d.mask[:, 0], model, theta0, 0.05, 60)
    np.testing.assert_allclose(fed, cen, rtol=1e-10, atol=1e-12)


def test_identical_clients_k1_equals_centralized_gd_on_pooled_data():
    model, d = _data(M=5, eps=0.0, keep=True)        # identical systems, own data each
    theta0 = np.zeros((2, model.p))
    fed = _fedavg(d, model, GD(reduction="mean"), theta0, K=1, lr=0.05, R=30)
    S, M, n, _ = d.Phi.shape
    pooled = [a.reshape(S, M * n, *a.shape[3:]) for a in (d.Phi, d.Y, d.mask[..., None])]
    cen = _pooled_gd(pooled[0], pooled[1], pooled[2][..., 0], model, theta0, 0.05, 30)
    np.testing.assert_allclose(fed, cen, rtol=1e-10, atol=1e-12)


def test_every_client_starts_each_round_from_the_server_model():
    model, d = _data(M=3, eps=0.5)
    theta0 = np.zeros((2, model.p))
    server = _fedavg(d, model, GD(), theta0, K=4, lr=1e-3, R=2)
    ref = theta0
    for _ in range(2):                                      # one client at a time, by hand
        local = [gd_steps(ref, d.H[:, m], d.b[:, m], d.n[:, m], [1e-3] * 4) for m in range(3)]
        ref = np.mean(local, axis=0)
    np.testing.assert_allclose(server, ref, rtol=1e-12)


def test_aggregate_weights_by_samples():
    models = np.array([[[0.0], [3.0]]])                     # (S=1, M=2, p=1)
    np.testing.assert_allclose(aggregate(models, np.array([[10.0, 30.0]])), [[2.25]])
    np.testing.assert_allclose(aggregate(models), [[1.5]])


def test_sgd_with_full_batch_equals_gd():
    model, d = _data(keep=True)
    theta0 = np.zeros((2, model.p))
    sgd = _fedavg(d, model, SGD(batch_size=25), theta0, K=3, lr=1e-3, R=5)
    gd = _fedavg(d, model, GD(), theta0, K=3, lr=1e-3, R=5)
    np.testing.assert_allclose(sgd, gd, rtol=1e-10)


def test_sgd_epoch_visits_every_sample_once():
    model, d = _data(M=2, N=[5, 3], keep=True, repeats=1)
    opt = SGD(batch_size=4)
    opt.setup(d, model, seed=0)
    assert opt.n_batches[0].tolist() == [7, 4]             # ceil(25 / 4), ceil(15 / 4)
    batches = {0: [], 1: []}
    for _ in range(7):
        opt._reshuffle(slice(None))
        for m in (0, 1):
            start = opt.pos[0, m] * 4
            stop = min(start + 4, opt.n_i[0, m])
            batches[m].append(opt.perm[0, m, start:stop].tolist())
        opt.pos = (opt.pos + 1) % opt.n_batches
        opt.t += 1
    assert sorted(sum(batches[0], [])) == list(range(25))    # one epoch of client 0
    first, second = sum(batches[1][:4], []), sum(batches[1][4:], [])
    assert sorted(first) == list(range(15))                 # padded samples never drawn
    assert first[:12] != second                             # reshuffled for the next epoch


def test_feature_scaling_keeps_physical_units_and_the_solution():
    model, d = _data(system="pendulum", M=2, overrides=["system.x0.scale=[0.5,0.5]"])
    P = preconditioner(d.H, d.n)
    np.testing.assert_allclose(P, d.n[..., None] / np.diagonal(d.H, axis1=-2, axis2=-1))
    theta = gd_steps(np.zeros_like(d.b), d.H, d.b, d.n, step_sizes(0.5, 2000),
                     reduction="mean", precond=P)
    np.testing.assert_allclose(theta, np.linalg.solve(d.H, d.b[..., None])[..., 0], rtol=1e-6)


def test_prox_and_correction_terms():
    H, b = np.eye(1), np.zeros(1)
    th = gd_steps(np.array([2.0]), H, b, 1, [0.1], mu=1.0, anchor=np.array([1.0]),
                  correction=np.array([0.5]))
    # grad = 2 + 0.5 + 1 * (2 - 1) = 3.5
    np.testing.assert_allclose(th, [2.0 - 0.35])


def test_client_errors_follow_eq_9():
    truth = np.array([[[3.0, 4.0], [0.0, 2.0]]])
    e = client_errors(np.array([[[3.0, 0.0]]]), truth)
    np.testing.assert_allclose(e, [[4.0 / 5.0, np.sqrt(13.0) / 2.0]])


@pytest.mark.parametrize("bad", [{"schedule": "cosine"}, {"reduction": "max"}])
def test_bad_solver_settings(bad):
    with pytest.raises(ValueError, match=list(bad)[0]):
        GD(**bad)


def test_proximal_term_is_not_feature_scaled():
    H, b = np.diag([4.0, 1e-6]), np.zeros(2)
    P = preconditioner(H, np.array(1.0))
    th = gd_steps(np.array([1.0, 1.0]), H, b, 1.0, [0.1], reduction="mean", precond=P, mu=0.5,
                  anchor=np.zeros(2))
    # P g = [1, 1] (unit curvature after scaling); prox adds 0.5 * theta unscaled
    np.testing.assert_allclose(th, [1.0 - 0.1 * 1.5, 1.0 - 0.1 * 1.5])


def test_whitening_makes_a_unit_step_land_on_least_squares():
    model, d = _data(system="quadrotor", M=2, N=3)
    P = preconditioner(d.H, d.n, "whiten")
    theta = gd_steps(np.zeros_like(d.b), d.H, d.b, d.n, [1.0], reduction="mean", precond=P)
    np.testing.assert_allclose(theta, np.linalg.solve(d.H, d.b[..., None])[..., 0], rtol=1e-7,
                               atol=1e-9)
    with pytest.raises(ValueError, match="scale_features"):
        GD(scale_features="pca")
