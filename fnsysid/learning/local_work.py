"""Local work per client: the ``K`` knob as one integer, a list of M integers (``K_i``) or a
distribution ``{kind: uniform_int, low: L, high: H}`` drawn per repeat and client.

Draws come from their own random stream (purpose ``LOCAL_STEPS``, per repeat and block of
clients, like the clients' systems), so client i's ``K_i`` does not change when M grows, and a
federated node can draw its own client's ``K_i`` alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fnsysid.config.errors import ConfigError
from fnsysid.dynamics import random as rnd

KINDS = ("uniform_int",)


def _plain(K):
    """``K`` as plain Python (a checked distribution setting becomes its dict)."""
    return K.model_dump() if hasattr(K, "model_dump") else K


def is_heterogeneous(K) -> bool:
    """Whether ``K`` gives clients different step counts (a list or a distribution).

    Parameters
    ----------
    K : int, list of int or mapping
        The ``K`` setting.

    Returns
    -------
    bool
    """
    K = _plain(K)
    return isinstance(K, (list, tuple, Mapping))


def local_steps(K, M: int, repeats: int, seed: int, clients=None):
    """The local steps of each client.

    Parameters
    ----------
    K : int, list of int or mapping
        One integer, a list of M integers (``K_i``) or ``{kind: uniform_int, low: L, high:
        H}``.
    M : int
        The number of clients.
    repeats : int
        The number of repeats S.
    seed : int
        The run's root seed (the draws' stream, :mod:`fnsysid.dynamics.random`).
    clients : sequence of int or None, default=None
        The clients asked (m of them); None: all M.

    Returns
    -------
    int or numpy.ndarray of int, shape (S, m)
        ``K`` itself when it is one integer, else each repeat's step count of each client.

    Raises
    ------
    fnsysid.config.errors.ConfigError
        If a list does not have M entries or the distribution's kind is unknown.

    Examples
    --------
    >>> local_steps(5, 3, 2, 0)
    5
    >>> local_steps([1, 2, 3], 3, 2, 0, clients=[2])
    array([[3],
           [3]])
    """
    K = _plain(K)
    ids = np.arange(M) if clients is None else np.asarray(clients, dtype=int).reshape(-1)
    if not is_heterogeneous(K):
        return int(K)
    if isinstance(K, (list, tuple)):
        if len(K) != M:
            raise ConfigError(f"K has {len(K)} entries but there are M={M} clients: a list K "
                              "gives one step count per client")
        return np.broadcast_to(np.asarray(K, dtype=int)[ids], (repeats, len(ids))).copy()
    kind, low, high = K.get("kind"), K.get("low"), K.get("high")
    if kind not in KINDS:
        raise ConfigError(f"K.kind={kind} is not allowed; allowed: {', '.join(KINDS)}")
    out = np.empty((repeats, len(ids)), dtype=int)
    blk = rnd.block_of(ids)
    for s in range(repeats):
        for b in np.unique(blk).tolist():
            draws = rnd.stream(seed, rnd.LOCAL_STEPS, s, b).integers(
                int(low), int(high) + 1, size=rnd.block_size(b))
            out[s, blk == b] = draws[ids[blk == b] - rnd.block_start(b)]
    return out


def label(K) -> str:
    """Short text of ``K`` for titles: ``5``, ``[1,5,20]`` or ``U{1..20}``.

    Parameters
    ----------
    K : int, list of int or mapping
        The ``K`` setting.

    Returns
    -------
    str
    """
    K = _plain(K)
    if isinstance(K, Mapping):
        return f"U{{{K.get('low')}..{K.get('high')}}}"
    if isinstance(K, (list, tuple)):
        return "[" + ",".join(map(str, K)) + "]"
    return str(K)
