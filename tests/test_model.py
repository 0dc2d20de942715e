"""Regression model: exact recovery, embedding of the truth, refusals of misfit features."""

import numpy as np
import pytest

from fnsysid.app.build import fitting_feature_maps
from fnsysid.dynamics.features import Fourier, Identity, Polynomial
from fnsysid.dynamics.model import FeatureMapError, build_model, generate
from tests.conftest import make

SYSTEMS = ["synthetic", "linear", "pendulum", "quadrotor"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_exact_least_squares_recovers_truth_without_noise(system, noiseless):
    cfg, model, *_ = make(*noiseless(system), "eps=0.5")
    data = generate(model, M=3, N=4, T=cfg.T, eps=cfg.eps, repeats=2, seed=1)
    theta = np.linalg.solve(data.H, data.b[..., None])[..., 0]   # per-client least squares
    np.testing.assert_allclose(theta, data.theta_true, rtol=1e-7, atol=1e-9)
    # clients differ (eps > 0), so recovering each one's own truth is not trivial
    assert np.ptp(data.theta_true[0], axis=0).max() > 1e-3


def test_stats_match_raw_samples():
    cfg, model, *_ = make("system=linear")
    data = generate(model, M=2, N=[3, 5], T=4, eps=0.1, repeats=1, seed=0, keep_samples=True)
    Phi, Y, w = data.Phi[0, 1], data.Y[0, 1], data.mask[0, 1]
    assert w.sum() == data.n[0, 1] == 20
    X = np.kron(np.eye(3), Phi[w > 0])                              # vec(Theta) regression
    y = Y[w > 0].T.ravel()
    np.testing.assert_allclose(data.H[0, 1], X.T @ X, rtol=1e-12)
    np.testing.assert_allclose(data.b[0, 1], X.T @ y, rtol=1e-12)
    np.testing.assert_allclose(data.yy[0, 1], y @ y, rtol=1e-12)


def test_truth_is_embedded_in_a_larger_library(noiseless):
    cfg, model, *_ = make(*noiseless("linear"), "feature_map=polynomial")
    assert model.p == 3 * 21
    data = generate(model, M=1, N=30, T=5, eps=0.0, repeats=1, seed=0)
    theta = np.linalg.solve(data.H[0, 0], data.b[0, 0])
    np.testing.assert_allclose(theta, data.theta_true[0, 0], atol=1e-8)
    Theta = model.theta_matrix(data.theta_true[0, 0])
    names = Polynomial(2).feature_names(3, 2)
    assert Theta[0, names.index("x1")] == 0.5 and Theta[0, names.index("u0")] == 1.0
    assert Theta[0, names.index("x0^2")] == 0.0 and Theta[0, names.index("1")] == 0.0


@pytest.mark.slow
def test_misfit_feature_maps_are_refused():
    _, model, *_ = make("system=synthetic")
    with pytest.raises(FeatureMapError, match=r"sin\(x0\)"):
        build_model(model.system, Polynomial(3))
    with pytest.raises(FeatureMapError, match="repeats"):
        build_model(model.system, Fourier("x") + Fourier("x") + Identity("u"))
    assert fitting_feature_maps(model.system) == ["combined", "default", "fourier"]
    _, pend, *_ = make("system=pendulum")
    with pytest.raises(FeatureMapError, match="own features"):
        build_model(pend.system, Identity())
    assert fitting_feature_maps(pend.system) == ["default"]


def test_custom_feature_map_plugs_in_through_target(noiseless):
    cfg, model, *_ = make(*noiseless("synthetic"), "feature_map=default",
                          "+feature_map._target_=tests.test_model.SinAndInputs")
    assert model.param_names[:2] == ["x0+:u0", "x0+:u1"]
    data = generate(model, M=1, N=10, T=5, eps=0.0, repeats=1, seed=0)
    theta = np.linalg.solve(data.H[0, 0], data.b[0, 0])
    np.testing.assert_allclose(theta, data.theta_true[0, 0], atol=1e-9)


class SinAndInputs(Identity):
    """A user's own map: inputs first, then sin of the states (order differs from default)."""

    def __init__(self):
        super().__init__("u")

    def transform(self, x, u):
        return np.concatenate([u, np.sin(x)], axis=-1)

    def feature_names(self, n_x, n_u):
        return [f"u{j}" for j in range(n_u)] + [f"sin(x{j})" for j in range(n_x)]
