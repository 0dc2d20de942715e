"""``personalize=finetune`` and ``auto`` under ``runtime=flower``: the exchanges after the
last round.

Each client computes its own model on its node from its own data
(:mod:`fnsysid.learning.personalize`); the server sees only what is sent:

- ``auto``: exchange ``personalize_stats``: each client sends its
  :class:`~fnsysid.learning.personalize.Message` (``H_i``, ``b_i``, its residual sums of
  squares and degrees of freedom per group of targets, whether its data determine its own
  model); the server computes the :class:`~fnsysid.learning.personalize.Fleet` (``mu``,
  ``cov_mu``, ``Sigma``, ``s2``) and sends it
  in exchange ``personalize``, from which each client computes its model;
- ``finetune``: exchange ``personalize`` with the final server model; each client runs
  ``personalize.K`` local steps on its own data.

With ``sparsity``'s support (group sparsity), the server sends the support (S, p) with both
requests; each client's statistics are those of the kept terms alone with the residual sums
of its own least squares on them, and the server's fleet is that of the kept terms; both
travel as arrays of the kept terms (:func:`fnsysid.results.personal.pack_kept`: k, the most
terms a repeat keeps, in place of p); :func:`fnsysid.results.personal.support_message`,
``support_fleet`` and ``support_posterior`` compute them, as in the in-process run.

In the reply to ``personalize`` each client sends its model and standard errors, its own
least squares with theirs, and the error of its model against its own truth (``_e``, NaN
where unknown), so that the run can write ``client_estimates.csv`` and the ``e_pers``
columns; its true parameters stay on the node.
"""

from __future__ import annotations

import numpy as np

from fnsysid.learning import personalize as pers
from fnsysid.results.personal import (
    Personal,
    auto_outcome,
    own_intervals,
    own_sse,
    pack_kept,
    per_parameter_dof,
    reml_summary,
    support_fleet,
    support_message,
    support_posterior,
    target_stats,
    unpack_kept,
)

#: the exchanges of this module (a ClientApp's ``train`` message config ``exchange``)
EXCHANGES = ("personalize_stats", "personalize")


def client_reply(node, exchange: str, arrays: dict) -> dict:
    """A client's reply (arrays (S, 1, ...)) to one of :data:`EXCHANGES`, from its own data
    (``node.data``) and the server's message ``arrays``."""
    d = node.data
    support = arrays.get("support")
    support = None if support is None else np.asarray(support) > 0.5
    blocks, sse, msg = _message(node, support)
    if exchange == "personalize_stats":
        H, b = ((msg.H, msg.b) if support is None     # group sparsity: the kept terms alone
                else (pack_kept(msg.H, support, 2), pack_kept(msg.b, support, 1)))
        return {"H": H, "b": b, "rss": msg.rss, "dof": msg.dof, "own": msg.own.astype(float)}
    option = node.settings.personalize
    if option.name == "auto":
        got = arrays if support is None else _unpacked(arrays, support)
        nan = np.full(len(got["mu"]), np.nan)
        fl = pers.Fleet(got["mu"], got["cov_mu"], got["Sigma"], got["s2"],
                        got["Sigma_ci"], nan, nan, scale=got["scale"])
        theta, se = (pers.client_posterior(msg, fl, blocks) if support is None
                     else support_posterior(msg, fl, blocks, support))
    else:
        solver = node.clients.solver
        start = np.array(arrays["theta"][:, None, :])
        theta = solver.local_steps(start, option.K, option.lr)
        se = np.full(theta.shape, np.nan)
    local, local_se, _, dof = own_intervals(
        node.model, d, None if support is None else support[:, None, :], sse=sse)
    return {"theta": theta, "se": se, "local": local, "local_se": local_se,
            "local_dof": per_parameter_dof(node.model, d, dof),
            "_e": node.errors(theta[:, 0])}


#: the fleet's arrays sent to the clients, by their parameter axes (group sparsity sends
#: them on the kept terms alone, :func:`~fnsysid.results.personal.pack_kept`)
FLEET_AXES = {"mu": 1, "cov_mu": 2, "Sigma": 2, "Sigma_ci": 2, "scale": 1}


def _unpacked(arrays: dict, support) -> dict:
    """The fleet's arrays of a group-sparsity message in full size (0 for pruned terms)."""
    return {k: (unpack_kept(np.asarray(v), support, FLEET_AXES[k]) if k in FLEET_AXES else v)
            for k, v in arrays.items()}


def _message(node, support):
    """The client's noise blocks, own residual sums and :class:`~fnsysid.learning.personalize.
    Message` on ``support`` (None: every term), computed once per node and support: both
    exchanges use them (kept on the node as ``_personal``)."""
    key = None if support is None else support.tobytes()
    kept = getattr(node, "_personal", None)
    if kept is not None and kept[0] == key:
        return kept[1]
    d = node.data
    yy, blocks = target_stats(node.model, d)
    if support is None:
        sse = own_sse(node.model, d)
        msg = pers.client_message(d.H, d.b, yy, d.n, blocks, sse)
    else:                                   # group sparsity: the kept terms alone
        sse = own_sse(node.model, d, support[:, None, :])
        msg = support_message(node.model, d, support, sse)
    node._personal = (key, (blocks, sse, msg))
    return blocks, sse, msg


def serve_personalize(ask, settings, strategy, model):
    """The server's side after the last round: the exchanges above with every node (in the
    clients' order); ``ask(name, arrays)`` sends one exchange to every node and returns their
    replies stacked in the clients' order (the Flower runtime's). Returns
    :class:`~fnsysid.results.personal.Personal`."""
    option = settings.personalize.name
    if option == "auto":
        support = getattr(getattr(strategy, "sparsity", None), "support", None)
        sent = {} if support is None else {"support": np.asarray(support, float)}
        got = ask("personalize_stats", sent)
        blocks = pers.noise_blocks(model.structure)       # as the clients grouped them
        if got["dof"].shape[-1] != blocks.g:              # data without per-target sums
            blocks = int(model.structure.shape[0])
        H, b = got["H"], got["b"]
        if support is not None:                 # the kept terms alone, in full size again
            H, b = unpack_kept(H, support, 2), unpack_kept(b, support, 1)
        msg = pers.Message(H, b, got["rss"], got["dof"], got["own"] > 0.5)
        fl = (pers.fleet(msg, blocks) if support is None
              else support_fleet(msg, blocks, support))
        fleet = {"mu": fl.mu, "cov_mu": fl.cov_mu, "Sigma": fl.Sigma, "s2": fl.s2,
                 "Sigma_ci": fl.Sigma_ci, "scale": fl.scale}
        if support is not None:
            fleet = {k: (pack_kept(v, support, FLEET_AXES[k]) if k in FLEET_AXES else v)
                     for k, v in fleet.items()}
        out = ask("personalize", {**fleet, **sent})
    else:
        out = ask("personalize", {"theta": strategy.server})
    reml = reml_summary(fl) if option == "auto" else None
    se, warning = auto_outcome(out["se"], reml, out["local_se"])
    return Personal(option, out["theta"], se, out["local"], out["local_se"], out["_e"],
                    np.full(out["theta"].shape, np.nan), warning=warning,
                    local_dof=out["local_dof"], reml=reml)
