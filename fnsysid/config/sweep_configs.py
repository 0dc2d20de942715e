"""Hydra's config loader, composing each config once: a command's own config (checked before
the run, read for ``hydra.mode``, then run) and, in sweeps whose jobs differ in plain values,
one config per choice of config groups with each job's values applied.

A command composes its config three times: the check before the run (``fnsysid.app.cli``, through
Hydra's compose API), Hydra's ``get_mode`` (in ``RunMode.MULTIRUN``, to read ``hydra.mode``) and
Hydra's ``run`` (or ``multirun``), each about 0.08 s of CPU for this project's config.
:class:`ComposeOnceLoader` keeps the composition of the command and returns a copy of it to the
later requests that would compose the same: the same config search path, config name and
overrides, job name, working folder and version base (all that Hydra's
``ConfigLoaderImpl._load_configuration_impl`` reads besides the config files and the variables
of ``hydra.job.env_copy``, which are compared too). A composition in ``RunMode.RUN`` also stands
for one in ``RunMode.MULTIRUN``: the two differ only in skipping config groups left ``???``,
which a composition in ``RunMode.RUN`` refuses, so one that succeeded met none. The
``hydra.mode=RUN`` (or ``MULTIRUN``) that Hydra's entry point appends when the config sets no
mode is applied to the copy as Hydra applies it (a value override, applied last, recorded last
in ``hydra.overrides.hydra``). Hydra's checks of sweep overrides run on every request.

Hydra also composes every job of a multirun from scratch (its sweeper once to check the batch,
its launcher again to run the job), more than a small job's arithmetic. Yet the jobs of a stored
experiment mostly differ in plain values (``M=1,9,25``), which Hydra applies last, on top of the
config merged from the defaults list. :class:`ReusingConfigLoader` keeps Hydra's composition of
the first job with each choice of config groups (and of ``hydra.*`` overrides) and builds the
other jobs from a copy of it, applying their value overrides and setting their override records
as Hydra's own ``_load_configuration_impl`` does. The sweeper, the launcher, the job records in
``.hydra/`` and the sweep callbacks are Hydra's; ``tests/test_sweep_configs.py`` checks that
every job of every stored experiment gets the config Hydra itself composes.

Hydra's sweeper composes every job to check its batch, then the launcher composes each job
again; within :func:`reuse_compositions` (jobs) the launcher gets the config the check composed
for that job (used once). Hydra also reads and parses each config file again for every
composition: within :func:`keep_config_files` each file is parsed once and every composition
gets a copy (about a fifth of the cost of the parse).

``run.py`` composes its command's config once (:func:`reuse_compositions` with the command's
overrides, jobs of sweeps as Hydra composes them); ``scripts/make_figure.py`` also reuses the
compositions of sweep jobs and keeps the config files for the whole invocation.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from contextlib import contextmanager

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.config_repository import ConfigRepository
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from hydra.plugins.sweeper import Sweeper
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

_PARSED: dict[str, Override] = {}


def _parse(line: str) -> Override:
    """Hydra's parse of one override (parsed once per text: the grammar is slow)."""
    if line not in _PARSED:
        _PARSED[line] = OverridesParser.create().parse_override(line)
    return _PARSED[line]


#: what Hydra's entry point appends to the overrides when the config sets no ``hydra.mode``
_MODES = ("hydra.mode=RUN", "hydra.mode=MULTIRUN")


class _Store:
    """Compositions kept in one :func:`reuse_compositions` block: (run mode, config) by what
    the composition depends on (:meth:`ComposeOnceLoader._key`)."""

    def __init__(self, command: list[str] | None = None):
        #: overrides whose composition in RunMode.RUN is kept (the command line's own)
        self.command = None if command is None else tuple(command)
        self.configs: dict[tuple, tuple[RunMode, DictConfig]] = {}


_STORE: _Store | None = None

#: config files as Hydra's repository loaded them, by (config sources, config path), within
#: one :func:`keep_config_files` block (None outside)
_FILES: dict[tuple, object] | None = None


class _KeepingRepository(ConfigRepository):
    """Hydra's ``ConfigRepository`` that, within :func:`keep_config_files`, reads and parses
    each config file once and hands every request a copy of the result (Hydra merges a loaded
    config's nodes into the composition without copying them, then changes them)."""

    def load_config(self, config_path: str):
        if _FILES is None:
            return super().load_config(config_path)
        key = (tuple((type(s), s.provider, s.path) for s in self.sources), config_path)
        if key not in _FILES:
            _FILES[key] = super().load_config(config_path)
        kept = _FILES[key]
        if kept is None:
            return None
        return dataclasses.replace(kept, config=copy.deepcopy(kept.config),
                                   header=dict(kept.header),
                                   defaults_list=copy.deepcopy(kept.defaults_list))


@contextmanager
def keep_config_files():
    """Within the block, compositions through :class:`ComposeOnceLoader` read each config file
    once (the files must not change within the block; a later block reads them again)."""
    global _FILES
    saved, _FILES = _FILES, ({} if _FILES is None else _FILES)
    try:
        yield
    finally:
        _FILES = saved


class ComposeOnceLoader(ConfigLoaderImpl):
    """``ConfigLoaderImpl`` that composes a command's config once: later requests for the same
    composition (or for it plus Hydra's ``hydra.mode``) get a copy of the first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.repository.__class__ = _KeepingRepository      # Hydra's, plus keep_config_files
        self._store = _STORE if _STORE is not None else _Store()

    def __getstate__(self):
        """Sent to a launcher's workers without the kept compositions."""
        state = self.__dict__.copy()
        state["_store"] = _Store()
        return state

    def _key(self, config_name, overrides) -> tuple:
        """What ``_load_configuration_impl`` reads besides the config files and the variables
        of ``hydra.job.env_copy``: search path, config name, overrides, job name, working
        folder and version base."""
        from hydra import version
        from hydra.core.utils import JobRuntime

        path = tuple((e.provider, e.path) for e in self.config_search_path.get_path())
        return (path, config_name, tuple(overrides), JobRuntime().get("name"), os.getcwd(),
                str(version.getbase()))

    def _kept(self, config_name, overrides: list[str], run_mode):
        """(kept composition, Hydra's mode override to apply on it or None), or None."""
        splits = [(overrides, None)]
        if overrides and overrides[-1] in _MODES:
            splits.append((overrides[:-1], overrides[-1]))
        for head, mode_override in splits:
            mode, cfg = self._store.configs.get(self._key(config_name, head), (None, None))
            if cfg is None or (mode == RunMode.MULTIRUN and run_mode != RunMode.MULTIRUN):
                continue                         # RUN refuses groups left ???, MULTIRUN skips
            job = cfg.hydra.job
            if all(os.environ.get(k) == job.env_set.get(k) for k in job.env_copy):
                return cfg, mode_override
        return None

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True,
                           validate_sweep_overrides=True) -> DictConfig:
        """Hydra's, from a copy of a kept composition if there is one."""
        overrides = list(overrides)
        kept = self._kept(config_name, overrides, run_mode)
        if kept is None:
            cfg = super().load_configuration(config_name, overrides, run_mode, from_shell,
                                             validate_sweep_overrides)
            key = self._key(config_name, overrides)
            if (run_mode == RunMode.RUN and tuple(overrides) == self._store.command) or \
                    (run_mode == RunMode.MULTIRUN and key not in self._store.configs):
                self._store.configs[key] = run_mode, copy.deepcopy(cfg)
            return cfg
        if validate_sweep_overrides:
            self.validate_sweep_overrides_legal(overrides=[_parse(o) for o in overrides],
                                                run_mode=run_mode, from_shell=from_shell)
        cfg = copy.deepcopy(kept[0])
        if kept[1] is not None:       # as _load_configuration_impl: applied last, recorded last
            try:
                ConfigLoaderImpl._apply_overrides_to_config([_parse(kept[1])], cfg)
            except OmegaConfBaseException as e:
                raise ConfigCompositionException().with_traceback(sys.exc_info()[2]) from e
            cfg.hydra.overrides.hydra.append(kept[1])
        return cfg


class ReusingConfigLoader(ComposeOnceLoader):
    """:class:`ComposeOnceLoader` whose :meth:`load_sweep_config` reuses the composition of an
    earlier job with the same config-group (and ``hydra.*``) overrides."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bases: dict[tuple, DictConfig] = {}
        self._groups: dict[str, bool] = {}
        #: jobs' configs composed by the sweeper's check of its batch, for the launcher: by
        #: (id of the sweep's config, job's overrides), (the sweep's config, configs)
        self._checked: dict[tuple, tuple[DictConfig, list[DictConfig]]] = {}

    def __getstate__(self):
        state = super().__getstate__()
        state["_checked"] = {}
        return state

    def check_batch(self, master_config: DictConfig, batch) -> None:
        """Hydra's ``Sweeper.validate_batch_is_legal`` (compose every job of ``batch``),
        keeping each job's config for the next :meth:`load_sweep_config` of that job (the
        launcher's), which then composes nothing: the same function of the same inputs."""
        for overrides in batch:
            cfg = self.load_sweep_config(master_config, list(overrides))
            key = (id(master_config), tuple(overrides))
            self._checked.setdefault(key, (master_config, []))[1].append(cfg)

    def _take_checked(self, master_config: DictConfig, sweep_overrides) -> DictConfig | None:
        """The config :meth:`check_batch` composed for this job, once; None if there is none."""
        key = (id(master_config), tuple(sweep_overrides))
        master, configs = self._checked.get(key, (None, None))
        if master is not master_config:
            return None
        cfg = configs.pop(0)
        if not configs:
            del self._checked[key]
        # Hydra copies the sweep's resolver cache when the launcher composes (now, not at the
        # check: the sweep's config may have resolved more since)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    def _is_value(self, o: Override) -> bool:
        """Whether Hydra applies ``o`` to the composed config (rather than to the defaults
        list): the rule of Hydra's ``defaults_list.Overrides``, for a job's override."""
        if o.is_hydra_override():
            return False
        key = o.key_or_group
        if key not in self._groups:
            self._groups[key] = self.repository.group_exists(key)
        return isinstance(o.value(), dict) or not self._groups[key]

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]
                          ) -> DictConfig:
        checked = self._take_checked(master_config, sweep_overrides)
        if checked is not None:
            return checked
        lines = list(OmegaConf.to_container(master_config.hydra.overrides.hydra))
        lines += list(sweep_overrides)
        parsed = [_parse(line) for line in lines]
        if any(o.is_sweep_override() or o.get_key_element() == "hydra.searchpath"
               for o in parsed):                   # Hydra's own errors and search path
            return super().load_sweep_config(master_config, sweep_overrides)
        values = [o for o in parsed if self._is_value(o)]
        rest = [o.input_line for o in parsed if not self._is_value(o)]
        name = master_config.hydra.job.config_name
        key = (name, tuple(rest))
        if key not in self._bases:
            self._bases[key] = self.load_configuration(config_name=name, overrides=rest,
                                                       run_mode=RunMode.RUN)
        cfg = copy.deepcopy(self._bases[key])
        # what _load_configuration_impl does with the value overrides, in its order
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        task = [o for o in parsed if not o.is_hydra_override()]
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in task]
            dirname = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=task, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep,
                exclude_keys=dirname.exclude_keys)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg


@contextmanager
def reuse_compositions(command: list[str] | None = None, jobs: bool = True):
    """Within the block, the Hydra instances that Hydra's entry points (``@hydra.main``) and
    :func:`fnsysid.config.groups.hydra_session` make compose through :class:`ReusingConfigLoader`
    (``jobs``: sweep jobs too) or :class:`ComposeOnceLoader` (sweep jobs as Hydra composes
    them). The composition of ``command`` (a command line's overrides) in ``RunMode.RUN`` is
    kept for the requests after it; sweeps' own configs always are."""
    import hydra._internal.hydra as hydra_module

    global _STORE
    saved = hydra_module.ConfigLoaderImpl, _STORE, Sweeper.validate_batch_is_legal
    hydra_module.ConfigLoaderImpl = ReusingConfigLoader if jobs else ComposeOnceLoader
    if jobs:
        Sweeper.validate_batch_is_legal = _check_batch
    _STORE = _Store(command)
    try:
        yield
    finally:
        hydra_module.ConfigLoaderImpl, _STORE, Sweeper.validate_batch_is_legal = saved


_HYDRA_CHECK_BATCH = Sweeper.validate_batch_is_legal


def _check_batch(self, batch) -> None:
    """``Sweeper.validate_batch_is_legal`` within :func:`reuse_compositions` (jobs): through
    :meth:`ReusingConfigLoader.check_batch` when the sweeper composes with one (the loader the
    launcher composes with too), else Hydra's."""
    context = getattr(self, "hydra_context", None)
    loader = context.config_loader if context is not None else getattr(self, "config_loader",
                                                                        None)
    if isinstance(loader, ReusingConfigLoader) and self.config is not None:
        loader.check_batch(self.config, batch)
    else:
        _HYDRA_CHECK_BATCH(self, batch)
