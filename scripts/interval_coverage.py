"""Coverage of ``personalize=auto``'s intervals under other heterogeneity covariances.

Usage: python scripts/interval_coverage.py [--seeds 3] [--repeats 40] [--eps 0,0.3,1]
[--detail] [--jackknife] [--bootstrap B [--rounds 0,1]]

On the synthetic fleet (M = 20, N = 10, ``repeats`` repeats per seed, seeds 0 ... seeds - 1)
it computes ``auto``'s models once (:func:`fnsysid.learning.personalize.fleet` and
:func:`~fnsysid.learning.personalize.client_posterior`) and changes only the ``Sigma'`` of
the intervals (``Fleet.Sigma_ci``), as docs/ALGORITHMS.md's table of ``Sigma'`` choices was
measured. Coverage of the clients' true parameters at level 0.95 over every (repeat, client,
parameter), its range over seeds printed per eps. The candidates:

- ``Sigma_ci``: the unrestricted REML (the default); ``0``: pooled's interval; ``Sigma``: the
  models' own (test, BIC rank);
- ``diag REML`` / ``diag PM``: ``Sigma' = diag(tau_j^2)``, each parameter's heterogeneity
  variance from its own marginal random-effects model ``theta_hat_ij ~ N(mu_j, tau_j^2 +
  V_i,jj)``: restricted maximum likelihood by the fixed-point iteration of Viechtbauer 2005
  (https://doi.org/10.3102/10769986030003261, his eq. 11, truncated at 0), or Paule & Mandel
  1982 (https://doi.org/10.6028/jres.087.022: ``sum_i w_i (theta_hat_ij - mu_j)^2 = m - 1``,
  ``w_i = 1 / (tau_j^2 + V_i,jj)``; 0 where it is below m - 1 at 0); with equal ``V_i,jj = v``
  both are ``max(0, s_j^2 - v)``;
- ``diag REML, t(m-2)``: the same with Student's t on ``m - 2`` degrees of freedom, the
  prediction interval of Higgins, Thompson & Spiegelhalter 2009
  (https://doi.org/10.1111/j.1467-985X.2008.00552.x);
- ``Sigma_ci if Sigma != 0 else diag REML``; ``Sigma + diag(tau^2 - Sigma_jj)+``: the models'
  ``Sigma`` with each parameter's marginal variance it misses added on the diagonal;
- with ``--jackknife`` (about 20 times the CPU): ``Sigma_ci, jackknife``, the jackknife over
  clients of Jiang, Lahiri & Wan 2002 (https://doi.org/10.1214/aos/1043351257) applied to
  the default: the whole of ``fleet`` rerun without each client g, ``mse_i = max(0, b_i -
  (M - 1)/M sum_g (b_i^(g) - b_i)) + (M - 1)/M sum_g (theta_i^(g) - theta_i)^2`` with
  ``b_i`` the squared standard error with ``Sigma_ci`` and ``theta_i`` the models;
- with ``--bootstrap B``: the default's standard errors times a parametric-bootstrap
  multiplier (:func:`bootstrap_multiplier`: B fleets drawn from the fitted model and
  estimated as the data were), drawn from ``Sigma_ci`` after each of ``--rounds`` rounds of
  bias correction, and from the models' ``Sigma``; one multiplier per repeat, or per
  (repeat, parameter);
- with ``--frontier``: a family of per-parameter rules ``Sigma' = diag(max(0, lam (s_j^2 -
  v_j) + d v_j))`` (``s_j^2`` the spread of the clients' own estimates of parameter j,
  ``v_j`` their mean variance; ``lam = 1, d = 0`` is the moment estimate) over a grid of
  ``lam`` in :data:`FRONTIER_LAM` and ``d`` in :data:`FRONTIER_D`, each member judged
  against the truth: how many cover 93-97 % at every eps and seed, and the best coverage at
  the largest eps (of the first two) that those within 97 % at eps = 0 reach. A rule tuned
  on the truth bounds what any rule of the family can do on these fleets.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import pandas as pd
from scipy.special import stdtrit

import fnsysid
from fnsysid.learning import personalize as pers
from fnsysid.results.personal import target_stats

#: the grid of ``--frontier``: ``Sigma' = diag(max(0, lam (s_j^2 - v_j) + d v_j))``
FRONTIER_LAM = (1.0, 1.5, 2.0, 3.0, 4.0)
FRONTIER_D = tuple(np.round(np.linspace(-0.6, 0.2, 17), 2))
BASE = {"system": "synthetic", "M": 20, "N": 10, "progress": False, "output.plot": False,
        "strategy": "centralized_exact", "personalize": "none", "R": 1}
LEVEL = 0.95


def marginal(theta, V, own, method: str = "reml", iterations: int = 2000, tol: float = 1e-12):
    """Heterogeneity variance ``tau_j^2`` (S, p) of each parameter from the clients' own
    estimates ``theta`` (S, M, p) and variances ``V`` (S, M, p) over the clients ``own``
    (S, M), and whether each converged (REML: the fixed point moved by less than ``tol``
    relative; PM: bisection to the resolution of a float)."""
    w0 = own.astype(float)[..., None]
    v = np.where(own[..., None], V, 1.0)
    m = w0.sum(axis=1)
    mean = (w0 * theta).sum(axis=1) / m
    s2 = (w0 * (theta - mean[:, None]) ** 2).sum(axis=1) / (m - 1)
    if method == "reml":
        tau = np.maximum(s2 - (w0 * v).sum(axis=1) / m, 0.0)
        for _ in range(iterations):
            w = w0 / (tau[:, None] + v)
            mu = (w * theta).sum(axis=1) / w.sum(axis=1)
            new = np.maximum((w ** 2 * ((theta - mu[:, None]) ** 2 + 1 / w.sum(axis=1)[:, None]
                                        - v)).sum(axis=1) / (w ** 2).sum(axis=1), 0.0)
            done = np.abs(new - tau) <= tol * np.maximum(s2, np.finfo(float).tiny)
            tau = new
            if done.all():
                break
        return tau, done

    def q(t):
        w = w0 / (t[:, None] + v)
        mu = (w * theta).sum(axis=1) / w.sum(axis=1)
        return (w * (theta - mu[:, None]) ** 2).sum(axis=1)

    lo, hi = np.zeros_like(s2), np.maximum(s2 * (m - 1), np.finfo(float).tiny)  # q(hi) <= 1
    pos = q(lo) > m - 1
    for _ in range(200):
        mid = (lo + hi) / 2
        big = q(mid) > m - 1
        lo, hi = np.where(big, mid, lo), np.where(big, hi, mid)
    return np.where(pos, (lo + hi) / 2, 0.0), np.ones_like(pos)


def _replicates(msg, fl, blocks, Sigma, level: float, B: int, rng,
                **options) -> tuple[np.ndarray, np.ndarray]:
    """B fleets per repeat drawn from ``(fl.mu, Sigma)`` and the clients' ``H_i`` (see
    :func:`bootstrap_multiplier`), estimated as the data were: the studentized errors
    ``|theta_hat_i* - theta_i*| / (z se_i*)`` (S, B, M, p) and the replicates' ``Sigma_ci``
    (S, B, p, p)."""
    S, M, p = msg.b.shape
    lam, U = np.linalg.eigh(Sigma)
    Lc = U * np.sqrt(np.maximum(lam, 0.0))[:, None, :]                        # (S, p, p)
    truth = fl.mu[:, None, None] + np.einsum("spq,sbmq->sbmp", Lc,
                                             rng.standard_normal((S, B, M, p)))
    r = np.sqrt(np.asarray(fl.s2, float).reshape(S, -1)[:, None, blocks.param_block])
    lh, Uh = np.linalg.eigh(msg.H * r[..., :, None] * r[..., None, :])      # Cov(b_i)
    Lh = Uh * np.sqrt(np.maximum(lh, 0.0))[..., None, :]                       # (S, M, p, p)
    b = (np.einsum("smpq,sbmq->sbmp", msg.H, truth)
         + np.einsum("smpq,sbmq->sbmp", Lh, rng.standard_normal((S, B, M, p))))
    g = np.asarray(fl.s2).reshape(S, -1).shape[-1]
    dof = msg.dof.reshape(S, M, g)
    s2 = np.asarray(fl.s2, float).reshape(S, 1, 1, g)
    rss = np.where(dof[:, None] > 0, s2 * rng.chisquare(np.maximum(dof[:, None], 1.0),
                                                        (S, B, M, g)), 0.0)

    def rep(a):
        return np.repeat(a, B, axis=0)

    star = pers.Message(rep(msg.H), b.reshape(S * B, M, p), rss.reshape(S * B, M, g),
                   rep(dof), rep(msg.own))
    fls = pers.fleet(star, blocks, **options)
    th, se = pers.client_posterior(star, fls, blocks)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (np.abs(th.reshape(S, B, M, p) - truth)
             / (pers.z_value(level) * se.reshape(S, B, M, p)))
    return np.where(np.isnan(t), 0.0, t), fls.Sigma_ci.reshape(S, B, p, p)  # 0/0: exact


def bootstrap_multiplier(msg, fl, blocks, level: float = 0.95, B: int = 20,
                         seed: int = 0, structures=(), criterion: str = "bic",
                         max_rank: int = pers.MAX_RANK, per_parameter: bool = False,
                         corrected: int = 1, source: str = "Sigma_ci",
                         errors: bool = False):
    """Parametric-bootstrap calibration of ``auto``'s intervals (Hall & Maiti 2006,
    https://doi.org/10.1111/j.1467-9868.2006.00541.x; Chatterjee, Lahiri & Li 2008,
    https://doi.org/10.1214/07-AOS512): the multiplier ``c`` (S,) (or (S, p) with
    ``per_parameter``) of the standard errors such that ``theta_i -/+ c z se_i`` covers
    ``level`` of the clients' parameters in B fleets drawn from the fitted model.

    Each replicate keeps every client's ``H_i`` and ``own`` and draws its truth
    ``theta_i* ~ N(mu, Sigma*)``, its moments ``b_i* ~ N(H_i theta_i*, S^1/2 H_i S^1/2)``
    (the least-squares noise with the fleet's residual variances ``S``, also where ``H_i`` is
    singular) and its residual sums ``rss_i* ~ s2 chi2(dof_i)``; the whole estimation
    (``fleet``, with the same ``structures``, ``criterion`` and ``max_rank``, then
    ``client_posterior``) runs on the B replicates of every repeat stacked on the repeats'
    axis (one call), and ``c`` is the ``level`` quantile of ``|theta_hat_i* -
    theta_i*| / (z se_i*)`` over (replicate, client, parameter) of each repeat.

    ``Sigma*`` is the fleet's ``Sigma_ci`` (``source``; or the models' ``Sigma``, the test's
    and the rank's) after ``corrected`` rounds of bootstrap bias correction, each of B
    replicates drawn from the current ``Sigma*``: ``Sigma* <- (Sigma* + Sigma_ci - mean_b
    Sigma_ci*_b)+`` (the positive part; the unrestricted REML is positive semi-definite,
    biased upward in the directions without heterogeneity, so a truth drawn from it is more
    heterogeneous than the fleet; the rounds seek the ``Sigma*`` whose replicates' mean
    ``Sigma_ci`` is the fleet's). ``errors``: return the studentized errors (S, B, M, p) of
    the calibrating replicates instead of ``c``."""
    rng = np.random.default_rng(seed)
    S, M, p = msg.b.shape
    if isinstance(blocks, (int, np.integer)):
        blocks = pers.pooled_blocks(int(blocks), p)
    options = {"structures": structures, "criterion": criterion, "max_rank": max_rank}
    if source not in ("Sigma_ci", "Sigma"):
        raise ValueError(f"bootstrap source must be 'Sigma_ci' or 'Sigma', not {source!r}")
    Sig = fl.Sigma_ci if source == "Sigma_ci" else fl.Sigma
    for _ in range(int(corrected)):
        _, Sci = _replicates(msg, fl, blocks, Sig, level, B, rng, **options)
        lam, U = np.linalg.eigh(Sig + fl.Sigma_ci - Sci.mean(axis=1))
        Sig = (U * np.maximum(lam, 0.0)[:, None, :]) @ np.swapaxes(U, -1, -2)
    t, _ = _replicates(msg, fl, blocks, Sig, level, B, rng, **options)
    if errors:
        return t
    return multiplier(t, level, per_parameter)

def multiplier(t, level: float = 0.95, per_parameter: bool = False) -> np.ndarray:
    """The ``level`` quantile of the studentized errors ``t`` (S, B, M, p) of each repeat
    (S,), or of each (repeat, parameter) (S, p)."""
    S, B, M, p = t.shape
    if per_parameter:
        return np.quantile(t.transpose(0, 3, 1, 2).reshape(S, p, B * M), level, axis=-1)
    return np.quantile(t.reshape(S, -1), level, axis=-1)


def jackknife(msg, fl, blocks):
    """``(mse, floored)`` (S, M, p): the jackknife mean squared error of the models over the
    M fleets without one client each (stacked on the repeats' axis: one ``fleet`` call), and
    where its bias-corrected part was negative (floored at 0)."""
    S, M, p = msg.b.shape

    def drop(a):
        return np.concatenate([np.delete(a, g, axis=1) for g in range(M)], axis=0)

    def rep(a):
        return np.concatenate([a] * M, axis=0)

    fields = [f.name for f in dataclasses.fields(msg)]
    flg = pers.fleet(pers.Message(*(drop(getattr(msg, f)) for f in fields)), blocks)
    theta, se = pers.client_posterior(msg, fl, blocks)
    thg, seg = pers.client_posterior(pers.Message(*(rep(getattr(msg, f)) for f in fields)),
                                     flg, blocks)
    thg, seg = thg.reshape(M, S, M, p), seg.reshape(M, S, M, p)
    b = se ** 2
    corrected = b - (M - 1) / M * (seg ** 2 - b).sum(axis=0)
    return (np.maximum(corrected, 0.0) + (M - 1) / M * ((thg - theta) ** 2).sum(axis=0),
            corrected < 0)


def measure(eps: float, seed: int, repeats: int, detail: bool = False,
            jack: bool = False, boot: int = 0, rounds=(0,), frontier: bool = False) -> dict:
    """Coverage of each candidate on one fleet (eps, seed); ``detail``: print, per
    parameter, the coverage of ``diag REML``, its share of ``tau_j^2 = 0``, the true spread
    over clients and the clients' mean own standard error."""
    r = fnsysid.run({**BASE, "eps": eps, "repeats": repeats, "seed": seed})
    model, d = r.model, r.dataset.train
    yy, blocks = target_stats(model, d)
    msg = pers.client_message(d.H, d.b, yy, d.n, blocks)
    fl = pers.fleet(msg, blocks)
    J, beta = pers._scaled(msg, fl.s2, blocks)
    own, p = msg.own, J.shape[-1]
    V = np.linalg.inv(np.where(own[..., None, None], J, np.eye(p)))
    th = np.einsum("...pq,...q->...p", V, np.where(own[..., None], beta, 0.0))
    Vd = np.diagonal(V, axis1=-2, axis2=-1)
    z = pers.z_value(LEVEL)
    m = own.sum(axis=1)
    t = stdtrit(np.maximum(m - 2, 1), 0.5 + LEVEL / 2)[:, None, None]
    out = {}

    def cover(Sci, name, q=z):
        models, se = pers.client_posterior(msg, dataclasses.replace(fl, Sigma_ci=Sci), blocks)
        inside = np.abs(models - d.theta_true) <= q * se
        out[name] = float(inside.mean())
        return inside

    hetero = (np.abs(fl.Sigma).max(axis=(1, 2)) > 0)[:, None, None]
    cover(fl.Sigma_ci, "Sigma_ci")
    cover(np.zeros_like(fl.Sigma), "0")
    cover(fl.Sigma, "Sigma")
    for method in ("reml", "pm"):
        tau, ok = marginal(th, Vd, own, method)
        if not ok.all():
            print(f"eps={eps} seed={seed}: the marginal {method} did not converge in "
                  f"{(~ok).sum()} (repeat, parameter)", file=sys.stderr)
        D = tau[:, :, None] * np.eye(p)
        inside = cover(D, f"diag {method.upper()}")
        if method == "reml" and detail:
            print(pd.DataFrame({
                "coverage": inside.mean(axis=(0, 1)), "tau^2 = 0": (tau == 0).mean(axis=0),
                "true sd": d.theta_true.std(axis=1).mean(axis=0),
                "own se": np.sqrt(np.where(own[..., None], Vd, np.nan)).mean(axis=(0, 1))},
                index=model.param_names).round(3).to_string(
                    header=[f"eps={eps:g} seed={seed}: coverage", "tau^2 = 0", "true sd",
                            "own se"]))
        if method == "reml":
            cover(D, "diag REML, t(m-2)", t)
            cover(np.where(hetero, fl.Sigma_ci, D), "Sigma_ci if Sigma != 0 else diag REML")
            miss = np.maximum(tau - np.diagonal(fl.Sigma, axis1=-2, axis2=-1), 0.0)
            cover(fl.Sigma + miss[:, :, None] * np.eye(p), "Sigma + diag(tau^2 - Sigma_jj)+")
            out["tau^2 = 0 (share)"] = float((tau == 0).mean())
    if boot:
        for src, corr, base in ([(f"Sigma_ci bias-corrected {k}x", k, "Sigma_ci")
                                  for k in rounds] + [("the models' Sigma", 0, "Sigma")]):
            tb = bootstrap_multiplier(msg, fl, blocks, LEVEL, boot, seed,
                                           corrected=corr, source=base, errors=True)
            c = multiplier(tb, LEVEL)
            cover(fl.Sigma_ci, f"Sigma_ci, bootstrap from {src} (B={boot})", z * c[:, None, None])
            cp = multiplier(tb, LEVEL, per_parameter=True)
            cover(fl.Sigma_ci, f"Sigma_ci, bootstrap from {src} per parameter (B={boot})",
                  z * cp[:, None, :])
            out[f"bootstrap from {src}: multiplier (median)"] = float(np.median(c))
    if frontier:
        w = own.astype(float)
        mean = np.einsum("sm,smp->sp", w, th) / m[:, None]
        spread = (np.einsum("sm,smp->sp", w, (th - mean[:, None]) ** 2)
                  / np.maximum(m - 1, 1)[:, None])
        vbar = np.einsum("sm,smp->sp", w, Vd) / m[:, None]
        for lam in FRONTIER_LAM:
            for dd in FRONTIER_D:
                tau = np.maximum(lam * (spread - vbar) + dd * vbar, 0.0)
                cover(tau[:, :, None] * np.eye(p), f"frontier {lam:g},{dd:g}")
    if jack:
        mse, floored = jackknife(msg, fl, blocks)
        models, _ = pers.client_posterior(msg, fl, blocks)
        out["Sigma_ci, jackknife"] = float((np.abs(models - d.theta_true)
                                            <= z * np.sqrt(mse)).mean())
        out["jackknife floored (share)"] = float(floored.mean())
    out["Sigma != 0 (share)"] = float(hetero.mean())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--eps", default="0,0.3,1")
    ap.add_argument("--detail", action="store_true",
                    help="per parameter: coverage of diag REML, tau^2 = 0, spreads")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="B",
                    help="also the parametric-bootstrap calibration with B replicates")
    ap.add_argument("--rounds", default="0,1",
                    help="the bootstrap's rounds of bias correction of Sigma_ci, e.g. 0,1,3")
    ap.add_argument("--jackknife", action="store_true",
                    help="also the jackknife of the default (about 20 times the CPU)")
    ap.add_argument("--frontier", action="store_true",
                    help="also a family of per-parameter rules judged against the truth")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.repeats < 2 or args.bootstrap < 0:
        ap.error("--seeds must be >= 1, --repeats >= 2 and --bootstrap >= 0")
    try:
        eps_list = [float(e) for e in args.eps.split(",")]
    except ValueError:
        ap.error(f"--eps must be numbers separated by commas, not {args.eps!r}")
    try:
        rounds = [int(k) for k in args.rounds.split(",")]
    except ValueError:
        ap.error(f"--rounds must be integers separated by commas, not {args.rounds!r}")
    rows = [{"eps": eps, "seed": seed, "Sigma'": k, "coverage": v}
            for eps in eps_list for seed in range(args.seeds)
            for k, v in measure(eps, seed, args.repeats, args.detail,
                                args.jackknife, args.bootstrap, rounds,
                                args.frontier).items()]
    frame = pd.DataFrame(rows)
    rule = frame["Sigma'"].str.startswith("frontier ")
    g = frame[~rule].groupby(["Sigma'", "eps"], sort=False)["coverage"]
    table = g.agg(lambda x: f"{x.min():.3f}-{x.max():.3f}").unstack("eps")
    print(f"coverage (range over seeds 0-{args.seeds - 1}, {args.repeats} repeats each):")
    print(table.to_string())
    if rule.any():
        print(frontier_summary(frame[rule], eps_list))
    return 0


def frontier_summary(rows: pd.DataFrame, eps_list) -> str:
    """``--frontier``'s rows (eps, seed, Sigma', coverage) -> how many rules cover 93-97 %
    at every eps and seed, and, among those within 97 % at the first eps on every seed, the
    best lowest coverage over seeds at the second (and their ranges)."""
    lo = rows.groupby(["Sigma'", "eps"])["coverage"].min().unstack("eps")
    hi = rows.groupby(["Sigma'", "eps"])["coverage"].max().unstack("eps")
    meet = ((lo >= 0.93) & (hi <= 0.97)).all(axis=1)
    lines = [f"frontier: {int(meet.sum())} of {len(lo)} rules diag(max(0, lam (s^2 - v) + d v))"
             " cover 93-97 % at every eps and seed"]
    if len(eps_list) >= 2:
        first, second = eps_list[0], eps_list[1]
        within = hi[first] <= 0.97
        if within.any():
            best = lo.loc[within, second].sort_values(ascending=False).index[:3]
            for name in best:
                ranges = ", ".join(f"eps={e:g}: {lo.loc[name, e]:.3f}-{hi.loc[name, e]:.3f}"
                                   for e in eps_list)
                lines.append(f"  within 97 % at eps={first:g}, best at eps={second:g}: "
                             f"lam,d = {name.split(' ', 1)[1]}: {ranges}")
        else:
            lines.append(f"  none is within 97 % at eps={first:g} on every seed")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
