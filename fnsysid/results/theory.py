"""The paper's Theorem 1 evaluated on a run's data.

Theorem 1: with probability >= 1 - 3 delta, for every client i,
``||theta_bar_LSE - theta_i*|| <= C1 sqrt((n_x + n_phi + log(2M/delta)) / N_tot) + C2 eps``
with ``C1 = 8 sigma_w / s_phi^2`` and ``C2 = b_phi / s_phi^2 + 1/2``. The constants that the data
determine are estimated from the pooled data of each repeat:

- ``sigma_w``: root mean square residual of the pooled least squares, per target coordinate
  (the residuals' squares summed over the clients' QR factors,
  :func:`fnsysid.dynamics.model.residual_sums`, without the ~1e-16 ``yy`` floor of the
  expanded ``yy - 2 b'theta + theta'H theta``);
- ``s_phi^2 = 2 lambda_min(G) / N_tot`` (Proposition 1's ``G >= 1/2 s_phi^2 N_tot I``), with
  ``G`` the pooled Gram matrix in parameter space;
- ``b_phi = max_t ||phi_t||^2`` over all samples;
- ``eps`` (Assumption 5): ``max_ij ||theta_i* - theta_j*||``, exact up to 2000 clients, else
  the upper bound ``2 max_i ||theta_i* - mean_j theta_j*||``;
- ``n_x`` = number of regression targets, ``n_phi`` = number of features, ``N_tot = sum N_i T``.

This is a plug-in evaluation of the bound as the paper states it: the constants are estimated
from the data, not bounds that hold a priori. The bound is absolute; ``bound_rel`` divides it by
``min_i ||theta_i*||`` so that it bounds the relative errors ``e^(i)`` the runs report.

``bound_proof`` is the stated bound with the proof's constants corrected (plug-in; the noise
step is not repaired): the constants that the steps of the paper's own proof (appendix) give
once three of them are corrected (docs/ALGORITHMS.md, "Theorem 1 in numbers", which also lists
what is not repaired, so that it is not a proven bound either):

- ``||G^-1|| <= 2 / (s_phi^2 N_tot)`` multiplies the heterogeneity term too, so its constant is
  ``2 b_phi / s_phi^2``, not ``b_phi / s_phi^2``;
- Assumption 5 gives ``||theta_i* - theta_bar*|| <= (1 - 1/M) eps`` (the mean of M points lies
  in their convex hull), not ``eps / 2``: with M - 1 clients at one point and one at distance
  eps, that client is ``(1 - 1/M) eps`` from the mean;
- Proposition 2 uses ``||Phi||_F^2 <= N T b_phi <= N T (n_x + n_phi)``; when
  ``b_phi > n_x + n_phi`` the same tail needs ``t`` larger by ``sqrt(b_phi / (n_x + n_phi))``.

so ``bound_proof = C1' sqrt((n_x + n_phi + log(2M/delta)) / N_tot) + C2' (1 - 1/M) eps`` with
``C1' = C1 sqrt(max(1, b_phi / (n_x + n_phi)))`` and ``C2' = 2 b_phi / s_phi^2 + 1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fnsysid.dynamics.model import ClientData, Model, least_squares, pooled, residual_sums
from fnsysid.results.tables import Table

if TYPE_CHECKING:
    import pandas as pd

EXACT_PAIRS_MAX_M = 2000


def heterogeneity(theta_true: np.ndarray) -> np.ndarray:
    """``max_ij ||theta_i - theta_j||`` per repeat (or its upper bound for large M).

    The exact value uses ``||a - b||^2 = |a|^2 + |b|^2 - 2 a.b`` one repeat at a time, an
    M x M matrix (32 MB at the 2000-client limit).
    """
    S, M, _ = theta_true.shape
    if M > EXACT_PAIRS_MAX_M:
        centre = theta_true.mean(axis=1, keepdims=True)
        return 2 * np.linalg.norm(theta_true - centre, axis=-1).max(axis=1)
    out = np.empty(S)
    for s in range(S):
        t = theta_true[s] - theta_true[s].mean(axis=0)       # centring keeps cancellation small
        sq = np.einsum("mp,mp->m", t, t)
        d2 = sq[:, None] + sq[None, :] - 2 * t @ t.T
        out[s] = np.sqrt(max(d2.max(), 0.0))
    return out


def theorem1(data: ClientData, model: Model, delta: float) -> pd.DataFrame:
    """Right-hand side of Theorem 1 and its ingredients, one row per repeat (``theory.csv``)."""
    return theorem1_table(data, model, delta).to_frame()


def theorem1_table(data: ClientData, model: Model, delta: float) -> Table:
    """:func:`theorem1` as a :class:`~fnsysid.results.tables.Table` (what a run writes)."""
    S, M = data.shape
    P = pooled(data)
    H, b, yy, n_tot = P.H[:, 0], P.b[:, 0], P.yy[:, 0], P.n[:, 0]
    theta = least_squares(H, b)
    if data.factor is not None:                 # squared residuals, no cancellation
        rss = residual_sums(model, data.factor, theta[:, None]).sum(axis=(1, 2))
    else:
        rss = yy - 2 * np.einsum("sp,sp->s", b, theta) + \
            np.einsum("sp,spq,sq->s", theta, H, theta)
    n_y, n_phi = model.structure.shape[:2]
    sigma_w = np.sqrt(np.maximum(rss, 0.0) / (n_tot * n_y))
    s_phi2 = 2 * np.linalg.eigvalsh(H)[:, 0] / n_tot
    b_phi = data.phi2max.max(axis=1)
    eps = heterogeneity(data.theta_true)
    with np.errstate(divide="ignore"):
        C1, C2 = 8 * sigma_w / s_phi2, b_phi / s_phi2 + 0.5
    root = np.sqrt((n_y + n_phi + np.log(2 * M / delta)) / n_tot)
    noise_term = C1 * root
    bound = noise_term + C2 * eps
    # the proof's own steps, corrected (module docstring)
    C1p = C1 * np.sqrt(np.maximum(1.0, b_phi / (n_y + n_phi)))
    with np.errstate(divide="ignore"):
        C2p = 2 * b_phi / s_phi2 + 1.0
    bound_proof = C1p * root + C2p * (1 - 1 / M) * eps
    norm_min = np.linalg.norm(data.theta_true, axis=-1).min(axis=1)
    return Table({
        "repeat": np.arange(S), "delta": delta, "N_tot": n_tot, "n_x": n_y, "n_phi": n_phi,
        "sigma_w": sigma_w, "s_phi2": s_phi2, "b_phi": b_phi, "eps": eps, "C1": C1, "C2": C2,
        "noise_term": noise_term, "bound": bound, "bound_rel": bound / norm_min,
        "C1_proof": C1p, "C2_proof": C2p, "bound_proof": bound_proof,
        "bound_proof_rel": bound_proof / norm_min,
    })
