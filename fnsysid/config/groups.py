"""Config group options: which YAML files each group (system, strategy, ...) offers.

The one place that knows where group options live: Hydra's config search path (``conf/``,
plus ``--config-dir`` and ``hydra.searchpath``), as Hydra's own entry point builds it. The
command line, the builders and the plotting read group options through :func:`options` and
:func:`load_option`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

from fnsysid.config.schema import ConfigError

#: the project's config folder: ``conf/`` beside the package in a checkout, ``fnsysid/conf/``
#: inside an installed wheel
_HERE = Path(__file__).resolve().parents[1]
CONF_DIR = _HERE / "conf" if (_HERE / "conf").is_dir() else _HERE.parent / "conf"


def flag_value(argv: list[str], *names: str) -> str | None:
    """Value of the last Hydra flag among ``names`` in ``argv`` (``--flag v`` or ``--flag=v``)."""
    value = None
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            value = argv[i + 1]
        elif "=" in a and a.split("=", 1)[0] in names:
            value = a.split("=", 1)[1]
    return value


@contextmanager
def hydra_session(argv: list[str] | None = None, job_name: str = "fnsysid"):
    """Hydra's config loader for the command ``argv``, with its config search path.

    Yields ``(config_loader, config_name, searchpath_overrides)``. The search path is the one
    Hydra's own entry point builds: ``conf/`` (or ``--config-path``), ``--config-dir`` and
    ``hydra.searchpath=[...]``; compositions get ``job_name`` as ``hydra.job.name``. With
    ``argv=None`` inside a running job, the job's own loader.
    """
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    if argv is None and GlobalHydra.instance().is_initialized():
        try:
            from hydra.core.hydra_config import HydraConfig

            hc = HydraConfig.get()
            searchpath = [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath")]
            yield GlobalHydra.instance().config_loader(), hc.job.config_name, searchpath
            return
        except ValueError:    # initialized by compose(), not by a run: use conf/ below
            pass
    argv = argv or []
    csp = create_config_search_path(config_path_dir(flag_value(argv, "--config-path", "-cp")))
    extra = flag_value(argv, "--config-dir", "-cd")
    if extra is not None:
        if not os.path.isdir(extra):
            raise ConfigError(f"--config-dir {extra}: no such folder")
        csp.prepend(provider="command-line", path=f"file://{os.path.abspath(extra)}",
                    anchor=SearchPathQuery(provider="schema"))     # as Hydra's own main does
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        Hydra.create_main_hydra2(task_name=job_name, config_search_path=csp)
        name = flag_value(argv, "--config-name", "-cn") or "config"
        searchpath = [a for a in argv if a.lstrip("+").startswith("hydra.searchpath=")]
        yield GlobalHydra.instance().config_loader(), name, searchpath
    finally:
        restore_gh_from_backup(backup)


def config_path_dir(config_path: str | None) -> str:
    """Where Hydra's entry point looks for the primary config given ``--config-path``: ``conf/``
    without it, an absolute path as given, and a relative one as Hydra resolves it beside the
    module of the task function (in a checkout, ``pkg://fnsysid/<path>``, a folder inside the
    package, not beside ``run.py`` nor in the working folder)."""
    if config_path is None:
        return str(CONF_DIR)
    from hydra._internal.utils import compute_search_path_dir

    return compute_search_path_dir(None, "fnsysid.app.cli", config_path)


def repository(loader, config_name: str, searchpath: list[str]):
    """Hydra's config repository for a command: its search path plus ``hydra.searchpath``."""
    try:
        return loader._parse_overrides_and_create_caching_repo(config_name, searchpath)[1]
    except Exception:     # the primary config itself is missing: the search path alone
        return loader._parse_overrides_and_create_caching_repo(None, [])[1]


def options(group: str, argv: list[str] | None = None) -> list[str]:
    """Options of a config group found through Hydra's config search path.

    ``conf/<group>/`` plus the folders that ``--config-dir`` and ``hydra.searchpath`` in
    ``argv`` add (inside a running job: the job's own search path).
    """
    from hydra.core.object_type import ObjectType

    with hydra_session(argv) as (loader, name, searchpath):
        return sorted(repository(loader, name, searchpath).get_group_options(
            group, ObjectType.CONFIG))


def load_option(group: str, name: str, argv: list[str] | None = None) -> DictConfig:
    """The YAML of option ``name`` of ``group``, unresolved, found through the search path."""
    with hydra_session(argv) as (loader, config_name, searchpath):
        result = repository(loader, config_name, searchpath).load_config(f"{group}/{name}")
    if result is None:
        raise ConfigError(f"{group}={name} is not an option; allowed: "
                          f"{', '.join(options(group, argv))}")
    return result.config
