"""How good an estimate is: the relative parameter error of each client (paper eq. 9)."""

from __future__ import annotations

import numpy as np

from fnsysid.dynamics.model import (
    equilibration,
    factor_starts,
    least_squares,
    masked_gram,
    residual_sums,
    target_groups,
)


class ParameterErrors:
    """``||theta_hat - theta_i*|| / ||theta_i*||`` for fixed true parameters ``theta_true``
    (S, M, p), evaluated once per round.

    The norms of the true parameters are computed once and the parameters kept one
    coordinate after another, so an evaluation is a few passes over contiguous (S, M) arrays.
    Parameters whose truth is unknown (NaN for every client and repeat: a truth file that
    gives a subset) are not scored: the norms are over the others. Without any truth the
    errors are NaN.

    Examples
    --------
    >>> err = ParameterErrors(np.array([[[3.0, 4.0], [0.0, 2.0]]]))
    >>> err(np.zeros((1, 1, 2)))
    array([[1., 1.]])
    """

    def __init__(self, theta_true: np.ndarray):
        theta_true = np.asarray(theta_true, float)
        known = np.isfinite(theta_true).reshape(-1, theta_true.shape[-1]).all(axis=0)
        #: the scored coordinates, None for all (or none known: NaN errors)
        self.keep = np.flatnonzero(known) if 0 < known.sum() < known.size else None
        if self.keep is not None:
            theta_true = theta_true[..., self.keep]
        self.coords = np.ascontiguousarray(np.moveaxis(theta_true, -1, 0))   # (p, S, M)
        self.norm = np.linalg.norm(theta_true, axis=-1)

    def __call__(self, estimate: np.ndarray) -> np.ndarray:
        """Errors (S, M) of ``estimate`` broadcastable to (S, M, p)."""
        est = _coordinate_first(np.asarray(estimate, float))                # (p, S, 1 or M)
        out = np.empty(self.norm.shape)
        for sl in _chunks(out.shape[1]):
            self._chunk(est, sl, out[:, sl])
        return out

    def _chunk(self, est: np.ndarray, sl: slice, acc: np.ndarray) -> None:
        """Errors of clients ``sl`` into ``acc`` (S, m); ``est`` (p, S, 1 or M)."""
        mine = est if est.shape[-1] == 1 else est[..., sl]
        if self.keep is not None:
            mine = mine[self.keep]
        d = mine - self.coords[..., sl]                                    # (p, S, m)
        d *= d
        np.add.reduce(d, axis=0, out=acc)          # coordinate after coordinate, in order
        np.sqrt(acc, out=acc)
        acc /= self.norm[:, sl]


#: clients evaluated at once per round: temporaries stay in the cache
CHUNK = 1 << 15
#: below this many clients a shared model is scored like per-client models (fewer calls)
SMALL = 2048


def _chunks(m: int) -> list[slice]:
    return [slice(lo, min(lo + CHUNK, m)) for lo in range(0, m, CHUNK)]


def client_errors(estimate: np.ndarray, theta_true: np.ndarray) -> np.ndarray:
    """Paper eq. 9: ``||theta_hat - theta_i*|| / ||theta_i*||`` per repeat and client, (S, M).

    ``estimate`` broadcasts against ``theta_true`` (S, M, p); the norm is the Euclidean norm of
    the parameter vector (the Frobenius norm for matrix parameters).
    """
    return ParameterErrors(theta_true)(estimate)


# --- prediction on held-out trajectories (no ground truth needed) ------------------------------

def _theta_matrix_per_client(model, theta: np.ndarray) -> np.ndarray:
    """``Theta`` (S, M or 1, n_y, n_phi) of estimates (S, M or 1, p)."""
    return model.theta_matrix(np.asarray(theta, float))


def scored(model, ho) -> np.ndarray:
    """(S, M) clients whose held-out NRMSE is defined: held-out data in which some predicted
    state varies. The others (no held-out data, or constant states such as all-zero logs,
    whose RMSE has no scale) are left out of the max and mean over clients."""
    return (ho.n > 0) & (ho.std[..., model.system.target_states] > 0).any(axis=-1)


class HeldOutScores:
    """One-step and free-run NRMSE of estimates on fixed held-out data, evaluated every round.

    Everything that does not depend on the estimate is computed once: the per-state weights
    ``1 / (k std sqrt(count))`` of the normalized RMSE (NaN for clients without held-out data
    or without a varying state). The rows of the QR factors of the held-out data (one per
    group of targets with the same features, :attr:`~fnsysid.data.heldout.HeldOut.factor`,
    (S, terms, M)) make each residual row of a model shared by all clients one small matrix
    product, a chunk of clients at a time (see :meth:`_shared_chunk`).

    The squared one-step error of target ``j = J[l]`` of a group (features ``F``, ``f`` of
    them) is ``||R[:, f + l] - R[:, :f] t||^2`` (``R`` the group's factor, ``t`` =
    ``Theta[j, F]``): a sum of squared residuals, exact to the rounding of the residuals
    themselves, so a perfect model scores ~1e-16 rather than the ~1e-8 floor of the expanded
    ``yy - 2 t.cross + t gram t``.
    """

    def __init__(self, model, ho):
        self.model, self.ho = model, ho
        S, M = ho.n.shape
        self.valid = scored(model, ho)
        self.n_y, self.n_phi = ho.cross.shape[-2:]
        self.groups = target_groups(model)
        self.w_step = self._weights(ho.std[..., model.system.target_states], ho.n)
        # row i of a group's factor from the diagonal on, R[i, i:], one after another: row
        # i of the residuals of its targets (q of them) is a (q, k - i) matrix times it
        self.spans = []                         # (group, row, first term, end)
        for g, ((F, J), a) in enumerate(zip(self.groups, factor_starts(model), strict=False)):
            k = len(F) + len(J)
            for i in range(k):
                self.spans.append((g, i, a, a + k - i))
                a += k - i
        self.stats = ho.factor                                           # (S, terms, M)
        # per block of clients: where a prediction exists, and whether everywhere
        self.masks = [b.mask[..., 1:] for b in ho.blocks]
        self.full = [bool(m.all()) for m in self.masks]
        count = np.ones(ho.n.shape)
        for b, m, full in zip(ho.blocks, self.masks, self.full, strict=True):
            count[:, b.clients] = (np.full(m.shape[:2], m[0, 0].size) if full
                                   else np.maximum(m.sum(axis=(2, 3)), 1))
        self.w_run = np.moveaxis(self._weights(ho.std, count), 0, -1)

    def _weights(self, std, count):
        """``1 / (k std_j sqrt(count))`` (n, S, M) for the k states with ``std_j > 0`` of
        ``std`` (S, M, n), else 0; NaN for clients without held-out data or without a varying
        state."""
        std = _first(std)
        use = std > 0
        k = use.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(use, 1.0 / np.where(use, std, 1.0), 0.0)
            w /= np.sqrt(count) * np.maximum(k, 1)
        w[:, ~(self.valid & (k > 0))] = np.nan
        return w

    def one_step(self, theta: np.ndarray) -> np.ndarray:
        """One-step NRMSE (S, M) of estimates ``theta`` (S, 1 or M, p)."""
        Th = self.model.theta_matrix(np.asarray(theta, float))           # (S, m, n_y, n_phi)
        if Th.shape[1] != 1:
            # each client's own model: the residuals of its factor (clients moved first)
            sse = np.moveaxis(residual_sums(self.model, np.moveaxis(self.stats, 1, -1),
                                            theta), -1, 0)               # (n_y, S, M)
        else:
            coefs = self._shared_coefs(Th)
            out = np.empty(self.valid.shape)
            for sl in _chunks(out.shape[1]):
                out[:, sl] = self._shared_chunk(coefs, sl)
            return out
        _finish(sse, self.w_step)
        return sse.sum(axis=0)

    def _shared_coefs(self, Th: np.ndarray) -> list[np.ndarray]:
        """Coefficients (S, q, k - i) of each span (row ``i`` of a group's factor) in the
        residuals of the group's ``q`` targets, ``R[i, f + l] - R[i, i:f] . t_l[i:]``, for one
        ``Theta`` per repeat, ``Th`` (S, 1, n_y, n_phi)."""
        T0 = Th[:, 0]                                                    # (S, n_y, n_phi)
        out = []
        for g, i, a, b in self.spans:
            F, J = self.groups[g]
            f, q = len(F), len(J)
            c = np.zeros((T0.shape[0], q, b - a))
            if i < f:
                c[:, :, :f - i] = -T0[:, J][:, :, F[i:]]
            for col in range(max(i, f), f + q):                 # target col - f's own value
                c[:, col - f, col - i] = 1.0
            out.append(c)
        return out

    def _shared_chunk(self, coefs: list[np.ndarray], sl: slice) -> np.ndarray:
        """One-step NRMSE (S, m) of clients ``sl`` for the coefficients of
        :meth:`_shared_coefs`: each residual row is one matrix product over the clients'
        statistics; their squares summed per target."""
        S = self.stats.shape[0]
        sse = np.zeros((S, self.n_y, sl.stop - sl.start))
        for (g, i, a, b), c in zip(self.spans, coefs, strict=True):
            F, J = self.groups[g]
            if b == a + 1:          # the last row, R[k-1, k-1]: the last target's own value
                res = self.stats[:, a, sl]
                sse[:, J[-1]] += res * res
                continue
            # row i of each target's residual, one (S, 1, k - i) x (S, k - i, m) product
            # each (far faster than one (q, k - i) product on these strided rows); the
            # targets before i - f have none
            for lt in range(max(0, i - len(F)), len(J)):
                res = np.matmul(c[:, lt:lt + 1], self.stats[:, a:b, sl])[:, 0]
                res *= res
                sse[:, J[lt]] += res
        _finish(sse, self.w_step[:, :, sl].transpose(1, 0, 2))
        return sse[:, 0] if self.n_y == 1 else sse.sum(axis=1)

    def free_run(self, theta: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """Free-run NRMSE (S, M) of estimates ``theta`` (S, 1 or M, p); ``inf`` for a rollout
        that blows up. Rolled out for a chunk of clients of one block at a time (temporaries
        in cache); ``clients`` (M,) bool: only those (NaN for the others; None: all)."""
        Th = self.model.theta_matrix(np.asarray(theta, float))             # (S, m, n_y, n_phi)
        sse = np.zeros(self.ho.std.shape)                                  # (S, M, n_x)
        if clients is not None:
            sse[:, ~np.asarray(clients, bool)] = np.nan
        with np.errstate(all="ignore"):
            for b, block in enumerate(self.ho.blocks):
                S, M, J = block.x.shape[:3]
                every = M == sse.shape[1]          # one block of every client, in order
                step = max(1, CHUNK // (4 * J))
                if clients is None:
                    parts = [slice(lo, min(lo + step, M)) for lo in range(0, M, step)]
                else:                              # positions in the block of those asked
                    pos = np.flatnonzero(np.asarray(clients, bool)[block.clients])
                    parts = [pos[lo:lo + step] for lo in range(0, len(pos), step)]
                for sl in parts:
                    at = sl if every else block.clients[sl]
                    sse[:, at] = self._rollout(Th if Th.shape[1] == 1 else Th[:, at], b, sl)
            out = (np.sqrt(sse) * self.w_run).sum(axis=-1)
        blown = np.isnan(out) & self.valid
        if clients is not None:
            blown &= np.asarray(clients, bool)
        return np.where(blown, np.inf, out)

    def _rollout(self, Th: np.ndarray, b: int, sl) -> np.ndarray:
        """Squared free-run errors of the clients ``sl`` (a slice or positions) of block ``b``
        summed over their samples, (S, m, n_x)."""
        model = self.model
        block = self.ho.blocks[b]
        x, u = block.x[:, sl], block.u[:, sl]
        mask = self.masks[b][:, sl]
        state = x[..., 0, :]
        sse = np.zeros(x.shape[:3] + x.shape[-1:])
        for t in range(x.shape[-2] - 1):
            phi = model.features(state, u[..., t, :])                      # (S, m, J, n_phi)
            if Th.shape[1] == 1:
                y = np.stack([_combine(phi, Th[:, 0, j]) for j in range(self.n_y)], axis=-1)
            else:
                y = np.einsum("smyk,smjk->smjy", Th, phi)
            state = model.system.predict(state, u[..., t, :], y)
            d = state - x[..., t + 1, :]
            if not self.full[b]:
                d = np.where(mask[:, :, :, t, None], d, 0.0)
            sse += d * d
        return sse.sum(axis=2)


def shared_summary(errors: ParameterErrors, scores: HeldOutScores | None,
                   estimate: np.ndarray):
    """Max and mean over the clients (each (S,)) of the parameter errors and, with ``scores``,
    of the one-step NRMSE of one model per repeat, ``estimate`` (S, 1, p), for many clients
    that all have held-out data.

    The same values as :class:`ParameterErrors` and :meth:`HeldOutScores.one_step` followed
    by :func:`over_clients`, computed a chunk of clients at a time without the (S, M) arrays:
    each round then reads the clients' statistics once. A NaN error gives a NaN maximum.
    Returns ``(e_max, e_mean, step_max, step_mean)``, the last two None without ``scores``.
    """
    est = _coordinate_first(np.asarray(estimate, float))                 # (p, S, 1)
    coefs = None if scores is None else scores._shared_coefs(
        scores.model.theta_matrix(np.asarray(estimate, float)))
    S, M = errors.norm.shape
    e_acc = v_acc = None                # running (max, sum) over the chunks, in their order

    def add(acc, a):
        part = (a.max(axis=1), a.sum(axis=1))
        return part if acc is None else (np.maximum(acc[0], part[0]), acc[1] + part[1])

    for sl in _chunks(M):
        e = np.empty((S, sl.stop - sl.start))
        errors._chunk(est, sl, e)
        e_acc = add(e_acc, e)
        if coefs is not None:
            v_acc = add(v_acc, scores._shared_chunk(coefs, sl))
    return (e_acc[0], e_acc[1] / M,
            *((None, None) if v_acc is None else (v_acc[0], v_acc[1] / M)))


def _coordinate_first(a: np.ndarray) -> np.ndarray:
    """The view ``np.moveaxis(a, -1, 0)`` (a round's estimates, coordinate first), made
    without moveaxis' checks (which cost more than the round's arithmetic)."""
    return a.transpose(a.ndim - 1, *range(a.ndim - 1))


def row_means(v: np.ndarray) -> np.ndarray:
    """``v.mean(axis=1)`` of (S, M) values: the same sums divided by M, bit for bit, without
    np.mean's overhead (once or twice per round)."""
    return np.add.reduce(v, axis=1) / v.shape[1]


def _first(a: np.ndarray) -> np.ndarray:
    """``a`` (S, M, k) as contiguous (k, S, M)."""
    return np.ascontiguousarray(_coordinate_first(a))


def _finish(sse: np.ndarray, w: np.ndarray) -> None:
    """``sqrt(max(sse, 0)) * w`` in place."""
    np.maximum(sse, 0.0, out=sse)
    np.sqrt(sse, out=sse)
    sse *= w


def _combine(phi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_k phi[..., k] w[s, k]`` for ``phi`` (S, ...) and weights ``w`` (S, n_phi)."""
    shape = (-1,) + (1,) * (phi.ndim - 2)
    out = np.zeros(phi.shape[:-1])
    for k in range(phi.shape[-1]):
        if w[:, k].any():
            out += phi[..., k] * w[:, k].reshape(shape)
    return out


def nrmse_one_step(model, theta: np.ndarray, ho) -> np.ndarray:
    """One-step-ahead NRMSE of each client's held-out data, (S, M); NaN without held-out data.

    For each regression target ``j`` (the next value of state ``s_j``, see
    :attr:`System.target_states`): ``RMSE_j / std(x_{s_j})``, averaged over targets, with the
    squared error ``||R [-Theta[j, F_j]; 1]||^2`` from the QR factor ``R`` of the target's
    held-out data (:attr:`~fnsysid.data.heldout.HeldOut.factor`):
    O(n_y n_phi^2) per client, whatever the amount of held-out data, and exact to rounding
    (no ~1e-8 floor).
    States constant over a client's held-out data are left out of the average. For every
    round of a run build one :class:`HeldOutScores` instead.
    """
    return HeldOutScores(model, ho).one_step(theta)


def _mean_over_states(rmse: np.ndarray, std: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean of ``rmse / std`` over states with ``std > 0``; NaN for clients not ``valid``."""
    use = std > 0
    ratio = np.where(use, rmse / np.where(use, std, 1.0), 0.0)
    k = use.sum(axis=-1)
    out = ratio.sum(axis=-1) / np.maximum(k, 1)
    return np.where(valid & (k > 0), out, np.nan)


def free_run(model, theta: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Simulate the model from each trajectory's first state with the recorded inputs.

    ``theta`` (S, M or 1, p); ``x`` (S, M, J, L, n_x); ``u`` (S, M, J, L - 1, n_u). Returns the
    simulated states (S, M, J, L, n_x); a rollout that blows up holds inf or NaN.
    """
    th = np.asarray(theta, float)[:, :, None, :]
    out = np.empty(np.broadcast_shapes(x.shape, th.shape[:3] + x.shape[3:]))
    out[..., 0, :] = x[..., 0, :]
    with np.errstate(all="ignore"):
        for t in range(x.shape[-2] - 1):
            out[..., t + 1, :] = model.predict(out[..., t, :], u[..., t, :], th)
    return out


def one_step(model, theta: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One-step-ahead predictions of states ``x[..., 1:, :]`` from the measured states."""
    th = np.asarray(theta, float)[:, :, None, None, :]
    with np.errstate(all="ignore"):
        return model.predict(x[..., :-1, :], u, th)


def nrmse_free_run(model, theta: np.ndarray, ho) -> np.ndarray:
    """Free-run simulation NRMSE of each client's held-out trajectories, (S, M).

    Per state: RMSE of the rollout over all held-out samples after the first, divided by the
    state's standard deviation over the held-out data; averaged over states. A rollout that
    blows up gives ``inf`` for that client (NaN: no held-out data).
    """
    return HeldOutScores(model, ho).free_run(theta)


def over_clients(v: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max and mean over the clients axis of (S, M) values, counting only ``valid`` clients
    (NaN where a repeat has none); ``inf`` propagates."""
    if valid.all():
        return v.max(axis=1), row_means(v)
    k = valid.sum(axis=1)
    with np.errstate(invalid="ignore"):
        vmax = np.where(valid, v, -np.inf).max(axis=1)
        vmean = np.where(valid, v, 0.0).sum(axis=1) / np.maximum(k, 1)
    return np.where(k > 0, vmax, np.nan), np.where(k > 0, vmean, np.nan)


#: a solve whose (equilibrated) Gram condition number reaches 1 / machine epsilon keeps no
#: correct digit: its relative error bound ``cond * eps`` is 1 or more
COND_LIMIT = 1.0 / np.finfo(float).eps


def roundoff_ratio(H: np.ndarray, b: np.ndarray, yy: np.ndarray,
                   support: np.ndarray | None = None, trials: int = 4,
                   seed: int = 0, spread: np.ndarray | None = None,
                   enters: np.ndarray | None = None) -> np.ndarray:
    """How far the round-off of the pooled sums moves each client's predictions, relative
    to its data: (S, M), or (S, M, n_y) per target with ``enters``.

    The pooled statistics ``sum_i H_i``, ``sum_i b_i`` carry a rounding error of about one
    unit in the last place of their largest terms: ``eps sqrt(h_k h_l)`` in entry (k, l)
    (``h`` the pooled Gram diagonal) and ``eps sqrt(h_k yy)`` in moment k. The pooled
    least squares (on ``support``) is solved again ``trials`` times with the sums perturbed
    by such errors of random signs (a fixed ``seed``), and the largest change ``dtheta`` of
    the solution is mapped to client i's predictions, ``sqrt(dtheta' H_i dtheta)``, divided
    by the size of its targets: ``sqrt(spread_i)`` when ``spread`` is given (the targets'
    summed squares about their means, so that an offset in the data, a state that moves
    about 1000, does not hide a change of the predictions that is large beside how much
    they move), else ``sqrt(yy_i)`` (``yy`` (S, M), the summed squares). With ``enters``
    (n_y, p: which targets each coefficient enters) each target is measured on its own
    coefficients against its own ``spread`` (S, M, n_y), so that a target that moves a lot
    does not hide one that sits far from 0. Where one trajectory is many orders of
    magnitude larger than the others, the other clients' data lie below the precision of
    the sums and the ratio approaches or passes 1: their part of the estimate keeps no
    correct digit; the same where the data sit far from 0 beside their spread (a
    polynomial library of a state about 1000). NaN for a target without variation."""
    H = np.asarray(H, float)
    S, M, p = H.shape[:3]
    keep = np.ones((S, p)) if support is None else np.asarray(support, float)
    G = masked_gram(H.sum(axis=1), keep)
    bs = np.asarray(b, float).sum(axis=1) * keep
    yt = np.asarray(yy, float).sum(axis=1)                                        # (S,)
    h = np.sqrt(np.maximum(np.diagonal(G, axis1=-2, axis2=-1), 0.0))              # (S, p)
    eps = np.finfo(float).eps
    rng = np.random.default_rng(seed)
    blocks = [np.arange(p)] if enters is None else \
        [np.flatnonzero(row) for row in np.asarray(enters, bool)]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        base = least_squares(G, bs) * keep
        E = rng.choice([-1.0, 1.0], size=(trials, *G.shape))
        E = np.triu(E) + np.swapaxes(np.triu(E, 1), -1, -2)                      # symmetric
        dG = eps * E * h[:, :, None] * h[:, None, :]
        db = eps * rng.choice([-1.0, 1.0], size=(trials, *bs.shape)) * h * np.sqrt(yt)[:, None]
        d = np.swapaxes(least_squares(G + dG, bs + db) * keep - base, 0, 1)      # (S, T, p)
        worst = np.zeros((S, M, len(blocks)))
        for j, own in enumerate(blocks):
            # every client's H_i read once for all the trials, on the target's coefficients
            Hj = H if len(own) == p else H[:, :, own[:, None], own]
            dj = d if len(own) == p else d[..., own]
            move = np.einsum("smpq,stq->smtp", Hj, dj, optimize=True)
            move = np.einsum("smtp,stp->smt", move, dj)
            worst[..., j] = np.sqrt(np.maximum(move, 0.0)).max(axis=-1)
        if enters is None:
            worst = worst[..., 0]
        size = np.asarray(yy if spread is None else spread, float)
        ratio = worst / np.sqrt(size)
    return np.where(size > 0, ratio, np.nan)


#: a target whose summed squares about its mean are below this share of its summed squares
#: moves less than 1e-5 of its level: its spread, a difference of the two, is not known well
#: enough to measure anything against, and a loss is measured against this share instead
#: (a target held at 1000 +- 1e-6 is then judged by what the sums can hold, not flagged by
#: the rounding of its spread; tanks about 1e6 moving by 0.3, whose closed-form fits miss
#: by 1e4 times their spread, are no longer left unjudged)
SPREAD_PRECISION = 1e-10


def roundoff_facts(data, support: np.ndarray | None = None,
                   enters: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """:func:`roundoff_ratio` of ``data`` (a :class:`~fnsysid.dynamics.model.ClientData`,
    (S, M, ...)) against each target's spread (``enters`` (n_y, p), with ``yy_target`` and
    ``y_mean``; else all targets together), with what its warning names, each (S, M) for
    the client's worst target: ``ratio``; ``raw``, the same change against the target's
    norm (below the limit where ``ratio`` is not: data far from 0 beside their spread);
    ``level``, the magnitude of the target's mean; ``sd``, its standard deviation. A target
    whose spread is below :data:`SPREAD_PRECISION` of its summed squares is measured
    against that share instead. Of one client's data alone (M = 1) it is the round-off of
    that client's own least squares, which a Flower client sends (the server holds no
    ``H_i``)."""
    n = np.asarray(data.n, float)
    if data.y_mean is None or data.yy_target is None or enters is None:
        yy = np.asarray(data.yy, float)
        if data.y_mean is None:
            spread, level = yy, np.full(yy.shape, np.nan)
        else:
            ym = np.asarray(data.y_mean, float)
            spread = yy - n * (ym ** 2).sum(axis=-1)
            level = np.sqrt((ym ** 2).mean(axis=-1))
        yy, spread, level = yy[..., None], spread[..., None], level[..., None]
        n_y = 1 if data.y_mean is None else data.y_mean.shape[-1]
        ratio = roundoff_ratio(data.H, data.b, yy[..., 0], support,
                               spread=np.maximum(spread, SPREAD_PRECISION * yy)[..., 0])[
            ..., None]
    else:
        yy = np.asarray(data.yy_target, float)                                  # (S, M, n_y)
        ym = np.asarray(data.y_mean, float)
        spread, level, n_y = yy - n[..., None] * ym ** 2, np.abs(ym), 1
        ratio = roundoff_ratio(data.H, data.b, data.yy, support, enters=enters,
                               spread=np.maximum(spread, SPREAD_PRECISION * yy))
    return _worst_target(ratio, spread, yy, level, n, n_y)


def _worst_target(ratio, spread, yy, level, n, n_y: int = 1) -> dict[str, np.ndarray]:
    """The facts of :func:`roundoff_facts`, each (S, M), at each client's worst target of
    ``ratio`` (S, M, targets): the ratio; ``raw``, the same loss against the target's norm
    (``spread`` and ``yy`` its summed squares about its mean and about 0); ``level``; ``sd``,
    the standard deviation over ``n`` (S, M) samples of ``n_y`` targets."""
    with np.errstate(divide="ignore", invalid="ignore"):
        raw = ratio * np.sqrt(spread / yy)
        sd = np.sqrt(np.maximum(spread, 0.0) / (np.maximum(n, 1)[..., None] * n_y))
    j = np.argmax(np.where(np.isnan(ratio), -np.inf, ratio), axis=-1)[..., None]

    def pick(a):
        return np.take_along_axis(a, j, axis=-1)[..., 0]

    return {"ratio": pick(ratio), "raw": pick(raw), "level": pick(level), "sd": pick(sd)}


#: a least-squares problem whose factor ``R`` (columns scaled to unit size) has diagonal
#: entries below this share of its largest is not judged by :func:`roundoff_loss`: the
#: closed-form solves drop such directions (``pinv`` below 1e-15 of the largest eigenvalue
#: of the Gram matrix, 3e-8 of the largest singular value), so the two solves differ by
#: more than rounding there
DETERMINED = 1e-8


def _stable_solve(R: np.ndarray, m: int) -> np.ndarray:
    """``t`` (..., m) of the least squares whose QR factor of ``[X | y]`` is ``R`` (..., k,
    m + 1): a triangular solve (NaN where the columns of X, scaled to unit size, are not
    determined, :data:`DETERMINED`)."""
    r = np.linalg.qr(R, mode="r")                                    # (..., m + 1, m + 1)
    A, y = r[..., :m, :m], r[..., :m, m]
    d = np.abs(np.diagonal(A, axis1=-2, axis2=-1))
    norm = np.sqrt((R[..., :m] ** 2).sum(axis=-2))
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = d / norm
        ok = (scaled.min(axis=-1) >= DETERMINED * scaled.max(axis=-1)) & (norm > 0).all(-1)
        A = np.where(ok[..., None, None], A, np.eye(m))
        t = np.linalg.solve(A, y[..., None])[..., 0]
    return np.where(ok[..., None], t, np.nan)


def roundoff_loss(model, data, support: np.ndarray | None = None,
                  pooled: bool = True) -> dict[str, np.ndarray]:
    """How much of each client's predictions the closed-form solves from the summed
    statistics lose to rounding, measured against a stable solve of the same least
    squares, relative to the spread of each target; each (S, M) for the client's worst
    target, as :func:`roundoff_facts`.

    The closed-form solves (:func:`fnsysid.dynamics.model.least_squares`) invert Gram
    matrices, whose condition number is the square of the data's: data far from 0 beside
    their spread (a polynomial library of a state about 1000) lose most of their digits
    there. The same least squares solved from the QR factors of the clients' samples
    (:attr:`~fnsysid.dynamics.model.ClientData.factor`, stacked over the clients for the
    pooled one) keeps the precision of the data; the difference ``dt`` of the two solutions
    is mapped to each client's predictions, ``||R_i dt||``, over the square root of the
    target's summed squares about its mean. ``pooled``: the pooled least squares (every
    client's predictions, ``ratio``), and each client's own (``own``); else the own alone
    (what a Flower client measures on its own data). A generic library's model (each
    coefficient one feature of one target); a target whose problem is not determined
    (:data:`DETERMINED`) is not judged (NaN); one whose spread is below
    :data:`SPREAD_PRECISION` of its summed squares is measured against that share."""
    from fnsysid.dynamics.model import group_factor, least_squares, target_groups
    from fnsysid.learning.ownfit import own_fits

    S, M, p = data.H.shape[:3]
    St = np.asarray(model.structure)                                 # (n_y, n_phi, p)
    keep = np.ones((S, p), bool) if support is None else np.asarray(support, bool)
    n = np.asarray(data.n, float)
    yy = np.asarray(data.yy_target, float)
    ym = np.asarray(data.y_mean, float)
    spread = yy - n[..., None] * ym ** 2
    size = np.maximum(spread, SPREAD_PRECISION * yy)
    n_y = St.shape[0]
    pooled_loss = np.full((S, M, n_y), np.nan)
    own_loss = np.full((S, M, n_y), np.nan)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        G = masked_gram(data.H.sum(axis=1), keep)
        base = least_squares(G, data.b.sum(axis=1) * keep) * keep          # (S, p)
        # each client's own fit as the model check, oneshot and Cochran's Q have it (one
        # computation for them all, fnsysid.learning.ownfit)
        own = own_fits(data.H, data.b, None if support is None else keep[:, None]).theta
        for g, (F, J) in enumerate(target_groups(model)):
            R = group_factor(model, data.factor, g)                        # (S, M, k, k)
            f, k = len(F), R.shape[-1]
            for q, j in enumerate(J):
                par = np.array([int(np.flatnonzero(St[j, c])[0]) for c in F])   # (f,)
                for s in range(S):
                    cols = np.flatnonzero(keep[s, par])
                    if not cols.size:
                        continue
                    m = cols.size
                    A = R[s][..., np.r_[cols, f + q]]                      # (M, k, m + 1)
                    Xs = A[..., :m]
                    if pooled:
                        t = _stable_solve(A.reshape(1, M * k, m + 1), m)[0]
                        dt = base[s, par[cols]] - t
                        pooled_loss[s, :, j] = np.linalg.norm(Xs @ dt, axis=-1)
                    t = _stable_solve(A, m)                                # (M, m)
                    dt = own[s][:, par[cols]] - t
                    own_loss[s, :, j] = np.linalg.norm(
                        np.einsum("mkc,mc->mk", Xs, dt), axis=-1)
        root = np.sqrt(size)
        pooled_loss, own_loss = pooled_loss / root, own_loss / root

    out = {f"own_{k}": v for k, v in
           _worst_target(own_loss, spread, yy, np.abs(ym), n).items()}
    if pooled:
        out.update(_worst_target(pooled_loss, spread, yy, np.abs(ym), n))
    return out


def flat_term(model, H: np.ndarray) -> dict | None:
    """The term of a generic library with the constant feature ``1`` that moves least
    beside its mean in each client's data: ``name`` (the features' names), and each (S, M)
    ``term`` (its index among them, -1 where none moves), ``mean``, ``sd`` (its standard
    deviation over the client's samples) and ``ratio`` ``|mean| / sd`` (inf where it does
    not move at all), from the client's Gram matrix ``H`` (S, M, p, p) of the first target
    that has the constant (its row of ``1`` holds each term's sum). Such a term is a copy of
    the constant in that client's data: its own least squares hardly determine the term's
    coefficient, and the Gram matrix's condition number grows as ``ratio`` squared. None
    without the constant or for a system's own features."""
    from fnsysid.dynamics.model import constant_feature

    found = constant_feature(model)
    if found is None:
        return None
    names, one = found
    St = np.asarray(model.structure)                                  # (n_y, n_phi, p)
    target = next((j for j in range(St.shape[0]) if np.count_nonzero(St[j, one]) == 1), None)
    if target is None:
        return None
    cols = [int(np.flatnonzero(St[target, f])[0]) if St[target, f].any() else -1
            for f in range(len(names))]
    c = cols[one]
    feats = [f for f in range(len(names)) if f != one and cols[f] >= 0]
    if not feats:
        return None
    H = np.asarray(H, float)
    k = np.array([cols[f] for f in feats])
    n = H[..., c, c]                                                  # (S, M) samples
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = H[..., c, k] / n[..., None]                            # (S, M, f)
        var = np.diagonal(H, axis1=-2, axis2=-1)[..., k] / n[..., None] - mean ** 2
        sd = np.sqrt(np.maximum(var, 0.0))
        ratio = np.where(mean != 0, np.abs(mean) / sd, 0.0)
    ratio = np.nan_to_num(ratio, nan=0.0)
    i = np.argmax(ratio, axis=-1)[..., None]

    def pick(a):
        return np.take_along_axis(a, i, axis=-1)[..., 0]

    best = pick(ratio)
    return {"name": names, "term": np.where(best > 0, np.asarray(feats)[i[..., 0]], -1),
            "mean": pick(mean), "sd": pick(sd), "ratio": best}


#: the one-step NRMSE that the estimation error of a mean of the clients' own fits adds on
#: its own (over the pooled data, against each target's spread), from which a run names the
#: clients whose fits make it; and from :data:`MEAN_ERROR_FLOOR` on, where it is above the
#: noise's own NRMSE (the pooled least squares' error is a small part of the noise's:
#: about ``sqrt(p / N)`` of it over ``N`` pooled samples)
MEAN_ERROR_LEVEL, MEAN_ERROR_FLOOR = 0.1, 0.01


def _noise_variance(H, b, yy, n, theta, ok) -> float:
    """The residual variance :func:`own_mean_error` scales each fit's covariance by, for one
    repeat and target (``H`` (M, m, m), ``b`` (M, m), ``yy`` and ``n`` (M,), the own fits
    ``theta`` (M, m), ``ok`` the determined ones): the median of the determined clients' own
    residual variances where some have residual degrees of freedom (``yy - theta'b`` of a fit
    that loses its digits loses them too: a held input's client was 117 times the others');
    where none has (each fit interpolates its data: as many samples as coefficients), the
    pooled least squares' residual variance, which counts the clients' differences as noise;
    NaN where that has no degree of freedom either."""
    m = H.shape[-1]
    spare = ok & (n > m)
    if spare.any():
        rss = yy[spare] - np.einsum("mk,mk->m", theta[spare], b[spare])
        return float(np.median(np.maximum(rss, 0.0) / (n[spare] - m)))
    N = n.sum()
    if N <= m:
        return np.nan
    G, g = H.sum(axis=0), b.sum(axis=0)
    pooled = np.linalg.lstsq(G, g, rcond=None)[0]
    return float(max(yy.sum() - pooled @ g, 0.0) / (N - m))


def own_mean_error(model, data, support=None, weights=None) -> dict | None:
    """What the estimation error of a mean of the clients' own least squares adds to its
    one-step predictions, per repeat and target, and who adds it.

    The mean ``sum_i w_i theta_i`` (``weights`` (S, M), None: uniform; over the clients whose
    data determine their fit) errs by ``sum_i w_i delta_i``, ``delta_i`` the error of client
    i's own fit, of covariance ``V_i = s^2 H_i^-1`` (on the coefficients of one target; ``s^2``
    of :func:`_noise_variance`: the median of the clients' residual variances, which one fit
    that loses its digits does not move, or the pooled fit's where every fit interpolates its
    data). Over the pooled samples it adds ``sum_i w_i^2 trace(Hbar
    V_i)`` to the mean squared one-step error (``Hbar`` the pooled Gram matrix per sample):
    ``nrmse`` (S, n_y) is its square root over the target's standard deviation, and
    ``share`` (S, n_y, M) each client's part of it; ``noise`` (S, n_y) the noise's own
    NRMSE, ``sqrt(s^2)`` over the same deviation. A fit that its data hardly determine
    (an input held nearly constant) makes this large even where every other fit is exact,
    since the mean weighs the fits alike; the pooled least squares weighs each client's data
    by what they determine. ``coefficient`` (S, n_y, M): each client's coefficient of the
    target with the largest ``V_i`` beside the median client's; ``fits`` (S, n_y): the
    clients whose fit enters. None where a coefficient enters several targets (a system's
    own features)."""
    from fnsysid.learning.ownfit import own_fits

    St = np.asarray(model.structure) != 0                             # (n_y, n_phi, p)
    enters = St.any(axis=1)                                           # (n_y, p)
    if (enters.sum(axis=0) > 1).any():
        return None
    H = np.asarray(data.H, float)
    b = np.asarray(data.b, float)
    S, M, p = b.shape
    n_y = enters.shape[0]
    keep = np.ones((S, p), bool) if support is None else np.asarray(support, bool)
    fits = own_fits(data.H, data.b, None if support is None else keep[:, None])
    n = np.asarray(data.n, float)
    yy = np.asarray(data.yy_target, float)
    spread = yy - n[..., None] * np.asarray(data.y_mean, float) ** 2  # (S, M, n_y)
    w = np.where(fits.full, 1.0 if weights is None else np.asarray(weights, float), 0.0)
    w = w / np.maximum(w.sum(axis=1, keepdims=True), np.finfo(float).tiny)
    nrmse, noise = np.full((S, n_y), np.nan), np.full((S, n_y), np.nan)
    share = np.zeros((S, n_y, M))
    coef = np.full((S, n_y, M), -1)
    fits_in = np.zeros((S, n_y), int)
    for s in range(S):                                                # repeats and targets,
        for j in range(n_y):                                          # not clients
            par = np.flatnonzero(enters[j] & keep[s])
            ok = fits.full[s]
            if not par.size or ok.sum() < 1:
                continue
            Hj = H[s][:, par][:, :, par]                              # (M, m, m)
            Hbar = Hj.sum(axis=0) / n[s].sum()
            eye = np.eye(par.size)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                inv = np.linalg.inv(np.where(ok[:, None, None], Hj, eye))
                s2 = _noise_variance(Hj, b[s][:, par], yy[s, :, j], n[s], fits.theta[s][:, par],
                                     ok)
                added = np.where(ok, w[s] ** 2 * s2 * np.einsum("kl,mlk->m", Hbar, inv), 0.0)
                var = spread[s, :, j].sum() / n[s].sum()
                total = added.sum()
                if not (var > 0 and np.isfinite(total)):
                    continue
                nrmse[s, j] = np.sqrt(total / var)
                noise[s, j] = np.sqrt(s2 / var)
                fits_in[s, j] = ok.sum()
                share[s, j] = np.where(ok, added / total if total > 0 else 0.0, 0.0)
                v = np.diagonal(inv, axis1=-2, axis2=-1)                      # (M, m)
                med = np.median(v[ok], axis=0)                  # of the determined fits
                coef[s, j] = np.where(ok, par[np.argmax(np.nan_to_num(v / med), axis=1)], -1)
    return {"nrmse": nrmse, "noise": noise, "share": share, "coefficient": coef,
            "fits": fits_in}


def mean_error_flagged(err: dict) -> np.ndarray:
    """The (repeat, target) pairs (S, n_y) where the error :func:`own_mean_error` finds
    matters: a one-step NRMSE of :data:`MEAN_ERROR_LEVEL` or more, or of
    :data:`MEAN_ERROR_FLOOR` or more and above the noise's own (``noise``): then the mean's
    one-step error is over sqrt(2) times the noise's, where the pooled least squares' is
    close to it (a short client among long ones: 0.095 against a noise of 0.007 turned a
    Duffing fleet's cubic coefficient from -0.019 to +0.083)."""
    added = np.nan_to_num(err["nrmse"], nan=0.0)
    noise = np.nan_to_num(err["noise"], nan=np.inf)
    return (added >= MEAN_ERROR_LEVEL) | ((added >= MEAN_ERROR_FLOOR) & (added > noise))


#: the terms of a near-dependence :func:`repeated_terms` names: weights of at least this
#: fraction of the largest (in unit-scaled regressors; below it the eigenvector's own
#: round-off), at most :data:`REPEATED_SHOWN` of them
REPEATED_WEIGHT, REPEATED_SHOWN = 1e-6, 6


def repeated_terms(H: np.ndarray, param_names, structure, support=None,
                   limit: float = COND_LIMIT) -> dict | None:
    """Which terms repeat each other where a repeat's pooled Gram matrix is singular: for the
    first repeat and target whose own block of ``H`` (S, M, p, p), summed over the clients and
    equilibrated as :func:`gram_condition` does, has condition number ``limit`` or more, the
    first of its terms (in the library's order) that the ones before it repeat: the shortest
    run of terms whose condition number reaches a hundredth of the block's (or of ``limit``),
    and its one dependence written as a relation between the features' values (in their
    units, the last term's weight 1): ``{repeat, target, terms, weights, relation}``, the
    terms of weights at least :data:`REPEATED_WEIGHT` of the largest (unit-scaled), at most
    :data:`REPEATED_SHOWN`. None where no target's block reaches ``limit``. ``structure``
    (n_y, n_phi, p) says which parameters each target has
    (:class:`~fnsysid.dynamics.model.Model`).

    >>> H = np.zeros((1, 1, 4, 4)); x = np.array([1.0, 2.0, 3.0, 5.0])
    >>> F = np.stack([np.ones(4), x, x ** 2, 2 * x], axis=1); H[0, 0] = F.T @ F
    >>> r = repeated_terms(H, ["y+:1", "y+:x", "y+:x^2", "y+:z"], np.eye(4)[None])
    >>> r["target"], r["terms"], r["relation"]
    ('y+', ['z', 'x'], 'z - 2 x = 0')
    """
    G, keep, d = _pooled_gram(H, support)
    St = np.asarray(structure)
    for s in range(G.shape[0]):
        for j in range(St.shape[0]):
            idx = np.flatnonzero(St[j].any(axis=0) & keep[s] & (d[s] > 0) & np.isfinite(d[s]))
            g, scale = _equilibrated(G[s], d[s], idx)
            if len(idx) < 2 or not np.isfinite(g).all():
                continue
            whole = _condition(g)
            if whole < limit:
                continue
            level = min(whole, limit) / 100
            k = next(k for k in range(2, len(idx) + 1) if _condition(g[:k, :k]) >= level)
            v = np.linalg.eigh(g[:k, :k])[1][:, 0]
            order = [i for i in np.argsort(-np.abs(v)) if abs(v[i]) >= REPEATED_WEIGHT
                     * np.abs(v).max()]
            order = ([k - 1] + [i for i in order if i != k - 1])[:REPEATED_SHOWN]
            raw = v[order] * scale[order]                  # weights of the features' values
            raw = raw / raw[0]
            names = [str(param_names[idx[i]]) for i in order]
            target = names[0].split(":", 1)[0] if ":" in names[0] else None
            terms = [n.split(":", 1)[1] if ":" in n else n for n in names]
            # the constant feature "1" is written as its weight alone ("aff - 5 - 3 u")
            relation = terms[0] + "".join(
                f" {'-' if w < 0 else '+'} {abs(w):.3g}" + ("" if t == "1" else f" {t}")
                for w, t in zip(raw[1:], terms[1:], strict=True))
            return {"repeat": s, "target": target, "terms": terms,
                    "weights": [float(w) for w in raw], "relation": f"{relation} = 0"}
    return None


def repeated_words(rep: dict | None) -> str:
    """:func:`repeated_terms` in words for the warning and ``fnsysid show`` ("" for None)."""
    if not rep:
        return ""
    of = f" of {rep['target']}" if rep.get("target") else ""
    return (f"the terms {', '.join(rep['terms'])}{of} repeat each other in repeat "
            f"{rep['repeat']}'s data ({rep['relation']} to round-off over the pooled samples)")


#: what :func:`repeated_terms`' dependence can come from, and what to do
REPEATED_CAUSES = ("a feature that repeats another (leave one of them out of the data or the "
                   "library), or a trajectory that escapes, whose largest samples make its "
                   "terms proportional (check the data's largest values)")


def gram_condition(H: np.ndarray, support: np.ndarray | None = None) -> np.ndarray:
    """The condition number (S,) of each repeat's pooled Gram matrix ``H`` (S, M, p, p) summed
    over the clients, equilibrated (each regressor scaled to unit size, as the closed-form
    solves invert it: :func:`fnsysid.dynamics.model.equilibrated_pinv`, whose ``pinv`` drops
    the directions below ``1e-15`` of the largest eigenvalue), on the coefficients of
    ``support`` (S, p) (all by default) whose regressor is not identically 0. It does not
    depend on the data's units. ``inf`` when singular or not finite, NaN when no coefficient
    is left."""
    G, keep, d = _pooled_gram(H, support)
    out = np.full(G.shape[0], np.nan)
    for s in range(G.shape[0]):                                        # repeats, not clients
        use = keep[s] & (d[s] > 0) & np.isfinite(d[s])
        if not use.any():
            continue
        g, _ = _equilibrated(G[s], d[s], np.flatnonzero(use))
        out[s] = _condition(g) if np.isfinite(g).all() else np.inf
    return out


def zero_regressors(H: np.ndarray, support: np.ndarray | None = None) -> np.ndarray:
    """The coefficients (S, p) of ``support`` (all by default) whose regressor is 0 in every
    client's data (the pooled Gram's diagonal of ``H`` (S, M, p, p) is 0): no data determine
    them, and a least-squares solve (pseudo-inverse) or gradient steps from 0 leave them at
    0 (an input held at 0, a state that never moves from 0)."""
    d = np.diagonal(np.asarray(H, float), axis1=-2, axis2=-1).sum(axis=1)   # (S, p) only
    return (d == 0) if support is None else np.asarray(support, bool) & (d == 0)


def _pooled_gram(H, support):
    """The pooled Gram matrices ``G`` (S, p, p) of ``H`` (S, M, p, p), the coefficients kept
    ``keep`` (S, p) (all where ``support`` is None) and ``G``'s diagonal ``d`` (S, p)."""
    G = np.asarray(H, float).sum(axis=1)
    S, p = G.shape[:2]
    keep = np.ones((S, p), bool) if support is None else np.asarray(support, bool)
    return G, keep, np.diagonal(G, axis1=-2, axis2=-1)


def _equilibrated(G, d, idx):
    """``G`` (p, p) on the coefficients ``idx``, each regressor scaled to unit size by its
    diagonal ``d`` (p,) (:func:`equilibration`), and the scale."""
    scale = equilibration(d[idx])
    return G[np.ix_(idx, idx)] * scale[:, None] * scale[None, :], scale


def _condition(g) -> float:
    """The condition number of a symmetric PSD ``g``: inf where it is singular."""
    ev = np.linalg.eigvalsh(g)
    return ev[-1] / ev[0] if ev[0] > 0 else np.inf
