"""The synthetic rows of docs/ALGORITHMS.md's table of ``personalize=auto`` against "best".

Usage: python scripts/personalized_table.py [--seeds 3] [--rows all] [--oracle]
[--structures identity,noise,diagonal] [--criterion bic] [--max-rank 4]

Each row draws synthetic fleets with ``fnsysid.dynamics.model.generate`` (the ``system=synthetic``
model; its ``T`` = 5; ``N``, ``M``, ``eps``, repeats and system settings as in the row) on the
seeds 0 ... ``--seeds``-1, and runs :func:`fnsysid.learning.personalize.auto` on the
statistics, as a run with ``personalize=auto`` does. The error of a method on one seed is the
mean over repeats and clients of ``||theta - theta_i*|| / ||theta_i*||``; "best" is the better
of the clients' own least squares (``local``) and pooled least squares (``pooled``), and the
row prints the range over seeds of ``auto / best`` (and of the three errors). ``--oracle``
adds the same ratio for the heterogeneity covariance known: the spread of the true
``theta_i*`` over every repeat and client of the seed (rank 2 in the synthetic family), used
in the fleet mean and the clients' posterior means on the same data, and "shape": that
covariance's shape known and its scale estimated by REML. ``--structures`` and
``--criterion``, ``--max-rank``: the REML's candidate structures of the heterogeneity and
the rule that chooses among them (``fnsysid.learning.personalize.reml``; ``--structures
none`` is the low ranks alone, ``--max-rank 0 --structures diagonal`` a diagonal or 0).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fnsysid.app.api import compose
from fnsysid.app.build import build
from fnsysid.config.checks import check_run
from fnsysid.dynamics.model import generate
from fnsysid.learning import personalize as pers
from fnsysid.results.personal import target_stats

#: rows: (name, M, N, eps, repeats a seed, extra system settings)
ROWS = {
    "N3": ("M = 20, N = 3, eps = 0", 20, 3, 0.0, 60, {}),
    "M5e0": ("M = 5, N = 10, eps = 0", 5, 10, 0.0, 100, {}),
    "M5e0.3": ("M = 5, eps = 0.3", 5, 10, 0.3, 100, {}),
    "M5e1": ("M = 5, eps = 1", 5, 10, 1.0, 100, {}),
    "M5e3": ("M = 5, eps = 3", 5, 10, 3.0, 100, {}),
    "M7e1": ("M = 7, eps = 1", 7, 10, 1.0, 100, {}),
    "M7e3": ("M = 7, eps = 3", 7, 10, 3.0, 100, {}),
    "M10e1": ("M = 10, eps = 1", 10, 10, 1.0, 60, {}),
    "M10e3": ("M = 10, eps = 3", 10, 10, 3.0, 60, {}),
    "scale": ("M = 20, N = 10, disturbance.scale=[0.2,1,3], eps = 0", 20, 10, 0.0, 50,
              {"system.disturbance.scale": [0.2, 1.0, 3.0]}),
    "M20e0": ("M = 20, N = 10, eps = 0", 20, 10, 0.0, 30, {}),
    "M20e0.3": ("M = 20, N = 10, eps = 0.3", 20, 10, 0.3, 30, {}),
    "M20e1": ("M = 20, N = 10, eps = 1", 20, 10, 1.0, 30, {}),
    "M20e3": ("M = 20, N = 10, eps = 3", 20, 10, 3.0, 30, {}),
}

T = 5


def fleet_data(M: int, N: int, eps: float, repeats: int, seed: int, extra: dict):
    """``(data, yy, blocks)``: the statistics of ``repeats`` synthetic fleets and their
    per-target sums of squares with the model's noise blocks."""
    settings = check_run(compose({"system": "synthetic", "M": M, "N": N, "T": T, "eps": eps,
                                  "repeats": repeats, **extra})[0])
    model = build(settings)[0]
    d = generate(model, M, N, T, eps, repeats, seed)
    yy, blocks = target_stats(model, d)
    return d, yy, blocks


def client_error(est, truth) -> float:
    """Mean over repeats and clients of ``||est - truth|| / ||truth||``."""
    return float((np.linalg.norm(est - truth, axis=-1)
                  / np.linalg.norm(truth, axis=-1)).mean())


def oracle(d, yy, blocks):
    """The clients' posterior means with the true heterogeneity covariance (the spread of
    ``theta_true`` over all repeats and clients) in place of the estimated one, and with its
    shape known and its scale estimated (the REML of ``tau^2`` in ``Sigma = tau^2 Sigma_true``,
    ``Sigma = 0`` where the homogeneity test does not reject, as ``auto``)."""
    msg = pers.client_message(d.H, d.b, yy, d.n, blocks)
    fl = pers.fleet(msg, blocks)
    p = d.theta_true.shape[-1]
    Sig = np.cov(d.theta_true.reshape(-1, p), rowvar=False)
    Sig = np.broadcast_to(Sig, fl.Sigma.shape).copy()
    J, beta = pers._scaled(msg, fl.s2, blocks)
    mu, cov_mu = pers.fleet_mean(J, beta, Sig)
    known = pers.Fleet(mu, cov_mu, Sig, fl.s2, Sig, fl.Q, fl.pvalue)
    # the shape known, its scale estimated: the REML of tau^2 in Sigma = tau^2 Sig
    own = msg.own
    theta = np.einsum("...pq,...q->...p",
                      np.linalg.inv(np.where(own[..., None, None], J, np.eye(p))),
                      np.where(own[..., None], beta, 0.0))
    shape = pers._one_parameter(theta, J * own[..., None, None], own.astype(float), Sig)[0]
    shape = np.where((fl.pvalue < pers.HOMOGENEITY_LEVEL)[:, None, None], shape, 0.0)
    mu, cov_mu = pers.fleet_mean(J, beta, shape)
    scaled = pers.Fleet(mu, cov_mu, shape, fl.s2, shape, fl.Q, fl.pvalue)
    return (pers.client_posterior(msg, known, blocks)[0],
            pers.client_posterior(msg, scaled, blocks)[0])


def row(key: str, seed: int, with_oracle: bool, structures=(),
        criterion: str = "bic", max_rank: int = pers.MAX_RANK) -> dict:
    _, M, N, eps, repeats, extra = ROWS[key]
    d, yy, blocks = fleet_data(M, N, eps, repeats, seed, extra)
    truth = d.theta_true
    t = time.process_time()
    theta = pers.auto(d.H, d.b, yy, d.n, blocks, structures, criterion, max_rank)[0]
    cpu = time.process_time() - t
    local = np.linalg.solve(d.H, d.b[..., None])[..., 0]
    pooled = np.linalg.solve(d.H.sum(axis=1), d.b.sum(axis=1)[..., None])[:, None, :, 0]
    out = {"auto": client_error(theta, truth), "local": client_error(local, truth),
           "pooled": client_error(pooled, truth), "cpu": cpu}
    best = min(out["local"], out["pooled"])
    out["ratio"] = out["auto"] / best
    if with_oracle:
        known, shape = oracle(d, yy, blocks)
        out["oracle"] = client_error(known, truth) / best
        out["shape"] = client_error(shape, truth) / best
    return out


def span(res: list[dict], q: str, f: str = "{:.2f}") -> str:
    """The range over seeds of quantity ``q`` (one number where it rounds to one)."""
    v = [r[q] for r in res]
    lo, hi = f.format(min(v)), f.format(max(v))
    return lo if lo == hi else f"{lo}-{hi}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0 ... seeds-1")
    ap.add_argument("--rows", default="all",
                    help=f"comma-separated rows of {', '.join(ROWS)}, or all")
    ap.add_argument("--oracle", action="store_true",
                    help="also the heterogeneity covariance known")
    ap.add_argument("--structures", default="none",
                    help="the structures of Sigma besides 0 and the low ranks that the REML "
                         f"compares: comma-separated of {', '.join(pers.STRUCTURES)}, or none")
    ap.add_argument("--criterion", default="bic", choices=sorted(pers.CRITERIA),
                    help="the information criterion that chooses among them")
    ap.add_argument("--max-rank", type=int, default=pers.MAX_RANK,
                    help="the largest rank of the low-rank structures (0: none)")
    a = ap.parse_args(argv)
    structures = () if a.structures == "none" else tuple(a.structures.split(","))
    if any(x not in pers.STRUCTURES for x in structures):
        ap.error(f"--structures={a.structures} is not allowed: comma-separated of "
                 f"{', '.join(pers.STRUCTURES)}, or none")
    if a.max_rank < 0:
        ap.error(f"--max-rank={a.max_rank} is not allowed: an integer >= 0")
    if a.seeds < 1:
        ap.error(f"--seeds={a.seeds} is not allowed: an integer >= 1")
    keys = list(ROWS) if a.rows == "all" else a.rows.split(",")
    bad = [k for k in keys if k not in ROWS]
    if bad:
        ap.error(f"--rows={a.rows} is not allowed: rows of {', '.join(ROWS)}, or all")
    head = "auto / best   " + ("oracle / best  shape / best  " if a.oracle else "")
    print(f"{'row':58s} {'repeats':>7s}  {head}auto, local, pooled", flush=True)
    for k in keys:
        res = [row(k, s, a.oracle, structures, a.criterion, a.max_rank)
               for s in range(a.seeds)]
        name, reps = ROWS[k][0], ROWS[k][4]
        print(f"{name:58s} {reps:7d}  {span(res, 'ratio'):12s}  "
              + (f"{span(res, 'oracle'):13s}  {span(res, 'shape'):12s}  " if a.oracle
                 else "")
              + ", ".join(span(res, q, "{:.3f}") for q in ("auto", "local", "pooled"))
              + f"  (auto {sum(r['cpu'] for r in res):.1f} s CPU)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
