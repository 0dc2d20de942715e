"""Held-out trajectories of each client, kept apart from the training data.

The strategies never see them; :mod:`fnsysid.results.metrics` scores the models on them. The
one-step error of a model is a quadratic in its parameters, so it comes from held-out sufficient
statistics (``gram``, ``cross``, ``yy``) at O(p^2) per client; the free-run error needs the
trajectories themselves (``x``, ``u``, ``mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import Model, chunk_clients, for_chunks, moments


@dataclass
class HeldOut:
    """Held-out data of ``S`` repeats x ``M`` clients, padded to ``J`` trajectories of ``L``
    samples.

    Attributes
    ----------
    gram : (S, M, n_phi, n_phi) ``sum_t phi_t phi_t'`` over held-out transitions.
    cross : (S, M, n_y, n_phi) ``sum_t y_t phi_t'``.
    yy : (S, M, n_y) ``sum_t y_t^2`` per target.
    n : (S, M) number of held-out transitions (0: client without held-out data).
    std : (S, M, n_x) standard deviation of each state over the client's held-out samples.
    x : (S, M, J, L, n_x) states; u : (S, M, J, L - 1, n_u) inputs; mask : (S, M, J, L) bool.
    """

    gram: np.ndarray
    cross: np.ndarray
    yy: np.ndarray
    n: np.ndarray
    std: np.ndarray
    x: np.ndarray
    u: np.ndarray
    mask: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        """(S, M) clients with held-out data."""
        return self.n > 0


def heldout_from_trajectories(model: Model, x: np.ndarray, u: np.ndarray,
                              mask: np.ndarray) -> HeldOut:
    """Held-out statistics of padded trajectories.

    Parameters
    ----------
    x : (S, M, J, L, n_x) states; u : (S, M, J, L - 1, n_u) inputs (padding: any finite value).
    mask : (S, M, J, L) True where a sample exists (a prefix of each trajectory).

    Computed a chunk of clients at a time, on the threads of
    :func:`~fnsysid.dynamics.model.for_chunks` (the values do not depend on the chunking).
    """
    mask = np.asarray(mask, bool)
    S, M, J, L = mask.shape
    n_y, n_phi = model.structure.shape[:2]
    gram, cross = np.empty((S, M, n_phi, n_phi)), np.empty((S, M, n_y, n_phi))
    yy, n, std = np.empty((S, M, n_y)), np.empty((S, M)), np.empty((S, M, x.shape[-1]))

    def work(s: int, chunk: list[tuple[int, int, int]]) -> None:
        lo, hi = chunk[0][1], chunk[-1][2]
        xs, ms = x[s, lo:hi], mask[s, lo:hi]
        Phi, Y = model.regression(xs, u[s, lo:hi])                  # (m, J, L-1, .)
        m = hi - lo
        w = (ms[..., 1:] & ms[..., :-1]).astype(float).reshape(m, -1)
        _, Z, _, Zw, gram[s, lo:hi], cross[s, lo:hi] = moments(
            Phi.reshape(m, -1, n_phi), Y.reshape(m, -1, n_y), w)
        yy[s, lo:hi] = np.einsum("y...n,y...n->y...", Zw, Z).T
        n[s, lo:hi] = w.sum(axis=-1)
        # per-state spread over the client's samples, states first (contiguous sums)
        xt = np.ascontiguousarray(np.moveaxis(xs.reshape(m, -1, xs.shape[-1]), -1, 0))
        mf = ms.reshape(m, -1).astype(float)
        full = bool(ms.all())
        cnt = np.maximum(mf.sum(axis=-1), 1.0)
        d = xt - (xt if full else xt * mf).sum(axis=-1, keepdims=True) / cnt[:, None]
        if not full:
            d *= mf
        d *= d
        std[s, lo:hi] = np.sqrt(d.sum(axis=-1) / cnt).T

    for_chunks(S, rnd.blocks(M), chunk_clients(model, J, L - 1), work)
    return HeldOut(gram, cross, yy, n, std, x, u, mask)
