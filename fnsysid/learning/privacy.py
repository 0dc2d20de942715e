"""Client-level differential privacy (the ``privacy`` config group).

Two runs are neighbours when one has one whole client more (add or remove one client: all its
trajectories). The closed-form strategies release one sum over the clients, once:

- ``centralized_exact``: each client's sufficient statistics ``(H_i, b_i)`` (``Phi_i^T Phi_i``
  and ``Phi_i^T Y_i`` in parameter space) as one vector whose norm is
  ``sqrt(||H_i||_F^2 + ||b_i||^2)``, scaled down to norm ``clip`` when it is longer; the server
  solves the noisy sums after raising the Gram matrix's eigenvalues to a floor;
- ``oneshot``: each client's own least-squares estimate ``theta_i``, clipped to norm ``clip``,
  with the count of clients that have one (weight ``clip``); the server divides the noisy sum
  by the noisy count.

``central``: the server (trusted) adds Gaussian noise of standard deviation
``noise_multiplier * sensitivity`` to the sum (sensitivity ``clip``; ``sqrt(2) clip`` for
``oneshot``, whose count rides along); ``local``: every client adds that noise to its own
clipped contribution before sending it, with the sensitivity of replacing its data
(``2 clip``; ``2 sqrt(2) clip`` for ``oneshot``), so the sum carries ``M`` times the variance.
The sum of the clients' independent Gaussian noises is drawn as one Gaussian of that variance
(the same distribution, without M draws). Symmetric matrices get symmetric noise: the
Gaussian mechanism on the vector ``(H_ii, sqrt(2) H_ij (i < j))``, whose norm is ``||H||_F``,
i.e. variance ``sigma^2`` on the diagonal and ``sigma^2 / 2`` off it.

The privacy loss is accounted by Google's ``dp-accounting`` package (optional extra
``privacy``): the noise multiplier is solved for the targets ``epsilon, delta`` or, given,
its ``epsilon`` is reported. The derivation and what is and is not protected:
docs/PRIVACY.md.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from fnsysid.config.errors import ConfigError
from fnsysid.dynamics import random as rnd

log = logging.getLogger("fnsysid")

MODES = ("none", "central", "local")
ACCOUNTANTS = ("pld", "rdp")
#: purpose of the privacy noise streams (see :mod:`fnsysid.dynamics.random`)
NOISE = 6
#: largest noise multiplier the solver searches (a target that needs more is refused)
MAX_NOISE_MULTIPLIER = 1.0e4
#: smallest one (a target it already meets runs with it: below, epsilon exceeds 10 for one
#: release and the privacy loss distribution grows past memory)
MIN_NOISE_MULTIPLIER = 0.5
#: share of clipped contributions above which a run warns (most contributions clipped)
MOST_CLIPPED = 0.5
#: ``noise_share_of`` under DP-FedAvg: one round's noise against the final model, a lower
#: bound of the rounds' (which add up: to at most R times its energy where the rounds do not
#: contract it)
FINAL_MODEL = "the final model (one round's noise; the R rounds' add up to more)"

#: a release whose noise makes up this share of it or more (:meth:`Privacy.released`) makes
#: the estimate mostly noise
NOISE_SHARE_LEVEL = 0.5
#: under this share of the contributions clipped, the clip is above (nearly) all of them:
#: a smaller one would add less noise
FEW_CLIPPED = 0.01
#: privacy that moves the estimate by this much or more, relative to its norm
#: (:meth:`Privacy.compare`; under Flower one round's noise, :meth:`Privacy.model_share`): a
#: warning
MOVED_LEVEL = 0.1
#: what a run whose plain rounds diverge is told (``privacy.plain_diverged``)
PLAIN_DIVERGED = ("the same rounds without clipping or noise diverge: clipping keeps this "
                  "run bounded")


def noise_formula(mode: str | None) -> str:
    """The noise's standard deviation on a released sum, in words, for ``mode`` (local: each
    client's own noise, with the sensitivity of replacing its data)."""
    return ("2 sqrt(M) privacy.clip times the noise multiplier" if mode == "local"
            else "privacy.clip times the noise multiplier")


def dp_accounting():
    """The ``dp_accounting`` module.

    Returns
    -------
    module

    Raises
    ------
    fnsysid.config.errors.ConfigError
        In one line saying how to install it, when it is missing.
    """
    try:
        import dp_accounting as dpa
    except ImportError:
        raise ConfigError("privacy=central and privacy=local need the dp-accounting package: "
                          "pip install -e '.[privacy]' (or privacy=none)") from None
    return dpa


#: the PLD accountant's discretization of the privacy loss (its epsilon is an upper bound,
#: here within about 1e-6 of the one at its default 1e-4, ten times faster)
PLD_INTERVAL = 1e-3


#: the RDP accountant's orders: integers (its default fractional orders near 1 fail to
#: converge for sampled Gaussians with noise multiplier about 1 and are dropped with a warning)
RDP_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 256, 512)


def accountant(name: str):
    """A fresh accountant of ``dp_accounting``, add-or-remove-one neighbours.

    Parameters
    ----------
    name : {"pld", "rdp"}
        Privacy loss distributions or Renyi DP.

    Returns
    -------
    dp_accounting.PrivacyAccountant
    """
    dpa = dp_accounting()
    if name == "pld":
        return dpa.pld.PLDAccountant(value_discretization_interval=PLD_INTERVAL)
    return dpa.rdp.RdpAccountant(orders=RDP_ORDERS)


def dp_event(noise_multiplier: float, rounds: int = 1, sampling_rate: float = 1.0):
    """The event of ``rounds`` Gaussian releases, each on a Poisson sample of the clients.

    Parameters
    ----------
    noise_multiplier : float
        The noise's standard deviation over the sensitivity.
    rounds : int, default=1
        The releases.
    sampling_rate : float, default=1.0
        Each client's probability to be sampled (1: every client).

    Returns
    -------
    dp_accounting.DpEvent
    """
    dpa = dp_accounting()
    event = dpa.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1.0:
        event = dpa.PoissonSampledDpEvent(sampling_rate, event)
    return dpa.SelfComposedDpEvent(event, rounds) if rounds > 1 else event


@functools.lru_cache(maxsize=256)
def spent_epsilon(noise_multiplier: float, delta: float, rounds: int = 1,
                  sampling_rate: float = 1.0, name: str = "pld") -> float:
    """Epsilon at ``delta`` of :func:`dp_event` (cached: a run plans its mechanism in its
    pre-run check and again when it starts).

    Parameters
    ----------
    noise_multiplier : float
        The noise's standard deviation over the sensitivity.
    delta : float
        The target delta.
    rounds : int, default=1
        The releases.
    sampling_rate : float, default=1.0
        Each client's probability to be sampled.
    name : {"pld", "rdp"}, default="pld"
        The accountant.

    Returns
    -------
    float
    """
    acc = accountant(name)
    acc.compose(dp_event(noise_multiplier, rounds, sampling_rate))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def solve_noise_multiplier(epsilon: float, delta: float, rounds: int = 1,
                           sampling_rate: float = 1.0, name: str = "pld") -> float:
    """The smallest noise multiplier from :data:`MIN_NOISE_MULTIPLIER` on whose
    :func:`spent_epsilon` is at most ``epsilon`` (``dp_accounting.calibrate_dp_mechanism``,
    within 0.1 %); refused in one line when even :data:`MAX_NOISE_MULTIPLIER` does not meet it.

    The search starts from a bracket around a cheap guess: for one release of every client
    the analytic Gaussian mechanism's sigma (``dp_accounting.get_sigma_gaussian``, exact for
    it), otherwise the RDP accountant's answer (an upper bound of the PLD one); the full
    range is searched when the guess does not bracket the answer.

    Parameters
    ----------
    epsilon : float
        The target epsilon.
    delta : float
        The target delta.
    rounds : int, default=1
        The releases.
    sampling_rate : float, default=1.0
        Each client's probability to be sampled.
    name : {"pld", "rdp"}, default="pld"
        The accountant.

    Returns
    -------
    float

    Raises
    ------
    fnsysid.config.errors.ConfigError
        When even :data:`MAX_NOISE_MULTIPLIER` spends more than ``epsilon``.
    """
    dpa = dp_accounting()

    def spent(z):
        return spent_epsilon(z, delta, rounds, sampling_rate, name)

    if rounds == 1 and sampling_rate >= 1.0:
        guess = float(dpa.get_sigma_gaussian(epsilon, delta))
        lo, hi = guess, 1.02 * guess
    else:
        guess = MAX_NOISE_MULTIPLIER
        lo, hi = 0.5 * guess, guess
    lo, hi = max(lo, MIN_NOISE_MULTIPLIER), min(max(hi, MIN_NOISE_MULTIPLIER),
                                                MAX_NOISE_MULTIPLIER)
    if spent(hi) > epsilon:
        hi = MAX_NOISE_MULTIPLIER
        if spent(hi) > epsilon:
            raise ConfigError(
                f"privacy.epsilon={epsilon} with privacy.delta={delta} cannot be met over "
                f"{rounds} release(s) at sampling rate {sampling_rate:g}: even noise "
                f"multiplier {MAX_NOISE_MULTIPLIER:g} spends more; allowed: a larger "
                "privacy.epsilon or privacy.delta, or fewer releases")
    if spent(lo) <= epsilon:
        if lo == MIN_NOISE_MULTIPLIER:
            return lo
        lo = MIN_NOISE_MULTIPLIER
        if spent(lo) <= epsilon:
            return lo
    z = dpa.calibrate_dp_mechanism(
        lambda: accountant(name), lambda s: dp_event(s, rounds, sampling_rate), epsilon, delta,
        dpa.ExplicitBracketInterval(lo, hi), tol=1e-3 * lo)
    return float(z)


class Privacy:
    """The run's mechanism: its settings, the noise multiplier it uses, and what it clipped.

    Parameters
    ----------
    name : {"central", "local"}
        ``central``: a trusted server adds the noise; ``local``: each client adds its own.
    clip : float
        The bound on the norm of a client's contribution.
    delta : float
        The target delta.
    epsilon : float or None, default=None
        The target epsilon; exactly one of ``epsilon`` and ``noise_multiplier`` is given.
    noise_multiplier : float or None, default=None
        The standard deviation of the noise over the sensitivity.
    accountant : {"pld", "rdp"}, default="pld"
        ``pld``: privacy loss distributions (tight); ``rdp``: Renyi DP.
    """

    def __init__(self, name: str, clip: float, delta: float, epsilon: float | None = None,
                 noise_multiplier: float | None = None, accountant: str = "pld"):
        if name not in MODES[1:]:
            raise ValueError(f"privacy={name}; allowed: {', '.join(MODES)}")
        if (epsilon is None) == (noise_multiplier is None):
            raise ConfigError(
                "privacy.epsilon and privacy.noise_multiplier: exactly one must be given (the "
                "other null); allowed: privacy.epsilon=E (the noise is solved for it) or "
                "privacy.epsilon=null privacy.noise_multiplier=Z (epsilon is reported)")
        self.mode, self.clip, self.delta = name, float(clip), float(delta)
        self.target_epsilon = None if epsilon is None else float(epsilon)
        self.noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)
        self.accountant = accountant
        self.rounds, self.sampling_rate, self.participation = 1, 1.0, 1.0
        self.clients: int | None = None
        self.epsilon: float | None = None
        self.mechanism = ""
        self.clipped_fraction: float | None = None
        self._clipped = np.zeros(2)            # clipped, total contributions
        self.epsilon_by_round: np.ndarray | None = None
        self.noise_share: float | None = None
        self.round_noise_sd: float | None = None
        self.moved: float | None = None
        self.moved_by: str | None = None       # estimator, rounds or round_noise
        self.clip_moved: float | None = None
        self.noise_moved: float | None = None
        self.noise_bound: float | None = None
        self.plain_diverged = False
        self.of = "the released sums"          # what noise_share is a share of

    def plan(self, rounds: int, sampling_rate: float, mechanism: str,
             clients: int | None = None) -> None:
        """Fix the noise multiplier for ``rounds`` releases at ``sampling_rate`` (solved for
        the target epsilon, or the given one's epsilon computed); refused in one line when
        the target cannot be met. Call before the run. ``local``: every round is accounted
        as a release of every client (``sampling_rate`` 1; the clients' rate is kept as
        ``participation``), since the server sees which clients send: amplification by
        subsampling assumes that whether a client took part is hidden."""
        dp_accounting()
        self.clients = clients
        self.participation = float(sampling_rate)
        if self.mode == "local":
            # each client's message is its own release, and the server sees who sends: not
            # taking part hides nothing about a client that did, so sampling amplifies
            # nothing; every round is counted (an upper bound: a client may take part in each)
            sampling_rate = 1.0
        self.rounds, self.sampling_rate, self.mechanism = int(rounds), float(sampling_rate), \
            mechanism
        if self.noise_multiplier == 0.0:           # no noise: no privacy, said so
            self.epsilon = None
            return
        if self.noise_multiplier is not None and self.noise_multiplier < MIN_NOISE_MULTIPLIER:
            raise ConfigError(
                f"privacy.noise_multiplier={self.noise_multiplier:g} is not allowed: below "
                f"{MIN_NOISE_MULTIPLIER} epsilon exceeds 10 a release; allowed: 0 (no noise, "
                f"no privacy) or a number >= {MIN_NOISE_MULTIPLIER}")
        if self.noise_multiplier is None:
            self.noise_multiplier = solve_noise_multiplier(
                self.target_epsilon, self.delta, self.rounds, self.sampling_rate,
                self.accountant)
        self.epsilon = spent_epsilon(self.noise_multiplier, self.delta, self.rounds,
                                     self.sampling_rate, self.accountant)
        if self.rounds > 1:
            self.epsilon_by_round = rdp_epsilons(self.noise_multiplier, self.delta,
                                                 self.rounds, self.sampling_rate)

    def clip_factors(self, norms: np.ndarray, bound: float | None = None,
                     count: bool = True) -> np.ndarray:
        """Scale factors ``min(1, bound / norm)`` (bound: ``clip``) of contributions with
        ``norms``; counts the clipped ones (unless ``count`` is false)."""
        bound = self.clip if bound is None else bound
        norms = np.asarray(norms, float)
        if count:
            self._clipped += (float((norms > bound).sum()), float(norms.size))
            self.clipped_fraction = float(self._clipped[0] / self._clipped[1])
        with np.errstate(divide="ignore"):
            return np.minimum(1.0, bound / norms)

    def sigma(self, sensitivity: float, senders) -> np.ndarray:
        """Standard deviation of the noise on the sum, (S,) for ``senders`` (S,) clients:
        ``z * sensitivity`` (central), or ``z * 2 sensitivity * sqrt(senders)`` (local: each
        client's own noise, with the sensitivity of replacing its data)."""
        z = self.noise_multiplier
        if not z:                          # no noise (also for an unbounded clip)
            return np.zeros(np.shape(senders))
        if self.mode == "central":
            return np.full(np.shape(senders), z * sensitivity)
        return z * 2.0 * sensitivity * np.sqrt(np.asarray(senders, float))

    def noise(self, seed: int, release: int, shape: tuple, sigma: np.ndarray,
              symmetric: bool = False) -> np.ndarray:
        """Gaussian noise (S, *shape), repeat s with standard deviation ``sigma[s]``, from
        the repeat's own stream for ``release``; ``symmetric``: matrices (p, p) with variance
        ``sigma^2`` on the diagonal and ``sigma^2 / 2`` off it (Frobenius geometry)."""
        out = np.empty((len(sigma), *shape))
        for s, sd in enumerate(np.asarray(sigma, float)):     # one stream per repeat
            g = rnd.stream(seed, NOISE, s, release).standard_normal(shape)
            out[s] = sd * (0.5 * (g + np.swapaxes(g, -1, -2)) if symmetric else g)
        return out

    def round_noise(self, sd: float) -> None:
        """Record the standard deviation per coefficient of the noise a DP-FedAvg round adds
        to the model (:attr:`round_noise_sd`, the largest over the rounds)."""
        self.round_noise_sd = sd if self.round_noise_sd is None else max(self.round_noise_sd, sd)

    def released(self, value: np.ndarray, sigma: np.ndarray, dims: int) -> None:
        """Record what share of a noisy release (S, ...) its noise makes up: the noise's
        expected energy ``sigma^2 dims`` (``sigma`` (S,), ``dims`` the dimensions it lies in)
        over the released value's ``||value||^2``, at most 1, the largest over the repeats
        and the releases (:attr:`noise_share`). It reads the released value and the noise's
        known variance alone (post-processing: it costs no privacy). About 1: the release
        is noise; the estimate made from it too."""
        S = len(sigma)
        energy = np.einsum("si,si->s", np.reshape(value, (S, -1)), np.reshape(value, (S, -1)))
        noise = np.asarray(sigma, float) ** 2 * dims
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(noise > 0, np.minimum(1.0, noise / energy), 0.0)
        share = float(np.nan_to_num(share, nan=1.0).max())
        self.noise_share = share if self.noise_share is None else max(self.noise_share, share)

    def compare(self, private: np.ndarray, plain: np.ndarray, by: str = "estimator",
                clipped: np.ndarray | None = None) -> None:
        """Record how far clipping and noise moved the estimate: ``||private - plain|| /
        ||plain||`` (S, ...), the worst repeat (:attr:`moved`), ``plain`` the same estimator
        (``by="estimator"``: ``oneshot``, ``centralized_exact``) or the same rounds
        (``"rounds"``: DP-FedAvg) on the clients' exact contributions, and ``clipped`` the
        estimator with clipping alone (:attr:`clip_moved`). A simulation's diagnostic, in
        process: it reads what the server of a deployment never sees, and is not itself
        private. The share of the release's energy (:meth:`released`) does not tell it: the
        noise of the sums reaches a coefficient through the inverse of their Gram matrix, so
        a coefficient the data determine loosely takes far more of it than the sums' norm
        shows. A move is not an error: where the plain estimate is itself far from the
        truth, privacy can move it either way."""
        S = len(plain)
        y = np.reshape(plain, (S, -1))

        def rel(a, b=y):
            x = np.reshape(a, (S, -1))
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                d = np.linalg.norm(x - b, axis=1) / np.linalg.norm(y, axis=1)
            return np.nan_to_num(d, nan=np.inf)

        moved = rel(private)
        s = int(np.argmax(moved))                # the worst repeat, and its parts
        self.moved, self.moved_by = float(moved[s]), by
        if by == "rounds" and self.round_noise_sd is not None:
            # all rounds' noise added up without the rounds' contraction, against the plain
            # model (the private one is inflated by that noise): about the most the noise
            # alone could have moved it
            p = np.shape(plain)[-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                b = self.round_noise_sd * np.sqrt(p * self.rounds) / np.linalg.norm(y, axis=1)
            self.noise_bound = float(np.nan_to_num(b, nan=np.inf).max())
        if clipped is not None:                  # clipping alone, and the noise beside it
            self.clip_moved = float(rel(clipped)[s])
            self.noise_moved = float(rel(private, np.reshape(clipped, (S, -1)))[s])

    def model_share(self, model: np.ndarray) -> None:
        """DP-FedAvg (:func:`private_change`): record what share of the final model (S, ...,
        p) the noise of one round makes up, ``round_noise_sd^2 p / ||model||^2``
        (:meth:`released` of the published model: post-processing; the changes of a
        converging run shrink, so their own share would say nothing). Where the plain rounds
        did not give :attr:`moved` (under Flower, or where they diverged with noise on), one
        round's noise against the final model is it (a lower bound: the rounds' noise adds
        up), and ``noise_bound`` that times ``sqrt(R)``. Nothing where the model is not
        finite (a diverged run)."""
        model = np.asarray(model, float)
        if self.round_noise_sd is None or not np.isfinite(model).all():
            return
        self.of = FINAL_MODEL
        self.released(model, np.full(len(model), self.round_noise_sd), model.shape[-1])
        with np.errstate(divide="ignore", invalid="ignore"):      # one round's noise, relative
            ratio = float(np.nan_to_num(self.round_noise_sd * np.sqrt(model.shape[-1])
                                        / np.linalg.norm(model.reshape(len(model), -1), axis=1),
                                        nan=np.inf).max())
        if self.noise_bound is None:     # (the plain rounds' own, where they ran, is better)
            self.noise_bound = ratio * np.sqrt(self.rounds)
        if self.moved is not None or (self.plain_diverged and not self.noise_multiplier):
            return                     # measured; or clipping alone, against diverged rounds
        # under Flower, or where the plain rounds diverged: one round's noise against the
        # final model, a lower bound
        self.moved, self.moved_by = ratio, "round_noise"

    def warn(self) -> None:
        """A warning when most contributions were clipped (``clip`` too small for the data:
        the sum then weighs the clients differently than the plain sum), and when there is
        no noise (``noise_multiplier=0``: epsilon is infinite, reported as null)."""
        if self.noise_multiplier == 0.0:
            log.warning("privacy.noise_multiplier=0: no noise is added, the release is not "
                        "private (privacy.epsilon in summary.json is null: infinite)")
        if self.clients and self.delta * self.clients >= 1.0:
            log.warning("privacy.delta=%g is at least 1/M (M=%d clients): a mechanism that "
                        "publishes one client's data whole with probability delta meets it; "
                        "delta well below 1/M is the usual choice", self.delta, self.clients)
        line = moved_line(self.summary())
        if line:                          # (it gives the clipped share and what to do)
            log.warning("%s", line)
        elif self.plain_diverged:
            log.info("privacy: %s (privacy.plain_diverged)", PLAIN_DIVERGED)
        if self.clipped_fraction is not None and self.clipped_fraction > MOST_CLIPPED \
                and self.plain_diverged:
            log.warning("privacy.clip=%g: %.0f%% of the clients' contributions were clipped "
                        "(privacy.clipped_fraction in summary.json); here clipping keeps the "
                        "rounds bounded (privacy.plain_diverged)", self.clip,
                        100 * self.clipped_fraction)
        elif self.clipped_fraction is not None and self.clipped_fraction > MOST_CLIPPED \
                and not line:
            log.warning("privacy.clip=%g: %.0f%% of the clients' contributions were clipped "
                        "(privacy.clipped_fraction in summary.json); a larger privacy.clip "
                        "clips fewer (and adds noise in proportion)", self.clip,
                        100 * self.clipped_fraction)

    def summary(self) -> dict:
        """What ``summary.json`` holds under ``privacy``."""
        return {"mode": self.mode, "epsilon": self.epsilon, "delta": self.delta,
                "target_epsilon": self.target_epsilon,
                "noise_multiplier": self.noise_multiplier, "clip": self.clip,
                "clipped_fraction": self.clipped_fraction, "mechanism": self.mechanism,
                "accountant": ("dp_accounting PLD (value_discretization_interval="
                               f"{PLD_INTERVAL:g})" if self.accountant == "pld"
                               else "dp_accounting RDP"),
                "rounds": self.rounds, "sampling_rate": self.sampling_rate,
                "participation": self.participation,
                "noise_share": self.noise_share, "noise_share_of": self.of,
                "round_noise_sd": self.round_noise_sd, "moved": self.moved,
                "moved_by": self.moved_by, "clip_moved": self.clip_moved,
                "noise_moved": self.noise_moved, "noise_bound": self.noise_bound,
                "plain_diverged": self.plain_diverged,
                "clients": self.clients}

    def epsilon_column(self, rounds: np.ndarray) -> np.ndarray | None:
        """Epsilon spent up to each of ``rounds`` (errors.csv's ``epsilon_rdp``; 0 at round 0),
        by the RDP accountant round by round (:func:`rdp_epsilons`: an upper bound, above the
        PLD accountant's at the last round); None for one release."""
        if self.epsilon_by_round is None:
            return None
        spent = np.concatenate([[0.0], self.epsilon_by_round])
        return spent[np.minimum(np.asarray(rounds, int), self.rounds)]


def noise_size(priv: dict) -> str:
    """How far privacy moved the estimate, from ``summary.json: privacy`` (``priv``): from the
    same estimator or the same rounds without clipping and noise, or (DP-FedAvg under
    Flower) one round's noise against the final model, a lower bound; with ``mostly noise``
    where the noise makes up :data:`NOISE_SHARE_LEVEL` of the release or more."""
    moved, by = priv.get("moved"), priv.get("moved_by")
    if by == "round_noise":
        what = (f"one round's noise (privacy.round_noise_sd, {priv['round_noise_sd']:.3g} per "
                f"coefficient) is {moved:.3g} times the final model's norm (privacy.moved; a "
                "lower bound: the rounds' noise adds up)")
    else:
        cause = "clipping" if priv.get("noise_multiplier") == 0 else "clipping and noise"
        what = (f"{cause} moved the {'final model' if by == 'rounds' else 'estimate'}"
                f" by {moved:.3g} of its norm from the same "
                f"{'rounds' if by == 'rounds' else 'estimator'} without them (privacy.moved")
        clip = priv.get("clip_moved")
        what += ")" if clip is None else (f"; in that repeat clipping alone {clip:.3g}, the "
                                          f"noise beside it {priv.get('noise_moved'):.3g})")
    if priv.get("plain_diverged"):
        what += f"; {PLAIN_DIVERGED}"
    share = priv.get("noise_share")
    if share is not None and share >= NOISE_SHARE_LEVEL:
        what += f"; the noise makes up {100 * share:.0f}% of {priv.get('noise_share_of')}"
    return what


def moved_line(priv: dict | None) -> str | None:
    """The warning (:meth:`Privacy.warn`) from ``summary.json: privacy`` where privacy moved
    the estimate by :data:`MOVED_LEVEL` of its norm or more, else None: how far
    privacy moved the estimate, and what would move it less as far as the run tells it: more
    clients or a larger epsilon always shrink the noise against the data; a clip above every
    contribution (under :data:`FEW_CLIPPED` of them clipped) adds noise in proportion that a
    smaller clip near their norms would not; where clipping alone moved a closed form more
    than the noise did, or the rounds' noise added up (``noise_bound``) could not have moved
    them half as far, or there is no noise: a larger clip. Nothing else is claimed."""
    moved = (priv or {}).get("moved")
    if moved is None or not moved >= MOVED_LEVEL:
        return None
    fraction = 100 * (priv.get("clipped_fraction") or 0.0)
    clip, noise = priv.get("clip_moved"), priv.get("noise_moved")
    clients = "" if priv.get("clients") is None else f" (M={priv['clients']})"
    bound = priv.get("noise_bound")             # rounds: what the noise could move at most
    clipping = (clip is not None and clip > (noise or 0.0)) or (
        clip is None and bound is not None and bound < moved / 2 and fraction > 0)
    said = []
    if priv.get("noise_multiplier") == 0:
        said.append(f"it is clipping ({fraction:.0f}% of the contributions clipped, "
                    f"privacy.clip {priv.get('clip'):g}; no noise): a larger privacy.clip "
                    "clips fewer")
    elif clipping:
        said.append(f"most of it is clipping ({fraction:.0f}% of the contributions clipped, "
                    f"privacy.clip {priv.get('clip'):g}): a larger privacy.clip clips fewer, "
                    "and adds noise in proportion")
    else:
        said.append(f"the noise's standard deviation is {noise_formula(priv.get('mode'))} (z = "
                    f"{priv.get('noise_multiplier'):.3g}, clip {priv.get('clip'):g}) whatever "
                    f"the data; more clients{clients} or a larger privacy.epsilon shrink it "
                    "against the data")
        if fraction < 100 * FEW_CLIPPED:
            above = ("every contribution" if fraction == 0 else
                     f"all but {fraction:.2g}% of the contributions")
            said.append(f"privacy.clip is above {above}: a smaller clip near their norms "
                        "shrinks the noise in proportion")
        elif clip is None:
            said.append(f"{fraction:.0f}% of the contributions were clipped, which moves it "
                        "too (not told apart from the noise here)")
    return f"privacy: {noise_size(priv)}: {'; '.join(said)}"


def rdp_epsilons(noise_multiplier: float, delta: float, rounds: int,
                 sampling_rate: float) -> np.ndarray:
    """Epsilon at ``delta`` spent after each of rounds 1..``rounds``, by dp-accounting's RDP
    accountant composing one sampled Gaussian round at a time (an upper bound of the PLD
    accountant's).

    Parameters
    ----------
    noise_multiplier : float
        The noise's standard deviation over the sensitivity.
    delta : float
        The target delta.
    rounds : int
        The rounds.
    sampling_rate : float
        Each client's probability to be sampled per round.

    Returns
    -------
    numpy.ndarray, shape (rounds,)
    """
    acc = accountant("rdp")
    step = dp_event(noise_multiplier, 1, sampling_rate)
    out = np.empty(rounds)
    for r in range(rounds):
        acc.compose(step)
        out[r] = acc.get_epsilon(delta)
    return out


def private_change(privacy: Privacy, change: np.ndarray, active: np.ndarray | None,
                   seed: int, r: int, expected: float) -> np.ndarray:
    """DP-FedAvg's server step (McMahan et al. 2018, https://arxiv.org/abs/1710.06963): the
    clients' model changes clipped to norm ``clip``, summed over the active ones, Gaussian
    noise added and divided by the expected number of participants.

    Parameters
    ----------
    privacy : Privacy
        The run's mechanism (its ``clip`` and noise multiplier).
    change : numpy.ndarray, shape (S, M, p)
        The clients' model changes.
    active : numpy.ndarray of bool, shape (S, M), or None
        The clients of the round; None: all.
    seed : int
        The run's root seed.
    r : int
        The round (its own noise stream).
    expected : float
        The expected number of participants (``fraction M``, fixed, so that the division
        reveals nothing).

    Returns
    -------
    numpy.ndarray, shape (S, p)
        The noisy mean change.
    """
    S, M, p = change.shape
    w = privacy.clip_factors(np.linalg.norm(change, axis=-1) if active is None else
                             np.linalg.norm(change, axis=-1)[active])
    if active is not None:
        f = np.zeros((S, M))
        f[active] = w
        w, senders = f, active.sum(axis=1)
    else:
        senders = np.full(S, M)
    sigma = privacy.sigma(privacy.clip, senders)
    # the model's noise each round, per coefficient (the changes shrink as the rounds
    # converge, so a share of the release would say nothing here)
    privacy.round_noise(float(np.max(sigma)) / expected)
    total = np.einsum("sm,smp->sp", w, change) + privacy.noise(seed, 2 + r, (p,), sigma)
    return total / expected


def build_privacy(node: dict | None) -> Privacy | None:
    """The run's privacy object from the ``privacy`` group's node.

    Parameters
    ----------
    node : dict or None
        The ``privacy`` settings (``name`` and :class:`Privacy`'s parameters).

    Returns
    -------
    Privacy or None
        None for ``none``.
    """
    if not node or node.get("name", "none") == "none":
        return None
    return Privacy(**node)


# --- the closed-form releases -------------------------------------------------------------

def eigen_floor(p: int, sigma: np.ndarray) -> np.ndarray:
    """The eigenvalue floor of a noisy Gram matrix: ``sqrt(2 p) sigma``, the spectral norm of
    its symmetric noise (semicircle edge of a p x p matrix with off-diagonal variance
    ``sigma^2 / 2``), below which an eigenvalue is noise.

    Parameters
    ----------
    p : int
        The matrix's size.
    sigma : numpy.ndarray, shape (S,)
        The noise's standard deviation.

    Returns
    -------
    numpy.ndarray, shape (S,)
    """
    return np.sqrt(2.0 * p) * np.asarray(sigma, float)


def repaired_solve(H: np.ndarray, b: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """``H^-1 b`` after raising the eigenvalues of the symmetric ``H`` to ``floor``: positive
    definite whatever the noise.

    Parameters
    ----------
    H : numpy.ndarray, shape (S, p, p)
        Symmetric (noisy) Gram matrices.
    b : numpy.ndarray, shape (S, p)
        Moments.
    floor : numpy.ndarray, shape (S,)
        The smallest eigenvalue kept (:func:`eigen_floor`).

    Returns
    -------
    numpy.ndarray, shape (S, p)
    """
    lam, V = np.linalg.eigh(H)
    lam = np.maximum(lam, np.asarray(floor, float)[:, None])
    return np.einsum("spk,sk,sqk,sq->sp", V, 1.0 / lam, V, b)


def statistics_bases(structure: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal bases of the spaces the statistics of a model with ``structure`` (n_y,
    n_phi, p) live in: ``H = sum_t G_t^T G_t`` is a linear image of the features' Gram
    ``F = sum_t phi_t phi_t^T`` (``H_pq = sum_jkl S_jkp S_jlq F_kl``), ``b`` one of
    ``Phi^T Y`` (``b_p = sum_jk S_jkp (Phi^T Y)_kj``). For a dense model ``H = I (x) F`` is
    block diagonal with equal blocks: r_H = n_phi^2 of p^2 directions.

    Parameters
    ----------
    structure : numpy.ndarray, shape (n_y, n_phi, p)
        The model's structure.

    Returns
    -------
    U_H : numpy.ndarray, shape (p^2, r_H)
        Columns spanning the image of ``H`` (in the Frobenius inner product of vec(H)).
    U_b : numpy.ndarray, shape (p, r_b)
        Columns spanning the image of ``b``.
    """
    n_y, n_phi, p = structure.shape
    L = np.einsum("jkp,jlq->pqkl", structure, structure).reshape(p * p, n_phi * n_phi)
    Lb = np.einsum("jkp->pkj", structure).reshape(p, n_phi * n_y)

    def basis(A):
        U, sv, _ = np.linalg.svd(A, full_matrices=False)
        return U[:, sv > sv.max(initial=0.0) * max(A.shape) * np.finfo(float).eps]

    return basis(L), basis(Lb)


def symmetric_dims(U: np.ndarray) -> float:
    """The expected energy over ``sigma^2`` of symmetric noise (:meth:`Privacy.noise`,
    ``symmetric``) projected onto the span of ``U`` (p^2, r) (:func:`project`):
    ``vec(E)`` has covariance ``sigma^2 (I + K) / 2`` (``K`` the commutation matrix), so
    ``(r + trace(U' K U)) / 2``; ``p (p + 1) / 2`` for ``U = I``.

    >>> symmetric_dims(np.eye(9))
    6.0
    """
    p = int(round(np.sqrt(U.shape[0])))
    Um = U.T.reshape(-1, p, p)
    return float((U.shape[1] + np.einsum("cij,cji->", Um, Um)) / 2)


def project(E: np.ndarray, U: np.ndarray) -> np.ndarray:
    """Orthogonal projection of ``E`` onto the span of ``U``.

    Parameters
    ----------
    E : numpy.ndarray, shape (S, *shape)
        The arrays projected (flattened after the first axis).
    U : numpy.ndarray, shape (prod(shape), r)
        Orthonormal columns.

    Returns
    -------
    numpy.ndarray, shape (S, *shape)
    """
    flat = E.reshape(E.shape[0], -1)
    return ((flat @ U) @ U.T).reshape(E.shape)


def private_statistics(privacy: Privacy, H: np.ndarray, b: np.ndarray, seed: int,
                       structure: np.ndarray | None = None):
    """The noisy sums of the clipped client statistics. With the model's ``structure``, the
    noise is projected onto the spaces every client's statistics lie in
    (:func:`statistics_bases`): the clipped sum lies there too, so the projection is
    post-processing, and it removes the noise outside (for a dense model with n_y targets,
    all but 1 / n_y of the Gram matrix's noise variance).

    Parameters
    ----------
    privacy : Privacy
        The run's mechanism (its ``clip`` and noise multiplier).
    H : numpy.ndarray, shape (S, M, p, p)
        The clients' Gram matrices.
    b : numpy.ndarray, shape (S, M, p)
        Their moments.
    seed : int
        The run's root seed.
    structure : numpy.ndarray, shape (n_y, n_phi, p), or None, default=None
        The model's structure; None: the noise is not projected.

    Returns
    -------
    H : numpy.ndarray, shape (S, p, p)
    b : numpy.ndarray, shape (S, p)
    sigma : numpy.ndarray, shape (S,)
        The noise's standard deviation.
    """
    S, M, p = b.shape
    f = privacy.clip_factors(statistics_norms(H, b))
    sigma = privacy.sigma(privacy.clip, np.full(S, M))
    EH = privacy.noise(seed, 0, (p, p), sigma, True)
    Eb = privacy.noise(seed, 1, (p,), sigma)
    if structure is not None:
        UH, Ub = statistics_bases(structure)
        EH, Eb = project(EH, UH), project(Eb, Ub)
    Hs = np.einsum("sm,smpq->spq", f, H) + EH
    bs = np.einsum("sm,smp->sp", f, b) + Eb
    # the noise's dimensions: those it was projected onto, or all (H's symmetric noise has
    # variance sigma^2 on the diagonal and sigma^2 / 2 off it: p (p + 1) / 2 in energy)
    privacy.released(Hs, sigma, p * (p + 1) / 2 if structure is None else symmetric_dims(UH))
    privacy.released(bs, sigma, p if structure is None else Ub.shape[-1])
    return Hs, bs, sigma


def private_pooled_solution(privacy: Privacy, H: np.ndarray, b: np.ndarray,
                            seed: int, structure: np.ndarray | None = None) -> np.ndarray:
    """``centralized_exact`` under ``privacy``: the pooled least squares of the noisy clipped
    statistics (:func:`private_statistics`), eigenvalues floored (:func:`eigen_floor`).

    Parameters
    ----------
    privacy : Privacy
        The run's mechanism (its ``clip`` and noise multiplier).
    H : numpy.ndarray, shape (S, M, p, p)
        The clients' Gram matrices.
    b : numpy.ndarray, shape (S, M, p)
        Their moments.
    seed : int
        The run's root seed.
    structure : numpy.ndarray, shape (n_y, n_phi, p), or None, default=None
        The model's structure (the noise projected); None: not projected.

    Returns
    -------
    numpy.ndarray, shape (S, p)
    """
    Hs, bs, sigma = private_statistics(privacy, H, b, seed, structure)
    return repaired_solve(Hs, bs, eigen_floor(b.shape[-1], sigma))


def statistics_norms(H: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each client's contribution's norm ``sqrt(||H_i||_F^2 + ||b_i||^2)`` (S, M), the
    statistics viewed as one vector."""
    return np.sqrt(np.einsum("smpq,smpq->sm", H, H) + np.einsum("smp,smp->sm", b, b))


def clipped_mean(privacy: Privacy, theta: np.ndarray, present: np.ndarray) -> np.ndarray:
    """:func:`private_mean` without its noise (clipping alone; nothing counted as clipped):
    the mean over the present clients of their estimates clipped to norm ``clip``, (S, p)."""
    w = privacy.clip_factors(np.linalg.norm(theta, axis=-1), count=False) * present
    return np.einsum("sm,smp->sp", w, theta) / np.maximum(present.sum(axis=1), 1)[:, None]


def clipped_pooled(privacy: Privacy, H: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`private_pooled_solution` without its noise (clipping alone; nothing counted
    as clipped): the pooled least squares of the clients' statistics each scaled to norm
    ``clip``, (S, p)."""
    from fnsysid.dynamics.model import least_squares

    f = privacy.clip_factors(statistics_norms(H, b), count=False)
    return least_squares(np.einsum("sm,smpq->spq", f, H)[:, None],
                         np.einsum("sm,smp->sp", f, b)[:, None])[:, 0]


def private_mean(privacy: Privacy, theta: np.ndarray, present: np.ndarray,
                 seed: int) -> np.ndarray:
    """``oneshot`` under ``privacy``: the mean of the clients' own estimates, from the noisy
    sum of the estimates clipped to ``clip`` and the noisy count of the clients (each
    counted with weight ``clip``, so that a client's contribution has norm at most
    ``sqrt(2) clip``).

    Parameters
    ----------
    privacy : Privacy
        The run's mechanism (its ``clip`` and noise multiplier).
    theta : numpy.ndarray, shape (S, M, p)
        The clients' own estimates.
    present : numpy.ndarray of bool, shape (S, M)
        The clients averaged.
    seed : int
        The run's root seed.

    Returns
    -------
    numpy.ndarray, shape (S, p)
    """
    S, M, p = theta.shape
    C = privacy.clip
    w = privacy.clip_factors(np.linalg.norm(theta, axis=-1)) * present
    sigma = privacy.sigma(np.sqrt(2.0) * C, np.full(S, M))
    total = np.einsum("sm,smp->sp", w, theta) + privacy.noise(seed, 0, (p,), sigma)
    count = (C * present.sum(axis=1) + privacy.noise(seed, 1, (), sigma)) / C
    privacy.released(total, sigma, p)
    return total / np.maximum(count, 1.0)[:, None]
