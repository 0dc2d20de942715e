"""Is the model class right? A check of each client's own fit on its held-out data.

Every client is fitted on its own training data (exact least squares, on the run's support
with ``sparsity``), so that differences between clients (heterogeneity) are not taken for a
missing term. Two questions are asked of these fits:

- **white residuals:** the one-step residuals of each regression target on the client's
  held-out trajectories should be white noise when the library holds the system's terms. A
  missing term (``x1^3`` in a Duffing oscillator fitted with a linear library) leaves a
  function of the state in the residuals, which is correlated in time. The test is Ljung and
  Box's portmanteau statistic ``Q = n (n + 2) sum_{k=1..h} r_k^2 / n_k`` of the first ``h``
  autocorrelations ``r_k`` of the (de-meaned) residuals, taken within trajectories (``n_k``
  pairs at lag ``k``, ``n`` samples; one trajectory: ``n_k = n - k``, the textbook form), with
  a chi-square tail on the lags that have pairs. The clients and targets of all repeats are
  tested together, so each p-value is compared with ``level / tests`` (Bonferroni; whether
  any is rejected is the same as with Holm's), and a rejection counts when the correlation is
  material too (mean squared autocorrelation over the lags at least :data:`MATERIAL`).
  Residuals that are zero to round-off (a state updated exactly, a process without noise)
  are white; a client-target with fewer than :data:`MIN_SAMPLES` held-out transitions is not
  tested. An own fit that predicts its held-out data worse than its training noise (ratio
  above :data:`OVERFIT`: too many terms for the client's samples) leaves correlated errors
  too; such clients are named apart (``overfit``) and do not make the class wrong, but only
  when the fit's own estimation error explains the excess (at least the share
  :data:`EXPLAINED` of it): under the right class that error alone makes the ratio
  ``1 + max_j trace(H^+ H_ho,j) / n_ho`` in expectation (``H`` the client's training Gram
  matrix on the support, ``H_ho,j`` the held-out one through target ``j``, ``n_ho`` its
  held-out transitions; the largest over the targets, as if all the noise were on that one).
  A larger excess is a term missing: without noise the training residuals of a wrong class
  are its misfit alone, and any change of the states between training and held-out data
  makes the ratio large (a linear library on a noise-free Duffing fleet: up to 10^4, against
  1.5 that 8 parameters from 156 samples explain).
- **free run:** simulated from each held-out trajectory's first state, the own fits should
  stay within :data:`SIM_LIMIT` standard deviations of the states (the median over the
  clients of the free-run NRMSE, per repeat: one client's fit of a stiff system may blow up
  from a small error whatever the library); a rollout that blows up or wanders off means the
  one-step fit does not describe the dynamics. Only clients with :data:`MIN_SAMPLES`
  held-out transitions whose fits generalize count.

``ok`` is None when nothing could be checked (short held-out trajectories, e.g. the paper's
systems at T = 5).
"""

from __future__ import annotations

import numpy as np

from fnsysid.dynamics.model import masked_gram
from fnsysid.results.metrics import HeldOutScores, over_clients

#: family-wise level of the whiteness test
LEVEL = 0.01
#: most lags of the Ljung-Box statistic
LAGS = 10
#: fewest held-out transitions of a client for its test
MIN_SAMPLES = 20
#: largest free-run NRMSE of an own fit that passes: a rollout that blows up or wanders an
#: order of magnitude beyond the data (a noise-driven process keeps a correct model's free run
#: at a few standard deviations: Duffing at disturbance 0.5, 3.7)
SIM_LIMIT = 10.0
#: mean squared autocorrelation over the lags from which a significant one counts: a missing
#: term leaves residuals correlated over many steps (Duffing without x1^3: 0.6), a fit from a
#: few samples of the right library a weak correlation (below 0.1)
MATERIAL = 0.2
#: held-out over training mean squared error above which an own fit counts as overfitted
OVERFIT = 1.5
#: a fit counts as overfitted only when its estimation error explains at least this share of
#: the excess of its held-out error over its training noise (the estimation error alone makes
#: the ratio ``1 + trace(H^+ H_ho) / n_ho``); an excess it does not explain is a missing term
EXPLAINED = 0.5
#: residuals below this share of the target's spread are exact (round-off)
EXACT = 1e-9


def _restricted_gram(data, support=None) -> np.ndarray:
    """The clients' Gram matrices (S, M, p, p) restricted to ``support`` (S, p) (zero
    outside), those of the own fits."""
    if support is None:
        return data.H
    return masked_gram(data.H, np.asarray(support, float)[:, None, :])


def own_fits(data, support=None, Hplus=None) -> np.ndarray:
    """Each client's exact least-squares model on its training statistics, (S, M, p);
    ``Hplus``: the pseudo-inverses of the restricted Gram matrices, if already made."""
    if Hplus is None:
        Hplus = np.linalg.pinv(_restricted_gram(data, support), hermitian=True)
    m = 1.0 if support is None else np.asarray(support, float)[:, None, :]
    return np.einsum("...pq,...q->...p", Hplus, data.b * m) * m


def ljung_box(E: np.ndarray, w: np.ndarray, lags: int = LAGS):
    """Ljung-Box statistics of residual series.

    ``E`` (..., J, L) residuals of ``J`` trajectories of up to ``L`` samples, ``w`` (..., J, L)
    0/1 where a sample exists (a prefix of each trajectory). Returns ``Q`` (...), the degrees
    of freedom (lags with pairs, ...), the number of samples ``n`` (...), the residuals'
    root mean square after de-meaning (...) and the mean over the lags of the squared
    autocorrelations (each the mean lagged product over the variance, ...).
    """
    n = w.sum(axis=(-2, -1))
    safe = np.maximum(n, 1)
    mean = (E * w).sum(axis=(-2, -1)) / safe
    e = (E - mean[..., None, None]) * w
    c0 = (e * e).sum(axis=(-2, -1))
    Q, dof, r2 = np.zeros(n.shape), np.zeros(n.shape, int), np.zeros(n.shape)
    h = min(lags, E.shape[-1] - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(1, h + 1):
            pairs = (w[..., k:] * w[..., :-k]).sum(axis=(-2, -1))
            r = (e[..., k:] * e[..., :-k]).sum(axis=(-2, -1)) / c0
            has = pairs > 0
            Q = Q + np.where(has, r * r / np.maximum(pairs, 1), 0.0)
            r2 = r2 + np.where(has, (r * n / np.maximum(pairs, 1)) ** 2, 0.0)
            dof = dof + has
    Q = n * (n + 2) * Q
    return Q, dof, n, np.sqrt(c0 / safe), r2 / np.maximum(dof, 1)


def model_check(model, data, heldout, support=None, level: float = LEVEL) -> dict | None:
    """The check of the module docstring: ``{ok, ...}`` for ``summary.json`` (None without
    held-out data). ``ok`` is None when no client-target could be tested and the free runs
    pass."""
    if heldout is None or not (heldout.n > 0).any():
        return None
    if not (heldout.n >= MIN_SAMPLES).any():           # nothing to test: no work
        return {"ok": None, "white": None, "test": "ljung-box", "tests": 0,
                "reason": f"no client has {MIN_SAMPLES} held-out transitions"}
    # imported here: a run without anything to test does not pay for it
    from scipy.stats import chi2
    # each client's exact least squares on the support, (S, M, p), and its pseudo-inverse
    Hplus = np.linalg.pinv(_restricted_gram(data, support), hermitian=True)   # (S, M, p, p)
    theta = own_fits(data, support, Hplus)
    S, M = heldout.n.shape
    n_y = model.structure.shape[0]
    names = [str(t) for t in model.system.target_names]
    p = np.full((S, M, n_y), np.nan)
    Qs = np.full((S, M, n_y), np.nan)
    n_exact = np.zeros((S, M, n_y), bool)
    r2 = np.zeros((S, M, n_y))
    sse_ho, n_ho, lev_ho = np.zeros((S, M)), np.zeros((S, M)), np.zeros((S, M))
    St = model.structure                                             # (n_y, n_phi, p)
    with np.errstate(all="ignore"):
        for block in heldout.blocks:
            c = block.clients
            Phi, Y = model.regression(block.x, block.u)              # (S, m, J, L-1, .)
            Th = model.theta_matrix(theta[:, c])                     # (S, m, n_y, n_phi)
            E = Y - np.einsum("smyk,smjtk->smjty", Th, Phi)
            w = (block.mask[..., 1:] & block.mask[..., :-1]).astype(float)
            sse_ho[:, c] = np.einsum("smjty,smjt->sm", E * E, w)
            n_ho[:, c] = w.sum(axis=(-2, -1)) * n_y
            # the own fit's estimation error on the held-out samples of each target, in
            # units of that target's noise variance: trace(H^+ H_ho,j), H_ho,j the held-out
            # Gram matrix of the parameters through target j; the largest over the targets
            # (all the noise on that target) per held-out transition
            gram = np.einsum("smjtk,smjt,smjtl->smkl", Phi, w, Phi)
            lev = np.einsum("ykp,smpq,ylq,smkl->smy", St, Hplus[:, c], St, gram,
                            optimize=True)
            lev_ho[:, c] = lev.max(axis=-1)
            for j in range(n_y):
                Q, dof, n, rms, rr = ljung_box(E[..., j], w)
                r2[:, c, j] = rr
                spread = _spread(Y[..., j], w)
                exact = rms <= EXACT * np.maximum(spread, np.finfo(float).tiny)
                tested = (n >= MIN_SAMPLES) & (dof > 0) & (spread > 0) & ~exact
                p[:, c, j] = np.where(tested, chi2.sf(Q, np.maximum(dof, 1)), np.nan)
                Qs[:, c, j] = np.where(tested, Q, np.nan)
                n_exact[:, c, j] = exact & (n > 0)
        sim = HeldOutScores(model, heldout).free_run(theta)          # (S, M)
        one = HeldOutScores(model, heldout).one_step(theta)
    valid = heldout.n > 0
    tests = int(np.isfinite(p).sum())
    # a fit that predicts its held-out data worse than its own training noise (too many terms
    # for the client's samples) leaves correlated errors too; such clients are named apart
    ratio = generalization(data, theta, sse_ho, n_ho, n_y)              # (S, M)
    with np.errstate(divide="ignore", invalid="ignore"):
        # the largest ratio estimation error alone gives (held-out transitions: n_ho / n_y)
        expected = 1 + lev_ho * n_y / n_ho
    over = valid & (ratio > OVERFIT) & (expected - 1 >= EXPLAINED * (ratio - 1))
    rejected = np.isfinite(p) & (p * max(tests, 1) < level) & (r2 >= MATERIAL)
    p_class = np.where(over[..., None] | (r2 < MATERIAL), np.nan, p)
    p_min = float(np.nanmin(p_class)) if np.isfinite(p_class).any() else None
    white = None if not tests else bool(not (rejected & ~over[..., None]).any())
    # the free run of clients with enough held-out data whose own fits generalize
    use = valid & (heldout.n >= MIN_SAMPLES) & ~over
    sim_max = over_clients(sim, use)[0]                              # (S,)
    with np.errstate(all="ignore"):
        sim_med = np.array([np.median(sim[s][use[s]]) if use[s].any() else np.nan
                            for s in range(S)])
    has_sim = ~np.isnan(sim_med)
    free_ok = bool(np.all(sim_med[has_sim] <= SIM_LIMIT))           # inf fails
    ok = None if white is None and not has_sim.any() else bool(free_ok and white is not False)
    worst = None
    if np.isfinite(p_class).any():
        s, m, j = np.unravel_index(np.nanargmin(p_class), p.shape)
        worst = {"repeat": int(s), "client": int(m), "target": names[j],
                 "Q": _num(Qs[s, m, j])}
    by_target = {names[j]: _num(np.nanmin(p[..., j]) if np.isfinite(p[..., j]).any()
                                else np.nan) for j in range(n_y)}
    return {"ok": ok, "white": white, "test": "ljung-box", "lags": LAGS, "level": level,
            "correction": "bonferroni", "tests": tests,
            "exact": int(n_exact.sum()), "p_min": p_min,
            "p_adjusted": None if p_min is None else min(1.0, p_min * tests),
            "p_min_by_target": by_target, "worst": worst,
            "overfit": [[int(s), int(m)] for s, m in zip(*np.nonzero(over & rejected.any(-1)),
                                                          strict=True)],
            "overfit_limit": OVERFIT, "overfit_explained": EXPLAINED,
            "support": "all terms" if support is None else "sparsity",
            "free_run_ok": free_ok, "free_run_limit": SIM_LIMIT,
            "nrmse_sim_max": [_num(v) for v in sim_max],
            "nrmse_sim_median": [_num(v) for v in sim_med],
            "nrmse_1step_max": [_num(v) for v in over_clients(one, valid)[0]],
            "fit": "each client's own least squares"}


def generalization(data, theta, sse_ho, n_ho, n_y: int) -> np.ndarray:
    """Held-out mean squared one-step error of each own fit over its training noise variance
    (training residual sum of squares over the ``n n_y`` target values minus the fitted
    terms), (S, M); NaN where either is undefined."""
    sse = data.yy - 2 * np.einsum("smp,smp->sm", theta, data.b) + \
        np.einsum("smp,smpq,smq->sm", theta, data.H, theta)
    dof = data.n * n_y - (theta != 0).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        noise = np.where(dof > 0, np.maximum(sse, 0) / dof, np.nan)
        return np.where((n_ho > 0) & (noise > 0), (sse_ho / np.maximum(n_ho, 1)) / noise,
                        np.nan)


def _spread(Y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Root mean square of a target about its mean over the existing samples, (...)."""
    n = np.maximum(w.sum(axis=(-2, -1)), 1)
    mean = (Y * w).sum(axis=(-2, -1)) / n
    return np.sqrt((((Y - mean[..., None, None]) * w) ** 2).sum(axis=(-2, -1)) / n)


def _num(v) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else (None if np.isnan(v) else v)


def verdict(check: dict | None) -> str | None:
    """The log line when the model class looks wrong (None when it does not)."""
    if not check:
        return None
    sparse = check.get("support") == "sparsity"
    if check["ok"] is not False:
        if not check.get("overfit"):
            return None
        advice = ("a larger sparsity.threshold or more data per client" if sparse else
                  "sparsity=stlsq or more data per client")
        return (f"model check: {len(check['overfit'])} client(s)' own fits predict their "
                f"held-out data worse than their training noise (mean squared error ratio > "
                f"{check['overfit_limit']}) with correlated errors, which the fits' own "
                "estimation error explains: too many terms for their data, or held-out states "
                f"beyond their training data; try {advice}")
    why = []
    if check["white"] is False:
        w = check["worst"]
        why.append(f"one-step residuals are not white (Ljung-Box over {check['tests']} "
                   f"client-targets, smallest p {check['p_min']:.2g}, adjusted "
                   f"{check['p_adjusted']:.2g} < {check['level']}; worst: target "
                   f"{w['target']} of client {w['client']} in repeat {w['repeat']})")
    if not check["free_run_ok"]:
        worst = max((v for v in check["nrmse_sim_median"] if v is not None), default=None)
        why.append(f"the clients' own fits do not hold in free run (median free-run NRMSE "
                   f"over the clients up to {worst:.3g}, limit {check['free_run_limit']})")
    richer = "a richer library (feature_map.degree, another feature_map or one of your own)"
    advice = (f"a smaller sparsity.threshold (the check fits the kept terms) or {richer}"
              if sparse else richer)
    return "model check: the model class looks wrong: " + "; ".join(why) + f"; try {advice}"
