"""The REML of ``personalize=auto``'s heterogeneity on at most ``REML_CLIENTS`` clients: the
subset is fixed, its estimate is the REML of those clients alone, and every client still
enters the test, the mean and its own posterior."""

from __future__ import annotations

import numpy as np

from fnsysid.learning import personalize as pers


def _message(seed=0, S=2, M=30, p=3, spread=1.0):
    """A random fleet's messages: y = X theta_i + noise with theta_i spread around a mean."""
    rng = np.random.default_rng(seed)
    n = 12
    X = rng.normal(size=(S, M, n, p))
    theta = 1.0 + spread * rng.normal(size=(S, M, p))
    y = np.einsum("smnp,smp->smn", X, theta) + 0.3 * rng.normal(size=(S, M, n))
    H = np.swapaxes(X, -1, -2) @ X
    b = np.einsum("smnp,smn->smp", X, y)
    fit = np.linalg.solve(H, b[..., None])[..., 0]
    rss = ((y - np.einsum("smnp,smp->smn", X, fit)) ** 2).sum(-1)[..., None]
    dof = np.full((S, M, 1), n - p, float)
    return pers.Message(H, b, rss, dof, np.ones((S, M), bool))


def test_the_subset_is_fixed_sorted_and_of_the_size_asked():
    a, b = pers.reml_clients(10_000, 500), pers.reml_clients(10_000, 500)
    np.testing.assert_array_equal(a, b)
    assert len(a) == 500 and len(np.unique(a)) == 500 and (np.diff(a) > 0).all()
    assert a.min() >= 0 and a.max() < 10_000
    assert pers.reml_clients(500, 500) == slice(None)
    assert pers.reml_clients(10_000, None) == slice(None)
    # a different fleet size draws a different subset
    assert not np.array_equal(pers.reml_clients(10_001, 500), a)


def test_the_heterogeneity_comes_from_the_subset_and_the_mean_from_every_client():
    msg, blocks = _message(), 1
    S, M, p = msg.b.shape
    every = pers.fleet(msg, blocks, most=None)
    np.testing.assert_array_equal(pers.fleet(msg, blocks, most=M).Sigma_ci, every.Sigma_ci)
    k = 12
    sub = pers.reml_clients(M, k)
    part = pers.fleet(msg, blocks, most=k)
    # the reference: the same scaled statistics (the fleet's residual variance from all
    # clients), the REML of the k clients alone
    J, beta = pers._scaled(msg, part.s2, blocks)
    theta = np.linalg.solve(J, beta[..., None])[..., 0]
    Sigma, Sigma_ci = pers.reml(theta[:, sub], J[:, sub], msg.own[:, sub])
    np.testing.assert_allclose(part.Sigma_ci, Sigma_ci, rtol=1e-12, atol=1e-14)
    assert (part.pvalue < pers.HOMOGENEITY_LEVEL).all()           # the low ranks were fitted
    np.testing.assert_allclose(part.Sigma, Sigma, rtol=1e-12, atol=1e-14)
    assert np.abs(part.Sigma_ci - every.Sigma_ci).max() > 1e-3 * np.abs(every.Sigma_ci).max()
    # the test and the mean use all M clients
    np.testing.assert_allclose(part.pvalue, every.pvalue, rtol=1e-12)
    mu, _ = pers.fleet_mean(J, beta, part.Sigma)
    np.testing.assert_allclose(part.mu, mu, rtol=1e-12, atol=1e-14)
    theta_i, se = pers.client_posterior(msg, part, blocks)
    assert theta_i.shape == (S, M, p) and np.isfinite(se).all()
