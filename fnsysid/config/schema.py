"""The run's settings as typed objects: every key, its type and its allowed range (pydantic).

:func:`settings_from` checks a composed config (converted to plain Python, after Hydra has
merged the groups and the command line) against :class:`Settings` and returns the typed
settings that flow down into the run. A value of the wrong type (the string ``'false'`` for a
boolean, ``1.5`` for an integer), a number out of range or not finite, a missing required key
and a key the schema does not know are refused with one line naming the key and what is
allowed; the words for "what is allowed" are read from the schema itself
(:func:`allowed`), so a new setting needs only its annotation.

Where to add a setting
----------------------
- A top-level knob or a key of a plain section (``output``, ``theory``, ...): one field in
  :class:`Settings` (a knob whose default comes from the system: in :class:`Knobs`) or the
  section's model, with its meaning as the field's ``description``: the refusals
  (:data:`KNOBS`), ``--help`` (``scripts/settings_reference.py --write-help``) and the settings
  reference page read it from there.
- A new data source or runtime: one model with a ``Literal`` ``source`` (``name``) added to
  :data:`Data` (:data:`Runtime`).
- A new class behind ``_target_`` (a system, feature map, optimizer or strategy): the class
  names the model of its keys where it is defined (``settings = "Weighted"``, a model of this
  module by name, or a model of its own deriving from :class:`System`, :class:`FeatureMap`,
  :class:`Optimizer` or :class:`Strategy`) and is registered (fnsysid/config/registry.py); the
  tables (``SYSTEMS``, ``FEATURE_MAPS``, ``OPTIMIZERS``, ``STRATEGIES``, :func:`tables`) are
  read from the registry, so nothing here changes. A class that names no model (a user's
  own, through ``_target_`` or ``--config-dir``) has its own keys checked by its constructor
  only; the keys every system shares (``knobs``, ``solver``, ``init``, noises) are still typed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)

from fnsysid.config import registry
from fnsysid.config.errors import ConfigError
from fnsysid.config.messages import field_words, message, not_allowed

# --- leaf types ---------------------------------------------------------------------------------

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
PosReal = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegReal = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1)]
FiniteVec = Union[Finite, Annotated[list[Finite], Field(min_length=1)]]
NonNegVec = Union[NonNegReal, Annotated[list[NonNegReal], Field(min_length=1)]]
Matrix = Annotated[list[Annotated[list[Finite], Field(min_length=1)]], Field(min_length=1)]
#: column names, or null for the system's own
Names = Union[None, Annotated[list[Text], Field(min_length=1)]]
#: input column names ([]: none), or null for the system's own
InputNames = Union[None, list[Text]]


def _either(*words: str):
    """``true``, ``false`` or one of ``words`` (strict: not 0 or 1, not ``'true'``)."""
    allowed = "one of " + ", ".join([*words, "true", "false"])
    return Annotated[Union[bool, Literal[words]], Field(json_schema_extra={"allowed": allowed})]


Scaling = _either("none", "diagonal", "zscore", "whiten")
Reduction = Literal["sum", "mean"]


class Section(BaseModel):
    """A group of settings: strictly typed (no ``'3'`` for 3, no ``0`` for false), no unknown
    keys, read-only once checked. A key with the default None may be absent (its class's
    constructor has the default), but not given as null unless its type says so."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True,
                              defer_build=True)


class ByClass(Section):
    """A group option given by class path (``_target_``); a class that no table of this
    module lists keeps its other keys, which its constructor checks."""

    model_config = ConfigDict(extra="allow")

    target: Text = Field(alias="_target_")


class StepDistribution(Section):
    """Per-client local steps drawn from ``U{low..high}``."""

    model_config = ConfigDict(json_schema_extra={
        "allowed": "{kind: uniform_int, low: L, high: H} with integers 1 <= L <= H"})

    kind: Literal["uniform_int"]
    low: PosInt
    high: PosInt

    @model_validator(mode="after")
    def _ordered(self):
        if self.low > self.high:
            raise ValueError("low > high")
        return self


TrajectoryCount = Union[PosInt, Annotated[list[PosInt], Field(min_length=1)]]
LocalSteps = Union[PosInt, Annotated[list[PosInt], Field(min_length=1)], StepDistribution]


# --- the knobs ----------------------------------------------------------------------------------

class Knobs(Section):
    """The knobs whose defaults come from the chosen system (its ``knobs`` node: its paper
    figure's settings); :class:`Settings` has them at the top level.

    A knob's ``description`` is its meaning wherever it is shown: the first clause (up to
    ``"; "``) in the one-line refusals (:data:`KNOBS`), the whole text in ``--help``
    (conf/hydra/help/fnsysid.yaml, written by ``scripts/settings_reference.py --write-help``)
    and in the settings reference page."""

    N: TrajectoryCount = Field(description="trajectories per client; a list of M ints gives "
                                           "per-client N_i")
    T: PosInt = Field(description="trajectory length; samples per trajectory")
    eps: NonNegReal = Field(description="heterogeneity; theta_i = theta_0 + gamma_i * "
                                        "direction, gamma_i ~ U(0, eps)")
    K: LocalSteps = Field(description="local steps per round; a list of M ints gives "
                                      "per-client K_i, 'K={kind:uniform_int,low:1,high:20}' "
                                      "(quoted) draws K_i per client")
    lr: PosReal = Field(description="learning rate")
    R: PosInt = Field(description="communication rounds")


#: knobs whose defaults come from the system's ``knobs`` node
SYSTEM_KNOBS = tuple(Knobs.model_fields)


# --- systems ------------------------------------------------------------------------------------


class Noise(Section):
    """A noise distribution (initial states, inputs, disturbances)."""

    kind: Literal["normal", "truncnormal", "uniform", "zero"]
    scale: NonNegVec = None
    loc: FiniteVec = None
    clip: Annotated[float, Field(gt=0, json_schema_extra={"allowed": "a number > 0 (inf: none)"})
                    ] = None


class Solver(Section):
    """A system's defaults of the local solver."""

    reduction: Reduction
    scale_features: Scaling


class Init(Section):
    """The start model: ``scale`` times the nominal model or client 0's true parameters."""

    scale: Finite
    reference: Literal["nominal", "client0"] = "nominal"


class System(ByClass):
    """The keys every system shares; a system's own constants are the other keys."""

    knobs: Knobs
    solver: Solver
    init: Init
    x0: Noise = None
    inputs: Noise = None
    disturbance: Noise = None

    #: keys that configure the run, not the system object
    RUN_KEYS: ClassVar[tuple[str, ...]] = ("knobs", "solver", "init")


class KnownSystem(System):
    model_config = ConfigDict(extra="forbid")


class Generic(KnownSystem):
    states: Names = None
    inputs: InputNames = None


class Dense(KnownSystem):
    A0: Matrix = None
    B0: Matrix = None
    V: Matrix = None
    U: Matrix = None


class Pendulum(KnownSystem):
    m: PosReal = None
    l: PosReal = None  # noqa: E741 - the pendulum's length
    g: Finite = None
    dt: PosReal = None
    gain: NonNegReal = None


class Controller(Section):
    f0: Finite
    z_ref: Finite
    kp_z: NonNegReal
    kd_z: NonNegReal
    kp_q: NonNegReal
    kd_omega: NonNegReal
    c: Annotated[list[Finite], Field(min_length=3, max_length=3)]


class Quadrotor(KnownSystem):
    m: PosReal = None
    Ixx: PosReal = None
    Iyy: PosReal = None
    Izz: PosReal = None
    drag: Union[NonNegReal, Annotated[list[NonNegReal], Field(min_length=3, max_length=3)]] = None
    g: Finite = None
    dt: PosReal = None
    identify_drag: bool = None
    controller: Controller = None


# --- feature maps, local solvers, strategies ------------------------------------------------

Variables = Literal["x", "u", "xu"]


class FeatureMap(ByClass):
    """A feature library given by class path."""


class OwnFeatures(Section):
    """``feature_map=default``: the system's own features (no keys)."""


class Identity(FeatureMap):
    model_config = ConfigDict(extra="forbid")
    variables: Variables = None
    bias: bool = None


class Polynomial(Identity):
    degree: PosInt = None


class Fourier(FeatureMap):
    model_config = ConfigDict(extra="forbid")
    variables: Variables = None
    n_frequencies: PosInt = None
    sin: bool = None
    cos: bool = None


class Optimizer(ByClass):
    """A local solver given by class path."""


class LocalSolver(Optimizer):
    """The keys of the project's local solvers."""

    model_config = ConfigDict(extra="forbid")
    schedule: Literal["constant", "inverse_k"] = Field(
        None, description="step size within a round: constant lr, or inverse_k (lr/k at local "
                          "step k, the published code)")
    reduction: Reduction = Field(
        None, description="the local gradient summed (paper eq. 10) or averaged over samples")
    scale_features: Scaling = Field(
        None, description="feature scaling of the local steps: none, diagonal, zscore "
                          "(centred, the published pendulum code) or whiten; the estimates "
                          "stay in physical units")


class GD(LocalSolver):
    affine: bool = Field(None, description="the K local steps as one precomputed affine map "
                                           "(false: step by step)")


class SGD(LocalSolver):
    batch_size: PosInt = Field(None, description="samples per local step (mini-batch)")


class Strategy(ByClass):
    """A strategy given by class path."""


class Weighted(Strategy):
    model_config = ConfigDict(extra="forbid")
    weighting: Literal["uniform", "samples"] = Field(
        None, description="the clients' weights: uniform (paper) or samples (weights N_i T)")


class Federated(Weighted):
    fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        None, description="share of clients taking part in each round (seeded sampling)")


class FedProx(Federated):
    mu: NonNegReal = Field(None, description="weight of the proximal term "
                                             "mu (theta_i - theta_s); 0 is FedAvg")


class Centralized(Weighted):
    exact: bool = Field(None, description="the pooled least-squares solution (true) or K "
                                          "optimizer steps per round on the pooled data")


def _by_target(table: dict[str, type], other: type, empty: type | None = None):
    """A group node checked by the model of its ``_target_`` in ``table`` (``other`` for a
    class in no table; ``empty`` for ``{}``)."""
    def tag(value) -> str:
        if empty is not None and isinstance(value, Mapping) and not value:
            return "{}"
        target = value.get("_target_") if isinstance(value, Mapping) else None
        return target if target in table else "custom"

    members = [Annotated[m, Tag(t)] for t, m in table.items()] + [Annotated[other, Tag("custom")]]
    if empty is not None:
        members.append(Annotated[empty, Tag("{}")])
    return Annotated[Union[tuple(members)], Discriminator(tag)]


# The models of the classes a group names by ``_target_`` are looked up in the registry
# (fnsysid/config/registry.py): each class names its model where it is defined
# (``settings = "Weighted"``), so the tables below are read from there (:func:`tables`).


class Concat(FeatureMap):
    """Feature maps side by side; each entry of ``libraries`` is checked by its own model."""

    model_config = ConfigDict(extra="forbid")
    libraries: Annotated[list[FeatureMap], Field(min_length=1)]

    @classmethod
    def nesting(cls, any_map) -> type:
        """This model with the entries of ``libraries`` checked as ``any_map`` (a feature map
        of any registered class), named ``Checked<name>`` in this module, whose
        ``__getattr__`` finds it, so that a checked model of it pickles."""
        return create_model(f"Checked{cls.__name__}", __base__=cls, __module__=__name__,
                            libraries=(Annotated[list[any_map], Field(min_length=1)], ...))


class IdentityKind(Section):
    kind: Literal["identity"]
    variables: Variables = None
    bias: bool = None


class PolynomialKind(IdentityKind):
    kind: Literal["polynomial"]
    degree: PosInt = None


class SinKind(Section):
    kind: Literal["sin", "cos"]
    variables: Variables = None
    n_frequencies: PosInt = None


class FourierKind(SinKind):
    kind: Literal["fourier"]
    sin: bool = None
    cos: bool = None


#: the libraries that ``feature_map=combined`` knows by name
LIBRARY_KINDS = ("identity", "polynomial", "fourier", "sin", "cos")
LibraryKind = Literal[LIBRARY_KINDS]


class AnyKind(Section):
    """A mapping whose ``kind`` is not a library kind (refused, naming ``kind``)."""

    model_config = ConfigDict(extra="allow")
    kind: LibraryKind


def _entry(value) -> str:
    """The tag of a :class:`Combined` entry: a kind's name, a kind's mapping, or a library."""
    if not isinstance(value, Mapping):
        return "name"
    if "_target_" in value:
        return "library"
    kind = value.get("kind")
    return kind if kind in LIBRARY_KINDS else "other"


def library_entry(any_map):
    """An entry of :class:`Combined`'s ``libraries``: a kind's name, a kind's mapping or a
    feature map of any registered class (``any_map``)."""
    return Annotated[
        Union[Annotated[LibraryKind, Tag("name")],
              Annotated[IdentityKind, Tag("identity")],
              Annotated[PolynomialKind, Tag("polynomial")],
              Annotated[FourierKind, Tag("fourier")],
              Annotated[SinKind, Tag("sin")],
              Annotated[SinKind, Tag("cos")],
              Annotated[AnyKind, Tag("other")],
              Annotated[any_map, Tag("library")]],
        Discriminator(_entry),
        Field(json_schema_extra={"allowed": "a library kind (identity, polynomial, fourier, "
                                            "sin, cos), {kind: ..., <its keys>} or "
                                            "{_target_: ...}"})]


class Combined(Concat):
    """Libraries named by kind (or given by class), each feature once."""

    libraries: Annotated[list[library_entry(FeatureMap)], Field(min_length=1)]

    @classmethod
    def nesting(cls, any_map) -> type:
        return create_model(f"Checked{cls.__name__}", __base__=cls, __module__=__name__,
                            libraries=(Annotated[list[library_entry(any_map)],
                                                 Field(min_length=1)], ...))


#: the base model of each group's class models, and the words of its refusals
GROUP_MODELS = {
    "system": (System, "a system option"),
    "feature_map": (FeatureMap, "a feature_map option"),
    "optimizer": (Optimizer, "an optimizer option"),
    "strategy": (Strategy, "a strategy option"),
}
#: the modules whose classes are the built-in options (importing one registers its classes)
BUILTIN_MODULES = ("fnsysid.dynamics.features", "fnsysid.dynamics.systems",
                   "fnsysid.dynamics.quadrotor", "fnsysid.learning.optim",
                   "fnsysid.learning.strategies")
#: the names of :func:`tables` as module attributes (``schema.STRATEGIES``)
_TABLE_NAMES = {"SYSTEMS": "system", "FEATURE_MAPS": "feature_map",
                "OPTIMIZERS": "optimizer", "STRATEGIES": "strategy"}


def tables() -> dict[str, dict[str, type]]:
    """Group -> (``_target_`` -> model of the class's keys) of every registered class: the
    built-in ones and any of the user's whose module has been imported."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    out = {}
    for group, (base, _) in GROUP_MODELS.items():
        out[group] = {}
        for target, model in registry.table(group).items():
            if isinstance(model, str):          # a built-in class names its model here
                model = globals().get(model)
            if not (isinstance(model, type) and issubclass(model, base)):
                raise TypeError(f"{target}.settings must be a model deriving from "
                                f"fnsysid.config.schema.{base.__name__} (or the name of one)")
            out[group][target] = model
    return out


def __getattr__(name: str):
    if name in _TABLE_NAMES:
        return tables()[_TABLE_NAMES[name]]
    if name == "CheckedSettings":        # what pickle finds a checked model's class by
        return checked_model()
    if name.startswith("Checked"):       # a nested feature map's (Concat.nesting)
        checked_model()
        if name in _CHECKED.get("nested", {}):
            return _CHECKED["nested"][name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# --- data, runtime and the plain sections --------------------------------------------------------

class Simulated(Section):
    """Trajectories simulated from the chosen system."""

    source: Literal["simulated"]
    shared_noise: bool = Field(description="the same noise on every client (the published "
                                           "pendulum code)")
    val_N: NonNegInt
    states: Names
    inputs: InputNames


class Files(Section):
    """Trajectories read from CSV or Parquet files."""

    source: Literal["files"]
    path: Text
    states: Names
    inputs: InputNames
    truth: Text | None
    holdout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
    val_path: Text | None
    trajectory: Text = "trajectory"
    time: Text = "t"
    ignore: Annotated[list[Text], Field(json_schema_extra={
        "allowed": "a list of column names, e.g. [battery, note]"})] = []
    missing: Literal["refuse", "split"] = Field(
        "refuse", description="a row with an empty time, state or input: refuse (one line "
                              "naming it) or split (left out, its trajectory split there)")


class InProcess(Section):
    name: Literal["inprocess"]


class SecAgg(Section):
    """Flower's SecAgg+ (``SecAggPlusWorkflow``/``secaggplus_mod``) settings; its mean is
    within ``2 clipping_range / quantization_range`` of the plain mean in every entry
    (fnsysid/runtimes/flower_secure.py, docs/PRIVACY.md)."""

    #: a client's reply entries must lie in [-clipping_range, clipping_range] (else refused)
    clipping_range: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = 16.0
    #: quantization levels of [-clipping_range, clipping_range]; M of them must sum below 2^32
    quantization_range: Annotated[int, Field(ge=2, le=2 ** 30, strict=True)] = 2 ** 24
    #: share of the round's clients each client's key is split among (its neighbours)
    num_shares: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    #: share of those shares that reconstructs a key
    reconstruction_threshold: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0


class Flower(Section):
    name: Literal["flower"]
    client_cpus: PosReal
    #: seconds the server waits for the replies of one exchange before it stops the run
    reply_timeout: PosReal = 600.0
    #: seconds a deployment's server waits for its M SuperNodes to connect before it stops
    node_timeout: PosReal = 300.0
    #: train exchanges through Flower's SecAgg+: the server sees only the sum of the replies
    secure_aggregation: bool = False
    secagg: SecAgg = SecAgg()


def _by_value(key: str, table: dict[str, type]):
    """A group node checked by the model that the value of its ``key`` names (closed: other
    values are refused, naming the allowed ones)."""
    def tag(value):
        return value.get(key) if isinstance(value, Mapping) else None

    members = [Annotated[m, Tag(t)] for t, m in table.items()]
    return Annotated[Union[tuple(members)], Discriminator(tag)]


Data = _by_value("source", {"simulated": Simulated, "files": Files})
Runtime = _by_value("name", {"inprocess": InProcess, "flower": Flower})


class NoPersonalization(Section):
    name: Literal["none"]


class Finetune(Section):
    """K local steps on each client's own data from the final server model."""

    name: Literal["finetune"]
    K: PosInt
    lr: PosReal


class AutoPersonalization(Section):
    """Empirical-Bayes combination of each client's own and the fleet's estimate."""

    name: Literal["auto"]


Personalize = _by_value("name", {"none": NoPersonalization, "finetune": Finetune,
                                 "auto": AutoPersonalization})


class NoSparsity(Section):
    name: Literal["none"]


class Stlsq(Section):
    """Sequentially thresholded least squares (fnsysid/learning/sparsity.py)."""

    name: Literal["stlsq"]
    #: a number > 0, or ``auto``: chosen along a threshold path by held-out error (BIC
    #: without held-out data)
    threshold: Annotated[Union[PosReal, Literal["auto"]],
                         Field(json_schema_extra={"allowed": "a finite number > 0 or auto"})]
    #: what the threshold is compared with: ``unit`` the coefficients of features and
    #: targets scaled to unit size (from the summed statistics), ``data`` the raw coefficients
    scale: Literal["unit", "data"]
    alpha: NonNegReal
    #: fit the kept terms without the ridge once the support is chosen (PySINDy's unbias)
    unbias: bool
    max_iter: PosInt
    #: ``threshold=auto``: the fewest terms whose score (-2 log-likelihood, held-out or BIC)
    #: is within this of the smallest
    margin: NonNegReal


Sparsity = _by_value("name", {"none": NoSparsity, "stlsq": Stlsq})


class NoPrivacy(Section):
    name: Literal["none"]


class CentralPrivacy(Section):
    """Client-level differential privacy (fnsysid/learning/privacy.py, docs/PRIVACY.md):
    each client's contribution clipped to norm ``clip``, Gaussian noise on the sum."""

    name: Literal["central"]
    #: bound on the norm of a client's contribution
    clip: PosReal
    #: target epsilon (null: ``noise_multiplier`` given, epsilon reported)
    epsilon: PosReal | None
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
    #: noise standard deviation over the sensitivity (null: solved for ``epsilon``; 0: none)
    noise_multiplier: NonNegReal | None
    accountant: Literal["pld", "rdp"]


class LocalPrivacy(CentralPrivacy):
    """As ``central``, each client adding its own noise before sending."""

    name: Literal["local"]


Privacy = _by_value("name", {"none": NoPrivacy, "central": CentralPrivacy,
                             "local": LocalPrivacy})


Probability = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]


class Theory(Section):
    delta: Probability = Field(description="failure probability of the Theorem 1 bound "
                                           "(theory.csv)")


class Output(Section):
    per_client: _either("auto") = Field(
        description="clients.csv: auto (when M <= output.per_client_max), true or false")
    per_client_max: NonNegInt = Field(description="the largest M for which per_client=auto "
                                                  "writes clients.csv")
    plot: bool = Field(description="error.png of e_r against r, fit.png of the held-out fit")
    eval_every: PosInt = Field(description="free-run NRMSE every this many rounds (and at "
                                           "round 0 and R)")
    trajectories: bool = Field(description="write trajectories.parquet and truth.csv "
                                           "(simulated data)")
    overwrite: bool = Field(description="true: replace an earlier run's result files in the "
                                        "run folder")
    resume: bool = Field(description="multirun: skip the jobs already ok with the same "
                                     "settings, rerun the others")
    ci_level: Probability = Field(description="level of the confidence intervals (se, ci_lo, "
                                              "ci_hi; estimates.csv, client_estimates.csv)")
    model_check: bool = Field(description="check the model class on the clients' held-out "
                                          "data (summary.json: model_check; "
                                          "docs/ALGORITHMS.md)")


def _group(name: str, annotation):
    return Annotated[annotation, Field(json_schema_extra={"allowed": GROUP_MODELS[name][1]})]


class Fleet(Section):
    """The number of clients: the first knob of :class:`Settings` (a base of its own so that
    it comes before the knobs of :class:`Knobs` in the settings' order)."""

    M: Annotated[PosInt | None, Field(description="number of clients", json_schema_extra={
        "allowed": "an integer >= 1 (null only with data=files, whose files give it)"})]


class Settings(Knobs, Fleet):
    """Every setting of a run, checked (the composed config without Hydra's own node): ``M``
    (:class:`Fleet`), the knobs of :class:`Knobs` and those below, the groups and the plain
    sections.

    The groups chosen by class are typed here by their base models; :func:`settings_from`
    checks a config against :func:`checked_model`, this model with each such group checked by
    the model of its ``_target_`` (:func:`tables`)."""

    repeats: Annotated[PosInt | None, Field(
        description="independent repetitions; new systems and data each, averaged in one run "
                    "(mean and band in the plot)",
        json_schema_extra={
            "allowed": "an integer >= 1 (null only with data=files, whose files give it)"})]
    seed: NonNegInt = Field(description="root random seed; the per-client, trajectory and "
                                        "repeat streams derive from it")
    system: _group("system", System)
    feature_map: _group("feature_map", Union[FeatureMap, OwnFeatures])
    optimizer: _group("optimizer", Optimizer)
    strategy: _group("strategy", Strategy)
    data: Data
    runtime: Runtime
    personalize: Personalize
    sparsity: Sparsity
    privacy: Privacy = NoPrivacy(name="none")
    theory: Theory
    output: Output
    progress: bool = Field(description="progress bar over the rounds (shown only on a terminal)")

    _resolved: dict = PrivateAttr(default_factory=dict)

    @property
    def resolved(self) -> dict:
        """The plain settings these were checked from (what ``config.yaml`` holds)."""
        return self._resolved

    @property
    def files(self) -> bool:
        """Whether the data come from files (``data=files``)."""
        return self.data.source == "files"

    def replace(self, **sections) -> Settings:
        """A copy with some settings or sections replaced (sections given as dicts are
        checked)."""
        plain = {**self._resolved, **sections}
        return settings_from(plain)


#: config groups chosen by name (``group=option``); ``experiment`` patches the whole config
GROUPS = ("data", "system", "feature_map", "optimizer", "strategy", "runtime", "personalize",
          "sparsity", "privacy", "experiment")
#: the top-level keys of a run config
TOP_LEVEL = tuple(f.alias or n for n, f in Settings.model_fields.items())
#: the knobs (top-level settings of one value): name -> meaning, the first clause of the
#: field's description (for the one-line refusals)
KNOBS = {name: Settings.model_fields[name].description.split("; ")[0]
         for name in ("M", *SYSTEM_KNOBS, "repeats", "seed")}


def _group_union(name: str, table: dict[str, type]):
    base = GROUP_MODELS[name][0]
    return _group(name, _by_target(table, base, OwnFeatures if name == "feature_map" else None))


_CHECKED: dict[str, Any] = {}


def checked_model(plain: Mapping | None = None) -> type[Settings]:
    """:class:`Settings` with each group chosen by class checked by the model its
    ``_target_`` names (:func:`tables`). The class a ``_target_`` of ``plain`` names is
    imported first (as Hydra would), so a class of the user's own that names its model is
    checked by it. The model is rebuilt only when a class has been registered since."""
    tabs = tables()
    if plain is not None and _import_targets(plain, tabs):
        tabs = tables()
    if _CHECKED.get("version") != registry.version():
        maps = tabs["feature_map"]
        any_map = _by_target({t: m for t, m in maps.items() if not issubclass(m, Concat)},
                             FeatureMap)
        tabs = {**tabs, "feature_map": {t: m.nesting(any_map) if issubclass(m, Concat) else m
                                        for t, m in maps.items()}}
        _CHECKED["nested"] = {m.__name__: m for t, m in tabs["feature_map"].items()
                              if issubclass(maps[t], Concat)}
        fields = {name: (_group_union(name, tabs[name]), ...) for name in GROUP_MODELS}
        # named apart from Settings, and found by that name through the module's
        # __getattr__, so that a model of it pickles (a fitted FederatedSysID holds one)
        _CHECKED["model"] = create_model("CheckedSettings", __base__=Settings,
                                         __module__=__name__, **fields)
        _CHECKED["version"] = registry.version()
    return _CHECKED["model"]


def _import_targets(plain: Mapping, tabs: dict) -> bool:
    """Import the module of each group's ``_target_`` that no table lists (what Hydra's
    ``instantiate`` does later); whether any was found. A target that does not import is left
    to the run's own refusal."""
    from hydra.utils import get_class

    found = False
    for name in GROUP_MODELS:
        node = plain.get(name)
        target = node.get("_target_") if isinstance(node, Mapping) else None
        if isinstance(target, str) and target and target not in tabs[name]:
            try:
                get_class(target)
            except Exception:       # noqa: BLE001 - any failure is reported by the run
                continue
            found = True
    return found


# --- checking and the one-line messages -----------------------------------------------------------

def settings_from(plain: Mapping) -> Settings:
    """The typed settings of a composed config given as plain Python (``hydra`` dropped).

    Raises :class:`ConfigError` with one line for the first offending key.
    """
    plain = {k: v for k, v in plain.items() if k != "hydra"}
    _refuse_unset(plain, "")
    model = checked_model(plain)
    try:
        settings = model.model_validate(plain)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        error = errors[0]
        if error["loc"][0] in SYSTEM_KNOBS:     # a knob left at its system default: name that
            error = next((e for e in errors if e["loc"][0] == "system" and "knobs" in e["loc"]
                          and e["loc"][-1] == error["loc"][0]), error)
        raise ConfigError(message(error, model, plain, KNOBS, System.RUN_KEYS,
                                  {"data": "source", "runtime": "name",
                                   "personalize": "name", "sparsity": "name",
                                   "privacy": "name"})) from None
    settings._resolved = plain
    return settings


def _refuse_unset(node, key: str) -> None:
    """Hydra's ``???`` (a value the config leaves to the command line), named."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _refuse_unset(v, f"{key}.{k}" if key else str(k))
    elif node == "???":
        raise ConfigError(f"setting '{key}' needs a value: {key}=... ({_allowed_at(key)})")


def check_value(key: str, value) -> None:
    """Refuse ``value`` for the dotted ``key`` of a top-level knob or of a plain section
    (``output.plot``, ``data.shared_noise``), before the config is composed; keys inside
    groups chosen by class are checked on the composed config."""
    info = _field_at(key)
    if info is None:
        return
    try:
        TypeAdapter(info.rebuild_annotation()).validate_python(value, strict=True)
    except ValidationError:
        raise ConfigError(not_allowed(key, value, field_words(info), KNOBS.get(key))) from None


def _field_at(key: str):
    """The field of a dotted key through plain sections (None inside a group chosen by
    class; for ``data.*``, the field if its sources agree on it)."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "data":
        found = [m.model_fields[parts[1]] for m in (Simulated, Files)
                 if parts[1] in m.model_fields]
        same = len({repr(f.rebuild_annotation()) for f in found}) == 1
        return found[0] if found and same else None
    model: Any = checked_model() if parts[0] in GROUP_MODELS else Settings
    for part in parts[:-1]:
        fields = getattr(model, "model_fields", {})
        model = fields[part].annotation if part in fields else None
        if not (isinstance(model, type) and issubclass(model, Section)):
            return None
    return getattr(model, "model_fields", {}).get(parts[-1])


def _allowed_at(key: str) -> str:
    info = _field_at(key)
    return "a value" if info is None else field_words(info)
