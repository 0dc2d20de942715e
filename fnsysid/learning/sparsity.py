"""Sparse identification (the ``sparsity`` config group): which terms of the library to keep.

``sparsity=stlsq`` is sequentially thresholded least squares (Brunton, Proctor, Kutz 2016), as
PySINDy's ``STLSQ(threshold, alpha)``: fit, set every coefficient whose magnitude is below
``threshold`` to zero, refit on the terms that are left, and repeat until the set of terms (the
*support*) stops changing. With ``scale=unit`` (the default) the magnitude compared is the
coefficient of features and targets scaled to unit size (:func:`unit_scales`, from the
clients' summed statistics); with ``scale=data`` it is the raw coefficient (PySINDy on
unnormalized columns). With ``alpha`` > 0 and ``unbias`` the kept terms are refitted without
the ridge once the support is stable (PySINDy's ``unbias=True``). The support is kept
per repeat and per coefficient, (S, p); for the dense models of a feature library each state's
row of ``Theta`` has its own terms.

Federated, the server prunes and every client continues on the common support:

- the closed-form strategies (``centralized_exact``, ``oneshot``) run the whole STLSQ loop
  before round 0, each refit being the strategy's own solution on the restricted statistics.
  With ``centralized_exact`` (the pooled sufficient statistics) it is pooled STLSQ exactly;
  with ``oneshot`` the average of the clients' own least squares is thresholded and each
  refit is the average of their own least squares on the kept terms (the rank check of
  :class:`~fnsysid.learning.strategies.OneShot` counts the kept terms);
- the iterative ones (``fedavg``, ``fedprox``, ``fedlin``, ``scaffold``, ``fednova``,
  ``centralized``, ``cyclic``) prune the server model every ``every`` rounds; when the support
  changes the strategy is set up again on the restricted problem from the pruned server model
  (the clients' local maps, SCAFFOLD's control variates), so pruned coefficients stay exactly
  0 and the kept ones go on converging. A pruning round that removes nothing leaves the run
  unchanged, so pruning stops by itself once the support is stable.

Restricting a client's problem to the support: ``H -> D (H + a_i I) D`` and ``b -> D b`` with
``D`` the 0/1 diagonal of the support and ``a_i`` the client's share of the ridge ``alpha``
(its share of the samples, so the shares add up to ``alpha`` over the pooled data). The
gradient ``H theta - b`` is then zero outside the support and the exact solutions
(``pinv``) are zero there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fnsysid.dynamics.model import ClientData, least_squares, masked_gram

#: strategies whose estimate is computed once, before round 0 (STLSQ runs to the end there)
CLOSED_FORM = ("OneShot",)


def restricted_solution(H: np.ndarray, b: np.ndarray, support: np.ndarray,
                        alpha: float = 0.0) -> np.ndarray:
    """Least-squares (ridge ``alpha``) solution on the coefficients in ``support``, exactly 0
    elsewhere: ``(D (H + alpha I) D)^+ D b``, batched over the leading axes."""
    m = np.asarray(support, float)
    A = H + alpha * np.eye(H.shape[-1]) if alpha else H
    return least_squares(masked_gram(A, m), b * m) * m


def unit_scales(theta: np.ndarray, h: np.ndarray, b: np.ndarray, yy: np.ndarray,
                enters: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Factors ``w`` (..., p) that make ``w * theta`` the coefficients of features and targets
    scaled to unit size (docs/ALGORITHMS.md, "Scale-free term selection").

    ``w_k = sqrt(h_k / r_k)``: ``h_k`` the summed square of coefficient k's regressor (the
    diagonal of the Gram matrix), ``r_k`` the smallest, over the kept coefficients ``k'`` that
    share a target with k, of ``||y - theta_k' x_k'||^2`` on the targets of ``k'`` (what the
    target does besides its largest term: for ``x+ = x + dt f`` the increment ``dt f``, so the
    scale does not depend on the sample time). ``r`` is at least ``1e-12`` of the targets' sum
    of squares (round-off of the expanded square); a target with sum of squares 0 keeps the
    raw coefficient (``w = 1``).

    Parameters
    ----------
    theta : (..., p) current coefficients; h, b : (..., p) the Gram diagonal and ``X'y``
        summed over the clients; yy : (..., n_y) each target's summed squares;
    enters : (n_y, p) bool, which targets each coefficient enters; support : (..., p) bool.
    """
    YY = yy @ enters.astype(float)                                   # (..., p)
    r = np.maximum(YY - 2 * theta * b + theta ** 2 * h, 1e-12 * YY)
    share = (enters.T.astype(float) @ enters.astype(float)) > 0      # (p, p)
    allowed = share & np.asarray(support, bool)[..., None, :]
    rmin = np.where(allowed, r[..., None, :], np.inf).min(axis=-1)   # (..., p)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.sqrt(h / rmin)
    w = np.where(np.isfinite(w), w, 0.0)
    return np.where(YY > 0, w, 1.0)


def stlsq(H: np.ndarray, b: np.ndarray, threshold: float, alpha: float = 0.0,
          max_iter: int = 20, support: np.ndarray | None = None, unbias: bool = True):
    """Sequentially thresholded least squares from sufficient statistics.

    Parameters
    ----------
    H, b : (..., p, p), (..., p) statistics (``X'X`` and ``X'y`` for a least-squares
        problem ``||y - X theta||^2``), any leading axes (repeats, clients).
    threshold : coefficients with ``|theta| < threshold`` are set to 0 (data units).
    alpha : ridge weight (``||y - X theta||^2 + alpha ||theta||^2``).
    max_iter : most refits.
    support : (..., p) terms allowed at the start (default all).
    unbias : with ``alpha`` > 0, refit the final support without the ridge (PySINDy's
        ``unbias=True``).

    Returns
    -------
    theta (..., p) (exactly 0 outside the support), support (..., p) bool, and the number of
    refits done.

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
        new = support & (np.abs(theta) >= threshold)
        if np.array_equal(new, support):
            k = i
            break
        support = new
        theta = restricted_solution(H, b, support, alpha)
    if alpha and unbias:
        theta = restricted_solution(H, b, support)
    return theta, support, k


def restrict_data(data: ClientData, support: np.ndarray, alpha: float = 0.0) -> ClientData:
    """The clients' statistics restricted to ``support`` (S, p) (module docstring); the
    samples (SGD) are left as they are: the solver masks its steps (``support`` attribute)."""
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
    threshold : float > 0, compared with the scaled coefficients (``scale``).
    scale : ``unit`` (coefficients of features and targets scaled to unit size,
        :func:`unit_scales`) or ``data`` (the coefficients' own units).
    alpha : ridge weight >= 0 (0: plain least squares, PySINDy's ``alpha=0``).
    unbias : with ``alpha`` > 0, the closed-form strategies refit the final support without
        the ridge (PySINDy's ``unbias=True``).
    every : the iterative strategies prune every this many rounds.
    max_iter : most refits of the closed-form loop.
    """

    name = "stlsq"

    def __init__(self, threshold: float = 0.01, scale: str = "unit", alpha: float = 0.0,
                 unbias: bool = True, every: int = 10, max_iter: int = 20):
        self.threshold, self.alpha = float(threshold), float(alpha)
        self.scale, self.unbias = str(scale), bool(unbias)
        self.every, self.max_iter = int(every), int(max_iter)
        self.stats = None            # (h, b, yy, enters) for scale=unit
        self.support: np.ndarray | None = None
        self.prunes: list[int] = []          # rounds at which the support changed
        self.refits = 0

    # --- in process ---------------------------------------------------------------------------
    def start(self, strategy, data: ClientData, model, optimizer, K, lr, seed) -> None:
        """After ``strategy.setup``: a closed-form strategy runs STLSQ to the end (each refit
        its own solution on the restricted data); an iterative one starts on all terms (with
        the ridge share when ``alpha`` > 0). The settings were checked before
        (:func:`fnsysid.config.checks.check_sparsity`: not ``strategy=local``, not
        ``scale_features=zscore``, ``every`` <= R)."""
        self._ctx = (data, model, optimizer, K, lr, seed)
        S, p = strategy.server.shape
        self.support = np.ones((S, p), bool)
        self.closed = self._closed_form(strategy)
        self.set_stats(np.diagonal(data.H, axis1=-2, axis2=-1).sum(axis=1), data.b.sum(axis=1),
                       data.yy_target.sum(axis=1), model)
        if self.alpha:
            self._setup(strategy, strategy.server)
        if self.closed:
            for _ in range(self.max_iter):
                if not self._prune(strategy):
                    break
                self.refits += 1
            if self.alpha and self.unbias:
                self._setup(strategy, strategy.server, alpha=0.0)

    def set_stats(self, h: np.ndarray, b: np.ndarray, yy: np.ndarray, model) -> None:
        """The summed statistics the scaled coefficients need (``scale=unit``): the Gram
        diagonal and ``X'y`` (S, p), each target's sum of squares (S, n_y)."""
        enters = np.abs(model.structure).sum(axis=1) > 0                 # (n_y, p)
        self.stats = (h, b, yy, enters)

    def keep(self, theta: np.ndarray) -> np.ndarray:
        """The support after thresholding ``theta`` (S, p) (the scaled coefficients with
        ``scale=unit``)."""
        if self.scale == "unit":
            h, b, yy, enters = self.stats
            theta = theta * unit_scales(theta, h, b, yy, enters, self.support)
        return self.support & (np.abs(theta) >= self.threshold)

    @staticmethod
    def _closed_form(strategy) -> bool:
        return type(strategy).__name__ in CLOSED_FORM or bool(getattr(strategy, "exact", False))

    def after_round(self, strategy, r: int) -> bool:
        """Prune the server model after round ``r`` when due; whether the support changed.
        Every round the pruned coefficients are set to exactly 0 (the restricted solves leave
        round-off there)."""
        strategy.server = strategy.server * self.support
        if self.closed or r % self.every:
            return False
        changed = self._prune(strategy)
        if changed:
            self.prunes.append(r)
        return changed

    def _prune(self, strategy) -> bool:
        new = self.keep(strategy.server)
        if np.array_equal(new, self.support):
            return False
        self.support = new
        self._setup(strategy, strategy.server * new)
        return True

    def _setup(self, strategy, theta0, alpha: float | None = None) -> None:
        data, model, optimizer, K, lr, seed = self._ctx
        optimizer.support = self.support[:, None, :]
        alpha = self.alpha if alpha is None else alpha
        strategy.setup(np.array(theta0), restrict_data(data, self.support, alpha), model,
                       optimizer, K, lr, seed)
        strategy.server = strategy.server * self.support

    # --- on a federated runtime: the server alone, the clients apply the support ----------
    def start_server(self, strategy, stats: dict, model) -> None:
        """Flower's server after ``strategy.setup_server``: every term kept; ``stats`` the
        clients' ``query`` replies (S, M, ...) with their Gram diagonals ``h``, ``X'y`` ``b``
        and targets' sums of squares ``yy``, summed here as in process."""
        self.support = np.ones(strategy.server.shape, bool)
        self.closed = False
        self.set_stats(stats["h"].sum(axis=1), stats["b"].sum(axis=1), stats["yy"].sum(axis=1),
                       model)

    def server_round(self, strategy, r: int, n, seed: int) -> bool:
        """After round ``r`` on the server: prune when due; on a new support the server
        starts again from its pruned model (``setup_server``: SCAFFOLD's ``c`` too), as the
        clients do when they see the support (:func:`restrict_client`)."""
        strategy.server = strategy.server * self.support
        if r % self.every:
            return False
        new = self.keep(strategy.server)
        if np.array_equal(new, self.support):
            return False
        self.support = new
        self.prunes.append(r)
        strategy.setup_server(strategy.server * new, n, seed)
        return True

    def message(self, msg: dict) -> dict:
        """A server message with the support (S, p) as 0/1, for the clients."""
        return {**msg, "support": self.support.astype(float)}

    # --- results -----------------------------------------------------------------------------
    def summary(self, model) -> dict:
        """What ``summary.json`` says under ``sparsity``: the settings, the number of kept
        terms per state and in all (each a number when the repeats agree, else a list with
        each repeat's), the states left without any term (``empty``: ``{state: [repeats]}``,
        only when there are some), the rounds at which the support changed."""
        sizes = support_sizes(model, self.support)
        terms = [int(v) for v in self.support.sum(axis=-1)]
        out = {"method": self.name, "threshold": self.threshold, "scale": self.scale,
               "alpha": self.alpha, "unbias": self.unbias,
               "support_size": {k: _one(v) for k, v in sizes.items()},
               "terms": _one(terms), "of": int(self.support.shape[-1])}
        empty = {k: [s for s, c in enumerate(v) if c == 0] for k, v in sizes.items()
                 if 0 in v}
        if empty:
            out["empty"] = empty
        if self.closed:
            out["refits"] = self.refits
        else:
            out.update(every=self.every, pruned_at=self.prunes)
        return out


def _one(values: list[int]) -> int | list[int]:
    """One number when every repeat has it, else the list of each repeat's."""
    return values[0] if len(set(values)) == 1 else values


def empty_warning(summary: dict, repeats: int) -> str | None:
    """The log line when the support left a state without any term (its model predicts 0
    for it; not a wrong number but rarely what is meant), from :meth:`STLSQ.summary`; None
    when every state keeps a term."""
    empty = summary.get("empty")
    if not empty:
        return None
    where = []
    for name, reps in empty.items():
        when = "" if repeats == 1 else " in every repeat" if len(reps) == repeats else \
            f" in repeat{'s' if len(reps) > 1 else ''} {', '.join(map(str, reps[:10]))}" \
            f"{', ...' if len(reps) > 10 else ''}"
        where.append(f"{name}{when}")
    return (f"sparsity: sparsity.threshold={summary['threshold']:g} pruned every term of "
            f"{'; '.join(where)}: the model has no term for "
            f"{'this state' if len(empty) == 1 else 'these states'} (its part of the "
            "regression is 0); a smaller sparsity.threshold keeps terms")


def support_sizes(model, support: np.ndarray) -> dict[str, list[int]]:
    """Kept terms of each regression target (state), per repeat: ``{target: [S counts]}``.
    A coefficient belongs to the targets whose row of ``Theta`` it enters."""
    enters = np.abs(model.structure).sum(axis=1) > 0                 # (n_y, p)
    names = model.system.target_names
    return {str(names[j]): [int(v) for v in (support & enters[j]).sum(axis=-1)]
            for j in range(len(names))}


def build_sparsity(node: dict | None):
    """The run's sparsity object from the ``sparsity`` group's node (None for ``none``)."""
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
    ``support``), as in process. Returns the support now held."""
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
