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
  :class:`Settings` or the section's model (a knob also gets its meaning in :data:`KNOBS`).
- A new data source or runtime: one model with a ``Literal`` ``source`` (``name``) added to
  :data:`Data` (:data:`Runtime`).
- A new class behind ``_target_`` (a system, feature map, optimizer or strategy): one model in
  the group's table (:data:`SYSTEMS`, :data:`FEATURE_MAPS`, :data:`OPTIMIZERS`,
  :data:`STRATEGIES`). A class found in no table (a user's own, through ``_target_`` or
  ``--config-dir``) has its own keys checked by its constructor only; the keys every system
  shares (``knobs``, ``solver``, ``init``, noises) are still typed.
"""

from __future__ import annotations

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
    model_validator,
)

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

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)


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

#: top-level knobs: name -> meaning (for messages and --help)
KNOBS = {
    "M": "number of clients",
    "N": "trajectories per client",
    "T": "trajectory length",
    "eps": "heterogeneity",
    "K": "local steps per round",
    "lr": "learning rate",
    "R": "communication rounds",
    "repeats": "independent repetitions",
    "seed": "root random seed",
}
#: knobs whose defaults come from the system's ``knobs`` node
SYSTEM_KNOBS = ("N", "T", "eps", "K", "lr", "R")


# --- systems ------------------------------------------------------------------------------------

class Knobs(Section):
    """A system's defaults of the top-level knobs (its paper figure's settings)."""

    N: TrajectoryCount
    T: PosInt
    eps: NonNegReal
    K: LocalSteps
    lr: PosReal
    R: PosInt


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
    inputs: Names = None


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
    schedule: Literal["constant", "inverse_k"] = None
    reduction: Reduction = None
    scale_features: Scaling = None


class GD(LocalSolver):
    affine: bool = None


class SGD(LocalSolver):
    batch_size: PosInt = None


class Strategy(ByClass):
    """A strategy given by class path."""


class Weighted(Strategy):
    model_config = ConfigDict(extra="forbid")
    weighting: Literal["uniform", "samples"] = None


class Federated(Weighted):
    #: share of clients taking part in each round
    fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = None


class FedProx(Federated):
    mu: NonNegReal = None


class Centralized(Weighted):
    exact: bool = None


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


SYSTEMS = {
    "fnsysid.dynamics.systems.Generic": Generic,
    "fnsysid.dynamics.systems.Synthetic": Dense,
    "fnsysid.dynamics.systems.Linear": Dense,
    "fnsysid.dynamics.systems.Pendulum": Pendulum,
    "fnsysid.dynamics.quadrotor.Quadrotor": Quadrotor,
}
FEATURE_MAPS = {
    "fnsysid.dynamics.features.Identity": Identity,
    "fnsysid.dynamics.features.Polynomial": Polynomial,
    "fnsysid.dynamics.features.Fourier": Fourier,
}
OPTIMIZERS = {"fnsysid.learning.optim.GD": GD, "fnsysid.learning.optim.SGD": SGD}
STRATEGIES = {
    **{f"fnsysid.learning.strategies.{name}": Federated
       for name in ("FedAvg", "FedLin", "Scaffold", "FedNova")},
    "fnsysid.learning.strategies.FedProx": FedProx,
    **{f"fnsysid.learning.strategies.{name}": Weighted for name in ("OneShot", "Local", "Cyclic")},
    "fnsysid.learning.strategies.Centralized": Centralized,
}

AnyFeatureMap = _by_target(FEATURE_MAPS, FeatureMap)


class Concat(FeatureMap):
    model_config = ConfigDict(extra="forbid")
    libraries: Annotated[list[AnyFeatureMap], Field(min_length=1)]


FEATURE_MAPS["fnsysid.dynamics.features.Concat"] = Concat


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


LibraryEntry = Annotated[
    Union[Annotated[LibraryKind, Tag("name")],
          Annotated[IdentityKind, Tag("identity")],
          Annotated[PolynomialKind, Tag("polynomial")],
          Annotated[FourierKind, Tag("fourier")],
          Annotated[SinKind, Tag("sin")],
          Annotated[SinKind, Tag("cos")],
          Annotated[AnyKind, Tag("other")],
          Annotated[AnyFeatureMap, Tag("library")]],
    Discriminator(_entry),
    Field(json_schema_extra={"allowed": "a library kind (identity, polynomial, fourier, sin, "
                                        "cos), {kind: ..., <its keys>} or {_target_: ...}"})]


class Combined(FeatureMap):
    model_config = ConfigDict(extra="forbid")
    libraries: Annotated[list[LibraryEntry], Field(min_length=1)]


FEATURE_MAPS["fnsysid.dynamics.features.Combined"] = Combined
SystemGroup = Annotated[_by_target(SYSTEMS, System),
                        Field(json_schema_extra={"allowed": "a system option"})]
FeatureMapGroup = Annotated[_by_target(FEATURE_MAPS, FeatureMap, OwnFeatures),
                            Field(json_schema_extra={"allowed": "a feature_map option"})]
OptimizerGroup = Annotated[_by_target(OPTIMIZERS, Optimizer),
                           Field(json_schema_extra={"allowed": "an optimizer option"})]
StrategyGroup = Annotated[_by_target(STRATEGIES, Strategy),
                          Field(json_schema_extra={"allowed": "a strategy option"})]


# --- data, runtime and the plain sections --------------------------------------------------------

class Simulated(Section):
    """Trajectories simulated from the chosen system."""

    source: Literal["simulated"]
    shared_noise: bool
    val_N: NonNegInt
    states: Names
    inputs: Names


class Files(Section):
    """Trajectories read from CSV or Parquet files."""

    source: Literal["files"]
    path: Text
    states: Names
    inputs: Names
    truth: Text | None
    holdout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
    val_path: Text | None
    trajectory: Text = "trajectory"
    time: Text = "t"
    ignore: Annotated[list[Text], Field(json_schema_extra={
        "allowed": "a list of column names, e.g. [battery, note]"})] = []


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


class Theory(Section):
    #: failure probability of Theorem 1's bound
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]


class Output(Section):
    per_client: _either("auto")
    per_client_max: NonNegInt
    plot: bool
    eval_every: PosInt
    trajectories: bool
    overwrite: bool
    resume: bool
    #: level of the confidence intervals (estimates.csv, client_estimates.csv)
    ci_level: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
    #: check the model class on the clients' held-out data (summary.json's model_check)
    model_check: bool


class Settings(Section):
    """Every setting of a run, checked (the composed config without Hydra's own node)."""

    M: Annotated[PosInt | None, Field(json_schema_extra={
        "allowed": "an integer >= 1 (null only with data=files, whose files give it)"})]
    N: TrajectoryCount
    T: PosInt
    eps: NonNegReal
    K: LocalSteps
    lr: PosReal
    R: PosInt
    repeats: Annotated[PosInt | None, Field(json_schema_extra={
        "allowed": "an integer >= 1 (null only with data=files, whose files give it)"})]
    seed: NonNegInt
    system: SystemGroup
    feature_map: FeatureMapGroup
    optimizer: OptimizerGroup
    strategy: StrategyGroup
    data: Data
    runtime: Runtime
    personalize: Personalize
    sparsity: Sparsity
    privacy: Privacy = NoPrivacy(name="none")
    theory: Theory
    output: Output
    progress: bool

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


# --- checking and the one-line messages -----------------------------------------------------------

def settings_from(plain: Mapping) -> Settings:
    """The typed settings of a composed config given as plain Python (``hydra`` dropped).

    Raises :class:`ConfigError` with one line for the first offending key.
    """
    plain = {k: v for k, v in plain.items() if k != "hydra"}
    _refuse_unset(plain, "")
    try:
        settings = Settings.model_validate(plain)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        error = errors[0]
        if error["loc"][0] in SYSTEM_KNOBS:     # a knob left at its system default: name that
            error = next((e for e in errors if e["loc"][0] == "system" and "knobs" in e["loc"]
                          and e["loc"][-1] == error["loc"][0]), error)
        raise ConfigError(message(error, Settings, plain, KNOBS, System.RUN_KEYS,
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
    model: Any = Settings
    for part in parts[:-1]:
        fields = getattr(model, "model_fields", {})
        model = fields[part].annotation if part in fields else None
        if not (isinstance(model, type) and issubclass(model, Section)):
            return None
    return getattr(model, "model_fields", {}).get(parts[-1])


def _allowed_at(key: str) -> str:
    info = _field_at(key)
    return "a value" if info is None else field_words(info)
