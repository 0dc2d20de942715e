"""From a composed config to the objects of a run: model, optimizer, strategy, start model.

Constructor errors become :class:`~fnsysid.config.checks.ConfigError` with one line naming the
group, so bad settings are reported before anything runs.
"""

from __future__ import annotations

import json
import shlex
from functools import lru_cache

from hydra.utils import instantiate
from omegaconf import OmegaConf

from fnsysid.config.checks import ConfigError, check_run
from fnsysid.config.errors import show
from fnsysid.config.groups import load_option, options
from fnsysid.config.schema import Settings, System, settings_from
from fnsysid.dynamics.model import FeatureMapError, build_model
from fnsysid.learning.privacy import build_privacy
from fnsysid.learning.sparsity import build_sparsity

#: modules of the classes a ``_target_`` names, moved into the stage folders in 0.1.0
#: (CHANGELOG.md): old module -> new module
MOVED = {"fnsysid.features": "fnsysid.dynamics.features",
         "fnsysid.systems": "fnsysid.dynamics.systems",
         "fnsysid.quadrotor": "fnsysid.dynamics.quadrotor",
         "fnsysid.optim": "fnsysid.learning.optim",
         "fnsysid.strategies": "fnsysid.learning.strategies"}


def check_moved(node, what: str) -> None:
    """Refuse a ``_target_`` (anywhere in ``node``) of a module that moved, naming the new
    path: ``system._target_=fnsysid.systems.Pendulum`` -> ``fnsysid.dynamics.systems``."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and "." in target:
            module, name = target.rsplit(".", 1)
            if module in MOVED:
                raise ConfigError(f"{what}._target_={target}: module {module} moved to "
                                  f"{MOVED[module]} (CHANGELOG.md, 0.1.0); allowed: _target_: "
                                  f"{MOVED[module]}.{name}")
        for k, v in node.items():
            check_moved(v, f"{what}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            check_moved(v, f"{what}[{i}]")


def _build(node: dict, what: str, drop=()):
    """Instantiate a config group node (plain, left unchanged), turning constructor errors
    into ConfigError."""
    check_moved(node, what)
    cfg = {k: v for k, v in node.items() if k not in drop}
    # in the config rather than a keyword: instantiate merges keywords into a copy of it
    cfg["_convert_"] = "all"
    try:
        return instantiate(cfg)
    except Exception as exc:  # hydra wraps constructor errors; report the root cause
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        hint = ""
        if isinstance(root, ImportError) and str(getattr(root, "name", "")).startswith("fnsysid"):
            hint = (" (fnsysid's classes are in its stage folders, e.g. "
                    "fnsysid.dynamics.systems.Pendulum, fnsysid.dynamics.features.Polynomial, "
                    "fnsysid.learning.strategies.FedAvg; see README, Layout)")
        elif isinstance(root, ImportError):
            hint = " (put the folder of your module on PYTHONPATH; see docs/EXTENDING.md)"
        raise ConfigError(f"{what}: {root}{hint}") from exc


def build(settings: Settings):
    """Build (model, optimizer, strategy) from checked settings (each class from its group's
    ``_target_`` through Hydra's ``instantiate``); a composed config is checked first."""
    if not isinstance(settings, Settings):
        settings = check_run(settings)
    groups = settings.resolved
    system = _build(groups["system"], "system", System.RUN_KEYS)
    library = None
    if groups["feature_map"]:
        library = _build(groups["feature_map"], "feature_map")
    try:
        model = build_model(system, library)
    except FeatureMapError as exc:
        nodes = option_nodes("feature_map")      # each option composed once for both answers
        name, changed = chosen_option("feature_map", groups["feature_map"], nodes)
        chosen = f"feature_map={name}" + (" with " + ", ".join(
            f"feature_map.{k}={show(v)}" for k, v in changed.items()) if changed else "")
        own = ", ".join(f"{k}={show(nodes[name].get(k))}" for k in changed)
        fit = [f"{n} with its default {own}" if n == name and changed else n
               for n in fitting_feature_maps(system, nodes)]
        raise ConfigError(f"{chosen} does not fit system={system.name}: {exc}; "
                          f"options that fit: {', '.join(fit)}") from exc
    optimizer = _build(groups["optimizer"], "optimizer")
    strategy = _build(groups["strategy"], "strategy")
    strategy.sparsity = build_sparsity(groups.get("sparsity"))
    strategy.privacy = build_privacy(groups.get("privacy"))
    if strategy.privacy is not None:           # the noise fixed (or refused) before the run
        if hasattr(strategy, "model_change"):  # DP-FedAvg: one sampled release a round
            strategy.privacy.plan(settings.R, strategy.fraction, dp_fedavg(settings), settings.M)
        else:
            exact = getattr(strategy, "exact", False)
            strategy.privacy.plan(1, 1.0, "Gaussian on the clipped sum of the clients' "
                                  + ("statistics (H_i, b_i)" if exact else
                                     "own least-squares estimates and their count"),
                                  settings.M)
    return model, optimizer, strategy


def dp_fedavg(settings) -> str:
    """What ``summary.json``'s ``privacy.mechanism`` says of a DP-FedAvg run."""
    if settings.runtime.name == "flower":
        return ("DP-FedAvg with Flower's blocks: fixedclipping_mod (each client clips its model "
                "change) and DifferentialPrivacyClientSideFixedClipping (Gaussian noise on the "
                "mean of the round), each round")
    return "DP-FedAvg: Gaussian on the clipped sum of the clients' model changes, each round"


def option_nodes(group: str) -> dict[str, dict]:
    """Each option of ``group`` (in the order of :func:`options`) with its resolved node."""
    return {name: OmegaConf.to_container(load_option(group, name), resolve=True)
            for name in options(group)}


def option_name(group: str, node: dict, nodes: dict[str, dict] | None = None) -> str:
    """Name of the group option whose YAML gives ``node`` ("custom" if none does);
    ``nodes``: the options' nodes (:func:`option_nodes`), loaded here if not given."""
    nodes = option_nodes(group) if nodes is None else nodes
    return next((name for name, option in nodes.items() if option == node), "custom")


def chosen_option(group: str, node: dict, nodes: dict[str, dict] | None = None
                  ) -> tuple[str, dict]:
    """The option of ``group`` that ``node`` was made from and the settings it changed:
    the option whose YAML gives ``node`` (nothing changed), else the one of the same class
    (``_target_``) that differs from it in the fewest settings (``feature_map=combined`` with
    its ``libraries`` changed), else ``("custom", {})``."""
    nodes = option_nodes(group) if nodes is None else nodes
    name = option_name(group, node, nodes)
    if name != "custom" or not isinstance(node, dict) or "_target_" not in node:
        return name, {}
    diffs = {n: {k: v for k, v in node.items() if option.get(k, object()) != v}
             for n, option in nodes.items()
             if isinstance(option, dict) and option.get("_target_") == node["_target_"]}
    fewest = sorted(diffs.items(), key=lambda item: len(item[1]))
    if not fewest or (len(fewest) > 1 and len(fewest[0][1]) == len(fewest[1][1])):
        return "custom", {}
    return fewest[0]


def fitting_feature_maps(system, nodes: dict[str, dict] | None = None) -> list[str]:
    """Options of the feature_map group that can represent ``system``; ``nodes``: the
    options' nodes (:func:`option_nodes`), loaded here if not given."""
    fit = []
    for name, node in (option_nodes("feature_map") if nodes is None else nodes).items():
        lib = _build(node, f"feature_map={name}") if node else None
        try:
            build_model(system, lib)
            fit.append(name)
        except FeatureMapError:
            pass
    return fit


@lru_cache(maxsize=4096)
def client_node(settings_json: str, index: int | None, data_path: str | None,
                truth_path: str | None, sources=None):
    """The node of a client, built once per process (a pure function of its arguments;
    ``settings_json``: the run's resolved settings as JSON; ``sources``: the
    :class:`~fnsysid.runtimes.flower.NodeSources` of a simulated run with ``data=files``)."""
    from fnsysid.runtimes.flower import ClientNode

    settings = check_run(settings_from(json.loads(settings_json)))
    model, optimizer, strategy = build(settings)
    truth = None
    if sources is not None and data_path is None and index is not None:
        data_path, truth = sources.of(index)
    return ClientNode(settings, model, optimizer, strategy, index, data_path, truth_path, truth)


def build_client_app(settings_json: str | None = None, sources=None):
    """The ClientApp of a run with resolved settings ``settings_json`` (None: composed from
    the run config, as ``flwr run`` passes it: :func:`fnsysid.runtimes.flower.
    deployed_overrides`); ``sources``: each client's file and truth (simulation engine)."""
    from fnsysid.runtimes.flower import deployed_overrides, make_client_app, node_identity

    def node(context):
        if settings_json is not None:
            text = settings_json
        else:
            text = compose_json(shlex.join(deployed_overrides(context.run_config)[0]))
        return client_node(text, *node_identity(context), sources)

    return make_client_app(node)


@lru_cache(maxsize=16)
def compose_json(overrides: str) -> str:
    """The resolved settings (JSON) of ``run.py`` overrides (on a node: the server checks
    them)."""
    from hydra import compose

    from fnsysid.config.groups import hydra_context

    with hydra_context():
        cfg = compose("config", overrides=[*shlex.split(overrides), "progress=false"])
    return json.dumps(check_run(cfg).resolved)
