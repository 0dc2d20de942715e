"""personalize=auto's REML converges (SQUAREM-accelerated EM) to the plain EM's fixed point,
and a run says when it did not."""

from __future__ import annotations

import numpy as np
import pytest

from fnsysid.dynamics.model import generate
from fnsysid.learning import personalize as pers
from fnsysid.results.personal import reml_summary, reml_warning
from tests.conftest import make


def _interior_fleet(seed=0, S=2, M=40, p=3):
    """Clients with information J_i of unit mean diagonal (``reml``'s own coordinates) and
    estimates theta_i ~ N(mu, Sigma + J_i^-1) with a full-rank Sigma: a REML solution inside
    the cone of positive definite matrices, where the plain EM converges (linearly)."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(S, M, p, p + 3))
    J = A @ np.swapaxes(A, -1, -2)
    d = np.sqrt(np.diagonal(J.mean(axis=1), axis1=-2, axis2=-1))
    J = J / (d[:, None, :, None] * d[:, None, None, :])
    B = rng.normal(size=(S, p, p))
    Sigma = B @ np.swapaxes(B, -1, -2) / p + 0.3 * np.eye(p)
    cov = Sigma[:, None] + np.linalg.inv(J)
    theta = np.einsum("smpq,smq->smp", np.linalg.cholesky(cov), rng.normal(size=(S, M, p)))
    return J, theta + rng.normal(size=(S, 1, p)), np.ones((S, M), bool)


def _start(th, J, own):
    """``reml``'s start: the PSD part of the moment estimate C - mean V_i plus mean V_i."""
    S, M, p = th.shape
    V = np.linalg.inv(J)
    dev = th - th.mean(axis=1, keepdims=True)
    C = np.einsum("smp,smq->spq", dev, dev) / (M - 1)
    Vbar = V.mean(axis=1)
    return pers._truncate(C - Vbar, p) + Vbar


@pytest.mark.slow
def test_reml_reaches_the_plain_em_fixed_point_and_it_is_stationary():
    J, th, own = _interior_fleet(M=200)
    S, M, p = th.shape
    w = own.astype(float)
    args = (th, J, w, w.sum(axis=1))
    np.testing.assert_allclose(np.diagonal(J.mean(axis=1), axis1=-2, axis2=-1), 1.0)
    # the plain EM to thousands of iterations, until its step is below 1e-13
    ref, _, ll_ref, conv, n = pers._em(*args, _start(th, J, own), p, 20000, 1e-13,
                                       squarem=False)
    assert conv.all() and (n > 300).all()
    scale = np.abs(ref).max(axis=(1, 2))
    cap = pers._em(*args, _start(th, J, own), p, 200, 0.0, squarem=False)
    assert (np.abs(cap[0] - ref).max(axis=(1, 2)) > 1e-4 * scale).any()
    for tol, close in ((1e-6, 1e-4), (1e-10, 1e-8)):
        _, Sig, rep = pers.reml(th, J, own, tol=tol, max_rank=0, report=True)
        assert rep.converged.all() and (rep.iterations < 150).all()
        assert (np.abs(Sig - ref).max(axis=(1, 2)) < close * scale).all()
        ll = pers._em(*args, Sig, p, 0, 0.0)[2]
        assert (ll >= cap[2] - 1e-5).all() and (ll >= ll_ref - 1e-5).all()
        # one EM step from it moves it by less than tol
        step = pers._em(*args, Sig, p, 1, 0.0, squarem=False)[0]
        assert (np.abs(step - Sig).max(axis=(1, 2)) < tol * np.abs(Sig).max(axis=(1, 2))).all()
    assert (ll > cap[2] + 1e-3).any()          # where the cap had not converged


def test_squarem_never_lowers_the_likelihood_below_plain_em():
    """At every cap the accelerated fit's likelihood is at least the plain EM's."""
    J, th, own = _interior_fleet(seed=1)
    S, M, p = th.shape
    w = own.astype(float)
    args = (th, J, w, w.sum(axis=1))
    start = _start(th, J, own)
    for cap in (5, 11, 30):
        ll_sq = pers._em(*args, start, p, cap, 0.0)[2]
        ll_em = pers._em(*args, start, p, cap, 0.0, squarem=False)[2]
        assert (ll_sq >= ll_em - 1e-9 * np.abs(ll_em)).all()


def _message(eps=1.0, repeats=2, M=20, seed=0):
    settings, model, _, _ = make("system=synthetic")
    d = generate(model, M, 10, 5, eps, repeats, seed)
    blocks = pers.noise_blocks(model.structure)
    return pers.client_message(d.H, d.b, d.yy_target, d.n, blocks), blocks


def test_a_run_says_when_its_reml_did_not_converge():
    msg, blocks = _message()
    fl = pers.fleet(msg, blocks)
    assert fl.pvalue.max() < pers.HOMOGENEITY_LEVEL           # heterogeneous: every rank fit
    rep = reml_summary(fl)
    assert rep["converged"] == [True, True]
    assert all(1 < n <= 201 for n in rep["iterations"])
    assert reml_warning(rep) is None
    short = pers.fleet(msg, blocks, iterations=2)
    rep = reml_summary(short)
    assert (rep["converged"], rep["iterations"]) == ([False, False], [3, 3])
    assert rep["rejected"] == [True, True] and all(k >= 1 for k in rep["rank"])
    line = reml_warning(rep)
    assert "did not converge in repeat(s) 0, 1" in line and "\n" not in line
    # the cap changes the heterogeneity the intervals assume
    assert np.abs(short.Sigma_ci - fl.Sigma_ci).max() > 1e-3 * np.abs(fl.Sigma_ci).max()
