"""Hydra's config loader for sweeps whose jobs differ in plain values: compose once per choice
of config groups, then apply each job's values.

Hydra composes every job of a multirun from scratch (its sweeper once to check the batch, its
launcher again to run the job): about 0.1 s of CPU per composition for this project's config,
more than a small job's arithmetic. Yet the jobs of a stored experiment mostly differ in plain
values (``M=1,9,25``), which Hydra applies last, on top of the config merged from the defaults
list. :class:`ReusingConfigLoader` keeps Hydra's composition of the first job with each choice
of config groups (and of ``hydra.*`` overrides) and builds the other jobs from a copy of it,
applying their value overrides and setting their override records as Hydra's own
``ConfigLoaderImpl._load_configuration_impl`` does. The sweeper, the launcher, the job records
in ``.hydra/`` and the sweep callbacks are Hydra's; ``tests/test_sweep_configs.py`` checks that
every job of every stored experiment gets the config Hydra itself composes.

Used by ``scripts/make_figure.py`` through :func:`reuse_compositions`; ``run.py`` composes as
Hydra does.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

_PARSED: dict[str, Override] = {}


def _parse(line: str) -> Override:
    """Hydra's parse of one override (parsed once per text: the grammar is slow)."""
    if line not in _PARSED:
        _PARSED[line] = OverridesParser.create().parse_override(line)
    return _PARSED[line]


class ReusingConfigLoader(ConfigLoaderImpl):
    """``ConfigLoaderImpl`` whose :meth:`load_sweep_config` reuses the composition of an earlier
    job with the same config-group (and ``hydra.*``) overrides, and that composes the sweep's
    own config once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bases: dict[tuple, DictConfig] = {}
        self._groups: dict[str, bool] = {}
        self._sweeps: dict[tuple, DictConfig] = {}

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True,
                           validate_sweep_overrides=True) -> DictConfig:
        """Hydra's, except that the sweep's own config (``RunMode.MULTIRUN``), which Hydra
        composes twice (to read ``hydra.mode``, then to run), is composed once."""
        if run_mode != RunMode.MULTIRUN:
            return super().load_configuration(config_name, overrides, run_mode, from_shell,
                                              validate_sweep_overrides)
        key = (config_name, tuple(overrides), from_shell)
        if key not in self._sweeps:
            self._sweeps[key] = super().load_configuration(
                config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
        elif validate_sweep_overrides:
            self.validate_sweep_overrides_legal(overrides=[_parse(o) for o in overrides],
                                                run_mode=run_mode, from_shell=from_shell)
        return copy.deepcopy(self._sweeps[key])

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
def reuse_compositions():
    """Within the block, Hydra's entry points (``@hydra.main``) compose sweep jobs with
    :class:`ReusingConfigLoader`."""
    import hydra._internal.hydra as hydra_module

    saved = hydra_module.ConfigLoaderImpl
    hydra_module.ConfigLoaderImpl = ReusingConfigLoader
    try:
        yield
    finally:
        hydra_module.ConfigLoaderImpl = saved
