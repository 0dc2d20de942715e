"""From a composed config to the objects of a run: model, optimizer, strategy, start model.

Constructor errors become :class:`~fnsysid.config.checks.ConfigError` with one line naming the
group, so bad settings are reported before anything runs.
"""

from __future__ import annotations

import shlex
from functools import lru_cache

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fnsysid.config.checks import ConfigError
from fnsysid.config.groups import load_option, options
from fnsysid.dynamics.model import FeatureMapError, build_model

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
    as :func:`~fnsysid.config.checks.check_run` returns them, if at hand (the groups are read from
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


@lru_cache(maxsize=4096)
def client_node(cfg_yaml: str, index: int | None, data_path: str | None,
                truth_path: str | None):
    """The node of a client, built once per process (a pure function of its arguments)."""
    from fnsysid.runtimes.flower import ClientNode

    cfg = OmegaConf.create(cfg_yaml)
    model, optimizer, strategy = build(cfg)
    return ClientNode(cfg, model, optimizer, strategy, index, data_path, truth_path)


def build_client_app(cfg_yaml: str | None = None):
    """The ClientApp of a run with resolved config ``cfg_yaml`` (None: composed from the run
    config's ``overrides``, as ``flwr run`` passes it)."""
    from fnsysid.runtimes.flower import make_client_app, node_identity

    def node(context):
        text = cfg_yaml if cfg_yaml is not None else compose_yaml(
            str(context.run_config.get("overrides", "")))
        return client_node(text, *node_identity(context))

    return make_client_app(node)


@lru_cache(maxsize=16)
def compose_yaml(overrides: str) -> str:
    """The resolved config (YAML) of ``run.py`` overrides (on a node: the server checks them)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fnsysid.config.groups import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[*shlex.split(overrides), "progress=false"])
    finally:
        GlobalHydra.instance().clear()
    return OmegaConf.to_yaml(cfg, resolve=True)
