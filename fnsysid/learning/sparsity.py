"""Sparse identification (the ``sparsity`` config group): which terms of the library to keep.

``sparsity=stlsq`` is sequentially thresholded least squares (Brunton, Proctor, Kutz 2016), as
PySINDy's ``STLSQ(threshold, alpha)``: fit, set every coefficient whose magnitude is below
``threshold`` to zero, refit on the terms that are left, and repeat until the set of terms (the
*support*) stops changing. With ``scale=unit`` (the default) the magnitude compared is the
coefficient of features and targets scaled to unit size (:func:`unit_scales`, from the
clients' summed statistics); with ``scale=data`` it is the raw coefficient (PySINDy on
unnormalized columns). With ``alpha`` > 0 and ``unbias`` the kept terms are fitted without
the ridge once the support is stable (PySINDy's ``unbias=True``). The support is kept
per repeat and per coefficient, (S, p); for the dense models of a feature library each state's
row of ``Theta`` has its own terms.

Federated, the server chooses the support and every client continues on it. The server
thresholds what pooled least squares gives, STLSQ on the clients' summed statistics
``sum_i H_i``, ``sum_i b_i`` (:meth:`STLSQ.choose`), before round 0 and whatever the strategy
(under ``runtime=flower`` the clients send ``H_i``, ``b_i`` with their sample counts); the
strategy is then set up on the problem restricted to the support (the clients' local maps,
SCAFFOLD's control variates), so pruned coefficients stay exactly 0 and the kept ones are
the strategy's own estimate: ``centralized_exact`` gives pooled STLSQ exactly, ``oneshot`` the
average of the clients' own least squares on the kept terms, the iterative strategies
(``fedavg``, ``fedprox``, ``fedlin``, ``scaffold``, ``fednova``, ``centralized``, ``cyclic``)
converge on them. Thresholding the server model instead selects the terms of that strategy's
fixed point: with whitened local steps (the generic system's default) FedAvg's fixed point is
the mean of the clients' own fits, whatever K (docs/ALGORITHMS.md, "Sparse models").

``threshold=auto`` (:meth:`STLSQ.choose_auto`) chooses the threshold along
:data:`AUTO_GRID`: each threshold's STLSQ support on the pooled statistics is a candidate,
scored by the held-out residual sums of squares of its pooled fit, which come from the
clients' held-out statistics summed (each client's held-out error is a quadratic in the
coefficients), or by BIC on the pooled training residuals when there are no held-out data;
the fewest terms whose score is within ``margin`` (default 2) of the smallest is kept
(docs/ALGORITHMS.md, "Choosing the threshold").

Restricting a client's problem to the support: ``H -> D (H + a_i I) D`` and ``b -> D b`` with
``D`` the 0/1 diagonal of the support and ``a_i`` the client's share of the ridge ``alpha``
(its share of the samples, so the shares add up to ``alpha`` over the pooled data). The
gradient ``H theta - b`` is then zero outside the support and the exact solutions
(``pinv``) are zero there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fnsysid.dynamics.model import ClientData, constant_feature, least_squares, masked_gram


def restricted_solution(H: np.ndarray, b: np.ndarray, support: np.ndarray,
                        alpha: float = 0.0) -> np.ndarray:
    """Least-squares (ridge ``alpha``) solution on the coefficients in ``support``, exactly 0
    elsewhere: ``(D (H + alpha I) D)^+ D b``, batched over the leading axes.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        Gram matrices.
    b : numpy.ndarray, shape (..., p)
        Moments ``X'y``.
    support : numpy.ndarray of bool, shape (..., p)
        The kept coefficients (``D`` its diagonal).
    alpha : float, default=0.0
        The ridge weight.

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    m = np.asarray(support, float)
    A = H + alpha * np.eye(H.shape[-1]) if alpha else H
    return least_squares(masked_gram(A, m), b * m) * m


def unit_scales(theta: np.ndarray, h: np.ndarray, b: np.ndarray, yy: np.ndarray,
                enters: np.ndarray, support: np.ndarray, centre=None) -> np.ndarray:
    """Factors ``w`` (..., p) that make ``w * theta`` the coefficients of features and targets
    scaled to unit size (docs/ALGORITHMS.md, "Scale-free term selection").

    ``w_k = sqrt(h_k / r_k)``: ``h_k`` the summed square of coefficient k's regressor (the
    diagonal of the Gram matrix), ``r_k`` the smallest, over the kept coefficients ``k'`` that
    share a target with k, of ``||y - theta_k' x_k'||^2`` on the targets of ``k'`` (what the
    target does besides its largest term: for ``x+ = x + dt f`` the increment ``dt f``, so the
    scale does not depend on the sample time). ``r`` is at least ``1e-12`` of the targets' sum
    of squares (round-off of the expanded square); a target with sum of squares 0 keeps the
    raw coefficient (``w = 1``).

    With ``centre`` (the sums of a constant regressor in the coefficient's target, from
    :func:`intercept_sums`), both are taken about their means for every coefficient but the
    constant, as in a regression with an intercept: ``h_k - s_k^2 / n`` and ``r`` less
    ``(s_y - theta_k' s_k')^2 / n``, so that data far from 0 (a state about 300) weigh a
    term by how much it moves, not by where it sits. The constant keeps ``h = n`` and the
    ``r`` with the mean: it competes with the target's level.

    Parameters
    ----------
    theta : numpy.ndarray, shape (..., p)
        The current coefficients.
    h : numpy.ndarray, shape (..., p)
        The Gram diagonal, summed over the clients.
    b : numpy.ndarray, shape (..., p)
        ``X'y``, summed over the clients.
    yy : numpy.ndarray, shape (..., n_y)
        Each target's summed squares.
    enters : numpy.ndarray of bool, shape (n_y, p)
        Which targets each coefficient enters.
    support : numpy.ndarray of bool, shape (..., p)
        The kept coefficients.
    centre : tuple of numpy.ndarray, or None, default=None
        ``(s, s_y, n, own)``, each (..., p) but ``own`` (p,): for each coefficient the sum of
        its regressor, of its target and the sample count, from the constant regressor of
        its target; ``own`` marks the constant coefficients and the coefficients without
        one (``n`` 0 there: not centred). None: nothing is centred.

    Returns
    -------
    numpy.ndarray, shape (..., p)
        The factors ``w``.
    """
    YY = yy @ enters.astype(float)                                   # (..., p)
    rest = YY - 2 * theta * b + theta ** 2 * h
    share = (enters.T.astype(float) @ enters.astype(float)) > 0      # (p, p)
    allowed = share & np.asarray(support, bool)[..., None, :]

    def smallest(rest):
        r = np.maximum(rest, 1e-12 * YY)
        return np.where(allowed, r[..., None, :], np.inf).min(axis=-1)   # (..., p)

    rmin = smallest(rest)
    if centre is not None:
        sx, sy, n, own = centre
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(n > 0, 1.0 / n, 0.0)
        # the constant itself is weighed against the rest with its mean: an intercept
        # competes with the target's level, and a state far from 0 makes the intercept of a
        # model without one a large extrapolation of noise (e.g. -0.1 beside a rest of 6)
        rmin = np.where(own, rmin, smallest(rest - (sy - theta * sx) ** 2 * inv))
        h = np.where(own, h, h - sx ** 2 * inv)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.sqrt(h / rmin)
    w = np.where(np.isfinite(w), w, 0.0)
    return np.where(YY > 0, w, 1.0)


def intercept_sums(H: np.ndarray, b: np.ndarray, model):
    """The ``centre`` of :func:`unit_scales` from the summed statistics ``H`` (..., p, p) and
    ``b`` (..., p): for each coefficient ``k`` of a generic library with the constant feature
    ``1``, the constant coefficient ``c`` of its target gives ``s_k = H[c, k]`` (the sum of
    k's regressor), ``s_y = b[c]`` (the sum of the target) and ``n = H[c, c]``. None when the
    model has no such feature (a system's own features, a library without ``1``)."""
    found = constant_feature(model)
    if found is None:
        return None
    one = found[1]
    S = np.asarray(model.structure)                                  # (n_y, n_phi, p)
    p = S.shape[-1]
    c = np.full(p, -1)
    for j in range(S.shape[0]):
        consts = np.flatnonzero(S[j, one])
        if consts.size != 1:
            continue
        for k in np.flatnonzero(S[j].any(axis=0)):
            # a coefficient of this target alone, as in a dense library
            if np.count_nonzero(S[:, :, k].any(axis=1)) == 1:
                c[k] = consts[0]
    has = c >= 0
    if not has.any():
        return None
    ci = np.where(has, c, 0)
    k = np.arange(p)
    sx = np.where(has, H[..., ci, k], 0.0)
    sy = np.where(has, b[..., ci], 0.0)
    n = np.where(has, H[..., ci, ci], 0.0)
    return sx, sy, n, ~has | (c == k)


def stlsq(H: np.ndarray, b: np.ndarray, threshold: float, alpha: float = 0.0,
          max_iter: int = 20, support: np.ndarray | None = None, unbias: bool = True,
          weights=None):
    """Sequentially thresholded least squares from sufficient statistics.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        ``X'X`` of a least-squares problem ``||y - X theta||^2``, any leading axes (repeats,
        clients).
    b : numpy.ndarray, shape (..., p)
        Its ``X'y``.
    threshold : float
        Coefficients with ``|w theta| < threshold`` are set to 0.
    alpha : float, default=0.0
        The ridge weight (``||y - X theta||^2 + alpha ||theta||^2``).
    max_iter : int, default=20
        The most refits.
    support : numpy.ndarray of bool, shape (..., p), or None, default=None
        The terms allowed at the start; None: all.
    unbias : bool, default=True
        With ``alpha`` > 0, refit the final support without the ridge (PySINDy's
        ``unbias=True``).
    weights : callable or None, default=None
        A function ``(theta, support) -> w`` (..., p), e.g. :func:`unit_scales` of the
        summed statistics; None: ``w = 1`` (the data's units).

    Returns
    -------
    theta : numpy.ndarray, shape (..., p)
        Exactly 0 outside the support.
    support : numpy.ndarray of bool, shape (..., p)
    refits : int
        The number of refits done.

    Examples
    --------
    >>> H = np.eye(3); b = np.array([1.0, 0.05, -0.5])
    >>> theta, keep, _ = stlsq(H, b, threshold=0.1)
    >>> theta, keep
    (array([ 1. ,  0. , -0.5]), array([ True, False,  True]))
    """
    support = np.ones(b.shape, bool) if support is None else np.array(support, bool)
    theta = restricted_solution(H, b, support, alpha)
    k = max_iter
    for i in range(1, max_iter + 1):
        w = 1.0 if weights is None else weights(theta, support)
        new = support & (np.abs(theta * w) >= threshold)
        if np.array_equal(new, support):
            k = i
            break
        support = new
        theta = restricted_solution(H, b, support, alpha)
    if alpha and unbias:
        theta = restricted_solution(H, b, support)
    return theta, support, k


#: the thresholds (on the ``scale=unit`` coefficients) tried by ``sparsity.threshold=auto``:
#: 31 log-spaced values from 0.001 to 1, ten a decade (docs/ALGORITHMS.md, "Choosing the
#: threshold")
AUTO_GRID = np.logspace(-3.0, 0.0, 31)


def target_groups(enters: np.ndarray) -> np.ndarray:
    """The targets scored together (G, n_y) bool: each target alone when every coefficient
    enters one target (the feature libraries' dense models: the pooled Gram matrix has no
    block between two targets, so each target's residual sum of squares comes from ``H``,
    ``b`` and its ``yy``), else all targets as one group.

    Parameters
    ----------
    enters : numpy.ndarray of bool, shape (n_y, p)
        Which targets each coefficient enters.

    Returns
    -------
    numpy.ndarray of bool, shape (G, n_y)
    """
    enters = np.asarray(enters, bool)
    if (enters.sum(axis=0) <= 1).all():
        return np.eye(enters.shape[0], dtype=bool)
    return np.ones((1, enters.shape[0]), bool)


def group_rss(theta: np.ndarray, H: np.ndarray, b: np.ndarray, yy: np.ndarray,
              enters: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Residual sums of squares per group of targets (:func:`target_groups`):
    ``yy_g - 2 theta_g' b + theta_g' H theta_g`` with ``theta_g`` the coefficients of the
    group's targets.

    Parameters
    ----------
    theta : numpy.ndarray, shape (..., p)
        The coefficients.
    H : numpy.ndarray, shape (..., p, p)
        The Gram matrix, summed over the clients.
    b : numpy.ndarray, shape (..., p)
        ``X'y``, summed over the clients.
    yy : numpy.ndarray, shape (..., n_y)
        Each target's summed squares.
    enters : numpy.ndarray of bool, shape (n_y, p)
        Which targets each coefficient enters.
    groups : numpy.ndarray of bool, shape (G, n_y)
        The groups of targets.

    Returns
    -------
    numpy.ndarray, shape (..., G)
    """
    cols = (groups.astype(float) @ enters.astype(float)) > 0                  # (G, p)
    tg = theta[..., None, :] * cols                                            # (..., G, p)
    quad = np.einsum("...gp,...pq,...gq->...g", tg, H, tg)
    return yy @ groups.T.astype(float) - 2 * np.einsum("...gp,...p->...g", tg, b) + quad


def heldout_rss(theta: np.ndarray, model, gram: np.ndarray, cross: np.ndarray,
                yy: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Held-out residual sums of squares from the held-out statistics summed over the
    clients: per target ``yy_j - 2 Th_j' cross_j + Th_j' gram Th_j`` with
    ``Th = model.theta_matrix(theta)``, added up per group of targets.

    Parameters
    ----------
    theta : numpy.ndarray, shape (..., p)
        The coefficients.
    model : fnsysid.dynamics.model.Model
        The model (:meth:`~fnsysid.dynamics.model.Model.theta_matrix`).
    gram : numpy.ndarray, shape (..., n_phi, n_phi)
        The held-out features' Gram matrix.
    cross : numpy.ndarray, shape (..., n_y, n_phi)
        The held-out targets' products with the features.
    yy : numpy.ndarray, shape (..., n_y)
        Each held-out target's sum of squares.
    groups : numpy.ndarray of bool, shape (G, n_y)
        The groups of targets (:func:`target_groups`).

    Returns
    -------
    numpy.ndarray, shape (..., G)
    """
    Th = model.theta_matrix(theta)                                             # (..., n_y, n_phi)
    per = yy - 2 * np.einsum("...jk,...jk->...j", Th, cross) + \
        np.einsum("...jk,...kl,...jl->...j", Th, gram, Th)
    return per @ groups.T.astype(float)


def path_scores(rss: np.ndarray, count: np.ndarray, yy: np.ndarray, terms: np.ndarray,
                penalty: float = 0.0) -> np.ndarray:
    """The score of each candidate: ``sum_g n_g log(rss_g / n_g) + penalty k``, the Gaussian
    -2 log-likelihood with each group's noise variance at its maximum (up to a constant),
    plus ``penalty`` per kept term ``k``. ``rss`` is floored at ``1e-12 yy`` (the round-off
    of the expanded square, as in :func:`unit_scales`: a target fitted exactly, such as
    ``x+ = x + dt v`` without noise, then adds the same to every candidate that fits it
    instead of its round-off) and a group with ``yy = 0`` adds nothing.

    Parameters
    ----------
    rss : numpy.ndarray, shape (..., L, G)
        Each candidate's residual sum of squares per group of targets.
    count : numpy.ndarray, shape (..., G)
        The number of residuals in each group (``n_g``).
    yy : numpy.ndarray, shape (..., G)
        The group's sum of squares.
    terms : numpy.ndarray of int, shape (..., L)
        Each candidate's kept terms.
    penalty : float, default=0.0
        Per kept term: ``log n`` for BIC, 0 on held-out data.

    Returns
    -------
    numpy.ndarray, shape (..., L)
    """
    count = np.asarray(count, float)[..., None, :]
    yy = np.asarray(yy, float)[..., None, :]
    floor = np.maximum(rss, 1e-12 * yy)
    with np.errstate(divide="ignore", invalid="ignore"):
        ll = np.where((yy > 0) & (count > 0), count * np.log(floor / count), 0.0)
    return ll.sum(axis=-1) + penalty * terms


def choose_on_path(scores: np.ndarray, terms: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Index of the chosen candidate: among those whose score is within ``margin`` of the
    smallest, the one with the fewest terms, then the smallest score, then the larger
    threshold (``margin=0``: the smallest score, fewer terms on a tie).

    Parameters
    ----------
    scores : numpy.ndarray, shape (..., L)
        The candidates' scores (:func:`path_scores`).
    terms : numpy.ndarray of int, shape (..., L)
        Their kept terms.
    margin : float, default=0.0
        Scores within this of the smallest count as equal (>= 0).

    Returns
    -------
    numpy.ndarray of int, shape (...)
    """
    L = scores.shape[-1]
    best = np.empty(scores.shape[:-1], int)
    for idx in np.ndindex(*scores.shape[:-1]):
        s, k = scores[idx], terms[idx]
        if np.isnan(s).all():
            near = np.ones(L, bool)
        else:                                   # a NaN score is never near the best
            near = s <= np.nanmin(s) + margin
        order = np.lexsort((-np.arange(L), s, k, ~near))   # near, terms, score, threshold
        best[idx] = order[0]
    return best


def pooled_heldout(ho) -> tuple[np.ndarray, ...]:
    """The held-out statistics summed over the clients; a client without held-out data adds
    zeros.

    Parameters
    ----------
    ho : fnsysid.data.heldout.HeldOut
        The clients' held-out statistics, (S, M, ...).

    Returns
    -------
    gram : numpy.ndarray, shape (S, n_phi, n_phi)
    cross : numpy.ndarray, shape (S, n_y, n_phi)
    yy : numpy.ndarray, shape (S, n_y)
    n : numpy.ndarray, shape (S,)
    """
    return (ho.gram.sum(axis=1), ho.cross.sum(axis=1), ho.yy.sum(axis=1), ho.n.sum(axis=1))


def restrict_data(data: ClientData, support: np.ndarray, alpha: float = 0.0) -> ClientData:
    """The clients' statistics restricted to a support (module docstring); the samples (SGD)
    are left as they are: the solver masks its steps (``support`` attribute).

    Parameters
    ----------
    data : fnsysid.dynamics.model.ClientData
        The clients' data, (S, M, ...).
    support : numpy.ndarray of bool, shape (S, p)
        The kept terms of each repeat.
    alpha : float, default=0.0
        The ridge weight, shared among the clients in proportion to their samples (added to
        their Gram matrices).

    Returns
    -------
    fnsysid.dynamics.model.ClientData
    """
    m = np.asarray(support, float)[:, None, :]                       # (S, 1, p)
    H = data.H
    if alpha:
        n = np.asarray(data.n, float)
        share = alpha * n / n.sum(axis=-1, keepdims=True)            # (S, M)
        H = H + share[..., None, None] * np.eye(H.shape[-1])
    return dataclasses.replace(data, H=masked_gram(H, m), b=data.b * m)


class STLSQ:
    """The settings and the state of ``sparsity=stlsq`` for one run.

    Parameters
    ----------
    threshold : float or "auto", default=0.05
        A float > 0, compared with the scaled coefficients (``scale``), or ``"auto"``: chosen
        along :data:`AUTO_GRID` by held-out error, or by BIC without held-out data
        (:meth:`choose_auto`).
    scale : {"unit", "data"}, default="unit"
        ``unit``: coefficients of features and targets scaled to unit size
        (:func:`unit_scales`); ``data``: the coefficients' own units.
    alpha : float, default=0.0
        The ridge weight, >= 0 (0: plain least squares, PySINDy's ``alpha=0``).
    unbias : bool, default=True
        With ``alpha`` > 0, the strategy fits the kept terms without the ridge (PySINDy's
        ``unbias=True``); else with the ridge.
    max_iter : int, default=20
        The most refits of the STLSQ loop.
    margin : float, default=2.0
        ``threshold=auto``: the candidate with the fewest terms among those whose score
        (-2 log-likelihood) is within ``margin`` of the smallest (:func:`choose_on_path`).
    """

    name = "stlsq"

    def __init__(self, threshold: float | str = 0.05, scale: str = "unit", alpha: float = 0.0,
                 unbias: bool = True, max_iter: int = 20, margin: float = 2.0):
        self.auto = threshold == "auto"
        self.threshold = threshold if self.auto else float(threshold)
        self.alpha, self.max_iter = float(alpha), int(max_iter)
        self.margin = float(margin)
        self.scale, self.unbias = str(scale), bool(unbias)
        self.support: np.ndarray | None = None
        self.refits = 0                      # least-squares fits of the STLSQ loop
        self.chosen = None                   # threshold=auto: the chosen threshold (S,)
        self.rule = None                     # threshold=auto: "heldout" or "bic"
        self.path = None                     # threshold=auto: rows of the threshold path
        self._scale = None                   # the scale function of the choice (scale=unit)
        self._centre = None                  # scale=unit: intercept_sums of the choice

    # --- in process ---------------------------------------------------------------------------
    def start(self, strategy, theta0, data: ClientData, model, optimizer, K, lr, seed,
              heldout=None) -> None:
        """Instead of ``strategy.setup``: the support is chosen from the clients' summed
        statistics (:meth:`choose`, before round 0, for every strategy) and the strategy is
        set up on the data restricted to it from the pruned start model ``theta0`` (a
        closed-form strategy computes its own solution on the kept terms). The settings were
        checked before (:func:`fnsysid.config.checks.check_sparsity`: not ``strategy=local``,
        not ``scale_features=zscore`` with local steps)."""
        self._ctx = (data, model, optimizer, K, lr, seed)
        self.choose(data.H.sum(axis=1), data.b.sum(axis=1), data.yy_target.sum(axis=1), model,
                    data.n.sum(axis=1), None if heldout is None else pooled_heldout(heldout))
        self._setup(strategy, np.asarray(theta0) * self.support)

    def choose(self, H: np.ndarray, b: np.ndarray, yy: np.ndarray, model, n=None,
               heldout=None) -> None:
        """The support (S, p): STLSQ (:func:`stlsq`, ridge ``alpha``) on the clients' summed
        statistics ``H`` (S, p, p) and ``b`` (S, p), i.e. on the pooled least-squares
        solution, whatever the strategy that then fits the kept terms (docs/ALGORITHMS.md,
        "Sparse models"); with ``scale=unit`` the coefficients compared are scaled by
        :func:`unit_scales` of the same sums and the targets' summed squares ``yy`` (S, n_y).
        With ``threshold=auto`` the threshold is chosen (:meth:`choose_auto`) from these sums,
        the pooled sample count ``n`` (S,) and the held-out statistics summed over the
        clients ``heldout`` (:func:`pooled_heldout`, or None)."""
        weights = self._weights(H, b, yy, model)
        self._scale = weights                        # for :meth:`faded`
        if self.auto:
            self.choose_auto(H, b, yy, model, n, heldout, weights)
            return
        _, self.support, self.refits = stlsq(H, b, self.threshold, self.alpha, self.max_iter,
                                             weights=weights)

    def _weights(self, H, b, yy, model):
        """The scale function of :func:`stlsq` (None with ``scale=data``)."""
        weights = None
        if self.scale == "unit":
            h = np.diagonal(H, axis1=-2, axis2=-1)
            enters = np.abs(model.structure).sum(axis=1) > 0                 # (n_y, p)
            centre = self._centre = intercept_sums(H, b, model)

            def weights(theta, support):
                return unit_scales(theta, h, b, yy, enters, support, centre)
        return weights

    def choose_auto(self, H, b, yy, model, n, heldout, weights) -> None:
        """``threshold=auto`` (docs/ALGORITHMS.md, "Choosing the threshold"): STLSQ on the
        pooled statistics at each threshold of :data:`AUTO_GRID` gives a candidate support and
        its pooled fit; each candidate is scored per repeat by :func:`path_scores` of its
        residual sums of squares per target: on the held-out data summed over the clients
        (``heldout``: gram, cross, yy, n) without a penalty (rule ``heldout``), or, when some
        repeat has no held-out transition, on the training data with BIC's ``log n`` per
        kept term (rule ``bic``). Among the candidates whose score is within ``margin`` of
        the smallest, the one with the fewest terms is kept (:func:`choose_on_path`); the
        reported threshold is the middle of the grid's thresholds that give its
        support. ``self.path`` holds (repeat, threshold, n_terms, score, chosen)."""
        enters = np.abs(model.structure).sum(axis=1) > 0                     # (n_y, p)
        groups = target_groups(enters)
        thetas, supports, refits = self._path(H, b, yy, enters, groups, weights)
        terms = supports.sum(axis=-1)                                           # (S, L)
        sizes = groups.sum(axis=1)                                              # (G,)
        use_heldout = heldout is not None and bool((np.asarray(heldout[3]) > 0).all())
        if use_heldout:
            gram, cross, hyy, hn = heldout
            rss = heldout_rss(thetas, model, gram[:, None], cross[:, None], hyy[:, None],
                              groups)
            count = np.asarray(hn, float)[:, None] * sizes
            scores = path_scores(rss, count, hyy @ groups.T.astype(float), terms)
            self.rule = "heldout"
        else:
            n = np.asarray(n, float)
            rss = group_rss(thetas, H[:, None], b[:, None], yy[:, None], enters, groups)
            count = n[:, None] * sizes
            scores = path_scores(rss, count, yy @ groups.T.astype(float), terms,
                                 penalty=np.log(n)[:, None])
            self.rule = "bic"
        best = choose_on_path(scores, terms, self.margin)
        S = thetas.shape[0]
        self.support = supports[np.arange(S), best]
        same = (supports == self.support[:, None, :]).all(axis=-1)              # (S, L)
        mid = [np.flatnonzero(same[s])[(same[s].sum() - 1) // 2] for s in range(S)]
        self.chosen = AUTO_GRID[mid]
        self.refits = int(refits[mid].max())
        self.path = {"repeat": np.repeat(np.arange(S), len(AUTO_GRID)),
                     "threshold": np.tile(AUTO_GRID, S), "n_terms": terms.reshape(-1),
                     "score": scores.reshape(-1),
                     "chosen": (np.arange(len(AUTO_GRID))[None, :] ==
                                np.asarray(mid)[:, None]).reshape(-1)}

    def after_round(self, strategy, r: int) -> bool:
        """Set the pruned coefficients to exactly 0 (the restricted solves leave round-off
        there); the support does not change during the rounds (False)."""
        strategy.server = strategy.server * self.support
        return False

    def _setup(self, strategy, theta0) -> None:
        data, model, optimizer, K, lr, seed = self._ctx
        optimizer.support = self.support[:, None, :]
        alpha = 0.0 if self.unbias else self.alpha          # unbias: the kept terms unridged
        strategy.setup(np.array(theta0), restrict_data(data, self.support, alpha), model,
                       optimizer, K, lr, seed)
        strategy.server = strategy.server * self.support

    # --- on a federated runtime: the server alone, the clients apply the support ----------
    def _path(self, H, b, yy, enters, groups, weights):
        """STLSQ at every threshold of :data:`AUTO_GRID`: coefficients (S, L, p), supports
        (S, L, p), refits (L,). When each target is scored alone its coefficients are a block
        of their own (``H`` has no entry between two targets' coefficients and the unit
        scales compare coefficients of one target), so each target's path is run on its own
        block: the same supports as on the whole, at a fraction of the cost."""
        S, p, L = b.shape[0], b.shape[-1], len(AUTO_GRID)
        if groups.shape[0] == 1:
            fits = [stlsq(H, b, t, self.alpha, self.max_iter, weights=weights)
                    for t in AUTO_GRID]
            return (np.stack([f[0] for f in fits], axis=-2),
                    np.stack([f[1] for f in fits], axis=-2), np.array([f[2] for f in fits]))
        thetas, supports = np.zeros((S, L, p)), np.zeros((S, L, p), bool)
        refits = np.zeros(L, int)
        h = np.diagonal(H, axis1=-2, axis2=-1)
        for j in range(enters.shape[0]):
            idx = np.flatnonzero(enters[j])
            if not idx.size:
                continue
            Hj, bj = H[:, idx[:, None], idx], b[:, idx]
            yj, ej = yy[:, j:j + 1], enters[j:j + 1, idx]
            wj = None
            if weights is not None:
                cj = None if self._centre is None else (
                    *(a[:, idx] for a in self._centre[:3]), self._centre[3][idx])

                def wj(theta, support, hj=h[:, idx], bj=bj, yj=yj, ej=ej, cj=cj):
                    return unit_scales(theta, hj, bj, yj, ej, support, cj)
            for i, t in enumerate(AUTO_GRID):
                theta, support, k = stlsq(Hj, bj, t, self.alpha, self.max_iter, weights=wj)
                thetas[:, i, idx], supports[:, i, idx] = theta, support
                refits[i] = max(refits[i], k)
        return thetas, supports, refits

    def start_server(self, strategy, H: np.ndarray, b: np.ndarray, yy: np.ndarray, model, n,
                     seed: int, heldout=None) -> None:
        """Flower's server after ``strategy.setup_server``: the support from the sums of the
        statistics the clients sent (``H`` (S, p, p), ``b`` (S, p), ``yy`` (S, n_y),
        :meth:`choose`); the
        server starts from its pruned model, and the clients restrict their problems when
        they see the support in the first message (:func:`restrict_client`). ``n`` (S, M)
        the clients' sample counts; ``heldout`` the held-out statistics summed over the
        clients (``threshold=auto``, :func:`pooled_heldout`) or None."""
        self.choose(H, b, yy, model, np.asarray(n).sum(axis=1), heldout)
        strategy.setup_server(strategy.server * self.support, n, seed)

    def server_round(self, strategy, r: int) -> bool:
        """After round ``r`` on the server: the pruned coefficients set to exactly 0 (False:
        the support does not change)."""
        strategy.server = strategy.server * self.support
        return False

    def message(self, msg: dict) -> dict:
        """A server message with the support (S, p) as 0/1, for the clients."""
        return {**msg, "support": self.support.astype(float)}

    # --- results -----------------------------------------------------------------------------
    def summary(self, model) -> dict:
        """What ``summary.json`` says under ``sparsity``: the settings, the number of kept
        terms per state and in all (each a number when the repeats agree, else a list with
        each repeat's), the states left without any term (``empty``: ``{state: [repeats]}``,
        only when there are some), the least-squares fits of the STLSQ loop (``refits``)."""
        sizes = support_sizes(model, self.support)
        terms = [int(v) for v in self.support.sum(axis=-1)]
        threshold = self.threshold if not self.auto else _one([float(t) for t in self.chosen])
        out = {"method": self.name, "threshold": threshold, "scale": self.scale,
               "alpha": self.alpha, "unbias": self.unbias,
               "support_size": {k: _one(v) for k, v in sizes.items()},
               "terms": _one(terms), "of": int(self.support.shape[-1])}
        empty = {k: [s for s, c in enumerate(v) if c == 0] for k, v in sizes.items()
                 if 0 in v}
        if empty:
            out["empty"] = empty
        out["refits"] = self.refits
        kept = self.support.mean(axis=0)                                   # (p,) share kept
        out["repeats_agree"] = bool(((kept == 0) | (kept == 1)).all())
        if not out["repeats_agree"]:
            out["terms_disputed"] = int(((kept > 0) & (kept < 1)).sum())
        if self.auto:
            out["auto"] = True
            out["rule"] = self.rule
            out["margin"] = self.margin
            out["path"] = [{"repeat": int(r), "threshold": float(t), "n_terms": int(k),
                            "score": float(v)}
                           for r, t, k, v in zip(self.path["repeat"], self.path["threshold"],
                                                 self.path["n_terms"], self.path["score"],
                                                 strict=True)]
        return out

    def faded(self, theta: np.ndarray) -> np.ndarray:
        """Kept terms whose coefficient in the final model ``theta`` (S, p) is below the
        threshold they were kept at (each repeat's, scaled as the choice scaled them): the
        support was chosen on the pooled least squares, which a federated strategy's model
        need not equal (clients that differ, too few samples for a client's own fit, rounds
        stopped early), so the term can be in the model in name only
        (docs/guide/sparsity.md). Returns (S, p) bool."""
        theta = np.asarray(theta, float)
        t = np.asarray(self.chosen if self.auto else self.threshold, float)
        t = t[:, None] if t.ndim else t
        with np.errstate(invalid="ignore"):
            return self.support & np.isfinite(theta) & (np.abs(self.scaled(theta)) < t)

    def scaled(self, theta: np.ndarray) -> np.ndarray:
        """The coefficients ``theta`` (S, p) on the scale the threshold applies to
        (``sparsity.scale=unit``: of features and targets scaled to unit size; else as
        they are)."""
        theta = np.asarray(theta, float)
        return theta * (1.0 if self._scale is None else self._scale(theta, self.support))

    def path_table(self) -> dict | None:
        """The threshold path of ``threshold=auto`` as columns (``sparsity_path.csv``):
        repeat, threshold, n_terms, score, chosen (the candidate kept); None otherwise."""
        return None if self.path is None else {**self.path, "rule": [self.rule] *
                                               len(self.path["repeat"])}


def _one(values: list[int]) -> int | list[int]:
    """One number when every repeat has it, else the list of each repeat's."""
    return values[0] if len(set(values)) == 1 else values


def empty_warning(summary: dict, repeats: int) -> str | None:
    """The log line when the support left a state without any term (its model predicts 0
    for it; not a wrong number but rarely what is meant).

    Parameters
    ----------
    summary : dict
        :meth:`STLSQ.summary`.
    repeats : int
        The number of repeats S.

    Returns
    -------
    str or None
        None when every state keeps a term.
    """
    empty = summary.get("empty")
    if not empty:
        return None
    where = []
    for name, reps in empty.items():
        when = "" if repeats == 1 else " in every repeat" if len(reps) == repeats else \
            f" in repeat{'s' if len(reps) > 1 else ''} {', '.join(map(str, reps[:10]))}" \
            f"{', ...' if len(reps) > 10 else ''}"
        where.append(f"{name}{when}")
    t = summary["threshold"]
    shown = f"{t:g}" if not isinstance(t, list) else "/".join(f"{v:g}" for v in t)
    if summary.get("auto"):
        shown = f"auto (chosen {shown})"
    return (f"sparsity: sparsity.threshold={shown} pruned every term of "
            f"{'; '.join(where)}: the model has no term for "
            f"{'this state' if len(empty) == 1 else 'these states'} (its part of the "
            "regression is 0); a smaller sparsity.threshold keeps terms")


def disagreement_warning(summary: dict) -> str | None:
    """The log line when the repeats keep different terms (:meth:`STLSQ.summary`'s
    ``repeats_agree``): each repeat's data chose its own support, so which terms are in the
    model is not determined by data of this size (the coefficients printed for one repeat
    are not the system's structure); None when every repeat keeps the same terms."""
    if summary.get("repeats_agree", True):
        return None
    terms = summary["terms"]
    low, high = (min(terms), max(terms)) if isinstance(terms, list) else (terms, terms)
    count = f"{low} to {high}" if low != high else f"{low}"
    return (f"sparsity: the repeats keep different terms ({count} of {summary['of']} in a "
            f"repeat; {summary['terms_disputed']} terms kept in some repeats and not in "
            "others): the data of one repeat do not determine which terms the model has "
            "(more clients or samples, or a fixed sparsity.threshold checked on "
            "sparsity_path.csv / each repeat's equations)")


def faded_summary(faded: np.ndarray, theta: np.ndarray, model,
                  scaled: np.ndarray | None = None) -> list[dict]:
    """``summary.json: sparsity.below_threshold``: each parameter that :meth:`STLSQ.faded`
    marks in some repeat, with those repeats, its coefficient in the first of them and
    (``scaled``: :meth:`STLSQ.scaled` of ``theta``) that coefficient on the threshold's
    scale."""
    theta = np.asarray(theta, float)
    out = []
    for k in np.flatnonzero(faded.any(axis=0)):
        first = np.flatnonzero(faded[:, k])[0]
        entry = {"parameter": model.param_names[k],
                 "repeats": [int(r) for r in np.flatnonzero(faded[:, k])],
                 "estimate": float(theta[first, k])}
        if scaled is not None:
            entry["scaled"] = float(np.asarray(scaled)[first, k])
        out.append(entry)
    return out


def faded_warning(summary: dict, strategy: str) -> str | None:
    """The log line when kept terms are below the threshold in the final model
    (``summary``: :meth:`STLSQ.summary` with ``below_threshold``); None when there are
    none."""
    faded = summary.get("below_threshold")
    if not faded:
        return None
    t = summary["threshold"]
    shown = f"{t:g}" if not isinstance(t, list) else "/".join(f"{v:g}" for v in t)
    rescaled = any(f.get("scaled", f["estimate"]) != f["estimate"] for f in faded)
    terms = ", ".join(f"{f['parameter']} {f['estimate']:.4g}"
                      + (f" (scaled {f['scaled']:.3g})" if rescaled else "") for f in faded[:4])
    more = f" and {len(faded) - 4} more" if len(faded) > 4 else ""
    scale = (", which applies to coefficients of features and targets scaled to unit size,"
             if rescaled else "")
    return (f"sparsity: {len(faded)} kept term{'s are' if len(faded) > 1 else ' is'} below "
            f"sparsity.threshold={shown}{scale} in the final model ({terms}{more}): the "
            f"terms were chosen on the clients' pooled least squares, which "
            f"strategy={strategy}'s model does not equal here (clients that differ, too few "
            "samples for a client's own fit, or rounds that stopped early), so "
            f"{'these are' if len(faded) > 1 else 'it is'} in the model in name only "
            "(strategy=centralized_exact fits the pooled model they were chosen on; "
            "docs/guide/sparsity.md, heterogeneous clients)")


def auto_choice(summary: dict) -> str | None:
    """What ``threshold=auto`` chose and by which rule, in words (``fnsysid show`` and
    :func:`auto_line`); None for a fixed threshold.

    Parameters
    ----------
    summary : dict
        :meth:`STLSQ.summary`.

    Returns
    -------
    str or None
    """
    if not summary.get("auto"):
        return None
    t = summary["threshold"]
    shown = f"{t:g}" if not isinstance(t, list) else ", ".join(f"{v:g}" for v in t)
    margin = summary.get("margin") or 0.0
    fewest = (f", the fewest terms within sparsity.margin={margin:g} of the best score"
              if margin else ", the best score (sparsity.margin=0)")
    rule = ("the held-out error of the pooled fits" if summary["rule"] == "heldout"
            else "BIC on the training data")
    return (f"sparsity: sparsity.threshold=auto chose {shown} ({summary['terms']} terms) by "
            f"{rule}{fewest}")


def auto_line(summary: dict) -> tuple[str, bool] | None:
    """The log line of ``threshold=auto``.

    Parameters
    ----------
    summary : dict
        :meth:`STLSQ.summary`.

    Returns
    -------
    tuple of (str, bool) or None
        The line and whether it is a warning (the held-out data were missing and BIC chose);
        None for a fixed threshold.
    """
    said = auto_choice(summary)
    if said is None:
        return None
    if summary["rule"] == "heldout":
        return f"{said} (sparsity_path.csv)", False
    return (f"{said}: no held-out data to score the candidates on (data.val_N=0, "
            "data.holdout=0 or no val rows in the files; sparsity_path.csv)"), True


def support_sizes(model, support: np.ndarray) -> dict[str, list[int]]:
    """Kept terms of each regression target (state), per repeat. A coefficient belongs to the
    targets whose row of ``Theta`` it enters.

    Parameters
    ----------
    model : fnsysid.dynamics.model.Model
        The model (its ``structure`` and targets' names).
    support : numpy.ndarray of bool, shape (S, p)
        The kept terms of each repeat.

    Returns
    -------
    dict of str to list of int
        ``{target: [S counts]}``.
    """
    enters = np.abs(model.structure).sum(axis=1) > 0                 # (n_y, p)
    names = model.system.target_names
    return {str(names[j]): [int(v) for v in (support & enters[j]).sum(axis=-1)]
            for j in range(len(names))}


def build_sparsity(node: dict | None):
    """The run's sparsity object from the ``sparsity`` group's node.

    Parameters
    ----------
    node : dict or None
        The ``sparsity`` settings (``name`` and :class:`STLSQ`'s parameters).

    Returns
    -------
    STLSQ or None
        None for ``none``.
    """
    if not node or node.get("name", "none") == "none":
        return None
    kw = {k: v for k, v in node.items() if k != "name"}
    return STLSQ(**kw)


def restrict_client(clients, data: ClientData, model, seed: int, support, current):
    """A federated node's side of the support (S, p) (0/1 from the server's message).

    Its solver is set up again on its statistics restricted to the support when it differs
    from ``current``, the support this process set the solver up on (None: all terms); its
    own state between rounds (SCAFFOLD's ``c_i``, ``clients.state``, which the runtime keeps
    per client) starts again when it was made on another support (kept in the state under
    ``support``), as in process.

    Parameters
    ----------
    clients : fnsysid.learning.strategies.Clients
        The node's clients (their ``solver`` and ``state``).
    data : fnsysid.dynamics.model.ClientData
        The node's statistics, unrestricted.
    model : fnsysid.dynamics.model.Model
        The model.
    seed : int
        The run's root seed (the solver's setup).
    support : array_like of 0/1 or bool, shape (S, p)
        The server's support.
    current : numpy.ndarray of bool, shape (S, p), or None
        The support the solver was set up on; None: all terms.

    Returns
    -------
    numpy.ndarray of bool, shape (S, p)
        The support now held.
    """
    support = np.asarray(support) > 0
    if not (np.array_equal(support, current) or (current is None and support.all())):
        solver = clients.solver
        solver.support = support[:, None, :]
        solver.setup(restrict_data(data, support), model, seed)
        clients._maps = None
    held = clients.state.get("support")
    if not np.array_equal(support, np.ones(support.shape, bool) if held is None else held > 0):
        clients.state = {}
    clients.state["support"] = support.astype(float)
    return support
