"""Config group options: which YAML files each group (system, strategy, ...) offers.

The one place that knows where group options live: Hydra's config search path (``conf/``,
plus ``--config-dir`` and ``hydra.searchpath``), read through Hydra's public compose API
(:func:`hydra.initialize_config_dir`, :func:`hydra.compose`) and its config loader's
:meth:`get_group_options`.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from omegaconf import DictConfig

from fnsysid.config.errors import ConfigError

#: the project's config folder: ``conf/`` beside the package in a checkout, ``fnsysid/conf/``
#: inside an installed wheel
_PACKAGE = Path(__file__).resolve().parents[1]
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else _PACKAGE.parent / "conf"


def job_dirname(override_dirname: str) -> str:
    """A sweep job's folder name from its overrides (Hydra's ``hydra.job.override_dirname``),
    one path component inside ``hydra.sweep.dir``: ``%`` is written ``%25`` and ``/`` is
    written ``%2F`` (URL encoding, so names stay distinct and readable), so a value such as
    ``data.path=../../logs`` names the folder ``data.path=..%2F..%2Flogs`` instead of a
    folder beside the sweep. A name longer than a file name may be (255 bytes) keeps its first
    200 bytes and ends in a hash of the whole (``...~1a2b3c4d5e6f``), so it stays one distinct
    folder. The resolver ``fnsysid.job_dirname`` of ``hydra.sweep.subdir``.

    >>> job_dirname("data.path=../logs,M=5")
    'data.path=..%2Flogs,M=5'
    >>> len(job_dirname("x=" + "a" * 300).encode())
    213
    """
    import hashlib

    name = str(override_dirname).replace("%", "%25").replace("/", "%2F")
    raw = name.encode()
    if len(raw) <= 255:
        return name
    head = raw[:200].decode(errors="ignore")
    return f"{head}~{hashlib.sha1(raw).hexdigest()[:12]}"


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("fnsysid.job_dirname"):
        OmegaConf.register_new_resolver("fnsysid.job_dirname", job_dirname)


_register_resolvers()


#: held while this process's Hydra (one :class:`~hydra.core.global_hydra.GlobalHydra` per
#: process) is initialized for a composition: runs in threads (``fnsysid.run``) compose one
#: after another instead of initializing or clearing it under each other
HYDRA_LOCK = threading.RLock()


@contextmanager
def hydra_context():
    """Hydra initialized on ``conf/`` for :func:`hydra.compose`, under :data:`HYDRA_LOCK`.

    Inside a running Hydra job (or a block of this already) Hydra is already initialized:
    that initialization is used as it is.
    """
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with HYDRA_LOCK:
        if GlobalHydra.instance().is_initialized():
            yield
            return
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3",
                                   job_name="fnsysid"):
            yield


def with_config_dir(overrides: list[str], folder: str | Path | None) -> list[str]:
    """``overrides`` with ``folder`` (the command line's ``--config-dir``) added to the
    config search path through ``hydra.searchpath`` (merged with one given there), so that
    compositions through the compose API find the options it holds."""
    if folder is None:
        return list(overrides)
    if not os.path.isdir(folder):
        raise ConfigError(f"--config-dir {folder}: no such folder")
    path = f"file://{os.path.abspath(folder)}"
    entry = "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"   # quoted: , = ] ok
    out, merged = [], False
    for line in overrides:
        key, _, value = line.partition("=")
        if key.lstrip("+") == "hydra.searchpath" and value.startswith("["):
            inner = value.strip()[1:-1].strip()
            line = f"{key}=[{inner + ',' if inner else ''}{entry}]"
            merged = True
        out.append(line)
    return out if merged else [*out, f"hydra.searchpath=[{entry}]"]


#: (config name, ``hydra.searchpath`` overrides) of the command being checked, while
#: :func:`command` is on (the check before a run composes outside a Hydra job)
_COMMAND: ContextVar[tuple[str, list[str]] | None] = ContextVar("fnsysid_command", default=None)


@contextmanager
def command(config_name: str, searchpath: list[str]):
    """Within the block, :func:`options` and :func:`load_option` read the config search path
    of the command being checked (its ``--config-dir`` and ``hydra.searchpath``)."""
    token = _COMMAND.set((config_name, list(searchpath)))
    try:
        yield
    finally:
        _COMMAND.reset(token)


def _job_overrides() -> tuple[str, list[str]]:
    """(config name, ``hydra.searchpath`` overrides) of the running Hydra job or of the
    command being checked; ``config`` and none otherwise."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return _COMMAND.get() or ("config", [])
    hc = HydraConfig.get()
    return hc.job.config_name, [o for o in hc.overrides.hydra
                                if o.lstrip("+").startswith("hydra.searchpath")]


def options(group: str, searchpath: list[str] | None = None) -> list[str]:
    """Options of a config group found through Hydra's config search path (``conf/<group>/``
    and the folders of ``--config-dir`` and of the ``hydra.searchpath`` overrides in
    ``searchpath``; inside a running job: the job's own)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    with hydra_context():
        name, job_searchpath = _job_overrides()
        loader = GlobalHydra.instance().config_loader()
        return sorted(loader.get_group_options(group, ObjectType.CONFIG, name,
                                               list(searchpath or job_searchpath)))


def load_option(group: str, name: str, overrides: list[str] | None = None) -> DictConfig:
    """The node that option ``name`` of ``group`` gives the composed config (unresolved),
    composed through the search path (``overrides``: other settings of the composition)."""
    from hydra import compose
    from hydra.errors import HydraException

    with hydra_context():
        config_name, searchpath = _job_overrides()
        try:
            cfg = compose(config_name, overrides=[*searchpath, *(overrides or []),
                                                  f"{group}={name}"])
        except HydraException as exc:
            raise ConfigError(f"{group}={name} is not an option; allowed: "
                              f"{', '.join(options(group))}") from exc
    return cfg[group]
