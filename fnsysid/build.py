"""From a composed config to the objects of a run: model, optimizer, strategy, start model.

Constructor errors become :class:`~fnsysid.validate.ConfigError` with one line naming the
group, so bad settings are reported before anything runs.
"""

from __future__ import annotations

import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .model import ClientData, FeatureMapError, Model, build_model
from .options import load_option, options
from .validate import ConfigError

#: keys of a system config that configure the run, not the system object
SYSTEM_RUN_KEYS = ("knobs", "solver", "init")


def _build(node, what: str, drop=()):
    """Instantiate a config group node (a DictConfig, or a plain dict that stays unchanged),
    turning constructor errors into ConfigError."""
    cfg = dict(node) if isinstance(node, dict) else OmegaConf.to_container(node, resolve=True)
    for k in drop:
        cfg.pop(k, None)
    # in the config rather than a keyword: instantiate merges keywords into a copy of it
    cfg["_convert_"] = "all"
    try:
        return instantiate(cfg)
    except Exception as exc:  # hydra wraps constructor errors; report the root cause
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        hint = ""
        if isinstance(root, ImportError):
            hint = " (put the folder of your module on PYTHONPATH; see docs/EXTENDING.md)"
        raise ConfigError(f"{what}: {root}{hint}") from exc


def build(cfg: DictConfig, resolved: dict | None = None):
    """Build (model, optimizer, strategy) from a composed config; ``resolved``: its settings
    as :func:`~fnsysid.validate.check_run` returns them, if at hand (the groups are read from
    there instead of being resolved again)."""
    groups = cfg if resolved is None else resolved
    system = _build(groups["system"], "system", SYSTEM_RUN_KEYS)
    library = None
    if cfg.feature_map.get("_target_"):
        library = _build(groups["feature_map"], "feature_map")
    try:
        model = build_model(system, library)
    except FeatureMapError as exc:
        name = option_name("feature_map", cfg.feature_map)
        raise ConfigError(f"feature_map={name} does not fit system={system.name}: {exc}; "
                          f"options that fit: {', '.join(fitting_feature_maps(system))}") from exc
    optimizer = _build(groups["optimizer"], "optimizer")
    strategy = _build(groups["strategy"], "strategy")
    return model, optimizer, strategy


def option_name(group: str, node) -> str:
    """Name of the group option whose YAML equals ``node`` ("custom" if none does)."""
    plain = OmegaConf.to_container(node, resolve=True)
    for name in options(group):
        if OmegaConf.to_container(load_option(group, name)) == plain:
            return name
    return "custom"


def fitting_feature_maps(system) -> list[str]:
    """Options of the feature_map group that can represent ``system``."""
    fit = []
    for name in options("feature_map"):
        node = load_option("feature_map", name)
        lib = instantiate(node, _convert_="all") if node.get("_target_") else None
        try:
            build_model(system, lib)
            fit.append(name)
        except FeatureMapError:
            pass
    return fit


def initial_model(model: Model, data: ClientData | None, init,
                  repeats: int | None = None) -> np.ndarray:
    """Server model of round 0, (S, p): ``init.scale`` times the nominal model or client 0's.

    Without ``data`` (a federated server sees none) only the nominal reference is possible and
    ``repeats`` gives S.
    """
    ref = init.get("reference", "nominal")
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
    return float(init.get("scale", 0.0)) * np.array(base)
