"""The server model of round 0, from the nominal model or client 0's true parameters."""

from __future__ import annotations

import numpy as np

from fnsysid.config.errors import ConfigError
from fnsysid.dynamics.model import ClientData, Model


def initial_model(model: Model, data: ClientData | None, init,
                  repeats: int | None = None) -> np.ndarray:
    """Server model of round 0: ``init.scale`` times the nominal model or client 0's.

    Parameters
    ----------
    model : fnsysid.dynamics.model.Model
        The model (its system's nominal parameters and the embedding into the model's basis).
    data : fnsysid.dynamics.model.ClientData or None
        The clients' data (client 0's true parameters); None: a federated server, which sees
        none (only the nominal reference is possible).
    init : object with ``reference`` and ``scale``
        The ``system.init`` settings: ``reference`` ``"nominal"`` or ``"client0"``, ``scale``
        a float.
    repeats : int or None, default=None
        S when ``data`` is None.

    Returns
    -------
    numpy.ndarray, shape (S, p)

    Raises
    ------
    fnsysid.config.errors.ConfigError
        If the reference is unknown or unavailable, or the start's squared norm overflows
        float64.
    """
    ref = init.reference
    if ref == "nominal":
        S = data.shape[0] if data is not None else repeats
        base = np.broadcast_to(model.system.nominal @ model.embed, (S, model.p))
    elif ref == "client0":
        if data is None or not np.isfinite(data.theta_true[:, 0]).all():
            raise ConfigError("system.init.reference=client0 starts from client 0's true "
                              "parameters, which this run does not have (with data=files give "
                              "data.truth=FILE); allowed without them: nominal")
        base = data.theta_true[:, 0]
    else:
        raise ConfigError(f"system.init.reference={ref} is not allowed; allowed: nominal, client0")
    scale = float(init.scale)
    with np.errstate(over="ignore", invalid="ignore"):
        theta0 = scale * np.array(base)
        norm2 = np.einsum("...i,...i->...", theta0, theta0)
    if not np.isfinite(norm2).all():
        norm = float(np.linalg.norm(base, axis=-1).max())
        raise ConfigError(f"system.init.scale={scale:g}: the start model ({scale:g} x the {ref} "
                          f"parameters, norm {norm:.3g}) overflows float64 (its squared norm is "
                          "not finite); allowed: |system.init.scale| below "
                          f"{np.sqrt(np.finfo(float).max) / norm:.3g}")
    return theta0
