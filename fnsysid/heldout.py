"""Held-out trajectories of each client, kept apart from the training data.

The strategies never see them; :mod:`fnsysid.metrics` scores the models on them. The one-step
error of a model is a quadratic in its parameters, so it comes from held-out sufficient
statistics (``gram``, ``cross``, ``yy``) at O(p^2) per client; the free-run error needs the
trajectories themselves (``x``, ``u``, ``mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Model


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
    """
    mask = np.asarray(mask, bool)
    Phi, Y = model.regression(x, u)                               # (S, M, J, L-1, .)
    S, M = x.shape[:2]
    w = (mask[..., 1:] & mask[..., :-1]).astype(float).reshape(S, M, -1)
    F = np.ascontiguousarray(np.moveaxis(Phi, -1, 0)).reshape(-1, S, M, w.shape[-1])
    Z = np.ascontiguousarray(np.moveaxis(Y, -1, 0)).reshape(-1, S, M, w.shape[-1])
    Fw, Zw = F * w, Z * w                   # sums over samples along a contiguous axis
    gram = np.einsum("k...n,l...n->...kl", Fw, F)
    cross = np.einsum("y...n,k...n->...yk", Zw, F)
    yy = np.moveaxis(np.einsum("y...n,y...n->y...", Zw, Z), 0, -1)
    n = w.sum(axis=-1)
    m = mask.astype(float)[..., None]
    cnt = np.maximum(m.sum(axis=(2, 3)), 1.0)
    mean = (x * m).sum(axis=(2, 3)) / cnt
    var = (((x - mean[:, :, None, None]) * m) ** 2).sum(axis=(2, 3)) / cnt
    return HeldOut(gram, cross, yy, n, np.sqrt(var), x, u, mask)
