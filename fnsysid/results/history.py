"""A run's metrics per round, the rule that stops a run that diverged and the rule that marks a
finished run whose error grew (both runtimes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fnsysid.results.metrics import over_clients, row_means

#: a run diverged when some client's error exceeds this many times the largest start error
DIVERGENCE_FACTOR = 1e3
#: a finished run is growing when some repeat's last error exceeds this many times the largest
#: start error (at least 1)
GROWTH_FACTOR = 10.0
#: a finished run is growing, too, when some repeat's error above max(1, its start) has
#: risen at every one of its last rounds (a share RISING_SHARE of them, at least RISING_MIN)
#: by RISING_FACTOR or more in all, and does not slow down so as to settle below
#: GROWTH_FACTOR times max(1, its start) (:func:`rising`): an error on its way up, not one
#: settling at a level
RISING_SHARE, RISING_MIN, RISING_FACTOR = 0.2, 6, 1.2
#: columns of errors.csv after repeat and round
COLUMNS = ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max",
           "nrmse_sim_mean")


def growth_limit(start: float) -> float:
    """Largest error a run may reach: ``DIVERGENCE_FACTOR * max(1, start)`` with ``start`` the
    largest error at round 0."""
    return DIVERGENCE_FACTOR * max(1.0, start)


def errors_diverged(e: np.ndarray, limit: float, norm: np.ndarray | None = None) -> bool:
    """Whether parameter errors ``e`` (..., M) show divergence: not finite, or above ``limit``.

    With ``norm`` (..., M), the norms ``||theta_i*||`` of the clients' true parameters, each
    relative error is put on the scale of the largest true parameters of its repeat,
    ``e_i ||theta_i*|| / max_j ||theta_j*|| = ||theta_hat - theta_i*|| / max_j ||theta_j*||``:
    a client whose truth is tiny (1e-150) has an enormous relative error from any model of
    the fleet's size, which is not a model that grows.

    >>> errors_diverged(np.array([[0.5, 1e149]]), 1e3, np.array([[1.0, 1e-150]]))
    False
    """
    e = np.asarray(e, float)
    if not np.isfinite(e).all():
        return True
    return not (e.max() if norm is None else fleet_errors(e, norm).max()) <= limit


def fleet_errors(e: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """The largest parameter error of each repeat on the scale of its largest true
    parameters, ``max_i ||theta_hat - theta_i*|| / max_j ||theta_j*||`` (...,), from the
    relative errors ``e`` (..., M) and the norms ``||theta_i*||`` (..., M): what the
    divergence and growth rules read (equal to ``max_i e_i`` when the truths have one
    size)."""
    norm = np.asarray(norm, float)
    return (np.asarray(e, float) * (norm / norm.max(axis=-1, keepdims=True))).max(axis=-1)


def rising_window(rounds: int) -> int:
    """The last rounds :func:`rising` reads of ``rounds`` recorded ones."""
    return max(RISING_MIN, int(np.ceil(RISING_SHARE * rounds)))


def rising(e: np.ndarray, ceiling: float = np.inf) -> float | None:
    """The steady growth factor per round of the errors ``e`` of one repeat's rounds (in
    order; NaN rounds left out) over their last rounds (:data:`RISING_SHARE`, at least
    :data:`RISING_MIN`), or None when they do not rise at every one of them, by
    :data:`RISING_FACTOR` in all, or when their rises slow down so that they settle below
    ``ceiling``: the rises per round (of ``log e``) of the later half against the earlier
    give a geometric slowdown ``rho`` per round, and what they add from the last round on,
    ``d rho / (1 - rho)`` (``d`` the later half's mean rise), must carry the error past
    ``ceiling``. A rise that does not slow down carries it past any. (A rule on the slowdown
    alone, the later half at least 0.9 times the earlier, passed a steady 1.1 a round whose
    rounds zigzag as not growing and called errors that level off at 1.4 growing; over 429000
    round prefixes of the stored experiments this rule flags none that it did not, drops
    five that settle, and flags pendulum repeats at lr 1.9-2.1 that grow to 100-400 or
    diverge.)

    >>> round(rising(1.05 ** np.arange(40)), 3)
    1.05
    >>> rising(2 - 0.9 ** np.arange(40)) is None      # settling at 2
    True
    """
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    w = rising_window(len(e))
    if len(e) < w + 1 or not (e[-w - 1:] > 0).all():
        return None
    d = np.diff(np.log(e[-w - 1:]))                       # w rises
    half = w // 2
    if not (d > 0).all() or e[-1] < RISING_FACTOR * e[-w - 1]:
        return None
    late = d[-half:].mean()
    ratio = late / d[:half].mean()
    if ratio < 1:                              # slowing down: where does it settle?
        rho = ratio ** (1.0 / (w - half))
        if np.log(e[-1]) + late * rho / (1 - rho) < np.log(ceiling):
            return None
    return float(np.exp(d.mean()))


def growth(errors, fleet: dict | None = None) -> dict | None:
    """Whether a run's ``errors`` table (``errors.csv``: a :class:`~fnsysid.results.tables.Table`
    or DataFrame) shows an error that grew: some repeat's error at the last round above
    ``GROWTH_FACTOR * max(1, start)``, ``start`` the largest error at round 0, or above
    ``max(1, start)`` (or ``GROWTH_FACTOR`` times its smallest) and still rising at a steady
    rate (:func:`rising`).

    The error is ``e_max`` when the run has a ground truth, else the held-out one-step NRMSE
    ``nrmse_1step_max`` (the metric the divergence rule reads). Returns None when no repeat
    grew (or the run has neither), else ``{"metric", "start", "final", "repeat", "ratio",
    "factor", "rule", "repeats"}`` of the repeat that grew most: ``rule`` ``limit`` (above
    the factor) or ``rising`` (with ``rate``, its growth per round, and ``rounds``, the rounds
    read); ``repeats``: every repeat that either rule flags on that metric.

    ``fleet``: ``{"start": (S,), "final": (S,)}``, the parameter errors of round 0 and of the
    last round on the scale of the fleet's largest truth (:func:`fleet_errors`, a
    :class:`History`'s ``fleet``), read instead of ``e_max`` when given: a client whose
    truth is tiny does not make the run grow.
    """
    rounds = np.asarray(errors["round"])
    repeats = np.asarray(errors["repeat"]) if len(rounds) else None
    for metric, e, first, last in _metrics(errors):
        if metric == "e_max" and fleet is not None:        # judged on the fleet's scale
            f_first = np.asarray(fleet["start"], float)
            f_last = np.where(np.isnan(last), np.nan, np.asarray(fleet["final"], float))
        start = float(np.nanmax(first))
        worst = int(np.nanargmax(last))
        limit = max(1.0, start)
        over = last > GROWTH_FACTOR * limit
        if metric == "e_max" and fleet is not None:
            over &= f_last > GROWTH_FACTOR * max(1.0, float(np.nanmax(f_first)))
        ids = repeats[rounds == rounds.max()]
        risen = _still_rising(metric, e, rounds, repeats, start, fleet)
        both = sorted({int(r) for r in ids[over]} | set((risen or {}).get("repeats", [])))
        if over.any():
            worst = int(np.nanargmax(np.where(over, last, np.nan)))
            return {"metric": metric, "start": start, "final": float(last[worst]),
                    "repeat": int(ids[worst]), "ratio": float(last[worst] / limit),
                    "factor": GROWTH_FACTOR, "rule": "limit", "repeats": both}
        if risen is not None:
            risen["repeats"] = both
        return risen
    return None


def _metrics(errors):
    """The error metrics a run has, in the order the rules read them (``e_max`` with a ground
    truth, the held-out one-step NRMSE ``nrmse_1step_max`` with held-out data): each
    ``(metric, e, first, last)``, its rows and those of round 0 and of the last round."""
    rounds = np.asarray(errors["round"])
    if not len(rounds):
        return
    for metric in ("e_max", "nrmse_1step_max"):
        e = np.asarray(errors[metric], dtype=float)
        first, last = e[rounds == 0], e[rounds == rounds.max()]
        if not (np.isnan(first).all() or np.isnan(last).all()):
            yield metric, e, first, last


def above_start(errors, fleet: dict | None = None) -> dict | None:
    """Where no repeat :func:`growth` flags, the repeat whose error at the last round is still
    above ``max(1, start)`` (``start`` the largest error at round 0; on the fleet's scale
    where ``fleet`` gives it, as :func:`growth`) on every metric the run has (``e_max`` with
    a ground truth, the held-out one-step NRMSE ``nrmse_1step_max`` with held-out data): a
    model worse than where the run began and than the zero model, by its parameters and by
    its predictions alike, though neither growing steadily nor above the growth limit
    (``strategy=local`` on the stored ``compare_synthetic``: ``e_max`` 0.65 to 3.54 and
    one-step NRMSE 1.73 to 2.89 over 300 rounds). A parameter error that rises for a while
    as the predictions improve is a hump on the way to convergence, not this (the paper's
    pendulum at M = 1: ``e_max`` 1.0 to 1.6 at round 50, 0.004 at round 1000, while the
    NRMSE falls from the start). ``{"metric", "start", "final", "repeat", "rounds",
    "before", "falling"}`` of the first metric (``rounds``: the last rounds read,
    :func:`rising_window`; ``before``: its error that many rounds before the last;
    ``falling``: lower now), or None."""
    rounds = np.asarray(errors["round"])
    repeats = np.asarray(errors["repeat"]) if len(rounds) else None
    found = []
    for metric, e, first, last in _metrics(errors):
        start = float(np.nanmax(first))
        judged = last
        limit = max(1.0, start)
        if metric == "e_max" and fleet is not None:        # judged on the fleet's scale
            judged = np.where(np.isnan(last), np.nan, np.asarray(fleet["final"], float))
            limit = max(1.0, float(np.nanmax(np.asarray(fleet["start"], float))))
        worst = int(np.nanargmax(judged))
        if not judged[worst] > limit:
            return None                   # one metric the run has is not above its start
        s = repeats[rounds == rounds.max()][worst]
        rows = repeats == s
        es = e[rows][np.argsort(rounds[rows])]
        window = min(rising_window(int(rounds.max())), len(es) - 1)
        before = float(es[-window - 1])
        found.append({"metric": metric, "start": start, "final": float(last[worst]),
                      "repeat": int(s), "rounds": int(window), "before": before,
                      "falling": bool(es[-1] < before)})
    return found[0] if found else None


def above_start_line(a: dict, rounds: int, privacy: bool = False) -> str:
    """The warning of :func:`above_start`'s ``a`` after ``rounds`` rounds: an error still
    coming down (more rounds, or a smaller lr where it oscillates), one still rising though
    not steadily or long enough for :func:`rising` (a smaller lr), or one that is neither
    (rounds that head to a poor model, which more of them do not mend). ``privacy``: the
    run's noise is named first among the causes."""
    few = rounds < RISING_MIN
    head = (f"the run ends with {a['metric']} {a['final']:.4g} at round {rounds} (repeat "
            f"{a['repeat']}), above max(1, its start {a['start']:.4g}): a model worse than "
            "where it began and than the zero model, "
            + (f"in too few rounds ({rounds}) to tell a steady growth" if few
               else "though not growing steadily"))
    was = f"{a['before']:.4g} {a['rounds']} rounds before"
    causes = ("privacy's noise (privacy.moved), then the data, the library (the model check) "
              "or the strategy" if privacy else
              "the data, the library (the model check) or the strategy")
    if a.get("falling"):
        return (f"{head}: still coming down ({was}): more rounds (R), or a smaller lr where it "
                "oscillates (near the largest stable lr)")
    if a["final"] > RISING_FACTOR * a["before"]:
        return (f"{head}, and rising ({was}): more rounds would take it further; a smaller lr "
                f"(rounds that overshoot), else {causes}")
    return (f"{head}, and not coming down ({was}): the rounds head to a poor model, which "
            f"more of them do not mend (with strategy=local, each client's own data; else "
            f"{causes})")


def growth_line(g: dict, rounds: int, advice: str) -> str:
    """The log line of a ``growing`` run from :func:`growth`'s ``g``, ending with ``advice``
    (:func:`fnsysid.app.cli.lr_advice`)."""
    head = (f"run growing: {g['metric']} {g['final']:.4g} at round {rounds} (repeat "
            f"{g['repeat']}) is {g['ratio']:.3g} times max(1, its start {g['start']:.4g})")
    why = (f", above the limit of {g['factor']:g} times" if g.get("rule", "limit") == "limit"
           else f", and has risen at every one of the last {g['rounds']} rounds, "
           f"{g['rate']:.3g} times a round")
    return f"{head}{why}: not a converged result (status: growing); {advice}"


def _still_rising(metric, e, rounds, repeats, start, fleet) -> dict | None:
    """:func:`growth`'s second rule: the repeat whose error ``e`` (the rows of ``errors``) is
    above ``max(1, start)`` at its last round (the fleet's scale, as the first rule, where
    ``fleet`` gives it) or :data:`GROWTH_FACTOR` times its smallest, and :func:`rising` over
    its last rounds."""
    limit = max(1.0, start)
    scaled = metric == "e_max" and fleet is not None      # the fleet's scale, as above
    if scaled:
        f_final = np.asarray(fleet["final"], float)
        f_limit = max(1.0, float(np.nanmax(np.asarray(fleet["start"], float))))
    found, every = None, []
    for s in np.unique(repeats):
        rows = repeats == s
        order = np.argsort(rounds[rows])
        es = e[rows][order]
        es = es[np.isfinite(es)]                         # the rounds it recorded
        if not len(es):
            continue
        final = es[-1]
        above = f_final[int(s)] > f_limit if scaled else final > limit
        # or risen GROWTH_FACTOR times from its best round: an error that fell far below its
        # start and turned back up at a steady rate is on its way out too
        above = above or final >= GROWTH_FACTOR * np.nanmin(es)
        rate = rising(es, GROWTH_FACTOR * limit) if above else None
        if rate is not None:
            every.append(int(s))
        if rate is not None and (found is None or final / limit > found["ratio"]):
            found = {"metric": metric, "start": start, "final": float(final),
                     "repeat": int(s), "ratio": float(final / limit),
                     "factor": GROWTH_FACTOR, "rule": "rising", "rate": rate,
                     "rounds": rising_window(len(es))}
    if found is not None:
        found["repeats"] = every
    return found


class Repeats:
    """Which repeats of a run diverged and at which round (both runtimes judge alike): a repeat
    that diverges is left out from then on (its rows NaN, :meth:`blank`) and the others run
    on; the run stops when every repeat diverged, or at the first under ``stop_at_first``
    (``sparsity``)."""

    def __init__(self, S: int, stop_at_first: bool = False):
        self.dead = np.zeros(S, dtype=bool)
        self.diverged_at: list = [None] * S
        self.stop_at_first = stop_at_first

    def judge(self, r: int, bad: np.ndarray) -> bool:
        """Mark the repeats ``bad`` (S,) that diverge at round ``r``; whether the run stops."""
        for s in np.flatnonzero(bad & ~self.dead).tolist():
            self.diverged_at[s] = r
        self.dead[bad] = True
        return bool(self.dead.all() or (self.stop_at_first and self.dead.any()))

    def blank(self, a):
        """``a`` (S, ...) with NaN in the rows of the repeats that diverged."""
        if a is None or not self.dead.any():
            return a
        return np.where(self.dead.reshape(-1, *([1] * (np.ndim(a) - 1))), np.nan, a)


@dataclass
class History:
    """Metrics per round, each a list of (S,) arrays (max and mean over clients), and
    optionally the per-client parameter errors."""

    rows: dict = field(default_factory=lambda: {c: [] for c in COLUMNS})
    per_client: list | None = None
    #: the clients' personalized models sent after the last round under runtime=flower
    #: (:class:`fnsysid.results.personal.Personal`), None otherwise
    personal: object | None = None
    #: the model check combined from the clients' statistics after the last round under
    #: runtime=flower (:func:`fnsysid.results.modelcheck.combine`), None otherwise
    model_check: dict | None = None
    #: the round at which each repeat diverged (None where it did not), or None where the
    #: runtime stops a run at its first divergence (runtime=flower)
    diverged_at: list | None = None
    #: ``{"start", "final"}``: the parameter errors of round 0 and of the last round on the
    #: fleet's scale (:func:`fleet_errors`, each (S,)), for :func:`growth`; None without truth
    fleet: dict | None = None

    @property
    def e_max(self) -> list:
        return self.rows["e_max"]

    @property
    def e_mean(self) -> list:
        return self.rows["e_mean"]

    def record(self, e: np.ndarray, one_step=None, free_run=None, valid=None) -> None:
        """Record parameter errors ``e`` (S, M) and, if given, NRMSE (S, M) of valid clients."""
        self.add(e.max(axis=1), row_means(e),
                 None if one_step is None else over_clients(one_step, valid),
                 None if free_run is None else over_clients(free_run, valid))
        if self.per_client is not None:
            self.per_client.append(e.copy())

    def add(self, e_max: np.ndarray, e_mean: np.ndarray, one_step=None, free_run=None) -> None:
        """Record a round from its maxima and means over clients (each (S,)); ``one_step`` and
        ``free_run`` are (max, mean) pairs or None (NaN rows)."""
        self.rows["e_max"].append(e_max)
        self.rows["e_mean"].append(e_mean)
        for name, v in (("nrmse_1step", one_step), ("nrmse_sim", free_run)):
            vmax, vmean = v if v is not None else (np.full(len(e_max), np.nan),) * 2
            self.rows[name + "_max"].append(vmax)
            self.rows[name + "_mean"].append(vmean)



def keep_per_client(settings, M: int | None = None) -> bool:
    """Whether per-client errors are kept (``output.per_client``: auto, true or false)."""
    flag = settings.output.per_client
    if flag == "auto":
        M = settings.M if M is None else M
        return M is None or M <= settings.output.per_client_max     # None: files not read yet
    return bool(flag)
