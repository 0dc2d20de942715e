"""Each client's own fit with what a test of it needs: its parameters, the pseudo-inverse of its
Gram matrix and its training noise.

The model check (:mod:`fnsysid.results.modelcheck`) judges the model class by each client's
own least squares on its own training data (so that differences between clients are not taken
for a missing term); this module makes those fits from the clients' sufficient statistics
(:class:`fnsysid.dynamics.model.ClientData`), on the run's support with ``sparsity``. The
parameters come from :func:`fnsysid.learning.ownfit.own_fits` (made once for the run's
statistics and shared with the strategy and the intervals); the pseudo-inverses are made only
for the clients asked (:class:`PseudoInverses`), since the check uses a subset of the clients.
The statistics computed from these fits, and the verdict, stay with the check.
"""

from __future__ import annotations

import weakref

import numpy as np

from fnsysid.dynamics.model import equilibrated_pinv, masked_gram, residual_sums
from fnsysid.learning import ownfit


def _support(support):
    """The support (S, p) as the clients' (S, 1, p) bool, or None."""
    return None if support is None else np.asarray(support, bool)[:, None, :]


def pseudo_inverses(data, support, clients) -> np.ndarray:
    """The pseudo-inverses of the Gram matrices of some clients, restricted to a support.

    Parameters
    ----------
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics; ``data.H`` is (S, M, p, p).
    support : numpy.ndarray of bool, shape (S, p), or None
        The terms each repeat's model keeps (zero outside them); None: every term.
    clients : array_like of int or slice
        The clients (along axis 1 of ``data.H``) whose pseudo-inverses are made.

    Returns
    -------
    numpy.ndarray, shape (S, m, p, p)
        ``H_i^+`` of each client asked (those of the own fits; only the clients checked need
        them).
    """
    H = data.H[:, clients]
    if support is not None:
        H = masked_gram(H, _support(support))
    return equilibrated_pinv(H)


class PseudoInverses:
    """The pseudo-inverses of the clients' restricted Gram matrices, made for the clients
    asked (``Hplus[:, clients]``, :func:`pseudo_inverses`) rather than for all M: only the
    clients checked need them.

    Parameters
    ----------
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics.
    support : numpy.ndarray of bool, shape (S, p), or None, default=None
        The terms each repeat's model keeps; None: every term.
    """

    def __init__(self, data, support=None):
        self.data, self.support = data, support

    def __getitem__(self, key):
        everything, clients = key
        if everything != slice(None):
            raise IndexError("PseudoInverses[:, clients] only")
        return pseudo_inverses(self.data, self.support, clients)


def own_fits(data, support=None) -> np.ndarray:
    """Each client's exact least-squares model on its training statistics.

    Parameters
    ----------
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics (``H``, ``b``).
    support : numpy.ndarray of bool, shape (S, p), or None, default=None
        The terms each repeat's model keeps; None: every term.

    Returns
    -------
    numpy.ndarray, shape (S, M, p)
        ``H_i^+ b_i`` on the support, 0 outside it (:func:`fnsysid.learning.ownfit.own_fits`,
        made once for the run's statistics and shared with the strategy and the intervals).
    """
    return ownfit.own_fits(data.H, data.b, _support(support)).theta


def own_residual_sums(model, data, support=None) -> np.ndarray | None:
    """Each client's own least squares' residual sum of squares per target (S, M, n_y), from
    its training QR factors (``data.factor``, :func:`fnsysid.dynamics.model.residual_sums`);
    None where the data carry no factors.

    Computed once per run: kept with the own fits (:func:`fnsysid.learning.ownfit.own_fits`,
    itself made once for the same statistics and support) for the same ``data.factor`` and
    ``model`` while they live, so the personalized models, the pooled intervals' homogeneity
    test and the model check share one computation.

    Parameters
    ----------
    model : fnsysid.dynamics.model.Model
        The model (its targets' groups of features).
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics (``H``, ``b``, ``factor``).
    support : numpy.ndarray of bool, shape (S, p), or None, default=None
        The terms each repeat's model keeps; None: every term.
    """
    if data.factor is None:
        return None
    fits = ownfit.own_fits(data.H, data.b, _support(support))
    memo = fits.__dict__.setdefault("_sse", {})     # a frozen dataclass's own dict
    key = (id(data.factor), id(model))
    hit = memo.get(key)
    if hit is not None and hit[0]() is data.factor and hit[1]() is model:
        return hit[2]
    with np.errstate(invalid="ignore"):
        sse = residual_sums(model, data.factor, fits.theta)
    memo[key] = (weakref.ref(data.factor), weakref.ref(model), sse)
    return sse


def training_noise(model, data, theta, sse=None) -> tuple[np.ndarray, np.ndarray]:
    """Each own fit's training residual variance per target and its degrees of freedom.

    The residual sums of squares come from each client's QR factors of its own training data
    (``data.factor``, :func:`fnsysid.dynamics.model.residual_sums`): sums of squared
    residuals, exact to their own rounding. The expanded ``yy - 2 theta'b + theta'H theta``
    (used only when ``data`` has no factors) is known to ~1e-16 of ``yy`` only: a client
    whose targets are large against its residuals (an offset, a near-perfect fit) got a
    noise variance off by that floor, or 0.

    Parameters
    ----------
    model : fnsysid.dynamics.model.Model
        The model (its ``structure`` (n_y, n_phi, p) tells which parameters enter which
        target).
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics (``factor``; without it ``H``, ``b``, ``yy`` or
        ``yy_target``), and ``n``.
    theta : numpy.ndarray, shape (S, M, p)
        The own fits (:func:`own_fits`).
    sse : numpy.ndarray, shape (S, M, n_y), or None, default=None
        Their residual sums of squares, when known (:func:`own_residual_sums`).

    Returns
    -------
    s2 : numpy.ndarray, shape (S, M, n_y)
        The residual sum of squares of each target over its degrees of freedom; NaN where
        there are none.
    dof : numpy.ndarray, shape (S, M, n_y)
        Samples minus the fitted (nonzero) terms of the target.
    """
    St = model.structure                                        # (n_y, n_phi, p)
    P = St.any(axis=1).astype(float)                            # (n_y, p) target of a param
    n_y = St.shape[0]
    th = theta[..., None, :] * P                                # (S, M, n_y, p)
    if sse is not None:
        pass
    elif data.factor is not None:
        sse = residual_sums(model, data.factor, theta)
    else:
        yy = (data.yy_target if data.yy_target is not None
              else np.repeat(data.yy[..., None] / n_y, n_y, axis=-1))
        sse = yy - 2 * np.einsum("smyp,smp->smy", th, data.b) + \
            np.einsum("smyp,smpq,smyq->smy", th, data.H, th)
    dof = data.n[..., None] - (th != 0).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dof > 0, np.maximum(sse, 0) / np.maximum(dof, 1), np.nan), dof


def own_fit_statistics(model, data, support=None):
    """Each client's own fit and what the model check's tests need of it.

    Parameters
    ----------
    model : fnsysid.dynamics.model.Model
        The model fitted.
    data : fnsysid.dynamics.model.ClientData
        The clients' training statistics.
    support : numpy.ndarray of bool, shape (S, p), or None, default=None
        The terms each repeat's model keeps (``sparsity``); None: every term.

    Returns
    -------
    Hplus : PseudoInverses
        The pseudo-inverses of the clients' (restricted) Gram matrices, made for the clients
        asked (``Hplus[:, clients]``, (S, m, p, p)).
    theta : numpy.ndarray, shape (S, M, p)
        The own fits' parameters (:func:`own_fits`).
    s2 : numpy.ndarray, shape (S, M, n_y)
        Their training noise variance per target (:func:`training_noise`).
    dof : numpy.ndarray, shape (S, M, n_y)
        Its degrees of freedom.
    """
    Hplus = PseudoInverses(data, support)
    theta = own_fits(data, support)
    s2_tr, dof_tr = training_noise(model, data, theta, own_residual_sums(model, data, support))
    return Hplus, theta, s2_tr, dof_tr
