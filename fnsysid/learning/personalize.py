"""Per-client (personalized) models and confidence intervals from sufficient statistics.

Everything here works on the clients' sufficient statistics ``H, b, yy, n`` (S, M, ...) of
:class:`fnsysid.dynamics.model.ClientData` and is vectorized over repeats and clients (no loop
over clients). The derivations are in ``docs/ALGORITHMS.md`` (Personalization and confidence
intervals).

- :func:`least_squares_intervals`: the least-squares solution of statistics (on a sparse
  model's support), its standard errors ``sqrt(s_k^2 diag(H^-1))`` with a residual variance
  ``s_k^2 = RSS_k / (n n_k - p_k)`` per group of targets (:func:`noise_blocks`), and the
  normal-quantile interval (:func:`z_value`).
- :func:`auto`: the empirical-Bayes (random-effects) estimator of every client's own model,
  split into what a client computes (:func:`client_message`, :func:`client_posterior`) and what
  the server computes from the clients' messages alone (:func:`fleet`), so that a federated
  runtime runs the same functions with one client per node.
- :func:`finetune`: K local steps of the run's optimizer on each client's own data from the
  final server model.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from fnsysid.dynamics.model import least_squares, masked_gram

#: personalize options (the ``personalize`` config group)
OPTIONS = ("none", "finetune", "auto")


def z_value(level: float) -> float:
    """Two-sided standard normal quantile of a confidence level (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


def _solve_psd(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(H^-1, full rank?)`` of stacks of symmetric PSD matrices (..., p, p); the inverse is
    NaN where the rank is below p (the pseudo-inverse would give a covariance for directions
    the data do not determine)."""
    p = H.shape[-1]
    full = np.linalg.matrix_rank(H, hermitian=True) == p
    inv = np.linalg.pinv(H, hermitian=True)
    return np.where(full[..., None, None], inv, np.nan), full


def residuals(H, b, yy, theta) -> np.ndarray:
    """Residual sum of squares ``yy - 2 b'theta + theta' H theta`` (...) at ``theta``, from the
    statistics (clipped at 0 against rounding)."""
    quad = np.einsum("...p,...pq,...q->...", theta, H, theta)
    return np.maximum(yy - 2 * np.einsum("...p,...p->...", b, theta) + quad, 0.0)


#: relative resolution of a residual sum of squares computed from statistics (of ``yy``)
RESOLUTION = np.finfo(float).eps


@dataclass(frozen=True)
class NoiseBlocks:
    """The groups of regression targets that get one residual variance each.

    ``param_block`` (p,): the group of each parameter; ``n_targets`` (g,): the targets of each
    group; ``targets`` (n_y,): the group of each target (-1: a target without parameters).
    Two targets are in one group when a parameter enters both (the quadrotor's ``1/m`` in its
    three velocity updates); the dense models of a feature library have one group per target.
    """

    param_block: np.ndarray
    n_targets: np.ndarray
    targets: np.ndarray

    @property
    def g(self) -> int:
        return len(self.n_targets)

    def per_block(self, yy) -> np.ndarray:
        """Sums of squares of targets (..., n_y) summed over each group: (..., g)."""
        yy = np.asarray(yy, float)
        return np.stack([yy[..., self.targets == k].sum(axis=-1) for k in range(self.g)],
                        axis=-1)


def noise_blocks(structure: np.ndarray) -> NoiseBlocks:
    """:class:`NoiseBlocks` of a model's ``structure`` (n_y, n_phi, p)."""
    enters = np.abs(np.asarray(structure)).sum(axis=1) > 0            # (n_y, p)
    n_y, p = enters.shape
    group = np.arange(n_y)
    for q in range(p):                                               # union of the targets
        js = np.flatnonzero(enters[:, q])                            # a parameter enters
        if len(js) > 1:
            group[np.isin(group, group[js])] = group[js].min()
    used = np.unique(group[enters.any(axis=1)])
    targets = np.where(enters.any(axis=1), np.searchsorted(used, group), -1)
    param_block = np.array([targets[np.flatnonzero(enters[:, q])[0]] if enters[:, q].any()
                            else 0 for q in range(p)], dtype=int)
    return NoiseBlocks(param_block, np.bincount(targets[targets >= 0], minlength=len(used)),
                       targets)


def pooled_blocks(n_y: int, p: int) -> NoiseBlocks:
    """One group of ``n_y`` targets holding all ``p`` parameters (one pooled variance)."""
    return NoiseBlocks(np.zeros(p, int), np.array([n_y]), np.zeros(n_y, int))


def least_squares_intervals(H, b, yy, n, blocks, support=None):
    """Least-squares solution, standard errors and residual variances of statistics (...).

    ``blocks``: the model's :class:`NoiseBlocks` with ``yy`` the sums of squares of each
    target (..., n_y); or an integer ``n_y`` with ``yy`` their total (...) (one variance for
    all targets). Each group ``k`` of targets has its own residual variance
    ``s_k^2 = RSS_k / (n n_k - p_k)`` (``n_k`` targets, ``p_k`` parameters fitted), and
    ``se_j = sqrt(s_k^2 (H^-1)_jj)`` for a parameter ``j`` of group ``k`` (``H`` has no entry
    between groups). ``support`` (..., p) bool: the fit on the kept parameters only (a sparse
    model's refit), NaN for the others. NaN where ``H`` (on the support) is singular or a
    group has no more observations than parameters. Returns ``(theta, se, s2, dof)`` with
    ``s2`` and ``dof`` per group (..., g).
    """
    p = H.shape[-1]
    if isinstance(blocks, (int, np.integer)):
        blocks, yy = pooled_blocks(int(blocks), p), np.asarray(yy, float)[..., None]
    else:
        yy = blocks.per_block(yy)
    keep = np.ones(np.shape(b), bool) if support is None else np.broadcast_to(
        np.asarray(support, bool), np.shape(b))
    m = keep.astype(float)
    Hs = masked_gram(H, m) + np.where(keep, 0.0, 1.0)[..., None] * np.eye(p)
    theta = least_squares(Hs, b * m) * m
    onehot = blocks.param_block[:, None] == np.arange(blocks.g)          # (p, g)
    p_k = np.einsum("...p,pg->...g", m, onehot.astype(float))
    dof = np.asarray(n, float)[..., None] * blocks.n_targets - p_k
    Ht = np.einsum("...pq,...q->...p", H, theta)
    # the difference of sums as large as yy is known to about a machine epsilon of yy: an
    # exactly updated target gets intervals at that resolution, not of width 0
    rss = np.maximum(yy - np.einsum("...p,pg->...g", (2 * b - Ht) * theta,
                                    onehot.astype(float)), RESOLUTION * yy)
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(dof > 0, rss / dof, np.nan)
    inv, _ = _solve_psd(Hs)
    var = s2[..., blocks.param_block] * np.diagonal(inv, axis1=-2, axis2=-1)
    se = np.where(keep, np.sqrt(var), np.nan)
    return theta, se, s2, dof


def heterogeneity(theta, V, own) -> np.ndarray:
    """The heterogeneity covariance ``Sigma`` (S, p, p) from the clients' own estimates
    ``theta`` (S, M, p) with noise covariances ``V`` (S, M, p, p), over the clients ``own``
    (S, M) (fewer than two: ``Sigma = 0``).

    In coordinates whitened by the mean noise covariance ``Vbar = L L'`` the spread of the
    estimates is the identity plus ``L^-1 Sigma L^-T``. The eigenvalues of the sample spread
    that pure noise can produce lie below the Marchenko-Pastur edge ``(1 + sqrt(g))^2``,
    ``g = p / (m - 1)``; each eigenvalue ``lam`` above it is a direction of heterogeneity whose
    variance (in whitened units) is the ``l - 1`` that the spiked-covariance relation
    ``lam = l (1 + g / (l - 1))`` gives. Directions below the edge get none, so a
    heterogeneity confined to a few directions is found with its rank.
    """
    S, M, p = theta.shape
    w = own.astype(float)
    m = w.sum(axis=1)                                           # (S,)
    eye = np.eye(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.einsum("sm,smp->sp", w, theta) / m[:, None]
        d = (theta - mean[:, None]) * w[..., None]
        spread = np.einsum("smp,smq->spq", d, d) / (m - 1)[:, None, None]
        Vbar = np.einsum("sm,smpq->spq", w, V) / m[:, None, None]
    ok = m >= 2
    spread = np.where(ok[:, None, None], spread, eye)
    Vbar = np.where(ok[:, None, None], Vbar, eye)
    d, Q = np.linalg.eigh((Vbar + np.swapaxes(Vbar, -1, -2)) / 2)     # Vbar = L L'
    d = np.maximum(d, np.finfo(float).tiny)
    L = Q * np.sqrt(d)[:, None, :]
    Li = np.swapaxes(Q, -1, -2) / np.sqrt(d)[:, :, None]
    white = Li @ spread @ np.swapaxes(Li, -1, -2)
    lam, U = np.linalg.eigh((white + np.swapaxes(white, -1, -2)) / 2)
    g = p / np.maximum(m - 1, 1)[:, None]
    a = lam + 1 - g
    ell = (a + np.sqrt(np.maximum(a * a - 4 * lam, 0.0))) / 2
    var = np.where(lam > (1 + np.sqrt(g)) ** 2, np.maximum(ell - 1, 0.0), 0.0)
    Sigma = L @ np.einsum("spk,sk,sqk->spq", U, var, U) @ np.swapaxes(L, -1, -2)
    return np.where(ok[:, None, None], (Sigma + np.swapaxes(Sigma, -1, -2)) / 2, 0.0)


@dataclass
class Message:
    """What each client sends for ``personalize=auto`` (arrays (S, M, ...), or (S, 1, ...)
    for one client): its Gram matrix and moment vector divided by its own residual variance,
    ``J = H / s^2`` and ``beta = b / s^2``, with ``rss`` and ``dof`` of its own fit (for the
    fleet's residual variance). A client whose data do not determine its own model (or leave
    no degree of freedom) sends ``H`` and ``b`` unscaled with ``scaled = False``; it scales
    them with the fleet's variance returned by the server."""

    H: np.ndarray
    b: np.ndarray
    rss: np.ndarray
    dof: np.ndarray
    scaled: np.ndarray


def client_message(H, b, yy, n, n_y: int) -> Message:
    """A client's message (:class:`Message`) from its own statistics."""
    theta, _, s2, dof = least_squares_intervals(H, b, yy, n, n_y)
    s2, dof = s2[..., 0], dof[..., 0]                 # one variance for all targets
    p = H.shape[-1]
    own = (np.linalg.matrix_rank(H, hermitian=True) == p) & (dof > 0) & (s2 > 0)
    s = np.where(own, s2, 1.0)
    rss = np.where(own, residuals(H, b, yy, theta), 0.0)
    return Message(H / s[..., None, None], b / s[..., None], rss, np.where(own, dof, 0.0), own)


@dataclass
class Fleet:
    """What the server sends back (arrays (S, ...)): the fleet mean ``mu`` (S, p), its
    covariance ``cov_mu`` (S, p, p), the heterogeneity covariance ``Sigma`` (S, p, p) and the
    fleet's residual variance ``s2`` (S,) for clients that could not estimate their own."""

    mu: np.ndarray
    cov_mu: np.ndarray
    Sigma: np.ndarray
    s2: np.ndarray


def _scaled(msg: Message, s2) -> tuple[np.ndarray, np.ndarray]:
    """``J, beta`` of every client: its own scaling, or the fleet's variance ``s2`` (S,)."""
    s = np.where(msg.scaled, 1.0, np.asarray(s2, float)[:, None])
    return msg.H / s[..., None, None], msg.b / s[..., None]


def fleet(msg: Message) -> Fleet:
    """The server's part of ``auto`` from the stacked messages (S, M, ...).

    Clients with their own noise variance (``scaled``) give the fleet's residual variance
    ``sum rss / sum dof`` and the heterogeneity ``Sigma`` (:func:`heterogeneity`) from their
    own estimates ``theta_i = J_i^-1 beta_i`` and noise covariances ``J_i^-1``. ``mu`` is the
    generalized least-squares mean of all clients, weights
    ``W_i = (Sigma + J_i^-1)^-1 = J_i (I + Sigma J_i)^-1`` (defined for singular ``J_i``:
    a client weighs nothing in the directions its data do not determine).
    """
    own = msg.scaled
    S, M, p = msg.b.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(msg.dof.sum(axis=1) > 0, msg.rss.sum(axis=1) / msg.dof.sum(axis=1), 1.0)
    J, beta = _scaled(msg, s2)
    eye = np.eye(p)
    V = np.linalg.inv(np.where(own[..., None, None], J, eye))   # determined clients only
    theta = np.einsum("...pq,...q->...p", V, np.where(own[..., None], beta, 0.0))
    Sigma = heterogeneity(theta, V, own)
    W = J @ np.linalg.inv(eye + Sigma[:, None] @ J)             # (S, M, p, p)
    rhs = np.linalg.solve(eye + J @ Sigma[:, None], beta[..., None])[..., 0]
    cov_mu = np.linalg.pinv(W.sum(axis=1), hermitian=True)
    mu = np.einsum("spq,sq->sp", cov_mu, rhs.sum(axis=1))
    return Fleet(mu, cov_mu, Sigma, s2)


def client_posterior(msg: Message, fl: Fleet) -> tuple[np.ndarray, np.ndarray]:
    """Each client's personalized model and its standard errors (S, M, p), computed from its
    own message and the server's :class:`Fleet` alone.

    ``theta_i = mu + Sigma (I + J_i Sigma)^-1 (beta_i - J_i mu)``, the posterior mean of the
    random-effects model; its covariance ``Sigma (I + J_i Sigma)^-1`` plus the part of the
    uncertainty of ``mu`` it carries, ``B_i cov_mu B_i'`` with ``B_i = (I + Sigma J_i)^-1``.
    """
    J, beta = _scaled(msg, fl.s2)
    p = beta.shape[-1]
    eye = np.eye(p)
    Sig = fl.Sigma[:, None]
    post = Sig @ np.linalg.inv(eye + J @ Sig)                   # (S, M, p, p)
    r = beta - np.einsum("smpq,sq->smp", J, fl.mu)
    theta = fl.mu[:, None] + np.einsum("smpq,smq->smp", post, r)
    B = np.linalg.inv(eye + Sig @ J)
    cov = post + B @ fl.cov_mu[:, None] @ np.swapaxes(B, -1, -2)
    se = np.sqrt(np.maximum(np.diagonal(cov, axis1=-2, axis2=-1), 0.0))
    return theta, se


def auto(H, b, yy, n, n_y: int) -> tuple[np.ndarray, np.ndarray, Fleet]:
    """``personalize=auto`` for all clients at once: (models, se, fleet)."""
    msg = client_message(H, b, yy, n, n_y)
    fl = fleet(msg)
    theta, se = client_posterior(msg, fl)
    return theta, se, fl


def finetune(optimizer, data, model, start, K: int, lr: float, seed: int) -> np.ndarray:
    """K local steps of ``optimizer`` on each client's own data from ``start`` (S, 1 or M, p)
    (the final server model): (S, M, p). The optimizer is set up on ``data`` again (a strategy
    such as ``centralized`` set it up on the pooled data)."""
    optimizer.setup(data, model, seed)
    S, M = data.shape
    start = np.array(np.broadcast_to(start, (S, M, start.shape[-1])))
    return optimizer.local_steps(start, K, lr)
