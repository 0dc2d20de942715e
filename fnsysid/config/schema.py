"""Typed schema of the whole run config: every key, its type and its allowed range.

The composed config (after Hydra has merged the groups and the command line) is checked
against :data:`ROOT` by :func:`check_config`, in the pre-run check and again inside each job.
A value of the wrong type (the string ``'false'`` for a boolean, ``1.5`` for an integer), a
number out of range or not finite, a missing required key and a key the schema does not know
are refused with one line naming the key and what is allowed.

Where to add a setting (the one place)
--------------------------------------
- A top-level knob or a key of a plain node (``output``, ``theory``, ...): one entry in
  :data:`ROOT` (a knob: one line in :data:`KNOBS`, with its meaning for messages).
- A key of a ``data`` option: one entry in that option's dict in :data:`DATA` (keyed by
  ``data.source``); a new data source: one new dict there.
- A new config group whose options are plain nodes: one ``Node({...})`` entry in :data:`ROOT`;
  options that differ in their keys can share one node with ``required=False`` keys.
- A new class behind ``_target_`` (a system, feature map, optimizer or strategy): one entry
  ``"module.Class": {key: spec, ...}`` in the group's table (:data:`SYSTEMS`,
  :data:`FEATURE_MAPS`, :data:`OPTIMIZERS`, :data:`STRATEGIES`). A class found in no table (a
  user's own, through ``_target_`` or ``--config-dir``) has its keys checked by its
  constructor only; the keys every system shares (``knobs``, ``solver``, ``init``, noises) are
  still typed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A config value outside its type or range (one-line message)."""


def show(value) -> str:
    """A value as the user would type it on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"'{value}'" if _looks_typed(value) else value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _looks_typed(text: str) -> bool:
    """True if Hydra would read ``text`` unquoted as a number, boolean or null (or it is blank)."""
    if text.strip() != text or not text or " " in text:
        return True
    if text.lower() in ("true", "false", "null", "nan", "inf", "-inf", "+inf"):
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False


class Spec:
    """A leaf type: ``ok(value)`` and the words ``allowed`` used in messages."""

    allowed = "a value"

    def ok(self, value) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def check(self, key: str, value) -> None:
        if not self.ok(value):
            raise ConfigError(f"{key}={show(value)} is not allowed: {key} must be {self.allowed}")


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass
class Int(Spec):
    """An integer (not a boolean) in ``lo..hi``."""

    lo: int | None = None
    hi: int | None = None

    def ok(self, v) -> bool:
        return (_is_int(v) and (self.lo is None or v >= self.lo)
                and (self.hi is None or v <= self.hi))

    @property
    def allowed(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"an integer in {self.lo}..{self.hi}"
        if self.lo is not None:
            return f"an integer >= {self.lo}"
        return "an integer"


@dataclass
class Real(Spec):
    """A finite number (integers accepted) with optional open or closed bounds."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    inf_ok: bool = False     # +inf allowed (e.g. "no cut-off")

    def ok(self, v) -> bool:
        if not _is_real(v) or math.isnan(v):
            return False
        if math.isinf(v) and not (self.inf_ok and v > 0):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))

    @property
    def allowed(self) -> str:
        fin = "a number" if self.inf_ok else "a finite number"
        if self.lo is not None and self.hi is not None:
            lb, rb = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{fin} in {lb}{self.lo:g}, {self.hi:g}{rb}"
        if self.lo is not None:
            return f"{fin} {'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f"{fin} {'<' if self.hi_open else '<='} {self.hi:g}"
        return fin


class Bool(Spec):
    """``true`` or ``false`` (no strings, no 0/1)."""

    allowed = "true or false"

    def ok(self, v) -> bool:
        return isinstance(v, bool)


class Str(Spec):
    """Any non-empty string."""

    allowed = "a non-empty string"

    def ok(self, v) -> bool:
        return isinstance(v, str) and v != ""


@dataclass
class Choice(Spec):
    """One of the listed values (compared with their types: ``'true'`` is not ``true``)."""

    values: tuple = ()

    def __init__(self, *values):
        self.values = values

    def ok(self, v) -> bool:
        return any(type(v) is type(c) and v == c for c in self.values)

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(show(c) for c in self.values)


@dataclass
class AnyOf(Spec):
    """A value that fits one of ``specs``."""

    specs: tuple = ()

    def __init__(self, *specs):
        self.specs = specs

    def ok(self, v) -> bool:
        return any(s.ok(v) for s in self.specs)

    @property
    def allowed(self) -> str:
        return ", or ".join(s.allowed for s in self.specs)


@dataclass
class ListOf(Spec):
    """A non-empty list whose items fit ``item`` (``length`` items if given)."""

    item: Spec = field(default_factory=Spec)
    length: int | None = None

    def ok(self, v) -> bool:
        return (isinstance(v, (list, tuple)) and len(v) > 0
                and (self.length is None or len(v) == self.length)
                and all(self.item.ok(x) for x in v))

    @property
    def allowed(self) -> str:
        n = f"{self.length} " if self.length else ""
        return f"a list of {n}values, each {self.item.allowed}"


class Null(Spec):
    """``null``."""

    allowed = "null"

    def ok(self, v) -> bool:
        return v is None


def Optional(spec: Spec) -> AnyOf:  # noqa: N802 - reads like a type
    """``spec`` or ``null``."""
    return AnyOf(Null(), spec)


class Anything(Spec):
    """Any value (checked elsewhere, e.g. by a constructor)."""

    allowed = "any value"

    def ok(self, v) -> bool:
        return True


@dataclass
class Node:
    """A mapping with known keys. ``optional`` keys may be absent; ``open`` allows others."""

    keys: dict
    optional: tuple = ()
    open: bool = False

    def check(self, key: str, value) -> None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={show(value)} is not allowed: {key} must be a group of "
                              f"settings ({', '.join(self.keys)})")
        for k, spec in self.keys.items():
            if k not in value:
                if k not in self.optional:
                    raise ConfigError(f"setting '{_join(key, k)}' is missing (removed with ~?); "
                                      f"it is required: {_describe(spec)}")
                continue
            if value[k] == "???":
                raise ConfigError(f"setting '{_join(key, k)}' needs a value: "
                                  f"{_join(key, k)}=... ({_describe(spec)})")
            spec.check(_join(key, k), value[k])
        if not self.open:
            for k in value:
                if k not in self.keys:
                    raise ConfigError(f"unknown setting '{_join(key, k)}'; "
                                      f"{key or 'top level'} has: {', '.join(self.keys)}")


@dataclass
class Target:
    """A group node whose keys depend on one of its values (``_target_`` by default).

    ``table`` maps that value (a class path) to its keys; ``common`` keys are shared by every
    option of the group (and checked for unknown classes too); a class missing from ``table``
    keeps its other keys open (its constructor checks them), unless ``closed``.
    """

    table: dict
    common: dict = field(default_factory=dict)
    group: str = ""
    empty_ok: bool = False   # {} allowed (feature_map=default: the system's own features)
    key: str = "_target_"
    closed: bool = False     # a value missing from ``table`` is refused

    def check(self, key: str, value) -> None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={show(value)} is not allowed: {key} must be a group option "
                              "(a mapping with _target_)")
        if not value and self.empty_ok:
            return
        target = value.get(self.key)
        if self.closed and target not in self.table:
            raise ConfigError(f"{key}.{self.key}={show(target)} is not allowed; allowed: "
                              + ", ".join(self.table))
        if not isinstance(target, str) or not target:
            raise ConfigError(f"{key}.{self.key} is missing or not a class path "
                              f"({show(target)}); {key} needs '{self.key}: module.Class'")
        keys = {self.key: Str(), **self.common}
        own = self.table.get(target)
        if own is None:
            Node(keys, optional=tuple(keys), open=True).check(key, value)
        else:
            keys.update(own)
            Node(keys, optional=() if self.closed else tuple(keys)).check(key, value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _describe(spec) -> str:
    if isinstance(spec, Node):
        return "a group of settings (" + ", ".join(spec.keys) + ")"
    if isinstance(spec, Target):
        return f"a {spec.group or 'group'} option"
    return spec.allowed


# --- the tables ---------------------------------------------------------------------------------

POS_INT = Int(lo=1)
POS_REAL = Real(lo=0, lo_open=True)
NONNEG_REAL = Real(lo=0)
FINITE = Real()
FINITE_VEC = AnyOf(FINITE, ListOf(FINITE))
NONNEG_VEC = AnyOf(NONNEG_REAL, ListOf(NONNEG_REAL))
MATRIX = ListOf(ListOf(FINITE))

class StepDistribution(Spec):
    """``{kind: uniform_int, low: L, high: H}`` with integers ``1 <= L <= H``."""

    allowed = "{kind: uniform_int, low: L, high: H} with integers 1 <= L <= H"

    def ok(self, v) -> bool:
        return (isinstance(v, Mapping) and set(v) == {"kind", "low", "high"}
                and v["kind"] == "uniform_int" and _is_int(v["low"]) and _is_int(v["high"])
                and 1 <= v["low"] <= v["high"])


#: top-level knobs: name -> (meaning, spec); also the knobs a system's ``knobs`` node sets
KNOBS = {
    "M": ("number of clients", POS_INT),
    "N": ("trajectories per client", AnyOf(POS_INT, ListOf(POS_INT))),
    "T": ("trajectory length", POS_INT),
    "eps": ("heterogeneity", NONNEG_REAL),
    "K": ("local steps per round", AnyOf(POS_INT, ListOf(POS_INT), StepDistribution())),
    "lr": ("learning rate", POS_REAL),
    "R": ("communication rounds", POS_INT),
    "repeats": ("independent repetitions", POS_INT),
    "seed": ("root random seed", Int(lo=0)),
}
KNOB_MEANING = {k: meaning for k, (meaning, _) in KNOBS.items()}
#: knobs whose defaults come from the system's ``knobs`` node
SYSTEM_KNOBS = ("N", "T", "eps", "K", "lr", "R")

NOISE = Node({"kind": Choice("normal", "truncnormal", "uniform", "zero"),
              "scale": NONNEG_VEC, "loc": FINITE_VEC,
              "clip": Real(lo=0, lo_open=True, inf_ok=True)},
             optional=("scale", "loc", "clip"))

SCALINGS = Choice(False, True, "none", "diagonal", "zscore", "whiten")
REDUCTIONS = Choice("sum", "mean")
SYSTEM_COMMON = {
    "knobs": Node({k: KNOBS[k][1] for k in SYSTEM_KNOBS}),
    "solver": Node({"reduction": REDUCTIONS, "scale_features": SCALINGS}),
    "init": Node({"scale": FINITE, "reference": Choice("nominal", "client0")},
                 optional=("reference",)),
    "x0": NOISE, "inputs": NOISE, "disturbance": NOISE,
}
DENSE = {"A0": MATRIX, "B0": MATRIX, "V": MATRIX, "U": MATRIX}
NAMES = Optional(ListOf(Str()))      # column names, or null for the system's own
SYSTEMS = {
    "fnsysid.dynamics.systems.Generic": {"states": NAMES, "inputs": NAMES},
    "fnsysid.dynamics.systems.Synthetic": DENSE,
    "fnsysid.dynamics.systems.Linear": DENSE,
    "fnsysid.dynamics.systems.Pendulum": {"m": POS_REAL, "l": POS_REAL, "g": FINITE, "dt": POS_REAL,
                                 "gain": NONNEG_REAL},
    "fnsysid.dynamics.quadrotor.Quadrotor": {
        "m": POS_REAL, "Ixx": POS_REAL, "Iyy": POS_REAL, "Izz": POS_REAL,
        "drag": AnyOf(NONNEG_REAL, ListOf(NONNEG_REAL, 3)), "g": FINITE, "dt": POS_REAL,
        "identify_drag": Bool(),
        "controller": Node({"f0": FINITE, "z_ref": FINITE, "kp_z": NONNEG_REAL,
                            "kd_z": NONNEG_REAL, "kp_q": NONNEG_REAL, "kd_omega": NONNEG_REAL,
                            "c": ListOf(FINITE, 3)}),
    },
}

VARIABLES = Choice("x", "u", "xu")
FEATURE_MAPS: dict = {
    "fnsysid.dynamics.features.Identity": {"variables": VARIABLES, "bias": Bool()},
    "fnsysid.dynamics.features.Polynomial": {"degree": POS_INT, "variables": VARIABLES,
                                             "bias": Bool()},
    "fnsysid.dynamics.features.Fourier": {"variables": VARIABLES, "n_frequencies": POS_INT,
                                 "sin": Bool(), "cos": Bool()},
}
FEATURE_MAPS["fnsysid.dynamics.features.Concat"] = {
    "libraries": ListOf(Anything())}   # items checked one by one in check_config

_SOLVER = {"schedule": Choice("constant", "inverse_k"), "reduction": REDUCTIONS,
           "scale_features": SCALINGS}
OPTIMIZERS = {
    "fnsysid.learning.optim.GD": {**_SOLVER, "affine": Bool()},
    "fnsysid.learning.optim.SGD": {**_SOLVER, "batch_size": POS_INT},
}

WEIGHTING = {"weighting": Choice("uniform", "samples")}
#: federated strategies: share of clients taking part in each round
FEDERATED = {**WEIGHTING, "fraction": Real(lo=0, hi=1, lo_open=True)}
STRATEGIES = {
    "fnsysid.learning.strategies.FedAvg": FEDERATED,
    "fnsysid.learning.strategies.FedProx": {**FEDERATED, "mu": NONNEG_REAL},
    "fnsysid.learning.strategies.FedLin": FEDERATED,
    "fnsysid.learning.strategies.Scaffold": FEDERATED,
    "fnsysid.learning.strategies.FedNova": FEDERATED,
    "fnsysid.learning.strategies.OneShot": WEIGHTING,
    "fnsysid.learning.strategies.Local": WEIGHTING,
    "fnsysid.learning.strategies.Centralized": {**WEIGHTING, "exact": Bool()},
    "fnsysid.learning.strategies.Cyclic": WEIGHTING,
}

#: the ``data`` group, by ``data.source``
DATA = {
    "simulated": {"shared_noise": Bool(), "val_N": Int(lo=0), "states": NAMES,
                  "inputs": NAMES},
    "files": {"path": Str(), "states": NAMES, "inputs": NAMES, "truth": Optional(Str()),
              "holdout": Real(lo=0, hi=1, hi_open=True), "val_path": Optional(Str())},
}

#: the ``runtime`` group, by ``runtime.name``
RUNTIMES = {
    "inprocess": {},
    "flower": {"client_cpus": POS_REAL},
}

#: the whole run config (Hydra's own ``hydra`` node is checked by Hydra)
ROOT = Node({
    **{k: spec for k, (_, spec) in KNOBS.items()},
    # null with data=files: the files give them (validate.check_run)
    "M": Optional(KNOBS["M"][1]), "repeats": Optional(KNOBS["repeats"][1]),
    "system": Target(SYSTEMS, SYSTEM_COMMON, group="system"),
    "feature_map": Target(FEATURE_MAPS, group="feature_map", empty_ok=True),
    "optimizer": Target(OPTIMIZERS, group="optimizer"),
    "strategy": Target(STRATEGIES, group="strategy"),
    "data": Target(DATA, group="data", key="source", closed=True),
    "runtime": Target(RUNTIMES, group="runtime", key="name", closed=True),
    "theory": Node({"delta": Real(lo=0, hi=1, lo_open=True, hi_open=True)}),
    "output": Node({"per_client": Choice("auto", True, False), "per_client_max": Int(lo=0),
                    "plot": Bool(), "eval_every": POS_INT, "trajectories": Bool(),
                    "overwrite": Bool(), "resume": Bool()}),
    "progress": Bool(),
})
#: config groups chosen by name (``group=option``); ``experiment`` patches the whole config
GROUPS = ("data", "system", "feature_map", "optimizer", "strategy", "runtime", "experiment")


def check_config(cfg) -> dict:
    """Check a composed run config (DictConfig or plain dict) against :data:`ROOT`.

    Raises :class:`ConfigError` with a one-line message for the first offending key. Returns
    the settings checked: ``OmegaConf.to_container(cfg, resolve=True)`` without ``hydra``
    (for a plain dict a shallow copy of it), which the run reads instead of converting the
    config again; it must not be changed.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):
        raw = OmegaConf.to_container(cfg, resolve=False)
        raw.pop("hydra", None)
        _check_present(ROOT, raw)
        _check_system_present(raw.get("system"))
        try:
            plain = OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(one_line(exc)) from exc
    else:
        plain = dict(cfg)
    plain.pop("hydra", None)
    ROOT.check("", plain)
    fm = plain.get("feature_map") or {}
    for i, lib in enumerate(fm.get("libraries") or []):
        Target(FEATURE_MAPS, group="feature_map").check(f"feature_map.libraries[{i}]", lib)
    return plain


def _check_present(node: Node, raw: dict) -> None:
    """Missing top-level keys, before interpolations into them fail obscurely."""
    for k, spec in node.keys.items():
        if k not in raw and k not in node.optional:
            raise ConfigError(f"setting '{k}' is missing (removed with ~?); it is required: "
                              f"{_describe(spec)}")


def _check_system_present(system) -> None:
    """Keys every system YAML needs (``knobs``, ``solver``, ``init``), named when missing."""
    if not isinstance(system, dict):
        return
    for k in ("knobs", "solver", "init"):
        node = SYSTEM_COMMON[k]
        sub = system.get(k)
        if sub is None:
            raise ConfigError(f"system.{k} is missing: every system's YAML needs {k}: "
                              f"{_describe(node)} (see docs/EXTENDING.md)")
        missing = [kk for kk in node.keys if isinstance(sub, dict) and kk not in sub
                   and kk not in node.optional]
        if missing:
            raise ConfigError(f"system.{k}.{missing[0]} is missing: system.{k} needs "
                              f"{', '.join(node.keys)} (see docs/EXTENDING.md)")


def leaf_spec(key: str):
    """The spec of a dotted key of a plain node of :data:`ROOT` (None inside groups)."""
    node = ROOT
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, Node) or part not in node.keys:
            return None
        node = node.keys[part]
        if isinstance(node, Target):
            if node.key == "_target_" or i != len(parts) - 2:
                return None
            # a group keyed by a plain value (data.source): the key's spec if all agree
            specs = {id(t[parts[-1]]): t[parts[-1]] for t in node.table.values()
                     if parts[-1] in t}
            return next(iter(specs.values())) if len(specs) == 1 else None
        if i == len(parts) - 1:
            return node
    return None


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (Hydra and OmegaConf messages span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "reference_type="))]
    return "; ".join(keep[:3]) if keep else type(exc).__name__
