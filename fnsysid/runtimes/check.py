"""Where the rounds run: the ``runtime`` config group.

``inprocess`` (default): the vectorized engine, every client of every repeat in one array.
``flower``: Flower's simulation engine, a ServerApp and one ClientApp per client
(:mod:`fnsysid.runtimes.flower`); needs the ``flower`` extra. Both run the same strategy code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fnsysid.config.checks import ConfigError
from fnsysid.learning.strategies import Federated


class FlowerError(RuntimeError):
    """Under ``runtime=flower``: a client answered with an error, or did not answer."""

RUNTIMES = ("inprocess", "flower")
INSTALL_FLOWER = "pip install -e '.[flower]' (or make install-flower)"


def flower_installed() -> bool:
    """Whether Flower and its simulation backend (Ray) can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in ("flwr", "ray"))


def check_runtime(settings, optimizer, strategy) -> None:
    """Raise :class:`ConfigError` if the run cannot use ``settings.runtime``."""
    name = settings.runtime.name
    if name not in RUNTIMES:
        raise ConfigError(f"runtime={name} is not allowed; allowed: {', '.join(RUNTIMES)}")
    if name == "inprocess":
        return
    if not flower_installed():
        raise ConfigError(f"runtime=flower needs Flower, which is not installed: {INSTALL_FLOWER}")
    if not isinstance(strategy, Federated):
        raise ConfigError(f"runtime=flower runs the federated strategies (fedavg, fedprox, "
                          f"fedlin, scaffold, fednova); strategy {type(strategy).__name__} runs "
                          f"only with runtime=inprocess")
    if optimizer.needs_samples:
        raise ConfigError("runtime=flower supports optimizer=gd; optimizer=sgd runs only with "
                          "runtime=inprocess")
    if settings.system.init.reference != "nominal":
        raise ConfigError("runtime=flower needs system.init.reference=nominal (the server "
                          "does not see client 0's parameters)")
    if settings.output.trajectories:
        raise ConfigError("output.trajectories=true exports the data of an in-process run; "
                          "with runtime=flower each client keeps its own")
    if settings.files and settings.data.val_path:
        raise ConfigError("data.val_path runs only with runtime=inprocess; with runtime=flower "
                          "each client's held-out trajectories are in its own file (rows with "
                          "split=val, or the last ones data.holdout marks)")
    if settings.files and not Path(str(settings.data.path)).is_dir():
        raise ConfigError(f"runtime=flower with data=files needs data.path to be a folder with "
                          f"one file per client (each ClientApp reads its own); got "
                          f"{settings.data.path}")


def node_settings(settings, path=None, truth_path: str | None = None):
    """The settings with which a node reads its own file ``path`` (None: the settings with
    which the whole ``data.path`` folder is checked before the simulation starts): no held-out
    files (a node trains on what the in-process run trains on: with ``data.val_path``, all
    of its rows; else what ``data.holdout`` leaves); ``truth_path``: its own truth file."""
    data = {**settings.resolved["data"], "val_path": None}
    if settings.data.val_path:
        data["holdout"] = 0.0
    if path is not None:
        data.update(path=str(path), truth=truth_path)
    return settings.replace(data=data)
