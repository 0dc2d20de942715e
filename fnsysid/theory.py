"""The paper's Theorem 1 evaluated on a run's data.

Theorem 1: with probability >= 1 - 3 delta, for every client i,
``||theta_bar_LSE - theta_i*|| <= C1 sqrt((n_x + n_phi + log(2M/delta)) / N_tot) + C2 eps``
with ``C1 = 8 sigma_w / s_phi^2`` and ``C2 = b_phi / s_phi^2 + 1/2``. The constants that the data
determine are estimated from the pooled data of each repeat:

- ``sigma_w``: root mean square residual of the pooled least squares, per target coordinate;
- ``s_phi^2 = 2 lambda_min(G) / N_tot`` (Proposition 1's ``G >= 1/2 s_phi^2 N_tot I``), with
  ``G`` the pooled Gram matrix in parameter space;
- ``b_phi = max_t ||phi_t||^2`` over all samples;
- ``eps`` (Assumption 5): ``max_ij ||theta_i* - theta_j*||``, exact up to 2000 clients, else
  the upper bound ``2 max_i ||theta_i* - mean_j theta_j*||``;
- ``n_x`` = number of regression targets, ``n_phi`` = number of features, ``N_tot = sum N_i T``.

The bound is absolute; ``bound_rel`` divides it by ``min_i ||theta_i*||`` so that it bounds the
relative errors ``e^(i)`` the runs report.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .model import ClientData, Model, least_squares, pooled

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
    """Right-hand side of Theorem 1 and its ingredients, one row per repeat."""
    S, M = data.shape
    P = pooled(data)
    H, b, yy, n_tot = P.H[:, 0], P.b[:, 0], P.yy[:, 0], P.n[:, 0]
    theta = least_squares(H, b)
    rss = yy - 2 * np.einsum("sp,sp->s", b, theta) + np.einsum("sp,spq,sq->s", theta, H, theta)
    n_y, n_phi = model.structure.shape[:2]
    sigma_w = np.sqrt(np.maximum(rss, 0.0) / (n_tot * n_y))
    s_phi2 = 2 * np.linalg.eigvalsh(H)[:, 0] / n_tot
    b_phi = data.phi2max.max(axis=1)
    eps = heterogeneity(data.theta_true)
    with np.errstate(divide="ignore"):
        C1, C2 = 8 * sigma_w / s_phi2, b_phi / s_phi2 + 0.5
    noise_term = C1 * np.sqrt((n_y + n_phi + np.log(2 * M / delta)) / n_tot)
    bound = noise_term + C2 * eps
    return pd.DataFrame({
        "repeat": np.arange(S), "delta": delta, "N_tot": n_tot, "n_x": n_y, "n_phi": n_phi,
        "sigma_w": sigma_w, "s_phi2": s_phi2, "b_phi": b_phi, "eps": eps, "C1": C1, "C2": C2,
        "noise_term": noise_term, "bound": bound,
        "bound_rel": bound / np.linalg.norm(data.theta_true, axis=-1).min(axis=1),
    })
