"""The REML of ``personalize=auto`` (SQUAREM-accelerated EM) against the plain EM run long.

Usage: python scripts/reml_convergence.py [--M 20] [--eps 1] [--seed 0] [--plain 20000]

Draws the synthetic fleet's statistics (``system=synthetic N=2 T=30``, one repeat, through
``fnsysid.dynamics.model.generate``), scales them as ``fnsysid.learning.personalize.reml``
does, and runs the unrestricted (full-rank) fit from ``reml``'s start three ways: accelerated
(the default ``tol`` 1e-6 and cap of 200 passes), the plain EM capped at 200 iterations, and
the plain EM for ``--plain`` iterations. Prints each one's CPU time, passes, ``trace Sigma``,
restricted log-likelihood and eigenvalues, and their largest difference (docs/ALGORITHMS.md,
REML).
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


def scaled_fleet(M: int, eps: float, seed: int):
    """``(th, Jw, w, m, start, sums)`` in ``reml``'s coordinates."""
    settings = check_run(compose({"system": "synthetic", "N": 2, "T": 30, "repeats": 1,
                                  "M": M, "eps": eps})[0])
    model = build(settings)[0]
    d = generate(model, M, 2, 30, eps, 1, seed)
    yy, blocks = target_stats(model, d)
    msg = pers.client_message(d.H, d.b, yy, d.n, blocks)
    S, M, p = msg.b.shape
    s2 = msg.rss.reshape(S, M, -1).sum(1) / msg.dof.reshape(S, M, -1).sum(1)
    J, beta = pers._scaled(msg, s2, blocks)
    own = msg.own
    theta = np.einsum("...pq,...q->...p", np.linalg.inv(np.where(own[..., None, None], J,
                                                                 np.eye(p))),
                      np.where(own[..., None], beta, 0.0))
    w = own.astype(float)
    m = np.maximum(w.sum(1), 1.0)
    dg = np.sqrt(np.diagonal(np.einsum("sm,smpq->spq", w, J) / m[:, None, None],
                             axis1=-2, axis2=-1))
    Js = J / (dg[:, None, :, None] * dg[:, None, None, :])
    th = theta * dg[:, None]
    V = np.linalg.inv(np.where(own[..., None, None], Js, np.eye(p)))
    dev = (th - (np.einsum("sm,smp->sp", w, th) / m[:, None])[:, None]) * w[..., None]
    C = np.einsum("smp,smq->spq", dev, dev) / np.maximum(m - 1, 1)[:, None, None]
    Vbar = np.einsum("sm,smpq->spq", w, V) / m[:, None, None]
    start = pers._truncate(C - Vbar, p) + Vbar
    Jw = Js * w[..., None, None]
    return th, Jw, w, m, start, (Jw.sum(1), np.einsum("smpq,smq->sp", Jw, th))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--M", type=int, default=20)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plain", type=int, default=20000)
    a = ap.parse_args(argv)
    th, Jw, w, m, start, sums = scaled_fleet(a.M, a.eps, a.seed)
    p = th.shape[-1]
    out = {}
    for name, its, tol, sq in (("squarem", 200, 1e-6, True), ("plain 200", 200, 0.0, False),
                               (f"plain {a.plain}", a.plain, 0.0, False)):
        t = time.process_time()
        Sig, _, ll, conv, n = pers._em(th, Jw, w, m, start, p, its, tol, *sums, squarem=sq)
        t = time.process_time() - t
        out[name] = Sig[0]
        print(f"{name}: {t:.2f} s CPU, converged {bool(conv[0])}, {int(n[0])} passes, "
              f"trace Sigma {np.trace(Sig[0]):.6g}, log-likelihood {ll[0]:.6f}")
        print("  eigenvalues", np.array2string(np.linalg.eigvalsh(Sig[0])[::-1], precision=3))
    ref = out[f"plain {a.plain}"]
    for name in ("squarem", "plain 200"):
        print(f"max |{name} - plain {a.plain}| / max |plain {a.plain}|: "
              f"{np.abs(out[name] - ref).max() / np.abs(ref).max():.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
