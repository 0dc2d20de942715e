"""Every client's own least squares from its statistics, a block of clients at a time.

One computation serves every user of the clients' own fits: ``strategy=oneshot`` (the
average of the determined clients' solutions), the intervals of its estimate and of the
clients' own models (:func:`fnsysid.learning.personalize.least_squares_intervals`),
``personalize=auto`` (whose clients need their residual variances and whether their data
determine their model) and the model check (:mod:`fnsysid.learning.ownfit_stats`,
:mod:`fnsysid.results.modelcheck`).
:func:`own_fits` keeps its last results for the arrays it was given, so a second caller with
the same statistics (the same array objects, treated as read-only) gets them without
solving again.

The fits are the numbers of the pseudo-inverse ``H_i^+ b_i`` (on a sparse model's kept terms)
and of the rank rule of :func:`numpy.linalg.matrix_rank` (``|eigenvalues| > p eps
max|eigenvalue|``), both applied to the equilibrated Gram matrix ``D H_i D`` (``D`` scales
each regressor to unit size, as :func:`fnsysid.dynamics.model.equilibrated_pinv`: the
result does not depend on the data's units), at a fraction of their cost: a block of
:data:`CHUNK` clients is split into the blocks its Gram matrices are block diagonal in (the
groups of targets of a model whose parameters enter one target each), each block inverted
by LU; a client whose ``||H_i||_F ||H_i^-1||_F`` (an upper bound of its condition number, up
to a factor ``p``) is below :data:`MARGIN` ``/ (p eps)`` has full rank by that rule beyond
doubt. The others (a client without data, a singular or nearly singular Gram matrix) take
the rule's own path: their eigenvalues (:func:`numpy.linalg.eigvalsh`) and the pseudo-inverse.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from fnsysid.dynamics.model import equilibration, for_slices

#: clients whose Gram matrices one block decomposes at a time (bounds the temporaries:
#: a few times CHUNK x p^2 numbers)
CHUNK = 4096

#: a client whose ``||H||_F ||H^-1||_F`` is below ``MARGIN / (p eps)`` has full rank by the
#: rule of :func:`numpy.linalg.matrix_rank` with a margin of 1 / MARGIN (the LU inverse of
#: such a matrix is accurate to far better than that margin); the others are decided by
#: their eigenvalues
MARGIN = 1e-2


@dataclass(frozen=True)
class OwnFits:
    """The clients' own least squares (arrays over the clients' leading axes ``...``).

    Attributes
    ----------
    theta : numpy.ndarray, shape (..., p)
        ``H_i^+ b_i`` on the kept terms (0 outside them; the minimum-norm solution where
        ``H_i`` is singular).
    full : numpy.ndarray of bool, shape (...)
        Whether ``H_i`` (restricted to the kept terms) has full rank on them (the rule of
        :func:`numpy.linalg.matrix_rank`).
    inv_diag : numpy.ndarray, shape (..., p)
        The diagonal of ``H_i^-1`` on the kept terms, NaN outside them and where ``full`` is
        False.
    """

    theta: np.ndarray
    full: np.ndarray
    inv_diag: np.ndarray

    def solutions(self) -> np.ndarray:
        """``theta`` where the data determine it (``full``), 0 elsewhere."""
        return np.where(self.full[..., None], self.theta, 0.0)


def ranks(H: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """Ranks of stacks of symmetric positive semi-definite matrices by the rule of
    :func:`numpy.linalg.matrix_rank` (``hermitian=True``) applied to their equilibrated form
    ``D H D`` (``D = diag(H)^(-1/2)``, 1 where the diagonal is 0): as the data determine a
    least-squares problem whatever the regressors' units.

    Parameters
    ----------
    H : array_like, shape (..., p, p)
        Symmetric matrices.
    chunk : int, default=CHUNK
        Matrices whose eigenvalues are computed at a time (bounds the temporaries).

    Returns
    -------
    numpy.ndarray of int, shape (...)
    """
    H = np.asarray(H)
    rank = np.empty(H.shape[:-2], dtype=int)
    flat, out = H.reshape(-1, *H.shape[-2:]), rank.reshape(-1)
    for i in range(0, len(flat), chunk):
        A = flat[i:i + chunk]
        sc = equilibration(np.diagonal(A, axis1=-2, axis2=-1))
        w = np.abs(np.linalg.eigvalsh(A * sc[:, :, None] * sc[:, None, :]))
        tol = w.max(axis=-1, keepdims=True) * H.shape[-1] * np.finfo(H.dtype).eps
        out[i:i + chunk] = (w > tol).sum(axis=-1)
    return rank


def _components(pattern: np.ndarray) -> list[np.ndarray]:
    """The connected components (index arrays, increasing) of a symmetric 0/1 pattern
    (p, p) with a true diagonal: the diagonal blocks a matrix of that pattern splits into."""
    reach = pattern.astype(np.int64)
    while True:
        nxt = ((reach @ reach) > 0).astype(np.int64)
        if np.array_equal(nxt, reach):
            break
        reach = nxt
    seen, out = np.zeros(len(reach), bool), []
    for j in range(len(reach)):
        if not seen[j]:
            idx = np.flatnonzero(reach[j])
            seen[idx] = True
            out.append(idx)
    return out


def _exact(A: np.ndarray, bm: np.ndarray, keep: np.ndarray):
    """The rule's own path for a few clients: ``(theta, full, inv_diag)`` of masked Gram
    matrices ``A`` (n, p, p) (zero outside ``keep``), masked moments ``bm`` (n, p)."""
    m = keep.astype(float)
    full = ranks(A) == keep.sum(axis=-1)
    P = np.linalg.pinv(A + (1.0 - m)[:, :, None] * np.eye(A.shape[-1]), hermitian=True)
    theta = np.einsum("npq,nq->np", P, bm) * m
    dg = np.diagonal(P, axis1=-2, axis2=-1)
    return theta, full, np.where(full[:, None] & keep, dg, np.nan)


def _chunk(A: np.ndarray, bm: np.ndarray, keep: np.ndarray):
    """``(theta, full, inv_diag)`` of one block of clients (``_exact``'s arguments)."""
    n, p = bm.shape
    m = keep.astype(float)
    theta, dg = np.zeros((n, p)), np.full((n, p), np.nan)
    slow = ~np.isfinite(A).all(axis=(-2, -1))
    norm_inv = np.zeros(n)                   # max over the diagonal blocks of ||A_g^-1||_F
    pattern = (A != 0).any(axis=0) | np.eye(p, dtype=bool)
    try:
        for P in _components(pattern):
            mP = m[:, P]
            if not mP.any():
                continue
            sub = A[:, P[:, None], P] + (1.0 - mP)[:, :, None] * np.eye(len(P))
            d = np.diagonal(sub, axis1=-2, axis2=-1)
            bad = ~(d > 0).all(axis=-1) | slow        # a zero row: singular, no LU of it
            slow |= bad
            sub[bad] = np.eye(len(P))
            inv = np.linalg.inv(sub)
            theta[:, P] = np.einsum("npq,nq->np", inv, bm[:, P]) * mP
            dg[:, P] = np.where(mP > 0, np.diagonal(inv, axis1=-2, axis2=-1), np.nan)
            kept = inv * mP[:, :, None] * mP[:, None, :]
            norm_inv = np.maximum(norm_inv, np.sqrt((kept * kept).sum(axis=(-2, -1))))
    except np.linalg.LinAlgError:            # an exact zero pivot: the whole block the rule's way
        slow[:] = True
    with np.errstate(over="ignore", invalid="ignore"):
        bound = np.sqrt((A * A).sum(axis=(-2, -1))) * norm_inv
    slow |= ~(bound < MARGIN / (p * np.finfo(float).eps))
    full = ~slow
    if slow.any():
        j = np.flatnonzero(slow)
        theta[j], full[j], dg[j] = _exact(A[j], bm[j], keep[j])
    dg[~full] = np.nan
    return theta, full, dg


def _solve(H: np.ndarray, b: np.ndarray, support) -> OwnFits:
    H, b = np.asarray(H, float), np.asarray(b, float)
    p = H.shape[-1]
    lead = np.broadcast_shapes(H.shape[:-2], b.shape[:-1],
                               () if support is None else np.shape(support)[:-1])
    Hf = np.broadcast_to(H, lead + (p, p)).reshape(-1, p, p)
    bf = np.broadcast_to(b, lead + (p,)).reshape(-1, p)
    keepf = (np.ones((len(bf), p), bool) if support is None else
             np.broadcast_to(np.asarray(support, bool), lead + (p,)).reshape(-1, p))
    theta, dg = np.zeros((len(bf), p)), np.full((len(bf), p), np.nan)
    full = np.zeros(len(bf), bool)

    def work(sl):
        A, keep = Hf[sl], keepf[sl]
        if support is not None:
            m = keep.astype(float)
            A = A * m[:, :, None] * m[:, None, :]
        # equilibrated: each regressor scaled to unit size, so that neither the rank rule
        # nor the solve depends on the data's units (a regressor identically 0 keeps 1)
        s = equilibration(np.diagonal(A, axis1=-2, axis2=-1))
        t, full[sl], g = _chunk(A * s[:, :, None] * s[:, None, :], bf[sl] * keep * s, keep)
        theta[sl], dg[sl] = t * s, g * s * s

    for_slices(len(bf), CHUNK, work)
    return OwnFits(theta.reshape(lead + (p,)), full.reshape(lead), dg.reshape(lead + (p,)))


#: the last results of :func:`own_fits`, by the identity of their arrays
_CACHE: dict = {}
_CACHE_SIZE = 4


def _support_key(support):
    if support is None:
        return None
    s = np.asarray(support, bool)
    return s.shape, s.tobytes()


def own_fits(H: np.ndarray, b: np.ndarray, support=None) -> OwnFits:
    """Each client's own least squares.

    Computed once for the same array objects ``H`` and ``b`` (never changed in place) and
    the same support while they live; the numbers are those of :func:`numpy.linalg.pinv` and
    :func:`numpy.linalg.matrix_rank` up to round-off (module docstring).

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        The clients' Gram matrices.
    b : numpy.ndarray, shape (..., p)
        Their moments ``X'y``.
    support : array_like of bool or 0/1, broadcast against (..., p), or None, default=None
        The fit on the kept terms only (the statistics restricted to them, zero outside);
        None: every term.

    Returns
    -------
    OwnFits
        ``theta``, ``full`` and ``inv_diag`` over the leading axes ``...``.
    """
    key = (id(H), id(b), _support_key(support))
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is H and hit[1]() is b:
        return hit[2]
    fits = _solve(H, b, support)
    try:
        refs = (weakref.ref(H), weakref.ref(b))
    except TypeError:                  # not arrays (lists): nothing to keep them by
        return fits
    while len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (*refs, fits)
    weakref.finalize(H, _CACHE.pop, key, None)
    return fits
