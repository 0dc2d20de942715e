"""Per-client (personalized) models and confidence intervals from sufficient statistics.

Everything here works on the clients' sufficient statistics ``H, b, yy, n`` (S, M, ...) of
:class:`fnsysid.dynamics.model.ClientData` and is vectorized over repeats and clients (no loop
over clients). The derivations are in ``docs/ALGORITHMS.md`` (Personalization and confidence
intervals).

- :func:`least_squares_intervals`: the least-squares solution of statistics (on a sparse
  model's support), its standard errors ``sqrt(s_k^2 diag(H^-1))`` with a residual variance
  ``s_k^2 = RSS_k / (n n_k - p_k)`` per group of targets (:func:`noise_blocks`), and the
  normal-quantile interval (:func:`z_value`).
- :func:`auto`: the empirical-Bayes (random-effects) estimator of every client's own model
  (a homogeneity test, :func:`homogeneity`, then a REML heterogeneity of a structure chosen
  by an information criterion, :func:`reml`),
  split into what a client computes (:func:`client_message`, :func:`client_posterior`) and what
  the server computes from the clients' messages alone (:func:`fleet`), so that a federated
  runtime runs the same functions with one client per node.
- :func:`finetune`: K local steps of the run's optimizer on each client's own data from the
  final server model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from fnsysid.dynamics.model import equilibrated_pinv, equilibration
from fnsysid.learning.ownfit import own_fits

#: personalize options (the ``personalize`` config group)
OPTIONS = ("none", "finetune", "auto")


def z_value(level: float) -> float:
    """Two-sided standard normal quantile of a confidence level (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + level / 2)


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


def least_squares_intervals(H, b, yy, n, blocks, support=None, sse=None):
    """Least-squares solution, standard errors and residual variances of statistics (...).

    ``blocks``: the model's :class:`NoiseBlocks` with ``yy`` the sums of squares of each
    target (..., n_y); or an integer ``n_y`` with ``yy`` their total (...) (one variance for
    all targets). Each group ``k`` of targets has its own residual variance
    ``s_k^2 = RSS_k / (n n_k - p_k)`` (``n_k`` targets, ``p_k`` parameters fitted), and
    ``se_j = sqrt(s_k^2 (H^-1)_jj)`` for a parameter ``j`` of group ``k`` (``H`` has no entry
    between groups). ``support`` (..., p) bool: the fit on the kept parameters only (a sparse
    model's refit), NaN for the others. NaN where ``H`` (on the support) is singular or a
    group has no more observations than parameters. ``sse`` (..., n_y): the fit's residual
    sum of squares of each target where the caller has it from the samples' QR factors
    (:func:`fnsysid.dynamics.model.residual_sums`), exact to the residuals' rounding; None:
    ``RSS_k`` from the expanded ``yy - 2 theta'b + theta'H theta``, known to about a machine
    epsilon of ``yy`` only. Returns ``(theta, se, s2, dof)`` with ``s2`` and ``dof`` per
    group (..., g).
    """
    p = H.shape[-1]
    if isinstance(blocks, (int, np.integer)):
        blocks, yy = pooled_blocks(int(blocks), p), np.asarray(yy, float)[..., None]
        sse = None if sse is None else np.asarray(sse, float).sum(axis=-1, keepdims=True)
    else:
        yy = blocks.per_block(yy)
        sse = None if sse is None else blocks.per_block(sse)
    keep = np.ones(np.shape(b), bool) if support is None else np.broadcast_to(
        np.asarray(support, bool), np.shape(b))
    m = keep.astype(float)
    fits = own_fits(H, b, support)         # once for these statistics (fnsysid.learning.ownfit)
    theta = fits.theta
    onehot = blocks.param_block[:, None] == np.arange(blocks.g)          # (p, g)
    p_k = np.einsum("...p,pg->...g", m, onehot.astype(float))
    dof = np.asarray(n, float)[..., None] * blocks.n_targets - p_k
    if sse is None:
        Ht = np.einsum("...pq,...q->...p", H, theta)
        sse = yy - np.einsum("...p,pg->...g", (2 * b - Ht) * theta, onehot.astype(float))
    # the difference of sums as large as yy is known to about a machine epsilon of yy: an
    # exactly updated target gets intervals at that resolution, not of width 0 (kept with
    # the factors' exact sums, so that both give the same widths there)
    rss = np.maximum(sse, RESOLUTION * yy)
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(dof > 0, rss / dof, np.nan)
    var = s2[..., blocks.param_block] * fits.inv_diag   # NaN where H (kept) is singular
    se = np.where(keep, np.sqrt(var), np.nan)
    return theta, se, s2, dof


def _blocks_yy(blocks, yy, p):
    """``(NoiseBlocks, yy per group (..., g))`` of ``blocks`` (a :class:`NoiseBlocks` with
    ``yy`` per target, or an integer ``n_y`` with ``yy`` their total)."""
    if isinstance(blocks, (int, np.integer)):
        return pooled_blocks(int(blocks), p), np.asarray(yy, float)[..., None]
    return blocks, blocks.per_block(yy)


#: a group of targets whose residual variance is below this fraction of its mean square is
#: treated as updated exactly: its variance is floored there in ``auto`` (the rounding of a
#: solve is far above RESOLUTION, and would otherwise read as heterogeneity)
EXACT = 1e-10

#: level of the homogeneity test that decides whether ``auto`` personalizes
HOMOGENEITY_LEVEL = 0.05

#: the largest rank of the heterogeneity ``Sigma`` that :func:`reml` considers
MAX_RANK = 4

#: the structures of ``Sigma`` beyond 0 and the low ranks that :func:`reml` compares (in its
#: scaled coordinates): ``tau^2 I`` ("identity"), ``tau^2 mean_i V_i`` ("noise":
#: heterogeneity proportional to the clients' noise) and a diagonal ``Sigma`` ("diagonal")
STRUCTURES = ("identity", "noise", "diagonal")

#: most clients whose own estimates enter the REML of the heterogeneity (:func:`fleet`)
REML_CLIENTS = 2000

#: information criteria :func:`reml` may choose the structure by: the penalty of one
#: parameter as a function of the number of clients m
CRITERIA = {"bic": np.log, "aic": lambda m: np.full(np.shape(m), 2.0)}


@dataclass
class Message:
    """What each client sends for ``personalize=auto`` (arrays (S, M, ...), or (S, 1, ...)
    for one client): its Gram matrix ``H`` and moment vector ``b``, the residual sums of
    squares ``rss`` and degrees of freedom ``dof`` (..., g) of its own least squares per group
    of targets (:class:`NoiseBlocks`) for the fleet's residual variances, and whether its
    data determine its own model (``own``: full-rank ``H``, a degree of freedom left in every
    group; ``rss`` and ``dof`` are 0 where not). These are its sufficient statistics."""

    H: np.ndarray
    b: np.ndarray
    rss: np.ndarray
    dof: np.ndarray
    own: np.ndarray


def client_message(H, b, yy, n, blocks, sse=None) -> Message:
    """A client's message (:class:`Message`) from its own statistics; ``blocks``, ``yy`` and
    ``sse`` as in :func:`least_squares_intervals`. A group whose residual variance is below
    :data:`EXACT` of its mean square counts as that fraction (a target updated exactly)."""
    p = H.shape[-1]
    _, _, s2, dof = least_squares_intervals(H, b, yy, n, blocks, sse=sse)
    blocks, yyg = _blocks_yy(blocks, yy, p)
    ms = yyg / np.maximum(np.asarray(n, float)[..., None] * blocks.n_targets, 1.0)
    s2 = np.maximum(s2, EXACT * ms)
    own = (own_fits(H, b).full & (dof > 0).all(axis=-1)
           & (s2 > 0).all(axis=-1))
    return Message(np.asarray(H, float), np.asarray(b, float),
                   np.where(own[..., None], s2 * dof, 0.0), np.where(own[..., None], dof, 0.0),
                   own)


@dataclass
class Fleet:
    """What the server sends back (arrays (S, ...)): the fleet mean ``mu`` (S, p), its
    covariance ``cov_mu`` (S, p, p), the heterogeneity covariance ``Sigma`` (S, p, p), the
    fleet's residual variances ``s2`` (S, g) for clients that could not estimate their own,
    the heterogeneity covariance the intervals assume ``Sigma_ci`` (S, p, p) (the
    unrestricted REML estimate, see :func:`client_posterior`), and the homogeneity test:
    ``Q`` (S,) and its p-value ``pvalue`` (S,) (NaN with fewer than two clients of their
    own); ``reml_converged`` (S,) whether each repeat's REML converged and ``reml_iterations``
    (S,) its passes over the clients (:class:`RemlReport`; None where the fleet was not
    estimated here, e.g. a client's copy)."""

    mu: np.ndarray
    cov_mu: np.ndarray
    Sigma: np.ndarray
    s2: np.ndarray
    Sigma_ci: np.ndarray
    Q: np.ndarray
    pvalue: np.ndarray
    reml_converged: np.ndarray | None = None
    reml_iterations: np.ndarray | None = None
    scale: np.ndarray | None = None


def parameter_scale(H: np.ndarray) -> np.ndarray:
    """The factors ``c`` (S, p) that scale each parameter's regressor to unit norm in the
    fleet's pooled statistics (``H`` (S, M, p, p) summed over the clients): ``c_k = 1 /
    sqrt(h_k)``, ``h`` the pooled Gram diagonal (1 where it is 0). ``auto`` works on the
    parameters ``theta_k / c_k`` (:func:`fleet`, :func:`client_posterior`), which are the
    same numbers in any units of the data, so that its eigenvalue cuts, low-rank factors and
    stopping rules do not depend on them; the results are mapped back."""
    return equilibration(np.diagonal(np.asarray(H, float).sum(axis=1), axis1=-2, axis2=-1))


def _fleet_variances(msg: Message) -> np.ndarray:
    """The fleet's residual variance of each group of targets ``sum rss / sum dof`` (S, g)
    over the clients with their own fit (1 where none has a degree of freedom)."""
    S, M = msg.b.shape[:2]
    rss, dof = msg.rss.reshape(S, M, -1), msg.dof.reshape(S, M, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dof.sum(axis=1) > 0, rss.sum(axis=1) / dof.sum(axis=1), 1.0)


def variance_dof(msg: Message) -> np.ndarray:
    """The degrees of freedom (S,) that :func:`_q_pvalue` gives the fleet's residual
    variances (:func:`_fleet_variances`, one per group of targets, on ``sum dof`` over the
    clients with their own fit): the fewest of the groups'."""
    S, M = msg.b.shape[:2]
    return msg.dof.reshape(S, M, -1).sum(axis=1).min(axis=-1)


def _q_pvalue(Q, m, p: int, dof=None) -> np.ndarray:
    """The tail of Cochran's ``Q`` (S,) over ``m`` (S,) clients of ``p`` parameters, ``k = (m -
    1) p`` degrees of freedom (NaN with fewer than two clients): ``Q / k`` against Snedecor's
    F(k, ``dof``), ``dof`` (S,) the degrees of freedom of the residual variances that scale
    the clients' information (:func:`variance_dof`; None: known variances, the chi-square
    tail of ``Q``). ``Q`` is a chi-square in ``k`` over the variances' ratio to the truth,
    itself a chi-square in ``dof`` over ``dof``: with one group of targets ``Q / k`` is F
    exactly; with several, each with its own variance, one F on the fewest degrees of
    freedom of theirs (:func:`variance_dof`): exact where the groups' variances move
    together (one noise on every target); where they vary independently, conservative from
    3 degrees of freedom (Monte Carlo, 3 groups of 5 parameters: size 4.4 % at level 0.05
    with 3, 2.8 % with 10) and above the level below that (5.7 % with 2, 8.3 % with 1).
    Taking the groups' variances as independent instead (``G`` times the degrees of
    freedom) rejected 23 % at level 0.05 on the synthetic fleet, where this rejects 5 %.
    Taking the variances as known rejected 56 % of homogeneous fleets at level 0.05 with
    three clients of one residual degree of freedom each (20 % with five each;
    docs/ALGORITHMS.md). The tails are ``scipy.special``'s ``fdtrc`` and ``chdtrc`` (as
    ``scipy.stats``' ``f.sf`` and ``chi2.sf``, without importing ``scipy.stats``)."""
    from scipy.special import chdtrc, fdtrc

    k = np.maximum((m - 1) * p, 1)
    if dof is None:
        return np.where(m >= 2, chdtrc(k, Q), np.nan)
    d = np.asarray(dof, float)
    ok = (m >= 2) & (d > 0)
    return np.where(ok, fdtrc(k, np.where(d > 0, d, 1.0), Q / k), np.nan)


def _scaled(msg: Message, s2, blocks, c=None) -> tuple[np.ndarray, np.ndarray]:
    """``J = S^-1/2 H S^-1/2`` and ``beta = S^-1 b`` of every client, ``S`` the diagonal of the
    fleet's residual variances ``s2`` (S, g) of each parameter's group; with ``c`` (S, p),
    those of the parameters ``theta / c`` (each regressor times ``c``), in one pass over
    ``H`` (``J = H`` times ``(c / sqrt(s))_k (c / sqrt(s))_l``, ``beta = b c / s``)."""
    p = msg.b.shape[-1]
    if isinstance(blocks, (int, np.integer)):
        blocks = pooled_blocks(int(blocks), p)
    s = np.asarray(s2, float).reshape(len(msg.b), -1)[:, blocks.param_block]
    f = 1.0 / np.sqrt(s) if c is None else np.asarray(c, float) / np.sqrt(s)
    g = 1.0 / s if c is None else np.asarray(c, float) / s
    return msg.H * (f[:, None, :, None] * f[:, None, None, :]), msg.b * g[:, None, :]


def homogeneity(theta, J, own, dof=None):
    """Cochran's Q generalised to vectors and its p-value (S,): ``Q = sum_i (theta_i -
    mu_F)' J_i (theta_i - mu_F)`` over the clients ``own`` (S, M) with their own estimates
    ``theta`` (S, M, p) and information ``J`` (S, M, p, p), ``mu_F`` the fixed-effect
    (generalized least-squares) mean; under homogeneity Q is chi-square with ``(m - 1) p``
    degrees of freedom where the variances in ``J_i`` are known, and ``Q / ((m - 1) p)`` is F
    on ``dof`` (S,) more where they are estimated on ``dof`` degrees of freedom
    (:func:`_q_pvalue`)."""
    p = theta.shape[-1]
    w = own.astype(float)
    Jth = np.matmul(J, theta[..., None])[..., 0]
    mu = np.einsum("spq,sq->sp", np.linalg.pinv(np.einsum("sm,smpq->spq", w, J),
                                                hermitian=True),
                   np.einsum("sm,smp->sp", w, Jth))
    d = theta - mu[:, None]
    Q = np.einsum("sm,smp,smp->s", w, d, np.matmul(J, d[..., None])[..., 0])
    return Q, _q_pvalue(Q, w.sum(axis=1), p, dof)


def homogeneity_from(msg: Message, blocks, theta):
    """:func:`homogeneity` of the clients' messages with their own estimates ``theta``
    (S, M, p) in the data's units, without the scaled copies of every client's information
    that :func:`fleet` makes (three passes of O(M p^2) over ``msg.H``): the information of
    client i is ``J_i = W H_i W``, ``W`` the diagonal of ``1 / sqrt(s2)`` of each parameter's
    group (the fleet's residual variances, :func:`own_estimates`). Returns ``(Q, pvalue)``
    (S,)."""
    p = msg.b.shape[-1]
    if isinstance(blocks, (int, np.integer)):
        blocks = pooled_blocks(int(blocks), p)
    w = 1.0 / np.sqrt(_fleet_variances(msg)[:, blocks.param_block])               # (S, p)
    m = msg.own.astype(float)
    theta = np.where(msg.own[..., None], theta, 0.0)
    Hv = np.einsum("smpq,smq->smp", msg.H, theta * w[:, None])
    A = np.einsum("sm,smpq->spq", m, msg.H) * w[:, :, None] * w[:, None, :]
    mu = np.einsum("spq,sq->sp", equilibrated_pinv(A), w * np.einsum("sm,smp->sp", m, Hv))
    e = (theta - mu[:, None]) * w[:, None]
    Q = np.einsum("sm,smp,smp->s", m, e, np.einsum("smpq,smq->smp", msg.H, e))
    return Q, _q_pvalue(Q, m.sum(axis=1), p, variance_dof(msg))


def _truncate(Sig, rank: int, factors: bool = False):
    """The best rank-``rank`` PSD approximation of symmetric ``Sig`` (S, p, p) (with its
    eigenvalues and eigenvectors ``(Sig, lam, U)`` where ``factors``)."""
    lam, U = np.linalg.eigh(Sig)
    # directions below 1e-12 of the largest are 0 (EM shrinks them geometrically to
    # subnormal numbers, which make every later product slow)
    lam = np.where(lam > 1e-12 * np.abs(lam).max(axis=-1, keepdims=True), lam, 0.0)
    lam[..., :Sig.shape[-1] - rank] = 0.0
    out = np.einsum("spk,sk,sqk->spq", U, lam, U)
    return (out, lam, U) if factors else out


def _factor(Sig):
    """``L`` (S, p, k) with ``Sig = L L'`` for a PSD ``Sig`` (S, p, p) of rank <= k (its
    eigen-directions of positive eigenvalue, largest first; k >= 1, zero columns where a
    repeat's rank is below k). Eigenvalues within rounding (``p eps`` of the largest) of 0
    count as 0."""
    lam, U = np.linalg.eigh(Sig)
    big = np.abs(lam).max(axis=-1, keepdims=True)
    lam = np.where(lam > Sig.shape[-1] * np.finfo(float).eps * big, lam, 0.0)
    return _columns(lam, U)


def _columns(lam, U):
    """``U sqrt(lam)`` on the columns of positive ``lam`` (ascending, as ``eigh`` gives them)."""
    k = max(int((lam > 0).sum(axis=-1).max(initial=0)), 1)
    return U[..., -k:] * np.sqrt(lam[..., None, -k:])


def _gram(X, Y):
    """``sum_m X_m Y_m'`` (S, k, l) of (S, M, k, p) and (S, M, l, p): one BLAS product."""
    S, M, k, p = X.shape
    x = np.swapaxes(X, 1, 2).reshape(S, k, M * p)
    y = np.swapaxes(Y, 1, 2).reshape(S, Y.shape[2], M * p)
    return x @ np.swapaxes(y, -1, -2)


class _Woodbury:
    """Every client's ``W_i = (Sigma + J_i^-1)^-1 = J_i - Z_i (I + K_i)^-1 Z_i'`` for
    ``Sigma = L L'`` (L (S, p, k)), ``Z_i = J_i L``, ``K_i = L' J_i L``, kept as
    ``Zt`` = ``Z_i'`` (S, M, k, p), ``K`` (S, M, k, k) and ``F_i = (I + K_i)^-1 Z_i' = L' W_i``
    (S, M, k, p): O(M p^2 k) per evaluation instead of O(M p^3), in BLAS products over all
    clients at once (``J`` stacked as (S, M p, p)) and one batched solve."""

    def __init__(self, J, L):
        S, M, p = J.shape[:3]
        k = L.shape[-1]
        self.L = L
        # Z_i' = L' J_i for all clients at once: (k, p) @ (p, M p), J_i symmetric
        Zt = np.matmul(np.swapaxes(L, -1, -2), np.swapaxes(J.reshape(S, M * p, p), -1, -2))
        self.Zt = np.ascontiguousarray(np.swapaxes(Zt.reshape(S, k, M, p), 1, 2))
        K = np.einsum("smkp,spl->smkl", self.Zt, L, optimize=True)
        self.K = (K + np.swapaxes(K, -1, -2)) / 2
        self.F = np.linalg.solve(np.eye(k) + self.K, self.Zt)

    @property
    def Ginv(self):
        """``(I + K_i)^-1`` (S, M, k, k)."""
        return np.linalg.inv(np.eye(self.K.shape[-1]) + self.K)

    def wsum(self, sJ):
        """``sum_i W_i`` (S, p, p) from ``sum_i J_i``."""
        Wsum = sJ - _gram(np.swapaxes(self.Zt, -1, -2), np.swapaxes(self.F, -1, -2))
        return (Wsum + np.swapaxes(Wsum, -1, -2)) / 2

    def sums(self, sJ, sJth, th):
        """``sum_i W_i`` (S, p, p), ``sum_i W_i th_i`` (S, p) from ``sum J_i`` and
        ``sum J_i th_i``, and ``F_i th_i`` (S, M, k)."""
        Fth = np.einsum("smkp,smp->smk", self.F, th)
        Wth = sJth - np.einsum("smkp,smk->sp", self.Zt, Fth)
        return self.wsum(sJ), Wth, Fth


def _low_rank(Sigma):
    """``L`` with ``Sigma = L L'`` (:func:`_factor`) of a PSD ``Sigma`` (S, p, p), factored
    scaled to a unit diagonal, so that parameters of very different scales keep their
    accuracy."""
    d = np.diagonal(Sigma, axis1=-2, axis2=-1)
    d = np.sqrt(np.where(d > 0, d, 1.0))
    return _factor(Sigma / (d[:, :, None] * d[:, None, :])) * d[:, :, None]


def _pass(th, Jw, w, m, Sig, lam, U, rank: int, sJ, sJth):
    """One evaluation of the REML EM map at ``Sig`` (its eigenvalues ``lam`` and vectors
    ``U``, as :func:`_truncate` gives them): one pass over the clients. Returns ``(new, lam,
    U, ll, mu, step)``: the EM iterate truncated to rank ``rank`` with its eigen-pairs, the
    restricted log-likelihood (up to a constant) and the fleet mean at ``Sig``, and the
    relative step ``max |new - Sig| / max |Sig|`` (S,).

    With ``Sigma = L L'`` the EM iterate is ``Sigma + Sigma D Sigma / m`` with ``D = sum_i
    (u_i u_i' - W_i + W_i Cov(mu) W_i)``, ``u_i = W_i (theta_i - mu)`` (the update of
    :func:`reml` written with ``P_i = Sigma - Sigma W_i Sigma`` and ``A_i = Sigma W_i``), and
    needs only ``L' D L`` (k x k): every client enters through ``F_i = L' W_i``
    (:class:`_Woodbury`)."""
    S, M, p = th.shape
    L = _columns(lam, U)
    k = L.shape[-1]
    wb = _Woodbury(Jw, L)
    Wsum, Wth, Fth = wb.sums(sJ, sJth, th)
    cov_mu = np.linalg.pinv(Wsum, hermitian=True)
    mu = np.einsum("spq,sq->sp", cov_mu, Wth)
    Fr = Fth - np.matmul(wb.F.reshape(S, M * k, p), mu[..., None]).reshape(S, M, k)
    FC = np.matmul(wb.F.reshape(S, M * k, p), cov_mu).reshape(S, M, k, p)
    E = (np.swapaxes(Fr, -1, -2) @ Fr + _gram(FC, wb.F)
         - wb.F.sum(axis=1) @ L)                # L' D L; L' W_i L = F_i L
    inner = np.eye(k) + E / m[:, None, None]
    new = L @ inner @ np.swapaxes(L, -1, -2)
    new = (new + np.swapaxes(new, -1, -2)) / 2
    new, nlam, nU = _truncate(new, rank, factors=True)
    step = np.abs(new - Sig).max(axis=(1, 2)) / np.maximum(
        np.abs(Sig).max(axis=(1, 2)), np.finfo(float).tiny)
    # restricted log-likelihood at Sig: -(sum_i log|I + J_i Sigma| + sum_i r_i' W_i r_i
    # + log|sum_i W_i|) / 2, r_i = theta_i - mu; r_i' W_i r_i = r_i' J_i r_i - (Z_i' r_i)' F_i r_i
    r = th - mu[:, None]
    Zr = np.einsum("smkp,smp->smk", wb.Zt, r)
    rWr = (np.einsum("smp,smpq,smq->s", r, Jw, r, optimize=True)
           - np.einsum("smk,smkp,smp->s", Zr, wb.F, r, optimize=True))
    ld = np.linalg.slogdet(np.eye(k) + wb.K)[1]    # log|I + J_i Sigma|
    ll = -0.5 * (np.einsum("sm,sm->s", w, ld) + rWr + np.linalg.slogdet(Wsum)[1])
    return new, nlam, nU, ll, mu, step


#: SQUAREM: halvings of the step length toward the plain EM step until the extrapolated
#: point is positive semi-definite
BACKTRACK = 8


def _em(th, Jw, w, m, Sig, rank: int, iterations: int, tol: float, sJ=None, sJth=None,
        squarem: bool = True):
    """The REML of :func:`reml` at one rank: ``(Sigma, mu, ll, converged, passes)``, the
    restricted log-likelihood ``ll`` (up to a constant) at ``Sigma``, whether the EM map moves
    ``Sigma`` by less than ``tol`` (relative, ``max |F(Sigma) - Sigma| / max |Sigma|``: a
    stationary point of the likelihood up to ``tol``; directions whose variance goes to 0,
    where EM and SQUAREM approach the boundary slowly, may keep a variance far below the
    largest, see docs/ALGORITHMS.md) and the passes over the clients (EM map evaluations:
    at most ``iterations`` that move ``Sigma`` and the last one, the check). ``sJ``, ``sJth``:
    ``sum_i Jw_i`` and ``sum_i Jw_i th_i`` (computed here when not given). ``squarem=False``:
    the plain EM, ``iterations`` steps unless it converges first.

    The EM map ``F`` (:func:`_pass`) is accelerated by SQUAREM (Varadhan & Roland 2008,
    https://doi.org/10.1111/j.1467-9469.2007.00585.x, scheme S3): from ``Sigma_0``,
    ``Sigma_1 = F(Sigma_0)``, ``Sigma_2 = F(Sigma_1)``, ``r = Sigma_1 - Sigma_0``,
    ``v = Sigma_2 - 2 Sigma_1 + Sigma_0``, ``a = -min(-1, |r| / |v|)`` (Frobenius norms)
    and the extrapolation ``Sigma_0 + 2 a r + a^2 v`` (``a = 1`` is ``Sigma_2``), whose ``a``
    is halved toward 1 until the point is positive semi-definite; one EM step from it is the
    next iterate if its likelihood is not below ``Sigma_0``'s, else ``Sigma_2`` (plain EM,
    which never lowers it). Each repeat stops when it converges (its ``Sigma`` is then kept)."""
    S, M, p = th.shape
    if sJ is None:
        sJ, sJth = Jw.sum(axis=1), np.einsum("smpq,smq->sp", Jw, th)
    args = (th, Jw, w, m)
    Sig, lam, U = _truncate(Sig, rank, factors=True)
    conv = np.zeros(S, bool)
    passes = np.zeros(S, int)
    done = 0
    while True:
        S1, lam1, U1, ll, mu, step = _pass(*args, Sig, lam, U, rank, sJ, sJth)
        done += 1
        passes = np.where(conv, passes, done)
        conv = conv | (step < tol)
        if conv.all() or done > iterations:
            break
        keep = conv[:, None, None]
        if not squarem or done + 2 > iterations:   # (no room for a SQUAREM cycle) EM step
            Sig, lam, U = (np.where(keep, Sig, S1), np.where(conv[:, None], lam, lam1),
                           np.where(keep, U, U1))
            continue
        S2, lam2, U2, _, _, _ = _pass(*args, S1, lam1, U1, rank, sJ, sJth)
        done += 1
        r, v = S1 - Sig, S2 - 2 * S1 + Sig
        nv = np.linalg.norm(v, axis=(1, 2))
        a = np.where(nv > 0, np.linalg.norm(r, axis=(1, 2)) / np.where(nv > 0, nv, 1.0), 1.0)
        a = np.maximum(a, 1.0)
        for _ in range(BACKTRACK + 1):
            X = Sig + 2 * a[:, None, None] * r + (a ** 2)[:, None, None] * v
            X = (X + np.swapaxes(X, -1, -2)) / 2
            ev = np.linalg.eigvalsh(X)
            bad = ev[:, 0] < -1e-12 * np.abs(ev).max(axis=-1)
            if not bad.any():
                break
            a = np.where(bad, (a + 1) / 2, a)
        X = np.where(bad[:, None, None], S2, X)
        X, lamX, UX = _truncate(X, rank, factors=True)
        S3, lam3, U3, llX, _, _ = _pass(*args, X, lamX, UX, rank, sJ, sJth)
        done += 1
        up = llX >= ll                              # not below the likelihood at Sigma_0
        Sig = np.where(keep, Sig, np.where(up[:, None, None], S3, S2))
        lam = np.where(conv[:, None], lam, np.where(up[:, None], lam3, lam2))
        U = np.where(keep, U, np.where(up[:, None, None], U3, U2))
    return Sig, mu, ll, conv, passes


def _restricted(th, Jw, w, Sig, em: str | None = "full"):
    """The restricted log-likelihood (S,) at a PSD ``Sig`` (S, p, p) of any rank, with the
    constant of :func:`_em`'s, and the unrestricted EM map ``Sig + Sig D Sig / m`` (S, p, p)
    there (``em="full"``), only its diagonal (S, p) for a diagonal ``Sig`` (``"diagonal"``)
    or nothing (None), ``D = sum_i (u_i u_i' - W_i + W_i Cov(mu) W_i)``: dense, O(M p^3),
    for the structures of :data:`STRUCTURES` (``Jw`` the clients' information, 0 for clients
    without their own fit)."""
    S, M, p = th.shape
    A = np.eye(p) + Jw @ Sig[:, None]                       # I + J_i Sigma
    W = np.linalg.solve(A, Jw)                              # (I + J_i Sigma)^-1 J_i
    W = (W + np.swapaxes(W, -1, -2)) / 2
    Wsum = W.sum(axis=1)
    cov_mu = np.linalg.pinv(Wsum, hermitian=True)
    mu = np.einsum("spq,sq->sp", cov_mu, np.einsum("smpq,smq->sp", W, th))
    r = th - mu[:, None]
    u = np.einsum("smpq,smq->smp", W, r)
    ld = np.linalg.slogdet(A)[1]
    ll = -0.5 * (np.einsum("sm,sm->s", w, ld) + np.einsum("smp,smp->s", r, u)
                 + np.linalg.slogdet(Wsum)[1])
    if em is None:
        return ll, None
    m = np.maximum(w.sum(axis=1), 1.0)
    WC = np.matmul(W.reshape(S, M * p, p), cov_mu).reshape(S, M, p, p)
    if em == "diagonal":                  # diag(D) only: (W_i C W_i)_jj = sum_k (W_i C)_jk W_ijk
        Dd = (np.einsum("smp,smp->sp", u, u) - np.diagonal(Wsum, axis1=-2, axis2=-1)
              + np.einsum("smjk,smjk->sj", WC, W))
        sig = np.diagonal(Sig, axis1=-2, axis2=-1)
        return ll, sig + sig ** 2 * Dd / m[:, None]
    D = (np.einsum("smp,smq->spq", u, u) - Wsum
         + _gram(WC, W))                  # sum_i W_i C W_i (W_i symmetric)
    new = Sig + Sig @ D @ Sig / m[:, None, None]
    return ll, (new + np.swapaxes(new, -1, -2)) / 2


#: golden-section steps of the one-parameter structures' REML (after a grid of
#: :data:`TAU_GRID` points on ``log tau^2`` in ``[-12, 8]``, scaled coordinates): the bracket
#: ends 2 * 0.618^30 ~ 1e-6 wide in ``log tau^2``
GOLDEN = 30
TAU_GRID = 21


def _one_parameter(th, Jw, w, D):
    """REML of ``Sigma = tau^2 D`` (D (S, p, p) PSD): ``(Sigma, ll)``, the maximum over
    ``tau^2 = 0`` and a golden-section search on ``log tau^2`` from the best point of a grid,
    vectorized over repeats and clients."""
    def at(t):
        return _restricted(th, Jw, w, np.exp(t)[:, None, None] * D, None)[0]

    S = th.shape[0]
    grid = np.linspace(-12.0, 8.0, TAU_GRID)
    k = np.stack([at(np.full(S, g)) for g in grid]).argmax(axis=0)
    a, b = grid[np.maximum(k - 1, 0)], grid[np.minimum(k + 1, TAU_GRID - 1)]
    g = (np.sqrt(5.0) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = at(c), at(d)
    for _ in range(GOLDEN):
        left = fc > fd                        # the maximum is in [a, d], else in [c, b]
        a, b = np.where(left, a, c), np.where(left, d, b)
        c, d = (np.where(left, b - g * (b - a), d), np.where(left, c, a + g * (b - a)))
        f = at(np.where(left, c, d))          # the one new point
        fc, fd = np.where(left, f, fd), np.where(left, fc, f)
    t = (a + b) / 2
    Sig = np.exp(t)[:, None, None] * D
    ll = _restricted(th, Jw, w, Sig, None)[0]
    ll0 = _restricted(th, Jw, w, np.zeros_like(D), None)[0]
    zero = ll0 > ll
    return np.where(zero[:, None, None], 0.0, Sig), np.maximum(ll, ll0)


def _diagonal(th, Jw, w, x, iterations: int, tol: float):
    """REML of a diagonal ``Sigma`` from the diagonal ``x`` (S, p): ``(Sigma, ll, converged,
    passes)``. The EM iteration with the diagonal constraint keeps the diagonal of the
    unrestricted EM map (:func:`_restricted`; the maximizer of the complete-data likelihood
    over diagonal covariances is the diagonal of the mean second moment), accelerated by
    SQUAREM as :func:`_em` (the extrapolated point clipped at 0 instead of halving toward the
    EM step), converged when one EM step moves it by less than ``tol`` of its largest entry."""
    S, p = x.shape

    def F(x):
        ll, new = _restricted(th, Jw, w, x[..., None] * np.eye(p), "diagonal")
        return np.maximum(new, 0.0), ll

    conv, passes, done = np.zeros(S, bool), np.zeros(S, int), 0
    while True:
        x1, ll = F(x)
        done += 1
        passes = np.where(conv, passes, done)
        step = np.abs(x1 - x).max(axis=-1) / np.maximum(np.abs(x).max(axis=-1),
                                                        np.finfo(float).tiny)
        conv = conv | (step < tol)
        if conv.all() or done > iterations:
            break
        keep = conv[:, None]
        if done + 2 > iterations:
            x = np.where(keep, x, x1)
            continue
        x2, _ = F(x1)
        r, v = x1 - x, x2 - 2 * x1 + x
        nv = np.linalg.norm(v, axis=-1)
        a = np.maximum(np.where(nv > 0, np.linalg.norm(r, axis=-1) / np.where(nv > 0, nv, 1.0),
                                1.0), 1.0)
        X = np.maximum(x + 2 * a[:, None] * r + (a ** 2)[:, None] * v, 0.0)
        x3, llX = F(X)
        done += 2
        x = np.where(keep, x, np.where((llX >= ll)[:, None], x3, x2))
    return x[..., None] * np.eye(p), ll, conv, passes


def reml(theta, J, own, iterations: int = 200, tol: float = 1e-6,
         max_rank: int = MAX_RANK, report: bool = False, structures=(),
         criterion: str = "bic"):
    """Restricted maximum likelihood of a low-rank heterogeneity covariance ``Sigma``
    (S, p, p), and of the unrestricted one (rank up to p, for the intervals), of the model
    ``theta_i ~ N(mu, Sigma + J_i^-1)`` over the clients ``own`` (S, M), vectorized over
    repeats and clients.

    For each rank ``r`` = 1 ... ``min(max_rank, m - 1, p)`` the EM iteration of the linear
    mixed model with ``mu`` integrated out: every client's posterior
    ``delta_i = A_i (theta_i - mu)``, ``A_i = Sigma (I + J_i Sigma)^-1 J_i``, and ``Sigma =
    mean_i (delta_i delta_i' + P_i + A_i Cov(mu) A_i')`` with ``P_i = Sigma (I + J_i
    Sigma)^-1`` (the last term is what makes it REML), truncated to its top ``r``
    eigen-directions. Beside them, where asked, the structures of ``structures`` (default
    none: the low ranks alone; any of :data:`STRUCTURES`):
    ``Sigma = tau^2 I`` and ``tau^2 mean_i V_i`` (one parameter each; the REML by a golden
    section search on ``log tau^2``, :func:`_one_parameter`) and a diagonal ``Sigma``
    (``p`` parameters; EM with the diagonal constraint, :func:`_diagonal`). One rule
    chooses among all of them, 0 included: the smallest information criterion
    ``-2 ll + k pen(m)`` on the restricted likelihood ``ll``, ``k`` the structure's
    parameters (rank r: ``r p - r (r - 1) / 2``), ``pen`` of :data:`CRITERIA`
    (``criterion``; BIC: ``log m``); ``max_rank = 0`` and no ``structures``: ``Sigma = 0``.
    A full-rank choice makes every later use of ``Sigma`` through its factor cost
    O(M p^3) instead of O(M p^2 r). It works in coordinates scaled by the
    mean information's diagonal, so targets of very different noise levels keep their
    accuracy, and starts from the moment estimate ``C - mean V_i`` (PSD part) plus the mean
    ``V_i``. Each fit is the EM accelerated by SQUAREM (:func:`_em`), at most ``iterations``
    passes over the clients, converged when the EM map moves it by less than ``tol``
    (relative). Returns ``(Sigma, Sigma_full)``, and a :class:`RemlReport` third where
    ``report``."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion={criterion} is not allowed; allowed: "
                         f"{', '.join(CRITERIA)}")
    if any(x not in STRUCTURES for x in structures):
        raise ValueError(f"structures={list(structures)} is not allowed; allowed: any of "
                         f"{', '.join(STRUCTURES)}")
    S, M, p = theta.shape
    w = own.astype(float)
    m = np.maximum(w.sum(axis=1), 1.0)
    Jbar = np.einsum("sm,smpq->spq", w, J) / m[:, None, None]
    dg = np.sqrt(np.maximum(np.diagonal(Jbar, axis1=-2, axis2=-1), np.finfo(float).tiny))
    Js = J / (dg[:, None, :, None] * dg[:, None, None, :])
    th = theta * dg[:, None]
    eye = np.eye(p)
    V = np.linalg.inv(np.where(own[..., None, None], Js, eye))
    mean = np.einsum("sm,smp->sp", w, th) / m[:, None]
    dev = (th - mean[:, None]) * w[..., None]
    C = np.einsum("smp,smq->spq", dev, dev) / np.maximum(m - 1, 1)[:, None, None]
    Vbar = np.einsum("sm,smpq->spq", w, V) / m[:, None, None]
    start = _truncate(C - Vbar, p) + Vbar
    Jw = Js * w[..., None, None]
    sums = Jw.sum(axis=1), np.einsum("smpq,smq->sp", Jw, th)     # once for every rank
    zero = np.zeros((S, p, p))
    pen = CRITERIA[criterion](m)
    best, best_ic = zero, -2 * _em(th, Jw, w, m, zero, 0, 0, tol, *sums)[2]
    top = int(min(max_rank, p, max(w.sum(axis=1).min() - 1, 0)))
    conv, its = np.ones(S, bool), np.zeros(S, int)

    def compare(Sig, ll, k):
        nonlocal best, best_ic
        ic = -2 * ll + k * pen
        better = ic < best_ic
        best = np.where(better[:, None, None], Sig, best)
        best_ic = np.where(better, ic, best_ic)

    for r in range(1, top + 1):
        Sig, _, ll, c, n = _em(th, Jw, w, m, _truncate(start, r), r, iterations, tol, *sums)
        conv, its = conv & c, np.maximum(its, n)
        compare(Sig, ll, r * p - r * (r - 1) / 2)
    if w.sum(axis=1).max() >= 2:
        for name in structures:
            if name == "diagonal":
                Sig, ll, c, n = _diagonal(th, Jw, w, np.diagonal(start, axis1=-2, axis2=-1),
                                          iterations, tol)
                conv, its = conv & c, np.maximum(its, n)
                compare(Sig, ll, p)
            else:
                D = np.broadcast_to(eye, (S, p, p)) if name == "identity" else Vbar
                compare(*_one_parameter(th, Jw, w, D), 1)
    full, _, _, c, n = _em(th, Jw, w, m, start, p, iterations, tol, *sums)
    ok = (w.sum(axis=1) >= 2)[:, None, None]
    back = dg[:, :, None] * dg[:, None, :]
    out = np.where(ok, best / back, 0.0), np.where(ok, full / back, 0.0)
    if report:
        return out + (RemlReport(conv & c | ~ok[:, 0, 0], np.maximum(its, n), iterations),)
    return out


@dataclass
class RemlReport:
    """How :func:`reml`'s fits ended, per repeat (S,): ``converged`` (every rank's fit and
    the unrestricted one: the EM map moves each by less than ``tol``; True where fewer than
    two clients have their own model and ``Sigma`` is 0 by definition), ``iterations`` (the
    most passes over the clients any one fit took) and the cap ``limit``."""

    converged: np.ndarray
    iterations: np.ndarray
    limit: int


def reml_clients(M: int, most: int | None = REML_CLIENTS) -> np.ndarray | slice:
    """The clients whose own estimates enter :func:`reml` (of M): all of them up to ``most``
    (None: no limit), else ``most`` of them drawn without replacement by a fixed seed, in
    their order (the same clients in every repeat and every run of the same M)."""
    if most is None or M <= most:
        return slice(None)
    return np.sort(np.random.default_rng(M).choice(M, size=most, replace=False))


def own_estimates(msg: Message, blocks):
    """The first step of :func:`fleet`, in the unit-scaled parameters: ``(c, s2, J, beta,
    theta)``, the parameter scale (:func:`parameter_scale` times the square root of each
    parameter's group variance, so that the pooled information has a unit diagonal), the
    fleet's residual variances (:func:`_fleet_variances`), every client's information and
    moments scaled by them (:func:`_scaled`) and each determined client's own estimate
    ``J_i^-1 beta_i`` (0 for the others)."""
    p = msg.b.shape[-1]
    s2 = _fleet_variances(msg)                                                    # (S, g)
    groups = pooled_blocks(int(blocks), p) if isinstance(blocks, (int, np.integer)) else blocks
    # unit-norm regressors and, through sqrt(s2), unit information per parameter in the
    # pooled J: groups whose noise differs by many orders (a target updated exactly beside a
    # noisy one, whatever its units) do not leave one group below the others' round-off
    c = parameter_scale(msg.H) * np.sqrt(s2[:, groups.param_block])
    J, beta = _scaled(msg, s2, blocks, c)
    own = msg.own.all()        # else the undetermined clients' J replaced by I (a copy of J)
    theta = np.linalg.solve(J if own else np.where(msg.own[..., None, None], J, np.eye(p)),
                            np.where(msg.own[..., None], beta, 0.0)[..., None])[..., 0]
    return c, s2, J, beta, theta


def fleet(msg: Message, blocks, iterations: int = 200, structures=(),
          criterion: str = "bic", max_rank: int = MAX_RANK,
          most: int | None = REML_CLIENTS) -> Fleet:
    """The server's part of ``auto`` from the stacked messages (S, M, ...); ``blocks`` the
    model's :class:`NoiseBlocks` (or ``n_y``: one variance for all targets).

    The fleet's residual variance of each group of targets is ``sum rss / sum dof`` over the
    clients with their own fit (``own``); every client's information is scaled by it
    (:func:`_scaled`; with ``Sigma = 0``, ``mu`` is pooled least squares). Those clients give
    the homogeneity test (:func:`homogeneity`) and, where it rejects at
    :data:`HOMOGENEITY_LEVEL`, the heterogeneity ``Sigma`` (:func:`reml`) from their own
    estimates ``theta_i = J_i^-1 beta_i``; where it does not, ``Sigma = 0``. ``mu``
    is the generalized least-squares mean of all clients, weights
    ``W_i = (Sigma + J_i^-1)^-1 = J_i (I + Sigma J_i)^-1`` (defined for singular ``J_i``:
    a client weighs nothing in the directions its data do not determine). ``iterations``:
    :func:`reml`'s cap on its passes over the clients. ``most``: the most clients whose
    estimates enter the REML of ``Sigma`` (:func:`reml_clients`; a fixed random subset
    above it, :data:`REML_CLIENTS`); the test, ``mu`` and every client's posterior use all.
    All of it runs on the parameters scaled to unit-size regressors (:func:`parameter_scale`,
    returned as ``scale``); the fleet's arrays are mapped back to the data's units.
    """
    c, s2, J, beta, theta = own_estimates(msg, blocks)
    own = msg.own
    M = msg.b.shape[1]
    Q, pv = homogeneity(theta, J, own, variance_dof(msg))
    hetero = pv < HOMOGENEITY_LEVEL
    # the low-rank Sigma only where some repeat is heterogeneous (it is 0 elsewhere); the
    # unrestricted Sigma_ci always
    sub = reml_clients(M, most)
    Sigma, Sigma_ci, rep = reml(theta[:, sub], J[:, sub], own[:, sub], iterations,
                                max_rank=max_rank if hetero.any() else 0, report=True,
                                structures=structures if hetero.any() else (),
                                criterion=criterion)
    Sigma = np.where(hetero[:, None, None], Sigma, 0.0)
    mu, cov_mu = fleet_mean(J, beta, Sigma)
    cc = c[:, :, None] * c[:, None, :]
    return Fleet(mu * c, cov_mu * cc, Sigma * cc, s2, Sigma_ci * cc, Q, pv, rep.converged,
                 rep.iterations, c)


def fleet_mean(J, beta, Sigma) -> tuple[np.ndarray, np.ndarray]:
    """The fleet mean ``mu`` (S, p) and its covariance ``Cov(mu)`` (S, p, p) of every client's
    scaled information ``J`` (S, M, p, p) and ``beta`` (S, M, p) (:func:`_scaled`) given the
    heterogeneity ``Sigma`` (S, p, p): ``mu = (sum W_i)^-1 sum (I + J_i Sigma)^-1 beta_i``,
    ``Cov(mu) = (sum W_i)^-1``, ``W_i = (Sigma + J_i^-1)^-1``."""
    # sum_i W_i and sum_i (I + J_i Sigma)^-1 beta_i, Sigma = L L' of rank k:
    # W_i = J_i - Z_i (I + K_i)^-1 Z_i' (:class:`_Woodbury`), O(M p^2 k)
    wb = _Woodbury(J, _low_rank(Sigma))
    Lb = np.einsum("spk,smp->smk", wb.L, beta)
    rhs = beta.sum(axis=1) - np.einsum("smkp,smk->sp", wb.Zt,
                                       np.linalg.solve(np.eye(Lb.shape[-1]) + wb.K,
                                                       Lb[..., None])[..., 0])
    cov_mu = np.linalg.pinv(wb.wsum(J.sum(axis=1)), hermitian=True)
    mu = np.einsum("spq,sq->sp", cov_mu, rhs)
    return mu, cov_mu


def client_posterior(msg: Message, fl: Fleet, blocks) -> tuple[np.ndarray, np.ndarray]:
    """Each client's personalized model and its standard errors (S, M, p), computed from its
    own message and the server's :class:`Fleet` alone.

    ``theta_i = mu + A_i (theta_hat_i - mu)``, ``A_i = Sigma (I + J_i Sigma)^-1 J_i`` (in
    information form ``mu + Sigma (I + J_i Sigma)^-1 (beta_i - J_i mu)``), the posterior mean
    of the random-effects model. Its error ``B_i (mu_hat - mu) - B_i delta_i + A_i e_i``
    (``B_i = I - A_i = (I + Sigma J_i)^-1``) has covariance
    ``B_i (Sigma_ci + Cov(mu)) B_i' + A_i J_i^-1 A_i'`` when the clients' spread is
    ``Sigma_ci``: with ``Sigma_ci = Sigma`` that is the posterior covariance
    ``Sigma (I + J_i Sigma)^-1 + B_i Cov(mu) B_i'``; the intervals take the unrestricted
    REML ``Sigma_ci`` (:class:`Fleet`), which keeps the directions the rank and the test
    left out. Computed with a factor ``Sigma = L L'`` of its rank (:class:`_Woodbury`), so a
    client costs O(p^2 rank), and its k x k systems ``I + L' J_i L`` do not depend on the
    scales of the parameters; the whole in the unit-scaled parameters of ``fl.scale``
    (:func:`parameter_scale`; none where it is None).
    """
    S, _, p = msg.b.shape
    c = np.ones((S, p)) if fl.scale is None else np.asarray(fl.scale, float)
    theta, se = _posterior(msg, _unscaled_fleet(fl, c), blocks, c)
    return theta * c[:, None, :], se * c[:, None, :]


def _unscaled_fleet(fl: Fleet, c: np.ndarray) -> Fleet:
    """``fl`` for the parameters ``theta / c`` (:func:`parameter_scale`)."""
    cc = c[:, :, None] * c[:, None, :]
    return replace(fl, mu=fl.mu / c, cov_mu=fl.cov_mu / cc, Sigma=fl.Sigma / cc,
                   Sigma_ci=fl.Sigma_ci / cc, scale=None)


def _posterior(msg: Message, fl: Fleet, blocks, c) -> tuple[np.ndarray, np.ndarray]:
    """:func:`client_posterior` in the coordinates of ``fl``: those of ``msg`` rescaled by
    ``c`` (each regressor times ``c``)."""
    J, beta = _scaled(msg, fl.s2, blocks, c)
    S, M, p = beta.shape
    # with Sigma = L L' (rank k): A_i = L (I + K_i)^-1 L' J_i and B_i = I - L F_i,
    # F_i = (I + K_i)^-1 Z_i' (:class:`_Woodbury`): O(M p^2 k), not O(M p^3)
    wb = _Woodbury(J, _low_rank(fl.Sigma))
    L, k = wb.L, wb.L.shape[-1]
    Lr = np.einsum("spk,smp->smk", L, beta) - np.einsum("smkp,sp->smk", wb.Zt, fl.mu)
    Ginv = wb.Ginv
    theta = fl.mu[:, None] + np.einsum("spk,smk->smp", L, np.einsum("smkl,sml->smk", Ginv, Lr))
    # diag(B T B' + A J^-1 A') with T = Sigma_ci + Cov(mu):
    # T_jj - 2 (L F T)_jj + (L (F T F' + Ginv K Ginv) L')_jj
    T = fl.Sigma_ci + fl.cov_mu
    FT = np.matmul(wb.F.reshape(S, M * k, p), T).reshape(S, M, k, p)
    N = FT @ np.swapaxes(wb.F, -1, -2) + Ginv @ wb.K @ Ginv
    var = (np.diagonal(T, axis1=-2, axis2=-1)[:, None]
           - 2 * np.einsum("spk,smkp->smp", L, FT)
           + np.einsum("spk,smkl,spl->smp", L, N, L, optimize=True))
    se = np.sqrt(np.maximum(var, 0.0))
    return theta, se


def auto(H, b, yy, n, blocks, structures=(), criterion: str = "bic",
         max_rank: int = MAX_RANK, sse=None) -> tuple[np.ndarray, np.ndarray, Fleet]:
    """``personalize=auto`` for all clients at once: (models, se, fleet); ``blocks``, ``yy``
    and ``sse`` as in :func:`least_squares_intervals`; ``structures``, ``criterion`` and
    ``max_rank``: the heterogeneity's candidate structures and the rule that chooses among
    them (:func:`reml`)."""
    msg = client_message(H, b, yy, n, blocks, sse)
    fl = fleet(msg, blocks, structures=structures, criterion=criterion, max_rank=max_rank)
    theta, se = client_posterior(msg, fl, blocks)
    return theta, se, fl


def finetune(optimizer, data, model, start, K: int, lr: float, seed: int) -> np.ndarray:
    """K local steps of ``optimizer`` on each client's own data from ``start`` (S, 1 or M, p)
    (the final server model): (S, M, p). The optimizer is set up on ``data`` again (a strategy
    such as ``centralized`` set it up on the pooled data)."""
    optimizer.setup(data, model, seed)
    S, M = data.shape
    start = np.array(np.broadcast_to(start, (S, M, start.shape[-1])))
    return optimizer.local_steps(start, K, lr)
