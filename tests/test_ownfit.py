"""The clients' own least squares made a block of clients at a time
(fnsysid.learning.ownfit) against numpy.linalg applied to each client on its own."""

from __future__ import annotations

import numpy as np
import pytest

from fnsysid.app.experiment import execute
from fnsysid.learning import ownfit
from fnsysid.learning import personalize as pers
from fnsysid.learning import strategies as st
from tests.conftest import compose_cfg


def _fleet(block_diagonal: bool):
    """Statistics (S, M, p, p), (S, M, p) of clients with regression rows ``X`` and targets
    ``y``, among them clients whose data do not determine their model. ``block_diagonal``:
    two targets of 3 parameters each (the Gram matrix block diagonal, as a model whose
    parameters enter one target each); else one target of 6."""
    rng = np.random.default_rng(7)
    S, M, n, p = 2, 13, 14, 6
    X = rng.normal(size=(S, M, n, p)) * rng.uniform(0.1, 10.0, size=(S, M, 1, p))
    X[0, 4, :, 2] = X[0, 4, :, 1]                 # a repeated column: rank p - 1, exactly
    X[1, 7] = 0.0                                 # a client without data
    X[0, 9, 2:] = 0.0                             # two samples only: rank 2 (4)
    X[1, 2, :, 2] = X[1, 2, :, 0] * (1 + 1e-15 * rng.normal(size=n))   # nearly singular
    X[1, 11, :, 3] = X[1, 11, :, 4] + 1e-4 * rng.normal(size=n)        # ill-conditioned
    y = rng.normal(size=(S, M, n, 2 if block_diagonal else 1))
    if block_diagonal:                            # G rows: (x, 0) for target 0, (0, x) for 1
        H = np.zeros((S, M, p, p))
        b = np.zeros((S, M, p))
        for j, P in enumerate((slice(0, 3), slice(3, 6))):
            H[..., P, P] = np.einsum("smtp,smtq->smpq", X[..., P], X[..., P])
            b[..., P] = np.einsum("smtp,smt->smp", X[..., P], y[..., j])
    else:
        H = np.einsum("smtp,smtq->smpq", X, X)
        b = np.einsum("smtp,smt->smp", X, y[..., 0])
    return H, b, (y ** 2).sum(axis=2), np.full((S, M), float(n))


def _reference(H, b, support):
    """Per client with numpy.linalg on the kept terms' equilibrated Gram matrix ``D A D``
    (each regressor scaled to unit size): its rank rule, the pseudo-inverse solution (mapped
    back by ``D``); the diagonal of the inverse of ``A`` where the rank is full."""
    S, M, p = b.shape
    keep = np.broadcast_to(np.asarray(support, bool), (S, M, p))
    theta, full, dg = np.zeros((S, M, p)), np.zeros((S, M), bool), np.full((S, M, p), np.nan)
    for s in range(S):
        for m in range(M):
            k = np.flatnonzero(keep[s, m])
            A = H[s, m][np.ix_(k, k)]
            d = np.diag(A)
            D = np.diag(1 / np.sqrt(np.where(d > 0, d, 1.0)))
            full[s, m] = np.linalg.matrix_rank(D @ A @ D, hermitian=True) == len(k) \
                if len(k) else True
            if len(k):
                theta[s, m, k] = D @ np.linalg.pinv(D @ A @ D, hermitian=True) @ D @ b[s, m, k]
                if full[s, m]:
                    dg[s, m, k] = np.diag(np.linalg.inv(A))
    return theta, full, dg


SUPPORTS = [None, np.array([[[1, 1, 0, 1, 1, 1]], [[1, 0, 1, 1, 1, 0]]], bool)]


@pytest.mark.parametrize("block_diagonal", [False, True])
@pytest.mark.parametrize("support", SUPPORTS, ids=["all terms", "support per repeat"])
@pytest.mark.parametrize("chunk,threads", [(ownfit.CHUNK, "1"), (4, "1"), (3, "2")])
def test_own_fits_equal_numpy_per_client(monkeypatch, block_diagonal, support, chunk, threads):
    monkeypatch.setattr(ownfit, "CHUNK", chunk)      # blocks smaller than the fleet
    monkeypatch.setenv("FNSYSID_THREADS", threads)
    H, b, _, _ = _fleet(block_diagonal)
    keep = np.ones(6, bool) if support is None else support
    Hs = H * (keep[..., :, None] & keep[..., None, :])     # statistics restricted to it
    fits = ownfit._solve(Hs, b * keep, support)
    theta, full, dg = _reference(H, b, keep)
    np.testing.assert_array_equal(fits.full, full)
    if support is None:                          # the rank-deficient clients are in the test
        assert not full[0, 4] and not full[1, 7] and not full[0, 9] and not full[1, 2]
    assert full[1, 11] and full.sum() >= 20
    # 1e-10 where the problem allows it; an ill-conditioned client's inverse is known to
    # about its condition number times eps whichever way it is computed
    cond = np.linalg.cond(H[1, 11][np.ix_(keep[1, 0] if keep.ndim > 1 else keep,
                                          keep[1, 0] if keep.ndim > 1 else keep)])
    assert 1e7 < cond < 1e11
    well = full.copy()
    well[1, 11] = False
    np.testing.assert_allclose(fits.theta[well], theta[well], rtol=1e-10, atol=0)
    np.testing.assert_allclose(fits.inv_diag[well | ~full], dg[well | ~full], rtol=1e-10,
                               atol=0)                                     # NaN where ~full
    np.testing.assert_allclose(fits.inv_diag[1, 11], dg[1, 11], rtol=100 * cond * 2.2e-16)
    np.testing.assert_allclose(fits.theta[1, 11], theta[1, 11], rtol=100 * cond * 2.2e-16)
    # where the data do not determine the model: the pseudo-inverse's minimum-norm solution
    np.testing.assert_allclose(fits.theta[~full], theta[~full], rtol=1e-8, atol=1e-12)
    assert (fits.theta[..., ~np.broadcast_to(keep, b.shape)] == 0).all()
    np.testing.assert_array_equal(st.determined(Hs, support), full)
    np.testing.assert_array_equal(fits.solutions()[~full], 0.0)


@pytest.mark.parametrize("block_diagonal", [False, True])
def test_intervals_equal_numpy_per_client(block_diagonal):
    """least_squares_intervals (one residual variance per target) against each client's
    textbook numbers: se_j = sqrt(s^2 (H^-1)_jj), s^2 = RSS / (n - p_k) of its target."""
    H, b, yy, n = _fleet(block_diagonal)
    blocks = (pers.NoiseBlocks(np.repeat([0, 1], 3), np.array([1, 1]), np.array([0, 1]))
              if block_diagonal else 1)
    theta, se, s2, dof = pers.least_squares_intervals(H, b, yy if block_diagonal
                                                      else yy[..., 0], n, blocks)
    ref_theta, full, dg = _reference(H, b, np.ones(6, bool))
    well = full.copy()
    well[1, 11] = False           # ill-conditioned: known to about cond * eps (test above)
    groups = [slice(0, 3), slice(3, 6)] if block_diagonal else [slice(0, 6)]
    for j, P in enumerate(groups):
        rss = yy[..., j] - np.einsum("smp,smp->sm", b[..., P], ref_theta[..., P])
        k = P.stop - P.start
        np.testing.assert_array_equal(dof[..., j], n - k)
        ref_s2 = rss / (n - k)
        np.testing.assert_allclose(s2[..., j][well], ref_s2[well], rtol=1e-10)
        ref_se = np.sqrt(ref_s2[..., None] * dg[..., P])
        np.testing.assert_allclose(se[..., P][well], ref_se[well], rtol=1e-10)
        np.testing.assert_allclose(se[1, 11, P], ref_se[1, 11], rtol=1e-4)
    assert np.isnan(se[~full]).all() and np.isfinite(se[full]).all()
    np.testing.assert_allclose(theta[well], ref_theta[well], rtol=1e-10)


def test_exact_zero_pivot_takes_the_eigenvalue_path():
    """A Gram matrix with a nonzero diagonal whose LU meets an exact zero pivot (two equal
    integer columns) makes its whole block take the rank rule's own path: same numbers."""
    X = np.tile(np.arange(1.0, 6.0)[:, None], (1, 3))
    X[:, 2] = [1.0, 0.0, 2.0, 0.0, 1.0]
    Xs = np.stack([X, np.eye(5, 3) + 1.0])[None]             # (1, 2, 5, 3)
    H = np.einsum("smtp,smtq->smpq", Xs, Xs)
    b = np.einsum("smtp,smt->smp", Xs, np.ones((1, 2, 5)))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.inv(H[0, 0])
    fits = ownfit._solve(H, b, None)
    theta, full, dg = _reference(H, b, np.ones(3, bool))
    np.testing.assert_array_equal(fits.full, [[False, True]])
    np.testing.assert_allclose(fits.theta, theta, rtol=1e-10)
    np.testing.assert_allclose(fits.inv_diag, dg, rtol=1e-10)


def test_own_fits_are_kept_for_the_same_arrays():
    H, b, _, _ = _fleet(False)
    first = ownfit.own_fits(H, b)
    assert ownfit.own_fits(H, b) is first                    # the same arrays: kept
    assert ownfit.own_fits(H.copy(), b) is not first         # other arrays: solved again
    sup = SUPPORTS[1]
    assert ownfit.own_fits(H, b, sup) is not first
    assert ownfit.own_fits(H, b, sup.copy()) is ownfit.own_fits(H, b, sup)


@pytest.mark.slow
def test_a_run_solves_the_clients_own_least_squares_once(monkeypatch):
    """strategy=oneshot with personalize=auto and the model check: the strategy, the
    intervals of its estimate, the clients' own intervals, auto's messages and the model
    check all read one computation of the clients' own fits."""
    calls = []
    solve = ownfit._solve

    def counted(H, b, support):
        calls.append((H.shape, support is None))
        return solve(H, b, support)

    monkeypatch.setattr(ownfit, "_solve", counted)
    r = execute(compose_cfg("system=synthetic", "strategy=oneshot", "personalize=auto", "R=1",
                            "repeats=2", "M=6", "N=2", "T=30", "output.plot=false"),
                choices={}, given=frozenset())
    assert r.summary["model_check"]["verdict"] is not None           # the check ran
    assert r.client_estimates is not None and r.summary["ci"]["estimates"]
    assert calls == [((2, 6, 15, 15), True)]


@pytest.mark.slow
def test_the_clients_residual_sums_are_computed_once_per_run(monkeypatch):
    """personalize=auto with centralized_exact: the personalized models, the pooled
    intervals' homogeneity test (ci.clients_differ) and the model check each need every
    client's own residual sums; they are made once (own_residual_sums, kept with the own
    fits) and equal a fresh computation."""
    import fnsysid
    from fnsysid.dynamics import model as dm
    from fnsysid.learning import ownfit_stats

    seen = []

    def counted(model, factor, theta):
        seen.append(theta.shape)
        return dm.residual_sums(model, factor, theta)

    from fnsysid.results import personal

    for module in (ownfit_stats, personal):                # wherever it is called from
        monkeypatch.setattr(module, "residual_sums", counted)
    res = fnsysid.run({"system": "synthetic", "M": 6, "N": 4, "T": 30, "R": 2, "repeats": 2,
                       "strategy": "centralized_exact", "personalize": "auto",
                       "output.plot": False, "progress": False})
    assert res.summary["model_check"]["verdict"] is not None
    assert "clients_differ" in res.summary["ci"]
    assert seen == [(2, 6, res.model.p)]
    data = res.dataset.train
    again = dm.residual_sums(res.model, data.factor, ownfit_stats.own_fits(data))
    np.testing.assert_array_equal(ownfit_stats.own_residual_sums(res.model, data), again)
