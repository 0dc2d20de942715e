"""What a run sends between the clients and the server (``summary.json``'s ``communication``).

Each strategy declares what one client sends up (client -> server) and receives down
(server -> client) in one repeat, as arrays of float64 (8 bytes a number) named with their
shapes: :meth:`fnsysid.learning.strategies.Strategy.payload` gives a :class:`Plan`, the
arrays of one round (``round``, per participating client) and those sent once before the
first round (``start``, every client). :func:`plan_of` adds what the run's other settings
send (``sparsity``: the statistics that choose the support and the support itself;
``personalize``: the exchanges after the last round, ``end``) and :func:`account`
multiplies by the rounds run and the clients taking part in each (``strategy.fraction``).
docs/guide/outputs.md ("Communication") lists what each strategy sends.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

#: the numbers' type on the wire and its size in bytes
DTYPE, ITEMSIZE = "float64", 8


@dataclasses.dataclass(frozen=True)
class Payload:
    """Arrays one client sends ``up`` and receives ``down`` at one stage, in one repeat.

    Parameters
    ----------
    up : tuple of (str, tuple of int), default=()
        The arrays sent, as (name, shape).
    down : tuple of (str, tuple of int), default=()
        The arrays received.
    messages_up : int, default=0
        The messages that carry ``up`` (a strategy with two exchanges a round sends two each
        way).
    messages_down : int, default=0
        The messages that carry ``down``.
    """

    up: tuple = ()
    down: tuple = ()
    messages_up: int = 0
    messages_down: int = 0

    def bytes_up(self) -> int:
        return ITEMSIZE * sum(math.prod(s) for _, s in self.up)

    def bytes_down(self) -> int:
        return ITEMSIZE * sum(math.prod(s) for _, s in self.down)

    def __add__(self, other: Payload) -> Payload:
        return Payload(self.up + other.up, self.down + other.down,
                       self.messages_up + other.messages_up,
                       self.messages_down + other.messages_down)

    def describe(self, stage: str) -> list[str]:
        """Lines such as ``per round, down: theta (9)``."""
        out = []
        for way, arrays in (("up", self.up), ("down", self.down)):
            if arrays:
                out.append(f"{stage}, {way}: " + ", ".join(
                    f"{n} ({'x'.join(map(str, s))})" for n, s in arrays))
        return out


def exchange(down=(), up=()) -> Payload:
    """One message each way.

    Parameters
    ----------
    down : tuple of (str, tuple of int), default=()
        The arrays received, as (name, shape).
    up : tuple of (str, tuple of int), default=()
        The arrays sent.

    Returns
    -------
    Payload
    """
    return Payload(tuple(up), tuple(down), 1, 1)


def upload(*arrays) -> Payload:
    """One message up (none down).

    Parameters
    ----------
    *arrays : tuple of (str, tuple of int)
        The arrays sent, as (name, shape).

    Returns
    -------
    Payload
    """
    return Payload(tuple(arrays), (), 1, 0)


NOTHING = Payload()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one client sends and receives in one repeat.

    Parameters
    ----------
    round : Payload, default=NOTHING
        In each round the client takes part in.
    start : Payload, default=NOTHING
        Once before the first round (every client).
    end : Payload, default=NOTHING
        Once after the last round (every client).
    note : str or None, default=None
        Why the plan is not known (then the run's summary says so instead of numbers).
    """

    round: Payload = NOTHING
    start: Payload = NOTHING
    end: Payload = NOTHING
    note: str | None = None

    def describe(self) -> list[str]:
        return (self.start.describe("once before round 1")
                + self.round.describe("per round") + self.end.describe("once after the rounds"))


#: the members of a strategy that decide what it sends: a class that takes one of them from
#: elsewhere than the class defining its ``payload`` has no declared payload
SENDING_RULES = ("exchanges", "message", "client_update", "round")


def owner(cls: type, name: str) -> type | None:
    """The class in ``cls``'s method resolution order that defines ``name``.

    Parameters
    ----------
    cls : type
    name : str
        An attribute's name.

    Returns
    -------
    type or None
        None when no class defines it.
    """
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _declared(strategy) -> str | None:
    """Why ``strategy``'s declared payload may not be its own: a class that overrides an
    update rule of the class whose :meth:`payload` it inherits (what it sends may differ),
    None when its payload is declared by the class that defines its rules."""
    cls = type(strategy)
    base = owner(cls, "payload")
    changed = [n for n in SENDING_RULES
               if owner(cls, n) is not None and owner(cls, n) is not owner(base, n)]
    if not changed:
        return None
    return (f"{cls.__qualname__} overrides {', '.join(changed)} of {base.__name__} but "
            f"declares no payload of its own (define {cls.__qualname__}.payload)")


def plan_of(strategy, p: int, model=None, sparsity=None, personalize: str = "none") -> Plan:
    """The run's :class:`Plan`: ``strategy.payload(p)`` for ``p`` parameters, plus

    - ``sparsity`` (an object with ``support``): once before round 1 each client sends its
      statistics ``H`` (p x p), ``b`` (p) and its targets' sums of squares ``yy`` (n_y) (with
      ``threshold=auto`` also its held-out ``hgram`` (n_phi x n_phi), ``hcross``
      (n_y x n_phi), ``hyy`` (n_y) and ``hn`` (1), whose sums score the candidates), and
      receives the support (p, as 0/1) once; a federated strategy's server sends the support
      with every message instead (as the Flower runtime does, so a client that restarts
      sees it);
    - ``personalize=auto``: after the last round each client sends its statistics ``H``,
      ``b``, residual sums of squares and degrees of freedom (one each per group of targets,
      g) and whether its data determine its own model (1), and receives the fleet's ``mu``
      (p), ``cov_mu``, ``Sigma``, ``Sigma_ci`` (p x p each), ``s2`` (g) and the parameter
      scale it was estimated in (p); with ``sparsity`` also the support (p) with the request
      for its statistics and with the fleet, and the statistics and the fleet's arrays are
      those of the kept terms alone (k, the most terms a repeat keeps, in place of p);
      ``personalize=finetune``: each client receives the final server model (p).

    Parameters
    ----------
    strategy : fnsysid.learning.strategies.Strategy
        The run's strategy (its ``payload``).
    p : int
        The model's parameters.
    model : fnsysid.dynamics.model.Model or None, default=None
        The model (its targets, for ``sparsity`` and ``personalize``).
    sparsity : object or None, default=None
        The run's sparsity (:class:`fnsysid.learning.sparsity.STLSQ`); None: none.
    personalize : str, default="none"
        The ``personalize`` option.

    Returns
    -------
    Plan
    """
    why = _declared(strategy)
    if why is not None:
        return Plan(note=why)
    plan = strategy.payload(p)
    if plan.note is not None:
        return plan
    start, rnd, end = plan.start, plan.round, plan.end
    if sparsity is not None:
        n_y, n_phi = (int(v) for v in np.shape(model.structure)[:2])
        start = start + upload(("H", (p, p)), ("b", (p,)), ("yy", (n_y,)))
        if getattr(sparsity, "auto", False):    # the held-out sums that score the candidates
            start = start + Payload((("hgram", (n_phi, n_phi)), ("hcross", (n_y, n_phi)),
                                     ("hyy", (n_y,)), ("hn", (1,))))     # the same message
        federated = getattr(strategy, "exchanges", None) is not None   # message exchanges
        if federated and rnd.messages_down:
            rnd = rnd + Payload((), (("support", (p,)),) * rnd.messages_down)
        else:
            start = start + Payload((), (("support", (p,)),), 0, 1)
    if personalize == "auto":
        from fnsysid.learning.personalize import noise_blocks

        g = int(noise_blocks(model.structure).g)
        # with sparsity the statistics and the fleet are those of the kept terms alone (the
        # most kept in a repeat, k: the repeats share a message)
        k = p if sparsity is None else int(np.asarray(sparsity.support, bool)
                                           .sum(axis=-1).max(initial=0))
        end = end + Payload((("H", (k, k)), ("b", (k,)), ("rss", (g,)), ("dof", (g,)),
                             ("own", (1,))),
                            (("mu", (k,)), ("cov_mu", (k, k)), ("Sigma", (k, k)),
                             ("s2", (g,)), ("Sigma_ci", (k, k)), ("scale", (k,))), 1, 1)
        if sparsity is not None:        # the support with both requests (group sparsity)
            end = end + Payload((), (("support", (p,)),) * 2, 0, 1)
    elif personalize == "finetune":
        end = end + Payload((), (("theta", (p,)),), 0, 1)
    return Plan(rnd, start, end)


def participants(strategy, rounds: int, M: int, S: int) -> np.ndarray:
    """Clients taking part in each of rounds 1..``rounds`` per repeat: all M unless
    ``strategy.fraction`` < 1, then ``max(1, round(fraction M))`` or, under privacy's
    Poisson sampling, the count of the round's own draw (the strategy's ``participants``).

    Parameters
    ----------
    strategy : fnsysid.learning.strategies.Strategy
        The run's strategy.
    rounds : int
        The rounds R.
    M : int
        The clients.
    S : int
        The repeats.

    Returns
    -------
    numpy.ndarray of int, shape (S, rounds)
    """
    fraction = float(getattr(strategy, "fraction", 1.0))
    if fraction >= 1.0 or rounds == 0:
        return np.full((S, rounds), M, dtype=float)
    if getattr(strategy, "privacy", None) is None:
        return np.full((S, rounds), max(1, int(round(fraction * M))), dtype=float)
    return np.stack([strategy.participants(r).sum(axis=1) for r in range(1, rounds + 1)],
                    axis=1).astype(float)


def account(plan: Plan, taking_part: np.ndarray, M: int) -> dict:
    """``summary.json``'s ``communication`` from a :class:`Plan` and the clients taking part
    in each round run, ``taking_part`` (S, rounds) (:func:`participants`), with ``M``
    clients. Totals are per repeat (the mean over repeats where participation differs);
    ``cumulative`` (S, rounds + 1) the bytes up and down per client (mean over the clients)
    after each round, round 0 holding what was sent before the first round (the ``end``
    exchanges come after the last round and are in the totals only).

    Parameters
    ----------
    plan : Plan
        What a client sends and receives (:func:`plan_of`).
    taking_part : numpy.ndarray of int, shape (S, rounds)
        The clients taking part in each round run (:func:`participants`).
    M : int
        The clients.

    Returns
    -------
    dict
        The summary (``cumulative`` under the key ``_cumulative``, for errors.csv).
    """
    if plan.note is not None:
        return {"declared": False, "note": plan.note}
    r, s, e = plan.round, plan.start, plan.end
    S, R = taking_part.shape
    clients_rounds = taking_part.sum(axis=1)                     # (S,)
    up = s.bytes_up() * M + r.bytes_up() * clients_rounds + e.bytes_up() * M
    down = s.bytes_down() * M + r.bytes_down() * clients_rounds + e.bytes_down() * M
    msgs = ((s.messages_up + s.messages_down + e.messages_up + e.messages_down) * M
            + (r.messages_up + r.messages_down) * clients_rounds)
    per_round = (r.bytes_up() + r.bytes_down()) * taking_part / M   # mean over clients
    cumulative = np.concatenate([np.full((S, 1), float(s.bytes_up() + s.bytes_down())),
                                 s.bytes_up() + s.bytes_down() + np.cumsum(per_round, axis=1)],
                                axis=1)
    return {
        "declared": True,
        "dtype": DTYPE, "bytes_per_number": ITEMSIZE,
        "per": "repeat",
        "up_bytes_per_client_round": r.bytes_up(),
        "down_bytes_per_client_round": r.bytes_down(),
        "up_bytes_per_client_once": s.bytes_up() + e.bytes_up(),
        "down_bytes_per_client_once": s.bytes_down() + e.bytes_down(),
        "rounds": int(R),
        "clients": int(M),
        "client_rounds": _one(clients_rounds),
        "up_total": _one(up),
        "down_total": _one(down),
        "per_client_total": _one((up + down) / M),
        "messages": _one(msgs),
        "what": plan.describe(),
        "_cumulative": cumulative,
    }


def _one(v: np.ndarray) -> float | int:
    """The mean over repeats, as an int when whole."""
    m = float(np.mean(v))
    return int(m) if m.is_integer() else m
