"""personalize=auto's REML, fleet and client posteriors against the textbook formulas, written
plainly client by client (the independent reference of the vectorized low-rank code)."""

from __future__ import annotations

import numpy as np
import pytest

from fnsysid.learning import personalize as pers


def _fleet(seed, S=2, M=9, p=4, own_every=4, scales=True):
    """A random fleet: information J_i (SPD, of very different scales per parameter unless
    not ``scales``: the coordinates scaled to the mean information that ``reml`` works in),
    estimates theta_i with a spread, and every ``own_every``-th client without data of its
    own (J_i singular, not ``own``)."""
    rng = np.random.default_rng(seed)
    scale = np.array([1.0, 1e3, 1e-2, 30.0])[:p] if scales else np.ones(p)
    A = rng.normal(size=(S, M, p, p + 2))
    J = (A @ np.swapaxes(A, -1, -2)) * scale[:, None] * scale
    theta = rng.normal(size=(S, M, p)) / scale
    own = np.ones((S, M), bool)
    own[:, ::own_every] = False
    J[~own] = np.outer(scale, scale) * np.outer([1.0, 0, 1, 0][:p], [1.0, 0, 1, 0][:p])
    theta[~own] = 0.0
    return J, theta, own


def _psd(rng, S, p, rank):
    B = rng.normal(size=(S, p, rank))
    return B @ np.swapaxes(B, -1, -2)


def _em_reference(th, J, own, Sig, iterations):
    """The REML EM of one repeat, client by client: ``W_i = (Sigma + J_i^-1)^-1``, ``mu =
    (sum W_i)^-1 sum W_i theta_i``, ``delta_i = Sigma W_i (theta_i - mu)``, ``P_i = Sigma -
    Sigma W_i Sigma``, ``Sigma <- mean_i (delta_i delta_i' + P_i + Sigma W_i Cov(mu) W_i
    Sigma)`` (no truncation: the full rank), and the restricted log-likelihood at the end."""
    idx = np.flatnonzero(own)
    for it in range(iterations + 1):
        W = [np.linalg.inv(Sig + np.linalg.inv(J[i])) for i in idx]
        C = np.linalg.inv(sum(W))
        mu = C @ sum(Wi @ th[i] for Wi, i in zip(W, idx, strict=True))
        if it == iterations:
            ll = -0.5 * (sum(np.linalg.slogdet(np.eye(len(mu)) + J[i] @ Sig)[1] for i in idx)
                         + sum((th[i] - mu) @ Wi @ (th[i] - mu)
                               for Wi, i in zip(W, idx, strict=True))
                         + np.linalg.slogdet(sum(W))[1])
            return Sig, mu, ll
        new = np.zeros_like(Sig)
        for Wi, i in zip(W, idx, strict=True):
            d = Sig @ Wi @ (th[i] - mu)
            new += np.outer(d, d) + Sig - Sig @ Wi @ Sig + Sig @ Wi @ C @ Wi @ Sig
        Sig = new / len(idx)


def test_em_steps_and_likelihood_are_the_textbook_ones():
    J, th, own = _fleet(0, scales=False)
    S, M, p = th.shape
    Sig0 = _psd(np.random.default_rng(1), S, p, p) / 1e2
    w = own.astype(float)
    for iterations in (0, 1, 4):
        Sig, mu, ll, _, _ = pers._em(th, J * w[..., None, None], w, w.sum(axis=1), Sig0, p,
                                     iterations, 0.0, squarem=False)
        for s in range(S):
            ref = _em_reference(th[s], J[s], own[s], Sig0[s], iterations)
            np.testing.assert_allclose(Sig[s], ref[0], rtol=1e-10, atol=1e-10 * abs(ref[0]).max())
            np.testing.assert_allclose(mu[s], ref[1], rtol=1e-10, atol=0)
            np.testing.assert_allclose(ll[s], ref[2], rtol=1e-10)


def test_low_rank_em_keeps_its_rank_and_is_the_truncated_textbook_step():
    """At rank r the step is the textbook one truncated to its top r eigen-directions."""
    J, th, own = _fleet(2, scales=False)
    S, M, p = th.shape
    start = pers._truncate(_psd(np.random.default_rng(3), S, p, p), 2)
    w = own.astype(float)
    Sig, _, _, _, _ = pers._em(th, J * w[..., None, None], w, w.sum(axis=1), start, 2, 1, 0.0,
                               squarem=False)
    for s in range(S):
        ref = pers._truncate(_em_reference(th[s], J[s], own[s], start[s], 1)[0][None], 2)[0]
        np.testing.assert_allclose(Sig[s], ref, rtol=1e-10, atol=1e-10 * abs(ref).max())
        assert np.linalg.matrix_rank(Sig[s], tol=1e-9 * abs(ref).max()) == 2


def _message(J, theta, own, s2=1.0):
    """A message whose scaled information and estimates are ``J`` and ``theta`` (the
    fleet's variance ``s2`` = 1 with a one-group model)."""
    beta = np.einsum("smpq,smq->smp", J, theta)
    dof = np.where(own, 10.0, 0.0)[..., None]
    return pers.Message(J, beta, dof * s2, dof, own)


@pytest.mark.slow
def test_fleet_and_client_posteriors_are_the_textbook_ones():
    """mu = (sum W_i)^-1 sum W_i J_i^-1 beta_i with W_i = J_i (I + Sigma J_i)^-1 over all
    clients (a client without data included); theta_i = mu + Sigma (I + J_i Sigma)^-1
    (beta_i - J_i mu); se_i^2 = diag(B_i (Sigma_ci + Cov mu) B_i' + A_i J_i^-1 A_i'),
    B_i = (I + Sigma J_i)^-1, A_i J_i^-1 A_i' = Sigma (I + J_i Sigma)^-1 J_i (I + Sigma
    J_i)^-1 Sigma; client by client, for a Sigma of rank 0, 1 and 3."""
    J, theta, own = _fleet(4)
    S, M, p = theta.shape
    msg = _message(J, theta, own)
    rng = np.random.default_rng(5)
    scale = np.sqrt(np.diagonal(J[own].mean(axis=0), axis1=-2, axis2=-1))
    blocks = pers.pooled_blocks(1, p)
    for rank in (0, 1, 3):
        Sigma = (_psd(rng, S, p, rank) if rank else np.zeros((S, p, p))) / np.outer(scale, scale)
        Sigma_ci = _psd(rng, S, p, p) / np.outer(scale, scale)
        fl = pers.fleet(msg, blocks)
        fl = pers.Fleet(fl.mu, fl.cov_mu, Sigma, fl.s2, Sigma_ci, fl.Q, fl.pvalue)
        theta_i, se = pers.client_posterior(msg, fl, blocks)
        for s in range(S):
            eye = np.eye(p)
            Ws = [J[s, i] @ np.linalg.inv(eye + Sigma[s] @ J[s, i]) for i in range(M)]
            for i in range(M):
                B = np.linalg.inv(eye + Sigma[s] @ J[s, i])
                post = Sigma[s] @ np.linalg.inv(eye + J[s, i] @ Sigma[s])
                t = fl.mu[s] + post @ (msg.b[s, i] - J[s, i] @ fl.mu[s])
                cov = B @ (Sigma_ci[s] + fl.cov_mu[s]) @ B.T + post @ J[s, i] @ post.T
                np.testing.assert_allclose(theta_i[s, i], t, rtol=1e-10, atol=0)
                np.testing.assert_allclose(se[s, i], np.sqrt(np.diag(cov)), rtol=1e-10, atol=0)
    # the fleet's mean with its own Sigma (rank chosen by the test and REML)
    fl = pers.fleet(msg, blocks)
    for s in range(S):
        eye = np.eye(p)
        Ws = [J[s, i] @ np.linalg.inv(eye + fl.Sigma[s] @ J[s, i]) for i in range(M)]
        rhs = sum(np.linalg.solve(eye + J[s, i] @ fl.Sigma[s], msg.b[s, i]) for i in range(M))
        # in the parameters' own scales (D = diag(scale)), as residuals: with the fleet's
        # REML Sigma the sum of weights is ill-conditioned (the reference's own inverses
        # and the low-rank form round differently, by about 1e-8 here)
        Wd = sum(Ws) / np.outer(scale, scale)
        np.testing.assert_allclose(Wd @ (fl.cov_mu[s] * np.outer(scale, scale)), eye,
                                   rtol=0, atol=1e-7)
        np.testing.assert_allclose(Wd @ (fl.mu[s] * scale), rhs / scale, rtol=0,
                                   atol=1e-7 * abs(rhs / scale).max())


def test_a_homogeneous_fleet_skips_the_low_rank_fits_and_changes_nothing():
    """Where no repeat rejects homogeneity, fleet runs only the unrestricted REML: its
    Sigma_ci is reml's, Sigma is 0, and mu is pooled generalized least squares."""
    rng = np.random.default_rng(7)
    S, M, p = 2, 12, 3
    A = rng.normal(size=(S, M, p, p + 3))
    J = A @ np.swapaxes(A, -1, -2)
    own = np.ones((S, M), bool)
    # estimates drawn around one mean with each client's own covariance J_i^-1
    chol = np.linalg.cholesky(np.linalg.inv(J))
    theta = np.array([1.0, -2.0, 0.5]) + np.einsum("smpq,smq->smp", chol,
                                                   rng.normal(size=(S, M, p)))
    msg = _message(J, theta, own)
    fl = pers.fleet(msg, pers.pooled_blocks(1, p))
    assert (fl.pvalue >= pers.HOMOGENEITY_LEVEL).all()
    np.testing.assert_array_equal(fl.Sigma, 0.0)
    # as fleet has them: in the parameters scaled to unit-size regressors, mapped back
    c = pers.parameter_scale(msg.H)
    cc = c[:, :, None] * c[:, None, :]
    Jc = J * cc[:, None]
    own_theta = np.linalg.solve(Jc, (msg.b * c[:, None])[..., None])[..., 0]
    np.testing.assert_allclose(fl.Sigma_ci, pers.reml(own_theta, Jc, own)[1] * cc,
                               rtol=1e-12, atol=0)
    np.testing.assert_array_equal(fl.scale, c)
    np.testing.assert_allclose(fl.mu, np.linalg.solve(J.sum(1), msg.b.sum(1)[..., None])[..., 0],
                               rtol=1e-10)
