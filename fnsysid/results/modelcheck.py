"""Is the model class right? A check of each client's own fit on its held-out data.

Every client is fitted on its own training data (exact least squares, on the run's support
with ``sparsity``; :mod:`fnsysid.learning.ownfit_stats` makes these fits, this module the
statistics of the tests and the verdict), so that differences between clients
(heterogeneity) are not taken for a missing term. Three questions are asked of these fits
(derivation and thresholds: docs/ALGORITHMS.md, "Model check"):

- **correlation tests** (Billings and Voon 1986): the one-step residuals ``e`` of each target
  on the held-out trajectories should be uncorrelated with their own past (``phi_ee``), with
  the past and present states and inputs ``z`` (``phi_ze``), their centred squares
  (``phi_z2e``, and ``phi_z2e2`` with the centred squared residuals) and the past products
  ``e z`` (``phi_e(ez)``), at lags 0..:data:`LAGS`. Each client computes sums over its own
  samples (the lagged cross products, and their variances under a right model class, which
  include the own fit's estimation error through ``H^+``); the server adds them over the
  clients, so each test is one standard normal statistic ``Z = sum_i S_i / sqrt(sum_i V_i)``
  per repeat, target, variable and lag (Billings and Voon's band ``+-z / sqrt(N)`` on a
  pooled correlation of ``N`` samples), with a Bonferroni correction over every test of the
  run. A rejection counts where the pooled correlation ``Z / sqrt(N)`` is at least
  :data:`MATERIAL` too. A target whose only rejected test is a negative ``phi_ee`` at lag
  1 is not counted: that is the moving average that noise on the measured states leaves in
  the one-step residuals (``v_{t+1} - a v_t``, correlation ``-a / (1 + a^2)``, -0.5 for
  states that change little per step), not a missing term; ``measurement_noise`` names
  those targets and the run says so (least squares is then biased by the noise on its
  regressors, errors in variables; the free run judges the model).
- **held-out excess**: under the right class, a client's held-out sum of squared errors over
  its training noise variance is ``sum_t chi^2_1 + sum_k mu_k chi^2_1`` (held-out noise plus
  the estimation error along each direction, ``mu_k`` the eigenvalues of ``H^+ H_ho``),
  approximated by Satterthwaite's scaled chi-square and compared with the training noise by
  an F test per client and target. More p-values below :data:`EXCESS_LEVEL` than the
  binomial law allows, and at least the share :data:`EXCESS_SHARE` of them, is a term
  missing; otherwise a fit whose held-out error exceeds its
  training noise by more than :data:`OVERFIT` times, and whose expected ratio
  ``1 + trace(H^+ H_ho) / n_ho`` under the right class (its regressors alone: the
  estimation error's share, e.g. a single poorly determined direction with a large ``mu``)
  exceeds :data:`OVERFIT` too, is **overfit**: too many terms for its data. A high ratio
  where the expected one is near 1 is the noise of a short held-out set, not too many terms
  (the excess test judges whether a term is missing). Clients whose expected ratio exceeds
  :data:`OVERFIT` are left out of the pooled correlation tests.
- **free run** against the fit's own variability: each own fit is rolled out from each
  held-out trajectory's first state without noise (the observed free-run NRMSE) and
  :data:`REPLICATES` times as a right model would make the data: Gaussian noise on each
  state of the variance of its one-step residuals, parameters drawn from the fit's
  estimation error ``N(theta, s2 H^+)``. A client whose
  observed free run is worse than every replicate happens with probability
  ``1 / (REPLICATES + 1)`` under the right class (a Monte Carlo test; a free-run NRMSE
  below :data:`EXACT` is round-off and exceeds nothing); the fleet fails when
  the number of such clients is improbable under that binomial law (level :data:`LEVEL`),
  or when the median free run is worse than the best constant predictor (NRMSE
  :data:`CONSTANT`) and more clients run worse than the median of their own noisy runs
  than the binomial law of 1/2 allows (a sign test, level :data:`LEVEL`). At most
  :data:`CHECK_CLIENTS` clients are checked.

Held-out transitions beyond the range of a client's training data (a feature above
:data:`RANGE` times the largest magnitude it takes in training, :func:`sample_reach`) are
left out of its tests: a model is checked where its training data reach
(``extrapolating``).

``ok`` is True when no test rejects (overfit clients do not make it False), False when one
does, None when nothing could be checked (short held-out trajectories). ``verdict``: ``ok``,
``overfit``, ``missing terms`` (correlation tests or held-out excess) or ``free run fails``.
"""

from __future__ import annotations

import numpy as np

from fnsysid.dynamics.model import equilibration
from fnsysid.learning.ownfit_stats import PseudoInverses, own_fit_statistics
from fnsysid.learning.privacy import MOVED_LEVEL, noise_size
from fnsysid.results.metrics import HeldOutScores, over_clients

#: family-wise level of each of the three tests
LEVEL = 0.01
#: largest lag of the correlation tests
LAGS = 10
#: fewest held-out transitions of a client for its tests
MIN_SAMPLES = 20
#: smallest pooled correlation |Z| / sqrt(N) of a rejected correlation test that counts: on
#: a large fleet the band z / sqrt(N) falls below any correlation that matters; right
#: libraries fitted with condition numbers near 1e7 leave up to 0.13 (Lotka-Volterra and
#: Duffing, degree 3, 20 seeds each), missing terms 0.5-0.9 (Duffing and pendulum with a
#: linear library, CartPole)
MATERIAL = 0.15
#: held-out over training mean squared error above which an own fit whose excess the F test
#: explains counts as overfitted, when its expected ratio (its estimation error's share) is
#: above it too; and the expected ratio above which a client stays out of the pooled
#: correlation tests
OVERFIT = 1.5
#: level of each client-target's held-out excess test; the fleet fails when more of them
#: fall below it than the binomial law of that level allows (at :data:`LEVEL`)
EXCESS_LEVEL = 0.001
#: smallest share of the client-targets below :data:`EXCESS_LEVEL` that makes the fleet
#: fail: a missing term is a property of the class and shows in many clients, while the
#: test's approximations (Gaussian estimation errors of covariance ``s2 H^+``) leave a few
#: percent of a right class's ill-conditioned fits below 0.01 (Lotka-Volterra: 1.5-5.5 %)
EXCESS_SHARE = 0.1
#: noisy free runs of each own fit (the Monte Carlo test's level per client: 1 / 20)
REPLICATES = 19
#: free-run NRMSE of the best constant predictor (the held-out mean of each state): a
#: median free run above it fails where more clients than chance allows run worse than the
#: median of their own noisy runs
CONSTANT = 1.0
#: most clients checked (the first ones with enough held-out data; the pooled tests have
#: ample power with them, and the check's cost stays that of a few thousand clients)
CHECK_CLIENTS = 2000
#: residuals below this share of the target's spread are exact (round-off)
EXACT = 1e-9
#: a held-out transition with a feature beyond this many times its largest training magnitude
#: is left out of the client's tests (the fit extrapolates there); within it, as held-out
#: runs from random starts go a little beyond the training runs, it is tested
RANGE = 2.0
#: residuals below the own fit's solve rounding count as exact only below this share of the
#: target's spread; above it the target is ``unresolved`` (the fit is its rounding)
RESOLVED = 1e-6
#: kinds of correlation test, with the lags they take
KINDS = ("ee", "ze", "z2e", "z2e2", "e(ez)")


def _lag(a: np.ndarray, k: int) -> tuple[np.ndarray, slice]:
    """``a`` (..., T) shifted by ``k`` along time: the values at ``t - k`` for t in the slice
    returned (``k:``)."""
    return (a if k == 0 else a[..., :-k]), slice(k, None)


def correlation_sums(E, w, G, A, Hplus, Z, sigma2, s2_train, dof_train, lags: int = LAGS):
    """Per-client sums of the correlation tests of one target.

    ``E`` (S, m, J, T) held-out residuals, ``w`` (S, m, J, T) 0/1 where a transition exists,
    ``G`` (S, m, J, T, p) each residual's gradient in the parameters, ``A`` = ``G H^+``
    (``Hplus`` (S, m, p, p) the pseudo-inverse of the training Gram matrix),
    ``Z`` (S, m, J, T, n_z) the variables (states and inputs at the transition's start),
    ``sigma2`` (S, m) the residual variance on the held-out data, ``s2_train`` and
    ``dof_train`` (S, m) the training residual variance and its degrees of freedom. Returns
    ``num, var`` (S, m, tests) (the statistic's excess over its mean under the right class and
    its variance) and the names of the tests, ``(kind, variable, lag)``.

    The variables and their squares are centred by their running mean over the trajectory up
    to each sample (:func:`_causal_centred`), not by a mean over all held-out samples: such a
    mean holds samples later than ``t``, which depend on the noise at ``t`` (an AR(1) at 0.8
    would get a bias of ``-sigma^2 / (1 - a)`` in ``sum_t e_t z_t``). The squared residuals
    are centred by their expectation under the right class, ``s2_train (1 + h_t)``
    (``h_t = g_t' H^+ g_t``).
    """
    sig = sigma2[..., None, None]
    e = E * w
    h = (G * A).sum(axis=-1)
    GR = G @ _root(Hplus)[:, :, None]          # g_t' R, R R' = H^+ (:func:`_quadratic_var`)
    s2t = np.nan_to_num(s2_train)[..., None, None]
    e2 = (E * E - s2t * (1 + h)) * w
    n = w.sum(axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        v_e2 = (e2 * e2).sum(axis=(-2, -1)) / np.maximum(n, 1)
        # the variance s2_train's own error adds to sum_t e2_t z2_t: 2 s2^2 / dof (chi-square)
        v_s2 = np.where(dof_train > 0, 2 * np.nan_to_num(s2_train) ** 2
                        / np.maximum(dof_train, 1), 0.0)
    Zw = _causal_centred(Z, w) * w[..., None]
    Z2 = _causal_centred(Z * Z, w) * w[..., None]
    eZ = e[..., None] * Zw
    nums, vars_, names = [], [], []

    def add(num, var, kind, v, k):
        nums.append(num)
        vars_.append(var)
        names.append((kind, v, k))

    for k in range(1, lags + 1):                          # phi_ee: bias sigma^2 g_t H^+ g_{t-k}
        if k >= E.shape[-1]:
            break
        past, now = _lag(e, k)[0], e[..., k:]
        bias = ((G[..., k:, :] * A[..., :-k, :]).sum(axis=-1) * w[..., k:] * w[..., :-k]
                ).sum(axis=(-2, -1))
        ww = w[..., k:] * w[..., :-k]
        # the noise's share and the estimation error's (sum_t h_t + h_{t-k}), and the
        # variance of its quadratic part delta' B delta, B = sum_t g_t g_{t-k}': one draw of
        # delta per client (:func:`_quadratic_var`)
        spread = (ww * (1 + h[..., k:] + h[..., :-k])).sum(axis=(-2, -1))
        quad = _quadratic_var(GR[..., k:, :] * ww[..., None], GR[..., :-k, :, None])
        add((now * past).sum(axis=(-2, -1)) - sigma2 * bias,
            sigma2 ** 2 * (spread + quad[..., 0]), "ee", None, k)
    for k in range(0, lags + 1):
        if k >= E.shape[-1]:
            break
        sl = slice(k, None)
        zp = Zw if k == 0 else Zw[..., :-k, :]               # z at t - k
        z2p = Z2 if k == 0 else Z2[..., :-k, :]
        en, e2n, wn = e[..., sl], e2[..., sl], w[..., sl]
        nz = zp.shape[-1]
        Zs = np.concatenate([zp, z2p], axis=-1)               # z and z^2 at t - k
        C = _tdot(G[..., sl, :] * wn[..., None], Zs)          # sum_t g_t z_{t-k}, (S, m, p, .)
        q = (C * (Hplus @ C)).sum(axis=-2)                    # c' H^+ c
        L = _tdot(np.stack([en, e2n, (1 + h[..., sl]) * wn], axis=-1), Zs)   # (S, m, 3, .)
        # over the pairs (t - k, t) that both exist: a z whose partner residual is past the
        # trajectory's end (a shorter trajectory padded to a block's longest) adds nothing
        zz = (Zs * Zs * wn[..., None]).sum(axis=(2, 3))
        num, num2 = L[:, :, 0, :nz], L[:, :, 0, nz:]
        var = sig[..., 0] * (zz[..., :nz] + q[..., :nz])
        var2 = sig[..., 0] * (zz[..., nz:] + q[..., nz:])
        num22, lz = L[:, :, 1, nz:], L[:, :, 2, nz:]
        # the squared residuals' spread v_e2 holds the noise's share and, on average, the
        # estimation error's at t = s (E = 2 sigma^4 (1 + h)^2): scaled to the noise's and
        # the linear share, 2 sigma^4 sum_t (1 + 2 h_t) z^4, and the quadratic part's whole
        # variance added (B = sum_t g_t g_t' z^2_{t-k}, :func:`_quadratic_var`)
        hs = h[..., sl] * wn
        z4 = z2p ** 2 * wn[..., None]
        lin = _tdot((1 + 2 * hs)[..., None], z4)[:, :, 0]
        mean_sq = ((1 + hs) ** 2 * wn).sum(axis=(-2, -1)) / np.maximum(wn.sum(axis=(-2, -1)), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            shrink = np.where(zz[..., nz:] > 0, lin / (mean_sq[..., None] * zz[..., nz:]), 1.0)
        var22 = (v_e2[..., None] * zz[..., nz:] * shrink + v_s2[..., None] * lz ** 2
                 + sigma2[..., None] ** 2 * _quadratic_var(
                     GR[..., sl, :] * wn[..., None], GR[..., sl, :, None] * z2p[..., None, :]))
        for v in range(Z.shape[-1]):
            add(num[..., v], var[..., v], "ze", v, k)
            add(num2[..., v], var2[..., v], "z2e", v, k)
            add(num22[..., v], var22[..., v], "z2e2", v, k)
        if k + 1 < E.shape[-1]:                               # phi_e(ez): e_t (e z)_{t-1-k}
            j = k + 1
            ezp = eZ[..., :-j, :]
            nowj = e[..., j:]
            ga = (G[..., j:, :] * A[..., :-j, :]).sum(axis=-1) * w[..., j:]
            # the sum of the squared terms: the variance of a sum of martingale differences,
            # robust to a noise whose variance changes with the state
            L3 = _tdot(np.stack([ga, nowj], axis=-1), np.concatenate([Zw[..., :-j, :], ezp],
                                                                      axis=-1))
            nz = ezp.shape[-1]
            num3 = L3[:, :, 1, nz:] - sigma2[..., None] * L3[:, :, 0, :nz]
            var3 = _tdot((nowj * nowj)[..., None], ezp * ezp)[:, :, 0]
            # on average the squared terms hold sigma^4 z^2 ((1 + h_t)(1 + h_{t-j}) + 2 c_t^2)
            # (c_t = g_t' H^+ g_{t-j}): scaled to the noise's and the linear share,
            # sigma^4 z^2 (1 + h_t + h_{t-j}), and the quadratic part delta' B delta's whole
            # variance added (B = sum_t g_t (z g)'_{t-j}, one draw of delta per client)
            z2 = Zw[..., :-j, :] ** 2
            hn, hp = h[..., j:] * w[..., j:], h[..., :-j] * w[..., j:]
            lin = _tdot((w[..., j:] + hn + hp)[..., None], z2)[:, :, 0]
            full = _tdot((w[..., j:] + hn + hp + hn * hp + 2 * ga * ga)[..., None], z2)[:, :, 0]
            with np.errstate(divide="ignore", invalid="ignore"):
                var3 = (var3 * np.where(full > 0, lin / full, 1.0)
                        + sigma2[..., None] ** 2 * _quadratic_var(
                            GR[..., j:, :] * w[..., j:, None],
                            GR[..., :-j, :, None] * Zw[..., :-j, None, :]))
            for v in range(Z.shape[-1]):
                add(num3[..., v], var3[..., v], "e(ez)", v, k)
    return np.stack(nums, -1), np.stack(vars_, -1), names


#: numbers of the p x p matrices :func:`_quadratic_var` holds at once (its clients in chunks)
QUAD_VALUES = 1 << 22


def _root(Hplus: np.ndarray) -> np.ndarray:
    """A factor ``R`` (S, m, p, p) with ``R R' = H^+`` (``H^+`` positive semi-definite)."""
    lam, V = np.linalg.eigh(Hplus)
    return V * np.sqrt(np.maximum(lam, 0.0))[..., None, :]


def _quadratic_var(Ga: np.ndarray, Gb: np.ndarray) -> np.ndarray:
    """``2 tr((B_s H^+)^2)`` (S, m, v) with ``B = sum_t a_t b_t'`` per variable ``v``, from
    the vectors whitened by a factor of ``H^+`` (:func:`_root`): ``Ga`` = ``a_t' R``
    (S, m, J, T, p), ``Gb`` = ``b_t' R`` (S, m, J, T, p, v). ``B_s`` is ``B``'s symmetric
    part; the value is the variance of ``delta' B delta`` for ``delta ~ N(0, H^+)`` (times
    ``sigma^4``): with ``N = R' B R``, ``2 ||(N + N') / 2||_F^2 = ||N||_F^2 + tr(N N)``.
    The clients go in chunks of at most :data:`QUAD_VALUES` numbers of ``N``."""
    S, m = Ga.shape[:2]
    p, nv = Gb.shape[-2:]
    out = np.empty((S, m, nv))
    step = max(1, QUAD_VALUES // max(1, S * p * p * nv))
    for lo in range(0, m, step):
        c = slice(lo, lo + step)
        gb = Gb[:, c]
        N = _tdot(Ga[:, c], gb.reshape(*gb.shape[:4], p * nv)).reshape(S, -1, p, p, nv)
        out[:, c] = (N * N).sum(axis=(2, 3)) + np.einsum("smijv,smjiv->smv", N, N)
    return out


def _tdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum_{j, t} a[s, m, j, t, :]' b[s, m, j, t, :]``, (S, m, a's last, b's last): one
    batched matrix product over the clients."""
    S, m = a.shape[:2]
    return np.matmul(a.reshape(S, m, -1, a.shape[-1]).swapaxes(-1, -2),
                     b.reshape(S, m, -1, b.shape[-1]))


def _causal_centred(Z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Z`` (S, m, J, T, n) minus its mean over each trajectory's samples up to and
    including ``t`` (``w`` (S, m, J, T) marks the samples): a function of the past only."""
    count = np.maximum(np.cumsum(w, axis=-1), 1)[..., None]
    return Z - np.cumsum(Z * w[..., None], axis=-2) / count


def _tail_normal(z: np.ndarray) -> np.ndarray:
    """Two-sided standard normal tail ``P(|N(0, 1)| > |z|)``."""
    from scipy.special import ndtr

    return 2 * ndtr(-np.abs(z))


#: the per-client statistics of the check whose values are 0/1 (floats, as a Flower client
#: sends them)
FLAGS = ("exact", "high", "s2_ok", "exceed", "tried", "unresolved")


def test_names(n_z: int, lags: int = LAGS) -> list[tuple]:
    """Every correlation test of one target, ``(kind, variable, lag)``, in the order of
    :func:`correlation_sums` on trajectories longer than ``lags + 1`` transitions (shorter
    ones leave the tests of the longer lags out: their sums are 0 there)."""
    names = [("ee", None, k) for k in range(1, lags + 1)]
    for k in range(0, lags + 1):
        names += [(kind, v, k) for v in range(n_z) for kind in ("ze", "z2e", "z2e2")]
        names += [("e(ez)", v, k) for v in range(n_z)]
    return names


def empty_statistics(model, S: int, M: int) -> dict[str, np.ndarray]:
    """The per-client statistics (:func:`client_statistics`) of clients that were not
    checked: no held-out samples, nothing to add."""
    n_y = model.structure.shape[0]
    n_t = len(test_names(model.system.n_x + model.system.n_u))
    nan = np.full((S, M), np.nan)
    return {"n_ho": np.zeros((S, M)), "one": nan.copy(), "s2_ok": np.zeros((S, M)),
            "ratio": np.full((S, M, n_y), np.nan), "p_excess": np.full((S, M, n_y), np.nan),
            "mu_top": np.full((S, M, n_y), np.nan), "expected": np.full((S, M, n_y), np.nan),
            "exact": np.zeros((S, M, n_y)),
            "num": np.zeros((S, M, n_y, n_t)), "var": np.zeros((S, M, n_y, n_t)),
            "n_pool": np.zeros((S, M, n_y)), "client_z": np.zeros((S, M)),
            "high": np.zeros((S, M)), "cond": nan.copy(), "reach": nan.copy(),
            "n_in": np.zeros((S, M)), "unresolved": np.zeros((S, M, n_y)),
            "sim": nan.copy(), "ref": nan.copy(), "ref_mean": nan.copy(),
            "exceed": np.zeros((S, M)), "tried": np.zeros((S, M))}


def checked_clients(n_ho: np.ndarray) -> np.ndarray:
    """The clients the check uses (M,): the first :data:`CHECK_CLIENTS` (in the clients'
    order) with :data:`MIN_SAMPLES` held-out transitions in some repeat."""
    enough = (n_ho >= MIN_SAMPLES).any(axis=0)
    keep = np.zeros(enough.shape, bool)
    keep[np.flatnonzero(enough)[:CHECK_CLIENTS]] = True
    return keep


def correlation_statistics(model, data, heldout, fits, support=None,
                           clients: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each client's statistics of the correlation and held-out excess tests on its own held-out
    data (:func:`empty_statistics`' keys but the free run's), each (S, M, ...); ``clients``
    (M,): those computed (None: every client with enough held-out data); ``fits``:
    :func:`fnsysid.learning.ownfit_stats.own_fit_statistics`. A client's values depend on its
    own data only."""
    from scipy.special import fdtrc

    Hplus, theta, s2_tr, dof_tr = fits
    S, M = heldout.n.shape
    St = model.structure                                             # (n_y, n_phi, p)
    n_y = St.shape[0]
    st = empty_statistics(model, S, M)
    st["n_ho"] = np.asarray(heldout.n, float)
    st["s2_ok"] = np.isfinite(s2_tr).all(-1).astype(float)
    with np.errstate(all="ignore"):
        st["one"] = np.where(heldout.n > 0, HeldOutScores(model, heldout).one_step(theta),
                             np.nan)
    enough = heldout.n >= MIN_SAMPLES
    pick = enough.any(axis=0) if clients is None else clients & enough.any(axis=0)
    n_z = model.system.n_x + model.system.n_u
    where = {name: i for i, name in enumerate(test_names(n_z))}
    ratio, p_excess, mu_top, exact = st["ratio"], st["p_excess"], st["mu_top"], st["exact"]
    with np.errstate(all="ignore"):
        for block in heldout.blocks:
            keep = np.flatnonzero(pick[block.clients])
            if not len(keep):
                continue
            c = block.clients[keep]
            bx, bu, bmask = block.x[:, keep], block.u[:, keep], block.mask[:, keep]
            Phi, Y = model.regression(bx, bu)                          # (S, m, J, T, .)
            Th = model.theta_matrix(theta[:, c])                     # (S, m, n_y, n_phi)
            E = Y - np.einsum("smyk,smjtk->smjty", Th, Phi)
            w_all = (bmask[..., 1:] & bmask[..., :-1]).astype(float)
            # only the transitions within the range of the client's training data are
            # tested: a model is checked where its training data reach (:func:`sample_reach`)
            r = sample_reach(Phi, w_all, data, c, St, support)
            st["reach"][:, c] = r.max(axis=(-2, -1))                    # 0 where none
            w = w_all * (r <= RANGE)
            st["n_in"][:, c] = n = w.sum(axis=(-2, -1))
            Xs = bx[..., :-1, :]
            Zv = np.concatenate([Xs, bu[..., :Xs.shape[-2], :]], axis=-1)
            Hp = Hplus[:, c]
            floor = _solve_floor(data.H[:, c], support)               # (S, m)
            per_target = []
            expected = np.ones((S, len(c), n_y))
            for j in range(n_y):
                # the target's own parameters (the columns of St[j] that are not 0): every
                # quantity below is a quadratic form g' H^+ g of its gradients, which are 0
                # elsewhere, so the block of H^+ on them gives the same values at a fraction
                # of the cost (a third on a system of three states)
                own = np.flatnonzero(np.any(St[j] != 0, axis=0))
                G = Phi @ St[j][:, own]                               # (S, m, J, T, p_j)
                Hj = Hp[..., own[:, None], own]                       # (S, m, p_j, p_j)
                A = G @ Hj[:, :, None]                                # G H^+
                h = (G * A).sum(axis=-1)                              # held-out leverage
                e = E[..., j]
                sse = (e * e * w).sum(axis=(-2, -1))
                spread = _spread(Y[..., j], w)
                # exact: residuals at the rounding of the target's spread, or of the solve
                # itself (its relative error up to eps times the equilibrated condition
                # number of the Gram matrix, times the target's size)
                size = np.sqrt((Y[..., j] ** 2 * w).sum(axis=(-2, -1)) / np.maximum(n, 1))
                rms = np.sqrt(sse / np.maximum(n, 1))
                tiny = np.maximum(spread, np.finfo(float).tiny)
                ex = rms <= np.maximum(EXACT * tiny, np.minimum(floor * size, RESOLVED * tiny))
                # residuals at the solve's rounding but not small against the spread: the
                # fit cannot be told from its rounding; not tested, and said so
                st["unresolved"][:, c, j] = (~ex & (rms <= floor * size) & (n > 0))
                ex = ex | st["unresolved"][:, c, j].astype(bool)
                exact[:, c, j] = ex & (n > 0)
                # held-out excess: sse / s2 ~ chi^2_n + sum_k mu_k chi^2_1 (Satterthwaite)
                Gho = np.einsum("smjtp,smjt,smjtq->smpq", G, w, G)
                B = Hj @ Gho
                m1 = np.trace(B, axis1=-2, axis2=-1)
                m2 = np.einsum("smpq,smqp->sm", B, B)
                mu_top[:, c, j] = np.linalg.eigvals(B).real.max(axis=-1) / np.maximum(m1, 1e-300)
                g = (n + m2) / (n + m1)
                hh = (n + m1) ** 2 / (n + m2)
                s2 = s2_tr[:, c, j]
                stat = sse / s2 / (g * hh)
                ok_f = (n >= MIN_SAMPLES) & ~ex & (dof_tr[:, c, j] > 0)
                p_excess[:, c, j] = np.where(ok_f, np.where(
                    s2 > 0, fdtrc(hh, np.maximum(dof_tr[:, c, j], 1), stat), 0.0), np.nan)
                ratio[:, c, j] = np.where(n > 0, sse / n / s2, np.nan)
                expected[:, :, j] = np.where(ex, 1.0, 1 + m1 / np.maximum(n, 1))
                sigma2 = sse / np.maximum((w * (1 + h)).sum(axis=(-2, -1)), 1e-300)
                per_target.append((e, w, G, A, Hj, sigma2, ex))
            # clients that predict their held-out data much worse than their training noise
            # where their own estimation error is expected to add that much too (overfit, or a
            # term missing: the excess test tells); a ratio above OVERFIT on a fit whose
            # expected ratio is near 1 is the held-out data's noise (39 held-out samples put
            # 3 % of such ratios above 1.5), or a missing term, not too many terms
            st["expected"][:, c] = expected
            over_c = ((ratio[:, c] > OVERFIT) & (expected > OVERFIT)
                      & ~exact[:, c].astype(bool)).any(-1)
            st["high"][:, c] = over_c & (n >= MIN_SAMPLES)
            # clients whose estimation error is expected to add more than OVERFIT - 1 of the
            # noise on their held-out data stay out of the pooled tests: a rule on their
            # regressors alone, since one on their held-out residuals (the ratio above) keeps
            # the clients whose error happens to be small and biases the sums
            loose = (expected > OVERFIT).any(-1)
            for j, (e, w_, G, A, Hj, sigma2, ex) in enumerate(per_target):
                pool = (n >= MIN_SAMPLES) & ~ex & ~loose & (sigma2 > 0)          # (S, m)
                st["n_pool"][:, c, j] = np.where(pool, n, 0)
                # the sums of the clients pooled in some repeat only (the others add nothing)
                k = np.flatnonzero(pool.any(axis=0))
                if not len(k):
                    continue
                num, var, labels = correlation_sums(
                    e[:, k], w_[:, k], G[:, k], A[:, k], Hj[:, k], Zv[:, k], sigma2[:, k],
                    s2_tr[:, c[k], j], dof_tr[:, c[k], j])
                num = np.where(pool[:, k, None], num, 0.0)
                var = np.where(pool[:, k, None], var, 0.0)
                zc = np.abs(num) / np.sqrt(np.where(var > 0, var, np.inf))
                st["client_z"][:, c[k]] = np.maximum(st["client_z"][:, c[k]], zc.max(axis=-1))
                at = [where[name] for name in labels]
                st["num"][:, c[k][:, None], j, at] = num
                st["var"][:, c[k][:, None], j, at] = var
    for s, m in zip(*np.nonzero(st["high"]), strict=True):      # the overfit's detail
        H = data.H[s, m]
        keep = (np.ones(H.shape[0], bool) if support is None
                else np.asarray(support, bool)[s])
        if not keep.any():                 # no term kept: no Gram matrix to condition
            continue
        g = H[np.ix_(keep, keep)]
        sc = equilibration(np.diagonal(g))                   # independent of the units
        ev = np.linalg.eigvalsh(g * sc[:, None] * sc[None, :])
        st["cond"][s, m] = ev[-1] / ev[0] if ev[0] > 0 else np.inf
    return st


def _solve_floor(H: np.ndarray, support=None) -> np.ndarray:
    """The relative rounding of the own fits' normal-equation solve (S, m): machine epsilon
    times the condition number of each client's equilibrated Gram matrix on the kept terms
    (infinite where it is singular). Residuals below it times the target's size are the
    solve's rounding, not noise: a position logged with an offset of 273.15, updated exactly
    (``x+ = x + dt v``), leaves residuals of 4e-9 to 3e-8 from a Gram matrix of condition
    3e6, far above 1e-9 of its spread, and the correlation tests read that rounding as a
    missing term."""
    if support is not None:
        keep = np.asarray(support, float)[:, None, :]
        H = H * keep[..., :, None] * keep[..., None, :]
    d = equilibration(np.diagonal(H, axis1=-2, axis2=-1), fill=0.0)
    ev = np.linalg.eigvalsh(H * d[..., :, None] * d[..., None, :])
    top = ev[..., -1]
    low = np.where(ev > top[..., None] * 1e-15, ev, np.inf).min(axis=-1)   # as pinv keeps them
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(top <= 0, 0.0,              # no kept term: nothing solved, no rounding
                        np.where(np.isfinite(low) & (low > 0), np.finfo(float).eps * top / low,
                                 np.inf))


def sample_reach(Phi: np.ndarray, w: np.ndarray, data, c: np.ndarray, St: np.ndarray,
                 support=None) -> np.ndarray:
    """How far each held-out transition of the clients ``c`` goes beyond their training data
    (S, m, J, T): the largest ``|phi_tk| / max_s |phi_sk|`` over the features ``k`` that the
    model's kept coefficients use (``s`` over the client's training samples,
    ``data.phimax``; infinite where a feature is 0 in every training sample and not in the
    transition). Above 1, the transition has a feature beyond the largest value it takes in
    training; above :data:`RANGE` it is left out of the tests (docs/ALGORITHMS.md, "Model
    check")."""
    used = np.abs(St).sum(axis=0)                                              # (n_phi, p)
    if support is None:
        use = np.broadcast_to(used.sum(axis=-1) > 0, (Phi.shape[0], Phi.shape[-1]))
    else:
        use = (used @ np.asarray(support, float).T).T > 0                      # (S, n_phi)
    top = data.phimax[:, c][:, :, None, None, :]                               # (S, m, 1, 1, k)
    a = np.abs(Phi)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(top > 0, a / top, np.where(a > 0, np.inf, 0.0))
    r = np.where(use[:, None, None, None, :], over, 0.0).max(axis=-1)
    return np.where(w > 0, r, 0.0)


def client_statistics(model, data, heldout, key, support=None,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """What one client computes for the check on its own data and sends (a Flower client
    after the last round): :func:`correlation_statistics` and the free run's
    (:func:`free_run_statistics`) of every client whose free run the server may count (it
    picks them, :func:`combine`); ``data``/``heldout`` of this client alone (S, 1, ...),
    ``key`` its label (its own random stream)."""
    fits = own_fit_statistics(model, data, support)
    st = correlation_statistics(model, data, heldout, fits, support)
    # every client the server may count: whether an overfit one is left out depends on the
    # fleet's excess test (:func:`_excess`)
    use = (st["n_in"] >= MIN_SAMPLES) & (st["s2_ok"] > 0.5)
    st.update(free_run_statistics(model, heldout, fits, use, [key], seed))
    return st


def _free_run_use(st: dict, chosen: np.ndarray, level: float) -> np.ndarray:
    """The clients whose free runs the test counts (S, M): checked, with enough held-out
    transitions within the range of their training data and a training noise, not
    overfit."""
    overfit = _excess(st, level)[-1]
    return ((st["n_in"] >= MIN_SAMPLES) & chosen & ~overfit & (st["s2_ok"] > 0.5)
            & ~(st["unresolved"] > 0.5).any(axis=-1))


def _excess(st: dict, level: float):
    """The fleet's held-out excess test on the statistics ``st`` (of the checked clients):
    the client-targets below :data:`EXCESS_LEVEL`, their count and number per repeat, the
    binomial p-value and share per repeat, those left unexplained (a term missing) and the
    overfit clients."""
    from scipy.special import bdtrc

    p_excess = st["p_excess"]
    S = p_excess.shape[0]
    small = np.isfinite(p_excess) & (p_excess < EXCESS_LEVEL)
    k_small, n_excess = small.sum(axis=(1, 2)), np.isfinite(p_excess).sum(axis=(1, 2))
    p_fleet = np.where(k_small > 0, bdtrc(np.maximum(k_small - 1, 0), np.maximum(n_excess, 1),
                                          EXCESS_LEVEL), 1.0)
    share = k_small / np.maximum(n_excess, 1)
    unexplained = small & ((p_fleet * S < level) & (share >= EXCESS_SHARE))[:, None, None]
    overfit = (st["high"] > 0.5) & ~unexplained.any(-1)
    return k_small, p_fleet, unexplained, overfit


#: statistics the server only sums over the checked clients: :func:`_only` keeps just the
#: checked clients' rows of these (the largest, (S, M, n_y, tests)), not a masked copy of all
SUMMED = ("num", "var")


def _only(st: dict, chosen: np.ndarray) -> dict:
    """The statistics of the ``chosen`` clients (M,), the others' as not checked; of
    :data:`SUMMED` only the chosen clients' rows (S, chosen, ...), whose sums over the clients
    are the same."""
    S, M = st["n_ho"].shape
    empty = {k: v[:, :1] for k, v in empty_statistics_like(st).items()}
    return {k: (v if k in ("n_ho", "one") else
                (v if chosen.all() else v[:, chosen]) if k in SUMMED else
                np.where(chosen.reshape((1, M) + (1,) * (v.ndim - 2)), v, empty[k]))
            for k, v in st.items()}


def empty_statistics_like(st: dict) -> dict:
    """One client's values of not being checked, shaped as the statistics ``st``."""
    out = {}
    for k, v in st.items():
        fill = np.nan if k in ("one", "ratio", "p_excess", "mu_top", "expected", "cond",
                               "reach", "sim", "ref", "ref_mean") \
            else 0.0
        out[k] = np.full((v.shape[0], 1) + v.shape[2:], fill)
    return out


def model_check(model, data, heldout, support=None, level: float = LEVEL,
                seed: int = 0, keys=None) -> dict | None:
    """The check of the module docstring: ``{ok, verdict, ...}`` for ``summary.json`` (None
    without held-out data). ``seed``: the root of the free-run test's noise; ``keys``: the
    clients' labels (default ``0..M-1``), which name each client's own random stream, so that
    a client draws the same noise wherever it is checked (:func:`client_statistics`)."""
    if heldout is None or not (heldout.n > 0).any():
        return None
    if not (heldout.n >= MIN_SAMPLES).any():           # nothing to test: no work
        return _nothing()
    S, M = heldout.n.shape
    keys = [str(m) for m in range(M)] if keys is None else [str(k) for k in keys]
    chosen = checked_clients(heldout.n)
    fits = _checked_fits(model, data, support, chosen)
    st = correlation_statistics(model, data, heldout, fits, support, chosen)
    use = _free_run_use(st, chosen, level)
    st.update(free_run_statistics(model, heldout, fits, use, keys, seed))
    return combine(model, st, support, level)


def _checked_fits(model, data, support, chosen: np.ndarray):
    """:func:`~fnsysid.learning.ownfit_stats.own_fit_statistics` of the ``chosen`` clients
    (M,) only, in the clients' order (S, M, ...): NaN parameters and noise for the others,
    whose statistics the check does not count. The pseudo-inverses stay those of all clients,
    made for the clients asked."""
    if chosen.all():
        return own_fit_statistics(model, data, support)
    idx = np.flatnonzero(chosen)
    _, theta, s2, dof = own_fit_statistics(model, data.take(idx), support)
    S, M = data.n.shape
    out = []
    for a in (theta, s2, dof):
        full = np.full((S, M) + a.shape[2:], np.nan)
        full[:, idx] = a
        out.append(full)
    return (PseudoInverses(data, support), *out)


#: why a check judged nothing where the held-out trajectories are all too short
SHORT = f"no client has {MIN_SAMPLES} held-out transitions"
#: the most free-run NRMSE (mean over clients) that :func:`free_run_warning` puts down to a
#: right model's noise on held-out trajectories too short for the check: fits near the
#: truth (N = 50 a client, T = 5, 200 clients, 3 repeats of synthetic, linear and pendulum)
#: scored 0.42-0.97 on average and at most 2.3 for any one client
SHORT_NOISE = 3.0


def _nothing() -> dict:
    return {"ok": None, "verdict": None, "white": None, "test": "billings-voon",
            "tests": 0, "reason": SHORT}


def combine(model, st: dict, support=None, level: float = LEVEL) -> dict | None:
    """The check from the clients' statistics ``st`` (:func:`client_statistics`, each
    (S, M, ...) in the clients' order), as the server adds them: each correlation test is
    ``sum_i S_i / sqrt(sum_i V_i)`` over the checked clients (:func:`checked_clients`)."""
    from scipy.special import bdtrc

    n_ho = st["n_ho"]
    if not (n_ho > 0).any():
        return None
    if not (n_ho >= MIN_SAMPLES).any():
        return _nothing()
    S, M = n_ho.shape
    chosen = checked_clients(n_ho)
    st = _only(st, chosen)
    names = [str(t) for t in model.system.target_names]
    n_y = len(names)
    n_z = model.system.n_x + model.system.n_u
    labels = test_names(n_z)
    ratio, mu_top = st["ratio"].copy(), st["mu_top"]
    unresolved = st["unresolved"] > 0.5
    exact = (st["exact"] > 0.5) & ~unresolved
    client_z = st["client_z"]
    with np.errstate(all="ignore"):
        num_sum, den_sum = st["num"].sum(axis=1), st["var"].sum(axis=1)    # (S, n_y, tests)
        n_pool = st["n_pool"].sum(axis=1)                                 # (S, n_y)
        Zp = num_sum / np.sqrt(den_sum)
        r = Zp / np.sqrt(n_pool[..., None])
        pz = np.where(den_sum > 0, _tail_normal(Zp), np.nan)
    tests = int(np.isfinite(pz).sum())
    rejected = np.isfinite(pz) & (pz * max(tests, 1) < level) & (np.abs(r) >= MATERIAL)
    # noise on the measured states: a target whose only rejected test is a negative phi_ee
    # at lag 1 (an MA(1) residual) is not counted as a missing term
    lag1 = labels.index(("ee", None, 1))
    noisy = (rejected[..., lag1] & (r[..., lag1] < 0)
             & (rejected.sum(axis=-1) == 1))                                # (S, n_y)
    rejected[..., lag1] &= ~noisy
    white = None if not tests else bool(not rejected.any())
    p_min = float(np.nanmin(pz)) if tests else None
    variables = list(model.system.state_names) + list(model.system.input_names)
    worst = None
    if tests:
        # the most significant material test (else the most significant one)
        key = np.where(np.isfinite(pz), pz, np.inf) + np.where(np.abs(r) >= MATERIAL, 0, 2)
        s, j, t = np.unravel_index(np.argmin(key), pz.shape)
        kind, v, k = labels[t]
        worst = {"repeat": int(s), "target": names[j], "test": _label(kind, v, variables),
                 "lag": int(k), "Z": _num(Zp[s, j, t]), "correlation": _num(r[s, j, t]),
                 "client": int(np.argmax(client_z[s]))}
    by_target = {names[j]: _num(np.nanmin(pz[:, j]) if np.isfinite(pz[:, j]).any()
                                else np.nan) for j in range(n_y)}
    ratio[exact | unresolved] = np.nan     # a target updated exactly has no noise to exceed
    # held-out excess beyond what the own fits' estimation error explains: more client-targets
    # below EXCESS_LEVEL than the binomial law allows is a term missing (those are listed);
    # else the clients with a large excess are overfit
    k_small, p_fleet, unexplained, overfit = _excess(st, level)
    # held-out transitions beyond the range of the client's training data were left out
    outside = chosen & (n_ho > 0) & (np.nan_to_num(st["reach"], nan=0.0) > RANGE)
    beyond = np.where(outside, 1.0 - st["n_in"] / np.maximum(n_ho, 1), np.nan)
    # free run against noisy runs of the own fit itself, of the clients it counts
    valid = n_ho > 0
    use = ((st["n_in"] >= MIN_SAMPLES) & chosen & ~overfit & (st["s2_ok"] > 0.5)
           & ~unresolved.any(axis=-1))           # a fit at its rounding: no free run either
    tried = (st["tried"] > 0.5) & use
    exceed = st["exceed"] > 0.5
    sim, ref = np.where(use, st["sim"], np.nan), np.where(tried, st["ref"], np.nan)
    k_ex, n_mc = (exceed & tried).sum(axis=1), tried.sum(axis=1)
    p_free = np.where(k_ex > 0, bdtrc(np.maximum(k_ex - 1, 0), np.maximum(n_mc, 1),
                                      1.0 / (REPLICATES + 1)), 1.0)
    with np.errstate(all="ignore"):
        sim_med = np.array([np.median(sim[s][use[s]]) if use[s].any() else np.nan
                            for s in range(S)])
        ref_med = np.array([np.median(ref[s][tried[s]]) if tried[s].any() else np.nan
                            for s in range(S)])
        # the mean NRMSE of one noisy run of the own fits (the mean over the clients of each
        # one's mean over its replicates): what the run's own model's mean free run is
        # compared with (:func:`free_run_warning`)
        ref_mean = np.array([np.mean(st["ref_mean"][s][tried[s]]) if tried[s].any()
                             else np.nan for s in range(S)])
    # worse than the held-out mean (NRMSE 1, the best constant predictor) by more than noisy
    # runs of the fit itself are: the free run does not describe the dynamics
    # the median free run above it where more clients run worse than the median of their
    # own noisy runs than chance allows: under the right class each does so with
    # probability 1/2 (its run and the 19 replicates are exchangeable; a sign test), so a
    # median over a few clients above 1 by its own spread does not fail a right class
    k_up = ((st["sim"] > st["ref"]) & tried).sum(axis=1)
    p_up = np.where(k_up > 0, bdtrc(np.maximum(k_up - 1, 0), np.maximum(n_mc, 1), 0.5), 1.0)
    worse = (sim_med > CONSTANT) & (p_up * S < level)
    free_ok = bool(np.all(p_free * S >= level) and not worse.any())
    missing = white is False or bool(unexplained.any())
    p_excess = st["p_excess"]
    judged = tests > 0 or n_mc.sum() > 0 or np.isfinite(p_excess).any()
    verdict_ = (None if not judged else "free run fails" if not free_ok else
                "missing terms" if missing else "overfit" if overfit.any() else "ok")
    ok = None if verdict_ is None else verdict_ in ("ok", "overfit")
    over_list = [[int(s), int(m)] for s, m in zip(*np.nonzero(overfit), strict=True)]
    reason = ({"reason": "the clients' own fits are at their solve's rounding (ill-conditioned "
               "Gram matrices): their residuals cannot be told from it"}
              if verdict_ is None and unresolved.any() else
              {"reason": f"no client has {MIN_SAMPLES} held-out transitions within the range "
               "of its training data"} if verdict_ is None and outside.any() else {})
    return {**reason, "ok": ok, "verdict": verdict_, "white": white, "test": "billings-voon",
            "lags": LAGS, "level": level, "correction": "bonferroni", "tests": tests,
            "material": MATERIAL, "exact": int(exact.sum()),
            "unresolved": int(unresolved.sum()), "p_min": p_min,
            "p_adjusted": None if p_min is None else min(1.0, p_min * tests),
            "p_min_by_target": by_target, "worst": worst,
            "rejected": int(rejected.sum()),
            "pooled_clients": [int(v) for v in (st["n_pool"] > 0).any(axis=-1).sum(axis=1)],
            # the clients the correlation tests could take: enough held-out transitions
            # within their training range and a target with noise to test
            "poolable_clients": [int(v) for v in (
                chosen & (st["n_in"] >= MIN_SAMPLES) & (st["s2_ok"] > 0.5)
                & ~(exact | unresolved).all(axis=-1)).sum(axis=1)],
            "measurement_noise": [names[j] for j in range(n_y) if noisy[:, j].any()],
            "measurement_noise_correlation": [
                _num(r[s, j, lag1]) for j in range(n_y) if noisy[:, j].any()
                for s in [int(np.argmin(np.where(noisy[:, j], r[:, j, lag1], np.inf)))]],
            "excess_tests": int(np.isfinite(p_excess).sum()), "excess_level": EXCESS_LEVEL,
            "excess_below": [int(v) for v in k_small], "excess_p": [_num(v) for v in p_fleet],
            "excess_rejected": [[int(s), int(m), names[j]] for s, m, j in
                                zip(*np.nonzero(unexplained), strict=True)][:50],
            "overfit": over_list, "overfit_limit": OVERFIT,
            "overfit_detail": _overfit_detail(st["cond"], overfit, ratio, mu_top,
                                              st["expected"]),
            "reach_max": [_num(np.nanmax(v)) if (~np.isnan(v)).any() else None
                          for v in np.where(chosen & (n_ho > 0), st["reach"], np.nan)],
            "extrapolating": [[int(s), int(m)] for s, m in
                              zip(*np.nonzero(outside), strict=True)][:50],
            "extrapolating_clients": [int(v) for v in outside.sum(axis=1)],
            "extrapolating_untested": [int(v) for v in (
                outside & (n_ho >= MIN_SAMPLES) & (st["n_in"] < MIN_SAMPLES)).sum(axis=1)],
            "extrapolating_worst": _worst_outside(outside, beyond, st["reach"]),
            "support": "all terms" if support is None else "sparsity",
            "free_run_ok": free_ok, "free_run_test": "monte carlo",
            "free_run_replicates": REPLICATES,
            "free_run_exceed": [int(v) for v in k_ex], "free_run_clients": [int(v) for v in n_mc],
            "free_run_p": [_num(v) for v in p_free], "free_run_limit": CONSTANT,
            "free_run_above_median": [int(v) for v in k_up],
            "free_run_above_median_p": [_num(v) for v in p_up],
            "nrmse_sim_max": [_num(v) for v in over_clients(sim, use)[0]],
            "nrmse_sim_median": [_num(v) for v in sim_med],
            "nrmse_sim_noisy_median": [_num(v) for v in ref_med],
            "nrmse_sim_noisy_mean": [_num(v) for v in ref_mean],
            "nrmse_1step_max": [_num(v) for v in over_clients(st["one"],
                                                              valid & chosen)[0]],
            "clients_checked": int(chosen.sum()),
            "fit": "each client's own least squares"}


def _worst_outside(outside: np.ndarray, beyond: np.ndarray, reach: np.ndarray):
    """The client with the largest share of held-out transitions beyond its training data
    (then the largest reach), or None."""
    found = list(zip(*np.nonzero(outside), strict=True))
    if not found:
        return None
    s, m = max(found, key=lambda sm: (beyond[sm], reach[sm]))
    return {"repeat": int(s), "client": int(m), "share": _num(beyond[s, m]),
            "reach": _num(reach[s, m])}


def client_key(label) -> int:
    """The integer that names a client's own random stream of the free-run test: from its
    label (a file's name, or a simulated client's index), so the same wherever it runs."""
    import hashlib

    return int.from_bytes(hashlib.sha256(str(label).encode()).digest()[:8], "little")


#: most values of the noise of the free-run replicates held at once (a chunk of clients)
NOISE_VALUES = 1 << 22


def free_run_statistics(model, heldout, fits, use, keys, seed: int = 0) -> dict:
    """Free runs of the own fits (``fits``:
    :func:`fnsysid.learning.ownfit_stats.own_fit_statistics`) of the clients ``use`` (S, M):
    ``sim`` the observed free-run NRMSE (S, M)
    (:meth:`~fnsysid.results.metrics.HeldOutScores.free_run`), ``ref`` the median NRMSE of
    :data:`REPLICATES` runs with Gaussian noise on each state (of the variance of its one-step
    residuals on the held-out data) and parameters drawn from the fit's estimation error
    ``N(theta, s2 H^+)``, against the noise-free run (S, M), ``exceed`` whether the observed
    one exceeds every replicate (S, M) and ``tried`` which clients were rolled out (0/1).

    Each client's noise comes from its own stream (``rnd.stream(seed, MODEL_CHECK,
    client_key(keys[i]))``): first its parameter draws (B, S, p), then, trajectory by
    trajectory, its state noise (transitions, B, S, n_x), so that neither the other clients
    nor the padding of a block change a client's numbers."""
    from fnsysid.dynamics import random as rnd

    Hplus, theta, s2, _ = fits
    S, M = heldout.n.shape
    nan = np.full((S, M), np.nan)
    out = {"sim": nan.copy(), "ref": nan.copy(), "ref_mean": nan.copy(),
           "exceed": np.zeros((S, M)),
           "tried": np.zeros((S, M))}
    if not use.any():
        return out
    scores = HeldOutScores(model, heldout)
    with np.errstate(all="ignore"):
        obs = scores.free_run(theta, use.any(axis=0))      # only the clients it counts
    out["sim"] = np.where(use, obs, np.nan)
    P = model.structure.any(axis=1).astype(float)                  # (n_y, p)
    B = REPLICATES
    p = theta.shape[-1]
    with np.errstate(all="ignore"):
        for block in heldout.blocks:
            run = np.flatnonzero(use[:, block.clients].any(axis=0))
            J, L, n_x = block.x.shape[2], block.x.shape[3], block.x.shape[-1]
            step_c = max(1, NOISE_VALUES // max(1, B * S * J * L * n_x))
            for lo in range(0, len(run), step_c):
                idx = run[lo:lo + step_c]
                c = block.clients[idx]
                x, u = block.x[:, idx], block.u[:, idx]
                bmask = block.mask[:, idx]
                mask = bmask[..., 1:]
                zd = np.zeros((B, S, len(idx), p))
                zn = np.zeros((B, S, len(idx), J, L - 1, n_x))
                lengths = bmask.sum(axis=-1).max(axis=0)               # (m, J)
                for q, i in enumerate(c):
                    g = rnd.stream(seed, rnd.MODEL_CHECK, client_key(keys[i]))
                    zd[:, :, q] = g.standard_normal((B, S, p))
                    for j in range(J):
                        if lengths[q, j] > 1:
                            zn[:, :, q, j, :lengths[q, j] - 1] = np.moveaxis(
                                g.standard_normal((lengths[q, j] - 1, B, S, n_x)), 0, 2)
                Th = model.theta_matrix(theta[:, c])                  # (S, m, n_y, n_phi)
                # each replicate's model: the own fit plus a draw of its estimation error,
                # N(0, s2_j H^+) on the parameters of target j (H block diagonal over targets)
                lam, V = np.linalg.eigh(Hplus[:, c])
                root = V * np.sqrt(np.maximum(lam, 0))[..., None, :]
                sd_p = np.nan_to_num(np.sqrt(s2[:, c])) @ P             # (S, m, p)
                delta = np.einsum("smpq,bsmq->bsmp", root, zd) * sd_p
                ThB = model.theta_matrix(theta[:, c] + delta)         # (B, S, m, n_y, n_phi)
                # the noise of each state: its one-step residual variance on the held-out
                # data (states the model updates exactly, e.g. a position from a velocity,
                # move with the process too)
                wt = (bmask[..., 1:] & bmask[..., :-1])[..., None]
                step = model.predict(x[..., :-1, :], u, theta[:, c, None, None, :])
                r2 = np.where(wt, (x[..., 1:, :] - step) ** 2, 0.0).sum(axis=(2, 3))
                sd = np.sqrt(r2 / np.maximum(wt.sum(axis=(2, 3)), 1))[:, :, None, :]
                sd = np.nan_to_num(sd)                                 # (S, m, 1, n_x)
                det = x[..., 0, :]
                noisy = np.broadcast_to(det, (B,) + det.shape).copy()
                sse_det = np.zeros(det.shape)
                sse_rep = np.zeros(noisy.shape)
                for t in range(x.shape[-2] - 1):
                    ut = u[..., t, :]
                    uB = np.broadcast_to(ut, (B,) + ut.shape)
                    y = np.einsum("smyk,smjk->smjy", Th, model.features(det, ut))
                    det = model.system.predict(det, ut, y)
                    yB = np.einsum("bsmyk,bsmjk->bsmjy", ThB, model.features(noisy, uB))
                    noisy = model.system.predict(noisy, uB, yB)
                    noisy = noisy + sd * zn[..., t, :]
                    mt = mask[..., t, None]
                    sse_det += np.where(mt, (det - x[..., t + 1, :]) ** 2, 0.0)
                    sse_rep += np.where(mt, (noisy - det) ** 2, 0.0)
                w = scores.w_run[:, c]                                 # (S, m, n_x)
                o = (np.sqrt(sse_det.sum(axis=2)) * w).sum(axis=-1)
                rep = (np.sqrt(sse_rep.sum(axis=3)) * w).sum(axis=-1)  # (B, S, m)
                o = np.where(np.isfinite(o), o, np.inf)
                rep = np.where(np.isfinite(rep), rep, np.inf)
                out["ref"][:, c] = np.median(rep, axis=0)
                out["ref_mean"][:, c] = rep.mean(axis=0)
                # a free run within EXACT of the states' spread is round-off: it exceeds
                # nothing (replicates of an exact fit, s2 ~ 1e-30, vary less than it)
                out["exceed"][:, c] = (o > rep.max(axis=0)) & (o > EXACT)
                out["tried"][:, c] = use[:, c]
    return out


def _overfit_detail(cond, overfit, ratio, mu_top, expected, most: int = 20) -> list[dict]:
    """For the first ``most`` overfit clients: the held-out error ratio (largest over the
    targets whose expected ratio exceeds :data:`OVERFIT`), that expected ratio
    ``1 + trace(H^+ H_ho) / n_ho``, the share of the estimation error's expected held-out
    excess on its single worst direction, and the condition number ``cond`` (S, M) of the
    client's Gram matrix on the support."""
    out = []
    for s, m in list(zip(*np.nonzero(overfit), strict=True))[:most]:
        loose = np.where(expected[s, m] > OVERFIT, ratio[s, m], np.nan)
        j = int(np.nanargmax(loose)) if np.isfinite(loose).any() else 0
        out.append({"repeat": int(s), "client": int(m), "ratio": _num(ratio[s, m, j]),
                    "expected": _num(expected[s, m, j]),
                    "direction_share": _num(mu_top[s, m, j]), "condition": _num(cond[s, m])})
    return out


def _label(kind: str, v, variables) -> str:
    """The name of a correlation test, e.g. ``phi_{x1^2 e}``."""
    z = "" if v is None else variables[v]
    return {"ee": "phi_ee", "ze": f"phi_{{{z} e}}", "z2e": f"phi_{{{z}^2 e}}",
            "z2e2": f"phi_{{{z}^2 e^2}}", "e(ez)": f"phi_{{e(e {z})}}"}[kind]


def _spread(Y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Root mean square of a target about its mean over the existing samples, (...)."""
    n = np.maximum(w.sum(axis=(-2, -1)), 1)
    mean = (Y * w).sum(axis=(-2, -1)) / n
    return np.sqrt((((Y - mean[..., None, None]) * w) ** 2).sum(axis=(-2, -1)) / n)


def _num(v) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else (None if np.isnan(v) else v)


def _fmt(v, spec: str) -> str:
    """A number for the verdict's line; ``n/a`` where the check has none (None or NaN)."""
    return "n/a" if v is None or v != v else format(v, spec)


def own_precision_who(precision: dict) -> str:
    """Who adds the error of ``conditioning.own_precision``: the largest share's client and
    how many more stand out, or that it is spread over the fits."""
    names = precision.get("clients")
    if names:
        more = max(int(precision.get("named") or len(names)) - 1, 0)
        return (f"{100 * float(precision.get('share') or 0.0):.0f} % of it client {names[0]}'s"
                + (f", then {more} more client(s)" if more else ""))
    return "spread over the fits (no client stands out: several fits are imprecise)"


#: :func:`free_run_warning`'s words for a poor model of a run whose status is ok, and its
#: pointer to the library
POOR = ("it does not describe the dynamics, though the status is ok (the rounds neither "
        "diverged nor grew)")
SEE_LIBRARY = "see the model check and fnsysid compare (another library, or sparsity)"


def free_run_warning(summary: dict) -> tuple[str, bool] | None:
    """The log line when the run's own model, run freely from each held-out trajectory's
    first state, predicts worse than each state's held-out mean (``final_nrmse_sim_mean``,
    the mean over clients, above :data:`CONSTANT`), and whether it is a warning; else None.
    The status is about the rounds (they converged), so it stays; this line and ``fnsysid
    show`` say the model is poor. Where the held-out trajectories are too short for the model
    check (``model_check.verdict`` null: no client has :data:`MIN_SAMPLES` held-out
    transitions), the line is information, not a warning, up to :data:`SHORT_NOISE`: a short
    trajectory's NRMSE, scaled by its own spread, is near 1 for a right model whose noise
    moves its free run off (the true parameters of ``system=synthetic``, T = 5: 0.99 on
    average over 4000 clients); far above it no right model's noise puts it (4.8 at an lr
    whose error grew 8 times, 5.6 for an interpolating single fit), and it is a warning.
    Nor is it a warning where the model check finds the class right (``ok`` or ``overfit``)
    and noisy runs of the clients' own fits score at least the run model's mean NRMSE
    (``nrmse_sim_noisy_mean``): a system whose free run the noise leads (a slow pole) is
    there with any right model. Where the estimate is a mean of the clients' own fits that
    one client's imprecise fit spoils (``conditioning.own_precision``), the line says so
    instead of pointing at the library."""
    if summary.get("status") != "ok":
        return None
    mean, top = summary.get("final_nrmse_sim_mean"), summary.get("final_nrmse_sim_max")
    if mean is None or not mean > CONSTANT:
        return None
    shown = next(f"{mean:.{d}g}" for d in range(3, 18)         # visibly above the limit
                 if d == 17 or float(f"{mean:.{d}g}") > CONSTANT)
    head = (f"the identified model runs freely on the held-out trajectories with NRMSE "
            f"{shown} (mean over clients; max {_fmt(top, '.3g')}), worse than each "
            f"state's held-out mean (NRMSE {CONSTANT:g})")
    priv = summary.get("privacy") or {}
    if priv.get("moved") is not None and priv["moved"] >= MOVED_LEVEL:
        return (f"{head}: {noise_size(priv)}: the estimate, not the library, is poor"), True
    check = summary.get("model_check")
    if check is not None and check.get("verdict") is None and check.get("reason") in (
            None, SHORT) and mean <= SHORT_NOISE:
        return (f"{head}; on held-out trajectories too short for the model check (it needs "
                f"{MIN_SAMPLES} held-out transitions a client) a right model's noise can put "
                "its free run there, so this does not say the model is poor: hold out longer "
                "trajectories (T, data.val_N) to judge it"), False
    noisy = [v for v in (check or {}).get("nrmse_sim_noisy_mean") or [] if v is not None]
    if check is not None and check.get("verdict") in ("ok", "overfit") and noisy \
            and mean <= float(np.mean(noisy)):
        return (f"{head}, as noisy runs of the clients' own fits do (NRMSE "
                f"{float(np.mean(noisy)):.3g} on average, summary.json: model_check."
                "nrmse_sim_noisy_mean): the noise leads the free run, not a poor model"), False
    precision = (summary.get("conditioning") or {}).get("own_precision")
    if precision is not None:
        spoilt = (f"it is a mean of the clients' own fits, whose estimation error alone adds "
                  f"a one-step NRMSE of {precision['nrmse_added']:.3g}, "
                  f"{own_precision_who(precision)} (conditioning.own_precision)")
        if check is None or check.get("verdict") in ("ok", "overfit", None):
            return (f"{head}: {POOR}; the estimate, not the library, is poor: {spoilt}"), True
        return (f"{head}: {POOR}; {SEE_LIBRARY}; the estimate is poor too: {spoilt}"), True
    apart = _clients_apart(summary)
    right = check is not None and check.get("verdict") in ("ok", "overfit")
    own = ("the personalized models of client_estimates.csv are each client's (these scores "
           "are the shared estimate's)" if summary.get("personalize") == "auto" else
           "personalize=auto gives each client its own model")
    if apart and right:
        return (f"{head}: {apart}, and one model of them all runs freely far from each "
                "client's own dynamics; the library is not what is missing (the model check "
                f"finds the class right): {own}"), True
    if apart and (check is None or check.get("verdict") is None):
        return (f"{head}: {apart}, and one model of them all may run freely far from each "
                f"client's own dynamics ({own}); the model check did not judge the library"
                ), True
    if right:
        return (f"{head}: {POOR} and the model check finds the class right: the estimate "
                "rather than the library; the clients may differ beyond what the run could "
                f"test ({own}); fnsysid compare ranks other runs"), True
    if check is not None and check.get("verdict") is None and check.get("reason") in (
            None, SHORT):                   # above SHORT_NOISE: no right model's noise
        return (f"{head}: {POOR}; a right model's noise puts runs this short near 1, and "
                "they are too short for the model check to judge the library: look at the "
                "rounds (lr), the samples a coefficient (more data per client or fewer "
                "terms), then the library; fnsysid compare ranks other runs"
                + (f"; {apart} too" if apart else "")), True
    return (f"{head}: {POOR}; {SEE_LIBRARY}" + (f"; {apart} too" if apart else "")), True


def _clients_apart(summary: dict) -> str | None:
    """In words, where Cochran's Q found the clients' own fits to differ by more than their
    noise (``ci.clients_differ``, where it is read, or ``personalize_reml``) in some repeat,
    else None."""
    for test in ((summary.get("ci") or {}).get("clients_differ"),
                 summary.get("personalize_reml")):
        if not test or test.get("read") is False or not any(test.get("rejected") or []):
            continue
        pv = [v for v in test.get("pvalue") or [] if v is not None]
        return (f"the clients' own fits differ by more than their noise (Cochran's Q, p = "
                f"{min(pv):.2g} in {sum(test['rejected'])} of {len(test['rejected'])} "
                "repeats)")
    return None


def noise_note(check: dict | None) -> str | None:
    """The log line when the one-step residuals look like noise on the measured states
    (``measurement_noise``), else None."""
    if not check or not check.get("measurement_noise"):
        return None
    pairs = ", ".join(f"{t} {_fmt(c, '.2f')}" for t, c in
                      zip(check["measurement_noise"], check["measurement_noise_correlation"],
                          strict=True))
    return ("model check: the one-step residuals are correlated at lag 1 and at no other lag "
            f"or variable ({pairs}), as noise on the measured states makes them, not a missing "
            "term: not counted against the model class; least squares is biased by noise on "
            "its regressors (errors in variables), more so the larger the noise's share of "
            "the states' variation; the free run judges the model")


def extrapolation_note(check: dict | None) -> str | None:
    """The log line when some clients are left untested because their held-out transitions
    lie beyond the range of their training data (``extrapolating_untested``), else None
    (clients that keep enough transitions within it are tested on those, and only listed in
    ``extrapolating``)."""
    untested = (check or {}).get("extrapolating_untested") or [0]
    if max(untested) == 0 or not check.get("extrapolating_worst"):
        return None
    w = check["extrapolating_worst"]
    where = " in a repeat" if len(untested) > 1 else ""
    return (f"model check: {max(untested)} client(s){where} left untested: fewer than "
            f"{MIN_SAMPLES} of their held-out transitions lie within the range of their "
            f"training data (the others have a feature beyond {RANGE:g} times the largest "
            "magnitude it takes in training), and a model is only checked where its training "
            "data reach (worst: "
            f"client {w['client']} in repeat {w['repeat']}, {_fmt(w['share'], '.0%')} of its "
            "held-out transitions beyond); train on data that cover the range where the "
            "model will be used")


def pooling_clause(check: dict | None) -> str | None:
    """What the correlation tests (which see a missing term) left out, when they pooled
    fewer clients than the check tested in some repeat (``pooled_clients`` against
    ``clients_checked``), else None: as few as k of n clients, or none (then they were not
    made)."""
    pooled, able = (check or {}).get("pooled_clients"), (check or {}).get("poolable_clients")
    if not pooled or not able:
        return None
    short = [(p, a) for p, a in zip(pooled, able, strict=True) if p < a]
    if not short:
        return None
    p, a = min(short, key=lambda pa: pa[0] / pa[1])
    why = (f"their own fits are determined too loosely for them (an expected held-out error "
           f"above {OVERFIT:g} times the noise)")
    if not check.get("tests"):
        return (f"the correlation tests, which see a missing term, were not made: {why}")
    return (f"the correlation tests, which see a missing term, pooled as few as {p} of {a} "
            f"clients that could be tested (the others: {why})")


def pooling_note(check: dict | None) -> str | None:
    """The log line of an ``ok`` verdict whose correlation tests pooled fewer clients than
    the check tested (:func:`pooling_clause`), else None: the verdict rests on less than
    it seems (an ``overfit`` line says it itself)."""
    clause = pooling_clause(check)
    if clause is None or check.get("verdict") != "ok":
        return None
    return (f"model check: ok, but {clause}; a missing term there could go unseen (more "
            "data per client, or fewer terms, lets them in)")


def verdict(check: dict | None, personalized: bool = False,
            repeated: dict | None = None) -> str | None:
    """The log line when the check finds something (None when it does not); its advice
    leaves out ``sparsity=stlsq`` where the run has ``finetune`` models (``personalized``),
    with which sparsity is refused, and where the kept terms were chosen from a singular fit
    (``repeated``: ``conditioning.repeated``) it advises mending that first, not a richer
    library."""
    if not check or check.get("verdict") in (None, "ok"):
        return None
    sparse = check.get("support") == "sparsity"
    if check["verdict"] == "overfit":
        advice = ("a larger sparsity.threshold (fewer terms) or more data per client" if sparse
                  else "a smaller library (feature_map.degree, fewer features) or more data "
                  "per client (sparsity=stlsq prunes terms with personalize=none or auto)"
                  if personalized
                  else "fewer terms (sparsity=stlsq, a smaller library) or more data per client")
        detail = check.get("overfit_detail") or []
        worst = max(detail, key=lambda d: d["ratio"] or 0, default=None)
        where = ("" if worst is None else
                 f"; worst: client {worst['client']} in repeat {worst['repeat']}, held-out "
                 f"error {_fmt(worst['ratio'], '.3g')} times its training noise "
                 f"({_fmt(worst.get('expected'), '.3g')} expected from its estimation error), "
                 f"{(worst['direction_share'] or 0):.0%} of its expected excess on one "
                 f"direction, Gram condition {_fmt(worst['condition'], '.2g')}")
        clause = pooling_clause(check)
        seen = "" if clause is None else f"; {clause}"
        return (f"model check: {len(check['overfit'])} client(s)' own fits predict their "
                f"held-out data worse than their training noise (ratio > "
                f"{check['overfit_limit']}) where their own estimation error is expected to "
                f"add more than that (a poorly determined direction of the fit), and the "
                f"held-out excess test finds no term missing{where}: too many terms "
                f"for their data, not a missing term{seen}; try {advice}")
    why = []
    if check["verdict"] == "free run fails":
        k, n = check["free_run_exceed"], check["free_run_clients"]
        s = max(range(len(k)), key=lambda i: (k[i] / max(n[i], 1)))
        why.append(f"the clients' own fits run freely worse than noisy runs of themselves "
                   f"({k[s]} of {n[s]} clients in repeat {s} worse than all "
                   f"{check['free_run_replicates']} noisy runs, 1 in "
                   f"{check['free_run_replicates'] + 1} expected; median free-run NRMSE "
                   f"{_fmt(check['nrmse_sim_median'][s], '.3g')} against "
                   f"{_fmt(check['nrmse_sim_noisy_median'][s], '.3g')} of the noisy runs"
                   + (f", {check['free_run_above_median'][s]} of {n[s]} above their noisy "
                      "runs' median, half expected)" if check.get("free_run_above_median")
                      else ")"))
    if check["white"] is False:
        w = check["worst"]
        why.append(f"the residuals are correlated with the past ({check['rejected']} of "
                   f"{check['tests']} correlation tests reject at family-wise level "
                   f"{check['level']}; worst: {w['test']} of target {w['target']} at lag "
                   f"{w['lag']}, Z = {_fmt(w['Z'], '.3g')}, correlation "
                   f"{_fmt(w['correlation'], '.2g')})")
    if check.get("excess_rejected"):
        why.append(f"{len(check['excess_rejected'])} client-target(s) predict their held-out "
                   "data worse than their own estimation error explains")
    richer = "a richer library (feature_map.degree, another feature_map or one of your own)"
    advice = (f"a smaller sparsity.threshold (the check fits the kept terms) or {richer}"
              if sparse else richer)
    if sparse and repeated:          # the support was chosen from undetermined coefficients
        advice = (f"first leaving out one of the terms that repeat each other "
                  f"({repeated.get('relation')} in repeat {repeated.get('repeat')}, "
                  "conditioning.repeated): the kept terms were chosen from coefficients the "
                  "data do not determine, and a term the dynamics need may have been pruned")
    head = ("the model class looks wrong" if check["verdict"] == "free run fails"
            else "the model class looks wrong: terms look missing")
    return f"model check: {head}: " + "; ".join(why) + f"; try {advice}"
