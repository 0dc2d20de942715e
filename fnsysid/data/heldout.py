"""Held-out trajectories of each client, kept apart from the training data.

The strategies never see them; :mod:`fnsysid.results.metrics` scores the models on them. The
one-step error of a model is a quadratic in its parameters, so it comes from a fixed summary of
each client's held-out data at O(p^2) per client: the triangular factor ``R`` of the QR
decomposition of ``[Phi | Y]`` (``factor``), whose residual
``R [-theta; 1]`` has the norm of the held-out residual ``y - Phi theta``. It is exact to
machine precision, without the cancellation of the expanded sum of squares
``yy - 2 theta.cross + theta gram theta`` (whose rounding, ~1e-16 of ``yy``, left a floor of
~1e-8 on the NRMSE of a perfect model). The free-run error needs the trajectories themselves
(``x``, ``u``, ``mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import (
    Model,
    chunk_clients,
    factor_starts,
    for_chunks,
    moments,
    training_factor,
)

#: a state whose held-out standard deviation is at most this share of its RMS value does
#: not move: the deviation is the rounding of its mean (a log held at 0.3 gave 5e-17), and
#: the state is left out of the NRMSE like one whose deviation is exactly 0
CONSTANT = 1e-12


@dataclass
class Trajectories:
    """Held-out trajectories of the clients ``clients`` (m,), padded to the most trajectories
    (``J``) and the longest (``L``) among them.

    x : (S, m, J, L, n_x) states; u : (S, m, J, L - 1, n_u) inputs; mask : (S, m, J, L) bool,
    True where a sample exists (a prefix of each trajectory).
    """

    clients: np.ndarray
    x: np.ndarray
    u: np.ndarray
    mask: np.ndarray


@dataclass
class HeldOut:
    """Held-out data of ``S`` repeats x ``M`` clients.

    Attributes
    ----------
    gram : (S, M, n_phi, n_phi) ``sum_t phi_t phi_t'`` over held-out transitions.
    cross : (S, M, n_y, n_phi) ``sum_t y_t phi_t'``.
    yy : (S, M, n_y) ``sum_t y_t^2`` per target.
    n : (S, M) number of held-out transitions (0: client without held-out data).
    std : (S, M, n_x) standard deviation of each state over the client's held-out samples.
    factor : (S, terms, M) for each group of targets ``J`` that use the same features ``F``
        (:func:`target_groups`) in turn, the upper triangle, row after row
        (``R[0, 0:], R[1, 1:], ...``), of the ``(k, k)`` factor ``R`` (``k = f + q``, ``f``
        features, ``q`` targets, diagonal nonnegative) of the QR decomposition of the client's
        held-out
        ``[Phi[:, F] | Y[:, J]]`` (rows of absent transitions zero; zero rows below when the
        client has fewer than ``k`` transitions): :func:`training_factor`'s, terms first;
        :func:`fnsysid.dynamics.model.residual_sums` scores it (clients moved last). Then
        ``||y_j - Phi[:, F] t||^2 = ||R[:, f + l] - R[:, :f] t||^2`` for the group's target
        ``j = J[l]`` and every ``t``: a sum of squared residuals, without cancellation (see
        the module's docstring). Clients last: a model shared by all clients scores them
        with contiguous row operations.
    blocks : the trajectories, in blocks of clients of similar size (:class:`Trajectories`):
        one block of every client for simulated data; clients of files grouped by the length
        class of their number of trajectories and of their longest one, so a fleet of short
        and long clients is not padded to its longest. A client without held-out data is in
        no block.
    """

    gram: np.ndarray
    cross: np.ndarray
    yy: np.ndarray
    n: np.ndarray
    std: np.ndarray
    factor: np.ndarray
    blocks: list[Trajectories]

    @property
    def valid(self) -> np.ndarray:
        """(S, M) clients with held-out data."""
        return self.n > 0

    def client(self, m: int) -> tuple[Trajectories, int]:
        """The block holding client ``m`` and the client's position in it."""
        for block in self.blocks:
            at = np.flatnonzero(block.clients == m)
            if len(at):
                return block, int(at[0])
        raise KeyError(m)

    def padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """States (S, M, J, L, n_x), inputs (S, M, J, L - 1, n_u) and mask (S, M, J, L) of every
        client, padded to the most trajectories and the longest of all (the block's own arrays
        when one block holds every client in order; else a padded copy, for small data)."""
        S, M = self.n.shape
        if len(self.blocks) == 1 and np.array_equal(self.blocks[0].clients, np.arange(M)):
            b = self.blocks[0]
            return b.x, b.u, b.mask
        J = max(b.mask.shape[2] for b in self.blocks)
        L = max(b.mask.shape[3] for b in self.blocks)
        n_x, n_u = self.blocks[0].x.shape[-1], self.blocks[0].u.shape[-1]
        x, u = np.zeros((S, M, J, L, n_x)), np.zeros((S, M, J, L - 1, n_u))
        mask = np.zeros((S, M, J, L), bool)
        for b in self.blocks:
            j, t = b.mask.shape[2:]
            x[:, b.clients, :j, :t], u[:, b.clients, :j, :t - 1] = b.x, b.u
            mask[:, b.clients, :j, :t] = b.mask
        return x, u, mask

    def marks(self) -> np.ndarray:
        """(S, M) each client's mark of its held-out samples (:func:`heldout_marks`); 0 for
        a client without held-out data."""
        out = np.zeros(self.n.shape)
        for block in self.blocks:
            out[:, block.clients] = heldout_marks(block.x, block.u, block.mask)
        return np.where(self.n > 0, out, 0.0)

    @property
    def x(self) -> np.ndarray:
        """States of every client, padded (see :meth:`padded`)."""
        return self.padded()[0]

    @property
    def u(self) -> np.ndarray:
        """Inputs of every client, padded (see :meth:`padded`)."""
        return self.padded()[1]

    @property
    def mask(self) -> np.ndarray:
        """Where the padded samples exist (see :meth:`padded`)."""
        return self.padded()[2]


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (Steele, Lea & Flood 2014, https://doi.org/10.1145/2714064.2660195),
    elementwise on uint64: every input bit changes about half of the output bits."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _quantized(v: np.ndarray) -> np.ndarray:
    """Each value as a uint64 of its exponent and its mantissa rounded to 30 bits, so that
    values that differ by a few ulps (the same sample computed in another order) agree."""
    mant, expo = np.frexp(np.asarray(v, float))
    q = np.round(mant * 2.0 ** 30).astype(np.int64).astype(np.uint64)
    return (q << np.uint64(16)) ^ (expo.astype(np.int64).astype(np.uint64) & np.uint64(0xFFFF))


def heldout_marks(x: np.ndarray, u: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each client's mark of its held-out samples, per repeat: a 52-bit hash (a float, exact)
    of every state and input value it holds, each at its place in its trajectory (time,
    variable) and rounded to 30 bits of its mantissa, so that the same samples give the same
    mark wherever they are padded and however they were summed; each trajectory is hashed
    whole and the trajectories' hashes added, so that their order (their names in a file)
    does not change it. It depends on the held-out
    samples alone, not on the model, the library or the strategy: ``summary.json:
    heldout.fingerprint`` (:func:`heldout_fingerprint`), with which ``fnsysid compare``
    ranks only runs scored on the same data. A Flower node sends its own marks with its
    scores; a mark tells only whether two data sets are the same.

    Parameters
    ----------
    x : numpy.ndarray, shape (S, m, J, L, n_x)
        The held-out states (padded).
    u : numpy.ndarray, shape (S, m, J, L - 1, n_u)
        The held-out inputs.
    mask : numpy.ndarray of bool, shape (S, m, J, L)
        Where a state sample exists (an input counts where the transition it drives does).

    Returns
    -------
    numpy.ndarray of float, shape (S, m)
    """
    S, m, J, L, n_x = x.shape
    step = mask[..., 1:] & mask[..., :-1]
    runs = np.zeros((S, m, J), np.uint64)                   # each trajectory's own hash
    for values, where, first in ((x, mask, 0), (u, step, n_x)):
        k = values.shape[-1]
        if not k:
            continue
        t, v = np.meshgrid(np.arange(values.shape[3]), np.arange(k), indexing="ij")
        place = (t.astype(np.uint64) << np.uint64(8)) ^ (v + first).astype(np.uint64)  # (T, k)
        h = _mix(_quantized(values) ^ _mix(place))
        with np.errstate(over="ignore"):
            runs = runs + np.where(where[..., None], h, np.uint64(0)).sum(axis=(3, 4),
                                                                          dtype=np.uint64)
    with np.errstate(over="ignore"):
        total = np.where(mask.any(axis=-1), _mix(runs), np.uint64(0)).sum(axis=-1,
                                                                          dtype=np.uint64)
    return (_mix(total) & np.uint64((1 << 52) - 1)).astype(float)


def heldout_fingerprint(marks: np.ndarray) -> str | None:
    """A short hex digest of the fleet's held-out data: SHA-256 of each repeat's marks
    (:func:`heldout_marks`) sorted, the clients without held-out data (mark 0) left out, so
    that the order and the names of the clients and clients that hold only training data do
    not change it; None when no client has held-out data."""
    import hashlib

    marks = np.asarray(marks, float)
    if not (marks > 0).any():
        return None
    digest = hashlib.sha256()
    for row in marks:
        digest.update(np.sort(row[row > 0]).astype(np.int64).tobytes() + b"|")
    return digest.hexdigest()[:16]


#: clients whose held-out data are reduced to QR factors at once (temporaries of a few MB)
QR_CLIENTS = 1 << 12


def empty_heldout(model: Model, S: int, M: int) -> HeldOut:
    """Held-out statistics of no data yet (filled by :func:`add_block`)."""
    n_y, n_phi = model.structure.shape[:2]
    return HeldOut(np.zeros((S, M, n_phi, n_phi)), np.zeros((S, M, n_y, n_phi)),
                   np.zeros((S, M, n_y)), np.zeros((S, M)),
                   np.zeros((S, M, model.system.n_x)),
                   np.zeros((S, factor_starts(model)[-1], M)), [])


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
    S, M = mask.shape[:2]
    ho = empty_heldout(model, S, M)
    add_block(model, ho, np.arange(M), x, u, mask)
    return ho


def add_block(model: Model, ho: HeldOut, clients: np.ndarray, x: np.ndarray, u: np.ndarray,
              mask: np.ndarray) -> None:
    """Add the trajectories of clients ``clients`` (m,) to ``ho``: ``x`` (S, m, J, L, n_x),
    ``u`` (S, m, J, L - 1, n_u), ``mask`` (S, m, J, L) as in :func:`heldout_from_trajectories`;
    their statistics are written into the rows of ``clients``."""
    mask = np.asarray(mask, bool)
    clients = np.asarray(clients)
    S, M, J, L = mask.shape
    n_y, n_phi = model.structure.shape[:2]
    starts = factor_starts(model)
    every = M == ho.n.shape[1] and np.array_equal(clients, np.arange(M))
    if every:                                   # written in place
        gram, cross, yy, n, std = ho.gram, ho.cross, ho.yy, ho.n, ho.std
        factor = ho.factor
    else:
        gram, cross = np.empty((S, M, n_phi, n_phi)), np.empty((S, M, n_y, n_phi))
        yy, n, std = np.empty((S, M, n_y)), np.empty((S, M)), np.empty((S, M, x.shape[-1]))
        factor = np.empty((S, starts[-1], M))

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
        # each group's [Phi_F | y], absent transitions zeroed, reduced to its QR factor R
        # (:func:`training_factor`; LAPACK, one client after another: the same numbers in
        # any chunk), QR_CLIENTS clients at a time (small temporaries)
        P, Yc = Phi.reshape(m, -1, n_phi), Y.reshape(m, -1, n_y)
        for a in range(0, m, QR_CLIENTS):
            b = min(a + QR_CLIENTS, m)
            factor[s, :, lo + a:lo + b] = training_factor(model, P[a:b], Yc[a:b], w[a:b]).T
        # per-state spread over the client's samples, states first (contiguous sums)
        xt = np.ascontiguousarray(np.moveaxis(xs.reshape(m, -1, xs.shape[-1]), -1, 0))
        mf = ms.reshape(m, -1).astype(float)
        full = bool(ms.all())
        cnt = np.maximum(mf.sum(axis=-1), 1.0)
        d = xt - (xt if full else xt * mf).sum(axis=-1, keepdims=True) / cnt[:, None]
        if not full:
            d *= mf
        d *= d
        sd = np.sqrt(d.sum(axis=-1) / cnt)
        # a state that does not move (a log held at 0.3) has for spread the rounding of its
        # mean, about 1e-17 of its level: constant (0), not a scale to divide errors by
        level = np.sqrt(((xt * xt) if full else (xt * xt * mf)).sum(axis=-1) / cnt)
        std[s, lo:hi] = np.where(sd > CONSTANT * level, sd, 0.0).T

    for_chunks(S, rnd.blocks(M), chunk_clients(model, J, L - 1), work)
    if not every:
        for whole, part in ((ho.gram, gram), (ho.cross, cross), (ho.yy, yy), (ho.n, n),
                            (ho.std, std)):
            whole[:, clients] = part
        ho.factor[:, :, clients] = factor
    ho.blocks.append(Trajectories(clients, x, u, mask))
