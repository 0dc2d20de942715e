"""The heterogeneity structures that ``reml`` chooses among (fnsysid.learning.personalize):
their restricted likelihood, closed forms of their REML and the choice on clear cases."""

from __future__ import annotations

import numpy as np
import pytest

from fnsysid.learning import personalize as pers


def _fleet(rng, S, M, p, Sigma, v):
    """Client estimates theta_i = mu + delta_i + e_i with delta_i ~ N(0, Sigma), e_i ~ N(0, v I)
    and their information J_i = I / v."""
    Lc = np.linalg.cholesky(Sigma + 1e-12 * np.eye(p))
    theta = (rng.normal(size=(S, 1, p)) + rng.normal(size=(S, M, p)) @ Lc.T
             + np.sqrt(v) * rng.normal(size=(S, M, p)))
    return theta, np.broadcast_to(np.eye(p) / v, (S, M, p, p)).copy()


def test_dense_restricted_likelihood_and_em_map_equal_the_low_rank_pass():
    """``_restricted`` (any Sigma, O(M p^3)) gives the restricted log-likelihood and the EM
    map of ``_pass`` (Sigma = L L', Woodbury) at a rank-2 Sigma, and the likelihood computed
    from its definition with numpy: -(sum log|Sigma + V_i| + sum r_i' (Sigma + V_i)^-1 r_i
    + log|sum (Sigma + V_i)^-1|) / 2 + sum log|V_i| / 2 (the constant ``_pass`` drops)."""
    rng = np.random.default_rng(0)
    S, M, p = 3, 8, 4
    A = rng.normal(size=(S, M, p, p))
    J = A @ np.swapaxes(A, -1, -2) + np.eye(p)
    th = 2 * rng.normal(size=(S, M, p))
    w, m = np.ones((S, M)), np.full(S, float(M))
    L = rng.normal(size=(S, p, 2))
    Sig = L @ np.swapaxes(L, -1, -2)
    lam, U = np.linalg.eigh(Sig)
    new_ref, _, _, ll_ref, _, _ = pers._pass(th, J, w, m, Sig, np.maximum(lam, 0), U, 2,
                                             J.sum(1), np.einsum("smpq,smq->sp", J, th))
    ll, new = pers._restricted(th, J, w, Sig)
    np.testing.assert_allclose(ll, ll_ref, rtol=1e-11)
    np.testing.assert_allclose(new, new_ref, rtol=1e-9, atol=1e-12)
    for s in range(S):
        C = [Sig[s] + np.linalg.inv(J[s, i]) for i in range(M)]
        Wi = [np.linalg.inv(c) for c in C]
        mu = np.linalg.solve(sum(Wi), sum(Wi[i] @ th[s, i] for i in range(M)))
        ref = -0.5 * (sum(np.linalg.slogdet(c)[1] for c in C)
                      + sum((th[s, i] - mu) @ Wi[i] @ (th[s, i] - mu) for i in range(M))
                      + np.linalg.slogdet(sum(Wi))[1]
                      - sum(np.linalg.slogdet(np.linalg.inv(J[s, i]))[1] for i in range(M)))
        assert ll[s] == pytest.approx(ref, rel=1e-10)


@pytest.mark.slow
def test_one_parameter_and_diagonal_reml_with_equal_variances_are_the_closed_forms():
    """Every V_i = v I: with Sigma = tau^2 I the REML is tau^2 = max(0, sum_ij (theta_ij -
    mean_j)^2 / ((m - 1) p) - v); with a diagonal Sigma each coordinate separates and its
    variance is max(0, s_j^2 - v), s_j^2 the sample variance (m - 1)."""
    rng = np.random.default_rng(1)
    S, M, p, v = 3, 8, 4, 0.5
    theta, J = _fleet(rng, S, M, p, np.diag([1.7, 0.3, 2.5, 0.0]), v)
    theta[2] = theta[2, :1] + 0.2 * (theta[2] - theta[2, :1])    # repeat 2: little spread
    w = np.ones((S, M))
    dev2 = (theta - theta.mean(1, keepdims=True)) ** 2
    tau2, ll = pers._one_parameter(theta, J, w, np.broadcast_to(np.eye(p), (S, p, p)))
    ref = np.maximum(dev2.sum((1, 2)) / ((M - 1) * p) - v, 0.0)
    assert ref[2] == 0.0 and ref[:2].min() > 0
    np.testing.assert_allclose(np.diagonal(tau2, axis1=1, axis2=2), ref[:, None] * np.ones(p),
                               rtol=1e-5, atol=0)
    assert (tau2 - np.diagonal(tau2, axis1=1, axis2=2)[..., None] * np.eye(p) == 0).all()
    np.testing.assert_allclose(ll, pers._restricted(theta, J, w, tau2)[0], rtol=1e-12)
    D, _, conv, _ = pers._diagonal(theta, J, w, np.ones((S, p)), 5000, 1e-12)
    refd = np.maximum(dev2.sum(1) / (M - 1) - v, 0.0)
    inside = (refd > 0).all(axis=1)
    assert conv[inside].all() and not inside.all()
    got = np.diagonal(D, axis1=1, axis2=2)
    np.testing.assert_allclose(got[inside], refd[inside], rtol=1e-8)
    # a variance on the boundary (0) is approached sublinearly: small, not 0
    np.testing.assert_allclose(got[~inside], refd[~inside], rtol=1e-6, atol=1e-4 * v)


@pytest.mark.parametrize("truth", ["identity", "rank1", "diagonal"])
def test_the_selection_picks_the_structure_of_a_clear_case(truth):
    """200 clients, p = 6, noise v = 0.1: heterogeneity tau^2 I, rank one or a diagonal with
    unequal entries is recovered with its structure (entries off the structure 0) and its
    values within sampling error."""
    rng = np.random.default_rng(2)
    S, M, p, v = 2, 200, 6, 0.1
    u = np.ones(p) / np.sqrt(p)
    Sigma = {"identity": np.eye(p), "rank1": 4 * np.outer(u, u),
             "diagonal": np.diag([3.0, 0.1, 1.0, 0.0, 2.0, 0.5])}[truth]
    theta, J = _fleet(rng, S, M, p, Sigma, v)
    Sig, _ = pers.reml(theta, J, np.ones((S, M), bool), structures=pers.STRUCTURES)
    ev = np.linalg.eigvalsh(Sig)
    if truth == "identity":
        assert (Sig == Sig[:, :1, :1] * np.eye(p)).all()        # tau^2 I, exactly
    elif truth == "rank1":
        assert (ev[:, :-1] < 1e-8 * ev[:, -1:]).all()
    else:
        assert (Sig == np.diagonal(Sig, axis1=1, axis2=2)[..., None] * np.eye(p)).all()
        assert len(set(np.round(np.diagonal(Sig[0]), 6))) > 2   # not tau^2 I
    np.testing.assert_allclose(Sig, np.broadcast_to(Sigma, Sig.shape), atol=0.35 * ev.max())


def test_an_unknown_criterion_or_structure_is_refused_in_one_line():
    theta, J = _fleet(np.random.default_rng(3), 1, 5, 2, np.eye(2), 0.1)
    own = np.ones((1, 5), bool)
    with pytest.raises(ValueError, match=r"^criterion=aicc is not allowed; allowed: bic, aic$"):
        pers.reml(theta, J, own, criterion="aicc")
    with pytest.raises(ValueError, match=r"^structures=\['full'\] is not allowed"):
        pers.reml(theta, J, own, structures=("full",))
